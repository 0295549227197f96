"""The transfer experiment: held-out groups, nested row subsets, the scores and their reading."""

from __future__ import annotations

import json

import arviz as az
import numpy as np
import pandas as pd
import pytest
from test_stages import pipeline  # noqa: F401 - the module-scoped tiny pipeline fixture

from hbnn.config import TransferParams
from hbnn.config_read import parse_params
from hbnn.data.moons import make_moons_tasks
from hbnn.data.spec import DataSpec
from hbnn.data.tasks import Tasks
from hbnn.files.io import InputError
from hbnn.model import likelihoods
from hbnn.pipeline import transfer


@pytest.mark.parametrize("n_groups, expected", [(18, 6), (12, 4), (30, 10), (5, 3), (3, 1), (2, 1)])
def test_holdout_count_takes_a_third_at_least_four_and_leaves_two(n_groups, expected):
    assert transfer.holdout_count(n_groups, TransferParams()) == expected


def test_one_group_cannot_be_held_out():
    with pytest.raises(InputError, match="at least 2 groups"):
        transfer.holdout_count(1, TransferParams())


def test_holdout_is_seeded_and_in_tasks_order():
    names = [f"g{i:02d}" for i in range(18)]
    a = transfer.holdout(names, TransferParams(seed=3))
    assert a == transfer.holdout(names, TransferParams(seed=3))
    assert a == sorted(a) and len(a) == 6 and set(a) <= set(names)
    assert a != transfer.holdout(names, TransferParams(seed=4))


@pytest.mark.parametrize("seed", range(5))
def test_nested_order_prefixes_are_stratified(seed):
    y = np.array([1] * 30 + [0] * 20)
    order = transfer.nested_order(y, True, np.random.default_rng(seed))
    assert sorted(order) == list(range(50))
    assert set(y[order[:2]]) == {0, 1}
    ones = np.cumsum(y[order])
    for i in range(1, 51):
        assert abs(ones[i - 1] - 0.6 * i) < 1.0 + 1e-9, i  # each prefix as close to 60% ones as whole rows allow


def test_nested_order_without_labels_is_a_seeded_permutation():
    y = np.linspace(0, 1, 20)
    a = transfer.nested_order(y, False, np.random.default_rng(0))
    assert sorted(a) == list(range(20))
    assert (a == transfer.nested_order(y, False, np.random.default_rng(0))).all()


def _tasks(n_groups=5, n_samples=40):
    return Tasks(make_moons_tasks(DataSpec.of(parse_params({"n_groups": n_groups, "data": {"n_samples": n_samples}}))))


def test_refit_tasks_nest_the_rows_and_keep_every_test_row():
    tasks = _tasks()
    t = TransferParams(sizes=(2, 4, 8, 32))
    refit, refits, skipped = transfer.refit_tasks(tasks, ["g01", "g03"], t)
    assert [r.name for r in refits] == [f"{g}/{s}" for g in ("g01", "g03") for s in ("n2", "n4", "n8", "all")]
    assert skipped == ["g01/n32 (20 training rows)", "g03/n32 (20 training rows)"]
    assert refit.group_names == [r.name for r in refits]
    src = refit.ds["source_obs"].values
    split = refit.ds["split"].values
    labels = refit.ds["group"].values
    for g in ("g01", "g03"):
        train_sets = [set(src[(labels == f"{g}/{s}") & (split == "train")]) for s in ("n2", "n4", "n8", "all")]
        assert [len(x) for x in train_sets] == [2, 4, 8, 20]
        assert all(a < b for a, b in zip(train_sets, train_sets[1:], strict=False))  # nested
        own = set(tasks.ds["obs"].values[(tasks.ds["group"].values == g) & (tasks.ds["split"].values == "train")])
        assert train_sets[-1] == own
        tests = {s: tuple(src[(labels == f"{g}/{s}") & (split == "test")]) for s in ("n2", "n4", "n8", "all")}
        assert len(set(tests.values())) == 1 and len(tests["n2"]) == 20
        y2 = refit.ds["y"].values[(labels == f"{g}/n2") & (split == "train")]
        assert sorted(y2) == [0, 1]  # stratified: one of each label
    # rows carry their values; the standardisation statistics are the tasks'
    pos = {int(o): i for i, o in enumerate(tasks.ds["obs"].values)}
    assert np.array_equal(refit.ds["X"].values, tasks.ds["X"].values[[pos[int(o)] for o in src]])
    assert np.array_equal(refit.ds["x_mean"].values, tasks.ds["x_mean"].values)


