"""Hierarchical Bayesian neural networks as a reproducible DVC pipeline.

Modules, one concern each: ``config`` (typed params), ``data`` (tasks),
``models`` (PyMC builders), ``inference`` (sampling), ``prior`` (informed prior),
``evaluation`` (predictions, metrics), ``plots``, ``report``, ``io`` (atomic,
checked files) and ``pipeline`` (what each DVC stage does).
"""

__version__ = "0.1.0"
