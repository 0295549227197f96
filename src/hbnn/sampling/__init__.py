"""Sampling: the backends and their run-length control and restarts (``inference``), nutpie's compile cache and loader,
and the Dask cluster the per-group fits run on (``cluster``)."""
