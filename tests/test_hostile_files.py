"""Hostile inputs beyond params and tables: files that are not what they claim, an unusable home, races, interrupts.

Each case ends in one ``error:`` line (exit non-zero, earlier outputs byte-identical) or in correct work.
The damaged kernel cache is in ``tests/test_kernel.py`` (``test_damaged_cache_entries_...``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import test_bad_inputs
import xarray as xr
from test_bad_inputs import _assert_one_error, _run, _tiny_text
from test_predict import NEW, write_trace

from hbnn import cli
from hbnn.config_read import load_params
from hbnn.files import integrity
from hbnn.files.io import load_dataset, load_posterior, load_trace
from hbnn.files.outputs import staged_outputs, write_text
from hbnn.pipeline.runner import run_stage

ROOT = Path(__file__).resolve().parents[1]
workspace = test_bad_inputs.workspace  # the battery's directory of earlier outputs


# ----------------------------------------------------------------------------- files that are not what they claim
def _flip_data(path: Path, group: str, var: str, size: int = 4096) -> None:
    """Flip up to ``size`` bytes of a variable's stored data (as a bad disk or copy would), leaving HDF5's own
    structures whole: the file still opens, and reads back other numbers."""
    with h5py.File(path, "r") as f:
        dataset = (f[group] if group else f)[var]
        start, length = dataset.id.get_offset(), dataset.id.get_storage_size()
    size = min(size, length)
    data = bytearray(path.read_bytes())
    data[start: start + size] = bytes(b ^ 0xFF for b in data[start: start + size])
    path.write_bytes(bytes(data))


def _set_attr(path: Path, group: str, name: str, value) -> None:
    with h5py.File(path, "r+") as f:
        (f[group] if group else f).attrs[name] = value


@pytest.fixture
def trace_and_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_trace(tmp_path / "t.nc", "hierarchical")
    NEW.to_csv(tmp_path / "new.csv", index=False)
    return tmp_path / "t.nc"


TAMPERING = {
    # name: (what is done to the trace, the group the error names)
    "a variable's bytes flipped": (lambda p: _flip_data(p, "posterior", "w_out"), "posterior"),
    "settings not JSON": (lambda p: _set_attr(p, "posterior", "hbnn_settings", "{not json"), "posterior"),
    "settings of another shape": (lambda p: _set_attr(p, "posterior", "hbnn_settings", "[1, 2]"), "posterior"),
    "another variant": (lambda p: _set_attr(p, "posterior", "hbnn_variant", "flat"), "posterior"),
    "layer sizes edited": (lambda p: _set_attr(p, "posterior", "hbnn_settings",
                                               json.dumps({"hidden_layers": [7, 7]})), "posterior"),
    "checksum removed": (lambda p: _set_attr(p, "constant_data", "hbnn_checksum", ""), "constant_data"),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_a_trace_changed_after_it_was_written_is_refused_by_its_readers(trace_and_rows, capsys, case):
    """``hbnn predict`` and the stages' loaders read only groups whose content matches the checksum their stage
    wrote with them (hbnn.files.integrity): NetCDF itself reads flipped bytes back as other numbers, silently."""
    tamper, group = TAMPERING[case]
    tamper(trace_and_rows)
    before = trace_and_rows.read_bytes()
    code = cli.main(["predict", "--trace", "t.nc", "--input", "new.csv", "--output", "out.csv"])
    err = capsys.readouterr().err
    _assert_one_error(code, err, f"(group {group}) does not match the checksum written with it")
    assert not Path("out.csv").exists() and trace_and_rows.read_bytes() == before
    from hbnn.errors import InputError

    with pytest.raises(InputError, match="checksum"):
        load_trace(trace_and_rows, "hierarchical", groups=(), only=("posterior", "constant_data"))


def test_a_trace_saved_again_by_arviz_or_made_elsewhere_is_refused_naming_why(trace_and_rows, capsys):
    import arviz as az

    idata = az.from_netcdf(trace_and_rows).load()
    idata.posterior.attrs.pop("hbnn_checksum")
    idata.to_netcdf("edited.nc")  # what a user's own edit and save looks like
    code = cli.main(["predict", "--trace", "edited.nc", "--input", "new.csv", "--output", "out.csv"])
    _assert_one_error(code, capsys.readouterr().err, "(group posterior) has no hbnn_checksum: it was not written by "
                                                     "an hbnn stage")


def test_every_netcdf_a_stage_writes_carries_checksums_its_readers_accept(workspace, capsys, tmp_path):
    """make_data's tasks, and (as fit_hier and derive_prior write them) a trace and a prior: each group sealed, the
    seal deterministic (the same content, the same bytes) and accepted on reading; a flipped tasks file refused."""
    del workspace
    tasks = Path("data/tasks.nc")
    first = tasks.read_bytes()
    ds = load_dataset(tasks, "tasks file")
    assert ds.attrs["hbnn_checksum"] == integrity.content_hash(ds)
    assert _run("make_data", Path("params.yaml").read_text(), capsys)[0] == 0
    assert tasks.read_bytes() == first  # sealed again, byte for byte
    _flip_data(tasks, "", "X", 512)
    code, err = _run("fit_hier", Path("params.yaml").read_text(), capsys)
    _assert_one_error(code, err, "tasks file data/tasks.nc does not match the checksum")


def test_a_prior_or_posterior_changed_after_writing_is_refused(tmp_path):
    from hbnn.errors import InputError

    post = write_trace(tmp_path / "t.nc", "hierarchical")
    assert load_posterior(tmp_path / "t.nc", "hierarchical").identical(post.assign_attrs(
        load_posterior(tmp_path / "t.nc", "hierarchical").attrs))
    _set_attr(tmp_path / "t.nc", "posterior", "hbnn_stage", "fit_flat")
    with pytest.raises(InputError, match=r"t.nc \(group posterior\) does not match the checksum"):
        load_posterior(tmp_path / "t.nc", "hierarchical")


@pytest.mark.parametrize("values", [np.arange(6.0).reshape(2, 3), np.array(["g1", "g\u00e92"]),
                                    np.array([True, False]), np.arange(4, dtype=np.int32)])
def test_a_checksum_survives_a_netcdf_round_trip_and_moves_with_any_value(tmp_path, values):
    ds = xr.Dataset({"v": (tuple(f"d{i}" for i in range(values.ndim)), values)}, attrs={"note": "x", "n": 3})
    path = tmp_path / "d.nc"
    from hbnn.files.outputs import write_netcdf

    write_netcdf(ds, path)
    back = load_dataset(path, "file")  # checks it
    assert back.attrs["hbnn_checksum"] == integrity.content_hash(ds)
    changed = ds.copy(deep=True)
    flat = changed["v"].values.reshape(-1)
    flat[0] = flat[-1] if values.dtype.kind != "b" else not flat[0]
    assert integrity.content_hash(changed) != integrity.content_hash(ds)
    assert integrity.content_hash(ds.assign_attrs(note="y")) != integrity.content_hash(ds)


# ----------------------------------------------------------------------------- an unusable home directory
def test_an_unusable_home_moves_the_library_caches_to_a_temporary_folder(tmp_path):
    """HOME a file (as unusable as a read-only one, even for root): ArviZ's import, PyTensor's compile folder and
    hbnn's kernel cache all move to a temporary folder, and a stage says so once and runs."""
    home = tmp_path / "home"
    home.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "MPLCONFIGDIR", "PYTENSOR_FLAGS",
                                                              "HBNN_KERNEL_CACHE", "XDG_CONFIG_HOME")}
    script = textwrap.dedent("""
        import os, tempfile
        from hbnn.homes import moved, use_writable_homes
        use_writable_homes()  # as a stage's or a command's first step does (hbnn.errors.interrupts_reported)
        import arviz, matplotlib
        from pytensor.configdefaults import config
        from hbnn.density.modules import cache_dir
        tmp = tempfile.gettempdir()
        assert all(str(p).startswith(tmp) for p in (cache_dir(), config.base_compiledir, matplotlib.get_configdir()))
        print(len(moved()))
    """)
    done = subprocess.run([sys.executable, "-c", script], env={**env, "HOME": str(home)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["3"], done.stderr
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "params.yaml").write_text(_tiny_text(""))
    done = subprocess.run([sys.executable, str(ROOT / "stages" / "make_data.py"), "--out", "data/tasks.nc"],
                          cwd=tmp_path / "w", env={**env, "HOME": str(home)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("cannot be written; this run keeps them in a temporary folder") == 1


# ----------------------------------------------------------------------------- races around a run
def test_params_edited_while_a_stage_runs_write_no_output(workspace, capsys, monkeypatch):
    """DVC records the params it finds after the stage: outputs made with the earlier values would be recorded as
    made with the new ones, and `dvc status` would call them up to date."""
    from hbnn.pipeline.stages import make_data as stage

    before = workspace()
    real = stage.make_tasks

    def edited_meanwhile(spec):
        Path("params.yaml").write_text(Path("params.yaml").read_text().replace("n_groups: 3", "n_groups: 5"))
        return real(spec)

    monkeypatch.setattr(stage, "make_tasks", edited_meanwhile)
    code, err = _run("make_data", _tiny_text(""), capsys)
    _assert_one_error(code, err, "parameter file params.yaml changed while the stage ran (n_groups: 3 -> 5)", 1)
    assert workspace() == before


def test_an_edit_that_changes_no_value_lets_the_stage_write(workspace, capsys, monkeypatch):
    from hbnn.pipeline.stages import make_data as stage

    real = stage.make_tasks

    def commented(spec):
        Path("params.yaml").write_text(Path("params.yaml").read_text() + "# a comment\n")
        return real(spec)

    monkeypatch.setattr(stage, "make_tasks", commented)
    assert _run("make_data", _tiny_text(""), capsys)[0] == 0
    assert load_params().n_groups == 3


# ----------------------------------------------------------------------------- errors nobody foresaw, interrupts
def test_an_unforeseen_error_is_one_line_and_the_traceback_on_request(workspace, capsys, monkeypatch):
    def broken(params, out):
        raise KeyError("deep inside a library")

    before = workspace()
    code = run_stage("make_data", ["out"], broken, ["--out", "data/tasks.nc"])
    _assert_one_error(code, capsys.readouterr().err, "error: unexpected KeyError: 'deep inside a library' (set "
                                                     "HBNN_TRACEBACK=1 to see where", 1)
    assert workspace() == before
    monkeypatch.setenv("HBNN_TRACEBACK", "1")
    run_stage("make_data", ["out"], broken, ["--out", "data/tasks.nc"])
    assert "Traceback (most recent call last)" in capsys.readouterr().err


_LONG_CALL = """
import time
import numpy as np
import hbnn.errors as errors
errors.GRACE_SECONDS = 1.0
with errors.interrupts_reported():
    a = np.random.default_rng(0).normal(size=(3000, 3000))
    print("ready", flush=True)
    np.linalg.svd(a)  # one call into LAPACK of ~20 s: Python's own handler would run only after it returns
    print("returned", flush=True)
"""


def test_an_interrupt_ends_the_run_even_while_compiled_code_holds_the_main_thread():
    """SIGTERM reaches a watchdog thread at once (signal.set_wakeup_fd); after a grace period it ends the process
    with the same message and status as an interrupt the main thread handles."""
    with subprocess.Popen([sys.executable, "-c", _LONG_CALL], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}) as proc:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "interrupted: outputs unchanged", err
    assert time.monotonic() - start < 8  # the grace second, not the call's remaining time


def test_an_interrupt_during_the_commit_replaces_every_output_then_says_so(tmp_path, monkeypatch):
    """A stage's outputs are replaced all or none: a signal that arrives while they are renamed into place waits
    until every one is, and the run ends as interrupted after writing them (DVC records nothing)."""
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        import hbnn.files.outputs as io
        from hbnn.errors import interrupts_reported
        os.chdir({str(tmp_path)!r})
        real = os.replace
        def replace(src, dst):
            real(src, dst)
            os.kill(os.getpid(), signal.SIGINT)  # after the first of the two renames
        io.os.replace = replace
        with interrupts_reported():
            with io.staged_outputs() as out:
                out.write_text("new a", "a.txt")
                out.write_text("new b", "b.txt")
            print("not reached")
    """)
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("old")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130 and "not reached" not in done.stdout, done.stderr
    assert done.stderr.strip() == "interrupted after the outputs were written; DVC did not record them: run dvc " \
                                  "repro again"
    assert [(tmp_path / n).read_text() for n in ("a.txt", "b.txt")] == ["new a", "new b"]


def test_an_output_named_like_a_pattern_removes_only_its_own_temporaries(tmp_path):
    """Left-over temporaries of an output are removed when it is next written: by its name, not as a pattern."""
    other = tmp_path / ".report.html.123.tmp"
    other.write_text("someone else's")
    write_text("scored", tmp_path / "*")
    assert (tmp_path / "*").read_text() == "scored" and other.read_text() == "someone else's"
    with staged_outputs() as out:
        out.write_text("x", tmp_path / "[a-z]*")
    assert other.exists()


# ----------------------------------------------------------------------------- files swapped between stages
def test_a_file_copied_from_another_stages_outputs_is_refused(tmp_path):
    """The transfer experiment's held-out fit must not have seen its held-out groups: a trace or prior copied in from
    the other stage's outputs (of the right variant, and made with the same params) is refused by the stage it
    names, not read."""
    from conftest import TINY

    from hbnn.config_read import parse_params
    from hbnn.data.moons import make_moons_tasks
    from hbnn.data.spec import DataSpec
    from hbnn.data.tasks import load_tasks
    from hbnn.errors import InputError
    from hbnn.files.io import provenance
    from hbnn.files.outputs import write_netcdf
    from hbnn.pipeline.variants import STAGE_PARAMS

    params = parse_params(TINY)
    for stage in ("fit_hier", "transfer_prior"):
        other = "transfer_prior" if stage == "fit_hier" else "fit_hier"
        ds = xr.Dataset({"v": ("x", np.arange(3.0))})
        ds.attrs.update(provenance(other, "hierarchical", params.section_hash(*STAGE_PARAMS[other]), {}))
        write_netcdf(ds, tmp_path / f"{other}.nc")
        from hbnn.files.io import check_made_with

        with pytest.raises(InputError, match=f"was written by stage '{other}', not by {stage}"):
            check_made_with(load_dataset(tmp_path / f"{other}.nc", "file").attrs, params, tmp_path / f"{other}.nc",
                            stage)
    tasks = make_moons_tasks(DataSpec.of(params))
    tasks.attrs.update(provenance("derive_prior", "moons", "x", {}))
    write_netcdf(tasks, tmp_path / "tasks.nc")
    with pytest.raises(InputError, match="was written by stage 'derive_prior', not by make_data"):
        load_tasks(tmp_path / "tasks.nc")


def test_detail_metrics_swapped_between_models_are_refused_by_the_report(tmp_path):
    from conftest import TINY

    from hbnn.config_read import parse_params
    from hbnn.errors import InputError
    from hbnn.files.io import check_made_by, made_by

    params = parse_params(TINY)
    flat = {"per_group": {}, "made_by": made_by("fit_flat", params)}
    check_made_by(flat, "flat.json", "fit_flat", params)
    with pytest.raises(InputError, match="flat.json was written by stage 'fit_flat', not by fit_informed"):
        check_made_by(flat, "flat.json", "fit_informed", params)
    other = parse_params({**TINY, "sampler": {**TINY["sampler"], "draws": 26}})
    with pytest.raises(InputError, match="with other values of model, sampler, trace"):
        check_made_by(flat, "flat.json", "fit_flat", other)


# ----------------------------------------------------------------------------- one dvc run, one set of params
def test_params_changed_between_the_stages_of_one_dvc_run_stop_the_later_stage(tmp_path, monkeypatch):
    """A second `dvc exp run` writes its values into params.yaml before DVC refuses it; the first run's next stage
    then finds other values than its earlier stages read, and stops."""
    from conftest import TINY

    from hbnn.config_read import parse_params
    from hbnn.errors import ChangedMeanwhile
    from hbnn.pipeline import same_run

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".dvc").mkdir()
    monkeypatch.setattr(same_run, "dvc_process", lambda: "4242-100")
    first = parse_params(TINY)
    same_run.same_params_as_this_run(first)  # the run's first stage notes its params
    same_run.same_params_as_this_run(first)  # ... the next finds the same
    second = parse_params({**TINY, "sampler": {**TINY["sampler"], "draws": 29}})
    with pytest.raises(ChangedMeanwhile, match=r"changed between the stages of this dvc run \(sampler.draws: 25 -> 29"):
        same_run.same_params_as_this_run(second)
    monkeypatch.setattr(same_run, "dvc_process", lambda: "4243-100")  # another dvc run: its own note
    same_run.same_params_as_this_run(second)
    monkeypatch.setattr(same_run, "dvc_process", lambda: None)  # a stage run by hand: nothing compared
    same_run.same_params_as_this_run(first)


def test_the_dvc_process_is_found_among_the_stages_ancestors(tmp_path):
    """`dvc` -> a shell -> python: what the note is keyed on (a process that is not under dvc finds none)."""
    from hbnn.pipeline import same_run

    assert same_run.dvc_process() is None  # pytest runs under no dvc
    fake = tmp_path / "dvc"
    fake.write_text(f"#!/bin/sh\n{sys.executable} -c 'from hbnn.pipeline import same_run; "
                    "print(same_run.dvc_process())'\n")
    fake.chmod(0o755)
    done = subprocess.run([str(fake)], capture_output=True, text=True, timeout=60)
    found = done.stdout.strip()
    assert found != "None" and found.split("-")[0].isdigit(), done.stderr


# ----------------------------------------------------------------------------- names a file system takes
def test_an_output_name_as_long_as_the_file_system_takes_is_written(tmp_path):
    name = "a" * 251 + ".csv"  # 255 bytes, the most a Linux file system names
    write_text("x", tmp_path / name)
    assert (tmp_path / name).read_text() == "x" and not list(tmp_path.glob(".*.tmp"))


def test_an_output_whose_folder_is_a_file_says_so(tmp_path):
    from hbnn.errors import OutputError

    (tmp_path / "afile").write_text("")
    with pytest.raises(OutputError, match=r"its folder .*afile is a file, not a folder\); earlier outputs") as err:
        write_text("x", tmp_path / "afile" / "out.csv")
    assert "MiB free" not in str(err.value)


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_an_input_that_is_not_a_regular_file_says_so(tmp_path, kind):
    from hbnn.errors import InputError

    path = tmp_path / "t.nc"
    path.mkdir() if kind == "folder" else os.mkfifo(path)
    with pytest.raises(InputError, match="is not a regular file"):
        load_posterior(path, "hierarchical")


_LINGERING = """
import threading, time
import hbnn.errors as errors
errors.GRACE_SECONDS = 1.0
threading.Thread(target=time.sleep, args=(600,)).start()  # a library's thread that never ends (a Dask cluster's)
with errors.interrupts_reported(exit_now=True):
    print("ready", flush=True)
    time.sleep(600)
"""


def test_a_stage_ends_after_an_interrupt_although_a_library_left_a_thread_running():
    """Python's own exit waits for every non-daemon thread: a stage's process ends within its grace period."""
    with subprocess.Popen([sys.executable, "-c", _LINGERING], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        assert proc.stdout.readline().strip() == "ready"
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "interrupted: outputs unchanged", err
    assert time.monotonic() - start < 10


@pytest.mark.slow
def test_a_damaged_pytensor_cache_is_built_again_and_the_fit_gives_the_same_numbers(tmp_path):
    """PyTensor's numba cache truncated and its C linker module cut to a third (what a full disk leaves): before,
    every later fit whose density was checked failed (UnpicklingError) or crashed (SIGBUS); now the damaged files are
    removed before PyTensor loads them and built again."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "params.yaml").write_text(_tiny_text(""))
    env = {**os.environ, "PYTENSOR_FLAGS": f"base_compiledir={tmp_path / 'pytensor'}",
           "HBNN_KERNEL_CACHE": str(tmp_path / "kernels")}

    def fit(checks: str) -> str:
        for script, args in (("make_data.py", ["--out", "data/tasks.nc"]),
                             ("fit_flat.py", ["--tasks-path", "data/tasks.nc", "--trace-out", "traces/flat.nc",
                                              "--metrics-out", "metrics/flat.json", "--timing-out", "t.json"])):
            done = subprocess.run([sys.executable, str(ROOT / "stages" / script), *args], cwd=work, capture_output=True,
                                  text=True, timeout=900, env={**env, "HBNN_DENSITY_CHECKS": str(tmp_path / checks)})
            assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        return (work / "metrics" / "flat.json").read_text()

    clean = fit("checks1")
    base = tmp_path / "pytensor"
    damaged = sorted((base / "numba").glob("*.nb?")) + sorted(base.glob("compiledir_*/lazylinker_ext/*.so"))
    assert any(p.suffix == ".so" for p in damaged) and any(p.suffix == ".nbi" for p in damaged)
    for path in damaged:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    assert fit("checks2") == clean  # a new record of checks: the density is checked, so PyTensor compiles again
