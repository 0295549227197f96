"""Atomic writes, provenance attrs and checked loading of stage outputs.

Every output is written to a temporary file in the destination directory and
renamed into place, so a killed stage never leaves a partial file at an output
path. Loaders turn unreadable or mismatched files into :class:`InputError`
naming the file and what is wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
import xarray as xr

PACKAGES = ("hbnn", "pymc", "pytensor", "nutpie", "arviz", "numpy", "xarray", "scikit-learn")


class InputError(RuntimeError):
    """An input file is missing, unreadable or not what this stage expects."""


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    On any exception (or a kill before the rename) the destination is untouched
    and the temporary file is removed where possible.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        # mkstemp creates 0600 files; give outputs the permissions a plain open() would.
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(obj: Any, path: str | Path) -> None:
    """Write ``obj`` as stable, sorted, indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def write_text(text: str, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_bytes(data: bytes, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_netcdf(obj: az.InferenceData | xr.Dataset, path: str | Path) -> None:
    """Save an ``InferenceData`` or ``Dataset`` to NetCDF, atomically."""
    with atomic_path(path) as tmp:
        obj.to_netcdf(str(tmp))


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def provenance(stage: str, variant: str, params_hash: str, settings: dict[str, Any]) -> dict[str, str]:
    """NetCDF-safe attrs saying what produced a file (nested values as JSON)."""
    return {
        "hbnn_stage": stage,
        "hbnn_variant": variant,
        "hbnn_params_hash": params_hash,
        "hbnn_settings": json.dumps(settings, sort_keys=True),
        "hbnn_versions": json.dumps(package_versions(), sort_keys=True),
    }


def stamp(idata: az.InferenceData, attrs: dict[str, str]) -> az.InferenceData:
    """Copy provenance attrs onto every group of ``idata`` (in place) and return it."""
    for name in idata.groups():
        idata[name].attrs.update(attrs)
    return idata


def _check_exists(path: Path, what: str) -> None:
    if not path.is_file():
        raise InputError(f"{what} {path} does not exist; run the stage that writes it first (dvc repro)")


def load_dataset(path: str | Path, what: str, required: tuple[str, ...] = ()) -> xr.Dataset:
    """Open a NetCDF dataset fully into memory, checking for required variables."""
    path = Path(path)
    _check_exists(path, what)
    try:
        with xr.open_dataset(path) as ds:
            ds = ds.load()
    except Exception as err:  # noqa: BLE001 - any decode failure means a bad file
        raise InputError(f"{what} {path} is not a readable NetCDF file ({type(err).__name__}: {err})") from err
    missing = [v for v in required if v not in ds.variables]
    if missing:
        raise InputError(f"{what} {path} lacks variables {missing}; it was not written by this stage")
    return ds


def load_trace(
    path: str | Path,
    variant: str,
    groups: tuple[str, ...] = ("posterior", "sample_stats", "observed_data"),
) -> az.InferenceData:
    """Open a trace and check it came from the expected model variant."""
    path = Path(path)
    _check_exists(path, "trace")
    try:
        idata = az.from_netcdf(str(path))
        for name in groups:
            idata[name].load()
    except KeyError as err:
        raise InputError(f"trace {path} has no {err} group") from err
    except Exception as err:  # noqa: BLE001
        raise InputError(f"trace {path} is not a readable NetCDF trace ({type(err).__name__}: {err})") from err
    found = idata.posterior.attrs.get("hbnn_variant")
    if found != variant:
        raise InputError(f"trace {path} holds model variant {found!r}, expected {variant!r}")
    return idata


def settings_from_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """Decode the ``hbnn_settings`` JSON attr."""
    return json.loads(attrs.get("hbnn_settings", "{}"))


def as_builtin(x: Any) -> Any:
    """NumPy scalars to Python scalars, rounding floats for readable diffs."""
    if isinstance(x, dict):
        return {str(k): as_builtin(v) for k, v in x.items()}
    if isinstance(x, (np.floating, float)):
        return None if not np.isfinite(x) else round(float(x), 6)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.bool_,)):
        return bool(x)
    return x
