"""Folders under the home directory that hbnn and its libraries write to, moved where they cannot be written.

hbnn's kernel cache (``$XDG_CACHE_HOME/hbnn``), ArviZ (a stamp in ``$XDG_CACHE_HOME/arviz`` at import), PyTensor
(``~/.pytensor``, its compiled graphs) and matplotlib (``$XDG_CONFIG_HOME/matplotlib``) all write under the home
directory; where it is read-only, missing or not a directory, ArviZ's import and PyTensor's first compile stop
with a traceback. :func:`use_writable_homes` runs as a stage or an ``hbnn`` command starts
(:func:`hbnn.errors.interrupts_reported`), before those libraries load: each
such folder that cannot be written is replaced, for this process and the ones it starts, by one in a temporary
folder removed at exit, and :func:`moved` says which (the stages log it). Compiled code is then not kept between
runs, which costs time, not results: the same code compiles to the same machine code.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

_MOVED: list[str] = []  # what use_writable_homes moved, for the log


def _writable(folder: Path) -> bool:
    """Whether ``folder`` exists or can be made, and a file can be created in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".hbnn-probe-")
        os.close(fd)
        os.unlink(probe)
        return True
    except OSError:
        return False


def _home() -> Path:
    return Path(os.environ.get("HOME") or os.path.expanduser("~"))


def use_writable_homes() -> None:
    """Point the cache and configuration folders that cannot be written at a temporary folder (see the module)."""
    spare: list[Path] = []

    def temporary(name: str) -> str:
        if not spare:
            spare.append(Path(tempfile.mkdtemp(prefix="hbnn-home-")))
            atexit.register(shutil.rmtree, spare[0], ignore_errors=True)
        return str(spare[0] / name)

    cache = Path(os.environ.get("XDG_CACHE_HOME") or _home() / ".cache")
    if not all(_writable(folder) for folder in (cache, cache / "arviz", cache / "hbnn")):
        os.environ["XDG_CACHE_HOME"] = temporary("cache")
        _MOVED.append(f"caches ({cache})")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or _home() / ".config")
    if not os.environ.get("MPLCONFIGDIR") and not _writable(config / "matplotlib"):
        os.environ["MPLCONFIGDIR"] = temporary("matplotlib")
        _MOVED.append(f"matplotlib's settings ({config / 'matplotlib'})")
    flags = os.environ.get("PYTENSOR_FLAGS", "")
    if "compiledir" not in flags and not _writable(_home() / ".pytensor"):
        os.environ["PYTENSOR_FLAGS"] = ",".join(filter(None, [flags, f"base_compiledir={temporary('pytensor')}"]))
        _MOVED.append(f"PyTensor's compiled graphs ({_home() / '.pytensor'})")


def moved() -> list[str]:
    """What :func:`use_writable_homes` moved to a temporary folder in this process (empty where nothing was)."""
    return list(_MOVED)
