"""Predictions from posterior weights, the fit stages' metrics, diagnostics.

The scores themselves are the likelihood's (:mod:`hbnn.model.likelihoods`): this
module computes each group's posterior draws of the function-space quantity
(a probability, a mean, a rate) and lets the likelihood score them.
Convergence is judged in function space (that quantity on test points),
because weight space is symmetric under hidden-unit permutations and sign
flips and so weight-space R-hat says little.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr
from scipy.special import expit

from hbnn.config import DIVERGENT_SHARE_MAX, ESS_MIN, RHAT_MAX  # the convergence bar
from hbnn.data.tasks import Split, Tasks
from hbnn.diagnostics import convergence, psis
from hbnn.model import likelihoods
from hbnn.model.network import LayerSpec


def group_weights(posterior: xr.Dataset, specs: Sequence[LayerSpec], group: str | None) -> list[np.ndarray]:
    """Per-layer weight arrays ``(chain, draw, *layer.shape)`` for one group.

    ``group=None`` reads weights without a group dim (e.g. a population net).
    """
    out = []
    for s in specs:
        da = posterior[s.var]
        values, dims = da.values, list(da.dims)
        if group is not None:  # NumPy's indexing: xarray's sel and transpose took ~1.7 ms a layer and group
            axis = dims.index("group")
            # a view: np.take copies a non-contiguous array whole first (a per-group stage's stacked posterior is
            # group-major in memory), ~3 ms a call on the transfer stage's 36 groups
            values = values[(slice(None),) * axis + (da.indexes["group"].get_loc(group),)]
            del dims[axis]
        out.append(np.transpose(values, [dims.index(d) for d in ("chain", "draw", *s.dims)]))
    return out


def group_noise(posterior: xr.Dataset, group: str | None) -> np.ndarray:
    """The gaussian noise sd ``sigma`` as ``(chain, draw)`` for one group (shared or per-group)."""
    da = posterior["sigma"]
    if "group" in da.dims:
        da = da.sel(group=group)
    return da.transpose("chain", "draw").values


def predict_output(weights: Sequence[np.ndarray], X: np.ndarray, link=None) -> np.ndarray:
    """Network outputs ``(chain, draw, n)`` at rows ``X (n, feature)``, passed through ``link`` if given: the
    compiled float64 forward pass (:func:`hbnn.model.forward.outputs`), which agrees with
    :func:`hbnn.model.network.mlp_logit` to ~1e-15 relative."""
    from hbnn.model import forward  # numba: imported where outputs are wanted, not by every user of this module

    chains, draws = weights[0].shape[:2]
    flat = [w.reshape(chains * draws, *w.shape[2:]) for w in weights]
    out = forward.outputs(X, flat, np.float64)
    return (out if link is None else link(out)).reshape(chains, draws, X.shape[0])


def predict_proba(weights: Sequence[np.ndarray], X: np.ndarray) -> np.ndarray:
    """Probabilities ``(chain, draw, n)`` of ``y = 1`` at rows ``X (n, feature)``."""
    return predict_output(weights, X, link=expit)


def function_space_diagnostics(probs: np.ndarray) -> dict[str, float]:
    """Max rank-normalised split R-hat and min bulk ESS over prediction points: what the convergence bar judges.

    ``probs`` is ``(chain, draw, point)``. The values equal ArviZ's (``az.rhat``,
    ``az.ess``), computed for all points at once (:mod:`hbnn.diagnostics.convergence`); R-hat
    needs at least 2 chains and is NaN otherwise, as in ArviZ.
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

    ``probs`` is ``(chain, draw, point)``. At the point with the largest R-hat,
    each chain's mean and its Monte Carlo standard error (sd / sqrt(the chain's
    own bulk ESS)) are compared: the chains are distinct when two means lie more
    than ``DISTINCT_SIGMA`` standard errors apart while every chain has at least
    ``DISTINCT_CHAIN_ESS`` effective draws of its own (each chain is well sampled,
    they just sample different places). Returns the numbers behind that verdict,
    or ``None`` when the evidence is absent (fewer than 2 chains, or chains
    that are merely slow: more draws would fix those).
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
    """R-hat and ESS (bulk and, with ``tail``, tail) of scalar posterior variables (the hierarchical group sds),
    as ``az.rhat`` and ``az.ess`` give them (:mod:`hbnn.diagnostics.convergence`)."""
    x = np.stack([posterior[v].transpose("chain", "draw").values for v in var_names], axis=-1)
    rhat, bulk = convergence.rhat_and_ess_bulk(x)
    tails = convergence.ess_tail(x) if tail else None
    return {v: {"rhat": float(rhat[i]), "ess_bulk": float(bulk[i]), **({"ess_tail": float(tails[i])} if tail else {})}
            for i, v in enumerate(var_names)}


