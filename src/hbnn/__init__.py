"""Hierarchical Bayesian neural networks as a reproducible DVC pipeline.

Modules, one concern each:

- ``config`` (typed, validated params), ``budget`` (cost estimates and limits),
  ``variants`` (the model variants, stage params and seed streams);
- ``data`` (moons and tables, the tasks file), ``network`` (layer layout and the
  NumPy forward pass), ``models`` (PyMC builders), ``inference`` (samplers),
  ``nutpie_cache`` (compiled wrappers reused across runs), ``prior`` (the
  informed prior and its file), ``evaluation`` and ``convergence`` (predictions,
  scores, function-space R-hat and ESS);
- ``plots``, ``report`` (the report stage), ``predict`` (``hbnn predict``);
- ``io`` (atomic, committed-together outputs; checked loading), ``errors``;
- ``stages`` (the body of each DVC stage), ``cli`` (the stage runner),
  ``cli`` (the ``hbnn`` command line).
"""

__version__ = "0.1.0"
