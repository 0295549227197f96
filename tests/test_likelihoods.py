"""The likelihood seam: each likelihood's labels, PyMC term, scores and prediction summary."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pymc as pm
import pytest
from scipy.special import logsumexp
from scipy.stats import nbinom, poisson

from hbnn.errors import InputError
from hbnn.model import likelihoods
from hbnn.model.likelihoods import QUANTILES, NegativeBinomial, Poisson

POISSON = Poisson()
NB = NegativeBinomial()


def test_every_likelihood_is_registered_and_complete():
    assert set(likelihoods.LIKELIHOODS) == {"bernoulli", "gaussian", "poisson", "negative_binomial"}
    for lik in likelihoods.LIKELIHOODS.values():
        assert lik.score == lik.score_keys[0] and lik.score_keys[-1] == "n"
        assert len(lik.surface_titles) == 2 and lik.description
    with pytest.raises(InputError, match="unknown likelihood 'beta'"):
        likelihoods.get("beta")


@pytest.mark.parametrize("bad", [-1.0, 1.5])
def test_poisson_labels_are_counts(bad):
    assert POISSON.check_labels(np.array([0.0, 3.0, 12.0]), "sales", "t").dtype == np.int64
    with pytest.raises(InputError, match=r"label column 'sales' must hold counts .* found \[" + str(bad)):
        POISSON.check_labels(np.array([0.0, bad]), "sales", "table t")


def test_poisson_term_is_the_poisson_log_density():
    y = np.array([0, 2, 7])
    with pm.Model(coords={"obs": range(3)}) as model:
        log_rate = pm.Normal("log_rate", shape=3)
        POISSON.add_observed(log_rate, y, noise_sd=1.0)
    at = np.array([-0.5, 0.3, 2.0])
    logp = model.compile_logp(vars=[model["y_obs"]], sum=True)({"log_rate": at})
    assert logp == pytest.approx(poisson.logpmf(y, np.exp(at)).sum(), rel=1e-10)


def test_poisson_scores_on_a_worked_example():
    rates = np.array([[[1.0, 4.0, 0.5], [3.0, 4.0, 0.5]]])  # (chain 1, draw 2, row 3)
    y = np.array([2, 9, 0])
    s = POISSON.scores(POISSON.pointwise(rates, None, y))
    assert s["rmse"] == pytest.approx(np.sqrt((0 + 25 + 0.25) / 3))  # mean rates 2, 4, 0.5
    lpd = [logsumexp(poisson.logpmf(y[i], rates[0, :, i])) - np.log(2) for i in range(3)]
    assert s["lpd"] == pytest.approx(np.mean(lpd), rel=1e-12)
    # 94% intervals of the mixtures: row 2 (rate 4) is [1, 8], so 9 falls outside; rows 1 and 3 are inside
    assert s["coverage_94"] == pytest.approx(2 / 3) and s["n"] == 3


def test_poisson_intervals_are_the_mixture_quantiles():
    rates = np.random.default_rng(0).gamma(2.0, 3.0, size=(40, 5))
    ks = np.arange(200)
    cdf = np.array([poisson.cdf(k, rates).mean(axis=0) for k in ks])
    expected = [[ks[np.argmax(cdf[:, i] >= q)] for i in range(5)] for q in QUANTILES]
    np.testing.assert_array_equal(POISSON.quantiles(rates, QUANTILES), expected)
    out = POISSON.summarise(rates, None)
    np.testing.assert_allclose(out["mean"], rates.mean(axis=0))
    np.testing.assert_allclose(out["sd"] ** 2, rates.var(axis=0) + rates.mean(axis=0))  # law of total variance


def _nb(y, mu, alpha):
    """scipy's negative binomial with mean ``mu`` and dispersion ``alpha`` (variance ``mu + mu**2 / alpha``)."""
    return nbinom(alpha, alpha / (alpha + mu))