def quantity_draws(tasks: Tasks, weights: Sequence[np.ndarray], X: np.ndarray) -> np.ndarray:
    """The function-space quantity ``(chain, draw, n)`` (the likelihood's mean, in the label's original units) at
    rows ``X`` of ``tasks``, for per-layer weight draws ``weights`` (:func:`group_weights`)."""
    return likelihoods.get(tasks.likelihood).mean(predict_output(weights, X), tasks.y_mean, tasks.y_sd)


def evaluate_groups(
    tasks: Tasks, weights_of, splits: Sequence[str] = ("train", "test"), noise_of=None
) -> dict[str, dict[str, list]]:
    """Posterior draws of the function-space quantity ``(chain, draw, n)`` for every group and split.

    ``weights_of(g)`` returns :func:`group_weights` for group index ``g``; where
    the likelihood has a noise sd, ``noise_of(g)`` returns it (:func:`group_noise`).
    Gives ``{split: {"draws": [per group], "noise": [per group (chain, draw)] or
    None, "y": [per group]}}``, all in the label's original units (the tasks'
    ``y_mean`` and ``y_sd`` undone).
    """
    lik = likelihoods.get(tasks.likelihood)
    result = {}
    for name in splits:
        split: Split = tasks.split(name)
        draws, noise, ys = [], [], []
        for g in range(tasks.n_groups):
            rows = split.rows(g)
            draws.append(quantity_draws(tasks, weights_of(g), split.X[rows]))
            if lik.has_noise:
                noise.append(tasks.y_sd * noise_of(g))
            ys.append(lik.mean_label(split.y[rows], tasks.y_mean, tasks.y_sd))
        result[name] = {"draws": draws, "noise": noise if lik.has_noise else None, "y": ys}
    return result


def split_scores(lik: likelihoods.Likelihood, pred: dict[str, list]
                 ) -> tuple[dict[str, float], list[dict[str, float] | None]]:
    """Pooled scores over every row of a split and per-group scores (None for a group without rows).

    ``pred`` is one split of :func:`evaluate_groups`.
    """
    noise = pred["noise"] or [None] * len(pred["draws"])
    points = [lik.pointwise(d, n, y) for d, n, y in zip(pred["draws"], noise, pred["y"], strict=True)]
    pooled = lik.scores({k: np.concatenate([p[k] for p in points]) for k in points[0]})
    per = [lik.scores(p) if y.size else None for p, y in zip(points, pred["y"], strict=True)]
    return pooled, per


DISTINCT_SIGMA = 4.0  # chain means this many standard errors apart: distinct functions (distinct_chains)
DISTINCT_CHAIN_ESS = 100  # ... found by chains with at least this many effective draws each


def group_converged(rhat: float | None, ess: float | None, divergences: int, draws: int,
                    advi: dict | None = None) -> bool:
    """A group meets the bar: function-space R-hat <= 1.01, bulk ESS >= 400 and divergences (of the fit the
    group's draws come from) <= 0.1% of ``draws``. A missing R-hat (one chain) does not meet it.

    ADVI fits (``advi``: :func:`advi_loss_trend` of the loss the group's draws come from) are judged on
    what applies to them: their draws are independent draws from the approximation, so R-hat tests nothing
    (across thousands of quantities it exceeds 1.01 by chance alone) and there are no divergences; the bar
    is a loss no longer falling and bulk ESS >= 400 (Monte Carlo precision of the reported numbers)."""
    if advi is not None:
        return bool(ess is not None and ess >= ESS_MIN and not advi["still_falling"])
    return bool(meets_bar(rhat, ess) and divergences_within_bar(divergences, draws))


