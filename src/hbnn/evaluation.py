"""Predictions from posterior weights, classification and regression metrics, diagnostics.

Bernoulli: every metric is computed from the posterior-predictive mean
probability ``p_bar = mean over all kept draws of sigmoid(logit)``: accuracy
thresholds ``p_bar`` at 0.5, log loss and Brier score use the same ``p_bar``.
Gaussian, in the label's original units: RMSE of the posterior-mean prediction,
the mean log pointwise predictive density ``lpd`` (``log mean_s N(y | mu_s,
sigma_s)`` per row, by logsumexp over all kept draws) and ``coverage_94``, the
share of rows inside the central 94% interval of the posterior predictive
(noise included).
Convergence is judged in function space (predicted probabilities, or predicted
means, on test points), because weight space is symmetric under hidden-unit
permutations and sign flips and so weight-space R-hat says little.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import arviz as az
import numpy as np
import xarray as xr
from scipy.special import expit, logsumexp, ndtr
from scipy.stats import norm

from hbnn import convergence
from hbnn.data import Split, Tasks
from hbnn.network import LayerSpec, mlp_logit

EPS = 1e-12
INTERVAL = 0.94  # central posterior (predictive) interval reported by metrics and predictions
QUANTILES = ((1 - INTERVAL) / 2, (1 + INTERVAL) / 2)


def group_weights(posterior: xr.Dataset, specs: Sequence[LayerSpec], group: str | None) -> list[np.ndarray]:
    """Per-layer weight arrays ``(chain, draw, *layer.shape)`` for one group.

    ``group=None`` reads weights without a group dim (e.g. a population net).
    """
    out = []
    for s in specs:
        da = posterior[s.var]
        if group is not None:
            da = da.sel(group=group)
        out.append(da.transpose("chain", "draw", *s.dims).values)
    return out


def group_noise(posterior: xr.Dataset, group: str | None) -> np.ndarray:
    """The gaussian noise sd ``sigma`` as ``(chain, draw)`` for one group (shared or per-group)."""
    da = posterior["sigma"]
    if "group" in da.dims:
        da = da.sel(group=group)
    return da.transpose("chain", "draw").values


def predict_output(weights: Sequence[np.ndarray], X: np.ndarray, chunk: int = 1000, link=None) -> np.ndarray:
    """Network outputs ``(chain, draw, n)`` at rows ``X (n, feature)``, passed through ``link`` if given.

    Draws are processed in chunks so memory stays at ``chunk * n`` per layer.
    """
    chains, draws = weights[0].shape[:2]
    flat = [w.reshape(chains * draws, *w.shape[2:]) for w in weights]
    out = np.empty((chains * draws, X.shape[0]), dtype=np.result_type(X, *flat))
    for lo in range(0, chains * draws, chunk):
        value = mlp_logit(X, [w[lo : lo + chunk] for w in flat])
        out[lo : lo + chunk] = value if link is None else link(value)
    return out.reshape(chains, draws, X.shape[0])


def predict_proba(weights: Sequence[np.ndarray], X: np.ndarray, chunk: int = 1000) -> np.ndarray:
    """Probabilities ``(chain, draw, n)`` of ``y = 1`` at rows ``X (n, feature)``."""
    return predict_output(weights, X, chunk, link=expit)


def mixture_cdf(y: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Posterior-predictive CDF at ``y (n,)``: ``mean_s Phi((y - mu[s]) / sigma[s])``.

    ``mu`` is ``(sample, n)`` and ``sigma`` ``(sample,)``: an equal-weight mixture of normals.
    """
    return ndtr((y[None, :] - mu) / sigma[:, None]).mean(axis=0)


def mixture_quantiles(mu: np.ndarray, sigma: np.ndarray, qs: Sequence[float], iters: int = 80) -> np.ndarray:
    """Quantiles ``(len(qs), n)`` of the normal mixture of :func:`mixture_cdf`, by bisection.

    The bracket ``[min mu - 10 max sigma, max mu + 10 max sigma]`` holds every
    quantile in ``(1e-20, 1 - 1e-20)``; 80 halvings shrink it far below float
    resolution of the values involved.
    """
    lo0 = mu.min(axis=0) - 10 * sigma.max()
    hi0 = mu.max(axis=0) + 10 * sigma.max()
    out = []
    for q in qs:
        lo, hi = lo0.copy(), hi0.copy()
        for _ in range(iters):
            mid = (lo + hi) / 2
            below = mixture_cdf(mid, mu, sigma) < q
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        out.append((lo + hi) / 2)
    return np.array(out)