def test_pooled_tasks_add_the_held_out_groups_rows_at_one_size_to_every_training_row():
    tasks = _tasks()
    t = TransferParams(sizes=(2, 4, 32))
    refit, refits, _ = transfer.refit_tasks(tasks, ["g01", "g03"], t)
    kept = ["g00", "g02", "g04"]
    for size, n_train in (("n4", 4), ("all", 20)):
        pooled, groups = transfer.pooled_tasks(tasks, kept, refit, refits, size)
        assert groups == ["g01", "g03"] and pooled.group_names == [f"g0{i}" for i in range(5)]
        obs, names, split = (pooled.ds[k].values for k in ("obs", "group", "split"))
        labels = refit.ds["group"].values
        for g in kept:  # every row of a training group
            assert set(obs[names == g]) == set(tasks.ds["obs"].values[tasks.ds["group"].values == g])
        for g in groups:  # the held-out group's rows at this size: the flat and informed fits' rows
            same = set(refit.ds["source_obs"].values[labels == f"{g}/{size}"])
            assert set(obs[names == g]) == same
            assert ((names == g) & (split == "train")).sum() == n_train and ((names == g) & (split == "test")).sum()
    assert transfer.pooled_tasks(tasks, kept, refit, refits, "n32")[1] == []  # no group has 32 training rows


def test_refit_rows_are_the_refit_sizes_the_sizes_list():
    assert transfer.refit_rows(TransferParams()) == [2, 4, 8, 16, 32]
    assert transfer.refit_rows(TransferParams(sizes=(2, 3, 8), refit_sizes=(8, 2, 5))) == [2, 8]
    assert transfer.refit_rows(TransferParams(refit_sizes=())) == []


def test_refit_sizes_must_be_positive():
    with pytest.raises(InputError, match=r"transfer.refit_sizes\[1\]=0"):
        parse_params({"transfer": {"refit_sizes": [2, 0]}})


def test_a_refit_of_other_groups_or_rows_is_refused():
    from hbnn.pipeline.stages.transfer_refit import refit_line

    refit = {"groups": ["g01"], "row_lpd": [-0.1, -0.2], "test": {}, "lpd_se": 0.1, "heldout_not_converged": 0,
             "sampling": {"groups_not_converged": 0, "max_rhat": 1.0, "min_ess_bulk": 500.0, "divergences": 0}}
    line, diff, gain = refit_line(refit, ["g01"], np.array([-0.1, -0.1]), np.array([-0.3, -0.3]), "n2")
    assert line["fits_not_converged"] == 0 and diff["mean"] == pytest.approx(0.05)
    assert gain["mean"] == pytest.approx(0.15)
    for groups, lpd in ((["g02"], np.zeros(2)), (["g01"], np.zeros(3))):
        with pytest.raises(InputError, match="rerun transfer_refit"):
            refit_line(refit, groups, lpd, lpd, "n2")


def test_refit_tasks_with_nothing_to_fit_is_a_clear_error():
    with pytest.raises(InputError, match="nothing to fit"):
        transfer.refit_tasks(_tasks(), ["g01"], TransferParams(sizes=(64,), all_rows=False))


def test_transfer_prior_refuses_before_its_fit_when_no_size_can_be_fitted(tmp_path, monkeypatch):
    """A table's sizes are only known to the stages: transfer_prior says what `transfer` would, before sampling."""
    from conftest import TINY

    from hbnn.files.outputs import write_netcdf
    from hbnn.pipeline.stages import transfer as transfer_stage

    params = parse_params({**TINY, "transfer": {"sizes": [1000], "all_rows": False}})
    write_netcdf(make_moons_tasks(DataSpec.of(params)), tmp_path / "tasks.nc")

    def never(*args, **kwargs):
        raise AssertionError("sampled")

    monkeypatch.setattr(transfer_stage, "sample_hierarchical", never)
    with pytest.raises(InputError, match=r"transfer.sizes=\[1000\] and transfer.all_rows is false; nothing to fit"):
        transfer_stage.transfer_prior(params, tmp_path / "tasks.nc", *(tmp_path / n for n in ("h.nc", "p.nc", "m.json",
                                                                                             "t.json")))


