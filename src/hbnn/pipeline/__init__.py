"""The DVC pipeline: the stage runner, each stage's body (``stages``), cost estimates (``budget``) and the checks
before any stage samples (``preflight``), the model variants and seed streams (``variants``), the transfer experiment,
``hbnn predict`` and ``hbnn summarise``."""
