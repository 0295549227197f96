"""Per-group noise for gaussian regression in the hierarchical model (``model.noise: group``): the PyMC model has one
noise sd per group drawn from a learned log-normal, each row's likelihood uses its own group's, the hand-written
density declines it (one INFO line), and a new group's noise sd is drawn from the population."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import xarray as xr
from conftest import TINY
from scipy.stats import norm
from test_kernel import _data

from hbnn.config_read import parse_params
from hbnn.density import densities
from hbnn.fitting import common as fitting
from hbnn.model.builders import build_hierarchical_model
from hbnn.pipeline.predict import population_extra

TABLE = {"source": "table", "path": "sales.csv", "features": ["price"], "label": "sales", "group": "shop"}


class _Features:
    features = ["price"]


def test_each_rows_likelihood_uses_its_own_groups_noise_sd():
    X, y, counts, valid = _data("gaussian", (6, 3, 9))
    model = build_hierarchical_model(X, y, valid, ["a", "b", "c"], ["x0", "x1"], (), likelihood="gaussian",
                                     bias=True, noise="group")
    assert model.named_vars_to_dims["sigma"] == ("group",)
    assert {"log_sigma_mu", "log_sigma_sd", "z_sigma"} <= set(model.named_vars)
    point = model.initial_point()
    point["z_sigma"] = np.array([-1.0, 0.0, 1.5])  # three different noise sds
    point["log_sigma_mu"] = np.array(0.3)
    at_point = model.replace_rvs_by_values([model["w_out"], model["sigma"]])  # the deterministics at the point
    fn = model.compile_fn([*at_point, model.logp(vars=[model["y_obs"]])], inputs=model.value_vars)
    w, sigma, logp = fn(point)
    assert len(set(np.round(sigma, 6))) == 3
    rows_group = valid // X.shape[1]
    Xr = X.reshape(-1, X.shape[2])[valid]
    out = np.einsum("rf,rf->r", Xr, w[rows_group, :-1]) + w[rows_group, -1]  # the features, then the bias row
    assert logp == pytest.approx(norm.logpdf(y, out, sigma[rows_group]).sum(), rel=1e-6)


def test_shared_noise_is_one_sd_as_before():
    X, y, counts, valid = _data("gaussian", (6, 3, 9))
    model = build_hierarchical_model(X, y, valid, ["a", "b", "c"], ["x0", "x1"], (3,), likelihood="gaussian")
    assert model.named_vars_to_dims.get("sigma") in (None, ())
    assert "z_sigma" not in model.named_vars


def test_the_hand_written_density_declines_group_noise_with_one_info_line(monkeypatch, caplog):
    monkeypatch.setattr(fitting, "_SAID", set())
    why = densities.unsupported("gaussian", "tanh", "group")
    assert why is not None and "per-group noise (model.noise: group)" in why
    assert densities.unsupported("gaussian", "tanh", "shared") is None
    params = parse_params({**TINY, "data": TABLE, "model": {"likelihood": "gaussian", "noise": "group"}})
    spec = fitting.model_spec(params, _Features())
    assert spec.noise == "group"
    with caplog.at_level(logging.INFO, logger="hbnn.fitting.common"):
        said = [fitting.hand_written(spec, params.sampler_for("fit_hier"), "fit_hier", spec.noise) for _ in range(2)]
        flat = fitting.hand_written(spec, params.sampler_for("fit_flat"), "fit_flat")  # its sigma is per group anyway
    assert said == [False, False] and flat is True
    lines = [r for r in caplog.records if "PyMC's compiled density" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and "per-group noise" in lines[0].getMessage()


def test_a_new_groups_noise_sd_comes_from_the_population():
    rng = np.random.default_rng(0)
    chains, draws = 2, 4000
    post = xr.Dataset({
        "sigma": (("chain", "draw", "group"), rng.uniform(0.5, 2.0, (chains, draws, 3))),
        "log_sigma_mu": (("chain", "draw"), np.full((chains, draws), np.log(0.5))),
        "log_sigma_sd": (("chain", "draw"), np.full((chains, draws), 0.2)),
    })
    new = population_extra(post, "sigma", np.random.default_rng(1))
    assert new.shape == (chains, draws)
    assert np.log(new).mean() == pytest.approx(np.log(0.5), abs=0.01)
    assert np.log(new).std() == pytest.approx(0.2, abs=0.01)
    shared = xr.Dataset({"sigma": (("chain", "draw"), rng.uniform(0.5, 2.0, (chains, draws)))})
    assert np.array_equal(population_extra(shared, "sigma", np.random.default_rng(1)), shared["sigma"].values)
