"""Hierarchical Bayesian neural networks as a reproducible DVC pipeline.

Subpackages, one layer each:

- ``model``: the specification: the network's layout and forward passes, the likelihoods, PyMC's model builders
  and the informed prior;
- ``density``: the hand-written log density and gradient nutpie samples, the code written out per network, and the
  integrity of numba's cache of it;
- ``sampling``: the backends (nutpie, PyMC, NumPyro, BlackJAX, ADVI), run-length control, restarts, the adapters
  to nutpie's and NumPyro's internals, and the Dask cluster;
- ``diagnostics``: R-hat and ESS, PSIS-LOO, predictions and scores, the convergence criterion and a fit's metrics;
- ``data``: the tasks (rotated moons or a user's table) and their layouts;
- ``files``: atomic outputs, traces, checksums and checked loading;
- ``pipeline``: the DVC stages' bodies, the runner, cost estimates, variants and seeds, the transfer experiment,
  ``hbnn predict`` and ``hbnn summarise``;
- ``report``: the report stage, its sections, figures and plots;
- ``fitting``: fitting a model to tasks and scoring it, which the fit stages and the Python API share;
- ``api``: the Python API, :class:`HierarchicalBNN`, :class:`FlatBNN`, :class:`InformedBNN` and :func:`load`, importable
  from ``hbnn`` itself.

Beside them: ``config`` (typed, validated params; ``config_read`` reads ``params.yaml``, ``config_schema`` writes
its schema), ``names``, ``errors``, ``logs``, ``homes`` and ``cli`` (the ``hbnn`` command line).
"""

__version__ = "0.1.0"

# The Python API's names, imported on first use (importlib: the command line and the stages, which never ask for
# them, import ``hbnn`` without the estimators' imports)
_LAZY = {"FlatBNN": "hbnn.api", "HierarchicalBNN": "hbnn.api", "InformedBNN": "hbnn.api", "load": "hbnn.api",
         "InputError": "hbnn.errors"}


def __getattr__(name: str):
    """``hbnn.HierarchicalBNN`` and the API's other names, from the module that defines them."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hbnn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
