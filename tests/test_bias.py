"""``model.bias: true``: a bias per hidden and output unit, everywhere a network is built, relabelled or scored."""

from __future__ import annotations

import json

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import TINY
from test_stages import _run_pipeline

from hbnn.model.alignment import Symmetry, apply_symmetry, match_symmetry
from hbnn.model.builders import build_flat_model, build_hierarchical_model, build_informed_model
from hbnn.model.network import has_bias, layer_coords, layer_specs, mlp_logit
from hbnn.pipeline.budget import n_weights


def test_layers_get_a_bias_row_and_their_own_input_dims():
    specs = layer_specs(2, (5, 4), bias=True)
    assert [s.dims for s in specs] == [("feature_and_bias", "hidden_1"), ("hidden_1_and_bias", "hidden_2"),
                                       ("hidden_2_and_bias",)]
    assert [s.shape for s in specs] == [(3, 5), (6, 4), (5,)]
    assert has_bias(specs) and not has_bias(layer_specs(2, (5, 4)))
    assert [s.shape for s in layer_specs(3, (), bias=True)] == [(4,)]
    coords = layer_coords(["x1", "x2"], (5, 4), bias=True)
    assert coords["feature_and_bias"] == ["x1", "x2", "bias"]
    assert coords["hidden_1_and_bias"] == ["0", "1", "2", "3", "4", "bias"]
    assert n_weights(2, (5, 4), bias=True) == [15, 24, 5] and n_weights(2, (5, 4)) == [10, 20, 4]


@pytest.mark.parametrize("hidden", [(5, 4), (3,), ()])
def test_forward_pass_adds_each_units_bias(hidden):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(7, 2))
    weights = [rng.normal(size=s.shape) for s in layer_specs(2, hidden, bias=True)]
    h = X
    for w in weights[:-1]:
        h = np.tanh(h @ w[:-1] + w[-1])
    ref = h @ weights[-1][:-1] + weights[-1][-1]
    np.testing.assert_allclose(mlp_logit(X, weights, bias=True), ref, rtol=1e-12)
    np.testing.assert_allclose(mlp_logit(X, weights), ref, rtol=1e-12)  # NumPy: read from the shapes
    sym = mlp_logit(pt.as_tensor(X), [pt.as_tensor(w) for w in weights], pt.tanh, True).eval()
    np.testing.assert_allclose(sym, ref, rtol=1e-12)
    stacked = [np.stack([w, 2 * w]) for w in weights]  # leading draw dims broadcast
    np.testing.assert_allclose(mlp_logit(X, stacked)[0], ref, rtol=1e-12)
    # the point of biases: the origin is no longer forced to a logit of exactly 0
    assert mlp_logit(np.zeros((1, 2)), weights)[0] != 0.0


@pytest.mark.parametrize("seed", range(4))
def test_relabelling_keeps_the_function_and_aligns_back_with_biases(seed):
    rng = np.random.default_rng(seed)
    hidden = (5, 4)
    net = [rng.normal(size=s.shape) for s in layer_specs(2, hidden, bias=True)]
    sym = Symmetry(tuple(rng.permutation(h) for h in hidden), tuple(rng.choice([-1.0, 1.0], size=h) for h in hidden))
    moved = apply_symmetry(net, sym)
    X = rng.normal(size=(20, 2))
    np.testing.assert_allclose(mlp_logit(X, moved), mlp_logit(X, net), rtol=1e-10, atol=1e-12)
    assert moved[-1][-1] == net[-1][-1]  # the output's bias belongs to no hidden unit: it stays
    back = apply_symmetry(moved, match_symmetry(net, moved))
    for a, b in zip(back, net, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_every_model_has_bias_variables(tiny_tasks):
    train = tiny_tasks.split("train")
    rows = train.rows(0)
    specs = layer_specs(2, (3,), bias=True)
    flat = build_flat_model(train.X[rows], train.y[rows], ["x1", "x2"], (3,), bias=True)
    assert flat["w_in"].eval().shape == (3, 3) and flat["w_out"].eval().shape == (4,)
    prior = {s.name: (np.zeros(s.size), np.eye(s.size)) for s in specs}
    informed = build_informed_model(train.X[rows], train.y[rows], ["x1", "x2"], (3,), prior, bias=True)
    assert informed["w_in"].eval().shape == (3, 3)
    padded = tiny_tasks.padded("train")
    hier = build_hierarchical_model(padded.X, padded.y, padded.valid, tiny_tasks.group_names, ["x1", "x2"], (3,),
                                    bias=True)
    assert hier["mu_in"].eval().shape == (3, 3) and hier["w_in"].eval().shape == (3, 3, 3)
    for model in (flat, informed, hier):
        assert np.isfinite(model.compile_logp()(model.initial_point()))
    with flat:
        assert pm.draw(flat["w_out"]).shape == (4,)


@pytest.fixture(scope="module")
def bias_pipeline(tmp_path_factory):
    return _run_pipeline(tmp_path_factory, "bias", {**TINY, "model": {"hidden_layers": [3], "bias": True}})


def test_bias_runs_end_to_end_and_predicts_off_the_origin(bias_pipeline):
    d = bias_pipeline
    for name in ("flat", "hier", "informed"):
        post = az.from_netcdf(d / "traces" / f"{name}.nc").posterior
        assert "feature_and_bias" in post["w_in"].dims
        assert json.loads(post.attrs["hbnn_settings"])["bias"] is True
        assert 0 <= json.loads((d / "metrics" / f"{name}.json").read_text())["test"]["accuracy"] <= 1
    assert json.loads((d / "metrics" / "transfer.json").read_text())["flat"]["n2"]["test"]["accuracy"] >= 0
    html = (d / "reports" / "report.html").read_text()
    assert "a bias per hidden and output unit" in html
    # hbnn predict at the features' training mean: no longer 0.5 with sd 0
    const = az.from_netcdf(d / "traces" / "hier.nc").constant_data
    row = {"group": ["g00", "new"], **{f: [float(const["x_mean"].sel(feature=f))] * 2 for f in ("x1", "x2")}}
    pd.DataFrame(row).to_csv(d / "origin.csv", index=False)
    from hbnn.pipeline.predict import predict

    out = predict(d / "traces" / "hier.nc", d / "origin.csv", d / "origin_scored.csv")
    assert (out["sd"] > 0).all() and (out["mean"] != 0.5).all()
