"""Our own generated source compiled by numba with its disk cache: each text is written to a module file under
:func:`cache_dir`, named by a hash of the text, and imported (:func:`load`), so numba compiles it once and
every later process loads the machine code.

The cache's entries are loaded only as they were written (:mod:`hbnn.density.cache_guard`), and where that cannot
be done :func:`load` compiles the same text elsewhere: a damaged or unusable cache costs time, never a different
draw. The hand-written densities (:mod:`hbnn.density.written`) and the compiled forward passes
(:mod:`hbnn.model.forward`) are loaded this way.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import threading
import types
from pathlib import Path

from hbnn.density import cache_guard

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where the written-out modules live.

    Returns
    -------
    pathlib.Path
        ``$HBNN_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/hbnn/kernels`` (``~/.cache/hbnn/kernels``).
    """
    if os.environ.get("HBNN_KERNEL_CACHE"):
        return Path(os.environ["HBNN_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hbnn" / "kernels"


LOADING = threading.Lock()  # one thread writes and imports a module at a time; the others then find it whole


_LOADED: dict[str, Path] = {}  # module name -> the folder it was imported from (its entries recorded at exit)


def load(name: str, source: str, defines: str, depends: tuple[str, ...] = ()):
    """The module ``name`` with ``source``, imported once per process.

    From the shared cache (:func:`cache_dir`), whose entries numba may load only as they were written
    (:func:`hbnn.density.cache_guard.verify`); where importing there fails (an entry damaged in a way its hash could not
    show, a folder that cannot be written), its entries are removed and it is tried once more, then in a folder of
    this process's own, and last compiled in memory without any cache. Every way compiles the same source, so the
    machine code, and the draws, are the same; only the time to compile differs. A warning says which way was taken.

    Parameters
    ----------
    name : str
        The module's name (a hash of ``source``, so a changed text is another module).
    source : str
        The module's Python source.
    defines : str
        The callable the module must define; a module without it counts as failed.
    depends : tuple of str, optional
        The written modules it imports, whose functions numba compiles (or loads) as it runs.

    Returns
    -------
    types.ModuleType
    """
    if name in sys.modules:
        return sys.modules[name]
    problems = []
    for folder, attempt in ((cache_dir, "the shared cache"), (cache_dir, "the shared cache, emptied"),
                            (_private_dir, "a folder of this process")):
        try:
            module = _import_at(folder(), name, source, defines)
        except Exception as err:  # noqa: BLE001 - any failure: try the next way, which compiles the same source
            problems.append(f"{attempt}: {type(err).__name__}: {err}")
            for stem in (name, *depends):  # what importing it may have loaded
                with contextlib.suppress(Exception):
                    cache_guard.purge(_LOADED.get(stem, folder()) / "__pycache__", stem)
            continue
        if problems:
            log.warning("kernel: %s could not be used from %s; compiled in %s", name, "; ".join(problems), attempt)
        return module
    log.warning("kernel: %s could not be used from any folder (%s); compiled in memory, without a cache", name,
                "; ".join(problems))
    return _exec_in_memory(name, source, defines)


def _import_at(folder: Path, name: str, source: str, defines: str):
    """Import the module ``name`` from ``folder``, writing its file first where it is missing or differs."""
    path = folder / f"{name}.py"
    entries = folder / "__pycache__"
    entries.mkdir(parents=True, exist_ok=True)
    if not os.access(entries, os.W_OK):
        raise PermissionError(f"{entries} cannot be written")
    cache_guard.keep_beside(folder)
    cache_guard.verify(entries, name)
    if path.exists() and path.read_bytes() != source.encode():  # damaged after it was written: write it again
        log.warning("kernel: %s does not hold what its name says; writing it again", path)
        cache_guard.purge(entries, name)
        path.unlink(missing_ok=True)
    if not path.exists():
        _write(path, source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    _run(module, spec.loader.exec_module, defines)
    _LOADED[name] = folder
    record(name)
    return module


def _write(path: Path, source: str) -> None:
    """Write ``path`` whole and readable by whoever shares the cache, keeping a file another process put there
    first (and its time stamp, which numba's cache of it keys on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:  # where links are not supported, the rename is atomic too
            os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _run(module, execute, defines: str) -> None:
    """Run ``execute(module)`` with the module in ``sys.modules`` meanwhile, as an import does: a cfunc compiles as
    its module runs, and numba caches only functions whose module it can find. Other threads look only under
    :data:`LOADING`, so see it only whole."""
    sys.modules[module.__name__] = module
    try:
        execute(module)
        if not callable(getattr(module, defines, None)):
            raise ImportError(f"{module.__name__} defines no {defines}")
    except BaseException:
        del sys.modules[module.__name__]
        raise


def _exec_in_memory(name: str, source: str, defines: str):
    """The module compiled from ``source`` in memory, its functions without numba's disk cache."""
    module = types.ModuleType(name)
    code = compile(source.replace("cache=True", "cache=False"), f"<{name}>", "exec")
    _run(module, lambda m: exec(code, m.__dict__), defines)  # noqa: S102 - our own text
    return module


_PRIVATE: list[Path] = []


def _private_dir() -> Path:
    """A folder of this process's own for written modules (removed when it exits)."""
    if not _PRIVATE:
        folder = Path(tempfile.mkdtemp(prefix="hbnn-kernels-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _PRIVATE.append(folder)
    return _PRIVATE[0]


def record(name: str) -> None:
    """Record the entries of the module ``name`` as they are now (:func:`hbnn.density.cache_guard.record`).

    Parameters
    ----------
    name : str
        A module this process loaded with :func:`load`.
    """
    entries = _LOADED[name] / "__pycache__"
    if entries.is_dir():
        cache_guard.record(entries, name)


@atexit.register
def _record_all() -> None:
    """At exit, record what this process's modules compiled since they were imported (numba compiles an ``njit``
    function, and writes its entries, when it is first called)."""
    for name in list(_LOADED):
        with contextlib.suppress(Exception):
            record(name)


def function_source(text: str, name: str) -> str:
    """The source of a top-level function in a module's text, decorators included.

    Read from the text, not with ``ast.parse``, which CPython 3.11 does not allow in two threads at once ("AST
    constructor recursion depth mismatch").

    Parameters
    ----------
    text : str
        A module's source.
    name : str
        The function.

    Returns
    -------
    str
        From its decorators to the next line at column 0.

    Raises
    ------
    StopIteration
        Where ``text`` has no top-level ``def name(``.
    """
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}("))
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0].isspace()):
        end += 1
    while start > 0 and lines[start - 1].startswith("@"):
        start -= 1
    return "".join(lines[start:end]).rstrip() + "\n"


INLINE = '@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")'  # how text is compiled in


def compiled(text: str) -> str:
    """``text`` with every top-level function decorated with :data:`INLINE`: how a likelihood's or an activation's
    compiled source (plain functions, so that its module needs no numba) is compiled into a generated module.

    Parameters
    ----------
    text : str
        Python source: imports and plain top-level functions.

    Returns
    -------
    str
        The same source, each ``def`` at column 0 preceded by :data:`INLINE`.
    """
    return "".join(f"{INLINE}\n{line}" if line.startswith("def ") else line
                   for line in text.splitlines(keepends=True))
