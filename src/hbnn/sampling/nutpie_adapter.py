"""Everything of hbnn's that touches nutpie's internals, behind the few functions the rest of hbnn calls.

hbnn samples with nutpie but reaches past its public ``sample``: it builds nutpie's model class
(``nutpie.compile_pymc.CompiledPyMCModel``) around the hand-written density's callbacks (:func:`compiled_model`) and
replaces its fields (:func:`with_user_data`, :func:`with_initial_points`), reads nutpie's raw trace into a
:class:`~hbnn.files.trace.Trace` without ArviZ (:func:`trace_from_raw`), imports nutpie without ArviZ
(:func:`load`), and keys numba's disk cache of nutpie's ``cfunc`` wrappers itself (:func:`compile_numba`). Each
depends on how a nutpie release lays these out, so they are tested against the releases in :data:`SUPPORTED` and
refused outside it before any sampling, with one error naming both versions (:func:`check_version`).

**Loading.** ``nutpie.sample`` imports ArviZ at its top, a large share of a stage process's start-up (measured:
benchmarks/FINDINGS.md, section 'Measurements behind code comments'); nutpie uses it only to convert traces (which
hbnn does itself) and in its return annotations.
While nutpie imports, ``arviz`` is a stand-in that holds a placeholder for the annotations and forwards every other
attribute to the real ArviZ, imported then.

**The compile cache.** ``nutpie.compile_pymc_model(backend="numba")`` wraps PyTensor's logp+gradient and "expand"
functions in two ``numba.cfunc`` closures, which numba keys on a pickle of their cell contents, different in every
process, so every process would compile the whole linked model again, which takes seconds (measured:
benchmarks/FINDINGS.md, section 'Measurements behind code comments'). :func:`compile_numba` compiles with
``cache=True`` and keys the two wrappers by what their machine code depends on: their bytecode and that of the
nutpie helpers in their closures, PyTensor's cache key for the model's function, the shared-data arrays' dtypes and
ranks (their values are passed at run time), numba helpers by name, and the nutpie and PyTensor versions. A closure
holding anything else is compiled without a cache entry, as nutpie does by default. The cache never fails a fit: any
error in it ends in an uncached compile with one warning, and numba loads only entries as they were written
(:mod:`hbnn.density.cache_guard`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import logging
import re
import sys
import threading
import types
import warnings
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hbnn.errors import InputError

if TYPE_CHECKING:  # imported where traces are converted: check_params checks the version without xarray
    import xarray as xr

    from hbnn.files.trace import Trace

log = logging.getLogger(__name__)

# The nutpie releases whose private model class, raw trace and cfunc wrappers this module is tested against
# (requirements.lock pins 0.16.8); 0.16.9 requires a field of CompiledPyMCModel that compiled_model does not set:
# [lowest, first refused)
SUPPORTED = ((0, 16, 8), (0, 16, 9))


def _version_text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def installed_version() -> str:
    """The installed nutpie's version (``"not installed"`` where it is not), read without importing nutpie.

    Returns
    -------
    str
    """
    try:
        return metadata.version("nutpie")
    except metadata.PackageNotFoundError:
        return "not installed"


def check_version() -> None:
    """Refuse a nutpie outside :data:`SUPPORTED`, before anything is built or sampled.

    Raises
    ------
    hbnn.errors.InputError
        Where the installed nutpie is missing or outside :data:`SUPPORTED`; the message names both versions.
    """
    found = installed_version()
    parts = tuple(int(p) for p in re.findall(r"\d+", found)[:3]) if found != "not installed" else None
    low, high = SUPPORTED
    if parts is None or not low <= parts < high:
        raise InputError(f"nutpie {found} is installed, but hbnn supports nutpie >={_version_text(low)},"
                         f"<{_version_text(high)} (it builds nutpie's model and reads its raw trace through classes "
                         "that change between releases); install the pinned version (make venv, from "
                         "requirements.lock)")


def compiled_model(**fields):
    """nutpie's model class with ``fields`` (:meth:`hbnn.density.densities.Density.nutpie_model` passes them).

    Returns
    -------
    nutpie.compile_pymc.CompiledPyMCModel
    """
    return load().compile_pymc.CompiledPyMCModel(**fields)


def with_user_data(compiled, user_data: np.ndarray):
    """``compiled`` sampling the same callbacks over another ``user_data`` buffer (another group's rows).

    Parameters
    ----------
    compiled : nutpie.compile_pymc.CompiledPyMCModel
    user_data : numpy.ndarray
        :func:`hbnn.density.buffer.pack`'s buffer.

    Returns
    -------
    nutpie.compile_pymc.CompiledPyMCModel
    """
    return dataclasses.replace(compiled, user_data=user_data)


def with_initial_points(compiled, initial_point):
    """``compiled`` whose chains start where ``initial_point(seed)`` says.

    Parameters
    ----------
    compiled : nutpie.compile_pymc.CompiledPyMCModel
    initial_point : callable
        A chain's first point on the unconstrained scale, from its seed.

    Returns
    -------
    nutpie.compile_pymc.CompiledPyMCModel
    """
    return dataclasses.replace(compiled, initial_point_func=initial_point)


_LOCK = threading.Lock()


class _ArvizOnDemand(types.ModuleType):
    """``arviz`` as nutpie's modules see it: the real package's attributes, the package imported on first use."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(importlib.import_module("arviz"), name)


class _Placeholder:
    """Stands for ``arviz.InferenceData`` in nutpie's annotations while nutpie imports."""


def load() -> types.ModuleType:
    """The ``nutpie`` package, imported (once) without importing ArviZ where ArviZ is not loaded already.

    Returns
    -------
    types.ModuleType

    Raises
    ------
    hbnn.errors.InputError
        As :func:`check_version`.
    """
    check_version()
    with _LOCK:
        if "nutpie" in sys.modules or "arviz" in sys.modules:
            return importlib.import_module("nutpie")
        stand_in = _ArvizOnDemand("arviz", "ArviZ, imported when nutpie first uses it (hbnn.sampling.nutpie_loader)")
        stand_in.InferenceData = _Placeholder
        sys.modules["arviz"] = stand_in
        try:
            return importlib.import_module("nutpie")
        finally:
            if sys.modules.get("arviz") is stand_in:
                del sys.modules["arviz"]
            del stand_in.InferenceData  # from now on, the real class


# nutpie's per-draw statistics that a trace leaves out: its own chain and draw numbers (the coordinates), and the
# vectors it fills only when asked to store them (gradients, mass matrices, divergences' ends), null otherwise
_NUTPIE_STATS_LEFT_OUT = frozenset({
    "chain", "draw", "unconstrained_draw", "gradient", "mass_matrix_inv", "mass_matrix_eigvals", "mass_matrix_stds",
    "divergence_start", "divergence_start_gradient", "divergence_end", "divergence_momentum",
})


def _tuning_rows(stats) -> int:
    """How many of a chain's rows (its record batch of sample stats) are tuning."""
    import pyarrow

    return int(np.asarray(pyarrow.array(stats.column("tuning")).to_numpy(zero_copy_only=False)).sum())


def draws_done(stats) -> int:
    """Draws after tuning that every chain holds (the slowest chain's), without converting them.

    Parameters
    ----------
    stats : sequence of pyarrow.RecordBatch
        Each chain's sample stats, as a raw trace hands them over.

    Returns
    -------
    int
    """
    return min((s.num_rows - _tuning_rows(s) for s in stats), default=0)


def trace_from_raw(trace, coords: Mapping[str, Sequence]) -> Trace:
    """nutpie's raw trace (``return_raw_trace=True``) as ``posterior`` and ``sample_stats`` of the draws after
    tuning and, of tuning, the ``n_steps`` only (``warmup_sample_stats``, to count gradient evaluations).

    The same arrays, dims and coordinates as nutpie's own conversion (tests/test_inference.py compares them), which
    goes through ArviZ's ``from_dict`` for every group of draws, a cost every per-group fit would pay (measured:
    benchmarks/FINDINGS.md, section 'Measurements behind code comments'). Chains shorter than the longest (a trace
    inspected while it runs) are padded as nutpie pads them: NaN for floats, 0 otherwise.

    Parameters
    ----------
    trace : object
        nutpie's raw trace.
    coords : mapping of str to sequence
        The coordinates of the model's dims.

    Returns
    -------
    hbnn.files.trace.Trace
    """
    return trace_from_batches(*trace.get_arrow_trace(), coords)


def trace_from_batches(draws, stats, coords: Mapping[str, Sequence]) -> Trace:
    """:func:`trace_from_raw` of the record batches a raw trace hands over (once: ``get_arrow_trace``).

    Parameters
    ----------
    draws, stats : sequence of pyarrow.RecordBatch
        Each chain's draws and sample stats.
    coords : mapping of str to sequence

    Returns
    -------
    hbnn.files.trace.Trace
    """
    from hbnn.files.trace import Trace

    tuned = [_tuning_rows(s) for s in stats]
    kept = [d.num_rows - t for d, t in zip(draws, tuned, strict=True)]
    posterior = _arrow_dataset(draws, tuned, kept, lambda name: True, coords)
    sample_stats = _arrow_dataset(stats, tuned, kept, lambda name: name not in _NUTPIE_STATS_LEFT_OUT, coords)
    tuning = _arrow_dataset(stats, [0] * len(stats), tuned, lambda name: name == "n_steps", coords)
    return Trace(posterior=posterior, sample_stats=sample_stats, warmup_sample_stats=tuning)


def _arrow_dataset(batches, starts: Sequence[int], lengths: Sequence[int], keep, coords) -> xr.Dataset:
    """Rows ``starts[c]`` to ``starts[c] + lengths[c]`` of every chain's record batch as one ``(chain, draw, ...)``
    dataset of the columns ``keep(name)`` accepts, each column's dims and shape from nutpie's field metadata."""
    import pandas as pd
    import pyarrow
    import xarray as xr

    n_draws = max(lengths, default=0)
    arrays, dims = {}, {}
    for c, (batch, start, length) in enumerate(zip(batches, starts, lengths, strict=True)):
        for name in batch.column_names:
            if not keep(name):
                continue
            column = batch.column(name)
            meta = column.field.metadata
            shape = tuple(int(n) for n in meta[b"shape"].decode().split(",")) if meta.get(b"shape") else ()
            col = pyarrow.array(column).slice(start, length)
            values = col.flatten() if hasattr(col, "flatten") else col
            if name not in arrays:
                dtype = values.type.to_pandas_dtype()
                fill = np.nan if np.issubdtype(dtype, np.floating) else 0
                arrays[name] = np.full((len(batches), n_draws, *shape), fill, dtype=dtype)
                named = meta[b"dims"].decode().split(",") if meta.get(b"dims") else []
                dims[name] = ("chain", "draw", *(named or [f"{name}_dim_{i}" for i in range(len(shape))]))
            valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False))
            arrays[name][c, :length][valid] = values.to_numpy(zero_copy_only=False).reshape(-1, *shape)
    sizes = {d: n for name, a in arrays.items() for d, n in zip(dims[name], a.shape, strict=True)}
    return xr.Dataset(
        {name: (dims[name], a) for name, a in arrays.items()},
        # as ArviZ's from_dict: a dim without coordinates of its own gets 0, 1, ...
        coords={"chain": np.arange(len(batches)), "draw": np.arange(n_draws),
                **{d: pd.Index(coords[d]) if d in coords else np.arange(n) for d, n in sizes.items()
                   if d not in ("chain", "draw")}},
        attrs={"arviz_version": _ARVIZ_VERSION},
    )


