"""Sampling: one :class:`~hbnn.sampling.backend.Backend` per way to fit a model (``nutpie_backend``,
``pymc_backends``, ``advi``), looked up by name in :mod:`~hbnn.sampling.sampler`; nutpie's run-length control
(``runlength``) and restarts (``restarts``); nutpie's trace, loader and compile cache; and the Dask cluster the
per-group fits run on (``cluster``)."""
