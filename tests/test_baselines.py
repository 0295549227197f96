"""The baselines stage (scikit-learn reference models on the BNNs' rows) and the report's first line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import TINY
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression, PoissonRegressor
from sklearn.metrics import accuracy_score, brier_score_loss, log_loss

from hbnn.config_read import parse_params
from hbnn.data.tasks import load_tasks
from hbnn.model import likelihoods
from hbnn.pipeline.runner import run_stage
from hbnn.pipeline.stages.baselines import MODELS, baseline_seed, baselines
from hbnn.pipeline.stages.make_data import make_data
from hbnn.pipeline.transfer import paired_difference
from hbnn.report.winner import OVERDISPERSED, pearson_dispersion, winner_line

ARGS = ["--tasks-path", "data/tasks.nc", "--metrics-out", "metrics/baselines.json"]


def _stage(d: Path, raw: dict, monkeypatch) -> dict:
    """make_data then baselines in ``d`` with params ``raw``; the headline metrics."""
    monkeypatch.chdir(d)
    (d / "params.yaml").write_text(yaml.safe_dump(raw))
    assert run_stage("make_data", ["out"], make_data, ["--out", "data/tasks.nc"]) == 0
    assert run_stage("baselines", ["tasks_path", "metrics_out"], baselines, ARGS) == 0
    return json.loads((d / "metrics" / "baselines.json").read_text())


def _table(d: Path, likelihood: str) -> dict:
    """A tiny three-shop table with gaussian or count labels, and the params that read it."""
    rng = np.random.default_rng(7)
    parts = []
    for name, n in {"small": 8, "mid": 16, "big": 30}.items():
        X = rng.normal(size=(n, 2))
        eta = X @ rng.normal([0.8, -0.5], 0.3)
        y = rng.poisson(np.exp(1.0 + eta)) if likelihood == "poisson" else eta + rng.normal(0, 0.5, size=n)
        parts.append(pd.DataFrame({"shop": name, "a": X[:, 0], "b": X[:, 1], "sales": y}))
    pd.concat(parts).to_csv(d / "sales.csv", index=False)
    return {**TINY, "data": {"source": "table", "path": "sales.csv", "features": ["a", "b"], "label": "sales",
                             "group": "shop"}, "model": {"likelihood": likelihood}}


def test_moons_baselines_write_every_model_and_score(tmp_path, monkeypatch):
    m = _stage(tmp_path, TINY, monkeypatch)
    assert sorted(m) == sorted(MODELS)
    for model in MODELS:
        assert set(m[model]) == {"train", "test"}
        assert set(m[model]["train"]) == {"accuracy"} and set(m[model]["test"]) == {"accuracy", "log_loss", "brier"}
    detail = json.loads((tmp_path / "metrics" / "detail" / "baselines.json").read_text())
    assert detail["made_by"]["stage"] == "baselines"
    assert sorted(detail["gradient_boosting"]["per_group"]) == ["g00", "g01", "g02"]
    assert set(detail["per_group_glm"]["per_group"]["g01"]["test"]) == {"accuracy", "log_loss", "brier", "n"}


@pytest.mark.parametrize("likelihood", ["gaussian", "poisson"])
def test_table_baselines_write_the_predictive_scores(tmp_path, monkeypatch, likelihood):
    m = _stage(tmp_path, _table(tmp_path, likelihood), monkeypatch)
    for model in MODELS:
        assert set(m[model]["test"]) == {"rmse", "lpd", "coverage_94"} and set(m[model]["train"]) == {"rmse"}
        assert m[model]["test"]["rmse"] > 0 and 0 <= m[model]["test"]["coverage_94"] <= 1
        assert np.isfinite(m[model]["test"]["lpd"])


def test_scores_equal_a_direct_scikit_learn_computation(tmp_path, monkeypatch):
    """The pooled GLM's and gradient boosting's test scores are scikit-learn's own on the same split."""
    _stage(tmp_path, TINY, monkeypatch)
    detail = json.loads((tmp_path / "metrics" / "detail" / "baselines.json").read_text())
    tasks = load_tasks(tmp_path / "data" / "tasks.nc")
    train, test = tasks.split("train"), tasks.split("test")
    p = LogisticRegression(max_iter=1000).fit(train.X, train.y).predict_proba(test.X)[:, 1]
    got = detail["pooled_glm"]["test"]
    assert got["accuracy"] == pytest.approx(accuracy_score(test.y, p > 0.5), abs=1e-6)
    assert got["log_loss"] == pytest.approx(log_loss(test.y, p), abs=1e-6)
    assert got["brier"] == pytest.approx(brier_score_loss(test.y, p), abs=1e-6)
    hgb = HistGradientBoostingClassifier(categorical_features=[2], random_state=baseline_seed(parse_params(TINY)))
    p = hgb.fit(np.column_stack([train.X, train.group]), train.y).predict_proba(
        np.column_stack([test.X, test.group]))[:, 1]
    assert detail["gradient_boosting"]["test"]["log_loss"] == pytest.approx(log_loss(test.y, p), abs=1e-6)


