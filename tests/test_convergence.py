"""The vectorised diagnostics reproduce ArviZ's, quantity by quantity."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pytest
import xarray as xr
from scipy.stats import rankdata

from hbnn.diagnostics import convergence


def _ar1(rng, chains, draws, k, phi):
    x = np.zeros((chains, draws, k))
    e = rng.normal(size=(chains, draws, k))
    for t in range(1, draws):
        x[:, t] = phi * x[:, t - 1] + e[:, t]
    return x


def _arviz(x):
    ds = xr.Dataset({"q": (("chain", "draw", "quantity"), x)})
    with warnings.catch_warnings():  # ArviZ warns on the constant and NaN columns
        warnings.simplefilter("ignore")
        return (az.rhat(ds)["q"].values, az.ess(ds, method="bulk")["q"].values,
                az.ess(ds, method="tail")["q"].values, az.ess(ds, method="mean")["q"].values)


@pytest.mark.parametrize("chains, draws, phi", [(2, 1000, 0.9), (2, 101, 0.5), (4, 50, 0.99), (2, 400, -0.3),
                                                (1, 200, 0.7), (2, 12, 0.2), (2, 3, 0.0)])
def test_matches_arviz(chains, draws, phi):
    rng = np.random.default_rng(chains * 1000 + draws)
    x = _ar1(rng, chains, draws, 12, phi)
    x[:, :, 0] = 0.5  # constant
    x[-1, :, 1] += 3.0  # the last chain in another mode
    x[:, :, 2] = np.clip(1 / (1 + np.exp(-3 * x[:, :, 2])), None, 0.9)  # saturated: many exact ties
    x[:, :, 3] = np.round(x[:, :, 3])  # a few distinct values
    x[0, 0, 4] = np.nan
    ours = convergence.rhat(x), convergence.ess_bulk(x), convergence.ess_tail(x), convergence.ess_mean(x)
    for name, got, want in zip(("rhat", "ess_bulk", "ess_tail", "ess_mean"), ours, _arviz(x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, equal_nan=True, err_msg=name)
    # the two that share one ranking, computed together, are the same numbers
    for got, want in zip(convergence.rhat_and_ess_bulk(x), ours[:2], strict=True):
        np.testing.assert_array_equal(got, want)
    assert np.isnan(ours[0][4]) and np.isnan(ours[1][4])  # NaN in, NaN out
    if chains == 1 or draws < 4:
        assert np.isnan(ours[0]).all()


def test_average_ranks_equal_scipy_with_ties():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 5, size=(40, 6)).astype(float)
    x[:, 5] = rng.normal(size=40)
    np.testing.assert_array_equal(convergence.average_ranks(x), rankdata(x, axis=0, method="average"))


def test_average_ranks_equal_scipy_without_ties_and_keep_the_callers_layout():
    # the no-ties shortcut (continuous draws: the ranks are the sorted positions), and a C-contiguous result as the
    # callers' sums and FFTs expect, whatever x's own layout
    x = np.random.default_rng(4).normal(size=(300, 9))
    for values in (x, np.asfortranarray(x), x[::2]):
        ranks = convergence.average_ranks(values)
        np.testing.assert_array_equal(ranks, rankdata(values, axis=0, method="average"))
        assert ranks.flags["C_CONTIGUOUS"]


@pytest.mark.parametrize("chains, draws", [(4, 500), (4, 51), (2, 6), (3, 7), (1, 9)])
def test_normal_scores_are_the_ranks_normal_scores_bit_for_bit(chains, draws):
    # the table lookup and the merged distances from the median give exactly what ranking every draw (and every
    # distance) and taking ndtri of each rank gives, ties included: the diagnostics do not move by a bit
    from scipy.special import ndtri

    rng = np.random.default_rng(chains * 100 + draws)
    x = rng.normal(size=(chains, draws, 9)).cumsum(axis=1) * 0.1 + rng.normal(size=(chains, draws, 9))
    x[:, :, 0] = 0.5  # constant: one run of ties
    x[:, :, 1] = np.round(x[:, :, 1] * 4) / 4  # few values, many equidistant from the median
    x[:, :, 2] = 1 / (1 + np.exp(-40 * x[:, :, 2]))  # probabilities saturating at exactly 0 and 1
    x[:, :, 3] = np.where(x[:, :, 3] > 0, 1.0, 0.0)
    x[:, :, 4] = np.sort(x[:, :, 4], axis=None).reshape(chains, draws)  # already sorted
    x[:, :, 5] = np.where(x[:, :, 5] > -0.3, np.inf, x[:, :, 5])  # an infinite median: NaN distances (inf - inf)
    x[:, :, 6] = np.where(x[:, :, 6] > 1.0, -np.inf, x[:, :, 6])  # infinite draws, a finite median
    total = chains * draws

    def scores(values):
        ranks = convergence.average_ranks(values.reshape(total, -1))
        return ndtri((ranks - 3 / 8) / (total - 2 * 3 / 8 + 1)).reshape(values.shape)

    bulk, folded = convergence._normal_scores(x)
    np.testing.assert_array_equal(bulk, scores(x))
    with np.errstate(invalid="ignore"):
        distances = np.abs(x - np.median(x, axis=(0, 1)))
    np.testing.assert_array_equal(folded, scores(distances))
    assert convergence._normal_scores(x, folded=False)[1] is None
