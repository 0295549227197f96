"""Reuse nutpie's compiled numba wrappers across processes.

``nutpie.compile_pymc_model(backend="numba")`` wraps PyTensor's logp+gradient and
"expand" functions in two ``numba.cfunc`` callbacks. PyTensor caches its own numba
functions on disk, but the two wrappers are closures, and numba keys a closure's
cache entry on a pickle of its cell contents. Those hold freshly generated
PyTensor functions whose pickles differ in every process, so the key never
matches: every stage process spent 9-12 s re-typing and re-generating machine
code for the whole linked model (``benchmarks/compile_time.py``).

:func:`compile_numba` compiles with ``cache=True`` and, for the two nutpie
wrappers only, replaces numba's key with a description of what the machine
code depends on: the wrapper's bytecode, the bytecode of the nutpie helpers in
its closure, PyTensor's own cache key for the model's function (a hash of the
function graph, which is what PyTensor keys its on-disk numba cache on), the
dtypes and ranks of the shared-data arrays (their values are passed at run time
and never compiled in), numba helpers by name, and the nutpie and PyTensor
versions. numba adds the signature and CPU, and drops every entry when its own
version changes. Whenever the closure holds something that cannot be described
that way, for example a PyTensor function without a cache key, the wrapper is
compiled without loading or saving a cache entry, as nutpie does by default.
Each key has its own files under :func:`cache_dir`.

The cache can never fail a fit: a wrapper numba refuses to cache (for example
one whose model embeds a constant array over 1 MB, which numba links as a
"dynamic global"), an unreadable or corrupt cache entry, or any other error
inside the caching machinery ends in an uncached compile with one warning. numba
loads only entries as they were written (:mod:`hbnn.density.cache_guard`): one that
changed since is removed and compiled again.

A warm compile of the default hierarchical model takes about 1.8 s instead of
about 13.6 s (``benchmarks/compile_time.py``); the machine code is the same, so
draws are identical.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

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
    """The cache key of a nutpie wrapper, or ``None`` where it cannot be described."""
    import nutpie
    import pytensor

    try:
        description = (KEY_VERSION, nutpie.__version__, pytensor.__version__, _describe(py_func))
    except _Undescribable as why:
        log.debug("not caching nutpie's %s: its closure holds %s", py_func.__qualname__, why)
        return None
    return hashlib.sha256(repr(description).encode()).hexdigest()


def cache_dir() -> Path:
    """Where the wrappers are cached: beside PyTensor's own numba cache."""
    from pytensor.configdefaults import config

    return Path(config.base_compiledir) / "numba" / "nutpie"


def _locator_class(key_of):
    from numba.core.caching import _CacheLocator

    class KeyedLocator(_CacheLocator):
        """Files named by the wrapper's key: one index per key, so runs compiling other
        models at the same time (``dvc exp run --queue`` with several jobs) never
        rewrite each other's index."""

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
    """Within the block, numba files and keys nutpie's wrappers by :func:`wrapper_key`.

    Yields a list that collects the errors met loading or saving a wrapper.
    """
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
    """``nutpie.compile_pymc_model(model, backend="numba")``, reusing wrappers compiled by earlier runs."""
    import nutpie

    from hbnn.density import cache_guard

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