def test_poisson_lpd_is_the_poisson_log_pmf_of_scikit_learns_rate(tmp_path, monkeypatch):
    from scipy.stats import poisson

    _stage(tmp_path, _table(tmp_path, "poisson"), monkeypatch)
    detail = json.loads((tmp_path / "metrics" / "detail" / "baselines.json").read_text())
    tasks = load_tasks(tmp_path / "data" / "tasks.nc")
    train, test = tasks.split("train"), tasks.split("test")
    rate = PoissonRegressor(max_iter=1000).fit(train.X, train.y).predict(test.X)
    assert detail["pooled_glm"]["test"]["lpd"] == pytest.approx(poisson.logpmf(test.y, rate).mean(), abs=1e-6)
    assert detail["pooled_glm"]["test"]["rmse"] == pytest.approx(np.sqrt(np.mean((test.y - rate) ** 2)), abs=1e-6)


def test_winner_line_names_the_best_model_and_its_paired_standard_errors():
    rng = np.random.default_rng(0)
    base = rng.normal(-0.5, 0.3, size=200)
    rows = {"A": base - 0.2, "B": base + rng.normal(0.05, 0.1, size=200), "C": base - 0.01}
    lik = likelihoods.get("bernoulli")
    text = winner_line(lik, rows).text
    d = rows["B"] - rows["C"]  # the best and the runner-up by mean row lpd
    z = d.mean() / (d.std(ddof=1) / np.sqrt(d.size))
    assert text.startswith(f"Best on the test rows by log loss (lower is better): B ({-rows['B'].mean():.4f})")
    assert f"ahead of C ({-rows['C'].mean():.4f}) by {z:.1f} standard errors" in text
    assert f"{paired_difference(rows['B'], rows['C'])['mean'] / paired_difference(rows['B'], rows['C'])['se']:.1f}" \
        in text
    assert "by lpd (higher is better): B" in winner_line(likelihoods.get("gaussian"), rows).text
    assert "The best" not in text  # no baselines named: nothing more to say
    # B and C are BNNs, A a baseline: the line also says how far the best plain model is behind
    both = winner_line(lik, rows, baselines=["A"]).text
    d = rows["B"] - rows["A"]
    z = d.mean() / (d.std(ddof=1) / np.sqrt(d.size))
    assert both.endswith(f" The best plain model (baseline), A ({-rows['A'].mean():.4f}), is {z:.1f} standard "
                         "errors behind.")
    # the runner-up already of the other kind: nothing added
    assert "The best" not in winner_line(lik, rows, baselines=["C"]).text
    # a baseline best and another baseline second: the best BNN is named
    assert "The best BNN, A (" in winner_line(lik, rows, baselines=["B", "C"]).text


def test_winner_line_says_when_poisson_baselines_meet_overdispersed_counts():
    rng = np.random.default_rng(3)
    rate = rng.uniform(1.0, 6.0, size=4000)
    assert pearson_dispersion(rng.poisson(rate), rate) == pytest.approx(1.0, abs=0.1)
    # negative binomial counts with dispersion alpha = 1: variance rate + rate**2, about 4.5 times the mean here
    overdispersed = rng.negative_binomial(1.0, 1.0 / (1.0 + rate))
    assert pearson_dispersion(overdispersed, rate) > 3.0
    base = rng.normal(-2.5, 0.5, size=300)
    rows = {"Hierarchical BNN": base + 0.3, "Pooled GLM": base}
    lik = likelihoods.get("negative_binomial")
    text = winner_line(lik, rows, baselines=["Pooled GLM"], dispersion=4.25).text
    assert text.endswith("around the best baseline's rates the test counts' variance is 4.2 times their mean (a "
                         "Poisson count's is 1): part of the margin between the BNNs (negative binomial) and the "
                         "baselines is the likelihood, not the network.")
    assert "The baselines are Poisson models" in text
    # counts as dispersed as a Poisson's, no baselines compared, or no dispersion (same likelihood): nothing said
    assert "Poisson models" not in winner_line(lik, rows, baselines=["Pooled GLM"], dispersion=OVERDISPERSED).text
    assert "Poisson models" not in winner_line(lik, rows, dispersion=4.25).text
    assert "Poisson models" not in winner_line(lik, rows, baselines=["Pooled GLM"]).text


def test_missing_tasks_file_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(TINY))
    assert run_stage("baselines", ["tasks_path", "metrics_out"], baselines, ARGS) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "data/tasks.nc" in err[0]
    assert not (tmp_path / "metrics").exists()
