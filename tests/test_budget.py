"""The budget's estimates against what the stages measurably use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hbnn.config import ConfigError
from hbnn.config_read import parse_params
from hbnn.pipeline.budget import fit_estimate

ROOT = Path(__file__).resolve().parents[1]
PEAKS = ROOT / "benchmarks" / "memory_peaks.json"  # written by `python -m benchmarks.memory`


def _table_params(sampler: dict) -> dict:
    return {"data": {"source": "table", "path": "table.csv", "features": ["x1", "x2"], "label": "y", "group": "g",
                     "split": "split"}, "hier_sampler": sampler}


@pytest.mark.parametrize("run", json.loads(PEAKS.read_text())["runs"], ids=lambda r: f"{r['padded_rows']}rows")
def test_the_hierarchical_fits_memory_estimate_covers_its_measured_peak_within_2x(run):
    """Recorded peaks of fit_hier (density check included) on tables of many small groups and one large one, whose
    padded layout dominates, and of thousands of tiny groups, whose chains' NUTS states dominate: the estimate is
    never below the peak and at most twice it."""
    recorded = json.loads(PEAKS.read_text())
    params = parse_params(_table_params(recorded["sampler"]))
    n_test = run["rows_small"] * (run["groups"] - 1) + run["rows_large"] - run["train_rows"]
    estimate = fit_estimate("fit_hier", params, run["groups"], run["train_rows"], n_test, 2,
                            max_group_rows=(run["rows_large"] + 1) // 2)
    assert run["fit_hier_peak_gib"] <= estimate.memory_gib <= 2 * run["fit_hier_peak_gib"], estimate.describe()


def test_one_large_group_among_many_small_ones_is_refused_before_the_fit_naming_the_padding():
    """2,000 groups of 2 training rows and one of 50,000: the hierarchical layout holds 2,001 x 50,000 rows."""
    from hbnn.pipeline.budget import enforce

    tiny = {"tune": 10, "draws": 10, "max_draws": 0, "restarts": 0}
    params = parse_params({**_table_params(tiny), "limits": {"max_memory_gib": 16}})
    n_train = 2000 * 2 + 50_000
    estimate = fit_estimate("fit_hier", params, 2001, n_train, n_train, 2, max_group_rows=50_000)
    with pytest.raises(ConfigError, match=r"padded to the largest's 50000 rows: 100050000 rows held"):
        enforce(estimate, params)
    even = fit_estimate("fit_hier", params, 2001, n_train, n_train, 2)  # the same rows spread evenly: no padding
    assert even.memory_gib < 2 and "padded" not in even.describe()


def test_a_huge_max_draws_is_estimated_at_once():
    """The per-group refits were summed one multiple of draws at a time: max_draws 1e12 took minutes to refuse."""
    import time

    params = parse_params({"sampler": {"draws": 25, "max_draws": 10**12}})
    start = time.perf_counter()
    estimate = fit_estimate("fit_flat", params, 3, 60, 60, 2)
    assert time.perf_counter() - start < 0.1 and estimate.most_minutes > 1e6 and estimate.minutes < 1


def test_a_hierarchical_fit_of_many_tiny_groups_is_not_estimated_low():
    """Measured (nutpie, 2 x (40 + 25) iterations, nutpie's own mass matrix; benchmarks/FINDINGS.md): 20,000 groups
    of 2 training rows, 800,043 sampled coordinates, sampled in 570 s and peaked at 6.51 GiB:
    1.9 GiB of the chains' NUTS states from the first iterations, then the batches of 130 draws of 1.6 million
    values each. The estimate is at least that peak and at most twice it."""
    sampler = {"tune": 40, "draws": 25, "max_draws": 0, "restarts": 0, "mass_matrix": "diag", "target_accept": 0.9}
    params = parse_params({"hier_sampler": sampler})
    estimate = fit_estimate("fit_hier", params, 20_000, 40_000, 40_000, 2, max_group_rows=2)
    assert 570 <= 60 * estimate.minutes <= 2 * 570
    assert 6.51 <= estimate.memory_gib <= 2 * 6.51


def test_a_hierarchical_fit_drawn_on_to_max_draws_is_covered_by_the_most_it_can_take():
    """Measured (nutpie, 2 chains, tune 40, draws 25, max_draws 150, no restart; benchmarks/FINDINGS.md): 3,000 groups
    of 2 training rows, which miss the bar at every look, drew on to 150 draws per chain; the looks' copies of the
    draws so far took the stage to a 2.60 GiB peak. The most the estimate says it can take covers that, within 2x."""
    sampler = {"tune": 40, "draws": 25, "max_draws": 150, "restarts": 0, "mass_matrix": "diag", "target_accept": 0.9}
    estimate = fit_estimate("fit_hier", parse_params({"hier_sampler": sampler}), 3000, 6000, 6000, 2,
                            max_group_rows=2)
    assert 2.60 <= estimate.most_memory_gib <= 2 * 2.60, estimate.describe()


SCALING = json.loads((ROOT / "reports" / "benchmark.json").read_text())["scaling"]  # `make bench`'s measurements


def _moons_params(n_groups: int, **sections) -> object:
    """The committed params.yaml at ``n_groups`` groups, with ``sections`` (whole sections) as a point recorded."""
    import yaml

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    return parse_params({**raw, "n_groups": n_groups, **sections})


@pytest.mark.parametrize(("row", "n"), [(row, n) for row in ("hier_nuts", "hier_nuts_fixed")
                                        for n in sorted(SCALING.get(row, {}), key=int)])
def test_the_hierarchical_nuts_estimate_is_within_2x_of_the_recorded_scaling_points(row, n):
    """The hierarchical fit at the committed hier_sampler, as `make bench` measured it (moons: 50 training and 50 test
    rows a group; ``hier_nuts``: run-length control and restarts on, at 18 to 200 groups; ``hier_nuts_fixed``: of
    fixed length, at 1000): compile + sampling seconds and the stage's peak memory against the typical estimate for
    the settings it ran, within a factor of 2 either way; for ``hier_nuts``, which can draw on or restart, the most it
    can take is above the measured."""
    point = SCALING[row][n]
    if "seconds" not in point:  # failed, or skipped on its estimate: the point says why
        ran = f" (stopped after {point['seconds_run']:.0f} s)" if "seconds_run" in point else ""
        pytest.skip(f"the point at {n} groups was not measured{ran}: {point.get('error', point.get('skipped'))[:200]}")
    groups = int(n)
    estimate = fit_estimate("fit_hier", _moons_params(groups, hier_sampler=point["hier_sampler"]), groups,
                            50 * groups, 50 * groups, 2)
    peak_gib = point["peak_rss_mib"] / 1024
    assert point["seconds"] / 2 <= 60 * estimate.minutes <= 2 * point["seconds"], estimate.describe()
    if row == "hier_nuts":  # a fit that can draw on or restart: the most it can take covers what it took
        assert 60 * estimate.most_minutes >= point["seconds"] and estimate.most_memory_gib >= peak_gib
    assert peak_gib / 2 <= estimate.memory_gib <= 2 * peak_gib, estimate.describe()


@pytest.mark.parametrize("how", ["in_process", "local_cluster_2"])
@pytest.mark.parametrize("stage", ["fit_flat", "fit_informed"])
def test_the_per_group_nuts_estimates_are_within_2x_of_the_recorded_1000_group_fits(stage, how):
    """The per-group fits at the committed sampler on 1000 groups, as `make bench` measured them: the stage process's
    peak memory (on the LocalCluster too, where it gathers every group's draws and scores them) against the typical
    estimate, within a factor of 2 either way; and for the flat fits compile + sampling seconds (in-process: both
    chains on the machine's cores; on the LocalCluster the same cores). (The informed fits there sample under a prior
    from an ADVI posterior, far tighter than the default pipeline's, in 8 steps an iteration against 158: the
    budget's INFORMED_STEPS_FACTOR is the default's, and errs high on their time.)"""
    points = SCALING.get("per_group_nuts", {})
    if not points:
        pytest.skip("no per-group point recorded")
    n, point = next(iter(points.items()))
    fit = point[how][stage.removeprefix("fit_")]
    groups = int(n)
    estimate = fit_estimate(stage, _moons_params(groups), groups, 50 * groups, 50 * groups, 2)
    peak_gib = fit["peak_rss_mib"] / 1024
    assert peak_gib / 2 <= estimate.memory_gib <= 2 * peak_gib, estimate.describe()
    if stage == "fit_flat":
        seconds = fit["sampling_s"] + (fit["compile_s"] or 0)
        assert seconds / 2 <= 60 * estimate.minutes <= 2 * seconds, estimate.describe()


def test_full_batch_and_minibatch_advi_fits_are_estimated_at_the_hand_written_densitys_step_cost():
    """Measured (hbnn.sampling.density_advi, 1000 groups of 50 training rows, 40,043 parameters, on 2 cores): a
    full-batch step 2.2-2.35 ms, a step of 500 rows 0.9 ms. Both estimates are within 2x of the measured steps; a
    model without compiled code is costed at PyTensor's step."""
    full = {"backend": "advi", "draws": 500, "max_draws": 0, "restarts": 0,
            "advi": {"iterations": 10_000, "minibatch_size": 0}}
    estimate = fit_estimate("fit_hier", _moons_params(1000, hier_sampler=full), 1000, 50_000, 50_000, 2)
    assert 22 / 2 <= 60 * estimate.minutes <= 2 * 22, estimate.describe()
    # a model without compiled code (one noise sd per group) is fitted by PyTensor's full-batch step: costed as such
    import yaml

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    model = {**raw["model"], "likelihood": "gaussian", "noise": "group"}
    table = _table_params(full)
    pytensor = fit_estimate("fit_hier", parse_params({**table, "n_groups": 1000, "model": model}), 1000, 50_000,
                            50_000, 2)
    assert pytensor.minutes > 3 * estimate.minutes, pytensor.describe()
    mini = {**full, "advi": {"iterations": 10_000, "minibatch_size": 500}}
    estimate = fit_estimate("fit_hier", _moons_params(1000, hier_sampler=mini), 1000, 50_000, 50_000, 2)
    assert 9 / 2 <= 60 * estimate.minutes <= 2 * 9, estimate.describe()


def test_the_budget_knows_which_models_full_batch_advi_fits_by_the_hand_written_density():
    """budget._hand_written reads the registries itself (the cost-estimating stages must not depend on the density's
    code): the same answers as hbnn.density.densities.unsupported, for every likelihood, activation and noise."""
    from types import SimpleNamespace

    from hbnn.density.densities import unsupported
    from hbnn.model.activations import ACTIVATIONS
    from hbnn.model.likelihoods import LIKELIHOODS
    from hbnn.pipeline.budget import _hand_written

    answers = set()
    for likelihood in LIKELIHOODS:
        for activation in ACTIVATIONS:
            for noise in ("shared", "group"):
                params = SimpleNamespace(model=SimpleNamespace(likelihood=likelihood, activation=activation,
                                                               noise=noise))
                for hierarchical in (False, True):
                    want = unsupported(likelihood, activation, noise if hierarchical else "shared") is None
                    assert _hand_written(params, hierarchical) == want, (likelihood, activation, noise, hierarchical)
                    answers.add(want)
    assert answers == {True, False}
