"""Model advice when most groups miss the bar or a group sd runs to its prior's tail (hbnn.diagnostics.advice)."""

from __future__ import annotations

import numpy as np

from hbnn.diagnostics.advice import MEASURED, model_advice, sds_in_tail
from hbnn.report.numbers import MODELS
from hbnn.report.status import _status_section


def groups(missing: int, total: int) -> dict:
    return {f"g{i}": {"converged": i >= missing} for i in range(total)}


def test_few_groups_short_get_no_model_advice():
    assert model_advice(groups(0, 10), {"bias": False}, "Flat") is None
    assert model_advice(groups(4, 10), {"bias": False}, "Flat") is None
    assert model_advice(groups(1, 2), {"bias": False}, "Flat") is None  # one group: a longer run, not the model


def test_most_groups_short_name_the_settings_the_fit_did_not_use():
    text = model_advice(groups(6, 10), {"bias": False, "hidden_layers": [5, 5], "prior_sd": 1.0}, "Flat")
    assert text.startswith("Flat: 6 of 10 groups miss the bar")
    assert "model.bias: true" in text and "model.hidden_layers: []" in text and "model.prior_sd" in text
    linear = model_advice(groups(11, 11), {"bias": True, "hidden_layers": []}, "Hierarchical")
    assert "model.bias: true (" not in linear and "hidden_layers: [] (" not in linear
    assert "model.activation" in linear and "grunfeld" in linear


def test_a_shared_noise_sd_is_named_for_a_regression():
    text = model_advice(groups(8, 11), {"bias": True, "hidden_layers": [], "likelihood": "gaussian",
                                        "noise": "shared"}, "Hierarchical")
    assert "model.noise: group" in text
    assert "model.noise: group" not in model_advice(groups(8, 11), {"bias": True, "likelihood": "bernoulli"}, "Flat")


def test_an_sd_in_its_prior_tail_while_groups_miss_names_the_model_causes():
    rng = np.random.default_rng(0)
    tail = {"sd_in": np.abs(rng.normal(0.0, 0.1, size=(2, 500))), "sd_out": rng.normal(4.0, 0.5, size=(2, 500))}
    assert list(sds_in_tail(tail)) == ["sd_out"]
    # one group of 11 misses: not widespread, but the output layer's sd sits past HalfNormal(1)'s 95% quantile
    settings = {"bias": False, "hidden_layers": [5, 5], "likelihood": "gaussian", "noise": "shared"}
    text = model_advice(groups(1, 11), settings, "Hierarchical", sd_draws=tail)
    assert text.startswith("Hierarchical: 1 of 11 groups miss the bar and the group sd sd_out (posterior median "
                           f"{np.median(tail['sd_out']):.2f}) runs past its HalfNormal(1) prior's 95% quantile (1.96)")
    assert "model.bias: true" in text and "model.hidden_layers: []" in text and "model.noise: group" in text
    assert MEASURED["network"] in text and MEASURED["noise"] in text
    # every group met, but an sd itself missed the bar: the tail is still the likely cause
    assert "sd_out" in model_advice(groups(0, 11), settings, "Hierarchical", sd_draws=tail, sds_missing=1)


def test_an_sd_in_its_prior_tail_of_a_converged_fit_or_inside_the_prior_gets_no_advice():
    rng = np.random.default_rng(1)
    # the default moons fit: output-layer sd near 3.7, every group and sd meets the bar
    moons = {"sd_in": np.abs(rng.normal(0.0, 0.02, size=(2, 500))), "sd_out": rng.normal(3.7, 0.5, size=(2, 500))}
    assert model_advice(groups(0, 18), {"bias": False, "hidden_layers": [5, 5]}, "Hierarchical", sd_draws=moons) is None
    # a group misses, but the sds sit inside their prior (median 1.5 < 1.96): a longer run, not the model
    inside = {"sd_out": rng.normal(1.5, 0.3, size=(2, 500))}
    assert sds_in_tail(inside) == {}
    assert model_advice(groups(1, 11), {"bias": False}, "Hierarchical", sd_draws=inside, sds_missing=1) is None


def test_the_measurement_cited_fits_the_settings_the_fit_used():
    linear_shared = model_advice(groups(8, 11), {"bias": True, "hidden_layers": [], "likelihood": "gaussian",
                                                 "noise": "shared"}, "Hierarchical")
    assert MEASURED["noise"] in linear_shared and MEASURED["network"] not in linear_shared
    network = model_advice(groups(8, 11), {"bias": False, "hidden_layers": [5, 5], "likelihood": "bernoulli"}, "Flat")
    assert MEASURED["network"] in network and MEASURED["noise"] not in network
    assert network.count(MEASURED["network"]) == 1  # both settings point at one measurement, said once


def test_the_status_box_gives_the_tail_advice_from_the_hierarchical_sd_draws():
    names = ["a", "b", "c"]
    good = {"per_group": {g: {"converged": True, "rhat_fn": 1.0, "ess_bulk_fn": 900.0} for g in names},
            "sampling": {"max_rhat_fn": 1.0, "min_ess_bulk_fn": 900.0, "divergences": 0}}
    short = {**good, "per_group": {**good["per_group"], "c": {"converged": False, "rhat_fn": 1.05,
                                                             "ess_bulk_fn": 60.0}}}
    settings = {v: {"bias": False, "hidden_layers": [5, 5]} for v in MODELS}
    draws = {"sd_out": np.random.default_rng(2).normal(4.0, 0.3, size=(2, 200))}

    def advice(metrics):
        sec = _status_section(metrics, names, ["sd_out"], settings=settings, sd_draws=draws)
        return [b.text for b in sec.blocks if getattr(b, "warn", False) and "prior's 95% quantile" in b.text]

    text = advice({**{v: good for v in MODELS}, "hierarchical": short})
    assert len(text) == 1 and text[0].startswith("Hierarchical: 1 of 3 groups miss the bar and the group sd sd_out")
    assert advice({v: good for v in MODELS}) == []  # the same sd in a fit that meets the bar: no advice
    # the draws are the hierarchical fit's: a flat fit missing a group is not told about them
    assert advice({**{v: good for v in MODELS}, "flat": short}) == []
