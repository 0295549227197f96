"""Pareto-smoothed importance sampling leave-one-out cross-validation (PSIS-LOO), without ArviZ.

Vehtari, Gelman & Gabry (2017) and Vehtari et al. (2024): each training row's
leave-one-out predictive density is estimated by importance sampling the
posterior draws with ratios ``1 / p(y_i | draw)``, whose largest ratios are
replaced by the quantiles of a generalised Pareto distribution fitted to them
(Zhang & Stephens' empirical Bayes fit, with a weak prior on its shape ``k``).
``k`` is the estimate's own diagnostic: above ``min(1 - 1/log10(S), 0.7)`` for
``S`` draws the row's estimate is unreliable.

The numbers follow ArviZ 0.23's ``az.loo`` (``tests/test_psis.py`` compares
them); importing ArviZ for this function alone would cost every fit stage seconds (benchmarks/FINDINGS.md,
"Measurements behind code comments").
:meth:`Loo.to_arviz` gives ArviZ's ``ELPDData`` where ``az.compare`` needs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Log of the smallest normal float: a tail cut-off below it would lose the body's weights to underflow.
_LOG_TINY = float(np.log(np.finfo(float).tiny))
_EPS = float(np.finfo(float).eps)


def good_k(n_samples: int) -> float:
    """The Pareto ``k`` above which a row's PSIS estimate is unreliable.

    Parameters
    ----------
    n_samples : int
        The posterior draws behind the estimate.

    Returns
    -------
    float
        ``min(1 - 1/log10(n_samples), 0.7)``.
    """
    return min(1 - 1 / math.log10(n_samples), 0.7)


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = np.max(x, axis=axis, keepdims=True)
    return np.log(np.exp(x - top).sum(axis=axis)) + np.squeeze(top, axis=axis)


def _fit_gpd(tails: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shape ``k`` and scale ``sigma`` of a generalised Pareto distribution fitted to each row of ``tails``
    (sorted, positive exceedances; rows of one length): the posterior mean of ``b = -k / sigma`` over a grid of
    candidates weighted by their profile likelihood, then ``k`` shrunk towards 0.5 by a prior worth 10
    observations."""
    n = tails.shape[1]
    m = 30 + int(n**0.5)
    b = 1 - np.sqrt(m / (np.arange(1, m + 1, dtype=float) - 0.5))
    b = b / (3 * tails[:, int(n / 4 + 0.5) - 1, None]) + 1 / tails[:, -1, None]  # (row, m)
    k = np.log1p(-b[:, :, None] * tails[:, None, :]).mean(axis=2)
    profile = n * (np.log(-(b / k)) - k - 1)
    with np.errstate(over="ignore"):  # a candidate far below the best overflows to inf: its weight is 1 / inf = 0
        weights = 1 / np.exp(profile[:, None, :] - profile[:, :, None]).sum(axis=2)
    weights = np.where(weights >= 10 * _EPS, weights, 0.0)  # negligible candidates left out
    weights /= weights.sum(axis=1, keepdims=True)
    b_mean = np.sum(b * weights, axis=1)
    k_mean = np.log1p(-b_mean[:, None] * tails).mean(axis=1)
    sigma = -k_mean / b_mean
    return (n * k_mean + 10 * 0.5) / (n + 10), sigma


