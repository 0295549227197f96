"""Atomic writes of stage outputs.

Every output is written to a temporary file in the destination directory and
renamed into place, so a killed stage never leaves a partial file at an output
path. A stage's outputs are committed together (:func:`staged_outputs`): every
temporary is written first, then all are renamed, metrics last, with SIGINT and
SIGTERM held back during the renames; temporaries that a killed run left are
removed the next time that output is written. Nothing non-finite is written (:func:`check_finite`).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from hbnn.errors import (
    NonFiniteError,
    OutputError,
    commit_section,
    interrupt_received,
    run_commit_checks,
)
from hbnn.files import integrity
from hbnn.files.trace import Trace, write_netcdf_groups

# A temporary's name adds 14 bytes to its output's (``.<name>.<8 random>.tmp``); past this many bytes the output's
# name is replaced by its hash there, so that any name the file system takes (255 bytes) can be written
LONG_NAME_BYTES = 200


def _temporary_stem(path: Path) -> str:
    """What the temporaries of ``path`` are named after: its name, or its name's hash where that is long."""
    if len(path.name.encode()) <= LONG_NAME_BYTES:
        return path.name
    return "long-" + hashlib.sha256(path.name.encode()).hexdigest()[:32]


def _temporary(path: Path) -> Path:
    """A new empty temporary file beside ``path``, after removing those a killed run left there."""
    if path.parent.exists() and not path.parent.is_dir():
        raise NotADirectoryError(20, f"its folder {path.parent} is a file, not a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    stem = _temporary_stem(path)
    for stale in path.parent.glob(f".{glob.escape(stem)}.*.tmp"):
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def _seal(tmp: Path) -> None:
    """Flush ``tmp`` to disk and give it the permissions a plain ``open()`` would (mkstemp makes 0600)."""
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o666 & ~_umask())


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Turn a failure to write ``path`` into an :class:`OutputError` naming it and the free space there.

    File writers report a full disk in their own ways: ``OSError`` (ENOSPC) from
    Python, ``RuntimeError("NetCDF: HDF error")`` from netCDF4.
    """
    try:
        yield
    except (OSError, RuntimeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else f"{type(err).__name__}: {err}"
        free = ""
        if not isinstance(err, OSError) or err.errno in (errno.ENOSPC, errno.EDQUOT):  # a full disk: say how full
            with contextlib.suppress(OSError):
                free = f"; {shutil.disk_usage(path.parent).free / 2**20:.1f} MiB free on its disk"
        raise OutputError(f"cannot write {path} ({why}{free}); earlier outputs are unchanged") from err


class Outputs:
    """A stage's outputs, written to temporaries and committed together by :meth:`commit`.

    Use through :func:`staged_outputs`. Each ``write_*`` method writes the whole
    file to a temporary beside its destination; nothing at a destination changes
    until :meth:`commit`, which renames them all (JSON files, the metrics, last)
    and then removes the files passed to :meth:`remove`.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []  # (temporary, destination)
        self._removals: list[Path] = []

    @contextlib.contextmanager
    def path(self, path: str | Path) -> Iterator[Path]:
        """A temporary path to write an output's content to; it is staged once the block ends.

        Parameters
        ----------
        path : str or pathlib.Path
            The destination.

        Yields
        ------
        pathlib.Path
            The temporary, beside the destination.

        Raises
        ------
        hbnn.errors.OutputError
            Where the temporary cannot be written (a full disk, a missing folder).
        """
        path = Path(path)
        with _writing(path):
            tmp = _temporary(path)
            self._staged.append((tmp, path))
            yield tmp
            _seal(tmp)

    def write_json(self, obj: Any, path: str | Path) -> None:
        """Stage ``obj`` as stable, sorted, indented JSON.

        Parameters
        ----------
        obj : object
            JSON-serialisable data.
        path : str or pathlib.Path
            The destination.

        Raises
        ------
        hbnn.errors.NonFiniteError
            Where a value is NaN or infinite.
        """
        try:
            text = json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"
        except ValueError as err:
            raise NonFiniteError(f"{path}: refusing to write a non-finite value ({err})") from err
        with self.path(path) as tmp:
            tmp.write_text(text)

    def write_text(self, text: str, path: str | Path) -> None:
        """Stage ``text`` as a text file.

        Parameters
        ----------
        text : str
        path : str or pathlib.Path
            The destination.
        """
        with self.path(path) as tmp:
            tmp.write_text(text)

    def write_bytes(self, data: bytes, path: str | Path) -> None:
        """Stage ``data`` as a binary file.

        Parameters
        ----------
        data : bytes
        path : str or pathlib.Path
            The destination.
        """
        with self.path(path) as tmp:
            tmp.write_bytes(data)

    def write_netcdf(self, obj: Trace | xr.Dataset, path: str | Path) -> None:
        """Stage a trace or dataset as NetCDF, uncompressed, each group with its checksum.

        ArviZ compresses every numeric variable by default, but draws barely compress and zlib is most of the
        writing time (benchmarks/FINDINGS.md, "The overheads around the sampling"). Checksums:
        :mod:`hbnn.files.integrity`.

        Parameters
        ----------
        obj : hbnn.files.trace.Trace or xarray.Dataset
            What to save.
        path : str or pathlib.Path
            The destination.

        Raises
        ------
        hbnn.errors.NonFiniteError
            Where a checked value is NaN or infinite (:func:`check_finite`).
        """
        check_finite(obj, str(path))
        with self.path(path) as tmp:
            if isinstance(obj, xr.Dataset):  # netCDF4, xarray's default engine where it is installed
                write_netcdf_groups({None: integrity.sealed(obj)}, tmp, "netcdf4")
            else:  # a Trace (ArviZ's InferenceData writes the same way)
                Trace(**{name: integrity.sealed(obj[name]) for name in obj.groups()}).to_netcdf(str(tmp),
                                                                                              compress=False)

    def remove(self, path: str | Path) -> None:
        """Delete a file when the outputs are committed (an output the stage does not write for these params).

        Parameters
        ----------
        path : str or pathlib.Path
            The file.
        """
        self._removals.append(Path(path))

    def commit(self) -> None:
        """Rename every staged file onto its destination, JSON last, with interrupts held back.

        Raises
        ------
        Exception
            Whatever a check that :func:`hbnn.errors.checked_before_commit` holds raises to refuse, before any
            rename.
        """
        order = sorted(self._staged, key=lambda staged: staged[1].suffix == ".json")
        if interrupt_received():  # a Ctrl-C whose KeyboardInterrupt a library callback swallowed
            raise KeyboardInterrupt
        run_commit_checks()
        with commit_section():
            for tmp, path in order:
                with _writing(path):
                    os.replace(tmp, path)
            for path in self._removals:
                path.unlink(missing_ok=True)
        self._staged.clear()

    def discard(self) -> None:
        """Remove every temporary not yet committed."""
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged.clear()


