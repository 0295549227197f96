"""Grouped binary-classification tasks: generation, layout and conversion.

The long layout is the storage format: one row per observation with ``X[obs,
feature]``, ``y[obs]``, ``group[obs]`` (the group's name) and ``split[obs]``
(``"train"``/``"test"``). Groups may have any number of rows. Models that need a
per-group block layout get it from :meth:`Tasks.padded`, which also returns the
positions of the real rows so that padding never reaches a likelihood.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr
from sklearn.datasets import make_moons
from sklearn.preprocessing import scale

from hbnn.config import Params

SPLITS = ("train", "test")


def group_names(n_groups: int) -> list[str]:
    """``g00, g01, ...`` zero-padded to sort in order for any ``n_groups``."""
    width = max(2, len(str(n_groups - 1)))
    return [f"g{i:0{width}d}" for i in range(n_groups)]


def rotation_matrix(degrees: float) -> np.ndarray:
    """2x2 matrix ``R`` such that ``X @ R`` rotates row vectors by ``-degrees``.

    This is the convention of the original notebook (``X.dot([[c, -s], [s, c]])``).
    """
    theta = np.radians(degrees)
    c, s = np.cos(theta), np.sin(theta)
    return np.array([[c, -s], [s, c]])


def make_moons_tasks(params: Params) -> xr.Dataset:
    """Rotated two-moons tasks, one per group, in the long layout.

    All randomness comes from one legacy ``RandomState(params.seed)`` stream, used
    per group in the original order: the moons' shuffle and noise, then the
    rotation angle ``N(0, 1) * rotation_deg``. With the defaults this reproduces the
    original notebook's data bit for bit. The first ``train_fraction`` of each
    group's rows are training rows, the rest test rows.
    """
    d = params.data
    rng = np.random.RandomState(params.seed)
    n_train = round(d.n_samples * d.train_fraction)
    names = group_names(params.n_groups)
    xs, ys, angles = [], [], []
    for _ in names:
        x, y = make_moons(n_samples=d.n_samples, noise=d.noise, random_state=rng)
        x = scale(x)
        angle = rng.randn() * d.rotation_deg
        xs.append(x @ rotation_matrix(angle))
        ys.append(y)
        angles.append(angle)
    split = np.array(["train"] * n_train + ["test"] * (d.n_samples - n_train))
    ds = tasks_dataset(
        X=np.concatenate(xs),
        y=np.concatenate(ys),
        group=np.repeat(names, d.n_samples),
        split=np.tile(split, params.n_groups),
        features=["x1", "x2"],
    )
    # Per-group values use the dim "task": "group" already names the per-row labels.
    ds["rotation_deg"] = xr.DataArray(np.array(angles), dims="task", coords={"task": names})
    ds.attrs["source"] = "moons"
    return ds


def tasks_dataset(X, y, group, split, features) -> xr.Dataset:
    """Assemble the long-layout dataset from row-aligned arrays."""
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    return xr.Dataset(
        {
            "X": (("obs", "feature"), X),
            "y": ("obs", np.asarray(y, dtype=np.int64)),
            "group": ("obs", np.asarray(group).astype(str)),
            "split": ("obs", np.asarray(split).astype(str)),
        },
        coords={"obs": np.arange(n), "feature": list(features)},
    )


@dataclass(frozen=True)
class Split:
    """One split of the tasks as row-aligned arrays; ``group`` holds integer codes."""

    X: np.ndarray  # (n, feature)
    y: np.ndarray  # (n,)
    group: np.ndarray  # (n,) int codes into Tasks.group_names
    obs: np.ndarray  # (n,) row ids in the long dataset

    def rows(self, g: int) -> np.ndarray:
        """Indices (into this split) of group ``g``'s rows, in stored order."""
        return np.flatnonzero(self.group == g)


@dataclass(frozen=True)
class Padded:
    """Per-group block layout of one split.

    ``X[g, i]`` is group ``g``'s ``i``-th row for ``i < counts[g]``; later rows are
    zero padding. ``valid`` indexes the real rows in ``X.reshape(-1, D)`` order and
    ``y`` holds their labels in that same order.
    """

    X: np.ndarray  # (group, row, feature)
    y: np.ndarray  # (n_valid,)
    counts: np.ndarray  # (group,)
    valid: np.ndarray  # (n_valid,) positions in the flattened (group*row) axis
    obs: np.ndarray  # (n_valid,) row ids in the long dataset

    @property
    def is_ragged(self) -> bool:
        return bool(self.valid.size != self.X.shape[0] * self.X.shape[1])


class Tasks:
    """Read-only view of the long-layout dataset."""

    def __init__(self, ds: xr.Dataset):
        self.ds = ds
        labels = ds["group"].values.astype(str)
        # Group order is order of first appearance, so g00.. stay in their generated order.
        _, first = np.unique(labels, return_index=True)
        self.group_names: list[str] = [str(labels[i]) for i in sorted(first)]
        lookup = {name: i for i, name in enumerate(self.group_names)}
        self.group_codes = np.array([lookup[s] for s in labels], dtype=np.int64)
        self.features: list[str] = [str(f) for f in ds["feature"].values]

    @property
    def n_groups(self) -> int:
        return len(self.group_names)

    @property
    def n_features(self) -> int:
        return len(self.features)

    def split(self, which: str) -> Split:
        """Rows of ``which`` (``"train"`` or ``"test"``), group-sorted, stable within group."""
        mask = self.ds["split"].values.astype(str) == which
        idx = np.flatnonzero(mask)
        idx = idx[np.argsort(self.group_codes[idx], kind="stable")]
        return Split(
            X=self.ds["X"].values[idx],
            y=self.ds["y"].values[idx],
            group=self.group_codes[idx],
            obs=self.ds["obs"].values[idx],
        )

    def padded(self, which: str) -> Padded:
        """Block layout of a split for batched models (see :class:`Padded`)."""
        s = self.split(which)
        counts = np.bincount(s.group, minlength=self.n_groups)
        width = int(counts.max()) if counts.size else 0
        X = np.zeros((self.n_groups, width, self.n_features))
        valid = []
        for g in range(self.n_groups):
            rows = s.rows(g)
            X[g, : rows.size] = s.X[rows]
            valid.append(g * width + np.arange(rows.size))
        valid = np.concatenate(valid) if valid else np.zeros(0, dtype=np.int64)
        return Padded(X=X, y=s.y, counts=counts, valid=valid, obs=s.obs)
