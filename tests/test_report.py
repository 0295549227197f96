"""The report stage on tiny synthetic traces: pages, self-contained HTML, summary and CSV."""

from __future__ import annotations

import base64
import csv
import json
import re
import sys

import arviz as az
import numpy as np
import pytest
import xarray as xr
from scipy.special import expit

from hbnn.config_read import parse_params
from hbnn.data.moons import make_moons_tasks
from hbnn.data.spec import DataSpec
from hbnn.data.tasks import Tasks
from hbnn.diagnostics.predictions import predict_output, predict_proba
from hbnn.files.io import InputError, made_by, provenance, stamp
from hbnn.files.outputs import detail_path, write_json, write_netcdf
from hbnn.model.network import layer_coords, layer_specs
from hbnn.pipeline import transfer
from hbnn.pipeline.variants import STAGE_PARAMS
from hbnn.report import metric_plots, numbers, outputs, plots, sections, transfer_section
from hbnn.report import status as report_status
from hbnn.report.stage import report

N_GROUPS = 7
PER_PAGE = 4  # 7 groups -> pages of 4 and 3
HIDDEN = [3, 2]
CHAINS, DRAWS = 2, 5
RAW = {
    "n_groups": N_GROUPS,
    "seed": 31,
    "data": {"n_samples": 20},
    "model": {"hidden_layers": HIDDEN},
    "report": {"grid_size": 8, "surface_draws": 6, "panels_per_page": PER_PAGE},
}
STAGES = {"flat": "fit_flat", "hierarchical": "fit_hier", "informed": "fit_informed"}


def _posterior(rng, specs, coords, names, hierarchical: bool) -> xr.Dataset:
    data = {}
    for s in specs:
        w = rng.normal(size=(CHAINS, DRAWS, len(names), *s.shape))
        data[s.var] = (("chain", "draw", "group", *s.dims), w)
        if hierarchical:
            data[f"mu_{s.name}"] = (("chain", "draw", *s.dims), w.mean(axis=2))
            data[f"sd_{s.name}"] = (("chain", "draw"), rng.gamma(2.0, 0.5, size=(CHAINS, DRAWS)))
    return xr.Dataset(data, coords={"chain": range(CHAINS), "draw": range(DRAWS), "group": names, **coords})


def _metrics(rng, names, hierarchical: bool) -> dict:
    per_group = {g: {"test": {"accuracy": float(rng.uniform(0.5, 1))}, "rhat_fn": float(rng.uniform(1, 1.1)),
                     "ess_bulk_fn": 100.0} for g in names}
    sampling = {"divergences": int(rng.integers(0, 3)), "max_rhat": 1.05,
                "min_ess_bulk": 50.0, "max_rhat_fn": 1.05, "min_ess_bulk_fn": 60.0}
    if hierarchical:
        sampling["group_sd"] = {"sd_in": {"rhat": 1.0, "ess_bulk": 300.0, "ess_tail": 250.0}}
    return {"train": {"accuracy": float(rng.uniform(0.8, 1))},
            "test": {"accuracy": float(rng.uniform(0.7, 0.9)), "log_loss": 0.4, "brier": 0.1},
            "per_group": per_group, "sampling": sampling}


def _log_lik(rng, n: int) -> np.ndarray:
    """Log-likelihood draws of ``n`` 0/1 rows from random probabilities."""
    return np.log(rng.uniform(0.2, 0.9, size=(CHAINS, DRAWS, n)))


def _prior(rng, specs) -> xr.Dataset:
    data, layers = {}, {}
    for s in specs:
        a = rng.normal(size=(s.size, s.size))
        data[f"mean_{s.name}"] = (f"weight_{s.name}", rng.normal(size=s.size))
        data[f"cov_{s.name}"] = ((f"weight_{s.name}", f"weight_{s.name}_col"), a @ a.T + np.eye(s.size))
        layers[s.name] = {"shape": list(s.shape), "dims": list(s.dims)}
    ds = xr.Dataset(data)
    ds.attrs["layers"] = json.dumps(layers)
    return ds


