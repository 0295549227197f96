import errno
import json
import os
from pathlib import Path

import arviz as az
import numpy as np
import pytest
import xarray as xr

from hbnn.errors import NonFiniteError, OutputError
from hbnn.files.io import (
    InputError,
    close_trace,
    load_dataset,
    load_posterior,
    load_trace,
    provenance,
    stamp,
)
from hbnn.files.outputs import check_finite, staged_outputs, write_json, write_netcdf


def test_a_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(ValueError), staged_outputs() as out, out.path(target) as tmp:
        tmp.write_text("half")
        raise ValueError("killed")
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
    with pytest.raises(NonFiniteError):
        write_json({"x": float("nan")}, tmp_path / "n.json")
    assert not (tmp_path / "n.json").exists()
    assert not list(tmp_path.glob(".*.tmp"))


def _outputs(tmp_path):
    trace, metrics = tmp_path / "traces" / "t.nc", tmp_path / "metrics" / "m.json"
    write_netcdf(xr.Dataset({"a": ("x", np.arange(3.0))}), trace)
    write_json({"old": 1}, metrics)
    return trace, metrics, {p: p.read_bytes() for p in (trace, metrics)}


def test_staged_outputs_commit_together_or_not_at_all(tmp_path):
    trace, metrics, before = _outputs(tmp_path)
    with pytest.raises(KeyboardInterrupt), staged_outputs() as out:
        out.write_netcdf(xr.Dataset({"a": ("x", np.arange(4.0))}), trace)
        out.write_json({"new": 1}, metrics)
        raise KeyboardInterrupt  # a Ctrl-C after every temporary was written, before the commit
    assert {p: p.read_bytes() for p in before} == before
    assert not list(tmp_path.rglob(".*.tmp"))
    with staged_outputs() as out:
        out.write_json({"new": 1}, metrics)  # staged first, committed last: metrics follow the trace
        out.write_netcdf(xr.Dataset({"a": ("x", np.arange(4.0))}), trace)
        order = [dest.suffix for _, dest in sorted(out._staged, key=lambda s: s[1].suffix == ".json")]
        assert order == [".nc", ".json"]
    assert json.loads(metrics.read_text()) == {"new": 1}


def test_non_finite_results_are_never_written(tmp_path):
    trace, metrics, before = _outputs(tmp_path)
    with pytest.raises(NonFiniteError, match="a has 1 non-finite"), staged_outputs() as out:
        out.write_json({"new": 1}, metrics)
        out.write_netcdf(xr.Dataset({"a": ("x", np.array([0.0, np.inf]))}), trace)
    assert {p: p.read_bytes() for p in before} == before
    with pytest.raises(NonFiniteError, match="posterior: w"):
        check_finite(az.from_dict(posterior={"w": np.full((1, 2), np.nan)}), "trace")
    # sample_stats may hold NaN by design (PyMC's eigenvalue stats)
    check_finite(az.from_dict(posterior={"w": np.zeros((1, 2))}, sample_stats={"e": np.full((1, 2), np.nan)}), "t")


def test_leftover_temporaries_of_a_killed_run_are_removed(tmp_path):
    trace, metrics, _ = _outputs(tmp_path)
    leftover = metrics.parent / f".{metrics.name}.abc123.tmp"
    leftover.write_text("half")
    other = metrics.parent / ".other.json.abc123.tmp"  # another output's: not this write's business
    other.write_text("half")
    write_json({"new": 1}, metrics)
    assert not leftover.exists() and other.exists()


def test_a_full_disk_is_one_error_and_leaves_earlier_outputs(tmp_path, monkeypatch):
    trace, metrics, before = _outputs(tmp_path)

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    full_error = r"cannot write .*m.json \(No space left on device; .* MiB free"
    with pytest.raises(OutputError, match=full_error), staged_outputs() as out:
        out.write_netcdf(xr.Dataset({"a": ("x", np.arange(4.0))}), trace)
        out.write_json({"new": 1}, metrics)
    monkeypatch.undo()
    assert {p: p.read_bytes() for p in before} == before
    assert not list(tmp_path.rglob(".*.tmp"))


def _trace(variant):
    idata = az.from_dict(posterior={"w": np.zeros((2, 3))}, sample_stats={"diverging": np.zeros((2, 3), bool)},
                         observed_data={"y": np.zeros(4)})
    return stamp(idata, provenance("fit_x", variant, "0", {}))


@pytest.mark.parametrize("load", [load_trace, load_posterior])
def test_load_trace_checks_variant(tmp_path, load):
    path = tmp_path / "t.nc"
    write_netcdf(_trace("flat"), path)
    loaded = load(path, "flat")
    assert (loaded if load is load_posterior else loaded.posterior).attrs["hbnn_variant"] == "flat"
    with pytest.raises(InputError, match="holds model variant 'flat', expected 'hierarchical'"):
        load(path, "hierarchical")


