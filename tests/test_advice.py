"""Model advice when most groups miss the bar (hbnn.diagnostics.advice)."""

from __future__ import annotations

from hbnn.diagnostics.advice import model_advice


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