def test_negative_binomial_term_is_the_negative_binomial_log_density():
    y = np.array([0, 2, 7, 130])
    with pm.Model(coords={"obs": range(4)}) as model:
        log_mu = pm.Normal("log_mu", shape=4)
        NB.add_observed(log_mu, y, noise_sd=2.0)
    at, alpha = np.array([-0.5, 0.3, 2.0, 4.5]), 1.7
    logp = model.compile_logp(vars=[model["y_obs"]], sum=True)({"log_mu": at, "alpha_log__": np.log(alpha)})
    assert logp == pytest.approx(_nb(y, np.exp(at), alpha).logpmf(y).sum(), rel=1e-10)
    assert NB.log_density(np.exp(at)[None], np.array([alpha]), y)[0] == pytest.approx(
        _nb(y, np.exp(at), alpha).logpmf(y), rel=1e-10)
    assert NB.extra == "alpha" and "alpha" in model.named_vars


def test_negative_binomial_labels_are_counts():
    assert NB.check_labels(np.array([0.0, 3.0]), "sales", "t").dtype == np.int64
    with pytest.raises(InputError, match="must hold counts .* for model.likelihood=negative_binomial; found"):
        NB.check_labels(np.array([0.5]), "sales", "t")


def test_negative_binomial_scores_intervals_and_summary_are_the_mixtures():
    rng = np.random.default_rng(4)
    rates = rng.gamma(2.0, 3.0, size=(1, 40, 5))
    alpha = rng.uniform(0.5, 4.0, size=(1, 40))
    y = np.array([0, 3, 9, 30, 2])
    flat, a = rates.reshape(40, 5), alpha.reshape(40)
    ks = np.arange(400)
    cdf = np.array([_nb(k, flat, a[:, None]).cdf(k).mean(axis=0) for k in ks])
    expected = [[ks[np.argmax(cdf[:, i] >= q)] for i in range(5)] for q in QUANTILES]
    np.testing.assert_array_equal(NB.quantiles(flat, QUANTILES, a), expected)
    s = NB.scores(NB.pointwise(rates, alpha, y))
    lpd = [logsumexp(_nb(y[i], flat[:, i], a).logpmf(y[i])) - np.log(40) for i in range(5)]
    assert s["lpd"] == pytest.approx(np.mean(lpd), rel=1e-12)
    assert s["rmse"] == pytest.approx(np.sqrt(np.mean((y - flat.mean(axis=0)) ** 2)))
    lo, hi = np.array(expected)
    assert s["coverage_94"] == pytest.approx(np.mean((lo <= y) & (y <= hi)))
    out = NB.summarise(flat, a)
    np.testing.assert_allclose(out["sd"] ** 2, flat.var(axis=0) + (flat + flat**2 / a[:, None]).mean(axis=0))
    assert (out["lower_94"] == np.round(out["lower_94"])).all() and (out["upper_94"] >= out["lower_94"]).all()


def test_negative_binomial_predictive_draws_have_its_mean_and_variance():
    rng = np.random.default_rng(5)
    mu, alpha = np.full((2, 20000, 1), 6.0), np.full((2, 20000), 1.5)
    draws = NB.predictive_draws(mu, alpha, rng)
    assert draws.shape == mu.shape and draws.dtype.kind == "i"
    assert draws.mean() == pytest.approx(6.0, rel=0.02)
    assert draws.var() == pytest.approx(6.0 + 36.0 / 1.5, rel=0.05)


@pytest.mark.parametrize("name", sorted(likelihoods.LIKELIHOODS))
def test_summary_arrays_bound_the_memory_of_summarising(name):
    """What hbnn predict's chunks are sized by: summarising (draw, row) arrays holds at most summary_arrays of them
    at once, one kept spare for the predictions beside them."""
    lik = likelihoods.get(name)
    rng = np.random.default_rng(6)
    samples, rows = 2000, 64
    if lik.classifier:
        draws = rng.uniform(0.01, 0.99, (samples, rows))
    elif lik.standardise_labels:
        draws = rng.normal(size=(samples, rows))
    else:
        draws = np.exp(rng.normal(1.0, 0.5, (samples, rows)))
    noise = rng.uniform(0.5, 3.0, samples) if lik.extra else None
    lik.summarise(draws[:, :2], noise)  # imports and caches first: they are not the arrays' memory
    tracemalloc.start()
    lik.summarise(draws, noise)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak <= (lik.summary_arrays - 1) * draws.nbytes