def test_transfer_refuses_a_prior_made_with_other_params_before_any_fit(tmp_path):
    """The stage holds the params and checks the prior file's hash itself (load_prior takes only the layers)."""
    import xarray as xr
    from conftest import TINY

    from hbnn.files.io import provenance
    from hbnn.files.outputs import write_netcdf
    from hbnn.pipeline.stages import transfer as transfer_stage
    from hbnn.pipeline.variants import STAGE_PARAMS

    params = parse_params(TINY)
    other = parse_params({**TINY, "transfer": {**TINY["transfer"], "tune": 41}})
    write_netcdf(make_moons_tasks(DataSpec.of(params)), tmp_path / "tasks.nc")
    prior = xr.Dataset({"v": ("x", np.arange(3.0))})
    prior.attrs.update(provenance("transfer_prior", "hierarchical", other.section_hash(*STAGE_PARAMS["transfer_prior"]),
                                  {transfer_stage.HELDOUT_ATTR: ["g00"]}))
    write_netcdf(prior, tmp_path / "prior.nc")
    with pytest.raises(InputError, match="prior.nc was made by stage transfer_prior with other values of"):
        transfer_stage.run_transfer(params, tmp_path / "tasks.nc", *(tmp_path / n for n in (
            "h.nc", "prior.nc", "pm.json", "rm.json", "f.nc", "i.nc", "m.json", "p.csv", "t.json")))


def test_paired_difference_and_where_the_prior_stops_mattering():
    d = transfer.paired_difference(np.array([1.0, 2.0, 3.0]), np.array([0.0, 2.0, 2.0]))
    assert d["mean"] == pytest.approx(2 / 3) and d["se"] == pytest.approx(np.std([1, 0, 1], ddof=1) / np.sqrt(3))
    big, small = {"mean": 0.5, "se": 0.1}, {"mean": 0.05, "se": 0.1}
    assert transfer.stops_mattering({"n2": big, "n4": small, "all": small}) == "n4"
    assert transfer.stops_mattering({"n2": big, "n4": small, "all": big}) is None
    assert transfer.stops_mattering({"n2": small, "n4": small}) == "n2"
    assert transfer.stops_mattering({"n2": small, "n4": big, "all": small}) == "all"


def test_row_lpd_is_minus_the_log_loss_for_a_classifier():
    lik = likelihoods.get("bernoulli")
    rng = np.random.default_rng(0)
    draws = [rng.uniform(0.05, 0.95, size=(2, 50, 7)), rng.uniform(0.05, 0.95, size=(2, 50, 4))]
    pred = {"draws": draws, "noise": None, "y": [rng.integers(0, 2, 7), rng.integers(0, 2, 4)]}
    from hbnn.diagnostics.predictions import split_scores

    pooled, _ = split_scores(lik, pred)
    assert -transfer.row_lpd(lik, pred).mean() == pytest.approx(pooled["log_loss"], rel=1e-12)


# ----------------------------------------------------------------------------- the stages (tiny pipeline)
def test_transfer_metrics_are_keyed_by_model_and_size(pipeline):  # noqa: F811
    headline = json.loads((pipeline / "metrics" / "transfer.json").read_text())
    detail = json.loads((pipeline / "metrics" / "detail" / "transfer.json").read_text())
    sizes = list(transfer.in_size_order(detail["sizes"]))
    assert sizes == ["n2", "n4", "n8", "n16", "all"]  # TINY: 20 training rows per group, so n32 is skipped
    for model in ("flat", "informed"):
        for size in sizes:
            assert set(headline[model][size]["test"]) == {"accuracy", "log_loss", "brier"}
    assert set(headline["population"]["n0"]["test"]) == {"accuracy", "log_loss", "brier"}
    assert set(headline["sampling"]) == {"flat", "informed", "hierarchical", "hier_refit"}
    # the fit behind the transfer prior, judged as fit_hier's headline judges it: its group sds count too
    hier = detail["sampling"]["hierarchical"]
    required = {"divergences", "max_rhat", "min_ess_bulk", "groups_not_converged", "sds_not_converged"}
    assert required <= set(headline["sampling"]["hierarchical"]) <= required | {"restarts", "advi_still_falling"}
    assert hier["sds_not_converged"] == sum(not (d["rhat"] <= 1.01 and d["ess_bulk"] >= 400)
                                            for d in hier["group_sd"].values())
    assert detail["skipped"] == [f"{g}/n32 (20 training rows)" for g in detail["heldout_groups"]]

    def no_lists(node):
        assert not isinstance(node, list)
        if isinstance(node, dict):
            for v in node.values():
                no_lists(v)

    no_lists(headline)