def divergences_within_bar(divergences: int, draws: int) -> bool:
    """At most 0.1% (:data:`DIVERGENT_SHARE_MAX`) of ``draws`` diverged: the divergence part of
    :func:`group_converged`'s bar."""
    return bool(divergences <= DIVERGENT_SHARE_MAX * draws)


def sd_converged(diagnostics: dict, advi: bool = False) -> bool:
    """A hierarchical group sd meets the bar (``diagnostics``: its ``rhat`` and ``ess_bulk``); for ADVI's
    independent draws only the ESS is judged, as :func:`group_converged` judges ADVI's groups."""
    if advi:
        return bool((diagnostics.get("ess_bulk") or 0) >= ESS_MIN)
    return meets_bar(diagnostics.get("rhat"), diagnostics.get("ess_bulk"))


def meets_bar(rhat: float | None, ess: float | None) -> bool:
    """R-hat <= 1.01 and bulk ESS >= 400 (a missing or NaN R-hat does not meet it): the MCMC part of
    :func:`group_converged`'s bar, for any quantity."""
    return bool(rhat is not None and np.isfinite(rhat) and rhat <= RHAT_MAX and ess is not None and ess >= ESS_MIN)


@dataclass(frozen=True)
class Shortfall:
    """What in a fit's draws misses the bar, as a log line says it (``text``, worst first), and the smallest
    bulk ESS among the quantities that miss it (``min_ess``: past :data:`ESS_MIN` where only R-hat misses), from
    which a fit drawn until the bar is met estimates the draws it still needs, and the largest R-hat among them
    (``max_rhat``, of the quantity ``rhat_of``), which says whether the chains sit in different places."""

    text: str
    min_ess: float
    max_rhat: float = float("nan")
    rhat_of: str = ""

    def __str__(self) -> str:
        return self.text


def convergence_shortfall(tasks: Tasks, posterior: xr.Dataset, specs: Sequence[LayerSpec],
                          scalar_vars: Sequence[str] = ()) -> Shortfall | None:
    """What in a joint fit's draws misses the R-hat and ESS bar of :func:`group_converged` (every group's
    test-point quantity and the ``scalar_vars``, e.g. the group sds), worst first; ``None`` when nothing does.

    The same numbers as the metrics' (:func:`fit_metrics`), so a fit drawn until this says ``None`` reports
    every group converged unless its divergences miss the bar, which more draws do not mend.
    """
    return _shortfall(tasks, _test_draws(tasks, posterior, specs), posterior, scalar_vars)[0]


def _test_draws(tasks: Tasks, posterior: xr.Dataset, specs: Sequence[LayerSpec]) -> list[np.ndarray]:
    """Every group's test-point quantity ``(chain, draw, n)`` at ``posterior``'s draws."""
    return evaluate_groups(tasks, lambda g: group_weights(posterior, specs, tasks.group_names[g]), ("test",),
                           noise_of=lambda g: group_noise(posterior, tasks.group_names[g]))["test"]["draws"]


# A group whose test-point quantities all have at least this bulk ESS and at most this R-hat at a look is evaluated
# again only once every other group meets the bar (:class:`ShortfallCheck`)
COMFORT_ESS = 1.5 * ESS_MIN
COMFORT_RHAT = 1 + (RHAT_MAX - 1) / 2


