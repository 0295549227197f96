"""ArviZ's rank-normalised split R-hat and bulk / tail ESS for many quantities at once.

``az.rhat`` and ``az.ess`` loop over quantities in Python and rank each with ``scipy.stats.rankdata``, which made
the function-space diagnostics the slowest part of a many-group fit stage (benchmarks/FINDINGS.md, "Measurements
behind code comments"). These functions take ``(chain, draw, quantity)`` arrays and do the ranking, the
autocovariances and the variance terms for all quantities together; only Geyer's initial monotone sequence, a short
scalar loop, runs per quantity. They follow ArviZ 0.23 (``arviz/stats/diagnostics.py``) step by step, including its
NaN results, and ``tests/test_convergence.py`` checks them against ArviZ to 1e-10.
"""

from __future__ import annotations

import numba
import numpy as np
from scipy.fft import next_fast_len
from scipy.special import ndtri

MIN_DRAWS = 4  # ArviZ's least draws per chain for a diagnostic: fewer give NaN, as there
TAIL_PROBS = (0.05, 0.95)  # ArviZ's tail ESS quantiles, so the values agree with az.ess(method="tail")


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of each column, ties given their average rank (``rankdata(method="average")``).

    Parameters
    ----------
    x : numpy.ndarray
        Values ``(n, k)``.

    Returns
    -------
    numpy.ndarray
        The ranks, ``(n, k)``.
    """
    n = x.shape[0]
    # Each column's values contiguous (a row of the transpose): sorting and scattering them there is several
    # times faster than across columns. Any sort will do: tied values are neighbours in every sorted order and
    # share one average rank, so numpy's default (vectorised) sort is used, faster than its stable one
    # (benchmarks/FINDINGS.md, "Measurements behind code comments").
    columns = np.ascontiguousarray(x.T)
    order = np.argsort(columns, axis=1)
    ordered = np.take_along_axis(columns, order, axis=1)
    new = np.ones(ordered.shape, dtype=bool)  # first position of each run of equal values
    new[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    if new.all():  # no ties (continuous draws): the ranks are the positions
        ranked = np.broadcast_to(np.arange(1.0, n + 1.0), ordered.shape)
    else:
        last = np.ones(ordered.shape, dtype=bool)  # last position of each run
        last[:, :-1] = new[:, 1:]
        pos = np.arange(n)
        first_pos = np.maximum.accumulate(np.where(new, pos, 0), axis=1)
        last_pos = np.minimum.accumulate(np.where(last, pos, n)[:, ::-1], axis=1)[:, ::-1]
        ranked = (first_pos + last_pos) / 2.0 + 1.0
    ranks = np.empty(columns.shape)
    np.put_along_axis(ranks, order, ranked, axis=1)
    return np.ascontiguousarray(ranks.T)  # the callers' layout, so their sums and FFTs add in the same order


def _split_chains(x: np.ndarray) -> np.ndarray:
    """Each chain's first and last ``draw // 2`` draws as two chains."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half:]], axis=0)


def _z_scale(x: np.ndarray) -> np.ndarray:
    """Normal scores of the pooled ranks (Blom offset 3/8), per quantity."""
    return _normal_scores(x, folded=False)[0]


