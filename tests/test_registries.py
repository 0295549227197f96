"""Every registered likelihood and activation either has a hand-written density equal to PyMC's, value and gradient,
or is declared unsupported there and sampled with PyMC's density instead (one INFO line), never a KeyError."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import TINY
from test_kernel import _assert_same_density, _data

from hbnn.config_read import parse_params
from hbnn.density import densities
from hbnn.fitting import common as fitting
from hbnn.model import activations, likelihoods
from hbnn.model.builders import build_hierarchical_model
from hbnn.model.likelihoods.poisson import Poisson

TABLE = {"source": "table", "path": "sales.csv", "features": ["price"], "label": "sales", "group": "shop"}
PAIRS = [(lik, act) for lik in likelihoods.LIKELIHOODS for act in activations.ACTIVATIONS]


@pytest.mark.parametrize("likelihood, activation", PAIRS)
def test_every_registered_model_is_pymcs_density_or_declared_unsupported(likelihood, activation):
    X, y, counts, valid = _data(likelihood, (6, 3, 9))
    names, features = [f"g{i}" for i in range(len(counts))], ["x0", "x1"]
    model = build_hierarchical_model(X, y, valid, names, features, (3, 2), likelihood=likelihood, noise_sd=0.8,
                                     activation=activation)
    why = densities.unsupported(likelihood, activation)
    if why is None:
        density = densities.HierarchicalDensity(X, y, counts, (3, 2), False, likelihood, 0.8, activation=activation)
        _assert_same_density(model, density)
    else:
        assert likelihood in why or activation in why
        assert np.isfinite(model.compile_logp()(model.initial_point()))


class _Features:
    features = ["price"]


class _Uncompiled(Poisson):
    """A likelihood registered without its part of the hand-written density."""

    name = "uncompiled_counts"
    density_source = None


@pytest.fixture
def uncompiled(monkeypatch):
    monkeypatch.setitem(likelihoods.LIKELIHOODS, _Uncompiled.name, _Uncompiled())
    monkeypatch.setattr("hbnn.config.LIKELIHOODS", (*likelihoods.LIKELIHOODS,))
    monkeypatch.setattr(fitting, "_SAID", set())
    return _Uncompiled.name


def test_a_likelihood_without_density_code_falls_back_with_one_info_line(uncompiled, caplog):
    params = parse_params({**TINY, "data": TABLE, "model": {"likelihood": uncompiled}})
    assert densities.unsupported(uncompiled, "tanh") is not None
    with caplog.at_level(logging.INFO, logger="hbnn.fitting.common"):
        said = [fitting.hand_written(fitting.model_spec(params, _Features()), params.sampler_for(stage), stage)
                for stage in ("fit_flat", "fit_hier", "fit_flat")]
    assert said == [False, False, False]
    lines = [r for r in caplog.records if "PyMC's compiled density" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert f"the likelihood '{uncompiled}' has no compiled code" in lines[0].getMessage()


def test_a_fit_of_a_likelihood_without_density_code_samples_pymcs_model(uncompiled, caplog, tmp_path, monkeypatch):
    """The fallback through a stage: fit_flat of counts under the likelihood the density does not know samples
    PyMC's model with nutpie, says so once, and scores the draws as that likelihood's."""
    import json

    import pandas as pd

    from hbnn.pipeline.stages.fit_flat import fit_flat
    from hbnn.pipeline.stages.make_data import make_data

    rng = np.random.default_rng(3)
    pd.DataFrame({"shop": np.repeat(["a", "b"], 16), "price": rng.normal(size=32),
                  "sales": rng.poisson(3.0, 32)}).to_csv(tmp_path / "sales.csv", index=False)
    monkeypatch.chdir(tmp_path)
    params = parse_params({**TINY, "data": TABLE, "model": {"likelihood": uncompiled, "hidden_layers": [2]},
                           "sampler": {**TINY["sampler"], "backend": "nutpie"}})
    make_data(params, tmp_path / "tasks.nc")
    with caplog.at_level(logging.INFO):
        fit_flat(params, tmp_path / "tasks.nc", tmp_path / "flat.nc", tmp_path / "flat.json", tmp_path / "t.json")
    lines = [r for r in caplog.records if "PyMC's compiled density" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert not any("checking the hand-written" in r.getMessage() for r in caplog.records)
    metrics = json.loads((tmp_path / "flat.json").read_text())
    assert {"rmse", "lpd", "coverage_94"} <= set(metrics["test"])
