"""Smoke run of every DVC stage script with tiny settings, plus bad-input handling."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import arviz as az
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import TINY

from hbnn.diagnostics import evaluation

ROOT = Path(__file__).resolve().parents[1]
STAGES = ROOT / "stages"


def run(stage: str, params: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(STAGES / f"{stage}.py"), "--params", str(params), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=params.parent)


def check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


TRANSFER_ARGS = ("--tasks-path", "data/tasks.nc", "--hier-trace", "traces/transfer/hier.nc", "--prior-path",
                 "priors/transfer.nc", "--prior-metrics", "metrics/detail/transfer_prior.json", "--refit-metrics",
                 "metrics/detail/transfer_refit.json", "--flat-trace-out", "traces/transfer/flat.nc",
                 "--informed-trace-out", "traces/transfer/informed.nc", "--metrics-out", "metrics/transfer.json",
                 "--plot-out", "reports/plots/transfer.csv", "--timing-out", "timings/transfer.json")

REFIT_ARGS = ("--tasks-path", "data/tasks.nc", "--trace-dir", "traces/transfer/refit", "--metrics-out",
              "metrics/detail/transfer_refit.json", "--timing-out", "timings/transfer_refit.json")


def run_all(d: Path, params: Path) -> None:
    """The stages in dvc.yaml order, as DVC runs them."""
    check(run("make_data", params, "--out", "data/tasks.nc"))
    for stage, name in (("fit_flat", "flat"), ("fit_hier", "hier")):
        check(run(stage, params, "--tasks-path", "data/tasks.nc", "--trace-out", f"traces/{name}.nc",
                  "--metrics-out", f"metrics/{name}.json", "--timing-out", f"timings/{name}.json"))
    check(run("derive_prior", params, "--hier-trace", "traces/hier.nc", "--prior-out", "priors/informed.nc",
              "--metrics-out", "metrics/prior.json"))
    check(run("fit_informed", params, "--tasks-path", "data/tasks.nc", "--prior-path", "priors/informed.nc",
              "--trace-out", "traces/informed.nc", "--metrics-out", "metrics/informed.json",
              "--timing-out", "timings/informed.json"))
    check(run("transfer_prior", params, "--tasks-path", "data/tasks.nc", "--trace-out", "traces/transfer/hier.nc",
              "--prior-out", "priors/transfer.nc", "--metrics-out", "metrics/detail/transfer_prior.json",
              "--timing-out", "timings/transfer_prior.json"))
    check(run("transfer_refit", params, *REFIT_ARGS))
    check(run("transfer", params, *TRANSFER_ARGS))
    check(run("baselines", params, "--tasks-path", "data/tasks.nc", "--metrics-out", "metrics/baselines.json"))
    check(run("report", params, "--tasks-path", "data/tasks.nc", "--flat-trace", "traces/flat.nc",
              "--hier-trace", "traces/hier.nc", "--informed-trace", "traces/informed.nc",
              "--prior-path", "priors/informed.nc", "--metrics-dir", "metrics", "--out-dir", "reports"))


def _run_pipeline(tmp_path_factory, name: str, raw: dict) -> Path:
    """Every stage in a fresh directory with params ``raw``."""
    d = tmp_path_factory.mktemp(name)
    params = d / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    run_all(d, params)
    return d


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return _run_pipeline(tmp_path_factory, "pipe", TINY)


@pytest.mark.parametrize("name, variant", [("flat", "flat"), ("hier", "hierarchical"), ("informed", "informed")])
def test_traces_are_complete_inference_data(pipeline, name, variant):
    idata = az.from_netcdf(pipeline / "traces" / f"{name}.nc")
    for group in ("posterior", "sample_stats", "observed_data"):
        assert group in idata.groups()
    post = idata.posterior
    assert post.sizes["chain"] == TINY["sampler"]["chains"]
    assert post.sizes["draw"] == TINY["sampler"]["draws"]
    assert post.sizes["group"] == TINY["n_groups"]
    assert post["w_in"].dims == ("chain", "draw", "group", "feature", "hidden_1")
    assert post.attrs["hbnn_variant"] == variant
    settings = json.loads(post.attrs["hbnn_settings"])
    assert settings["sampler"]["draws"] == TINY["sampler"]["draws"]
    assert "diverging" in idata.sample_stats
    assert idata.observed_data["y"].dims == ("obs",)


@pytest.mark.parametrize("name", ["flat", "hier", "informed"])
def test_fit_metrics_have_the_contract_keys(pipeline, name):
    """metrics/<name>.json holds the headline keys (DVC makes a column of each); metrics/detail/ holds all."""
    m = json.loads((pipeline / "metrics" / f"{name}.json").read_text())
    detail = json.loads((pipeline / "metrics" / "detail" / f"{name}.json").read_text())
    assert m == evaluation.headline(detail, "accuracy")
    assert set(m) == {"train", "test", "sampling", "loo"}
    assert set(m["train"]) == {"accuracy"} and set(m["test"]) == {"accuracy", "log_loss", "brier"}
    hier_only = {"sds_not_converged"} if name == "hier" else set()  # its group sds, counted beside its groups
    assert set(m["sampling"]) == {"divergences", "max_rhat", "min_ess_bulk", "groups_not_converged", "flagged_groups",
                                  *hier_only}
    assert set(m["loo"]) == {"elpd", "se", "p_loo", "n_bad_k"}
    for split in ("train", "test"):
        assert 0 <= m[split]["accuracy"] <= 1
    assert m["test"]["log_loss"] > 0 and 0 <= m["test"]["brier"] <= 1
    assert m["loo"]["elpd"] < 0 and m["loo"]["se"] > 0
    assert sorted(detail["per_group"]) == ["g00", "g01", "g02"]
    assert all("accuracy" in g["test"] and "elpd" in g["loo"] for g in detail["per_group"].values())
    assert sum(g["loo"]["elpd"] for g in detail["per_group"].values()) == pytest.approx(m["loo"]["elpd"], abs=1e-5)
    for key in ("divergences", "max_rhat", "min_ess_bulk"):
        assert m["sampling"][key] is not None
    timing = json.loads((pipeline / "timings" / f"{name}.json").read_text())
    assert timing["backend"] == "nutpie"
    assert timing["sampling"]["seconds"] > 0 and timing["sampling"]["compile_seconds"] > 0
    # every leapfrog step of tuning and draws, at least one per iteration of every chain (and group)
    n_groups = 1 if name == "hier" else TINY["n_groups"]
    iterations = TINY["sampler"]["chains"] * (TINY["sampler"]["tune"] + TINY["sampler"]["draws"]) * n_groups
    assert timing["sampling"]["grad_evals"] >= iterations
    assert timing["sampling"]["us_per_grad"] > 0


@pytest.mark.parametrize("name", ["flat", "hier", "informed"])
def test_arviz_reads_the_traces_as_they_are(pipeline, name):
    """log_likelihood and predictions groups: az.loo, az.compare and az.rhat work on the trace alone and give the
    metrics' numbers; per-group fits' sample stats work per group after ``idata.sel(group=...)``."""
    idata = az.from_netcdf(pipeline / "traces" / f"{name}.nc")
    detail = json.loads((pipeline / "metrics" / "detail" / f"{name}.json").read_text())
    ll = idata.log_likelihood["y"]
    assert ll.dims == ("chain", "draw", "obs") and ll.sizes["obs"] == idata.observed_data.sizes["obs"]
    assert list(ll["obs_group"].values) == list(idata.observed_data["obs_group"].values)
    ours = evaluation.psis_loo(ll.values)
    assert float(ours.elpd_loo) == pytest.approx(detail["loo"]["elpd"], abs=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pareto k warnings at 25 draws
        default = az.loo(idata)  # ArviZ's own relative efficiency (from weight space): close, not equal
    assert float(default.elpd_loo) == pytest.approx(detail["loo"]["elpd"], rel=0.05)
    p = idata.predictions["p"]
    for g, values in detail["per_group"].items():
        rhat = az.rhat(p.where(p["obs_group"] == g, drop=True).to_dataset(name="p"))["p"]
        assert float(rhat.max()) == pytest.approx(values["rhat_fn"], abs=1e-6)
    y_test = idata.predictions_constant_data["y"]
    accuracy = float(((p.mean(("chain", "draw")) > 0.5) == (y_test == 1)).mean())
    assert accuracy == pytest.approx(detail["test"]["accuracy"], abs=1e-6)
    if "group" in idata.sample_stats.dims:
        one = idata.sel(group="g01")
        assert az.bfmi(one).shape == (idata.posterior.sizes["chain"],)
        az.plot_energy(one)
    else:
        assert az.bfmi(idata).shape == (idata.posterior.sizes["chain"],)
    plt.close("all")


def test_prior_outputs(pipeline):
    headline = json.loads((pipeline / "metrics" / "prior.json").read_text())
    m = json.loads((pipeline / "metrics" / "detail" / "prior.json").read_text())
    assert headline == {"draws": {"chains_used": m["draws"]["chains_used"]},
                        "layers": {k: {"prior_sd_mean": v["prior_sd_mean"]} for k, v in m["layers"].items()}}
    n_post = TINY["sampler"]["chains"] * TINY["sampler"]["draws"]
    assert m["draws"]["posterior_draws"] == n_post
    assert m["draws"]["new_group_draws"] == n_post * TINY["prior"]["draws_per_sample"]
    assert set(m["layers"]) == {"in", "h1_h2", "out"}
    assert m["layers"]["out"]["group_sd"]["mean"] > 0


def test_report_opens_with_the_best_model_and_shows_the_baselines(pipeline):
    """The first line below the title names the best model by test log loss among the BNNs and the baselines,
    whose scores are those of metrics/baselines.json."""
    lines = (pipeline / "reports" / "report.md").read_text().splitlines()
    assert lines[2].startswith("Best on the test rows by log loss (lower is better): ")
    assert "standard errors of the per-row difference" in lines[2]
    baselines = json.loads((pipeline / "metrics" / "baselines.json").read_text())
    row = next(line for line in lines if line.startswith("| Gradient boosting (baseline) |"))
    assert f"| {baselines['gradient_boosting']['test']['log_loss']:.3f} |" in row
    html = (pipeline / "reports" / "report.html").read_text()
    assert html.index("Best on the test rows by log loss") < html.index("Status: can the inference be trusted?")
    # the settings are a table further down, not a paragraph above the status box
    assert not any(line.startswith("Sampling:") for line in lines)
    assert html.index("Status: can the inference be trusted?") < html.index("Sampling settings")
    start = lines.index("## Sampling settings")
    settings = lines[start:next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))]
    assert [line.split(" | ")[0] for line in settings if line.startswith("| ")][1:] == ["| Flat", "| Hierarchical",
                                                                                      "| Informed prior"]


def test_report_outputs(pipeline):
    html = (pipeline / "reports" / "report.html").read_text()
    assert "data:image/png;base64," in html
    assert (pipeline / "reports" / "report.md").is_file()
    summary = json.loads((pipeline / "metrics" / "summary.json").read_text())
    assert {"hier_minus_flat_test_accuracy", "hier_minus_flat_elpd", "hier_minus_flat_elpd_se"} <= set(
        summary["comparison"])
    for name in ("compare.png", "energy.png", "trace_group_sd.png", "rank_group_sd.png", "ess_fn.png"):
        assert (pipeline / "reports" / "figures" / name).is_file()


def test_bad_param_stops_before_sampling_and_keeps_outputs(pipeline, tmp_path):
    bad = dict(TINY, sampler=dict(TINY["sampler"], draws=0))
    params = pipeline / "bad_params.yaml"
    params.write_text(yaml.safe_dump(bad))
    before = (pipeline / "metrics" / "flat.json").read_bytes()
    proc = run("fit_flat", params, "--tasks-path", "data/tasks.nc", "--trace-out", "traces/flat.nc",
               "--metrics-out", "metrics/flat.json", "--timing-out", "timings/flat.json")
    assert proc.returncode == 2
    assert "sampler.draws=0" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (pipeline / "metrics" / "flat.json").read_bytes() == before


def test_wrong_trace_variant_is_a_clear_error(pipeline):
    proc = run("derive_prior", pipeline / "params.yaml", "--hier-trace", "traces/flat.nc",
               "--prior-out", "priors/other.nc", "--metrics-out", "metrics/other.json")
    assert proc.returncode == 2
    assert "holds model variant 'flat', expected 'hierarchical'" in proc.stderr
    assert not (pipeline / "priors" / "other.nc").exists()


def test_a_trace_with_non_finite_draws_is_a_clear_error_in_derive_prior(pipeline):
    """A NaN draw: edited into a fit's trace, the checksum refuses the file; in a trace made elsewhere that carries a
    checksum of its own, one error line names the variable, not a traceback from the unit matching (whose
    assignment refuses non-finite costs)."""
    import shutil

    import netCDF4

    from hbnn.files import integrity
    from hbnn.files.io import close_trace, load_trace
    from hbnn.files.trace import Trace

    bad = pipeline / "traces" / "nan_hier.nc"
    shutil.copyfile(pipeline / "traces" / "hier.nc", bad)
    with netCDF4.Dataset(bad, "a") as f:
        f.groups["posterior"].variables["mu_in"][0, 3, 0, 0] = np.nan
    args = ("--hier-trace", "traces/nan_hier.nc", "--prior-out", "priors/other.nc", "--metrics-out",
            "metrics/other.json")
    proc = run("derive_prior", pipeline / "params.yaml", *args)
    assert proc.returncode == 2 and "(group posterior) does not match the checksum" in proc.stderr

    trace = load_trace(pipeline / "traces" / "hier.nc", "hierarchical", groups=(), only=None)
    groups = {name: trace[name].load() for name in trace.groups()}
    close_trace(trace)
    posterior = groups["posterior"].copy(deep=True)
    posterior["mu_in"][0, 3, 0, 0] = np.nan
    groups["posterior"] = posterior
    Trace(**{name: integrity.sealed(ds) for name, ds in groups.items()}).to_netcdf(bad)
    proc = run("derive_prior", pipeline / "params.yaml", *args)
    assert proc.returncode == 2
    assert "traces/nan_hier.nc: mu_in has 1 non-finite values" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (pipeline / "priors" / "other.nc").exists()


def test_prior_with_wrong_layer_shapes_is_a_clear_error(pipeline):
    params = pipeline / "wide_params.yaml"
    params.write_text(yaml.safe_dump(dict(TINY, model={"hidden_layers": [4, 4]})))
    proc = run("fit_informed", params, "--tasks-path", "data/tasks.nc", "--prior-path", "priors/informed.nc",
               "--trace-out", "traces/other.nc", "--metrics-out", "metrics/other.json",
               "--timing-out", "timings/other.json")
    assert proc.returncode == 2
    assert "has layer shapes" in proc.stderr and "priors/informed.nc" in proc.stderr
    assert not (pipeline / "traces" / "other.nc").exists()


def test_sigkill_during_sampling_leaves_outputs_intact(pipeline):
    params = pipeline / "long_params.yaml"
    params.write_text(yaml.safe_dump(dict(TINY, sampler=dict(TINY["sampler"], tune=20000, draws=20000))))
    trace, metrics = pipeline / "traces" / "flat.nc", pipeline / "metrics" / "flat.json"
    before = trace.read_bytes(), metrics.read_bytes()
    cmd = [sys.executable, str(STAGES / "fit_flat.py"), "--params", str(params), "--tasks-path", "data/tasks.nc",
           "--trace-out", "traces/flat.nc", "--metrics-out", "metrics/flat.json", "--timing-out", "timings/flat.json"]
    env = {**os.environ, "HBNN_LOG": "debug"}  # the test waits for the sampler's start line
    with subprocess.Popen(cmd, cwd=pipeline, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            deadline = time.monotonic() + 300
            for line in proc.stderr:  # wait until the sampler is running
                if "sampling: backend=" in line or time.monotonic() > deadline:
                    break
            time.sleep(1.0)
            assert proc.poll() is None, "stage finished before it could be killed"
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert (trace.read_bytes(), metrics.read_bytes()) == before
    leftovers = [p.name for d in ("traces", "metrics") for p in (pipeline / d).iterdir() if p.name.startswith(".")]
    assert leftovers == []
    # and the stage completes when run again
    check(run("fit_flat", pipeline / "params.yaml", "--tasks-path", "data/tasks.nc", "--trace-out", "traces/flat.nc",
              "--metrics-out", "metrics/flat.json",
              "--timing-out", "timings/flat.json"))


def test_same_params_give_identical_posteriors_and_metrics(pipeline):
    """Rerunning a fit with the same params reproduces every draw and the metrics file byte for byte.

    Wall-clock times live in timings/*.json, the only output that may differ.
    """
    check(run("fit_hier", pipeline / "params.yaml", "--tasks-path", "data/tasks.nc", "--trace-out",
              "traces/hier_again.nc", "--metrics-out", "metrics/hier_again.json",
              "--timing-out", "timings/hier_again.json"))
    first = az.from_netcdf(pipeline / "traces" / "hier.nc").posterior
    again = az.from_netcdf(pipeline / "traces" / "hier_again.nc").posterior
    for var in first.data_vars:
        assert (first[var].values == again[var].values).all(), var
    m1, m2 = ((pipeline / "metrics" / f).read_bytes() for f in ("hier.json", "hier_again.json"))
    assert m1 == m2
    t1, t2 = (json.loads((pipeline / "timings" / f).read_text()) for f in ("hier.json", "hier_again.json"))
    assert t1["sampling"]["grad_evals"] == t2["sampling"]["grad_evals"]


def test_a_dask_local_cluster_gives_the_same_outputs_and_says_where_it_ran(pipeline):
    """HBNN_DASK_SCHEDULER moves the per-group fits to Dask workers; the metrics stay identical byte for byte."""
    env = {**os.environ, "HBNN_DASK_SCHEDULER": "local:2"}
    cmd = [sys.executable, str(STAGES / "fit_informed.py"), "--params", "params.yaml", "--tasks-path",
           "data/tasks.nc", "--prior-path", "priors/informed.nc", "--trace-out", "traces/informed_dask.nc",
           "--metrics-out", "metrics/informed_dask.json", "--timing-out", "timings/informed_dask.json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=pipeline, env=env)
    check(proc)
    assert re.search(r"fit_informed: 3 groups in 3 shards on 2 Dask workers at tcp://", proc.stderr), proc.stderr
    info = [line.split()[2] for line in proc.stderr.splitlines() if " INFO " in line]
    assert info and all(name.startswith("hbnn") for name in info), info  # Dask's own lines stay at WARNING
    for name in ("informed.json", "detail/informed.json"):
        dask_name = name.replace("informed", "informed_dask")
        assert (pipeline / "metrics" / name).read_bytes() == (pipeline / "metrics" / dask_name).read_bytes(), name
    first = az.from_netcdf(pipeline / "traces" / "informed.nc").posterior
    again = az.from_netcdf(pipeline / "traces" / "informed_dask.nc").posterior
    for var in first.data_vars:
        assert (first[var].values == again[var].values).all(), var


# ----------------------------------------------------------------------------- users' tables
EXAMPLE = ROOT / "data" / "examples"
TABLE = {
    **TINY,
    "data": {"source": "table", "path": str(EXAMPLE / "sites.csv"), "features": ["temperature", "pressure", "humidity"],
             "label": "failed", "group": "site"},
}


@pytest.fixture(scope="module")
def table_pipeline(tmp_path_factory):
    return _run_pipeline(tmp_path_factory, "table", TABLE)


SITES = [f"S{i:02d}" for i in range(1, 13)]


def test_table_runs_through_every_stage_with_the_moons_outputs(table_pipeline, pipeline):
    d = table_pipeline
    for name in ("flat", "hier", "informed"):
        post = az.from_netcdf(d / "traces" / f"{name}.nc").posterior
        assert list(post["group"].values) == SITES
        assert list(post["feature"].values) == ["temperature", "pressure", "humidity"]
        m = json.loads((d / "metrics" / "detail" / f"{name}.json").read_text())
        moons = json.loads((pipeline / "metrics" / "detail" / f"{name}.json").read_text())
        assert sorted(m["per_group"]) == SITES
        assert set(m["test"]) == set(moons["test"]) and set(m["sampling"]) == set(moons["sampling"])
        assert 0.5 < m["test"]["accuracy"] <= 1
    same = {p.relative_to(pipeline / "reports").as_posix().split("_p")[0] for p in (pipeline / "reports").rglob("*.*")}
    ours = {p.relative_to(d / "reports").as_posix().split("_p")[0] for p in (d / "reports").rglob("*.*")}
    assert ours == same
    summary = json.loads((d / "metrics" / "summary.json").read_text())
    assert summary["n_groups"] == 12
    text = (d / "reports" / "report.md").read_text()
    assert "humidity held at their training mean" in text and "two moons" not in text
    # the seed notebooks' moons numbers are not set beside a table's (before: columns and hollow markers of them)
    assert "reference numbers are not shown" in text and "PyMC3 original (train / test %)" not in text


def test_training_rows_per_site_follow_the_table(table_pipeline):
    obs = az.from_netcdf(table_pipeline / "traces" / "hier.nc").observed_data
    counts = dict(zip(*np.unique(obs["obs_group"].values, return_counts=True), strict=True))
    assert counts["S01"] == 4 and counts["S12"] == 150  # half of 8 and of 300 rows, stratified by label


def test_predict_scores_an_unseen_site_from_the_console(table_pipeline):
    d = table_pipeline
    cmd = [sys.executable, "-m", "hbnn", "predict", "--trace", "traces/hier.nc", "--input",
           str(EXAMPLE / "new_sites.csv"), "--output", "scored.csv"]
    check(subprocess.run(cmd, capture_output=True, text=True, cwd=d))
    scored = pd.read_csv(d / "scored.csv")
    assert scored.groupby("site")["unseen_group"].all().to_dict() == {"S03": False, "S12": False, "S13": True}
    assert ((scored["lower_94"] <= scored["mean"]) & (scored["mean"] <= scored["upper_94"])).all()
    assert scored["mean"].between(0, 1).all()
    flat = subprocess.run([*cmd[:5], "traces/flat.nc", *cmd[6:9], "flat_scored.csv"], capture_output=True, text=True,
                          cwd=d)
    assert flat.returncode == 2 and "['S13']" in flat.stderr and "Traceback" not in flat.stderr
    assert not (d / "flat_scored.csv").exists()


def _predict_known_and_new(d: Path, features: dict[str, float]) -> pd.DataFrame:
    """``hbnn predict`` with the hierarchical trace on one row of shop ``big`` and one of an unseen shop."""
    pd.DataFrame({"shop": ["big", "new"], **{k: [v, v] for k, v in features.items()}}).to_csv(d / "new.csv",
                                                                                              index=False)
    check(subprocess.run([sys.executable, "-m", "hbnn", "predict", "--trace", "traces/hier.nc", "--input", "new.csv",
                          "--output", "scored.csv"], capture_output=True, text=True, cwd=d))
    scored = pd.read_csv(d / "scored.csv")
    assert scored["unseen_group"].tolist() == [False, True]
    return scored


@pytest.mark.slow  # about 2 minutes: three more model compiles and a report
def test_gaussian_linear_table_runs_through_every_stage(tmp_path):
    """Regression with hidden_layers 0 and unequal groups (4 to 40 rows), every stage and predict."""
    rng = np.random.default_rng(3)
    parent = rng.normal(2.0, 1.0, size=2)
    parts = []
    for name, n in {"small": 6, "mid": 15, "big": 40}.items():
        X = rng.normal(5.0, 2.0, size=(n, 2))
        w = rng.normal(parent, 0.3)
        parts.append(pd.DataFrame({"shop": name, "a": X[:, 0], "b": X[:, 1], "one": 1.0,
                                   "sales": X @ w + rng.normal(0, 0.5, size=n)}))
    pd.concat(parts).to_csv(tmp_path / "sales.csv", index=False)
    raw = {**TINY, "data": {"source": "table", "path": "sales.csv", "features": ["a", "b", "one"], "label": "sales",
                            "group": "shop"},
           "model": {"hidden_layers": 0, "likelihood": "gaussian"}}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    run_all(tmp_path, params)
    for name in ("flat", "hier", "informed"):
        m = json.loads((tmp_path / "metrics" / "detail" / f"{name}.json").read_text())
        assert {"rmse", "lpd", "coverage_94", "n"} == set(m["test"])
        assert evaluation.headline(m, "rmse") == json.loads((tmp_path / "metrics" / f"{name}.json").read_text())
        assert "accuracy" not in m["train"] and sorted(m["per_group"]) == ["big", "mid", "small"]
        trace = az.from_netcdf(tmp_path / "traces" / f"{name}.nc")
        assert set(trace.predictions.data_vars) == {"mu", "y"}  # the mean and a predictive draw per test row
        assert m["test"]["rmse"] > 0 and 0 <= m["test"]["coverage_94"] <= 1
    summary = json.loads((tmp_path / "metrics" / "summary.json").read_text())
    assert "hier_minus_flat_test_rmse" in summary["comparison"]
    assert (tmp_path / "reports" / "figures" / "surface_hierarchical_p01.png").is_file()
    assert (tmp_path / "reports" / "figures" / "correlation_out.png").is_file()
    scored = _predict_known_and_new(tmp_path, {"a": 5.0, "b": 4.0, "one": 1.0})
    assert scored.loc[1, "sd"] > scored.loc[0, "sd"]  # the population is wider than a fitted group


@pytest.mark.slow  # about 2 minutes: three more model compiles and a report
def test_poisson_count_table_runs_through_every_stage(tmp_path):
    """Counts per shop (sales) with a log link: every stage, the report and hbnn predict."""
    rng = np.random.default_rng(5)
    parent = rng.normal([0.8, -0.5], 0.3)
    parts = []
    for name, n in {"small": 8, "mid": 20, "big": 40}.items():
        X = rng.normal(size=(n, 2))
        rate = np.exp(1.0 + X @ rng.normal(parent, 0.3))
        parts.append(pd.DataFrame({"shop": name, "price": X[:, 0], "promo": X[:, 1], "one": 1.0,
                                   "sales": rng.poisson(rate)}))
    pd.concat(parts).to_csv(tmp_path / "sales.csv", index=False)
    raw = {**TINY, "data": {"source": "table", "path": "sales.csv", "features": ["price", "promo", "one"],
                            "label": "sales", "group": "shop"},
           "model": {"hidden_layers": [3], "likelihood": "poisson"}}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    check(run("check_params", params))
    run_all(tmp_path, params)
    for name in ("flat", "hier", "informed"):
        m = json.loads((tmp_path / "metrics" / "detail" / f"{name}.json").read_text())
        assert {"rmse", "lpd", "coverage_94", "n"} == set(m["test"])
        assert sorted(m["per_group"]) == ["big", "mid", "small"] and m["test"]["lpd"] < 0
        assert 0 <= m["test"]["coverage_94"] <= 1
    trace = az.from_netcdf(tmp_path / "traces" / "hier.nc")
    assert trace.observed_data["y"].dtype.kind == "i" and "sigma" not in trace.posterior
    summary = json.loads((tmp_path / "metrics" / "summary.json").read_text())
    assert "hier_minus_flat_test_rmse" in summary["comparison"]
    text = (tmp_path / "reports" / "report.md").read_text()
    assert "Poisson likelihood on the log rate" in text and "posterior mean rate" in text
    scored = _predict_known_and_new(tmp_path, {"price": 0.0, "promo": 0.0, "one": 1.0})
    assert (scored["mean"] > 0).all() and (scored["lower_94"] == scored["lower_94"].round()).all()
    assert (scored["lower_94"] <= scored["mean"]).all() and (scored["mean"] <= scored["upper_94"]).all()


@pytest.mark.slow  # about 2 minutes: three more model compiles, the transfer experiment and a report
def test_negative_binomial_count_table_runs_through_every_stage(tmp_path):
    """Overdispersed counts per shop: every stage, the transfer experiment, the report and hbnn predict."""
    rng = np.random.default_rng(6)
    parent = rng.normal([0.8, -0.5], 0.3)
    parts = []
    for name, n in {"s1": 10, "s2": 14, "s3": 20, "s4": 26, "s5": 32, "big": 40}.items():
        X = rng.normal(size=(n, 2))
        mean = np.exp(1.5 + X @ rng.normal(parent, 0.3))
        parts.append(pd.DataFrame({"shop": name, "price": X[:, 0], "promo": X[:, 1], "one": 1.0,
                                   "sales": rng.negative_binomial(2.0, 2.0 / (2.0 + mean))}))
    pd.concat(parts).to_csv(tmp_path / "sales.csv", index=False)
    raw = {**TINY, "data": {"source": "table", "path": "sales.csv", "features": ["price", "promo", "one"],
                            "label": "sales", "group": "shop"},
           "model": {"hidden_layers": [3], "likelihood": "negative_binomial", "noise_sd": 3.0}}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    check(run("check_params", params))
    run_all(tmp_path, params)
    for name in ("flat", "hier", "informed"):
        m = json.loads((tmp_path / "metrics" / "detail" / f"{name}.json").read_text())
        assert {"rmse", "lpd", "coverage_94", "n"} == set(m["test"]) and m["test"]["lpd"] < 0
        assert m["model"] == {"likelihood": "negative_binomial", "activation": "tanh"}
        trace = az.from_netcdf(tmp_path / "traces" / f"{name}.nc")
        assert "alpha" in trace.posterior and (trace.posterior["alpha"] > 0).all()
        assert trace.predictions["y"].dtype.kind == "i" and "rate" in trace.predictions
    transfer = json.loads((tmp_path / "metrics" / "transfer.json").read_text())
    assert transfer and (tmp_path / "traces" / "transfer" / "informed.nc").is_file()
    text = (tmp_path / "reports" / "report.md").read_text()
    assert "negative binomial likelihood on the log mean" in text
    # counts with variance mean + mean**2 / 2 against Poisson baselines: the first line says part of the margin is that
    assert "The baselines are Poisson models" in text
    scored = _predict_known_and_new(tmp_path, {"price": 0.0, "promo": 0.0, "one": 1.0})
    for column in ("lower_94", "upper_94"):
        assert (scored[column] == scored[column].round()).all()
    assert (scored["lower_94"] <= scored["mean"]).all() and (scored["mean"] <= scored["upper_94"]).all()
    assert (scored["sd"] ** 2 > scored["mean"]).all()  # overdispersed: more than a Poisson count's variance


@pytest.mark.slow  # about 2 minutes: three more model compiles, the transfer experiment and a report
def test_relu_network_runs_through_every_stage(tmp_path):
    """model.activation=relu: every stage, the transfer experiment, the report and hbnn predict, with the prior's
    units matched by permutations only and the activation said in the metrics and the report."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({**TINY, "model": {"activation": "relu"}}))
    run_all(tmp_path, params)
    for name in ("flat", "hier", "informed"):
        m = json.loads((tmp_path / "metrics" / "detail" / f"{name}.json").read_text())
        assert m["model"] == {"likelihood": "bernoulli", "activation": "relu"}
        assert 0 <= m["test"]["accuracy"] <= 1
    detail = tmp_path / "metrics" / "detail"
    for prior in (json.loads((detail / "prior.json").read_text()),
                  json.loads((detail / "transfer_prior.json").read_text())["prior"]):
        assert prior["activation"] == "relu" and prior["unit_matching"] == "permutations"
    text = (tmp_path / "reports" / "report.md").read_text()
    assert "relu MLP" in text
    post = az.from_netcdf(tmp_path / "traces" / "hier.nc").posterior
    known = str(post["group"].values[0])
    pd.DataFrame({"group": [known, "unseen"], "x1": [0.5, 0.5], "x2": [0.2, 0.2]}).to_csv(tmp_path / "new.csv",
                                                                                           index=False)
    check(subprocess.run([sys.executable, "-m", "hbnn", "predict", "--trace", "traces/hier.nc", "--input", "new.csv",
                          "--output", "scored.csv"], capture_output=True, text=True, cwd=tmp_path))
    scored = pd.read_csv(tmp_path / "scored.csv")
    assert scored["unseen_group"].tolist() == [False, True] and scored["mean"].between(0, 1).all()