class ShortfallCheck:
    """:func:`convergence_shortfall` for a fit drawn until it meets the bar, which looks at ever longer prefixes
    of the same chains: the test-point quantity of the draws seen at the last look is kept, so a look computes
    it for the new draws only. A posterior that does not start with the draws seen before (another run) is
    computed whole.

    R-hat and ESS (most of a look's cost: ~0.27 s of a core per look of the default fit, taken from the chains'
    two cores) are evaluated for every group at the first look; at later ones only for the groups that were
    not past the bar by a margin (:data:`COMFORT_ESS`, :data:`COMFORT_RHAT`) when last evaluated, and for the
    ``scalar_vars``. Once those meet the bar every group is evaluated again, so a fit stops only at a look
    where everything meets the bar. Where no group left out falls from the margin to under the bar between
    two such full looks, every look says what evaluating every group says, and the fit looks and stops where
    it would. Where one does, it is named at the next full look, and until then the next look (set by the
    smallest ESS short of the bar) and a restart of chains that only that group shows split (R-hat past
    :data:`hbnn.sampling.restarts.RESTART_RHAT`) wait for it; the group sds are evaluated at every look.
    """

    def __init__(self, tasks: Tasks, specs: Sequence[LayerSpec], scalar_vars: Sequence[str] = ()):
        self.tasks, self.specs, self.scalar_vars = tasks, specs, list(scalar_vars)
        self.draws: list[np.ndarray] | None = None  # per group, (chain, seen, n)
        self.last: np.ndarray | None = None  # the first weights' values at the last draw seen, to recognise a prefix
        self.watched: set[str] | None = None  # groups evaluated at every look (None: every group)

    def __call__(self, posterior: xr.Dataset) -> Shortfall | None:
        seen = 0 if self.draws is None else self.draws[0].shape[1]
        marker = posterior[self.specs[0].var]
        n = posterior.sizes["draw"]
        if not 0 < seen <= n or not np.array_equal(marker.isel(draw=seen - 1).values, self.last):
            seen, self.draws, self.watched = 0, None, None
        new = _test_draws(self.tasks, posterior.isel(draw=slice(seen, n)), self.specs)
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


ADVI_FALSE_ALARM = 0.01  # chance that some curve of a flat set of ADVI loss curves is called still falling
ADVI_MIN_DROP = 0.005  # ... and a fall smaller than this share of the loss is not worth more iterations


def advi_loss_trend(loss: np.ndarray) -> list[dict]:
    """Whether each ADVI loss curve (``(fits, iterations)``, the negative ELBO per iteration) is still falling.

    Compares the mean loss of the last quarter of the iterations with that of the quarter before:
    ``drop`` is the fall as a share of the final loss, ``z`` the fall in standard errors (iterations taken
    as independent: the loss is mostly Monte Carlo noise around a slow trend). A curve is still falling
    when ``z`` exceeds the one-sided normal quantile that keeps the chance of any false alarm over all
    ``fits`` curves at :data:`ADVI_FALSE_ALARM` (Bonferroni: 2.3 for one curve, 4.3 for 1000) and the
    fall exceeds :data:`ADVI_MIN_DROP`. On a 60-group flat fit this called 0 of 60 curves still falling
    after 5000 iterations; the hierarchical fit at 1000 iterations (z 16, 10% fall) and at 5000 (z 8,
    2% fall) were.
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


def split_order(split: Split, per_group: Sequence[np.ndarray]) -> np.ndarray:
    """Per-group arrays ``(..., n_g)`` (in :meth:`Split.rows` order) as one ``(..., n)`` in the split's row order."""
    out = np.empty((*per_group[0].shape[:-1], split.y.size), dtype=np.result_type(*per_group))
    for g, values in enumerate(per_group):
        out[..., split.rows(g)] = values
    return out


def pointwise_log_likelihood(tasks: Tasks, pred: dict[str, list], split: str = "train") -> np.ndarray:
    """``log p(y_i | draw)`` as ``(chain, draw, n)`` over the rows of ``split``, from :func:`evaluate_groups` output."""
    lik = likelihoods.get(tasks.likelihood)
    noise = pred["noise"] or [None] * len(pred["draws"])
    per_group = [lik.log_density(d, n, y) for d, n, y in zip(pred["draws"], noise, pred["y"], strict=True)]
    return split_order(tasks.split(split), per_group)


