"""The convergence criterion ("the bar") applied to a fit, and what a fit's draws so far still miss.

**The bar** is the convergence criterion every fit is judged on (Stan and ArviZ practice):

- function-space rank-normalised split R-hat <= 1.01 (:data:`hbnn.config.RHAT_MAX`) and bulk ESS >= 400
  (:data:`hbnn.config.ESS_MIN`) on every group's test-point predictions;
- divergences <= 0.1% of the draws (:data:`hbnn.config.DIVERGENT_SHARE_MAX`);
- the same R-hat and ESS for the hierarchical group sds.

A group "meets the bar" when all of these hold for it (:func:`group_converged`). Convergence is judged in
function space, because weight space is symmetric under hidden-unit permutations and sign flips, so weight-space
R-hat says little. :class:`Shortfall` says what a fit's draws so far still miss; it is judged at each look of
run-length control (defined in :mod:`hbnn.sampling.runlength`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from hbnn.config import DIVERGENT_SHARE_MAX, ESS_MIN, RHAT_MAX  # the convergence bar
from hbnn.data.tasks import Tasks
from hbnn.diagnostics import convergence
from hbnn.diagnostics.predictions import _test_draws
from hbnn.model.network import LayerSpec


def function_space_diagnostics(probs: np.ndarray) -> dict[str, float]:
    """Max rank-normalised split R-hat and min bulk ESS over prediction points: what the bar judges.

    The values equal ArviZ's (``az.rhat``, ``az.ess``), computed for all points at once
    (:mod:`hbnn.diagnostics.convergence`).

    Parameters
    ----------
    probs : numpy.ndarray
        Draws of the predictions, ``(chain, draw, point)``.

    Returns
    -------
    dict of str to float
        ``max_rhat`` (NaN with fewer than 2 chains, as in ArviZ) and ``min_ess_bulk``.
    """
    rhat, bulk = convergence.rhat_and_ess_bulk(probs)
    # NaN where every value is NaN (R-hat of one chain), as np.nanmax gives it, without its warning: no
    # warnings.catch_warnings here, which would swap the process's filters while score_fit's PSIS thread runs
    return {"max_rhat": _nan_extreme(rhat, np.max), "min_ess_bulk": _nan_extreme(bulk, np.min)}


def _nan_extreme(values: np.ndarray, extreme) -> float:
    """``extreme`` (``np.max``, ``np.min``) of the values that are not NaN, NaN where there are none."""
    kept = values[~np.isnan(values)]
    return float(extreme(kept)) if kept.size else float("nan")


def distinct_chains(probs: np.ndarray) -> dict[str, float] | None:
    """Evidence that a group's chains settled in distinct functions rather than mixing slowly.

    At the point with the largest R-hat, each chain's mean and its Monte Carlo standard error
    (sd / sqrt(the chain's own bulk ESS)) are compared: the chains are distinct when two means lie more
    than :data:`DISTINCT_SIGMA` standard errors apart while every chain has at least
    :data:`DISTINCT_CHAIN_ESS` effective draws of its own (each chain is well sampled, they just sample
    different places).

    Parameters
    ----------
    probs : numpy.ndarray
        Draws of the predictions, ``(chain, draw, point)``.

    Returns
    -------
    dict or None
        The numbers behind the verdict (``rhat``, ``test_point``, ``chain_means``, ``chain_ess_bulk``,
        ``separation_sigma``), or ``None`` when the evidence is absent (fewer than 2 chains, or chains that
        are merely slow: more draws would fix those).
    """
    if probs.shape[0] < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rhat = convergence.rhat(probs)
    if not np.isfinite(rhat).any():
        return None
    i = int(np.nanargmax(rhat))
    x = probs[:, :, i]
    ess = convergence.ess_bulk(x.T[None])  # each chain as one quantity of a one-chain array
    means = x.mean(axis=1)
    se = x.std(axis=1, ddof=1) / np.sqrt(np.maximum(ess, 1.0))
    with np.errstate(invalid="ignore", divide="ignore"):  # two constant chains: 0/0
        sigma = float(np.nanmax(np.abs(means[:, None] - means[None, :]) / np.hypot(se[:, None], se[None, :]),
                                initial=0.0))
    if sigma < DISTINCT_SIGMA or ess.min() < DISTINCT_CHAIN_ESS:
        return None
    return {"rhat": float(rhat[i]), "test_point": i, "chain_means": {str(c): float(m) for c, m in enumerate(means)},
            "chain_ess_bulk": {str(c): float(e) for c, e in enumerate(ess)}, "separation_sigma": sigma}


def scalar_diagnostics(posterior: xr.Dataset, var_names: Sequence[str], tail: bool = True
                       ) -> dict[str, dict[str, float]]:
    """R-hat and ESS of scalar posterior variables (the hierarchical group sds), as ArviZ gives them.

    The values equal ``az.rhat`` and ``az.ess`` (:mod:`hbnn.diagnostics.convergence`).

    Parameters
    ----------
    posterior : xarray.Dataset
        The posterior draws, with ``chain`` and ``draw`` dimensions.
    var_names : sequence of str
        The scalar variables to diagnose.
    tail : bool, optional
        Whether to compute the tail ESS too (a look needs only R-hat and bulk ESS).

    Returns
    -------
    dict of str to dict
        Per variable: ``rhat``, ``ess_bulk`` and, with ``tail``, ``ess_tail``.
    """
    x = np.stack([posterior[v].transpose("chain", "draw").values for v in var_names], axis=-1)
    rhat, bulk = convergence.rhat_and_ess_bulk(x)
    tails = convergence.ess_tail(x) if tail else None
    return {v: {"rhat": float(rhat[i]), "ess_bulk": float(bulk[i]), **({"ess_tail": float(tails[i])} if tail else {})}
            for i, v in enumerate(var_names)}


DISTINCT_SIGMA = 4.0  # chain means this far apart in standard errors are not one function sampled slowly


DISTINCT_CHAIN_ESS = 100  # ... provided each chain has enough effective draws for its own standard error to hold


def group_converged(rhat: float | None, ess: float | None, divergences: int, draws: int,
                    advi: dict | None = None) -> bool:
    """Whether a group meets the bar.

    MCMC fits: function-space R-hat <= 1.01, bulk ESS >= 400 and divergences (of the fit the group's draws
    come from) <= 0.1% of ``draws``. ADVI fits are judged on what applies to them: their draws are
    independent draws from the approximation, so R-hat tests nothing (across thousands of quantities it
    exceeds 1.01 by chance alone) and there are no divergences; the bar is a loss no longer falling and bulk
    ESS >= 400 (Monte Carlo precision of the reported numbers).

    Parameters
    ----------
    rhat : float or None
        The group's function-space R-hat; ``None`` or NaN (one chain) does not meet the bar.
    ess : float or None
        The group's smallest function-space bulk ESS.
    divergences : int
        Divergences of the fit the group's draws come from.
    draws : int
        All draws of that fit (every chain).
    advi : dict or None, optional
        For an ADVI fit, :func:`advi_loss_trend`'s entry for the loss the group's draws come from.

    Returns
    -------
    bool
        Whether the group meets the bar.
    """
    if advi is not None:
        return bool(ess is not None and ess >= ESS_MIN and not advi["still_falling"])
    return bool(meets_bar(rhat, ess) and divergences_within_bar(divergences, draws))


def divergences_within_bar(divergences: int, draws: int) -> bool:
    """Whether at most 0.1% of the draws diverged: the divergence part of :func:`group_converged`'s bar.

    Parameters
    ----------
    divergences : int
        Divergent transitions of the fit.
    draws : int
        All draws of the fit (every chain).

    Returns
    -------
    bool
        ``divergences <= DIVERGENT_SHARE_MAX * draws``.
    """
    return bool(divergences <= DIVERGENT_SHARE_MAX * draws)


def sd_converged(diagnostics: dict, advi: bool = False) -> bool:
    """Whether a hierarchical group sd meets the bar.

    Parameters
    ----------
    diagnostics : dict
        The sd's ``rhat`` and ``ess_bulk`` (:func:`scalar_diagnostics`).
    advi : bool, optional
        Whether the draws are ADVI's independent draws: then only the ESS is judged, as
        :func:`group_converged` judges ADVI's groups.

    Returns
    -------
    bool
        Whether the sd meets the bar.
    """
    if advi:
        return bool((diagnostics.get("ess_bulk") or 0) >= ESS_MIN)
    return meets_bar(diagnostics.get("rhat"), diagnostics.get("ess_bulk"))


def meets_bar(rhat: float | None, ess: float | None) -> bool:
    """Whether R-hat <= 1.01 and bulk ESS >= 400: the MCMC part of :func:`group_converged`'s bar, for any quantity.

    Parameters
    ----------
    rhat : float or None
        The quantity's R-hat; ``None`` or NaN does not meet the bar.
    ess : float or None
        The quantity's bulk ESS.

    Returns
    -------
    bool
        Whether both meet the bar.
    """
    return bool(rhat is not None and np.isfinite(rhat) and rhat <= RHAT_MAX and ess is not None and ess >= ESS_MIN)


@dataclass(frozen=True)
class Shortfall:
    """What in a fit's draws misses the bar.

    Parameters
    ----------
    text : str
        What misses, as a log line says it, worst first.
    min_ess : float
        The smallest bulk ESS among the quantities that miss the bar (past :data:`hbnn.config.ESS_MIN` where
        only R-hat misses): a fit drawn until the bar is met estimates from it the draws it still needs.
    max_rhat : float, optional
        The largest R-hat among them, which says whether the chains sit in different places.
    rhat_of : str, optional
        The quantity with that R-hat.
    """

    text: str
    min_ess: float
    max_rhat: float = float("nan")
    rhat_of: str = ""

    def __str__(self) -> str:
        return self.text


def convergence_shortfall(tasks: Tasks, posterior: xr.Dataset, specs: Sequence[LayerSpec], activation: str,
                          scalar_vars: Sequence[str] = ()) -> Shortfall | None:
    """What in a joint fit's draws misses the R-hat and ESS part of the bar, worst first.

    The same numbers as the metrics', so a fit drawn until this says ``None`` reports every group converged
    unless its divergences miss the bar, which more draws do not mend.

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
        The groups' data, whose test points are judged.
    posterior : xarray.Dataset
        The joint fit's draws so far.
    specs : sequence of hbnn.model.network.LayerSpec
        The network's layers, to compute the test-point predictions.
    activation : str
        The hidden layers' activation.
    scalar_vars : sequence of str, optional
        Scalar variables judged too (e.g. the group sds).

    Returns
    -------
    Shortfall or None
        What misses the bar, or ``None`` when nothing does.
    """
    return _shortfall(tasks, _test_draws(tasks, posterior, specs, activation), posterior, scalar_vars)[0]


# A group this far past the bar at a look is unlikely to fall under it by the next, so it is evaluated again only
# once every other group meets the bar (:class:`ShortfallCheck`): at least this bulk ESS ...
COMFORT_ESS = 1.5 * ESS_MIN


COMFORT_RHAT = 1 + (RHAT_MAX - 1) / 2  # ... and at most this R-hat


class ShortfallCheck:
    """:func:`convergence_shortfall` for a fit drawn until it meets the bar, looking at ever longer prefixes.

    The test-point quantity of the draws seen at the last look is kept, so a look computes it for the new
    draws only. A posterior that does not start with the draws seen before (another run) is computed whole.

    R-hat and ESS are most of a look's cost, taken from the chains' cores (benchmarks/FINDINGS.md,
    "Measurements behind code comments"), so they are evaluated for every group at the first look; at later
    ones only for the groups that were not past the bar by a margin (:data:`COMFORT_ESS`,
    :data:`COMFORT_RHAT`) when last evaluated, and for the ``scalar_vars``. Once those meet the bar every
    group is evaluated again, so a fit stops only at a look where everything meets the bar. Where no group
    left out falls from the margin to under the bar between two such full looks, every look says what
    evaluating every group says, and the fit looks and stops where it would. Where one does, it is named at
    the next full look, and until then the next look (set by the smallest ESS short of the bar) and a restart
    of chains that only that group shows split (R-hat past :data:`hbnn.sampling.restarts.RESTART_RHAT`) wait
    for it; the group sds are evaluated at every look.

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
        The groups' data, whose test points are judged.
    specs : sequence of hbnn.model.network.LayerSpec
        The network's layers.
    activation : str
        The hidden layers' activation.
    scalar_vars : sequence of str, optional
        Scalar variables judged at every look (e.g. the group sds).

    Notes
    -----
    Calling the instance with the posterior so far returns what :func:`convergence_shortfall` would: a
    :class:`Shortfall`, or ``None`` when everything meets the bar.
    """

    def __init__(self, tasks: Tasks, specs: Sequence[LayerSpec], activation: str, scalar_vars: Sequence[str] = ()):
        self.tasks, self.specs, self.activation, self.scalar_vars = tasks, specs, activation, list(scalar_vars)
        self.draws: list[np.ndarray] | None = None  # per group, (chain, seen, n)
        self.last: np.ndarray | None = None  # the first weights' values at the last draw seen, to recognise a prefix
        self.watched: set[str] | None = None  # groups evaluated at every look (None: every group)

    def __call__(self, posterior: xr.Dataset) -> Shortfall | None:
        seen = 0 if self.draws is None else self.draws[0].shape[1]
        marker = posterior[self.specs[0].var]
        n = posterior.sizes["draw"]
        if not 0 < seen <= n or not np.array_equal(marker.isel(draw=seen - 1).values, self.last):
            seen, self.draws, self.watched = 0, None, None
        new = _test_draws(self.tasks, posterior.isel(draw=slice(seen, n)), self.specs, self.activation)
        self.draws = new if self.draws is None else [np.concatenate(p, axis=1) for p in zip(self.draws, new,
                                                                                           strict=True)]
        self.last = marker.isel(draw=n - 1).values
        numbers = {}
        if self.watched is not None:
            short, numbers = _shortfall(self.tasks, self.draws, posterior, self.scalar_vars, self.watched)
            if short is not None:
                self.watched = _near_the_bar(numbers)
                return short
        short, numbers = _shortfall(self.tasks, self.draws, posterior, self.scalar_vars, known=numbers)
        self.watched = _near_the_bar(numbers)
        return short


def _near_the_bar(numbers: dict[str, tuple[float, float]]) -> set[str]:
    """The groups of ``numbers`` (``name: (max R-hat, min bulk ESS)``) not past the bar by the margin."""
    return {name for name, (rhat, ess) in numbers.items()
            if not (np.isfinite(rhat) and rhat <= COMFORT_RHAT and ess >= COMFORT_ESS)}


def _shortfall(tasks: Tasks, test_draws: Sequence[np.ndarray], posterior: xr.Dataset, scalar_vars: Sequence[str],
               groups: set[str] | None = None, known: dict[str, tuple[float, float]] | None = None
               ) -> tuple[Shortfall | None, dict[str, tuple[float, float]]]:
    """What misses the bar among ``groups`` (default: all) and the ``scalar_vars``, and each evaluated group's
    test-point ``(max R-hat, min bulk ESS)``; ``known``: those numbers of some groups at these draws already."""
    misses, numbers = [], {}
    for name, draws in zip(tasks.group_names, test_draws, strict=True):
        if draws.shape[2] and (groups is None or name in groups):
            if known and name in known:
                numbers[name] = known[name]
            else:
                d = function_space_diagnostics(draws)
                numbers[name] = (d["max_rhat"], d["min_ess_bulk"])
            misses.append((name, "test-point", *numbers[name]))
    for var, d in (scalar_diagnostics(posterior, scalar_vars, tail=False) if scalar_vars else {}).items():
        misses.append((var, "", d["rhat"], d["ess_bulk"]))
    misses = [m for m in misses if not meets_bar(m[2], m[3])]
    if not misses:
        return None, numbers
    misses.sort(key=lambda m: m[3])
    shown = ", ".join(f"{n} ({k + ' ' if k else ''}R-hat {r:.3f}, bulk ESS {e:.0f})" for n, k, r, e in misses[:3])
    more = f" and {len(misses) - 3} more" if len(misses) > 3 else ""
    what = "1 quantity misses" if len(misses) == 1 else f"{len(misses)} quantities miss"
    worst = max(misses, key=lambda m: -np.inf if np.isnan(m[2]) else m[2])
    return Shortfall(f"{what} R-hat <= {RHAT_MAX} and bulk ESS >= {ESS_MIN}: {shown}{more}", float(misses[0][3]),
                     float(worst[2]), f"{worst[0]}{' ' + worst[1] if worst[1] else ''}"), numbers


ADVI_FALSE_ALARM = 0.01  # a flat curve called still falling costs a rerun, so false alarms over all curves stay rare


ADVI_MIN_DROP = 0.005  # ... and a fall smaller than this share of the loss is not worth more iterations


def advi_loss_trend(loss: np.ndarray) -> list[dict]:
    """Whether each ADVI loss curve is still falling.

    Compares the mean loss of the last quarter of the iterations with that of the quarter before. A curve is
    still falling when ``z`` exceeds the one-sided normal quantile that keeps the chance of any false alarm
    over all curves at :data:`ADVI_FALSE_ALARM` (Bonferroni: 2.3 for one curve, 4.3 for 1000) and the fall
    exceeds :data:`ADVI_MIN_DROP`. How this test sorted flat and hierarchical fits' curves is in
    benchmarks/FINDINGS.md, "Measurements behind code comments".

    Parameters
    ----------
    loss : numpy.ndarray
        The negative ELBO per iteration, ``(fits, iterations)`` (one curve may be 1-D).

    Returns
    -------
    list of dict
        Per curve: ``drop`` (the fall as a share of the final loss), ``z`` (the fall in standard errors,
        iterations taken as independent: the loss is mostly Monte Carlo noise around a slow trend), both
        ``None`` with too few iterations to tell, and ``still_falling``.
    """
    from scipy.special import ndtri

    loss = np.atleast_2d(np.asarray(loss, dtype=float))
    w = loss.shape[1] // 4
    critical = float(ndtri(1 - ADVI_FALSE_ALARM / loss.shape[0]))
    out = []
    for curve in loss:
        if w < 2:  # too few iterations to tell
            out.append({"drop": None, "z": None, "still_falling": False})
            continue
        before, last = curve[-2 * w:-w], curve[-w:]
        fall = before.mean() - last.mean()
        se = np.sqrt((before.var(ddof=1) + last.var(ddof=1)) / w)
        z = fall / se if se > 0 else (np.inf if fall > 0 else 0.0)
        drop = fall / abs(last.mean()) if last.mean() else 0.0
        out.append({"drop": float(drop), "z": float(z), "still_falling": bool(z > critical and drop > ADVI_MIN_DROP)})
    return out
