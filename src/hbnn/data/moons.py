"""Rotated two-moons tasks, drawn from one legacy ``RandomState`` stream as the original notebook drew them,
so that the default data equal the original's bit for bit.
"""

from __future__ import annotations

import logging

import numpy as np
import xarray as xr

from hbnn.data.layout import tasks_dataset
from hbnn.data.spec import DataSpec
from hbnn.files.io import InputError

log = logging.getLogger(__name__)


def group_names(n_groups: int) -> list[str]:
    """``g00, g01, ...`` zero-padded to sort in order for any ``n_groups``.

    Parameters
    ----------
    n_groups : int

    Returns
    -------
    list of str
    """
    width = max(2, len(str(n_groups - 1)))
    return [f"g{i:0{width}d}" for i in range(n_groups)]


def rotation_matrix(degrees: float) -> np.ndarray:
    """2x2 matrix ``R`` such that ``X @ R`` rotates row vectors by ``-degrees``.

    This is the convention of the original notebook (``X.dot([[c, -s], [s, c]])``).

    Parameters
    ----------
    degrees : float

    Returns
    -------
    numpy.ndarray
    """
    theta = np.radians(degrees)
    c, s = np.cos(theta), np.sin(theta)
    return np.array([[c, -s], [s, c]])


def rotate(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``x @ r`` for ``(n, 2)`` rows and a 2x2 ``r``, as the original's BLAS computed it, on every machine.

    NumPy hands ``@`` to BLAS, whose kernel is picked by CPU: those with fused multiply-adds (current x86-64 CPUs, and
    the original's) give ``fma(x1, r[1, j], x0 * r[0, j])``, the others round twice, so some values of the default data
    would differ in their last bit. Here the product ``x0 * r[0, j]`` is rounded once, and the fused step is done
    exactly (in fractions) and rounded once, as an FMA does.

    Parameters
    ----------
    x : numpy.ndarray
        ``(n, 2)`` rows.
    r : numpy.ndarray
        A 2x2 matrix (:func:`rotation_matrix`).

    Returns
    -------
    numpy.ndarray
        ``(n, 2)`` rotated rows.
    """
    from fractions import Fraction

    first = x[:, :1] * r[0]
    out = np.empty_like(first)
    for (i, j), base in np.ndenumerate(first):
        out[i, j] = float(Fraction(float(x[i, 1])) * Fraction(float(r[1, j])) + Fraction(float(base)))
    return out


def two_moons(n: int, noise: float, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved half circles with Gaussian noise, as scikit-learn's ``make_moons`` draws them.

    ``n // 2`` rows of class 0 above, the rest of class 1 below, shuffled: ``make_moons(n, noise=noise,
    random_state=rng)`` draw for draw and bit for bit (``tests/test_data.py``), without importing scikit-learn (which
    would be most of ``make_data``'s time).

    Parameters
    ----------
    n : int
        Rows.
    noise : float
        The noise's sd.
    rng : numpy.random.RandomState
        The stream to draw the shuffle and the noise from.

    Returns
    -------
    tuple of numpy.ndarray
        ``(x, y)``: ``(n, 2)`` coordinates and ``(n,)`` classes.
    """
    n_upper = n // 2
    upper, lower = np.linspace(0, np.pi, n_upper), np.linspace(0, np.pi, n - n_upper)
    x = np.vstack([np.append(np.cos(upper), 1 - np.cos(lower)), np.append(np.sin(upper), 1 - np.sin(lower) - 0.5)]).T
    y = np.hstack([np.zeros(n_upper, dtype=np.intp), np.ones(n - n_upper, dtype=np.intp)])
    order = np.arange(n)
    rng.shuffle(order)
    x, y = x[order], y[order]
    x += rng.normal(scale=noise, size=x.shape)
    return x, y


def standardise_columns(x: np.ndarray) -> np.ndarray:
    """Each column less its mean, over its standard deviation (1 where that is ~0).

    As scikit-learn's ``preprocessing.scale`` computes it, with its second centring where the first left a mean not
    close to 0.

    Parameters
    ----------
    x : numpy.ndarray
        ``(n, columns)``; NaNs are ignored in the statistics.

    Returns
    -------
    numpy.ndarray
        A standardised copy.
    """
    x = np.array(x, dtype=np.float64)
    mean, sd = np.nanmean(x, axis=0), np.nanstd(x, axis=0)
    sd[sd < 10 * np.finfo(sd.dtype).eps] = 1.0
    x -= mean
    left = np.nanmean(x, axis=0)
    if not np.allclose(left, 0):
        x -= left
    x /= sd
    left = np.nanmean(x, axis=0)
    if not np.allclose(left, 0):
        x -= left
    return x


def make_moons_tasks(spec: DataSpec) -> xr.Dataset:
    """Rotated two-moons tasks, one per group, in the long layout.

    All randomness comes from one legacy ``RandomState(spec.seed)`` stream, used per group in the original order: the
    moons' shuffle and noise, then the rotation angle ``N(0, 1) * rotation_deg``. With the defaults this reproduces the
    original notebook's data bit for bit. The first ``train_fraction`` of each group's rows are training rows, the rest
    test rows.

    Parameters
    ----------
    spec : hbnn.data.spec.DataSpec
        ``seed``, ``n_groups`` and ``data`` (``n_samples``, ``noise``, ``rotation_deg``, ``train_fraction``).

    Returns
    -------
    xarray.Dataset
        The tasks (:func:`hbnn.data.layout.tasks_dataset`) with each group's ``rotation_deg``.

    Raises
    ------
    hbnn.errors.InputError
        If ``data.noise`` is so large that the coordinates cannot be standardised.
    """
    d = spec.data
    rng = np.random.RandomState(spec.seed)
    n_train = round(d.n_samples * d.train_fraction)
    names = group_names(spec.n_groups)
    xs, ys, angles = [], [], []
    for _ in names:
        x, y = two_moons(d.n_samples, d.noise, rng)
        with np.errstate(over="ignore", invalid="ignore"):  # refused just below, by name
            scaled = bool(np.isfinite(np.nanstd(x, axis=0)).all())
        if not scaled:  # past ~1e154 the squares overflow: the sd is inf and every feature would become 0
            raise InputError(f"invalid parameter data.noise={d.noise!r}: the moons' coordinates cannot be "
                             "standardised (their variance overflows float64); use a smaller noise")
        x = standardise_columns(x)
        angle = rng.randn() * d.rotation_deg
        xs.append(rotate(x, rotation_matrix(angle)))
        ys.append(y)
        angles.append(angle)
    split = np.array(["train"] * n_train + ["test"] * (d.n_samples - n_train))
    ds = tasks_dataset(
        X=np.concatenate(xs),
        y=np.concatenate(ys),
        group=np.repeat(names, d.n_samples),
        split=np.tile(split, spec.n_groups),
        features=["x1", "x2"],
    )
    # Per-group values use the dim "task": "group" already names the per-row labels.
    ds["rotation_deg"] = xr.DataArray(np.array(angles), dims="task", coords={"task": names})
    ds.attrs["source"] = "moons"
    # Each group was already scaled on its own (as in the original); nothing more to undo.
    ds.attrs["group_column"] = "group"
    return ds