# nutpie's conversion stamps ArviZ's version on every group; read from the package's metadata, not its import
_ARVIZ_VERSION = metadata.version("arviz")


# nutpie's wrappers, by qualified name (nutpie/compile_pymc.py).
_WRAPPERS = ("_make_c_logp_func.<locals>.logp_numba", "_make_c_expand_func.<locals>.expand_numba")
KEY_VERSION = 1


class _Undescribable(Exception):
    """The closure holds something whose effect on the machine code is unknown."""


def _describe(obj) -> object:
    """A deterministic description of one closure value, for the cache key."""
    from numba.core.dispatcher import Dispatcher
    from numba.core.extending import _Intrinsic
    from pytensor.link.numba.cache import CACHED_SRC_FUNCTIONS

    if isinstance(obj, Dispatcher):
        if obj.py_func in CACHED_SRC_FUNCTIONS:  # PyTensor-generated: its source hash covers the graph
            return ("pytensor", CACHED_SRC_FUNCTIONS[obj.py_func])
        obj = obj.py_func
    if isinstance(obj, _Intrinsic):
        obj = obj._defn
    if isinstance(obj, types.FunctionType):
        if obj.__module__.split(".")[0] == "numba":  # numba's own helpers: numba versions its cache index
            return ("numba", obj.__module__, obj.__qualname__)
        if obj.__module__.split(".")[0] != "nutpie":
            raise _Undescribable(f"function {obj.__module__}.{obj.__qualname__}")
        cells = tuple(_describe(c.cell_contents) for c in obj.__closure__ or ())
        return ("function", obj.__qualname__, obj.__code__.co_code.hex(), cells)
    if isinstance(obj, np.ndarray):  # shared data: only its type is compiled in
        return ("array", obj.dtype.str, obj.ndim)
    if isinstance(obj, tuple):
        return tuple(_describe(o) for o in obj)
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__)
    if isinstance(obj, (bool, int, float, str, np.generic, np.dtype, type(None))):
        return repr(obj)
    raise _Undescribable(type(obj).__name__)


