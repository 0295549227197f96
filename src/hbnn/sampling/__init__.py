"""Sampling: one :class:`~hbnn.sampling.backend.Backend` per way to fit a model (``nutpie_backend``,
``pymc_backends``, ``advi``), looked up by name in :mod:`~hbnn.sampling.sampler`; nutpie's run-length control
(``runlength``) and restarts (``restarts``); everything that reaches into nutpie's or NumPyro's internals, each behind
one adapter with the releases it supports (``nutpie_adapter``, ``numpyro_adapter``); and the Dask cluster the
per-group fits run on (``cluster``)."""
