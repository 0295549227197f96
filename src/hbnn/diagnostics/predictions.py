"""Each group's posterior draws of the function-space quantity, and the scores the likelihood gives them.

The function-space quantity is a probability, a mean or a rate, computed from the posterior weights; the scores
are the likelihood's (:mod:`hbnn.model.likelihoods`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr
from scipy.special import expit

from hbnn.data.tasks import Split, Tasks
from hbnn.model import likelihoods
from hbnn.model.network import LayerSpec


def group_weights(posterior: xr.Dataset, specs: Sequence[LayerSpec], group: str | None) -> list[np.ndarray]:
    """Per-layer weight arrays for one group.

    Parameters
    ----------
    posterior : xarray.Dataset
        The draws.
    specs : sequence of hbnn.model.network.LayerSpec
        The network's layers.
    group : str or None
        The group; ``None`` reads weights without a group dim (e.g. a population net).

    Returns
    -------
    list of numpy.ndarray
        Per layer, ``(chain, draw, *layer.shape)``.
    """
    out = []
    for s in specs:
        da = posterior[s.var]
        values, dims = da.values, list(da.dims)
        if group is not None:  # NumPy's indexing: xarray's sel and transpose cost far more per layer and group
            axis = dims.index("group")
            # a view: np.take copies a non-contiguous array whole first (a per-group stage's stacked posterior is
            # group-major in memory) (benchmarks/FINDINGS.md, "Measurements behind code comments")
            values = values[(slice(None),) * axis + (da.indexes["group"].get_loc(group),)]
            del dims[axis]
        out.append(np.transpose(values, [dims.index(d) for d in ("chain", "draw", *s.dims)]))
    return out


def group_extra(posterior: xr.Dataset, name: str, group: str | None) -> np.ndarray:
    """The likelihood's extra parameter for one group, as sampled.

    Parameters
    ----------
    posterior : xarray.Dataset
        The draws.
    name : str
        The parameter (gaussian's ``sigma``, negative_binomial's ``alpha``), shared by the groups or per group.
    group : str or None
        The group.

    Returns
    -------
    numpy.ndarray
        ``(chain, draw)``.
    """
    da = posterior[name]
    if "group" in da.dims:
        da = da.sel(group=group)
    return da.transpose("chain", "draw").values


def predict_output(weights: Sequence[np.ndarray], X: np.ndarray, activation: str, link=None) -> np.ndarray:
    """Network outputs at rows ``X`` for every draw, by the compiled float64 forward pass.

    :func:`hbnn.model.forward.outputs` agrees with :func:`hbnn.model.network.mlp_logit` to ~1e-15 relative.

    Parameters
    ----------
    weights : sequence of numpy.ndarray
        Per-layer weight draws ``(chain, draw, *layer.shape)`` (:func:`group_weights`).
    X : numpy.ndarray
        Rows ``(n, feature)``.
    activation : str
        The hidden units' activation.
    link : callable, optional
        Applied to the outputs if given.

    Returns
    -------
    numpy.ndarray
        ``(chain, draw, n)``.
    """
    from hbnn.model import forward  # numba: imported where outputs are wanted, not by every user of this module

    chains, draws = weights[0].shape[:2]
    flat = [w.reshape(chains * draws, *w.shape[2:]) for w in weights]
    out = forward.outputs(X, flat, np.float64, activation=activation)
    return (out if link is None else link(out)).reshape(chains, draws, X.shape[0])


def predict_proba(weights: Sequence[np.ndarray], X: np.ndarray, activation: str) -> np.ndarray:
    """Probabilities of ``y = 1`` at rows ``X`` for every draw.

    Parameters
    ----------
    weights : sequence of numpy.ndarray
        Per-layer weight draws ``(chain, draw, *layer.shape)`` (:func:`group_weights`).
    X : numpy.ndarray
        Rows ``(n, feature)``.
    activation : str
        The hidden units' activation.

    Returns
    -------
    numpy.ndarray
        ``(chain, draw, n)``.
    """
    return predict_output(weights, X, activation, link=expit)


def quantity_draws(tasks: Tasks, weights: Sequence[np.ndarray], X: np.ndarray, activation: str) -> np.ndarray:
    """The function-space quantity (the likelihood's mean, in the label's original units) at rows ``X``.

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
        The data, for its likelihood and label scaling.
    weights : sequence of numpy.ndarray
        Per-layer weight draws ``(chain, draw, *layer.shape)`` (:func:`group_weights`).
    X : numpy.ndarray
        Rows ``(n, feature)``.
    activation : str
        The hidden units' activation.

    Returns
    -------
    numpy.ndarray
        ``(chain, draw, n)``.
    """
    return likelihoods.get(tasks.likelihood).mean(predict_output(weights, X, activation), tasks.y_mean, tasks.y_sd)


def evaluate_groups(
    tasks: Tasks, weights_of, activation: str, splits: Sequence[str] = ("train", "test"), noise_of=None
) -> dict[str, dict[str, list]]:
    """Posterior draws of the function-space quantity ``(chain, draw, n)`` for every group and split.

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
        The data.
    weights_of : callable
        ``weights_of(g)`` returns :func:`group_weights` for group index ``g``.
    activation : str
        The hidden units' activation.
    splits : sequence of str, optional
        The splits to evaluate.
    noise_of : callable, optional
        Where the likelihood has an extra parameter, ``noise_of(g)`` returns its draws (:func:`group_extra`).

    Returns
    -------
    dict
        ``{split: {"draws": [per group], "noise": [per group (chain, draw)] or None, "y": [per group]}}``, all
        in the label's original units (the tasks' ``y_mean`` and ``y_sd`` undone).
    """
    lik = likelihoods.get(tasks.likelihood)
    result = {}
    for name in splits:
        split: Split = tasks.split(name)
        draws, noise, ys = [], [], []
        for g in range(tasks.n_groups):
            rows = split.rows(g)
            draws.append(quantity_draws(tasks, weights_of(g), split.X[rows], activation))
            if lik.extra:
                noise.append(lik.extra_in_label_units(noise_of(g), tasks.y_sd))
            ys.append(lik.mean_label(split.y[rows], tasks.y_mean, tasks.y_sd))
        result[name] = {"draws": draws, "noise": noise if lik.extra else None, "y": ys}
    return result


def split_scores(lik: likelihoods.Likelihood, pred: dict[str, list]
                 ) -> tuple[dict[str, float], list[dict[str, float] | None]]:
    """Pooled scores over every row of a split, and per-group scores.

    Parameters
    ----------
    lik : hbnn.model.likelihoods.Likelihood
        The likelihood that scores.
    pred : dict of str to list
        One split of :func:`evaluate_groups`.

    Returns
    -------
    tuple
        The pooled scores and a list of per-group scores (``None`` for a group without rows).
    """
    noise = pred["noise"] or [None] * len(pred["draws"])
    points = [lik.pointwise(d, n, y) for d, n, y in zip(pred["draws"], noise, pred["y"], strict=True)]
    pooled = lik.scores({k: np.concatenate([p[k] for p in points]) for k in points[0]})
    per = [lik.scores(p) if y.size else None for p, y in zip(points, pred["y"], strict=True)]
    return pooled, per


def _test_draws(tasks: Tasks, posterior: xr.Dataset, specs: Sequence[LayerSpec], activation: str) -> list[np.ndarray]:
    """Every group's test-point quantity ``(chain, draw, n)`` at ``posterior``'s draws."""
    return evaluate_groups(tasks, lambda g: group_weights(posterior, specs, tasks.group_names[g]), activation,
                           ("test",),
                           noise_of=lambda g: group_extra(posterior, likelihoods.get(tasks.likelihood).extra,
                                                          tasks.group_names[g]))["test"]["draws"]


def split_order(split: Split, per_group: Sequence[np.ndarray]) -> np.ndarray:
    """Per-group arrays as one array in the split's row order.

    Parameters
    ----------
    split : hbnn.data.tasks.Split
        The split.
    per_group : sequence of numpy.ndarray
        Per group, ``(..., n_g)`` in :meth:`hbnn.data.tasks.Split.rows` order.

    Returns
    -------
    numpy.ndarray
        ``(..., n)``.
    """
    out = np.empty((*per_group[0].shape[:-1], split.y.size), dtype=np.result_type(*per_group))
    for g, values in enumerate(per_group):
        out[..., split.rows(g)] = values
    return out


def pointwise_log_likelihood(tasks: Tasks, pred: dict[str, list], split: str = "train") -> np.ndarray:
    """``log p(y_i | draw)`` over the rows of a split.

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
        The data, for its likelihood.
    pred : dict of str to list
        One split of :func:`evaluate_groups`.
    split : str, optional
        The split, whose row order the result follows.

    Returns
    -------
    numpy.ndarray
        ``(chain, draw, n)``.
    """
    lik = likelihoods.get(tasks.likelihood)
    noise = pred["noise"] or [None] * len(pred["draws"])
    per_group = [lik.log_density(d, n, y) for d, n, y in zip(pred["draws"], noise, pred["y"], strict=True)]
    return split_order(tasks.split(split), per_group)