def wrapper_key(py_func) -> str | None:
    """The cache key of a nutpie wrapper (see the module doc).

    Parameters
    ----------
    py_func : function

    Returns
    -------
    str or None
        A SHA-256 hex digest, or ``None`` where the closure holds something that cannot be described.
    """
    import pytensor

    nutpie = load()
    try:
        description = (KEY_VERSION, nutpie.__version__, pytensor.__version__, _describe(py_func))
    except _Undescribable as why:
        log.debug("not caching nutpie's %s: its closure holds %s", py_func.__qualname__, why)
        return None
    return hashlib.sha256(repr(description).encode()).hexdigest()


def cache_dir() -> Path:
    """Where the wrappers are cached: beside PyTensor's own numba cache.

    Returns
    -------
    pathlib.Path
    """
    from pytensor.configdefaults import config

    return Path(config.base_compiledir) / "numba" / "nutpie"


def _locator_class(key_of):
    from numba.core.caching import _CacheLocator

    class KeyedLocator(_CacheLocator):
        """Files named by the wrapper's key: one index per key, so runs compiling other models at the same time
        (``dvc exp run --queue`` with several jobs) never rewrite each other's index."""

        def __init__(self, key: str, py_func, py_file: str):
            self._key = key
            # numba's own locators have these; its "cannot cache" warning reads them.
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno

        def get_cache_path(self) -> str:
            return str(cache_dir())

        def get_source_stamp(self) -> str:
            return "keyed"  # the key covers nutpie's and PyTensor's versions

        def get_disambiguator(self) -> str:
            return self._key[:32]

        @classmethod
        def from_function(cls, py_func, py_file):
            key = key_of(py_func)
            return cls(key, py_func, py_file) if key else None

    return KeyedLocator