def test_transfer_hierarchy_never_saw_the_held_out_groups(pipeline):  # noqa: F811
    detail = json.loads((pipeline / "metrics" / "detail" / "transfer.json").read_text())
    hier = az.from_netcdf(pipeline / "traces" / "transfer" / "hier.nc")
    groups = [str(g) for g in hier.posterior["group"].values]
    assert groups == detail["training_groups"]
    assert not set(groups) & set(detail["heldout_groups"])
    assert set(hier.observed_data["obs_group"].values) == set(groups)


def test_transfer_scores_recompute_from_the_refit_traces(pipeline):  # noqa: F811
    """Accuracy per size, pooled over held-out groups, recomputed from each refit trace's predictions."""
    headline = json.loads((pipeline / "metrics" / "transfer.json").read_text())
    for model in ("flat", "informed"):
        idata = az.from_netcdf(pipeline / "traces" / "transfer" / f"{model}.nc")
        p_bar = idata.predictions["p"].mean(("chain", "draw")).values
        y = idata.predictions_constant_data["y"].values
        fit = idata.predictions["obs_group"].values
        for size, scores in headline[model].items():
            rows = np.array([f.endswith("/" + size) for f in fit])
            assert scores["test"]["accuracy"] == pytest.approx(np.mean((p_bar[rows] > 0.5) == (y[rows] == 1)))


def test_transfer_csv_and_report_section(pipeline):  # noqa: F811
    csv = pd.read_csv(pipeline / "reports" / "plots" / "transfer.csv")
    headline = json.loads((pipeline / "metrics" / "transfer.json").read_text())
    assert list(csv.columns[:6]) == ["model", "size", "n", "score_name", "score", "log_loss"]
    assert set(csv["model"]) == {"population", "flat", "informed", "hier_refit"}
    for _, row in csv.iterrows():
        key = "n0" if row["model"] == "population" else row["size"]
        test = headline[row["model"]][key]["test"]
        assert row["score"] == pytest.approx(test["accuracy"], abs=1e-6)
        assert row["log_loss"] == pytest.approx(test["log_loss"], abs=1e-5)
    html = (pipeline / "reports" / "report.html").read_text()
    assert '<section id="transfer"' in html or 'id="transfer"' in html
    assert (pipeline / "reports" / "figures" / "transfer.png").is_file()


