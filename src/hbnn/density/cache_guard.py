"""numba's disk caches, used only as they were written.

numba keeps compiled machine code in files beside a module (``__pycache__/<module>.<function>-<line>.py311.nbi``,
the index, and ``....1.nbc``, the code) and loads whatever it finds there. A truncated or damaged file fails the
load with an exception deep inside numba; a flipped bit in the machine code itself may load and then compute
something else. The caches hbnn writes (the kernel modules of :mod:`hbnn.density.written`, nutpie's wrappers in
:mod:`hbnn.sampling.nutpie_adapter`) therefore keep, beside their entries, a manifest of each entry's SHA-256 written by
a process that wrote or loaded them (:func:`record`). Before numba may load anything, :func:`verify` removes every
entry the manifest does not vouch for, and numba compiles those again from the same source: the same machine code,
so the same draws. A caller whose load still fails removes the entries (:func:`purge`) and compiles elsewhere.

The manifest is a cache too: losing it (or a race between two processes writing theirs) costs a compile, never a
wrong result, since an entry it does not vouch for is compiled again.
"""

from __future__ import annotations

import atexit
import functools
import glob
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIXES = (".nbi", ".nbc")  # numba's index and data files


def manifest_path(directory: Path, stem: str) -> Path:
    """Where the hashes of a module's entries are kept.

    Parameters
    ----------
    directory : pathlib.Path
        The folder of numba's entries.
    stem : str
        The module's name (``""``: every entry of ``directory``).

    Returns
    -------
    pathlib.Path
    """
    return Path(directory) / f"hbnn-manifest-{stem or 'all'}.json"


def entries(directory: Path, stem: str, suffixes: tuple[str, ...] = SUFFIXES) -> list[Path]:
    """The cache files of a module.

    Parameters
    ----------
    directory : pathlib.Path
        The folder of the entries.
    stem : str
        The module's name (``""``: all).
    suffixes : tuple of str, default :data:`SUFFIXES`
        Which files count (numba's, by default).

    Returns
    -------
    list of pathlib.Path
        Sorted.
    """
    pattern = f"{glob.escape(stem)}.*" if stem else "*"
    return sorted(p for p in Path(directory).glob(pattern) if p.suffix in suffixes and p.is_file())


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest(directory: Path, stem: str) -> dict[str, str]:
    try:
        found = json.loads(manifest_path(directory, stem).read_text())
    except (OSError, ValueError):  # missing, unreadable or damaged: it vouches for nothing
        return {}
    if not isinstance(found, dict) or not all(isinstance(v, str) for v in found.values()):
        return {}
    return found


def verify(directory: Path, stem: str = "", suffixes: tuple[str, ...] = SUFFIXES) -> list[str]:
    """Remove the entries of ``stem`` in ``directory`` that its manifest does not list with their current hash.

    Parameters
    ----------
    directory : pathlib.Path
        The folder of the entries.
    stem : str, optional
        The module's name (``""``: all).
    suffixes : tuple of str, default :data:`SUFFIXES`
        Which files count.

    Returns
    -------
    list of str
        The names removed (a warning names them): entries written by a process that did not record them, or
        changed since (truncated, damaged or replaced), all of which numba then compiles again.
    """
    vouched = _manifest(directory, stem)
    removed = []
    for path in entries(directory, stem, suffixes):
        try:
            ok = vouched.get(path.name) == _digest(path)
        except OSError:  # vanished or unreadable: nothing numba could load either
            ok = False
        if not ok:
            Path(path).unlink(missing_ok=True)
            removed.append(path.name)
    if removed:
        log.warning("compile cache %s: removed %d %s not as written (%s); compiling again", directory, len(removed),
                    "entry" if len(removed) == 1 else "entries", ", ".join(removed[:3]) +
                    (f" and {len(removed) - 3} more" if len(removed) > 3 else ""))
    return removed