def write_fits(d, params, tasks: Tasks, rng) -> tuple[dict, dict]:
    """Synthetic outputs of the fit stages for ``tasks`` under ``d`` (traces, metrics, the informed prior and
    its metrics), as the report reads them: ``(trace paths, metrics)``."""
    names = tasks.group_names
    specs = layer_specs(tasks.n_features, HIDDEN)
    coords = layer_coords(tasks.features, HIDDEN)
    settings = {"hidden_layers": HIDDEN, "features": tasks.features, "sampler": {"chains": CHAINS, "draws": DRAWS}}
    n_train = tasks.split("train").y.size
    paths, metrics = {}, {}
    for v, stage in STAGES.items():
        groups = {"posterior": _posterior(rng, specs, coords, names, v == "hierarchical"),
                  "log_likelihood": xr.Dataset({"y": (("chain", "draw", "obs"), _log_lik(rng, n_train))})}
        if v == "hierarchical":  # as if fitted with ADVI: a loss per iteration
            groups["sample_stats"] = xr.Dataset({"loss": ("advi_iteration", 1000.0 / np.arange(1.0, 1201.0))})
        else:
            groups["sample_stats"] = xr.Dataset({"diverging": (("chain", "draw"), np.zeros((CHAINS, DRAWS), bool))})
        idata = az.InferenceData(**groups)
        stamp(idata, provenance(stage, v, params.section_hash(*STAGE_PARAMS[stage]), settings))
        paths[v] = d / "traces" / f"{v}.nc"
        write_netcdf(idata, paths[v])
        metrics[v] = {**_metrics(rng, names, v == "hierarchical"), "made_by": made_by(stage, params)}
        write_json(metrics[v], detail_path(d / "metrics" / numbers.METRICS_FILES[v]))
    prior = _prior(rng, specs)
    prior.attrs.update(provenance("derive_prior", "informed_prior", params.section_hash(*STAGE_PARAMS["derive_prior"]),
                                  {}))
    write_netcdf(prior, d / "prior.nc")
    prior_metrics = {"layers": {s.name: {"group_sd": {"mean": 1.0, "sd": 0.1, "q05": 0.8, "q95": 1.2}} for s in specs},
                     "alignment": {"chain_0": {"relabelled": 0}, "chain_1": {"relabelled": 1}},
                     "made_by": made_by("derive_prior", params)}
    write_json(prior_metrics, detail_path(d / "metrics" / "prior.json"))
    return paths, metrics


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Write synthetic inputs, leave a stale page in figures/, run the report once, record surface panels."""
    d = tmp_path_factory.mktemp("report")
    rng = np.random.default_rng(0)
    params = parse_params(RAW)
    tasks = make_moons_tasks(DataSpec.of(params))
    names = [str(g) for g in tasks["task"].values]
    write_netcdf(tasks, d / "tasks.nc")
    paths, metrics = write_fits(d, params, Tasks(tasks), rng)
    stale = d / "reports" / "figures" / "surface_flat_p09.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")

    # The surfaces are drawn in worker processes: each page drawn is recorded as a line of a file.
    record = d / "panels.jsonl"
    original = plots.plot_surface_page

    def recording(fields, titles, *args, **kwargs):
        assert fields.shape == (len(titles), 8, 8)
        with record.open("a") as f:
            f.write(json.dumps([kwargs["title"], list(titles)]) + "\n")
        return original(fields, titles, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "plot_surface_page", recording)
        result = report(params, d / "tasks.nc", paths["flat"], paths["hierarchical"], paths["informed"],
                            d / "prior.nc", d / "metrics", d / "reports")
    panels = sorted(tuple(json.loads(line)) for line in record.read_text().splitlines())
    return {"dir": d, "names": names, "metrics": metrics, "result": result, "panels": panels, "params": params}


def test_every_group_is_drawn_once_per_model_and_kind(run):
    for v in numbers.MODELS:
        for what in ("posterior mean", "posterior sd"):
            drawn = [t for title, titles in run["panels"] if title.startswith(f"{numbers.LABELS[v]}: {what}")
                     for t in titles]
            assert drawn == run["names"]
    figures = run["dir"] / "reports" / "figures"
    for v in numbers.MODELS:
        for stem in ("surface", "uncertainty"):
            assert sorted(p.name for p in figures.glob(f"{stem}_{v}_p*.png")) == [
                f"{stem}_{v}_p01.png", f"{stem}_{v}_p02.png"]


def test_report_surface_groups_draws_the_chosen_groups_of_every_model_and_says_why(run, tmp_path):
    """With fewer places than groups, every model's pages hold the same chosen groups in the chosen order, the
    section lists them with their reasons, and every other output still covers every group."""
    from hbnn.report.selection import choose_surface_groups

    params = parse_params({**RAW, "report": {**RAW["report"], "surface_groups": 3}})
    log, original = tmp_path / "panels.jsonl", plots.plot_surface_page

    def recording(fields, titles, *args, **kwargs):  # in the workers too: a line of a file per page
        with log.open("a") as f:
            f.write(json.dumps([kwargs["title"], list(titles)]) + "\n")
        return original(fields, titles, *args, **kwargs)

    d = run["dir"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "plot_surface_page", recording)
        result = report(params, d / "tasks.nc", d / "traces" / "flat.nc", d / "traces" / "hierarchical.nc",
                        d / "traces" / "informed.nc", d / "prior.nc", d / "metrics", tmp_path / "out")
    record = sorted(tuple(json.loads(line)) for line in log.read_text().splitlines())
    choice = choose_surface_groups(run["metrics"], run["names"], 3, params.seed)
    chosen = [run["names"][g] for g in choice.groups]
    assert len(chosen) == 3 and not choice.every_group
    assert sorted(title.split(":")[0] for title, _ in record) == sorted(2 * list(numbers.LABELS.values()))
    assert all(title.endswith("(page 1/1; 3 chosen groups of 7)") and titles == chosen for title, titles in record)
    out = tmp_path / "out"
    assert sorted(p.name for p in (out / "figures").glob("surface_*.png")) == [
        f"surface_{v}_p01.png" for v in sorted(numbers.MODELS)]
    page = (out / "report.html").read_text()
    assert "Surfaces are drawn for 3 of the 7 groups (report.surface_groups: 3)" in page
    assert all(re.search(f"<td[^>]*>{g}</td>", page) for g in chosen)
    assert result == run["result"]  # the summary covers every group either way
    assert (out / "plots" / "per_group_accuracy.csv").read_bytes() == (
        d / "reports" / "plots" / "per_group_accuracy.csv").read_bytes()
    assert "Every group&#x27;s surfaces are drawn (7 groups; report.surface_groups: 36" in (
        d / "reports" / "report.html").read_text()


_REPORT_AGAIN = """
import json, sys
from pathlib import Path
from hbnn.config_read import parse_params
from hbnn.report.stage import report
raw, d, out = json.loads(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
assert "jax" not in sys.modules  # so the models' figures are drawn in forked workers
report(parse_params(raw), d / "tasks.nc", d / "traces" / "flat.nc", d / "traces" / "hierarchical.nc",
       d / "traces" / "informed.nc", d / "prior.nc", d / "metrics", out)
"""


def test_a_report_drawn_in_forked_workers_has_the_same_bytes(run, tmp_path):
    """A fresh process (no JAX: the models' figures in forked workers) writes the same files as the fixture's run
    (in this test process, where JAX may be loaded and the workers then run in line)."""
    import subprocess
    import sys

    out = tmp_path / "reports"
    subprocess.run([sys.executable, "-c", _REPORT_AGAIN, json.dumps(RAW), str(run["dir"]), str(out)], check=True,
                   capture_output=True, text=True)
    ours = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(run["dir"] / "reports") for p in (run["dir"] / "reports").rglob("*") if p.is_file())
    assert ours == theirs
    for name in ours:
        assert (out / name).read_bytes() == (run["dir"] / "reports" / name).read_bytes(), name


_REPORT_INTERRUPTED = """
import os, sys, time
from pathlib import Path
from hbnn.errors import interrupts_reported
from hbnn.report import figures

d, out, started = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
real = figures.model_outputs

def slow(*args, **kwargs):  # in a worker: say so (its process id), then take long enough to be interrupted
    with started.open("a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(60)
    return real(*args, **kwargs)

figures.model_outputs = slow
with interrupts_reported():
    from hbnn.report.stage import report
    from hbnn.pipeline.runner import run_stage

    sys.exit(run_stage("report", ["tasks_path", "flat_trace", "hier_trace", "informed_trace", "prior_path",
                                  "metrics_dir", "out_dir"], report, [
        "--params", str(d / "params.yaml"), "--tasks-path", str(d / "tasks.nc"),
        "--flat-trace", str(d / "traces" / "flat.nc"), "--hier-trace", str(d / "traces" / "hierarchical.nc"),
        "--informed-trace", str(d / "traces" / "informed.nc"), "--prior-path", str(d / "prior.nc"),
        "--metrics-dir", str(d / "metrics"), "--out-dir", out]))
"""


def test_ctrl_c_while_the_workers_draw_ends_the_report_in_one_line(run, tmp_path):
    """Ctrl-C reaches the whole process group, workers included: one line, status 130, nothing written, no
    worker left behind."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    (run["dir"] / "params.yaml").write_text(yaml.safe_dump(RAW))
    started, out = tmp_path / "started", tmp_path / "reports"
    with subprocess.Popen([sys.executable, "-c", _REPORT_INTERRUPTED, str(run["dir"]), str(out), str(started)],
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert started.exists(), proc.stderr.read()
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends Ctrl-C
        err = proc.stderr.read()
        proc.wait(timeout=60)
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "interrupted: outputs unchanged"
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert not out.exists()
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):  # the workers are gone with the stage
        os.killpg(proc.pid, 0)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: exists and is not a zombie (an orphan's parent may be slow to reap it, or never)."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_a_killed_report_leaves_no_worker_behind(run, tmp_path):
    """``kill -9`` of the report's own process (its workers busy): the workers end with it, instead of waiting for
    ever to send their results down pipes that no one reads."""
    import os
    import signal
    import subprocess
    import time

    import yaml

    (run["dir"] / "params.yaml").write_text(yaml.safe_dump(RAW))
    started, out = tmp_path / "started", tmp_path / "reports"
    workers: list[int] = []
    with subprocess.Popen([sys.executable, "-c", _REPORT_INTERRUPTED, str(run["dir"]), str(out), str(started)],
                          stderr=subprocess.DEVNULL, start_new_session=True) as proc:
        try:
            deadline = time.monotonic() + 120
            while len(workers) < 3 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
                lines = started.read_text().split("\n") if started.exists() else [""]
                workers = [int(p) for p in lines[:-1]]  # whole lines only: a worker may be writing the last
            assert len(workers) == 3, workers  # one per model, each in its slow model_outputs
            os.kill(proc.pid, signal.SIGKILL)  # the report alone, not its process group
            proc.wait(timeout=60)
            deadline = time.monotonic() + 20
            while any(_running(w) for w in workers) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not [w for w in workers if _running(w)]
        finally:
            for w in workers:  # a failed test leaves no process either
                if _running(w):
                    os.kill(w, signal.SIGKILL)


def test_stale_figures_are_removed(run):
    assert not (run["dir"] / "reports" / "figures" / "surface_flat_p09.png").exists()


def test_html_is_self_contained(run):
    text = (run["dir"] / "reports" / "report.html").read_text()
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text and "<link" not in text and "@import" not in text and "url(" not in text
    sources = re.findall(r'src="([^"]*)"', text)
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', text))  # only the contents' anchors
    figures = sorted((run["dir"] / "reports" / "figures").glob("*.png"))
    assert len(sources) == len(figures)
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_references_every_figure(run):
    text = (run["dir"] / "reports" / "report.md").read_text()
    linked = set(re.findall(r"\]\((figures/[^)]+\.png)\)", text))
    on_disk = {f"figures/{p.name}" for p in (run["dir"] / "reports" / "figures").glob("*.png")}
    assert linked == on_disk
    assert {"figures/accuracy.png", "figures/group_sd.png", "figures/correlation_in.png"} <= on_disk
    # 7 groups is not the reference data, and the report must say so.
    assert "NOT comparable" in text and r"n\_groups = 7 (reference 18)" in text  # Markdown-escaped


def _has_list(x) -> bool:
    if isinstance(x, list):
        return True
    return isinstance(x, dict) and any(_has_list(v) for v in x.values())


def test_summary_json(run):
    summary = json.loads((run["dir"] / "metrics" / "summary.json").read_text())
    assert summary == run["result"]
    assert not _has_list(summary)
    assert summary["n_groups"] == N_GROUPS
    test = {v: run["metrics"][v]["test"]["accuracy"] for v in numbers.MODELS}
    comp = summary["comparison"]
    pairs = ("hier_minus_flat", "informed_minus_flat", "hier_minus_informed")
    assert set(comp) == {f"{p}_{k}" for p in pairs for k in ("test_accuracy", "elpd", "elpd_se")}
    ll = {v: az.from_netcdf(run["dir"] / "traces" / f"{v}.nc").log_likelihood["y"].values for v in numbers.MODELS}
    loo = {v: az.loo(az.from_dict(log_likelihood={"y": x}), reff=1.0, pointwise=True) for v, x in ll.items()}
    diff = np.asarray(loo["hierarchical"].loo_i) - np.asarray(loo["flat"].loo_i)
    assert comp["hier_minus_flat_elpd"] == pytest.approx(diff.sum(), abs=0.05)  # our reff is not 1: close only
    assert comp["hier_minus_flat_elpd_se"] == pytest.approx(np.sqrt(diff.size * diff.var()), rel=0.05)
    assert comp["hier_minus_flat_test_accuracy"] == pytest.approx(test["hierarchical"] - test["flat"], abs=1e-5)
    assert comp["informed_minus_flat_test_accuracy"] == pytest.approx(test["informed"] - test["flat"], abs=1e-5)
    assert comp["hier_minus_informed_test_accuracy"] == pytest.approx(test["hierarchical"] - test["informed"],
                                                                       abs=1e-5)


def test_per_group_csv(run):
    with open(run["dir"] / "reports" / "plots" / "per_group_accuracy.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["group", "flat", "hierarchical", "informed"]
    assert [r["group"] for r in rows] == run["names"]
    for r in rows:
        for v in numbers.MODELS:
            expected = run["metrics"][v]["per_group"][r["group"]]["test"]["accuracy"]
            assert float(r[v]) == pytest.approx(expected, abs=1e-6)


def test_calibration_csv_and_figure(run):
    with open(run["dir"] / "reports" / "plots" / "calibration.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["bin", *numbers.MODELS]
    assert [float(r["bin"]) for r in rows] == pytest.approx([0.05 + 0.1 * i for i in range(10)])
    values = [float(r[m]) for r in rows for m in numbers.MODELS if r[m] != ""]
    assert values and all(0.0 <= v <= 1.0 for v in values)
    assert (run["dir"] / "reports" / "figures" / "calibration.png").is_file()


def test_stale_metrics_are_an_input_error(run, tmp_path):
    d = run["dir"]
    metrics = tmp_path / "metrics"
    for name in ("flat.json", "hier.json", "informed.json", "prior.json"):
        detail_path(metrics / name).parent.mkdir(parents=True, exist_ok=True)
        detail_path(metrics / name).write_text(detail_path(d / "metrics" / name).read_text())
    flat = json.loads(detail_path(metrics / "flat.json").read_text())
    flat["per_group"].pop(run["names"][0])
    detail_path(metrics / "flat.json").write_text(json.dumps(flat))
    with pytest.raises(InputError, match="covers groups"):
        report(run["params"], d / "tasks.nc", d / "traces" / "flat.nc", d / "traces" / "hierarchical.nc",
                   d / "traces" / "informed.nc", d / "prior.nc", metrics, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_grid_past_the_memory_limit_is_refused_before_any_surface(run, tmp_path):
    """report.grid_size=100000 is a legal integer: 10^10 grid points a panel ended in a NumPy MemoryError."""
    import dataclasses

    from hbnn.config import ConfigError

    d, params = run["dir"], run["params"]
    huge = dataclasses.replace(params, report=dataclasses.replace(params.report, grid_size=100_000))
    with pytest.raises(ConfigError, match=r"report: estimated .* \(report.grid_size=100000\).*over limits"):
        report(huge, d / "tasks.nc", d / "traces" / "flat.nc", d / "traces" / "hierarchical.nc",
               d / "traces" / "informed.nc", d / "prior.nc", d / "metrics", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("features, hidden, bias", [(2, [4, 3], False), (2, [4, 3], True), (3, [5], True),
                                                     (2, [], False), (2, [], True), (4, [2, 6, 3], False)])
def test_surface_stats_match_all_draws_at_once(monkeypatch, features, hidden, bias):
    rng = np.random.default_rng(1)
    specs = layer_specs(features, hidden, bias)
    weights = [rng.normal(size=(13, *s.shape)) for s in specs]
    points = rng.uniform(-3, 3, size=(37, features))
    monkeypatch.setattr(numbers, "CHUNK_VALUES", points.shape[0] * 3)  # 3 draws per chunk: 5 uneven chunks
    mean, sd = numbers.surface_stats(weights, points, "tanh")
    p = predict_proba([w[None] for w in weights], points, "tanh")[0]
    # surfaces are computed in float32: ~1e-7 from float64, checked to 1e-6
    np.testing.assert_allclose(mean, p.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(sd, p.std(axis=0), atol=1e-6)
    # another quantity of the outputs (a Poisson rate), against the float64 outputs
    rate_mean, _ = numbers.surface_stats(weights, points, "tanh", values=lambda out: np.exp(0.3 * out))
    outputs = predict_output([w[None] for w in weights], points, "tanh")[0]
    np.testing.assert_allclose(rate_mean, np.exp(0.3 * outputs).mean(axis=0), rtol=2e-6)


def test_surface_stats_fused_expit_matches_numpy_path_including_saturated_outputs():
    """The classifier's compiled pass (``values`` is SciPy's ``expit``) gives what the generic NumPy path gives, also
    where outputs pass float32's exp range (|output| > 87)."""
    rng = np.random.default_rng(2)
    specs = layer_specs(2, [4], False)
    weights = [rng.normal(size=(11, *s.shape)) for s in specs]
    weights[-1] = weights[-1] * np.linspace(0.1, 60.0, 11)[:, None]  # outputs from ~0.1 to ~200 in size
    points = rng.uniform(-3, 3, size=(29, 2))
    fused = numbers.surface_stats(weights, points, "tanh")
    generic = numbers.surface_stats(weights, points, "tanh", values=lambda out: expit(out))
    assert all(np.isfinite(a).all() for a in (*fused, *generic))
    np.testing.assert_allclose(fused[0], generic[0], atol=1e-6)
    np.testing.assert_allclose(fused[1], generic[1], atol=1e-6)
    # a non-finite draw stays visible in the sums (NaN), on both paths, rather than being summed as a number
    weights[1][3, 0] = np.nan
    for values in (expit, lambda out: expit(out), lambda out: np.exp(0.01 * out)):
        assert np.isnan(numbers.surface_stats(weights, points, "tanh", values=values)[0]).all()
    # an overflowing value (a Poisson rate past float32's range) stays infinite in the mean
    weights[1][3, 0] = 1.0
    with np.errstate(over="ignore", invalid="ignore"):  # inf - inf in the variance, as before
        assert np.isinf(numbers.surface_stats(weights, points, "tanh", values=lambda out: np.exp(out) * 1e38)[0]).any()


def test_surface_values_take_the_compiled_path_only_for_the_logistic_mean():
    from hbnn.model import likelihoods
    from hbnn.report.figures import SurfaceSetup

    bernoulli = SurfaceSetup(np.zeros(2), ("a", "b"), likelihoods.LIKELIHOODS["bernoulli"])
    assert bernoulli.values() is expit

    class Probit(likelihoods.Bernoulli):  # a classifier of another link must not be plotted as logistic
        def mean(self, output, y_mean=0.0, y_sd=1.0):
            return 0.5 * (1.0 + np.tanh(output))

    assert SurfaceSetup(np.zeros(2), ("a", "b"), Probit()).values() is not expit
    gaussian = SurfaceSetup(np.zeros(2), ("a", "b"), likelihoods.LIKELIHOODS["gaussian"], (10.0, 2.0))
    np.testing.assert_allclose(gaussian.values()(np.array([0.0, 1.0])), [10.0, 12.0])


def test_surface_points_are_row_major_in_x2():
    axis, points = numbers.surface_points(1.0, 3)
    assert points.shape == (9, 2)
    np.testing.assert_array_equal(points[:3, 1], [-1, -1, -1])  # first image row is the lowest x2
    np.testing.assert_array_equal(points[:3, 0], axis)


@pytest.mark.parametrize("n_total, n_keep", [(2000, 500), (10, 500), (7, 3), (1, 1)])
def test_thin_indices(n_total, n_keep):
    idx = numbers.thin_indices(n_total, n_keep)
    assert idx.size == min(n_total, n_keep)
    assert idx[0] == 0 and idx[-1] == n_total - 1
    assert np.all(np.diff(idx) > 0)


def test_pages_and_near_square_grid():
    assert [len(p) for p in plots.pages(40, 36)] == [36, 4]
    assert [len(p) for p in plots.pages(36, 36)] == [36]
    assert [len(p) for p in plots.pages(1, 36)] == [1]
    for n in range(1, 250):
        rows, cols = plots.panel_grid(n)
        assert rows * cols >= n > (rows - 1) * cols
        assert 0 <= cols - rows <= 1


def test_surface_page_titles_every_panel():
    names = [f"g{i}" for i in range(5)]
    fields = np.random.default_rng(2).random((5, 4, 4))
    points = [(np.zeros((2, 2)), np.array([0, 1]))] * 5
    fig, axes = plots.plot_surface_page(fields, names, 3.0, points, kind="sd")
    assert axes.shape == (2, 3)
    assert [ax.get_title() for ax in axes.flat if ax.axison] == names
    assert plots.png_bytes(fig)[:4] == b"\x89PNG"


def test_correlation_helpers():
    cov = np.array([[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    corr = numbers.correlation_from_cov(cov)
    np.testing.assert_allclose(corr[:2, :2], [[1.0, 1.0], [1.0, 1.0]])
    assert np.isnan(corr[2]).all()
    assert np.isnan(numbers.correlation_of_draws(np.ones((1, 3)))).all()
    spec = layer_specs(2, [3])[0]
    assert numbers.weight_labels(spec, ["x1", "x2"]) == ["x1->0", "x1->1", "x1->2", "x2->0", "x2->1", "x2->2"]


def test_trace_without_group_mean_is_an_input_error(run, tmp_path):
    d = run["dir"]
    idata = az.from_netcdf(d / "traces" / "hierarchical.nc")
    broken = az.InferenceData(posterior=idata.posterior.load().drop_vars("mu_in"))
    write_netcdf(broken, tmp_path / "hier.nc")
    with pytest.raises(InputError, match="mu_in"):
        report(run["params"], d / "tasks.nc", d / "traces" / "flat.nc", tmp_path / "hier.nc",
                   d / "traces" / "informed.nc", d / "prior.nc", d / "metrics", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variant", ["flat", "hierarchical", "informed"])
def test_a_posterior_changed_after_its_fit_is_refused_before_the_report_writes(run, tmp_path, variant):
    """Each model's posterior is checked against its checksum once: by the report's own process (the model with a
    group distribution, whose draws it reads) or by the model's worker, before anything is written."""
    import shutil

    import h5py

    d = run["dir"]
    traces = {v: d / "traces" / f"{v}.nc" for v in ("flat", "hierarchical", "informed")}
    traces[variant] = shutil.copy(traces[variant], tmp_path / f"{variant}.nc")
    with h5py.File(traces[variant], "r") as f:
        start = f["posterior"]["w_out"].id.get_offset()
    data = bytearray(traces[variant].read_bytes())
    data[start: start + 8] = bytes(b ^ 0xFF for b in data[start: start + 8])
    traces[variant].write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"{variant}.nc \(group posterior\) does not match the checksum"):
        report(run["params"], d / "tasks.nc", traces["flat"], traces["hierarchical"], traces["informed"],
               d / "prior.nc", d / "metrics", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_reference_note_on_default_data():
    note = sections._reference_note(dict(numbers.REFERENCE_DATA))
    assert not note.warn and "comparable" in note.text and "NOT" not in note.text
    changed = sections._reference_note({**numbers.REFERENCE_DATA, "data.noise": 0.2})
    assert changed.warn and "data.noise = 0.2 (reference 0.3)" in changed.text
    # the networks count too: the same data with another network is not the reference's experiment
    same = sections._reference_note(dict(numbers.REFERENCE_DATA), dict(numbers.REFERENCE_MODEL))
    assert not same.warn and "comparable" in same.text
    narrow = sections._reference_note(dict(numbers.REFERENCE_DATA), {**numbers.REFERENCE_MODEL,
                                                                     "model.hidden_layers": [4]})
    assert narrow.warn and "model.hidden_layers = [4] (reference [5, 5])" in narrow.text
    wide_prior = sections._reference_note(dict(numbers.REFERENCE_DATA), {"model.prior_sd": 2.0})
    assert wide_prior.warn and "model.prior_sd = 2.0 (reference 1.0)" in wide_prior.text
    # traces from before the flat net's prior sd was recorded: not claimed to match
    older = {k: v for k, v in numbers.REFERENCE_MODEL.items() if k != "model.prior_sd"}
    old = sections._reference_note(dict(numbers.REFERENCE_DATA), older)
    assert not old.warn and "model.prior_sd 1.0" not in old.text
    assert "not recorded in the traces, so not compared: model.prior_sd" in old.text


def test_model_settings_come_from_the_traces_and_the_prior_sd_from_the_flat_one():
    settings = {"flat": {"hidden_layers": [4], "bias": True, "likelihood": "bernoulli", "prior_sd": 1.5},
                "hierarchical": {"hidden_layers": [4], "bias": True, "likelihood": "bernoulli"},
                "informed": {"hidden_layers": [4], "bias": True, "likelihood": "bernoulli", "prior_sd": 9.0}}
    assert sections.model_settings(settings) == {"model.hidden_layers": [4], "model.bias": True,
                                                 "model.likelihood": "bernoulli", "model.prior_sd": 1.5}
    assert "model.prior_sd" not in sections.model_settings({"hierarchical": settings["hierarchical"]})
    # only the flat net has an N(0, sd) prior: another model's prior_sd is never taken for it
    unrecorded = {**settings, "flat": {k: v for k, v in settings["flat"].items() if k != "prior_sd"}}
    assert "model.prior_sd" not in sections.model_settings(unrecorded)


@pytest.mark.parametrize("within, expected", [
    (True, "The difference is beyond 2 standard errors at the largest size (all), though not at every smaller one: "
           "the prior matters with every training row these groups have."),
    (False, "The difference is beyond 2 standard errors at every size, the largest (all) included: the prior "
            "matters with every training row these groups have.")])
def test_transfer_reading_where_the_largest_size_is_beyond_two_standard_errors(within, expected):
    def size(mean, rows):
        return {"difference": {"mean": mean, "se": 0.01}, "rows_mean": rows}

    sizes = {"n2": size(0.005 if within else 0.05, 2), "n8": size(0.05, 8), "all": size(0.03, 50)}
    text = transfer_section._transfer_reading(sizes, None)
    assert text.endswith(expected)
    # without an all-rows fit, the largest size is not every row the groups have
    sizes = {"n2": size(0.05, 2), "n8": size(0.05, 8)}
    assert "every training row" not in transfer_section._transfer_reading(sizes, None)
    # one test row: no standard error, and stops_mattering cannot call it within; the reading does not call it beyond
    lone = {"n2": size(0.05, 2), "all": {"difference": {"mean": 0.2, "se": float("nan")}, "rows_mean": 50}}
    assert transfer.stops_mattering({k: v["difference"] for k, v in lone.items()}) is None
    text = transfer_section._transfer_reading(lone, None)
    assert "beyond 2 standard errors at the largest" not in text and "no standard error to judge it by" in text


def test_advi_loss_curve_and_csv(run):
    """Only the ADVI-fitted model has a loss curve: block means of its 1200 iterations."""
    with open(run["dir"] / "reports" / "plots" / "advi_loss.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 400  # 1200 iterations in blocks of 3 (at most 500 points)
    assert {r["flat"] for r in rows} == {""} and {r["informed"] for r in rows} == {""}
    first = float(rows[0]["hierarchical"])
    assert first == pytest.approx(np.mean(1000.0 / np.arange(1.0, 4.0)), rel=1e-6)
    assert [int(r["iteration"]) for r in rows[:2]] == [3, 6]
    assert (run["dir"] / "reports" / "figures" / "advi_loss.png").is_file()
    assert "ADVI loss" in (run["dir"] / "reports" / "report.md").read_text()


def test_plots_csvs_without_values_keep_one_empty_row():
    """Without ADVI (or class probabilities) a plots CSV has one row whose values are empty: with a header only,
    DVC's plots page shows "Invalid specification {}" in that plot's place."""
    assert outputs.loss_csv({}) == "iteration,flat,hierarchical,informed\n0,,,\n"
    assert outputs.calibration_csv({}) == "bin,flat,hierarchical,informed\n0.5,,,\n"
    assert outputs.per_group_csv({}, []) == "group,flat,hierarchical,informed\n,,,\n"


def test_the_report_opens_with_whether_the_inference_can_be_trusted(run):
    """The synthetic metrics carry no per-group verdict, so every group is listed as missing the bar."""
    text = (run["dir"] / "reports" / "report.md").read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[:2] == ["Status: can the inference be trusted?", "Contents"]
    first = text.split("## ")[1]
    assert "NOT CONVERGED" in first and f"| Flat | NO | 0/{N_GROUPS} |" in first
    html = (run["dir"] / "reports" / "report.html").read_text()
    status = html.index('<section id="status" class="status fail">')
    assert status < html.index("<figure>") and status < html.index('<nav class="toc">')
    ids = re.findall(r'<section id="([^"]+)"', html)
    assert re.findall(r'<li><a href="#([^"]+)">', html) == ids and len(set(ids)) == len(ids)


def test_status_is_green_when_every_model_converged():
    names = ["a", "b"]
    good = {"per_group": {g: {"converged": True, "rhat_fn": 1.0, "ess_bulk_fn": 900.0} for g in names},
            "sampling": {"max_rhat_fn": 1.0, "min_ess_bulk_fn": 900.0, "divergences": 0}}
    metrics = {v: good for v in numbers.MODELS}
    sec = report_status._status_section(metrics, names, ["sd_in"])
    assert sec.failing is False and sec.anchor == "status" and sec.blocks[0].text.startswith("CONVERGED")
    bad = {**good, "per_group": {**good["per_group"], "b": {"converged": False, "rhat_fn": 1.03, "ess_bulk_fn": 97.0,
                                                           "divergences": 2}}}
    sec = report_status._status_section({**metrics, "informed": bad}, names, ["sd_in"])
    assert sec.failing is True and sec.blocks[1].rows[2][6] == "b"
    # the groups missing the bar, with their numbers, in a table of their own under the status table
    assert sec.blocks[2].text == "Groups missing the bar"
    assert sec.blocks[3].header == ["Model", "Group", "R-hat (fn)", "Bulk ESS (fn)", "Divergences"]
    assert sec.blocks[3].rows == [["Informed prior", "b", "1.030", "97", "2"]]


def test_a_failing_status_lists_its_groups_in_a_compact_table():
    names = [f"g{i:02d}" for i in range(40)]
    bad = {"per_group": {g: {"converged": False, "rhat_fn": 1.02, "ess_bulk_fn": 150.0, "divergences": 0}
                         for g in names},
           "sampling": {"max_rhat_fn": 1.02, "min_ess_bulk_fn": 150.0, "divergences": 0}}
    sec = report_status._status_section({v: bad for v in numbers.MODELS}, names, [])
    assert sec.blocks[1].rows[0][6] == "g00, g01, g02, g03, g04, g05 and 34 more"
    table = sec.blocks[3]
    assert len(table.rows) == report_status.MISSING_ROWS and table.rows[0] == ["Flat", "g00", "1.020", "150", "0"]
    assert sec.blocks[4].text.startswith(f"... and {3 * 40 - report_status.MISSING_ROWS} more")
    assert max(len(cell) for row in sec.blocks[1].rows for cell in row) < 50  # the status table stays narrow


def test_status_lists_the_chains_started_again_with_their_reason():
    names = ["a", "b"]
    good = {"per_group": {g: {"converged": True, "rhat_fn": 1.0, "ess_bulk_fn": 900.0} for g in names},
            "sampling": {"max_rhat_fn": 1.0, "min_ess_bulk_fn": 900.0, "divergences": 0}}
    restarted = {**good, "sampling": {**good["sampling"], "restarts": 1, "restarted": [
        {"reason": "87 divergences in the first 500 draws per chain", "restarted_from_chain": 1,
         "draws_per_chain": 500, "leapfrog_steps": 1532869, "chains": []}]}}
    sec = report_status._status_section({**{v: good for v in numbers.MODELS}, "hierarchical": restarted}, names,
                                   ["sd_in"])
    (para,) = [b for b in sec.blocks if getattr(b, "text", "").startswith("Chains started again")]
    none = {**good, "sampling": {**good["sampling"], "restarts": 0}}
    sec0 = report_status._status_section({**{v: good for v in numbers.MODELS}, "hierarchical": none}, names, ["sd_in"])
    assert any(getattr(b, "text", "").startswith("No chains were started again") for b in sec0.blocks)
    assert sec.failing is False  # a restart is not a miss: the new chains are judged like any others
    assert ("Hierarchical, after 500 draws per chain: 87 divergences in the first 500 draws per chain; started again "
            "from chain 1's draws (the attempt left behind: 1,532,869 gradient evaluations to that look)"
            ) in para.text


def test_status_judges_advi_fits_by_their_loss_not_by_r_hat():
    names = [f"g{i}" for i in range(20)]
    good = {"per_group": {g: {"converged": True, "rhat_fn": 1.0, "ess_bulk_fn": 900.0} for g in names},
            "sampling": {"max_rhat_fn": 1.0, "min_ess_bulk_fn": 900.0, "divergences": 0}}
    settled = {"drop": 0.0001, "z": 0.3, "still_falling": False}
    advi = {"per_group": {g: {"converged": True, "rhat_fn": 1.016, "ess_bulk_fn": 480.0, "advi_loss": settled}
                          for g in names},
            "sampling": {"max_rhat_fn": 1.016, "min_ess_bulk_fn": 480.0, "divergences": 0, "advi_still_falling": 0,
                         "group_sd": {"sd_in": {"rhat": 1.02, "ess_bulk": 900.0}}}}
    metrics = {"flat": advi, "hierarchical": advi, "informed": good}
    sec = report_status._status_section(metrics, names, ["sd_in"])
    assert sec.failing is False and sec.blocks[0].text.startswith("CONVERGED")  # R-hat 1.016 is not a failure
    assert sec.blocks[1].rows[0][0] == "Flat (ADVI)" and sec.blocks[1].rows[0][3] == "1.016 (not judged)"
    assert "Fitted with ADVI: Flat, Hierarchical" in sec.blocks[2].text
    falling = {"drop": 0.02, "z": 8.06, "still_falling": True}
    joint = {"per_group": {g: {**advi["per_group"][g], "converged": False, "advi_loss": falling} for g in names},
             "sampling": {**advi["sampling"], "advi_still_falling": 1}}
    sec = report_status._status_section({**metrics, "hierarchical": joint}, names, ["sd_in"])
    cell = sec.blocks[1].rows[1][6]
    assert sec.failing is True and cell == ("all 20 (one joint fit, its loss still falling: 2.0% over the last "
                                            "quarter of the iterations, 8.1 standard errors)")
    assert ("sample longer or with more chains (NUTS), or, for ADVI, run more iterations (advi.iterations) where the "
            "loss was still falling or draw more (draws) where only the ESS misses," in sec.blocks[0].text)
    sec = report_status._status_section({**metrics, "hierarchical": joint, "informed": advi}, names, ["sd_in"])
    # every model ADVI: the remedy names both of its causes (a loss still falling; too few draws for the ESS)
    assert ("diagnostics; run more ADVI iterations (advi.iterations) where the loss was still falling, or draw more "
            "from the approximation (draws) where only the ESS misses, before relying" in sec.blocks[0].text)
    one = {**advi, "per_group": {**advi["per_group"], "g3": {**advi["per_group"]["g3"], "converged": False,
                                                              "advi_loss": falling}},
           "sampling": {**advi["sampling"], "advi_still_falling": 1}}
    sec = report_status._status_section({**metrics, "flat": one}, names, ["sd_in"])
    assert sec.blocks[1].rows[0][6] == "g3"
    (table,) = [b for b in sec.blocks if getattr(b, "header", None) and b.header[1] == "Group"]
    assert table.rows == [["Flat", "g3", "1.016 (not judged)", "480", "n/a",
                           "loss still falling: 2.0% over the last quarter of the iterations, 8.1 standard errors"]]


def test_transfer_status_names_why_the_hierarchical_fit_misses_the_bar():
    refits = {m: {"fits_not_converged": 0, "fits": 60} for m in ("flat", "informed")}

    def status(**hier):
        h = {"groups_not_converged": 0, "max_rhat": 1.004, "min_ess_bulk": 900.0, **hier}
        return report_status._transfer_status({"training_groups": [f"g{i}" for i in range(990)],
                                          "sampling": {"hierarchical": h, **refits}})

    assert status() == ("Transfer experiment (Transfer to new groups): the hierarchical fit of the 990 training "
                        "groups meets the bar; refits of the held-out groups meeting it: 60/60 flat, 60/60 informed.",
                        False)
    text, failing = status(groups_not_converged=2, max_rhat=1.02)
    assert failing and "MISSES it (2 groups missing it; max R-hat 1.020, min ESS 900, group sds included)" in text
    # every group meets it, a group sd does not: the line says which, with its numbers
    text, failing = status(max_rhat=1.008, min_ess_bulk=290.0, group_sd={
        "sd_in": {"rhat": 1.008, "ess_bulk": 290.0}, "sd_out": {"rhat": 1.002, "ess_bulk": 1900.0}})
    assert failing and ("MISSES it (0 groups missing it; group sds missing it: sd_in (R-hat 1.008, ESS 290); max "
                        "R-hat 1.008, min ESS 290, group sds included)") in text
    text, failing = status(groups_not_converged=990, max_rhat=1.015, advi_still_falling=1)
    assert failing and "ADVI: its loss was still falling, so every group misses: 990 groups;" in text
    assert "R-hat" not in text
    assert status(max_rhat=1.015, advi_still_falling=0)[1] is False  # ADVI's R-hat is not judged
    one = report_status._transfer_status({"training_groups": ["g1"], "sampling": {
        "hierarchical": {"groups_not_converged": 1, "max_rhat": 1.02, "min_ess_bulk": 90.0}, **refits}})[0]
    assert "the hierarchical fit of the 1 training group MISSES it (1 group missing it; max R-hat" in one
    # the hierarchical refits (transfer_refit) are counted with the others, and one that misses fails the box
    good = {"groups_not_converged": 0, "max_rhat": 1.004, "min_ess_bulk": 900.0}
    for missed, failing in ((0, False), (1, True)):
        text, bad = report_status._transfer_status({"training_groups": ["g1", "g2"], "sampling": {
            "hierarchical": good, **refits, "hier_refit": {"fits_not_converged": missed, "fits": 6}}})
        assert bad is failing and f"60/60 informed, {6 - missed}/6 hierarchical." in text


def test_status_remedy_names_the_settings_that_say_how_long_and_a_fit_stopped_at_its_limit():
    names = ["a", "b"]
    good = {"per_group": {g: {"converged": True, "rhat_fn": 1.0, "ess_bulk_fn": 900.0} for g in names},
            "sampling": {"max_rhat_fn": 1.0, "min_ess_bulk_fn": 900.0, "divergences": 0}}
    short = {"converged": False, "rhat_fn": 1.012, "ess_bulk_fn": 304.0}
    bad = {**good, "per_group": {**good["per_group"], "a": short}}
    settings = {"flat": {"sampler": {"backend": "nutpie", "draws": 1000, "max_draws": 4000}},
                "hierarchical": {"sampler": {"backend": "nutpie", "draws": 300, "max_draws": 1200}},
                "informed": {"sampler": {"backend": "nutpie", "draws": 1000, "max_draws": 0}}}
    drawn = {"flat": 1000, "hierarchical": 1200, "informed": 1000}
    metrics = {v: good for v in numbers.MODELS}

    def verdict(changed: dict, drawn: dict = drawn, sets: dict = settings) -> str:
        return report_status._status_section({**metrics, **changed}, names, ["sd_in"], None, sets, drawn).blocks[0].text

    assert ("diagnostics; the Hierarchical fit stopped at 1200 draws per chain (hier_sampler.max_draws=1200): sample "
            "longer (raise hier_sampler.max_draws) or with more chains before relying"
            ) in verdict({"hierarchical": bad})
    # its looks go in steps of 100 (nutpie): with draws 150 and max_draws 300 the last look is at 250
    odd = {**settings, "hierarchical": {"sampler": {"backend": "nutpie", "draws": 150, "max_draws": 300}}}
    assert "the Hierarchical fit stopped at 250 draws per chain (hier_sampler.max_draws=300)" in verdict(
        {"hierarchical": bad}, {**drawn, "hierarchical": 250}, odd)
    assert ("diagnostics; sample longer (raise sampler.max_draws and sampler.draws) or with more chains before"
            in verdict({"flat": bad, "informed": bad}))
    # R-hat and ESS met, divergences not: more draws would not help, target_accept might
    diverged = {**good, "per_group": {g: {**good["per_group"][g], "converged": False} for g in names},
                "sampling": {**good["sampling"], "divergences": 9}}
    text = verdict({"hierarchical": diverged}, {**drawn, "hierarchical": 300})
    assert ("diagnostics; where only divergences miss the bar, raise hier_sampler.target_accept (more draws do not "
            "remove them) before relying") in text and "max_draws" not in text
    # a per-group fit fitted again at refit_target_accept where it diverged: that is the key to raise
    refit = {**settings, "informed": {"sampler": {"backend": "nutpie", "draws": 1000, "target_accept": 0.9,
                                                  "refit_target_accept": 0.97}}}
    assert "where only divergences miss the bar, raise sampler.refit_target_accept (more draws" in verdict(
        {"informed": diverged}, drawn, refit)
    assert "raise sampler.target_accept (more draws" in verdict({"informed": diverged})  # no refit: target_accept
    # a group sd short of the bar is a length problem of the hierarchical fit
    sds = {**good, "sampling": {**good["sampling"], "group_sd": {"sd_in": {"rhat": 1.003, "ess_bulk": 290.0}}}}
    assert "stopped at 1200 draws per chain (hier_sampler.max_draws=1200): sample longer (raise hier_sampler" \
        in verdict({"hierarchical": sds})


def test_intro_states_each_fits_inference_as_run():
    """NUTS fits state chains, draws and tuning; ADVI fits their optimisation (ADVI has no tuning)."""
    from dataclasses import asdict

    from hbnn.config import SamplerParams

    nuts = asdict(SamplerParams(backend="numpyro", chains=2, tune=1000, draws=3000))
    assert sections._run_description(nuts) == "2 chains x 3000 draws (1000 tuning, backend numpyro)"
    blocks = asdict(SamplerParams(backend="numpyro", chains=2, tune=1000, draws=1000, max_draws=5000))
    assert sections._run_description(blocks, 2000) == (
        "2 chains x 2000 draws (1000 tuning, backend numpyro; drawn in blocks of 1000 until every group met the "
        "convergence bar or 5000 were drawn)")
    looks = dict(blocks, backend="nutpie", draws=500)
    assert sections._run_description(looks, 1700) == (
        "2 chains x 1700 draws (1000 tuning, backend nutpie; checked after 500 draws, then where the smallest ESS "
        "extrapolated to the bar (at most 20% of the draws so far further), until every group met the convergence "
        "bar or 5000 were drawn)")
    assert sections._run_description(dict(looks, restarts=2), 1700).endswith(
        "or 5000 were drawn; chains found at a check to have gone wrong (divergences, or "
        "stuck where the log density is lower) start again from the best chain's draws, at most 2 times; the status "
        "section lists any that did)")
    per_group = asdict(SamplerParams(chains=2, tune=300, draws=1000, max_draws=4000))
    assert sections._run_description(per_group, 1000, joint=False) == (
        "2 chains x 1000 draws (300 tuning, backend nutpie; a group whose draws missed the convergence bar is "
        "fitted again with up to 4000 draws per chain and thinned to 1000)")
    refits = asdict(SamplerParams(chains=2, tune=300, draws=1000, max_draws=4000, refit_target_accept=0.97))
    assert sections._run_description(refits, 1000, joint=False) == (
        "2 chains x 1000 draws (300 tuning, backend nutpie; a group whose draws missed the convergence bar is "
        "fitted again with up to 4000 draws per chain and thinned to 1000; a group whose transitions diverged past "
        "the bar is fitted again at target_accept 0.97)")
    advi = asdict(SamplerParams(backend="advi", draws=500))
    advi["advi"]["minibatch_size"] = 500
    assert sections._run_description(advi) == (
        f"mean-field ADVI, {advi['advi']['iterations']} Adam steps (learning rate {advi['advi']['learning_rate']}, "
        f"minibatches of 500 rows), then {advi['chains']} x 500 draws from the approximation")


def test_comparison_section_and_figures_are_in_the_report(run):
    text = (run["dir"] / "reports" / "report.md").read_text()
    assert "## Model comparison (PSIS-LOO)" in text and "figures/compare.png" in text
    for name in ("rhat_fn.png", "ess_fn.png", "rank_group_sd.png", "compare.png"):
        assert (run["dir"] / "reports" / "figures" / name).is_file()
    for name in ("compare.png", "group_sd.png"):  # dvc plots images, kept in git
        plot = (run["dir"] / "reports" / "plots" / name).read_bytes()
        assert plot[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(plot[16:20], "big") <= 1000


def test_figures_are_drawn_for_reading(run):
    """150 dpi PNGs, shown one figure inch per CSS inch and no wider than the page, so 9 pt text stays 9 pt."""
    html = (run["dir"] / "reports" / "report.html").read_text()
    widths = [int(w) for w in re.findall(r'style="width: (\d+)px"', html)]
    assert widths and max(widths) <= plots.MAX_WIDTH_IN * 96 + 1
    assert plots.DPI >= 150 and plots.SMALL >= 9


def test_surface_pages_past_embedded_pages_are_linked_files_not_embedded():
    from hbnn.report.document import Figure, FigureLinks, Section, render_html, render_markdown

    png = plots.png_bytes(plots.plot_message("x")[0])
    files = {v: [f"surface_{v}_p{i:02d}.png" for i in range(1, 6)] for v in numbers.MODELS}
    used = dict.fromkeys(numbers.MODELS, 10)
    blocks = sections._page_blocks(files, used, "surface", "P(y=1)", embedded=2)
    figures = [b for b in blocks if isinstance(b, Figure)]
    links = [b for b in blocks if isinstance(b, FigureLinks)]
    assert len(figures) == 2 * len(numbers.MODELS) and len(links) == len(numbers.MODELS)
    assert links[0].names == files[numbers.MODELS[0]][2:] and links[0].labels == ["3", "4", "5"]
    assert len([b for b in sections._page_blocks(files, used, "surface", "P", embedded=0)
                if isinstance(b, Figure)]) == 5 * len(numbers.MODELS)
    page = render_html("t", [], [Section("s", "h", blocks)], {f.name: png for f in figures})
    assert page.count("data:image/png") == len(figures)
    first_linked = files[numbers.MODELS[0]][2]
    assert f'<a href="figures/{first_linked}">3</a>' in page
    assert f"[3](figures/{first_linked})" in render_markdown("t", [], [Section("s", "h", blocks)])


def test_report_wording_follows_the_likelihood():
    from hbnn.model import likelihoods

    for name, words in (("bernoulli", "predicted test probabilities"), ("gaussian", "predicted test means"),
                        ("poisson", "predicted test rates")):
        text = report_status._diagnostics_section({v: {} for v in numbers.MODELS}, ["g0"], [], [], None,
                                             likelihoods.LIKELIHOODS[name]).how_to_read
        assert f"on the {words} of each group" in text
    # the transfer's row subsets are stratified by label for a classifier only (hbnn.pipeline.transfer.nested_order)
    bernoulli, gaussian = likelihoods.LIKELIHOODS["bernoulli"], likelihoods.LIKELIHOODS["gaussian"]
    assert "rows, stratified by label, and all" in transfer_section._transfer_section(None, bernoulli).how_to_read
    assert "stratified" not in transfer_section._transfer_section(None, gaussian).how_to_read


def test_a_linear_models_weight_correlations_name_the_output_not_hidden_units():
    prior = {"alignment": {}}
    net = sections._correlation_section("in", "corr.png", 0, prior)
    linear = sections._correlation_section("out", "corr.png", 0, prior, hidden=False)
    assert "feature->hidden unit" in net.how_to_read and "label the hidden units" in net.how_to_read
    assert "->output" in linear.how_to_read and "hidden" not in linear.how_to_read
    assert "(or bias)" not in linear.how_to_read  # no bias row: model.bias false
    assert "feature (or bias)->output" in sections._correlation_section("out", "c.png", 0, prior, hidden=False,
                                                                       bias=True).how_to_read


def test_plot_templates_leave_out_empty_cells():
    """An empty cell of a plots CSV (a calibration bin without test rows, the row of a plot with nothing to show)
    reaches Vega-Lite as "", which a quantitative scale draws at 0: a point or bar no model predicted. The custom
    templates filter those cells out."""
    from pathlib import Path

    plots_dir = Path(__file__).parents[1] / ".dvc" / "plots"
    empty_out = {"filter": {"not": {"field": "<DVC_METRIC_Y>", "equal": ""}}}
    template = json.loads((plots_dir / "calibration_models.json").read_text())
    data_layer = next(layer for layer in template["layer"] if layer["data"]["values"] == "<DVC_METRIC_DATA>")
    assert empty_out in data_layer["transform"] and data_layer["encoding"]["y"]["field"] == "<DVC_METRIC_Y>"
    template = json.loads((plots_dir / "per_group_bars.json").read_text())
    assert empty_out in template["transform"] and template["encoding"]["x"]["field"] == "<DVC_METRIC_Y>"
    # ADVI loss with a model fitted by NUTS beside ADVI ones: its empty column was a line at loss 0 (DVC's linear
    # template draws "" as 0), which also pulled the axis down to 0
    template = json.loads((plots_dir / "advi_loss_models.json").read_text())
    assert empty_out in template["transform"] and template["encoding"]["y"]["field"] == "<DVC_METRIC_Y>"
    import yaml

    dvc = yaml.safe_load((Path(__file__).parents[1] / "dvc.yaml").read_text())
    # the plots page shows only charts with data: the ADVI loss, empty on a NUTS run, is the report's (and a
    # `dvc plots show ... --template advi_loss_models` away)
    assert not any(isinstance(p, dict) and "advi_loss" in p for p in dvc["plots"])
    # every line has a legend entry: the population's dashed rule is coloured by model like the refits' lines
    template = json.loads((plots_dir / "transfer_models.json").read_text())
    rule, lines = template["layer"]
    assert rule["mark"]["type"] == "rule" and "color" not in rule["mark"]
    for layer in (rule, lines):
        assert layer["encoding"]["color"]["field"] == "model"
        assert layer["encoding"]["color"]["scale"]["domain"] == ["flat", "informed", "hier_refit", "population"]


def test_transfer_sizes_that_pool_different_groups_are_flagged():
    """Groups of unequal sizes: a larger size is fitted on fewer held-out groups, so a change of score from one size
    to the next is partly a change of groups (found on a table with 8- to 60-row groups)."""
    from hbnn.pipeline.transfer import groups_by_size

    fits = {name: {} for name in ("A/n2", "A/all", "F/n2", "F/n16", "F/all", "C/n2", "C/all")}
    by_size = groups_by_size(fits)
    assert by_size == {"n2": ["A", "F", "C"], "n16": ["F"], "all": ["A", "F", "C"]}
    text = transfer_section._uneven_groups(by_size)
    assert "scored on different held-out groups" in text and "n16: F;" in text and "and at all" in text
    # transfer.all_rows false
    assert "and at all" not in transfer_section._uneven_groups({"n2": ["A", "B"], "n16": ["B"]})
    many = transfer_section._uneven_groups({"n2": [f"G{i}" for i in range(25)], "n16": ["G1"]})
    assert "G9 and 15 more" in many and "G10" not in many
    assert transfer_section._uneven_groups(groups_by_size({"A/n2": {}, "A/all": {}, "B/n2": {}, "B/all": {}})) == ""
    # the figure writes each size's group count under its tick where they differ
    series = {m: {"score": [0.7, 0.8, 0.9], "log_loss": [0.5, 0.4, 0.3], "lpd_se": [0.1] * 3}
              for m in ("flat", "informed")}
    diff = {"informed - flat": [{"mean": 0.1, "se": 0.05}] * 3}
    fig, axes = metric_plots.plot_transfer([2, 16, 30], ["n2", "n16", "all"], "accuracy", series,
                                    {"score": 0.5, "log_loss": 0.7}, diff, [3, 1, 3])
    ticks = [t.get_text() for t in axes[0].get_xticklabels()]
    assert ticks == ["2\n3 groups", "16\n1 group", "all\n(mean 30)\n3 groups"]
    fig, axes = metric_plots.plot_transfer([2, 16, 30], ["n2", "n16", "all"], "accuracy", series,
                                    {"score": 0.5, "log_loss": 0.7}, diff, [3, 3, 3])
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["2", "16", "all\n(mean 30)"]


def test_transfer_reading_where_only_the_last_size_stops_mattering():
    """stops_mattering == the last size ("all"): "From all on ... at every larger size" read as if there were one."""
    sizes = {"n2": {"difference": {"mean": 0.2, "se": 0.05}, "rows_mean": 2},
             "all": {"difference": {"mean": 0.01, "se": 0.05}, "rows_mean": 30}}
    text = transfer_section._transfer_reading(sizes, "all")
    assert "At the largest size (all) the difference is within 2 standard errors; at n2 it is not." in text
    assert "every larger size" not in text
    # a smaller size within, the one before the last beyond: the sentence must not say "only at the largest"
    within_beyond = {"n2": {"difference": {"mean": 0.0, "se": 0.05}, "rows_mean": 2},
                     "n8": {"difference": {"mean": 0.3, "se": 0.05}, "rows_mean": 8},
                     "all": {"difference": {"mean": 0.0, "se": 0.05}, "rows_mean": 30}}
    text = transfer_section._transfer_reading(within_beyond, "all")
    assert "within 2 standard errors at n2 (+0.000, se 0.050), all" in text and "at n8 it is not" in text
    sizes["n8"] = {"difference": {"mean": 0.0, "se": 0.05}, "rows_mean": 8}
    ordered = {k: sizes[k] for k in ("n2", "n8", "all")}
    assert "From n8 on the difference stays within" in transfer_section._transfer_reading(ordered, "n8")


def test_a_transfer_hierarchy_of_few_groups_is_cautioned():
    """A 6-group table with transfer.min_holdout 4 fits the transfer hierarchy on 2 groups: its group sds rest
    mostly on their prior, which the section says (it did only for 1 group)."""
    from pathlib import Path

    from hbnn.model import likelihoods

    tm = json.loads((Path(__file__).parents[1] / "metrics" / "detail" / "transfer.json").read_text())
    bernoulli = likelihoods.LIKELIHOODS["bernoulli"]

    def text(n):
        section = transfer_section._transfer_section({**tm, "training_groups": tm["training_groups"][:n]}, bernoulli)
        return " ".join(b.text for b in section.blocks if isinstance(b, sections.Para))

    assert "With 2 groups to fit, the hierarchy can tell little" in text(2)
    assert "fewer held out: transfer.min_holdout, transfer.holdout_fraction" in text(2)  # 8 groups: 7 could be fitted
    assert "With one group to fit" in text(1)
    assert "groups to fit" not in text(12)
    # 4 groups in all: at most 3 can be fitted, so holding fewer out cannot reach 4
    few = transfer_section._transfer_section({**tm, "training_groups": tm["training_groups"][:2],
                                      "heldout_groups": tm["heldout_groups"][:2]}, bernoulli)
    words = " ".join(b.text for b in few.blocks if isinstance(b, sections.Para))
    assert "With 2 groups to fit" in words and "fewer held out" not in words


def test_the_advi_loss_axis_is_labelled_within_one_decade():
    """A loss between ~150 and ~700 on a symlog axis had no labelled tick: no power of ten lies in the range."""
    it = np.arange(1, 101)
    fig, ax = metric_plots.plot_loss({"flat": (it, 150 + 550 * np.exp(-it / 20.0))})
    fig.canvas.draw()
    assert ax.get_yscale() == "linear" and [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    fig, ax = metric_plots.plot_loss({"flat": (it, 1e5 * np.exp(-it / 10.0) + 100)})
    assert ax.get_yscale() == "log"  # falling by orders of magnitude


def test_sampler_diagnostics_mark_advi_fits_as_the_status_does():
    """The status section says an ADVI fit's R-hat is not judged and its divergences n/a; the diagnostics section
    showed 'Divergences 0' and counted its groups past the R-hat bar."""
    from hbnn.model import likelihoods

    advi = {"sampling": {"advi_still_falling": 0, "divergences": 0, "max_rhat_fn": 1.03, "min_ess_bulk_fn": 390.0},
            "per_group": {"g0": {"rhat_fn": 1.03}}}
    nuts = {"sampling": {"divergences": 2, "max_rhat_fn": 1.02, "min_ess_bulk_fn": 500.0},
            "per_group": {"g0": {"rhat_fn": 1.02}}}
    sec = report_status._diagnostics_section({"flat": advi, "hierarchical": nuts, "informed": nuts}, ["g0"], [], [],
                                             None, likelihoods.LIKELIHOODS["bernoulli"])
    table = sec.blocks[0]
    div, rhat = table.header.index("Divergences"), table.header.index("Max R-hat (fn)")
    assert table.rows[0][0] == "Flat (ADVI)" and table.rows[0][div] == "n/a" and table.rows[0][rhat].endswith(
        "(not judged)")
    assert table.rows[1][div] == "2" and "not judged" not in table.rows[1][rhat]
    assert not [h for h in table.header if h.endswith(" s")]  # no wall-clock column: the same fits, the same report
    assert sec.blocks[1].text == "Groups with function-space R-hat above 1.01: Hierarchical 1/1, Informed prior 1/1."


def test_status_says_which_groups_were_fitted_again_at_a_higher_target_accept():
    names = ["a", "b"]
    good = {"per_group": {g: {"converged": True, "rhat_fn": 1.0, "ess_bulk_fn": 900.0, "divergences": 0}
                          for g in names},
            "sampling": {"max_rhat_fn": 1.0, "min_ess_bulk_fn": 900.0, "divergences": 0}}
    raised = {"b": {"target_accept": 0.97, "draws_per_chain": 1000, "divergences": 0, "transitions": 2000,
                    "missed": {"draws_per_chain": 1000, "divergences": 3, "transitions": 2000}}}
    settings = {v: {"sampler": {"backend": "nutpie", "draws": 1000}} for v in numbers.MODELS}
    drawn = {v: 1000 for v in numbers.MODELS}

    def text(metrics):
        section = report_status._status_section(metrics, names, [], None, settings, drawn)
        return " ".join(getattr(b, "text", "") for b in section.blocks)

    metrics = {v: good for v in numbers.MODELS}
    assert "higher target_accept" not in text(metrics)
    metrics["informed"] = {**good, "sampling": {**good["sampling"], "target_accept_raised": raised}}
    assert ("Fitted again at a higher target_accept (sampler.refit_target_accept: a group whose transitions diverged "
            "more often than the bar allows was fitted again from its seed with smaller steps): Informed prior, group "
            "b: 3 divergences in 2000 transitions, then 0 in 2000 at target_accept 0.97."
            ) in text(metrics)


def test_prose_columns_of_a_table_are_left_aligned_and_numbers_right():
    from hbnn.report.document import Section, Table, render_html, render_markdown

    section = [Section("T", "h", [Table(["model", "how", "n"], [["flat", "two words", "3"]], text_columns=(1,))])]
    html = render_html("t", [], section, {})
    assert '<th style="text-align: left">how</th>' in html and '<td style="text-align: left">two words</td>' in html
    assert "<td>3</td>" in html
    assert "|---|---|---:|" in render_markdown("t", [], section)


def test_a_group_named_like_the_joint_advi_sentence_still_gets_its_row():
    """Whether a model's groups are one joint ADVI fit is read from its metrics, not from the status cell's text:
    a failing group called "all sites" is listed with its numbers."""
    names = ["all sites", "b"]
    good = {"per_group": {g: {"converged": True, "rhat_fn": 1.0, "ess_bulk_fn": 900.0} for g in names},
            "sampling": {"max_rhat_fn": 1.0, "min_ess_bulk_fn": 900.0, "divergences": 0}}
    bad = {**good, "per_group": {**good["per_group"], "all sites": {"converged": False, "rhat_fn": 1.05,
                                                                    "ess_bulk_fn": 80.0, "divergences": 0}}}
    sec = report_status._status_section({**{v: good for v in numbers.MODELS}, "flat": bad}, names, [])
    assert sec.blocks[1].rows[0][6] == "all sites"
    assert sec.blocks[3].rows == [["Flat", "all sites", "1.050", "80", "0"]]
