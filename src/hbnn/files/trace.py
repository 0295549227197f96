"""A fit's trace: its groups (``posterior``, ``sample_stats``, ...) as ArviZ's ``InferenceData`` lays them out.

The fit stages build and write traces without importing ArviZ, whose import
(matplotlib's pyplot, SciPy's stats, a numba ufunc compiled at import) is a
large part of a stage process's start (benchmarks/FINDINGS.md). :class:`Trace` holds the same
groups in ArviZ's order and writes a NetCDF file as ArviZ lays it out (one HDF5 group per
trace group), so ``az.from_netcdf`` reads the same groups as from ArviZ's own file;
:meth:`Trace.to_arviz` hands the groups to ArviZ where its functions are wanted.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import xarray as xr

# ArviZ 0.23's order of groups (``InferenceData``'s supported groups, then the warmup groups): a file lists them
# in this order, whatever order they were given in.
GROUP_ORDER = (
    "posterior", "posterior_predictive", "predictions", "log_likelihood", "log_prior", "sample_stats", "prior",
    "prior_predictive", "sample_stats_prior", "observed_data", "constant_data", "predictions_constant_data",
    "unconstrained_posterior", "unconstrained_prior",
)


def _rank(name: str) -> tuple[int, int, str]:
    warmup = name.startswith("warmup_")
    base = name.removeprefix("warmup_")
    return (int(warmup), GROUP_ORDER.index(base) if base in GROUP_ORDER else len(GROUP_ORDER), name)


class Trace(Mapping):
    """Named ``xarray.Dataset`` groups, read as items (``trace["posterior"]``) or attributes (``trace.posterior``);
    :meth:`groups` lists them in ArviZ's order."""

    def __init__(self, **groups: xr.Dataset):
        for name, ds in groups.items():
            if not isinstance(ds, xr.Dataset):
                raise TypeError(f"trace group {name!r} is a {type(ds).__name__}, not an xarray.Dataset")
        self._groups = {name: groups[name] for name in sorted(groups, key=_rank)}

    def groups(self) -> list[str]:
        """The group names, in the order they are written (as ArviZ's ``InferenceData.groups``)."""
        return list(self._groups)

    def __getitem__(self, name: str) -> xr.Dataset:
        return self._groups[name]

    def __getattr__(self, name: str) -> xr.Dataset:
        groups = self.__dict__.get("_groups", {})
        if name in groups:
            return groups[name]
        raise AttributeError(f"the trace has no group {name!r} (it has {', '.join(groups) or 'none'})")

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    def __repr__(self) -> str:
        return f"Trace({', '.join(f'{g}: {dict(ds.sizes)}' for g, ds in self._groups.items())})"

    def to_netcdf(self, path: str | Path, compress: bool = False) -> None:
        """Write every group into one NetCDF file, each as a group of its own.

        Written with netCDF-C (xarray's ``netcdf4`` engine), which writes a trace faster than ArviZ's ``h5netcdf``
        (benchmarks/FINDINGS.md); ArviZ, which reads with h5netcdf, reads the same groups from either (tested).

        Parameters
        ----------
        path : str or pathlib.Path
            The new file.
        compress : bool, optional
            zlib on the numeric variables, as ArviZ's default.
        """
        encodings = {name: {var: {"zlib": True} for var, values in ds.variables.items() if values.dtype.kind in "biufc"}
                     for name, ds in self._groups.items()} if compress else {}
        write_netcdf_groups(self._groups, path, "netcdf4", encodings)

    def to_arviz(self):
        """The same groups as ArviZ's ``InferenceData``."""
        import arviz as az

        return az.InferenceData(**self._groups)


def write_netcdf_groups(groups: Mapping[str | None, xr.Dataset], path: str | Path, engine: str = "h5netcdf",
                        encodings: Mapping[str | None, Mapping] | None = None) -> None:
    """Write ``groups`` into a new NetCDF file, in their order, through one open file.

    The same variables, attributes and encodings as ``Dataset.to_netcdf`` writes group by group (tested), without its
    reopening of the file for every group or its question to Dask which scheduler runs: xarray asks it for every file
    written with its default lock, and Dask imports ``distributed`` to answer, a cost every stage process would pay
    (benchmarks/FINDINGS.md). The datasets here hold NumPy arrays, written by this thread, so the library's own lock
    (HDF5's, netCDF-C's) is the one the write needs.

    Parameters
    ----------
    groups : mapping of str or None to xarray.Dataset
        The groups by name; ``None`` is the file's root group.
    path : str or pathlib.Path
        The new file.
    engine : str, optional
        ``h5netcdf`` or ``netcdf4``.
    encodings : mapping, optional
        Per group, the variables' encodings (``Dataset.to_netcdf``'s ``encoding``).

    Raises
    ------
    ValueError
        If ``engine`` is neither.
    """
    from xarray.backends.common import ArrayWriter
    from xarray.backends.writers import dump_to_store

    if engine == "h5netcdf":
        from xarray.backends.h5netcdf_ import H5NetCDFStore as Store
        from xarray.backends.locks import HDF5_LOCK as lock
    elif engine == "netcdf4":
        from xarray.backends.netCDF4_ import NETCDF4_PYTHON_LOCK as lock
        from xarray.backends.netCDF4_ import NetCDF4DataStore as Store
    else:
        raise ValueError(f"engine {engine!r}: h5netcdf or netcdf4")
    encodings = encodings or {}
    store = Store.open(str(path), mode="w", lock=lock)
    try:
        for name, ds in groups.items():
            writer = ArrayWriter()
            dump_to_store(ds, store if name is None else store.get_child_store(name), writer,
                          encoding=encodings.get(name))
            writer.sync()
    finally:
        store.close()
