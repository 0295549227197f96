"""The likelihood seam: each likelihood's labels, PyMC term, scores and prediction summary."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from scipy.special import logsumexp
from scipy.stats import poisson

from hbnn.errors import InputError
from hbnn.model import likelihoods
from hbnn.model.likelihoods import QUANTILES, Poisson

POISSON = Poisson()


def test_every_likelihood_is_registered_and_complete():
    assert set(likelihoods.LIKELIHOODS) == {"bernoulli", "gaussian", "poisson"}
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
