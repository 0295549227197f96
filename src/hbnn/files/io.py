"""Atomic writes, provenance attrs and checked loading of stage outputs.

Every output is written to a temporary file in the destination directory and
renamed into place, so a killed stage never leaves a partial file at an output
path. A stage's outputs are committed together (:func:`staged_outputs`): every
temporary is written first, then all are renamed, metrics last, with SIGINT and
SIGTERM held back during the renames; temporaries that a killed run left are
removed the next time that output is written. Loaders turn unreadable or
mismatched files into :class:`InputError` naming the file and what is wrong.
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
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from hbnn.errors import (
    InputError,
    NonFiniteError,
    OutputError,
    commit_section,
    interrupt_received,
    run_commit_checks,
)
from hbnn.files import integrity
from hbnn.files.trace import Trace, write_netcdf_groups

# the packages whose versions a file's provenance records: those that decide its numbers
PACKAGES = ("hbnn", "pymc", "pytensor", "nutpie", "arviz", "numpy", "xarray", "scikit-learn")


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
        with self.path(path) as tmp:
            tmp.write_text(text)

    def write_bytes(self, data: bytes, path: str | Path) -> None:
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


def package_versions() -> dict[str, str]:
    """The installed versions of :data:`PACKAGES`.

    Returns
    -------
    dict of str to str
        Per package, its version or ``"not installed"``.
    """
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def provenance(stage: str, variant: str, params_hash: str, settings: dict[str, Any]) -> dict[str, str]:
    """NetCDF-safe attrs saying what produced a file (nested values as JSON).

    Parameters
    ----------
    stage : str
        The stage that writes the file.
    variant : str
        The model variant.
    params_hash : str
        The hash of the params the stage read.
    settings : dict
        The settings to record.

    Returns
    -------
    dict of str to str
        The ``hbnn_*`` attrs.
    """
    return {
        "hbnn_stage": stage,
        "hbnn_variant": variant,
        "hbnn_params_hash": params_hash,
        "hbnn_settings": json.dumps(settings, sort_keys=True),
        "hbnn_versions": json.dumps(package_versions(), sort_keys=True),
    }


# What a trace records of the clock: ArviZ's creation time, and PyMC's (also NumPyro's and BlackJAX's, through
# pm.sample) sampling time and per-draw timers. The stage's timings/*.json hold its seconds instead.
RUN_TIME_ATTRS = ("created_at", "sampling_time")
RUN_TIME_STATS = ("perf_counter_start", "perf_counter_diff", "process_time_diff")


def stamp(idata: Trace, attrs: dict[str, str]) -> Trace:
    """Copy provenance attrs onto every group of ``idata`` (in place) and return it.

    Drops what records the clock (:data:`RUN_TIME_ATTRS`, :data:`RUN_TIME_STATS`), so the same params write a
    byte-identical trace whatever the backend: DVC then sees an unchanged output, and a rerun of a stage upstream
    that changes nothing does not rerun the stages after it.

    Parameters
    ----------
    idata : hbnn.files.trace.Trace
        The trace, changed in place.
    attrs : dict of str to str
        The provenance attrs (:func:`provenance`).

    Returns
    -------
    hbnn.files.trace.Trace
        ``idata``.
    """
    for name in idata.groups():
        group = idata[name]
        for var in RUN_TIME_STATS:
            if var in group.data_vars:
                del group[var]
        for attr in RUN_TIME_ATTRS:
            group.attrs.pop(attr, None)
        group.attrs.update(attrs)
    return idata


def _check_exists(path: Path, what: str) -> None:
    if path.exists() and not path.is_file():  # a folder, a pipe, a device: nothing a stage wrote
        raise InputError(f"{what} {path} is not a regular file; run the stage that writes it (dvc repro)")
    if not path.is_file():
        raise InputError(f"{what} {path} does not exist; run the stage that writes it first (dvc repro)")


def load_dataset(path: str | Path, what: str, required: tuple[str, ...] = ()) -> xr.Dataset:
    """Open a NetCDF dataset fully into memory, checking for required variables.

    Parameters
    ----------
    path : str or pathlib.Path
        The file.
    what : str
        What it is, for messages (``"tasks file"``).
    required : tuple of str, optional
        Variables it must hold.

    Returns
    -------
    xarray.Dataset
        The dataset, loaded.

    Raises
    ------
    hbnn.errors.InputError
        If the file is missing, not a file, unreadable or lacks a required variable.
    """
    path = Path(path)
    _check_exists(path, what)
    try:
        with xr.open_dataset(path) as ds:
            ds = ds.load()
    except Exception as err:  # noqa: BLE001 - any decode failure means a bad file
        raise InputError(f"{what} {path} is not a readable NetCDF file ({type(err).__name__}: {err})") from err
    integrity.check(ds, f"{what} {path}")
    missing = [v for v in required if v not in ds.variables]
    if missing:
        raise InputError(f"{what} {path} lacks variables {missing}; it was not written by this stage")
    return ds


def load_trace(
    path: str | Path,
    variant: str,
    groups: tuple[str, ...] = ("posterior", "sample_stats", "observed_data"),
    params=None,
    only: tuple[str, ...] | None = None,
    stage: str | None = None,
) -> Trace:
    """Open a trace and check it came from the expected model variant, stage and params.

    Every group of the file (or of ``only``, ``groups`` and ``posterior``, which the checks read, those the file
    has: a reader that needs a few groups of the seven skips decoding the others) is opened as ``az.from_netcdf``
    opens it (xarray, h5netcdf, lazily) and those in ``groups`` are loaded; read without importing ArviZ, whose
    import costs seconds (the report's workers, forked before it is imported, read their traces this way;
    benchmarks/FINDINGS.md, "Measurements behind code comments"). Each opened group is checked against its checksum
    (:func:`hbnn.files.integrity.check`), which reads its values once; xarray keeps them. Close it with
    :func:`close_trace`.

    Parameters
    ----------
    path : str or pathlib.Path
        The trace.
    variant : str
        The model variant it must come from.
    groups : tuple of str, optional
        The groups to load into memory.
    params : hbnn.config.Params, optional
        Given, the trace must have been made with these params.
    only : tuple of str, optional
        Given, open only these groups (and those the checks read).
    stage : str, optional
        Given, the trace must have been made by this stage (:func:`check_made_with`).

    Returns
    -------
    hbnn.files.trace.Trace
        The trace.

    Raises
    ------
    hbnn.errors.InputError
        If the file is missing or unreadable, fails its checksum, or comes from another variant, stage or params.
    """
    import h5netcdf

    path = Path(path)
    _check_exists(path, "trace")
    opened: dict[str, xr.Dataset] = {}
    try:
        with h5netcdf.File(path, mode="r") as f:
            names = [name for name in f.groups
                     if only is None or name in only or name in groups or name == "posterior"]
        for name in names:
            opened[name] = xr.open_dataset(path, group=name, engine="h5netcdf")
        for name in groups:
            opened[name].load()
        trace = Trace(**opened)
        for name, ds in opened.items():
            integrity.check(ds, f"trace {path} (group {name})")
    except InputError:
        close_trace(opened)
        raise
    except KeyError as err:
        close_trace(opened)
        raise InputError(f"trace {path} has no {err} group") from err
    except Exception as err:  # noqa: BLE001
        close_trace(opened)
        raise InputError(f"trace {path} is not a readable NetCDF trace ({type(err).__name__}: {err})") from err
    if "posterior" not in trace:
        close_trace(trace)
        raise InputError(f"trace {path} has no 'posterior' group")
    try:
        _check_trace(trace.posterior.attrs, variant, params, path, stage)
    except InputError:
        close_trace(trace)
        raise
    return trace


def close_trace(trace) -> None:
    """Close every group of a trace :func:`load_trace` opened.

    Parameters
    ----------
    trace : hbnn.files.trace.Trace or mapping
        The trace, or its groups by name.
    """
    for ds in trace.values():
        ds.close()


def load_posterior(path: str | Path, variant: str, params=None, stage: str | None = None) -> xr.Dataset:
    """A trace's ``posterior`` group alone, loaded, and checked as :func:`load_trace` checks it.

    Read with xarray, without importing ArviZ, which a stage that needs no more of the trace would otherwise pay
    for (benchmarks/FINDINGS.md, "The overheads around the sampling").

    Parameters
    ----------
    path : str or pathlib.Path
        The trace.
    variant : str
        The model variant it must come from.
    params : hbnn.config.Params, optional
        Given, the trace must have been made with these params.
    stage : str, optional
        Given, the trace must have been made by this stage.

    Returns
    -------
    xarray.Dataset
        The posterior.

    Raises
    ------
    hbnn.errors.InputError
        If the file is missing or unreadable, has no posterior, or comes from another variant, stage or params.
    """
    path = Path(path)
    _check_exists(path, "trace")
    try:
        with xr.open_dataset(path, group="posterior", engine="h5netcdf") as ds:
            posterior = ds.load()
    except Exception as err:  # noqa: BLE001
        if isinstance(err, OSError) and str(err.args[0] if err.args else "").startswith("group not found"):
            raise InputError(f"trace {path} has no 'posterior' group") from err  # h5netcdf's words, above
        raise InputError(f"trace {path} is not a readable NetCDF trace ({type(err).__name__}: {err})") from err
    integrity.check(posterior, f"trace {path} (group posterior)")
    _check_trace(posterior.attrs, variant, params, path, stage)
    return posterior


def _check_trace(attrs: dict[str, Any], variant: str, params, path: Path, stage: str | None) -> None:
    found = attrs.get("hbnn_variant")
    if found != variant:
        raise InputError(f"trace {path} holds model variant {found!r}, expected {variant!r}")
    check_made_with(attrs, params, path, stage)


def check_made_with(attrs: dict[str, Any], params, path: str | Path, stage: str | None = None) -> None:
    """Refuse a file made by another stage or with other params.

    Each stage stamps its outputs with its name (``hbnn_stage``) and the hash of the params it read
    (``hbnn_params_hash``, :data:`hbnn.pipeline.variants.STAGE_PARAMS`). Under DVC both always agree; a file copied
    over another stage's output (``traces/hier.nc`` over ``traces/transfer/hier.nc``: the held-out groups' fit would
    then have seen them), or a stage run by hand after editing ``params.yaml``, would otherwise mix outputs. A file
    without the stamps (written by hbnn's functions outside a stage) is not checked.

    Parameters
    ----------
    attrs : dict
        The file's attributes.
    params : hbnn.config.Params or None
        The params it must have been made with; ``None``: not checked.
    path : str or pathlib.Path
        The file, for the message.
    stage : str, optional
        The stage that must have made it.

    Raises
    ------
    hbnn.errors.InputError
        Naming the file and what differs.
    """
    from hbnn.pipeline.variants import STAGE_PARAMS

    made_by = attrs.get("hbnn_stage")
    if stage is not None and made_by is not None and made_by != stage:
        raise InputError(f"{path} was written by stage {made_by!r}, not by {stage} (a file copied in from another "
                         f"stage's outputs?); rerun {stage} (dvc repro)")
    stage, found = made_by, attrs.get("hbnn_params_hash")
    if params is None or stage not in STAGE_PARAMS or found is None:
        return
    keys = STAGE_PARAMS[stage]
    if found != params.section_hash(*keys):
        raise InputError(f"{path} was made by stage {stage} with other values of {', '.join(keys)} than the params "
                         f"now hold; rerun {stage} first (dvc repro)")


def made_by(stage: str, params) -> dict[str, str]:
    """The ``made_by`` entry of a stage's detail metrics (``metrics/detail/*.json``).

    The stage and the hash of the params it read, as its NetCDF outputs' attributes hold them, so that a reader
    can refuse a file copied in from another stage's outputs or made with other params (:func:`check_made_by`).

    Parameters
    ----------
    stage : str
        The stage.
    params : hbnn.config.Params
        The params it read.

    Returns
    -------
    dict of str to str
        The entry.
    """
    from hbnn.pipeline.variants import STAGE_PARAMS

    return {"stage": stage, "params_hash": params.section_hash(*STAGE_PARAMS[stage])}


def check_made_by(doc: Any, path: str | Path, stage: str, params) -> None:
    """Refuse detail metrics not written by ``stage`` with ``params`` (:func:`made_by`, :func:`check_made_with`).

    Parameters
    ----------
    doc : object
        The detail metrics as read.
    path : str or pathlib.Path
        Where they were read, for the message.
    stage : str
        The stage that must have written them.
    params : hbnn.config.Params
        The params they must have been made with.

    Raises
    ------
    hbnn.errors.InputError
        Naming the file and what differs.
    """
    found = doc.get("made_by") if isinstance(doc, dict) else None
    if found is None:  # written outside a stage: nothing to check
        return
    if not isinstance(found, dict):
        raise InputError(f"metrics file {path} has a made_by entry that is not an object; rerun {stage} (dvc repro)")
    check_made_with({"hbnn_stage": found.get("stage"), "hbnn_params_hash": found.get("params_hash")}, params,
                    path, stage)


def settings_from_attrs(attrs: dict[str, Any], where: str = "the file") -> dict[str, Any]:
    """Decode the ``hbnn_settings`` JSON attr.

    Parameters
    ----------
    attrs : dict
        A file's attributes.
    where : str, optional
        The file, for the message.

    Returns
    -------
    dict
        The settings (empty where the attr is missing).

    Raises
    ------
    hbnn.errors.InputError
        Naming ``where``, if the attr is unreadable or not a JSON object.
    """
    try:
        settings = json.loads(attrs.get("hbnn_settings", "{}"))
    except (TypeError, ValueError) as err:
        raise InputError(f"{where} has an unreadable hbnn_settings attribute ({err})") from err
    if not isinstance(settings, dict):
        raise InputError(f"{where} has an hbnn_settings attribute that is not a JSON object")
    return settings


def as_builtin(x: Any) -> Any:
    """NumPy scalars to Python scalars, rounding floats for readable diffs.

    Parameters
    ----------
    x : object
        A value, or a dict of them (nested).

    Returns
    -------
    object
        The same structure in Python builtins; a non-finite float is ``None``.
    """
    if isinstance(x, dict):
        return {str(k): as_builtin(v) for k, v in x.items()}
    if isinstance(x, (np.floating, float)):
        return None if not np.isfinite(x) else round(float(x), 6)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.bool_,)):
        return bool(x)
    return x
