"""The tasks as the models read them: their splits and the per-group block layout.

:class:`Tasks` reads the long layout (:mod:`hbnn.data.layout`); its splits
(:class:`Split`) and the per-group block layout (:meth:`Tasks.padded`), which also returns the positions of the real
rows so that padding never reaches a likelihood; :func:`make_tasks` makes them from moons (:mod:`hbnn.data.moons`)
or a user's table (:mod:`hbnn.data.tables`), :func:`load_tasks` reads ``data/tasks.nc``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from hbnn.data.moons import make_moons_tasks
from hbnn.data.spec import DataSpec
from hbnn.data.tables import load_table_tasks
from hbnn.files.io import InputError, check_made_with, load_dataset

log = logging.getLogger(__name__)


def make_tasks(spec: DataSpec) -> xr.Dataset:
    """The tasks ``spec.data.source`` asks for: moons or a user's table.

    Parameters
    ----------
    spec : hbnn.data.spec.DataSpec
        The data the run asks for (:meth:`hbnn.data.spec.DataSpec.of` a run's params).

    Returns
    -------
    xarray.Dataset
        The tasks in the long layout.

    Raises
    ------
    hbnn.errors.InputError
        Where a user's table cannot be read or used.
    """
    if spec.data.source == "table":
        return load_table_tasks(spec)
    return make_moons_tasks(spec)


@dataclass(frozen=True)
class Split:
    """One split of the tasks as row-aligned arrays.

    Parameters
    ----------
    X : numpy.ndarray
        Inputs ``(n, feature)``.
    y : numpy.ndarray
        Labels ``(n,)``.
    group : numpy.ndarray
        Integer codes ``(n,)`` into :attr:`Tasks.group_names`.
    obs : numpy.ndarray
        Row ids ``(n,)`` in the long dataset.
    """

    X: np.ndarray  # (n, feature)
    y: np.ndarray  # (n,)
    group: np.ndarray  # (n,) int codes into Tasks.group_names
    obs: np.ndarray  # (n,) row ids in the long dataset

    def rows(self, g: int) -> np.ndarray:
        """Indices (into this split) of group ``g``'s rows, in stored order.

        A binary search in the group-sorted codes, so that visiting every group is linear in the rows (a mask
        per group would be quadratic in the groups).

        Parameters
        ----------
        g : int
            The group's code.

        Returns
        -------
        numpy.ndarray
            The indices, read-only.
        """
        order, codes = self._by_group
        lo, hi = np.searchsorted(codes, [g, g + 1])
        return order[lo:hi]

    @functools.cached_property
    def _by_group(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows in group order (stable) and their codes in that order, computed once."""
        order = np.argsort(self.group, kind="stable")
        codes = self.group[order]
        order.setflags(write=False)
        return order, codes


@dataclass(frozen=True)
class Padded:
    """Per-group block layout of one split.

    Parameters
    ----------
    X : numpy.ndarray
        ``(group, row, feature)``: ``X[g, i]`` is group ``g``'s ``i``-th row for ``i < counts[g]``; later rows
        are zero padding.
    y : numpy.ndarray
        The real rows' labels ``(n_valid,)``, in the order of ``valid``.
    counts : numpy.ndarray
        Real rows per group.
    valid : numpy.ndarray
        The real rows' positions ``(n_valid,)`` in ``X.reshape(-1, D)`` order.
    obs : numpy.ndarray
        The real rows' ids ``(n_valid,)`` in the long dataset.
    """

    X: np.ndarray  # (group, row, feature)
    y: np.ndarray  # (n_valid,)
    counts: np.ndarray  # (group,)
    valid: np.ndarray  # (n_valid,) positions in the flattened (group*row) axis
    obs: np.ndarray  # (n_valid,) row ids in the long dataset

    @property
    def is_ragged(self) -> bool:
        """Whether any group has padding rows."""
        return bool(self.valid.size != self.X.shape[0] * self.X.shape[1])


class Tasks:
    """Read-only view of the long-layout dataset.

    Groups are numbered in order of first appearance; the inputs' and labels' training statistics
    (``x_mean``, ``x_sd``, ``y_mean``, ``y_sd``) are the identity where the file has none (moons data).

    Parameters
    ----------
    ds : xarray.Dataset
        The tasks in the long layout (:mod:`hbnn.data.layout`).
    """

    def __init__(self, ds: xr.Dataset):
        self.ds = ds
        labels = ds["group"].values.astype(str)
        # Group order is order of first appearance, so g00.. stay in their generated order.
        codes, uniques = pd.factorize(labels)
        self.group_names: list[str] = [str(name) for name in uniques]
        self.group_codes = codes.astype(np.int64)
        self.features: list[str] = [str(f) for f in ds["feature"].values]
        d = len(self.features)
        # Files without the statistics hold moons data: the identity.
        self.x_mean = ds["x_mean"].values if "x_mean" in ds else np.zeros(d)
        self.x_sd = ds["x_sd"].values if "x_sd" in ds else np.ones(d)
        self.y_mean = float(ds["y_mean"]) if "y_mean" in ds else 0.0
        self.y_sd = float(ds["y_sd"]) if "y_sd" in ds else 1.0
        self.likelihood: str = str(ds.attrs.get("likelihood", "bernoulli"))
        self.group_column: str = str(ds.attrs.get("group_column", "group"))

    @property
    def n_groups(self) -> int:
        """The number of groups."""
        return len(self.group_names)

    @property
    def n_features(self) -> int:
        """The number of input features."""
        return len(self.features)

    def split(self, which: str) -> Split:
        """The rows of one split, group-sorted, stable within group.

        Parameters
        ----------
        which : str
            ``"train"`` or ``"test"``.

        Returns
        -------
        Split
            Its rows.
        """
        mask = self.ds["split"].values.astype(str) == which
        idx = np.flatnonzero(mask)
        idx = idx[np.argsort(self.group_codes[idx], kind="stable")]
        return Split(
            X=self.ds["X"].values[idx],
            y=self.ds["y"].values[idx],
            group=self.group_codes[idx],
            obs=self.ds["obs"].values[idx],
        )

    def subset(self, groups: Sequence[str]) -> Tasks:
        """The tasks of some groups only: their rows, in stored order, with the same statistics and attrs.

        Parameters
        ----------
        groups : sequence of str
            The groups to keep.

        Returns
        -------
        Tasks
            The subset.
        """
        keep = np.isin(self.ds["group"].values.astype(str), [str(g) for g in groups])
        return Tasks(self.ds.isel(obs=np.flatnonzero(keep)))

    def padded(self, which: str) -> Padded:
        """Block layout of a split for batched models.

        Parameters
        ----------
        which : str
            ``"train"`` or ``"test"``.

        Returns
        -------
        Padded
            The split's rows in per-group blocks.
        """
        s = self.split(which)  # group-sorted: group g's rows are one run, in stored order
        counts = np.bincount(s.group, minlength=self.n_groups)
        width = int(counts.max()) if counts.size else 0
        X = np.zeros((self.n_groups, width, self.n_features))
        starts = np.cumsum(counts) - counts
        valid = (s.group * width + np.arange(s.group.size) - starts[s.group]).astype(np.int64)
        X.reshape(-1, self.n_features)[valid] = s.X
        return Padded(X=X, y=s.y, counts=counts, valid=valid, obs=s.obs)


def load_tasks(path: Path, likelihood: str | None = None, check_attrs=None) -> Tasks:
    """Read and check ``data/tasks.nc``, opened once.

    Whether the file was made with the run's params is the stage's check, which holds the params
    (:func:`hbnn.pipeline.stages.load_run_tasks`); this one checks that ``make_data`` wrote it.

    Parameters
    ----------
    path : pathlib.Path
        The tasks file.
    likelihood : str or None, optional
        Given, the file must have been made for this likelihood.
    check_attrs : callable, optional
        Called with the file's attrs before its variables are read; it raises where they are not what the caller
        needs.

    Returns
    -------
    Tasks
        The tasks.

    Raises
    ------
    hbnn.errors.InputError
        If the file is missing, unreadable or lacks a variable, was made by another stage or for another
        likelihood, or fails ``check_attrs``.
    """
    ds = load_dataset(path, "tasks file", required=("X", "y", "group", "split"))
    check_made_with(ds.attrs, None, path, "make_data")
    if check_attrs is not None:
        check_attrs(ds.attrs)
    tasks = Tasks(ds)
    if likelihood is not None and tasks.likelihood != likelihood:
        raise InputError(f"tasks file {path} was made for model.likelihood={tasks.likelihood!r} but the params say "
                         f"{likelihood!r}; rerun make_data (dvc repro)")
    return tasks