def _normal_scores(x: np.ndarray, folded: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`_z_scale` of ``x (chain, draw, quantity)`` and, with ``folded``, of its distances from each quantity's
    median (``np.abs(x - np.median(x, axis=(0, 1)))``, the folded R-hat's draws), from one sort per quantity.

    The same numbers as ranking each with :func:`average_ranks` and taking ``ndtri`` of every rank, at ~2.5x less
    cost (a hierarchical fit's looks, every per-group fit's check): a rank's normal score is looked up in a table
    of every rank there can be (average ranks of ties are halves), and the distances from the median need no
    sort of their own: below the median they fall as the draws rise, above it they rise, so merging the two runs
    of the sorted draws orders them (``tests/test_convergence.py`` checks both against the ranking, bit for bit)."""
    c, n, k = x.shape
    total = c * n
    columns = np.ascontiguousarray(x.reshape(total, k).T)
    order = np.argsort(columns, axis=1)
    # every average rank r is j / 2 for an integer j (ties: the mean of two positions), 1 <= r <= total
    table = ndtri((np.arange(2, 2 * total + 1) / 2.0 - 3 / 8) / (total - 2 * 3 / 8 + 1))
    bulk = np.empty(columns.shape)
    far = np.empty(columns.shape) if folded else bulk[:0]
    infinite = np.zeros(k, dtype=np.bool_)
    _scores(columns, order, table, bulk, far, folded, infinite)
    for i in np.flatnonzero(infinite):  # an infinite median: distances of NaN (inf - inf), ranked last, as before
        with np.errstate(invalid="ignore"):
            distances = np.abs(columns[i] - np.median(columns[i]))
        far[i] = ndtri((average_ranks(distances[:, None])[:, 0] - 3 / 8) / (total - 2 * 3 / 8 + 1))
    return (np.ascontiguousarray(bulk.T).reshape(c, n, k),
            np.ascontiguousarray(far.T).reshape(c, n, k) if folded else None)


@numba.njit(cache=True, nogil=True)
def _scores(columns, order, table, bulk, far, folded, infinite):
    """Each row of ``columns``: the normal score of its values' average ranks into ``bulk``, and with ``folded`` of
    their distances from the row's median into ``far`` (see :func:`_normal_scores`); ``order`` sorts each row. A row
    whose median is infinite is marked in ``infinite`` and its distances left to the caller (some are NaN)."""
    k, total = columns.shape
    values = np.empty(total)
    distance = np.empty(total)
    at = np.empty(total, dtype=np.int64)
    for i in range(k):
        for p in range(total):
            values[p] = columns[i, order[i, p]]
        _assign(values, order[i], table, bulk[i])
        if not folded:
            continue
        half = total // 2  # np.median: the middle value, or the mean of the middle two
        median = values[half] if total % 2 else (values[half - 1] + values[half]) / 2.0
        if not np.isfinite(median):
            infinite[i] = True
            continue
        below = 0  # draws under the median come first; their distances grow as they fall
        while below < total and values[below] < median:
            below += 1
        lo, hi = below - 1, below
        for p in range(total):
            if hi >= total or (lo >= 0 and abs(values[lo] - median) <= abs(values[hi] - median)):
                distance[p] = abs(values[lo] - median)
                at[p] = order[i, lo]
                lo -= 1
            else:
                distance[p] = abs(values[hi] - median)
                at[p] = order[i, hi]
                hi += 1
        _assign(distance, at, table, far[i])


@numba.njit(cache=True, nogil=True, inline="always")
def _assign(ordered, positions, table, out):
    """``out[positions[p]]``: the normal score of ``ordered[p]``'s average rank, ``ordered`` sorted (runs of equal
    values share the mean of their positions, as :func:`average_ranks`)."""
    total = ordered.size
    start = 0
    while start < total:
        end = start
        while end + 1 < total and ordered[end + 1] == ordered[start]:
            end += 1
        score = table[start + end]  # rank (start + end) / 2 + 1, i.e. j = start + end + 2, at j - 2
        for p in range(start, end + 1):
            out[positions[p]] = score
        start = end + 1


def _rhat(x: np.ndarray) -> np.ndarray:
    n = x.shape[1]
    between = n * np.var(x.mean(axis=1), axis=0, ddof=1)
    within = np.var(x, axis=1, ddof=1).mean(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sqrt((between / within + n - 1) / n)


def _geyer_tau(rho: np.ndarray, n: int, total: int) -> float:
    """Integrated autocorrelation time from autocorrelations ``rho (lag,)``, as ArviZ's ``_ess``."""
    rho_t = np.zeros(n)
    even, odd = 1.0, rho[1]
    rho_t[0], rho_t[1] = even, odd
    t = 1
    while t < n - 3 and even + odd > 0.0:  # initial positive sequence
        even, odd = rho[t + 1], rho[t + 2]
        if even + odd >= 0:
            rho_t[t + 1], rho_t[t + 2] = even, odd
        t += 2
    max_t = t - 2
    if even > 0:
        rho_t[max_t + 1] = even
    t = 1
    while t <= max_t - 2:  # initial monotone sequence
        if rho_t[t + 1] + rho_t[t + 2] > rho_t[t - 1] + rho_t[t]:
            rho_t[t + 1] = rho_t[t + 2] = (rho_t[t - 1] + rho_t[t]) / 2.0
        t += 2
    if np.isnan(rho_t).any():
        return np.nan
    tau = -1.0 + 2.0 * rho_t[: max_t + 1].sum() + rho_t[max_t + 1: max_t + 2].sum()
    return max(tau, 1 / np.log10(total))


def _ess(x: np.ndarray) -> np.ndarray:
    """Effective sample size of each quantity of ``x (chain, draw, quantity)``."""
    x = np.asarray(x, dtype=float)
    c, n, k = x.shape
    m = next_fast_len(2 * n)
    centred = x - x.mean(axis=1, keepdims=True)
    f = np.fft.rfft(centred, n=m, axis=1)
    acov = np.fft.irfft(f * np.conjugate(f), n=m, axis=1)[:, :n] / n  # (chain, lag, quantity)
    mean_var = acov[:, 0].mean(axis=0) * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if c > 1:
        var_plus = var_plus + np.var(x.mean(axis=1), axis=0, ddof=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = 1.0 - (mean_var - acov.mean(axis=0)) / var_plus  # (lag, quantity)
    total = c * n
    ess = np.array([total / _geyer_tau(rho[:, i], n, total) for i in range(k)])
    constant = x.max(axis=(0, 1)) - x.min(axis=(0, 1)) < np.finfo(float).resolution
    return np.where(constant, float(total), ess)


def _per_quantity(x: np.ndarray, min_chains: int, statistic) -> np.ndarray:
    """``statistic`` of the quantities ArviZ accepts; NaN for the others (any NaN value, or too few chains or draws)."""
    x = np.asarray(x, dtype=float)
    out = np.full(x.shape[2], np.nan)
    ok = ~np.isnan(x).any(axis=(0, 1)) & (x.shape[0] >= min_chains) & (x.shape[1] >= MIN_DRAWS)
    if ok.any():
        out[ok] = statistic(x[..., ok])
    return out


def _rhat_split(z: np.ndarray, z_folded: np.ndarray) -> np.ndarray:
    """Rank-normalised R-hat of split chains from their normal scores and their distances' (:func:`_normal_scores`)."""
    return np.fmax(_rhat(z), _rhat(z_folded))


def _rhat_rank(x: np.ndarray) -> np.ndarray:
    return _rhat_split(*_normal_scores(_split_chains(x)))


def _ess_tail(x: np.ndarray) -> np.ndarray:
    pooled = x.reshape(-1, x.shape[2])
    low, high = (_ess(_split_chains(x <= np.quantile(pooled, q, axis=0))) for q in TAIL_PROBS)
    return np.where(high < low, high, low)  # Python's min(low, high), NaN handling included


def rhat(x: np.ndarray) -> np.ndarray:
    """Rank-normalised split R-hat (max of bulk and folded) per quantity; ``az.rhat``'s default.

    Parameters
    ----------
    x : numpy.ndarray
        Draws ``(chain, draw, quantity)``.

    Returns
    -------
    numpy.ndarray
        R-hat per quantity; NaN where ArviZ gives NaN (fewer than 2 chains, too few draws, a NaN value).
    """
    return _per_quantity(x, 2, _rhat_rank)


def ess_bulk(x: np.ndarray) -> np.ndarray:
    """Bulk ESS (rank-normalised, split chains) per quantity; ``az.ess(method="bulk")``.

    Parameters
    ----------
    x : numpy.ndarray
        Draws ``(chain, draw, quantity)``.

    Returns
    -------
    numpy.ndarray
        Bulk ESS per quantity; NaN where ArviZ gives NaN.
    """
    return _per_quantity(x, 1, lambda y: _ess(_z_scale(_split_chains(y))))


def rhat_and_ess_bulk(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rhat` and :func:`ess_bulk` of ``x`` together: both rank the same split chains, ranked here once.

    Parameters
    ----------
    x : numpy.ndarray
        Draws ``(chain, draw, quantity)``.

    Returns
    -------
    tuple of numpy.ndarray
        R-hat and bulk ESS per quantity, as the two functions give them.
    """
    x = np.asarray(x, dtype=float)
    rhat_out, bulk_out = np.full(x.shape[2], np.nan), np.full(x.shape[2], np.nan)
    ok = ~np.isnan(x).any(axis=(0, 1)) & (x.shape[1] >= MIN_DRAWS)
    if ok.any():
        z, z_folded = _normal_scores(_split_chains(x[..., ok]), folded=x.shape[0] >= 2)
        bulk_out[ok] = _ess(z)
        if z_folded is not None:
            rhat_out[ok] = _rhat_split(z, z_folded)
    return rhat_out, bulk_out


def ess_mean(x: np.ndarray) -> np.ndarray:
    """ESS of the mean (split chains, not rank-normalised) per quantity; ``az.ess(method="mean")``.

    Parameters
    ----------
    x : numpy.ndarray
        Draws ``(chain, draw, quantity)``.

    Returns
    -------
    numpy.ndarray
        ESS of the mean per quantity; NaN where ArviZ gives NaN.
    """
    return _per_quantity(x, 1, lambda y: _ess(_split_chains(y)))


def ess_tail(x: np.ndarray) -> np.ndarray:
    """Tail ESS: the smaller ESS of the 5% and 95% quantile indicators; ``az.ess(method="tail")``.

    Parameters
    ----------
    x : numpy.ndarray
        Draws ``(chain, draw, quantity)``.

    Returns
    -------
    numpy.ndarray
        Tail ESS per quantity; NaN where ArviZ gives NaN.
    """
    return _per_quantity(x, 1, _ess_tail)