def record(directory: Path, stem: str = "", suffixes: tuple[str, ...] = SUFFIXES) -> None:
    """Write the manifest of a module's entries as they are now (atomically).

    A cache that cannot be written is left as it is (its entries are then compiled again by the next process).

    Parameters
    ----------
    directory : pathlib.Path
        The folder of the entries.
    stem : str, optional
        The module's name (``""``: all).
    suffixes : tuple of str, default :data:`SUFFIXES`
        Which files count.
    """
    try:
        hashes = {path.name: _digest(path) for path in entries(directory, stem, suffixes)}
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".manifest.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(hashes, f, sort_keys=True)
            os.replace(tmp, manifest_path(directory, stem))
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as err:
        log.debug("compile cache %s: cannot record its entries (%s)", directory, err)


def purge(directory: Path, stem: str = "") -> None:
    """Remove every entry of a module and its manifest (after a load that failed).

    Parameters
    ----------
    directory : pathlib.Path
        The folder of the entries.
    stem : str, optional
        The module's name (``""``: all).
    """
    for path in [*entries(directory, stem), manifest_path(directory, stem)]:
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            log.debug("compile cache %s: cannot remove %s (%s)", directory, path.name, err)


_BESIDE: set[str] = set()  # folders whose modules' entries numba keeps in their own __pycache__ (keep_beside)


def keep_beside(folder: Path) -> None:
    """Have numba keep the entries of the modules in ``folder`` in ``folder/__pycache__``, where :func:`verify`
    looks, even where ``NUMBA_CACHE_DIR`` would send them elsewhere (numba's cache locators, checked in turn, are
    numba's own classes: one of ours goes first, and answers for these folders only).

    Parameters
    ----------
    folder : pathlib.Path
        A folder of written modules.
    """
    _install_locator()
    _BESIDE.add(os.path.realpath(folder))


@functools.cache
def _install_locator() -> None:
    from numba.core.caching import CacheImpl, InTreeCacheLocator

    class BesideLocator(InTreeCacheLocator):
        """numba's ``__pycache__``-beside-the-source locator, for the modules of :func:`keep_beside`'s folders."""

        @classmethod
        def from_function(cls, py_func, py_file):
            if os.path.realpath(os.path.dirname(py_file)) not in _BESIDE:
                return None
            return super().from_function(py_func, py_file)

    CacheImpl._locator_classes.insert(0, BesideLocator)


def pytensor_base_compiledir() -> Path:
    """PyTensor's cache folder as it will pick it, without importing PyTensor.

    Returns
    -------
    pathlib.Path
        ``base_compiledir`` from ``PYTENSOR_FLAGS``, else ``~/.pytensor`` (a ``.pytensorrc`` setting is not read).
    """
    for flag in os.environ.get("PYTENSOR_FLAGS", "").split(","):
        key, _, value = flag.partition("=")
        if key.strip() == "base_compiledir" and value.strip():
            return Path(value.strip()).expanduser()
    return Path.home() / ".pytensor"


def _pytensor_folders() -> list[tuple[Path, tuple[str, ...]]]:
    """The folders of PyTensor's cache whose damage fails every later fit: its numba cache (entries as ours, without
    the subfolders hbnn keeps there) and the compiled C module every PyTensor function runs through
    (``lazylinker_ext``: truncated, it crashed the process with SIGBUS). PyTensor rebuilds either when missing."""
    base = pytensor_base_compiledir()
    linkers = sorted(base.glob("compiledir_*/lazylinker_ext"))
    return [(base / "numba", SUFFIXES), *((folder, (".so",)) for folder in linkers)]


@functools.cache
def guard_pytensor() -> None:
    """Before PyTensor is first used in this process: remove what of its cache (:func:`_pytensor_folders`) differs
    from what a process of hbnn's recorded after using it, so that PyTensor builds it again; record it at exit."""
    for folder, suffixes in _pytensor_folders():
        if folder.is_dir():
            try:
                verify(folder, "", suffixes)
            except OSError as err:  # a folder of another user's, read-only: PyTensor's own errors speak for it
                log.debug("compile cache %s: cannot check its entries (%s)", folder, err)

    def record_all() -> None:
        for folder, suffixes in _pytensor_folders():
            if folder.is_dir():
                record(folder, "", suffixes)

    atexit.register(record_all)