def test_load_posterior_and_load_trace_read_what_arviz_reads_without_importing_it(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "t.nc"
    write_netcdf(_trace("flat"), path)
    xr.testing.assert_identical(load_posterior(path, "flat"), load_trace(path, "flat").posterior)
    trace, idata = load_trace(path, "flat"), az.from_netcdf(str(path))
    assert trace.groups() == idata.groups()
    for group in idata.groups():
        xr.testing.assert_identical(trace[group].load(), idata[group].load())
    close_trace(trace)
    for load in ("load_posterior", "load_trace"):
        code = (f"import sys; from hbnn.files.io import {load}; {load}({str(path)!r}, 'flat'); "
                "print('arviz' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out == "False\n", load
    ds_path = tmp_path / "d.nc"
    write_netcdf(xr.Dataset({"a": ("x", np.arange(3))}), ds_path)
    for load in (load_posterior, load_trace):
        with pytest.raises(InputError, match="has no 'posterior' group"):
            load(ds_path, "flat")


def test_load_trace_opens_only_the_groups_asked_for(tmp_path):
    """``only`` (the report's readers): just those groups the file has, plus those to load and the posterior (the
    checks read it), the same values as a full open; the variant check and a missing posterior's error as before."""
    path = tmp_path / "t.nc"
    write_netcdf(_trace("flat"), path)
    full = load_trace(path, "flat", groups=())
    some = load_trace(path, "flat", groups=("sample_stats",), only=("posterior", "no_such_group"))
    assert set(some.groups()) == {"posterior", "sample_stats"} < set(full.groups())
    for group in some.groups():
        xr.testing.assert_identical(some[group].load(), full[group].load())
    close_trace(some)
    close_trace(full)
    with pytest.raises(InputError, match="holds model variant"):
        load_trace(path, "informed", only=("posterior",))
    assert set(load_trace(path, "flat", groups=(), only=("sample_stats",)).groups()) == {"posterior", "sample_stats"}
    no_posterior = tmp_path / "d.nc"
    write_netcdf(xr.Dataset({"a": ("x", np.arange(3))}), no_posterior)
    with pytest.raises(InputError, match="has no 'posterior' group"):
        load_trace(no_posterior, "flat", groups=(), only=("sample_stats",))


def test_the_same_trace_written_twice_is_byte_identical(tmp_path, monkeypatch):
    """ArviZ stamps every group with the time it was made; a stamped trace carries none, so DVC sees the
    same output for the same draws."""
    first, second = tmp_path / "a.nc", tmp_path / "b.nc"
    write_netcdf(_trace("flat"), first)
    monkeypatch.setattr(az.data.base, "datetime", _Later)
    write_netcdf(_trace("flat"), second)
    assert first.read_bytes() == second.read_bytes()


class _Later:
    """The ``datetime`` module as ArviZ uses it, a day on: ``created_at`` as a later run would write it."""

    import datetime as _dt

    timezone = _dt.timezone

    class datetime:  # noqa: N801 - stands in for datetime.datetime
        @staticmethod
        def now(tz=None):
            return _Later._dt.datetime.now(tz) + _Later._dt.timedelta(days=1)


def test_truncated_and_missing_files_give_clear_errors(tmp_path):
    path = tmp_path / "t.nc"
    write_netcdf(_trace("flat"), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    for load in (load_trace, load_posterior):
        with pytest.raises(InputError, match=str(path)):
            load(path, "flat")
        with pytest.raises(InputError, match="does not exist"):
            load(tmp_path / "missing.nc", "flat")
    ds_path = tmp_path / "d.nc"
    write_netcdf(xr.Dataset({"a": ("x", np.arange(3))}), ds_path)
    with pytest.raises(InputError, match=r"lacks variables \['b'\]"):
        load_dataset(ds_path, "tasks file", required=("a", "b"))


def test_logs_hbnn_at_info_libraries_at_warning_and_hbnn_log_debug():
    import subprocess
    import sys

    code = ("import logging; from hbnn import logs; logs.configure(); "
            "print(logging.getLogger().level, logging.getLogger('hbnn.pipeline.stages').getEffectiveLevel())")
    for env, expected in ((None, "30 20"), ("debug", "30 10"), ("warning", "30 30"), ("nonsense", "30 20")):
        environ = {k: v for k, v in os.environ.items() if k != "HBNN_LOG"} | ({"HBNN_LOG": env} if env else {})
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, check=True)
        assert out.stdout.split() == expected.split(), env