def test_transfer_with_a_foreign_or_broken_upstream_file_stops_cleanly(pipeline, tmp_path):  # noqa: F811
    from test_stages import TRANSFER_ARGS, run

    before = (pipeline / "metrics" / "transfer.json").read_bytes()
    args = list(TRANSFER_ARGS)
    i = args.index("--prior-metrics") + 1
    for content in ("not json", json.dumps({"heldout_groups": ["g99"]})):
        bad = tmp_path / "upstream.json"
        bad.write_text(content)
        args[i] = str(bad)
        proc = run("transfer", pipeline / "params.yaml", *args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in proc.stderr
        assert "rerun transfer_prior" in proc.stderr
    assert (pipeline / "metrics" / "transfer.json").read_bytes() == before


def test_the_hierarchical_refit_joins_the_transfer_metrics_csv_and_report(pipeline):  # noqa: F811
    """transfer_refit at every refit size (TINY: n2, all): traces, its line in metrics/transfer.json and its
    informed-minus-refit difference recomputed from the refit's per-row densities."""
    refit = json.loads((pipeline / "metrics" / "detail" / "transfer_refit.json").read_text())
    detail = json.loads((pipeline / "metrics" / "detail" / "transfer.json").read_text())
    headline = json.loads((pipeline / "metrics" / "transfer.json").read_text())
    assert sorted(refit["sizes"]) == sorted(headline["hier_refit"]) == ["all", "n2"]
    assert sorted(p.name for p in (pipeline / "traces" / "transfer" / "refit").iterdir()) == ["all.nc", "n2.nc"]
    assert refit["heldout_groups"] == detail["heldout_groups"]
    for label, r in refit["sizes"].items():
        trace = az.from_netcdf(pipeline / "traces" / "transfer" / "refit" / f"{label}.nc")
        groups = [str(g) for g in trace.posterior["group"].values]
        assert groups == detail["training_groups"] + detail["heldout_groups"] or set(groups) == set(
            detail["training_groups"] + r["groups"])
        row = detail["sizes"][label]
        assert row["hier_refit"]["test"]["accuracy"] == headline["hier_refit"][label]["test"]["accuracy"]
        assert len(r["row_lpd"]) == detail["sizes"][label]["informed"]["test"]["n"]
        assert -np.mean(r["row_lpd"]) == pytest.approx(headline["hier_refit"][label]["test"]["log_loss"], abs=1e-5)
    assert "hier_refit" in headline["sampling"]
    html = (pipeline / "reports" / "report.html").read_text()
    assert "Hierarchical refit accuracy" in html and "Against the hierarchical refit" in html


def _refit_doc(groups=("g01",), rows=2):
    entry = {"groups": list(groups), "row_lpd": [-0.5] * rows, "test": {"accuracy": 0.5}, "lpd_se": 0.1,
             "heldout_not_converged": 0,
             "sampling": {"divergences": 0, "max_rhat": 1.0, "min_ess_bulk": 500.0, "groups_not_converged": 0}}
    return {"sizes": {"n2": entry}}


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("sizes"), "no sizes object"),
    (lambda d: d["sizes"].update(n4=d["sizes"]["n2"]), r"holds sizes \['n2', 'n4'\], and these params refit at"),
    (lambda d: d["sizes"].pop("n2"), r"holds sizes \[\]"),
    (lambda d: d["sizes"]["n2"].update(groups=["g02"]), r"n2 refit scored held-out groups \['g02'\], not"),
    (lambda d: d["sizes"]["n2"].update(row_lpd=[-0.5]), "no row_lpd of 2 numbers"),
    (lambda d: d["sizes"]["n2"].update(row_lpd=["x", "y"]), "no row_lpd of 2 numbers"),
    (lambda d: d["sizes"]["n2"].pop("sampling"), "lacks its test scores or sampling counts"),
])
def test_a_broken_refit_metrics_file_is_named_before_any_fit(change, message):
    from pathlib import Path

    from hbnn.pipeline.stages.transfer_refit import check_refit_metrics

    doc = _refit_doc()
    check_refit_metrics(doc, Path("r.json"), {"n2": (["g01"], 2)})  # as it should be
    change(doc)
    with pytest.raises(InputError, match=f"metrics file r.json: .*{message}.*rerun transfer_refit"):
        check_refit_metrics(doc, Path("r.json"), {"n2": (["g01"], 2)})


def test_transfer_refit_refuses_a_trace_folder_that_is_a_file_before_any_fit(tmp_path, monkeypatch):
    from conftest import TINY

    from hbnn.files.outputs import write_netcdf
    from hbnn.pipeline.stages import transfer_refit

    params = parse_params(TINY)
    write_netcdf(make_moons_tasks(DataSpec.of(params)), tmp_path / "tasks.nc")
    (tmp_path / "refit").write_text("a file")
    monkeypatch.setattr(transfer_refit, "sample_hierarchical", lambda *a, **k: pytest.fail("sampled"))
    with pytest.raises(InputError, match="refit exists and is not a folder"):
        transfer_refit.run_transfer_refit(params, tmp_path / "tasks.nc", tmp_path / "refit", tmp_path / "m.json",
                                          tmp_path / "t.json")


def test_the_report_says_when_no_refit_ran_and_when_refits_miss_the_bar(pipeline):  # noqa: F811
    from hbnn.report.transfer_section import _transfer_section

    tm = json.loads((pipeline / "metrics" / "detail" / "transfer.json").read_text())
    lik = likelihoods.get("bernoulli")

    def texts(section):
        return " ".join(getattr(b, "text", "") for b in section.blocks)

    ran = texts(_transfer_section(tm, lik))
    assert "did not run" not in ran
    missed = {**tm, "sampling": {**tm["sampling"], "hier_refit": {**tm["sampling"]["hier_refit"],
                                                                   "fits_not_converged": 1}}}
    assert "1 of the hierarchical refits miss the convergence bar" in texts(_transfer_section(missed, lik))
    none = {**tm, "sizes": {k: {m: v for m, v in r.items() if m not in ("hier_refit", "informed_vs_refit",
                                                                         "refit_vs_flat")}
                            for k, r in tm["sizes"].items()},
            "sampling": {k: v for k, v in tm["sampling"].items() if k != "hier_refit"}}
    text = texts(_transfer_section(none, lik))
    assert "The hierarchical refit did not run" in text and "Against the hierarchical refit" not in text
