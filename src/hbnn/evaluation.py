"""Predictions from posterior weights, classification metrics and diagnostics.

Every metric is computed from the posterior-predictive mean probability
``p_bar = mean over all kept draws of sigmoid(logit)``: accuracy thresholds
``p_bar`` at 0.5, log loss and Brier score use the same ``p_bar``.
Convergence is judged in function space (predicted probabilities on test
points), because weight space is symmetric under hidden-unit permutations and
sign flips and so weight-space R-hat says little.
"""

from __future__ import annotations

from collections.abc import Sequence

import arviz as az
import numpy as np
import xarray as xr
from scipy.special import expit

from hbnn.data import Split, Tasks
from hbnn.models import LayerSpec, mlp_logit

EPS = 1e-12


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


def predict_proba(weights: Sequence[np.ndarray], X: np.ndarray, chunk: int = 1000) -> np.ndarray:
    """Probabilities ``(chain, draw, n)`` of ``y = 1`` at rows ``X (n, feature)``.

    Draws are processed in chunks so memory stays at ``chunk * n`` per layer.
    """
    chains, draws = weights[0].shape[:2]
    flat = [w.reshape(chains * draws, *w.shape[2:]) for w in weights]
    out = np.empty((chains * draws, X.shape[0]))
    for lo in range(0, chains * draws, chunk):
        out[lo : lo + chunk] = expit(mlp_logit(X, [w[lo : lo + chunk] for w in flat]))
    return out.reshape(chains, draws, X.shape[0])


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

    ``probs`` is ``(chain, draw, point)``. Split R-hat is defined even for one chain.
    """
    ds = xr.Dataset({"p": (("chain", "draw", "point"), probs)})
    rhat = az.rhat(ds)["p"].values
    ess_bulk = az.ess(ds, method="bulk")["p"].values
    ess_tail = az.ess(ds, method="tail")["p"].values
    return {
        "max_rhat": float(np.nanmax(rhat)),
        "min_ess_bulk": float(np.nanmin(ess_bulk)),
        "min_ess_tail": float(np.nanmin(ess_tail)),
    }


def scalar_diagnostics(posterior: xr.Dataset, var_names: Sequence[str]) -> dict[str, dict[str, float]]:
    """R-hat and ESS of scalar posterior variables (the hierarchical group sds)."""
    ds = posterior[list(var_names)]
    rhat, bulk, tail = az.rhat(ds), az.ess(ds, method="bulk"), az.ess(ds, method="tail")
    return {
        v: {"rhat": float(rhat[v]), "ess_bulk": float(bulk[v]), "ess_tail": float(tail[v])} for v in var_names
    }


def evaluate_groups(
    tasks: Tasks, weights_of, splits: Sequence[str] = ("train", "test")
) -> dict[str, dict[str, np.ndarray]]:
    """Predicted probabilities ``(chain, draw, n)`` for every group and split.

    ``weights_of(g)`` returns :func:`group_weights` for group index ``g``. Returns
    ``{split: {"probs": [per-group arrays], "y": [...], "split": Split}}``.
    """
    result = {}
    for name in splits:
        split: Split = tasks.split(name)
        probs, ys = [], []
        for g in range(tasks.n_groups):
            rows = split.rows(g)
            probs.append(predict_proba(weights_of(g), split.X[rows]))
            ys.append(split.y[rows])
        result[name] = {"probs": probs, "y": ys}
    return result


def fit_metrics(
    tasks: Tasks,
    predictions: dict[str, dict[str, list]],
    divergences: int,
    extra_diagnostics: dict[str, dict[str, float]] | None = None,
) -> dict:
    """Metrics dict for a fit stage (keys per DESIGN.md).

    Pooled scores use every row of a split; ``per_group`` is keyed by group name.
    Sampling diagnostics are in function space on test points (per group), with
    any ``extra_diagnostics`` (e.g. group-sd R-hat/ESS) folded into the extremes.
    Everything here is a function of the posterior draws, so the same params give
    the same bytes; wall-clock times go to :func:`timing_metrics` instead.
    """
    metrics: dict = {"per_group": {name: {} for name in tasks.group_names}}
    fs_rhat, fs_ess = [], []
    for split, pred in predictions.items():
        p_bars = [p.mean(axis=(0, 1)) for p in pred["probs"]]
        metrics[split] = classification_scores(np.concatenate(p_bars), np.concatenate(pred["y"]))
        for g, name in enumerate(tasks.group_names):
            if pred["y"][g].size:
                metrics["per_group"][name][split] = classification_scores(p_bars[g], pred["y"][g])
            if split == "test" and pred["y"][g].size:
                diag = function_space_diagnostics(pred["probs"][g])
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
                   advi_iterations: int | None = None) -> dict:
    """Wall-clock cost of a fit: seconds, compile seconds and gradient evaluations.

    ``grad_evals`` is the total number of leapfrog steps, tuning included, over all
    chains and groups (``None`` where the backend does not report tuning steps);
    ``us_per_grad`` is sampling seconds per gradient evaluation, sampler overhead
    included.
    """
    out: dict = {"seconds": seconds, "compile_seconds": compile_seconds, "grad_evals": grad_evals,
                 "us_per_grad": 1e6 * seconds / grad_evals if grad_evals else None}
    if advi_iterations is not None:
        out["advi_iterations"] = advi_iterations
    return {"backend": backend, "sampling": out}