def psis_loo(log_lik: np.ndarray) -> psis.Loo:
    """PSIS-LOO (:func:`hbnn.diagnostics.psis.loo`, ArviZ's ``az.loo`` pointwise) from the training rows' log-likelihood
    ``(chain, draw, n)``.

    The relative efficiency is that of the likelihood values themselves
    (``loo``'s ``relative_eff``, averaged over rows), not of the weights: weight
    space is symmetric under hidden-unit permutations and its ESS says nothing
    here. For per-group fits each row's terms use only its own group's draws, so
    the pooled sum is the LOO of the product of the groups' posteriors.
    :meth:`hbnn.diagnostics.psis.Loo.to_arviz` gives what ``az.compare`` takes.
    """
    S = log_lik.shape[0] * log_lik.shape[1]
    # np.errstate, not warnings.catch_warnings: this runs in a thread beside the stage's own (score_fit), and
    # catch_warnings swaps the process's warning filters, which a thread can restore over another's
    with np.errstate(all="ignore"):  # a row of constant likelihood values: its ESS, NaN, is dropped below
        ess = convergence.ess_mean(np.exp(log_lik - log_lik.max(axis=(0, 1))))  # az.ess(method="mean"), per row
    reff = float(np.clip(np.nanmean(ess) / S, 1.0 / S, 1.0)) if np.isfinite(ess).any() else 1.0
    with np.errstate(divide="ignore", invalid="ignore"):  # a row of constant ratios: k is infinite, not smoothed
        return psis.loo(log_lik, reff)


def bad_k_threshold(n_draws: int) -> float:
    """Pareto k above which a row's PSIS estimate is unreliable: ``min(1 - 1/log10(S), 0.7)`` for ``S`` draws
    (Vehtari et al. 2024; ArviZ's ``good_k``): 0.7 from ~2,200 draws on, lower for fewer."""
    return min(1 - 1 / np.log10(n_draws), 0.7)


def high_k(res) -> np.ndarray:
    """Per row of a :func:`psis_loo` result: is its Pareto k above :func:`bad_k_threshold`?"""
    return np.asarray(res.pareto_k) > bad_k_threshold(res.n_samples)


def elpd_difference(a, b) -> tuple[float, float]:
    """``elpd_loo(a) - elpd_loo(b)`` and its standard error ``sqrt(n var(loo_i(a) - loo_i(b)))`` (paired over
    the same rows, as ``az.compare``'s ``dse``) for two :func:`psis_loo` results."""
    d = np.asarray(a.loo_i) - np.asarray(b.loo_i)
    return float(d.sum()), float(np.sqrt(d.size * d.var()))


def loo_metrics(res, group: np.ndarray, names: Sequence[str]) -> tuple[dict, dict[str, dict]]:
    """Pooled and per-group numbers of a :func:`psis_loo` result; ``group`` holds each row's group code.

    Pooled: ``elpd``, ``se``, ``p_loo``, ``n_bad_k`` (rows whose Pareto k is above
    :func:`bad_k_threshold`) and ``max_k``; per group: ``elpd`` (the sum of its
    rows' ``elpd_loo_i``), ``n_bad_k`` and ``max_k``.
    """
    k = np.asarray(res.pareto_k)
    loo_i = np.asarray(res.loo_i)
    bad = high_k(res)
    pooled = {"elpd": float(res.elpd_loo), "se": float(res.se), "p_loo": float(res.p_loo),
              "n_bad_k": int(bad.sum()), "max_k": float(k.max())}
    per_group = {}
    for g, name in enumerate(names):
        rows = group == g
        if rows.any():
            per_group[name] = {"elpd": float(loo_i[rows].sum()), "n_bad_k": int(bad[rows].sum()),
                               "max_k": float(k[rows].max())}
    return pooled, per_group


