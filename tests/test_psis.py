"""hbnn.diagnostics.psis against ArviZ's az.loo, which it replaces in the fit stages (ArviZ's import costs each ~2.5
s)."""

import warnings

import arviz as az
import numpy as np
import pytest
import xarray as xr

from hbnn.diagnostics import psis


def _arviz_loo(log_lik: np.ndarray, reff: float):
    idata = az.InferenceData(log_likelihood=xr.Dataset({"y": (("chain", "draw", "obs"), log_lik)}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return az.loo(idata, pointwise=True, reff=reff)


def _cases():
    rng = np.random.default_rng(7)
    normal = rng.normal(-1.0, 0.5, size=(2, 400, 30))
    heavy = rng.standard_t(1.5, size=(4, 250, 40)) * 2 - 3  # many rows with k above the bar
    few = rng.normal(-0.7, 0.3, size=(1, 20, 6))  # tails of 4 draws or fewer: k infinite, nothing smoothed
    odd = rng.normal(-2.0, 1.0, size=(2, 300, 12))
    odd[:, :, 0] = -0.5  # a constant row
    odd[1, 17, 1] = -400.0  # one draw that nearly rules a row's weights out
    odd[:, :150, 2] = -1e-3  # ties at the cut-off
    return {"normal": normal, "heavy": heavy, "few": few, "odd": odd}


@pytest.mark.parametrize("case", sorted(_cases()))
@pytest.mark.parametrize("reff", [1.0, 0.3])
def test_loo_equals_arviz(case, reff):
    log_lik = _cases()[case]
    ours, theirs = psis.loo(log_lik, reff), _arviz_loo(log_lik, reff)
    assert ours.n_samples == theirs.n_samples and ours.n_data_points == theirs.n_data_points
    assert ours.elpd_loo == pytest.approx(theirs.elpd_loo, rel=1e-12, abs=1e-9)
    assert ours.se == pytest.approx(theirs.se, rel=1e-10, abs=1e-10)
    assert ours.p_loo == pytest.approx(theirs.p_loo, rel=1e-10, abs=1e-9)
    np.testing.assert_allclose(ours.loo_i, theirs.loo_i.values, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours.pareto_k, theirs.pareto_k.values, rtol=1e-12, atol=1e-14)  # inf == inf
    assert ours.good_k == theirs.good_k and ours.warning == theirs.warning


def test_cases_reach_every_branch():
    """The comparison above covers smoothed rows, rows past the bar and rows too short to smooth."""
    cases = _cases()
    k = np.concatenate([psis.loo(cases[c]).pareto_k for c in cases])
    assert np.isinf(k).any() and (k[np.isfinite(k)] > 0.7).any() and (k < 0.5).any()


def test_the_weights_are_normalised_and_smoothed_only_in_the_tail():
    rng = np.random.default_rng(3)
    ratios = rng.standard_t(2, size=(5, 1000))
    weights, k = psis.smoothed_log_weights(ratios, reff=1.0)
    np.testing.assert_allclose(np.exp(weights).sum(axis=1), 1.0, rtol=1e-12)
    for row, w in zip(ratios, weights, strict=True):
        shift = w - row  # the body keeps its ratios, up to the normalising constant
        body = row <= np.sort(row)[-int(np.ceil(min(1000 / 5, 3 * 1000**0.5))) - 1]
        np.testing.assert_allclose(shift[body], shift[body][0], atol=1e-12)
    assert np.isfinite(k).all()


def test_to_arviz_is_what_az_compare_takes():
    cases = _cases()
    ours = {"a": psis.loo(cases["normal"]).to_arviz(), "b": psis.loo(cases["normal"] - 0.01).to_arviz()}
    theirs = {"a": _arviz_loo(cases["normal"], 1.0), "b": _arviz_loo(cases["normal"] - 0.01, 1.0)}
    a, b = az.compare(ours), az.compare(theirs)
    for column in ("rank", "elpd_loo", "p_loo", "elpd_diff", "weight", "se", "dse", "warning"):
        np.testing.assert_allclose(a[column].astype(float), b[column].astype(float), rtol=1e-9, atol=1e-9)


def test_long_heavy_tails_fit_without_an_overflow_warning():
    """A candidate shape far below the best makes exp() overflow in the profile weights; its weight is 0, and the
    log says nothing (the test's warnings are errors)."""
    tails = np.sort(np.random.default_rng(0).pareto(1.0, size=(1, 1000))) + 1e-6
    with np.errstate(over="raise"):
        k, sigma = psis._fit_gpd(tails)
    assert np.isfinite(k).all() and (sigma > 0).all()