@contextlib.contextmanager
def _keyed_wrappers() -> Iterator[list[str]]:
    """Within the block, numba files and keys nutpie's wrappers by :func:`wrapper_key`; yields a list that collects
    the errors met loading or saving a wrapper."""
    from numba.core.caching import CacheImpl, FunctionCache

    original = {name: getattr(FunctionCache, name) for name in ("_index_key", "load_overload", "save_overload")}
    keys: dict = {}  # py_func -> key; numba asks for it several times per wrapper
    problems: list[str] = []  # errors loading or saving a wrapper; compile_numba warns once

    def key_of(py_func) -> str | None:
        """The wrapper's key, ``None`` for an undescribable wrapper, ``""`` for any other function."""
        if py_func.__qualname__ not in _WRAPPERS:
            return ""
        if py_func not in keys:
            keys[py_func] = wrapper_key(py_func)
        return keys[py_func]

    def index_key(self, sig, codegen):
        key = key_of(self._py_func)
        if not key:
            return original["_index_key"](self, sig, codegen)
        return (sig, codegen.magic_tuple(), ("hbnn", key))

    def load_overload(self, sig, target_context):
        if key_of(self._py_func) is None:
            return None
        try:
            return original["load_overload"](self, sig, target_context)
        except Exception as err:  # noqa: BLE001 - a bad entry must never fail a fit: compile afresh
            problems.append(f"could not load {self._py_func.__qualname__} ({type(err).__name__}: {err})")
            return None

    def save_overload(self, sig, data):
        if key_of(self._py_func) is None:
            return
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                original["save_overload"](self, sig, data)
        except Exception as err:  # noqa: BLE001 - the compiled code is fine; only the cache entry is lost
            problems.append(f"could not save {self._py_func.__qualname__} ({type(err).__name__}: {err})")
            return
        # numba warns when it refuses to cache (e.g. large constant arrays are "dynamic globals"):
        # expected for such models, nothing for the user to do, so it is logged, not warned.
        for w in caught:
            message = re.sub(r"\x1b\[[0-9;]*m", "", str(w.message))  # numba's messages carry terminal colours
            log.debug("nutpie compile cache: %s not cached: %s", self._py_func.__qualname__, message)

    locator = _locator_class(key_of)
    CacheImpl._locator_classes.insert(0, locator)
    FunctionCache._index_key = index_key
    FunctionCache.load_overload = load_overload
    FunctionCache.save_overload = save_overload
    try:
        yield problems
    finally:
        CacheImpl._locator_classes.remove(locator)
        for name, method in original.items():
            setattr(FunctionCache, name, method)