def fit_metrics(
    tasks: Tasks,
    predictions: dict[str, dict[str, list]],
    divergences: int,
    extra_diagnostics: dict[str, dict[str, float]] | None = None,
    group_divergences: Sequence[int] | None = None,
    loo: tuple[dict, dict[str, dict]] | None = None,
    advi_loss: np.ndarray | None = None,
    test_diagnostics: dict[str, dict[str, float]] | None = None,
    thinned: dict[str, dict] | None = None,
) -> dict:
    """Metrics dict for a fit stage (keys per DESIGN.md; the scores are the likelihood's).

    Pooled scores use every row of a split; ``per_group`` is keyed by group name.
    Sampling diagnostics are in function space on test points (per group), with
    any ``extra_diagnostics`` (e.g. group-sd R-hat/ESS) folded into the extremes;
    ``group_divergences`` (per-group fits only) are stored per group;
    ``loo`` is :func:`loo_metrics`'s output (pooled, per group).
    ``advi_loss`` (ADVI fits): the loss per iteration, ``(groups, iterations)`` for per-group fits or
    ``(iterations,)`` for one joint fit; groups are then judged by :func:`group_converged`'s ADVI bar, each
    group's ``advi_loss`` says how its loss ended and ``sampling.advi_still_falling`` counts the curves
    still falling. ``test_diagnostics``: :func:`function_space_diagnostics` of groups' test draws computed
    before (per-group fits judge each group as it is fitted), used instead of computing them again;
    ``thinned``: groups drawn longer and thinned by ``thinned_by`` (``sampler.max_draws``), whose divergences
    (their whole run's, in ``group_divergences``) are judged against ``thinned_by`` times as many transitions.
    ``sampling.groups_not_converged`` counts the groups that miss the bar of
    :func:`group_converged`; each group's ``converged`` says which. Of those,
    ``sampling.flagged_groups`` names the ones whose chains settled in distinct
    functions (:func:`distinct_chains`), with the numbers: a non-mixing posterior,
    not merely a short run.
    Everything here is a function of the posterior draws, so the same params give
    the same bytes; wall-clock times go to :func:`timing_metrics` instead.
    """
    lik = likelihoods.get(tasks.likelihood)
    metrics: dict = {"per_group": {name: {} for name in tasks.group_names}}
    fs_rhat, fs_ess = [], []
    for split, pred in predictions.items():
        metrics[split], per_group = split_scores(lik, pred)
        draws = pred["draws"]
        for g, name in enumerate(tasks.group_names):
            if per_group[g] is not None:
                metrics["per_group"][name][split] = per_group[g]
            if split == "test" and pred["y"][g].size:
                diag = (test_diagnostics or {}).get(name) or function_space_diagnostics(draws[g])
                metrics["per_group"][name]["rhat_fn"] = diag["max_rhat"]
                metrics["per_group"][name]["ess_bulk_fn"] = diag["min_ess_bulk"]
                fs_rhat.append(diag["max_rhat"])
                fs_ess.append(diag["min_ess_bulk"])
    n_draws = int(predictions["test"]["draws"][0].shape[0] * predictions["test"]["draws"][0].shape[1])
    not_converged, flagged = 0, {}
    test = predictions["test"]
    trend = None if advi_loss is None else advi_loss_trend(advi_loss)
    for g, name in enumerate(tasks.group_names):
        group = metrics["per_group"][name]
        # Per-group fits: the group's own divergences. One joint fit: its divergences concern every group.
        div = int(divergences) if group_divergences is None else int(group_divergences[g])
        longer = (thinned or {}).get(name)
        if group_divergences is not None:
            group["divergences"] = div
        advi = None if trend is None else trend[g if len(trend) > 1 else 0]
        if advi is not None:
            group["advi_loss"] = advi
        group["converged"] = group_converged(group.get("rhat_fn"), group.get("ess_bulk_fn"), div,
                                             n_draws * (longer["thinned_by"] if longer else 1), advi)
        not_converged += not group["converged"]
        # ADVI's chains are one approximation's independent draws: distinct chains cannot happen
        evidence = (None if group["converged"] or not test["y"][g].size or advi is not None
                    else distinct_chains(test["draws"][g]))
        if evidence is not None:
            means = ", ".join(f"{m:.3f}" for m in evidence["chain_means"].values())
            flagged[name] = {
                **evidence,
                "reason": (f"chains settled in distinct functions: at test point {evidence['test_point']} the chain "
                           f"means are {means}, {evidence['separation_sigma']:.1f} standard errors apart, each chain "
                           f"with >= {min(evidence['chain_ess_bulk'].values()):.0f} effective draws; "
                           f"R-hat {evidence['rhat']:.3f}"),
            }
    extra = extra_diagnostics or {}
    rhats = fs_rhat + [d["rhat"] for d in extra.values()]
    esses = fs_ess + [d["ess_bulk"] for d in extra.values()]
    metrics["sampling"] = {
        "divergences": int(divergences),
        "max_rhat": max(rhats) if rhats else None,
        "min_ess_bulk": min(esses) if esses else None,
        "max_rhat_fn": max(fs_rhat) if fs_rhat else None,
        "min_ess_bulk_fn": min(fs_ess) if fs_ess else None,
        "groups_not_converged": not_converged,
        "flagged_groups": flagged,
    }
    if trend is not None:
        metrics["sampling"]["advi_still_falling"] = sum(t["still_falling"] for t in trend)
    if extra:
        metrics["sampling"]["group_sd"] = extra
        # the group sds are reported quantities too: a count beside the groups', so that a miss shows in the metrics
        metrics["sampling"]["sds_not_converged"] = sum(not sd_converged(d, trend is not None) for d in extra.values())
    if loo is not None:
        add_loo(metrics, loo)
    return metrics