@contextlib.contextmanager
def staged_outputs() -> Iterator[Outputs]:
    """Collect a stage's outputs; commit them together if the block succeeds, else discard them all.

    Yields
    ------
    Outputs
        The stage's outputs.
    """
    outputs = Outputs()
    try:
        yield outputs
        outputs.commit()
    finally:
        outputs.discard()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def detail_path(metrics_out: str | Path) -> Path:
    """Where a stage's complete metrics go (per group, every diagnostic): ``detail/`` beside ``metrics_out``.

    ``metrics_out`` is the file DVC declares as metrics and holds the headline
    keys only, because ``dvc exp show`` makes one column per key; the detail
    file is a plain output, diffed with ``dvc metrics diff --targets <it>``.

    Parameters
    ----------
    metrics_out : str or pathlib.Path
        The headline metrics file.

    Returns
    -------
    pathlib.Path
        The detail file.
    """
    return Path(metrics_out).parent / "detail" / Path(metrics_out).name


def write_json(obj: Any, path: str | Path) -> None:
    """Write ``obj`` as stable, sorted, indented JSON, atomically.

    Parameters
    ----------
    obj : object
        JSON-serialisable data.
    path : str or pathlib.Path
        The destination.

    Raises
    ------
    hbnn.errors.NonFiniteError
        Where a value is NaN or infinite.
    hbnn.errors.OutputError
        Where the file cannot be written.
    """
    with staged_outputs() as outputs:
        outputs.write_json(obj, path)


def write_text(text: str, path: str | Path) -> None:
    """Save ``text`` to ``path``, atomically.

    Parameters
    ----------
    text : str
    path : str or pathlib.Path
        The destination.

    Raises
    ------
    hbnn.errors.OutputError
        Where the file cannot be written.
    """
    with staged_outputs() as outputs:
        outputs.write_text(text, path)


def write_netcdf(obj: Trace | xr.Dataset, path: str | Path) -> None:
    """Save a trace or dataset to NetCDF, atomically.

    Parameters
    ----------
    obj : hbnn.files.trace.Trace or xarray.Dataset
        What to save.
    path : str or pathlib.Path
        The destination.

    Raises
    ------
    hbnn.errors.NonFiniteError
        Where a checked value is NaN or infinite.
    hbnn.errors.OutputError
        Where the file cannot be written.
    """
    with staged_outputs() as outputs:
        outputs.write_netcdf(obj, path)


# sample_stats may hold NaN by design (e.g. PyMC's unused eigenvalue stats).
UNCHECKED_GROUPS = ("sample_stats", "warmup_sample_stats")


def check_finite(obj: Trace | xr.Dataset, what: str) -> None:
    """Refuse NaN or infinite floats in a trace or dataset.

    Parameters
    ----------
    obj : hbnn.files.trace.Trace or xarray.Dataset
        What to check; for a trace the groups in :data:`UNCHECKED_GROUPS` are skipped.
    what : str
        What it is, for the message.

    Raises
    ------
    hbnn.errors.NonFiniteError
        Naming the variable, if any float is NaN or infinite.
    """
    if not isinstance(obj, xr.Dataset):  # a trace
        datasets = [(f"{what} group {g}", obj[g]) for g in obj.groups() if g not in UNCHECKED_GROUPS]
    else:
        datasets = [(what, obj)]
    for where, ds in datasets:
        for name, da in ds.data_vars.items():
            if np.issubdtype(da.dtype, np.floating) and not np.isfinite(da.values).all():
                bad = int((~np.isfinite(da.values)).sum())
                raise NonFiniteError(f"{where}: {name} has {bad} non-finite values; nothing was written")