def regression_pointwise(mu: np.ndarray, sigma: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row squared error, log predictive density and 94%-interval coverage.

    ``mu`` is ``(chain, draw, n)`` (predicted means), ``sigma`` ``(chain, draw)``
    (noise sd) and ``y`` ``(n,)``, all in the same units. A row is covered when
    its predictive CDF value lies in ``[0.03, 0.97]``, which is the same as lying
    inside the central 94% predictive interval.
    """
    m = mu.reshape(-1, mu.shape[-1])
    s = sigma.reshape(-1)
    logpdf = norm.logpdf(y[None, :], loc=m, scale=s[:, None])
    cdf = mixture_cdf(y, m, s)
    return {
        "sq_err": (y - m.mean(axis=0)) ** 2,
        "lpd": logsumexp(logpdf, axis=0) - np.log(m.shape[0]),
        "covered": (cdf >= QUANTILES[0]) & (cdf <= QUANTILES[1]),
    }


def regression_scores(point: dict[str, np.ndarray]) -> dict[str, float]:
    """RMSE, mean lpd and coverage over the rows of :func:`regression_pointwise` output."""
    return {
        "rmse": float(np.sqrt(np.mean(point["sq_err"]))),
        "lpd": float(np.mean(point["lpd"])),
        "coverage_94": float(np.mean(point["covered"])),
        "n": int(point["sq_err"].size),
    }


def classification_scores(p_bar: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Accuracy at 0.5, mean log loss and Brier score of mean probabilities."""
    p = np.clip(p_bar, EPS, 1 - EPS)
    return {
        "accuracy": float(np.mean((p_bar > 0.5) == (y == 1))),
        "log_loss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))),
        "brier": float(np.mean((p_bar - y) ** 2)),
        "n": int(y.size),
    }


def function_space_diagnostics(probs: np.ndarray) -> dict[str, float]:
    """Max rank-normalised split R-hat and min bulk/tail ESS over prediction points.

    ``probs`` is ``(chain, draw, point)``. The values equal ArviZ's (``az.rhat``,
    ``az.ess``), computed for all points at once (:mod:`hbnn.convergence`); R-hat
    needs at least 2 chains and is NaN otherwise, as in ArviZ.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmax of an all-NaN R-hat (one chain)
        return {
            "max_rhat": float(np.nanmax(convergence.rhat(probs))),
            "min_ess_bulk": float(np.nanmin(convergence.ess_bulk(probs))),
            "min_ess_tail": float(np.nanmin(convergence.ess_tail(probs))),
        }


def scalar_diagnostics(posterior: xr.Dataset, var_names: Sequence[str]) -> dict[str, dict[str, float]]:
    """R-hat and ESS of scalar posterior variables (the hierarchical group sds)."""
    ds = posterior[list(var_names)]
    rhat, bulk, tail = az.rhat(ds), az.ess(ds, method="bulk"), az.ess(ds, method="tail")
    return {
        v: {"rhat": float(rhat[v]), "ess_bulk": float(bulk[v]), "ess_tail": float(tail[v])} for v in var_names
    }


def evaluate_groups(
    tasks: Tasks, weights_of, splits: Sequence[str] = ("train", "test"), noise_of=None
) -> dict[str, dict[str, np.ndarray]]:
    """Posterior predictions ``(chain, draw, n)`` for every group and split.

    ``weights_of(g)`` returns :func:`group_weights` for group index ``g``.
    Bernoulli tasks give ``{split: {"probs": [per-group arrays], "y": [...]}}``.
    Gaussian tasks need ``noise_of(g)`` (:func:`group_noise`) and give
    ``{"mu": [...], "sigma": [per-group (chain, draw)], "y": [...]}``, all
    transformed back to the label's original units with the tasks' ``y_mean``
    and ``y_sd``.
    """
    gaussian = tasks.likelihood == "gaussian"
    result = {}
    for name in splits:
        split: Split = tasks.split(name)
        out, sigmas, ys = [], [], []
        for g in range(tasks.n_groups):
            rows = split.rows(g)
            if gaussian:
                out.append(tasks.y_mean + tasks.y_sd * predict_output(weights_of(g), split.X[rows]))
                sigmas.append(tasks.y_sd * noise_of(g))
                ys.append(tasks.y_mean + tasks.y_sd * split.y[rows])
            else:
                out.append(predict_proba(weights_of(g), split.X[rows]))
                ys.append(split.y[rows])
        result[name] = {"mu": out, "sigma": sigmas, "y": ys} if gaussian else {"probs": out, "y": ys}
    return result


def split_scores(pred: dict[str, list]) -> tuple[dict[str, float], list[dict[str, float] | None]]:
    """Pooled scores over every row of a split and per-group scores (None for a group without rows).

    ``pred`` is one split of :func:`evaluate_groups`: classification scores for
    ``probs``, regression scores for ``mu``/``sigma``.
    """
    if "probs" in pred:
        p_bars = [p.mean(axis=(0, 1)) for p in pred["probs"]]
        pooled = classification_scores(np.concatenate(p_bars), np.concatenate(pred["y"]))
        per = [classification_scores(p, y) if y.size else None for p, y in zip(p_bars, pred["y"], strict=True)]
        return pooled, per
    points = [regression_pointwise(m, s, y) for m, s, y in zip(pred["mu"], pred["sigma"], pred["y"], strict=True)]
    pooled = regression_scores({k: np.concatenate([p[k] for p in points]) for k in points[0]})
    per = [regression_scores(p) if p["sq_err"].size else None for p in points]
    return pooled, per


def fit_metrics(
    tasks: Tasks,
    predictions: dict[str, dict[str, list]],
    divergences: int,
    extra_diagnostics: dict[str, dict[str, float]] | None = None,
) -> dict:
    """Metrics dict for a fit stage (keys per DESIGN.md; RMSE/lpd/coverage for gaussian tasks).

    Pooled scores use every row of a split; ``per_group`` is keyed by group name.
    Sampling diagnostics are in function space on test points (per group), with
    any ``extra_diagnostics`` (e.g. group-sd R-hat/ESS) folded into the extremes.
    Everything here is a function of the posterior draws, so the same params give
    the same bytes; wall-clock times go to :func:`timing_metrics` instead.
    """
    metrics: dict = {"per_group": {name: {} for name in tasks.group_names}}
    fs_rhat, fs_ess = [], []
    for split, pred in predictions.items():
        metrics[split], per_group = split_scores(pred)
        draws = pred["probs"] if "probs" in pred else pred["mu"]
        for g, name in enumerate(tasks.group_names):
            if per_group[g] is not None:
                metrics["per_group"][name][split] = per_group[g]
            if split == "test" and pred["y"][g].size:
                diag = function_space_diagnostics(draws[g])
                metrics["per_group"][name]["rhat_fn"] = diag["max_rhat"]
                metrics["per_group"][name]["ess_bulk_fn"] = diag["min_ess_bulk"]
                fs_rhat.append(diag["max_rhat"])
                fs_ess.append(diag["min_ess_bulk"])
    extra = extra_diagnostics or {}
    rhats = fs_rhat + [d["rhat"] for d in extra.values()]
    esses = fs_ess + [d["ess_bulk"] for d in extra.values()]
    metrics["sampling"] = {
        "divergences": int(divergences),
        "max_rhat": max(rhats) if rhats else None,
        "min_ess_bulk": min(esses) if esses else None,
        "max_rhat_fn": max(fs_rhat) if fs_rhat else None,
        "min_ess_bulk_fn": min(fs_ess) if fs_ess else None,
    }
    if extra:
        metrics["sampling"]["group_sd"] = extra
    return metrics


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


def timing_metrics(backend: str, seconds: float, compile_seconds: float, grad_evals: int | None,
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
