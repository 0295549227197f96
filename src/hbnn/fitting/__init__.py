"""Fitting a model to tasks: what the fit stages, the transfer experiment and the Python API share.

- ``models``: the three models as they are sampled: the hierarchical model over all groups, the flat and informed
  models per group;
- ``per_group``: the per-group fits, each group from its own seed, drawn again where it misses the convergence bar;
- ``common``: the cost check, which density is sampled, and scoring a fit's draws into its trace and metrics.
"""
