import os

import arviz as az
import numpy as np
import pytest
import xarray as xr

from hbnn.io import InputError, atomic_path, load_dataset, load_trace, provenance, stamp, write_json, write_netcdf


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]


def test_atomic_outputs_get_normal_permissions(tmp_path):
    write_json({}, tmp_path / "m.json")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o666 & ~mask


def test_write_json_is_stable_and_rejects_nan(tmp_path):
    write_json({"b": 1, "a": {"d": 2, "c": 3}}, tmp_path / "m.json")
    assert (tmp_path / "m.json").read_text() == '{\n  "a": {\n    "c": 3,\n    "d": 2\n  },\n  "b": 1\n}\n'
    with pytest.raises(ValueError):
        write_json({"x": float("nan")}, tmp_path / "n.json")


def _trace(variant):
    idata = az.from_dict(posterior={"w": np.zeros((2, 3))}, sample_stats={"diverging": np.zeros((2, 3), bool)},
                         observed_data={"y": np.zeros(4)})
    return stamp(idata, provenance("fit_x", variant, "0", {}))


def test_load_trace_checks_variant(tmp_path):
    path = tmp_path / "t.nc"
    write_netcdf(_trace("flat"), path)
    assert load_trace(path, "flat").posterior.attrs["hbnn_variant"] == "flat"
    with pytest.raises(InputError, match="holds model variant 'flat', expected 'hierarchical'"):
        load_trace(path, "hierarchical")


def test_truncated_and_missing_files_give_clear_errors(tmp_path):
    path = tmp_path / "t.nc"
    write_netcdf(_trace("flat"), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=str(path)):
        load_trace(path, "flat")
    with pytest.raises(InputError, match="does not exist"):
        load_trace(tmp_path / "missing.nc", "flat")
    ds_path = tmp_path / "d.nc"
    write_netcdf(xr.Dataset({"a": ("x", np.arange(3))}), ds_path)
    with pytest.raises(InputError, match=r"lacks variables \['b'\]"):
        load_dataset(ds_path, "tasks file", required=("a", "b"))
