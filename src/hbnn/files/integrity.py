"""Checksums that let a reader tell a NetCDF output is as its stage wrote it.

Every NetCDF file a stage writes (the tasks, the traces, the priors) carries, in the attributes of each of its
groups (a trace's ``posterior``, ``sample_stats``, ...; a plain dataset's root), ``hbnn_checksum``: the SHA-256 of
that group's variables (names, dims, dtypes, shapes, values) and attributes, as xarray reads them back
(:func:`content_hash`). Readers check the groups they use (:func:`check`) and refuse, naming the file and the group,
one whose content changed after it was written (a damaged disk or download, an edit, a save by another tool), and one
with no checksum (not written by an hbnn stage). NetCDF's own format has no such check: a few KiB of flipped bytes
in a variable's data are read back as other numbers without any error.

The checksum is over the decoded values, not the file's bytes, so it does not depend on the NetCDF library that
wrote or reads the file, and it is deterministic: the same content gives the same checksum, so the same params
still write byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from hbnn.errors import InputError

ATTR = "hbnn_checksum"


def _plain(value: Any) -> Any:
    """An attribute's value as JSON sees it: NetCDF reads lists back as arrays and numbers as NumPy scalars."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _attrs(attrs) -> bytes:
    picked = {str(k): _plain(v) for k, v in attrs.items() if k != ATTR and not str(k).startswith("_")}
    return json.dumps(picked, sort_keys=True, default=str).encode()


def _values(values: np.ndarray) -> tuple[str, bytes | np.ndarray]:
    """A variable's kind and bytes: text as its strings (NetCDF reads fixed-width text back as objects), numbers
    little-endian in C order (the array itself where it already is: hashed through its buffer, not copied)."""
    if values.dtype.kind in "OUS":
        text = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values.ravel().tolist()]
        return "text", json.dumps(text).encode()
    little = values.dtype.newbyteorder("<")
    return little.str, np.ascontiguousarray(values, little).reshape(-1).view(np.uint8)


def content_hash(ds) -> str:
    """SHA-256 of a dataset's variables and attributes, leaving out its own :data:`ATTR`.

    Parameters
    ----------
    ds : xarray.Dataset

    Returns
    -------
    str
        The hex digest.
    """
    h = hashlib.sha256()
    for name in sorted(map(str, ds.variables)):
        var = ds.variables[name]
        kind, data = _values(np.asarray(var.values))
        h.update(json.dumps([name, [str(d) for d in var.dims], list(var.shape), kind]).encode())
        h.update(len(data).to_bytes(8, "little"))  # a 1-d uint8 view's length is its bytes
        h.update(data)
        h.update(_attrs(var.attrs))
    h.update(_attrs(ds.attrs))
    return h.hexdigest()


def sealed(ds):
    """A shallow copy of ``ds`` whose attributes carry its :func:`content_hash`.

    Parameters
    ----------
    ds : xarray.Dataset

    Returns
    -------
    xarray.Dataset
    """
    out = ds.copy(deep=False)
    out.attrs = {**{k: v for k, v in ds.attrs.items() if k != ATTR}, ATTR: content_hash(ds)}
    return out


def check(ds, where: str) -> None:
    """Check that ``ds`` matches the checksum it carries.

    Parameters
    ----------
    ds : xarray.Dataset
        Loaded or lazily opened (this reads every value).
    where : str
        The file, and the group, for messages.

    Raises
    ------
    hbnn.errors.InputError
        Naming ``where`` if ``ds`` carries no checksum or does not match it.
    """
    found = ds.attrs.get(ATTR)
    if found is None:
        raise InputError(f"{where} has no {ATTR}: it was not written by an hbnn stage (or by an older version); "
                         "rerun the stage that writes it (dvc repro)")
    if str(found) != content_hash(ds):
        raise InputError(f"{where} does not match the checksum written with it: it changed after its stage wrote it "
                         "(a damaged file, an edit, or a save by another tool); rerun the stage that writes it "
                         "(dvc repro --force <stage>)")
