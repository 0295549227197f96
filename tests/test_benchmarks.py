"""`make bench` (benchmarks/run.py): the documented configurations (docs/many-groups.md) are the ones it measures,
its ratios come from one run, and every row and section runs (at smoke sizes)."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from dvc.utils.hydra import apply_overrides

from hbnn.config_read import load_params

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ is a package at the repository root
bench = importlib.import_module("benchmarks.run")


def test_the_documented_many_groups_command_sets_what_the_benchmark_measures(tmp_path):
    text = (ROOT / "docs" / "many-groups.md").read_text()
    match = re.search(r"^(?:HBNN_DASK_SCHEDULER=(\S+) )?dvc exp run -n groups-1000 (.+?)(?<!\\)$", text,
                      flags=re.M | re.S)
    assert match, "docs/many-groups.md: no `dvc exp run -n groups-1000 ...` line"
    assert (match.group(1) or "") == bench.MANY_GROUPS_SCHEDULER
    words = shlex.split(match.group(2).replace("\\\n", " "))
    overrides = [w for i, w in enumerate(words) if i and words[i - 1] == "-S"]
    assert overrides and len(overrides) * 2 == len(words), words
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    apply_overrides(str(tmp_path / "params.yaml"), overrides)
    committed = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert yaml.safe_load((tmp_path / "params.yaml").read_text()) == bench.overridden(committed, bench.MANY_GROUPS)
    load_params(tmp_path / "params.yaml")  # valid as written: no key of the defaults it keeps conflicts with it


def test_bench_ratios_to_pymc_come_only_from_rows_of_the_same_run(tmp_path, monkeypatch):
    out = tmp_path / "benchmark.json"
    rates = ("ess_per_s", "ess_per_s_fn", "ess_per_s_group_sd")
    earlier = {"measured_utc": "2020-01-01T00:00:00+00:00", "commit": "abc"}

    def row(backend, us, *values, stamp=earlier):
        return {**dict(zip(rates, values, strict=True)), "us_per_grad": us, "runs": [{"backend": backend}], **stamp}

    old = {"pymc": row("pymc", 400.0, 1.0, 1.0, 2.0), "numpyro": row("numpyro", 100.0, 3.0, 3.0, 4.0),
           "nutpie": row("nutpie", 40.0, 9.0, 9.0, 9.0), "default": row("nutpie", 40.0, 1.0, 1.0, 1.0),
           "blackjax": {**row("blackjax", 90.0, 2.0, 2.0, 2.0, stamp={}), "speedup_vs_pymc": 2.0}}  # unstamped
    out.write_text(json.dumps({"backends": bench.with_speedups(old), "repro_s": 5.0}))
    stamps = []

    def backends(work, chosen, sizes, stamp):  # as bench.backends: this run's rows, stamped, with their ratios
        stamps.append(stamp)
        return bench.with_speedups({name: row("nutpie", 24.0, 8.0, 8.0, 10.0, stamp=stamp) for name in chosen})

    monkeypatch.setattr(bench, "backends", backends)
    bench.main(["--out", str(out), "--only", "backends", "--variants", "default", "--workdir", str(tmp_path / "w")])
    got = json.loads(out.read_text())["backends"]
    assert set(got) == {"pymc", "numpyro", "nutpie", "default", "blackjax"}
    assert {k: got["default"][k] for k in earlier} == stamps[-1] != earlier
    # the fresh row has no PyMC row of its run: no ratio to the earlier run's
    assert not [k for k in got["default"] if k.startswith("speedup")]
    # kept rows stay whole, their ratios to the PyMC row of their own run included; an unstamped row has none
    assert got["numpyro"]["speedup_vs_pymc_group_sd"] == 2.0 and got["nutpie"]["speedup_vs_pymc_fn"] == 9.0
    assert [got[name]["us_per_grad"] for name in ("nutpie", "numpyro")] == [40.0, 100.0]
    assert not [k for k in got["blackjax"] if k.startswith("speedup")]
    assert json.loads(out.read_text())["repro_s"] == 5.0  # sections not run keep their values too

    # PyMC's row measured again: the rows of this run get ratios to it, the kept ones lose theirs
    bench.main(["--out", str(out), "--only", "backends", "--variants", "default", "pymc",
                "--workdir", str(tmp_path / "w")])
    got = json.loads(out.read_text())["backends"]
    assert got["default"]["speedup_vs_pymc_fn"] == 1.0 and got["pymc"]["measured_utc"] == stamps[-1]["measured_utc"]
    assert not [k for name in ("numpyro", "nutpie") for k in got[name] if k.startswith("speedup")]


def test_the_run_stamp_names_the_commit_measured_and_when_in_utc():
    import datetime
    import subprocess

    stamp = bench.run_stamp()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":!reports/benchmark.json"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert stamp["commit"] == head + ("-dirty" if dirty.stdout.strip() else "")
    when = datetime.datetime.fromisoformat(stamp["measured_utc"])
    assert when.utcoffset() == datetime.timedelta(0)
    assert abs(datetime.datetime.now(datetime.UTC) - when) < datetime.timedelta(minutes=1)


def test_the_run_stamp_is_dirty_for_changed_code_and_not_for_the_report_an_earlier_run_wrote(tmp_path, monkeypatch):
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()

    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "benchmark.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "c")
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "REPORT", tmp_path / "reports" / "benchmark.json")
    (tmp_path / "reports" / "benchmark.json").write_text('{"scaling": {}}')
    assert bench.run_stamp()["commit"] == git("rev-parse", "HEAD")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert bench.run_stamp()["commit"] == git("rev-parse", "HEAD") + "-dirty"


def test_bench_scaling_keeps_the_rows_it_does_not_run_each_with_its_own_stamp(tmp_path, monkeypatch):
    earlier = {"measured_utc": "2020-01-01T00:00:00+00:00", "commit": "abc"}
    out = tmp_path / "benchmark.json"
    out.write_text(json.dumps({"scaling": {
        "hier_advi": {"18": {**earlier, "seconds": 3.0, "peak_rss_mib": 1.0}},
        "hier_nutpie": {"18": {"seconds": 53.0, "peak_rss_mib": 1.0}},  # a row no longer measured goes
        "hier_nuts": {"18": {**earlier, "seconds": 9.0, "peak_rss_mib": 1.0},
                      "1000": {**earlier, "error": "stopped at the limit"}}}}))
    seen = {}

    def scaling(work, sizes, rows, stamp, save):
        seen["rows"], seen["stamp"] = rows, stamp
        return {"hier_nuts": {"18": {**stamp, "seconds": 4.0, "peak_rss_mib": 1.0},
                              "60": {**stamp, "seconds": 12.0, "peak_rss_mib": 1.0}}}

    monkeypatch.setattr(bench, "scaling", scaling)
    bench.main(["--out", str(out), "--only", "scaling", "--scaling-rows", "hier_nuts",
                "--workdir", str(tmp_path / "w")])
    got = json.loads(out.read_text())["scaling"]
    assert seen["rows"] == ("hier_nuts",)
    assert set(got) == {"hier_advi", "hier_nuts", "linearity"}
    assert got["hier_advi"]["18"]["measured_utc"] == earlier["measured_utc"]  # kept whole
    assert got["hier_nuts"]["1000"] == {**earlier, "error": "stopped at the limit"}  # a size not rerun stays
    assert got["hier_nuts"]["18"]["seconds"] == 4.0 and got["hier_nuts"]["18"]["commit"] == seen["stamp"]["commit"]
    assert got["linearity"]["hier_nuts"]["loglog_slope"] == pytest.approx(np.log(3) / np.log(60 / 18))


def test_a_hierarchical_point_the_budget_expects_past_the_limit_is_recorded_with_why_not_run(tmp_path, monkeypatch):
    """A hier_nuts point whose typical estimate is past ``point_limit_s`` is not run (no fit_hier process): the
    point records the estimate and the reason, and the printed table says so."""
    import dataclasses

    fits = []
    monkeypatch.setattr(bench, "_fit", lambda *args, **kwargs: fits.append(args))
    sizes = dataclasses.replace(bench.SMOKE, point_limit_s=1e-6)
    point = bench.hier_nuts_point(tmp_path, 2, sizes, {"commit": "abc"})
    assert fits == [] and point["commit"] == "abc" and point["hier_trace"] == "" and "seconds" not in point
    assert point["estimated_minutes"] >= 0 and point["skipped"].startswith("not run: hbnn.pipeline.budget expects")
    assert f"past the point limit of {1e-6 / 60:g} min" in point["skipped"]
    assert bench._not_measured(point) == f"skipped (expected {point['estimated_minutes']:g} min)"


def test_a_hierarchical_point_that_fails_keeps_how_long_it_ran_and_its_warnings(tmp_path, monkeypatch):
    """A hier_nuts point whose stage fails or is stopped records the headline, the seconds, each warning once (its
    first line, whatever the log's timestamps) and the last line; the printed table says after how long."""
    import dataclasses

    stderr = "".join(f"2026-11-30 08:0{i}:00,001 hbnn.s WARNING restarting: chain 1 stuck\n"
                     f"2026-11-30 08:0{i}:00,002 hbnn.s INFO still running\n" for i in range(5))
    stderr += "x.py:3: UserWarning: odd\ninterrupted: outputs unchanged\n"

    def fail(*args, **kwargs):
        raise bench.StageFailed("fit_hier failed (130) stopped at the limit of 60 s", stderr, 60.4)

    monkeypatch.setattr(bench, "_stage", lambda *args, **kwargs: {})
    monkeypatch.setattr(bench, "_typical_minutes", lambda stage, params: 0.5)
    monkeypatch.setattr(bench, "_fit", fail)
    point = bench.hier_nuts_point(tmp_path, 2, dataclasses.replace(bench.SMOKE, point_limit_s=60), {"commit": "abc"})
    assert point["error"] == "fit_hier failed (130) stopped at the limit of 60 s" and point["seconds_run"] == 60.4
    assert point["warnings"] == ["2026-11-30 08:00:00,001 hbnn.s WARNING restarting: chain 1 stuck",
                                 "x.py:3: UserWarning: odd"]
    assert point["last_line"] == "interrupted: outputs unchanged" and "seconds" not in point
    assert bench._not_measured(point) == "failed after 1 min"


def test_chain_steps_sums_each_chains_steps_over_every_other_dimension(tmp_path):
    import xarray as xr

    hier = xr.Dataset({"n_steps": (("chain", "draw"), np.array([[3, 4], [5, 6]]))})
    flat = xr.Dataset({"n_steps": (("group", "chain", "draw"), np.ones((3, 2, 4), dtype=np.int64))})
    for name, stats in (("hier", hier), ("flat", flat), ("none", xr.Dataset({"depth": ("draw", [1])}))):
        stats.to_netcdf(tmp_path / f"{name}.nc", group="sample_stats")
    assert bench.chain_steps(tmp_path / "hier.nc") == [7, 11]
    assert bench.chain_steps(tmp_path / "flat.nc") == [12, 12]
    assert bench.chain_steps(tmp_path / "none.nc") == []


# ----------------------------------------------------------------------------- smoke runs of every row and section
def _smoke(tmp_path, *sections: str) -> dict:
    """``python -m benchmarks.run --smoke --only sections``: its JSON, the committed reports/benchmark.json
    untouched."""
    report = ROOT / "reports" / "benchmark.json"
    before = report.read_bytes() if report.exists() else None
    out = tmp_path / "smoke.json"
    assert bench.main(["--smoke", "--only", *sections, "--out", str(out), "--workdir", str(tmp_path / "w")]) == 0
    assert (report.read_bytes() if report.exists() else None) == before
    got = json.loads(out.read_text())
    assert got["smoke"] is True and set(got["measured"]) == set(sections)
    return got


def test_every_backends_row_and_the_floor_run_at_smoke_sizes(tmp_path, capsys):
    got = _smoke(tmp_path, "backends", "floor")
    rows = got["backends"]
    assert set(rows) == set(bench.VARIANTS)
    assert {name: row["runs"][0]["backend"] for name, row in rows.items()} == {
        "default": "nutpie", "nutpie": "nutpie", "pymc": "pymc", "numpyro": "numpyro", "blackjax": "blackjax",
        "nutpie_low_rank": "nutpie"}
    stamp = bench.run_stamp()["commit"]
    for name, row in rows.items():
        assert row["commit"] == stamp and row["measured_utc"] == got["measured"]["backends"]["measured_utc"], name
        assert row["min_ess_bulk"] > 0 and row["us_per_grad"] > 0 and len(row["runs"]) == len(bench.SMOKE.seeds)
        assert row["speedup_vs_pymc_fn"] == row["ess_per_s_fn"] / rows["pymc"]["ess_per_s_fn"], name
    assert got["numpy_floor_us_per_grad"] > 0
    assert "backend (median of seeds)" in capsys.readouterr().out  # the table printed


def test_smoke_needs_an_out_file_other_than_the_committed_report(tmp_path, capsys):
    report = ROOT / "reports" / "benchmark.json"
    before = report.read_bytes() if report.exists() else None
    for argv in (["--smoke", "--only", "floor"], ["--smoke", "--only", "floor", "--out", str(report)]):
        assert bench.main([*argv, "--workdir", str(tmp_path / "w")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --smoke needs --out") and err.count("\n") == 1, err
    assert (report.read_bytes() if report.exists() else None) == before
    assert not (tmp_path / "w").exists()  # stopped before any section ran


@pytest.mark.slow
@pytest.mark.parametrize("section", ["scaling", "cluster", "many_groups", "repro"])
def test_every_other_section_runs_at_smoke_sizes(tmp_path, section):
    got = _smoke(tmp_path, section)
    if section == "scaling":
        sizes = bench.SMOKE
        assert {k: set(v) for k, v in got["scaling"].items() if k != "linearity"} == {
            "hier_nuts": {str(n) for n in sizes.nuts_groups},
            "hier_nuts_fixed": {str(n) for n in sizes.fixed_groups}, "hier_advi": {str(n) for n in sizes.advi_groups},
            "per_group_nuts": {str(sizes.per_group_groups)},
            "hier_advi_minibatch": {str(n) for n in sizes.minibatch_groups}, "report": {str(sizes.report_groups)}}
        assert "loglog_slope" in got["scaling"]["linearity"]["hier_nuts"]
        stamp = got["measured"]["scaling"]
        for point in [*got["scaling"]["hier_nuts"].values(), *got["scaling"]["hier_nuts_fixed"].values()]:
            assert point["commit"] == stamp["commit"] and point["steps_per_iteration"] > 0 and point["draws"] > 0
        for point in got["scaling"]["hier_nuts_fixed"].values():  # exactly tune + draws, never restarted
            hs = point["hier_sampler"]
            assert (hs["max_draws"], hs["restarts"], point["restarts"]) == (0, 0, 0)
            assert point["draws"] == hs["draws"]
        fits = got["scaling"]["per_group_nuts"][str(sizes.per_group_groups)]
        assert set(fits) == {"in_process", "local_cluster_2"}
        assert all(fits[how][stem]["process_s"] > 0 for how in fits for stem in ("flat", "informed"))
    elif section == "cluster":
        assert got["cluster"]["identical_metrics"] is True and got["cluster"]["speedup"] > 0
    elif section == "many_groups":
        assert got["many_groups"]["settings"] == bench.SMOKE.many_groups
        assert set(got["many_groups"]["stages"]) == {stage for stage, _ in bench._pipeline_stages()}
    else:
        assert got["repro_s"] > 0 and set(got["repro_stages"]) == {"flat", "hier", "informed"}


@pytest.mark.slow
def test_transfer_seeds_summarises_every_size_over_the_seeds(tmp_path):
    """benchmarks/transfer_seeds.py at tiny settings over two data seeds: per size, the three comparisons with their
    seeds counted, and every fit's convergence."""
    from conftest import TINY

    from benchmarks import transfer_seeds

    out = tmp_path / "seeds.json"
    settings = {k: v for k, v in TINY.items() if k != "seed"}
    assert transfer_seeds.main(["--seeds", "31", "1", "--set", json.dumps(settings), "--methods", "mvnormal", "plugin",
                                "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["complete"] is True and result["seeds_requested"] == [31, 1]
    mv, plugin = result["methods"]["mvnormal"], result["methods"]["plugin"]
    assert [r["seed"] for r in mv["seeds"]] == [31, 1] == [r["seed"] for r in plugin["seeds"]]
    assert set(mv["summary"]["n2"]) == {"informed - flat", "informed - refit", "refit - flat"}
    assert "informed - refit" not in mv["summary"]["n4"]  # TINY refits at n2 and all only
    n2 = mv["summary"]["n2"]
    assert n2["refit - flat"]["mean"] == pytest.approx(n2["informed - flat"]["mean"] - n2["informed - refit"]["mean"],
                                                      abs=1e-5)  # each rounded to 6 decimals
    assert all(set(r["not_converged"]) == {"flat", "informed", "hier_refit", "hierarchical"} for r in mv["seeds"])
    # plugin reruns transfer_prior and transfer only: the same data, flat fits and refits
    assert set(plugin["seeds"][0]["seconds"]) == {"transfer_prior", "transfer"}
    assert plugin["summary"]["n2"]["refit - flat"] == n2["refit - flat"]
    assert plugin["summary"]["n2"]["informed - flat"] != n2["informed - flat"]


def test_a_bench_process_past_its_limit_is_stopped_and_says_so(tmp_path):
    import time

    start = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"stopped at the limit of 0.5 s"):
        bench._run([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, limit_s=0.5)
    assert time.perf_counter() - start < 10
    # a failure keeps its warning lines, however long the tail after them (a restart's reason, before a heartbeat)
    noisy = ("import sys; print('2026 hbnn WARNING restarting the chains: chain 1 stuck', file=sys.stderr); "
             "[print('heartbeat', i, file=sys.stderr) for i in range(2000)]; sys.exit(1)")
    with pytest.raises(bench.StageFailed) as failed:
        bench._run([sys.executable, "-c", noisy], tmp_path)
    assert failed.value.warnings == ["2026 hbnn WARNING restarting the chains: chain 1 stuck"]
    assert "chain 1 stuck" in str(failed.value) and failed.value.tail.rstrip().endswith("heartbeat 1999")
    assert bench._run([sys.executable, "-c", "pass"], tmp_path, limit_s=30)["seconds"] < 30