def add_loo(metrics: dict, loo: tuple[dict, dict[str, dict]]) -> None:
    """Put :func:`loo_metrics`' output (pooled, per group) into :func:`fit_metrics`' ``metrics``."""
    metrics["loo"] = loo[0]
    for name, values in loo[1].items():
        metrics["per_group"][name]["loo"] = values


HEADLINE_SAMPLING = ("divergences", "max_rhat", "min_ess_bulk", "groups_not_converged")
# ADVI fits; hierarchical fits (their group sds; chains that may restart)
HEADLINE_SAMPLING_IF_PRESENT = ("advi_still_falling", "sds_not_converged", "restarts")
HEADLINE_LOO = ("elpd", "se", "p_loo", "n_bad_k")


def headline(metrics: dict, score: str) -> dict:
    """The keys of :func:`fit_metrics` that ``metrics/<model>.json`` holds (DESIGN.md's headline keys).

    ``dvc exp show`` makes one column per key, so the declared metrics file holds
    the headline score of the training rows, every score of the test rows, the
    LOO estimate and the convergence summary, with each flagged group's reason
    (``score`` is the likelihood's headline score);
    the complete dict (per group, every diagnostic) goes to ``metrics/detail/``.
    """
    train, test = metrics["train"], metrics["test"]
    out = {
        "train": {score: train[score]},
        "test": {k: v for k, v in test.items() if k != "n"},
        "sampling": {k: metrics["sampling"][k] for k in (*HEADLINE_SAMPLING, *HEADLINE_SAMPLING_IF_PRESENT)
                     if k in metrics["sampling"]}
        | {"flagged_groups": {g: f["reason"] for g, f in metrics["sampling"]["flagged_groups"].items()}},
    }
    if "loo" in metrics:
        out["loo"] = {k: metrics["loo"][k] for k in HEADLINE_LOO}
    return out


def reliability(p_bar: np.ndarray, y: np.ndarray, n_bins: int = 10) -> dict[str, np.ndarray]:
    """Reliability (calibration) table of mean probabilities in equal-width bins.

    Returns ``bin_mid``, ``mean_predicted`` and ``observed`` (fraction of ``y = 1``),
    NaN for empty bins, and ``count`` per bin. ``p = 1`` falls in the last bin.
    """
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.clip(np.digitize(p_bar, edges[1:-1]), 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_pred = np.bincount(idx, weights=p_bar, minlength=n_bins) / count
        observed = np.bincount(idx, weights=y.astype(float), minlength=n_bins) / count
    return {"bin_mid": (edges[:-1] + edges[1:]) / 2, "mean_predicted": mean_pred, "observed": observed,
            "count": count}


def timing_metrics(backend: str, seconds: float, compile_seconds: float | None, grad_evals: int | None,
                   parallel_chains: int = 1, advi_iterations: int | None = None) -> dict:
    """Wall-clock cost of a fit: seconds, compile seconds and gradient evaluations.

    ``grad_evals`` is the total number of leapfrog steps, tuning included, over all
    chains and groups (``None`` where the backend does not report tuning steps).
    ``us_per_grad`` is the wall time of one gradient evaluation within a chain,
    sampler overhead included: ``seconds * parallel_chains / grad_evals``, because
    ``parallel_chains`` chains step at the same time on their own cores.
    """
    us = 1e6 * seconds * parallel_chains / grad_evals if grad_evals else None
    out: dict = {"seconds": seconds, "compile_seconds": compile_seconds, "grad_evals": grad_evals,
                 "us_per_grad": us}
    if advi_iterations is not None:
        out["advi_iterations"] = advi_iterations
    return {"backend": backend, "sampling": out}
