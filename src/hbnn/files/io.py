"""Provenance attrs and checked loading of stage outputs (their atomic writing: :mod:`hbnn.files.outputs`).

Every file a stage writes records which stage, params and package versions made it (:func:`provenance`,
:func:`made_by`); loaders turn unreadable or mismatched files into :class:`InputError` naming the file and
what is wrong.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from hbnn.errors import (
    InputError,
)
from hbnn.files import integrity
from hbnn.files.trace import Trace

# the packages whose versions a file's provenance records: those that decide its numbers
PACKAGES = ("hbnn", "pymc", "pytensor", "nutpie", "arviz", "numpy", "xarray", "scikit-learn")


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
    verify: tuple[str, ...] | None = None,
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
    verify : tuple of str, optional
        Given, only these of the opened groups are checked against their checksums: for a reader that uses a
        group's attributes alone while another process, which reads its values, checks it before anything is
        written (the report's own process and its workers).

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
            if verify is None or name in verify:
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


def load_posterior(path: str | Path, variant: str, params=None, stage: str | None = None, group: str = "posterior"
                   ) -> xr.Dataset:
    """A trace's ``posterior`` group (or ``group``) alone, loaded, and checked as :func:`load_trace` checks it.

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
    group : str, optional
        The group (``sample_stats`` for the log density per draw).

    Returns
    -------
    xarray.Dataset
        The posterior (or ``group``).

    Raises
    ------
    hbnn.errors.InputError
        If the file is missing or unreadable, has no such group, or comes from another variant, stage or params.
    """
    path = Path(path)
    _check_exists(path, "trace")
    try:
        with xr.open_dataset(path, group=group, engine="h5netcdf") as ds:
            posterior = ds.load()
    except Exception as err:  # noqa: BLE001
        if isinstance(err, OSError) and str(err.args[0] if err.args else "").startswith("group not found"):
            raise InputError(f"trace {path} has no {group!r} group") from err  # h5netcdf's words, above
        raise InputError(f"trace {path} is not a readable NetCDF trace ({type(err).__name__}: {err})") from err
    integrity.check(posterior, f"trace {path} (group {group})")
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