def compile_numba(model):
    """``nutpie.compile_pymc_model(model, backend="numba")``, reusing wrappers compiled by earlier runs.

    Parameters
    ----------
    model : pymc.Model

    Returns
    -------
    nutpie.compile_pymc.CompiledPyMCModel
        Compiled without the cache, with one warning, where anything in the cache fails.
    """
    from hbnn.density import cache_guard

    nutpie = load()

    folder = cache_dir()
    try:
        if folder.is_dir():
            cache_guard.verify(folder)
        with _keyed_wrappers() as problems:
            compiled = nutpie.compile_pymc_model(model, backend="numba", cache=True)
    except Exception as err:  # noqa: BLE001 - whatever broke in the cache, an uncached compile still works
        log.warning("nutpie compile cache failed (%s: %s); compiling without it", type(err).__name__, err)
        cache_guard.purge(folder)
        return nutpie.compile_pymc_model(model, backend="numba")
    if problems:
        log.warning("nutpie compile cache: %s; compiled without it", "; ".join(problems))
        cache_guard.purge(folder)
    elif folder.is_dir():
        cache_guard.record(folder)
    hits = compiled.compiled_logp_func.cache_hits + compiled.compiled_expand_func.cache_hits
    log.debug("nutpie: %d of 2 compiled wrappers loaded from %s", hits, cache_dir())
    return compiled
