"""The long layout the tasks are stored in: one row per observation with ``X[obs, feature]``, ``y[obs]``,
``group[obs]`` (the group's name) and ``split[obs]`` (``train``/``test``), plus the standardisation
statistics ``x_mean[feature]``, ``x_sd[feature]``, ``y_mean`` and ``y_sd`` that map raw values to the stored
(model) scale: ``X = (raw - x_mean) / x_sd``. Groups may have any number of rows.
"""

from __future__ import annotations

import logging

import numpy as np
import xarray as xr

from hbnn.model import likelihoods

log = logging.getLogger(__name__)


SPLITS = ("train", "test")


MIN_TRAIN_ROWS = 2


def tasks_dataset(
    X, y, group, split, features, likelihood: str = "bernoulli", x_mean=None, x_sd=None, y_mean=0.0, y_sd=1.0
) -> xr.Dataset:
    """Assemble the long-layout dataset from row-aligned arrays.

    Parameters
    ----------
    X : array_like
        ``(obs, feature)`` features on the model scale.
    y : array_like
        ``(obs,)`` labels, stored in the likelihood's label dtype (int64 for counts and classes, float64 for gaussian).
    group, split : array_like
        ``(obs,)`` group names and ``train``/``test``.
    features : sequence of str
        The feature names.
    likelihood : str, optional
        The likelihood's name, stored as an attr.
    x_mean, x_sd : array_like, optional
        ``(feature,)`` standardisation statistics (default: mean 0, sd 1, the identity).
    y_mean, y_sd : float, optional
        The labels' standardisation statistics.

    Returns
    -------
    xarray.Dataset
        The tasks in the long layout (see the module).
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    y_dtype = likelihoods.get(likelihood).label_dtype
    return xr.Dataset(
        {
            "X": (("obs", "feature"), X),
            "y": ("obs", np.asarray(y, dtype=y_dtype)),
            "group": ("obs", np.asarray(group).astype(str)),
            "split": ("obs", np.asarray(split).astype(str)),
            "x_mean": ("feature", np.zeros(d) if x_mean is None else np.asarray(x_mean, dtype=np.float64)),
            "x_sd": ("feature", np.ones(d) if x_sd is None else np.asarray(x_sd, dtype=np.float64)),
            "y_mean": ((), float(y_mean)),
            "y_sd": ((), float(y_sd)),
        },
        coords={"obs": np.arange(n), "feature": list(features)},
        attrs={"likelihood": likelihood},
    )


def group_slices(codes: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Each group's positions in ``codes``, from one stable sort.

    Code that visits every group is then linear in the rows (a mask ``codes == g`` per group would be quadratic in the
    groups).

    Parameters
    ----------
    codes : numpy.ndarray
        Integer group codes per row, each below ``n_groups``.
    n_groups : int
        The number of groups.

    Returns
    -------
    tuple of numpy.ndarray
        ``(order, bounds)``: ``order[bounds[g]:bounds[g + 1]]`` are the positions of code ``g``, in increasing order.
    """
    order = np.argsort(codes, kind="stable")
    bounds = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(codes, minlength=n_groups), out=bounds[1:])
    return order, bounds