def _gpd_quantiles(probs: np.ndarray, k: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Quantiles of the generalised Pareto distributions of shapes ``k`` and scales ``sigma`` (per row) at
    ``probs`` (all strictly inside (0, 1)); NaN where a scale is not positive."""
    k, sigma = k[:, None], sigma[:, None]
    tiny = np.abs(k) < _EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(tiny, -np.log1p(-probs), np.expm1(-k * np.log1p(-probs)) / np.where(tiny, 1.0, k)) * sigma
    return np.where(sigma > 0, x, np.nan)


def _smooth_rows(x: np.ndarray, cut: int) -> np.ndarray:
    """Pareto ``k`` of every row of ``x`` (log ratios less each row's maximum, smoothed in place): the largest
    ``cut`` ratios of a row form its tail (fewer where ties sit at the cut-off, and none when under 5 remain:
    then ``k`` is infinite and nothing is smoothed). Rows whose tail holds exactly ``cut`` ratios, nearly all of
    them, are fitted together; the others one by one."""
    order = np.argsort(x, axis=1)
    sorted_x = np.take_along_axis(x, order, axis=1)
    threshold = np.maximum(sorted_x[:, -cut - 1], _LOG_TINY)
    sizes = (x > threshold[:, None]).sum(axis=1)
    k = np.full(x.shape[0], math.inf)
    regular = np.flatnonzero(sizes == cut) if cut > 4 else np.zeros(0, dtype=int)
    for rows in np.array_split(regular, max(1, regular.size // 128)):  # (rows, m, cut) floats at a time
        if rows.size:
            k[rows] = _smooth_tails(x, rows, order[rows, -cut:], sorted_x[rows, -cut:], threshold[rows])
    for r in np.flatnonzero((sizes != cut) & (sizes > 4)):
        (at,) = np.nonzero(x[r] > threshold[r])
        inner = np.argsort(x[r, at])
        k[r] = _smooth_tails(x, np.array([r]), at[inner][None], x[r, at][inner][None], threshold[[r]])[0]
    return k


def _smooth_tails(x: np.ndarray, rows: np.ndarray, at: np.ndarray, tail: np.ndarray, threshold: np.ndarray
                  ) -> np.ndarray:
    """Fit the tails ``tail`` (sorted log ratios at columns ``at`` of ``rows``, above ``threshold``) and put their
    smoothed values into ``x`` (capped at the largest raw ratio, 0) where the fit is finite; returns ``k``."""
    base = np.exp(threshold)[:, None]
    k, sigma = _fit_gpd(np.exp(tail) - base)
    n = tail.shape[1]
    smoothed = np.minimum(np.log(_gpd_quantiles(np.arange(0.5, n) / n, k, sigma) + base), 0.0)
    ok = np.isfinite(k)
    block = x[rows]
    np.put_along_axis(block, at, np.where(ok[:, None], smoothed, np.take_along_axis(block, at, axis=1)), axis=1)
    x[rows] = block
    return k


def smoothed_log_weights(log_ratios: np.ndarray, reff: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Pareto-smoothed importance sampling of each row's log ratios.

    The tail holds the largest ``min(S / 5, 3 sqrt(S / reff))`` ratios (rounded up) of a row.

    Parameters
    ----------
    log_ratios : numpy.ndarray
        Log importance ratios ``(n, S)``.
    reff : float, optional
        The draws' relative efficiency (ESS / S).

    Returns
    -------
    tuple of numpy.ndarray
        Each row's normalised, smoothed log weights ``(n, S)`` and Pareto ``k`` ``(n,)``.
    """
    x = np.array(log_ratios, dtype=float)
    S = x.shape[-1]
    cut = int(np.ceil(min(S / 5.0, 3 * (S / reff) ** 0.5)))
    x -= x.max(axis=1, keepdims=True)
    k = _smooth_rows(x, cut)
    return x - _logsumexp(x, axis=1)[:, None], k


@dataclass(frozen=True)
class Loo:
    """A PSIS-LOO estimate on the log scale.

    Parameters
    ----------
    elpd_loo : float
        The sum of the rows' leave-one-out log predictive densities.
    se : float
        Its standard error.
    p_loo : float
        The effective number of parameters.
    loo_i : numpy.ndarray
        Per row, the leave-one-out log predictive density.
    pareto_k : numpy.ndarray
        Per row, the Pareto ``k`` diagnostic.
    n_samples : int
        The posterior draws behind the estimate.
    """

    elpd_loo: float
    se: float
    p_loo: float
    loo_i: np.ndarray
    pareto_k: np.ndarray
    n_samples: int

    @property
    def n_data_points(self) -> int:
        """The number of rows."""
        return int(self.loo_i.size)

    @property
    def good_k(self) -> float:
        """The ``k`` above which a row's estimate is unreliable (:func:`good_k`)."""
        return good_k(self.n_samples)

    @property
    def warning(self) -> bool:
        """Does any row's ``k`` exceed :attr:`good_k`?"""
        return bool((self.pareto_k > self.good_k).any())

    def to_arviz(self):
        """The same estimate as ArviZ's ``ELPDData``, for ``az.compare`` and ``az.plot_compare``.

        Returns
        -------
        arviz.ELPDData
            What ``az.loo(..., pointwise=True)`` returns.
        """
        import xarray as xr
        from arviz.stats.stats_utils import ELPDData

        return ELPDData(
            data=[self.elpd_loo, self.se, self.p_loo, self.n_samples, self.n_data_points, self.warning,
                  xr.DataArray(self.loo_i, dims=["obs"], name="loo_i"),
                  xr.DataArray(self.pareto_k, dims=["obs"], name="pareto_shape"), "log", self.good_k],
            index=["elpd_loo", "se", "p_loo", "n_samples", "n_data_points", "warning", "loo_i", "pareto_k", "scale",
                   "good_k"],
        )


def loo(log_lik: np.ndarray, reff: float = 1.0) -> Loo:
    """PSIS-LOO of a pointwise log-likelihood.

    Parameters
    ----------
    log_lik : numpy.ndarray
        The pointwise log-likelihood ``(chain, draw, n)``.
    reff : float, optional
        The draws' relative efficiency (ESS / S).

    Returns
    -------
    Loo
        The estimate.
    """
    log_lik = np.asarray(log_lik, dtype=float)
    S = log_lik.shape[0] * log_lik.shape[1]
    rows = log_lik.reshape(S, -1).T  # (n, S), draws in chain-major order
    weights, k = smoothed_log_weights(-rows, reff)
    loo_i = _logsumexp(weights + rows, axis=1)
    lppd = float(np.sum(_logsumexp(rows, axis=1) - math.log(S)))
    elpd = float(loo_i.sum())
    return Loo(elpd_loo=elpd, se=float((loo_i.size * np.var(loo_i)) ** 0.5), p_loo=lppd - elpd, loo_i=loo_i,
               pareto_k=k, n_samples=S)
