"""The transfer experiment: does the informed prior help a group the hierarchy never saw?

``transfer_prior`` holds out some groups (:func:`holdout`), fits the hierarchical
model on the others and derives the informed prior from that fit. ``transfer``
refits every held-out group on nested subsets of its training rows
(:func:`nested_order`, :func:`refit_tasks`) with the flat and the informed prior,
and scores them, and the hierarchical population's prediction for an unseen group
(no rows, "n = 0"), on the group's own test rows (:func:`size_scores`,
:func:`paired_difference`, :func:`stops_mattering`).

Each (held-out group, size) pair is one "fit" of the per-group stages: a group
named ``<group>/<size>`` (``g05/n8``, ``g05/all``) whose training rows are the
subset and whose test rows are all of the group's test rows, so the per-group
machinery (one compile, seeded per fit, the same scores and diagnostics) applies
unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hbnn.config import TransferParams
from hbnn.errors import InputError
from hbnn.model import likelihoods
from hbnn.pipeline.variants import STAGE_KEYS, derive_seed

if TYPE_CHECKING:  # xarray and pandas (hbnn.data.tasks) only where the refits are built: check_params reads the rest
    from hbnn.data.tasks import Tasks

log = logging.getLogger(__name__)

ALL = "all"  # the size label of "every training row of the group"
POPULATION = "n0"  # the size label of the population's prediction (no rows of the group)


def require_groups(n_groups: int, what: str = "the data") -> None:
    """Refuse data with fewer than 2 groups: nothing could be held out and fitted.

    The pipeline's ``check_params`` and ``make_data`` check it too, before any stage samples.

    Parameters
    ----------
    n_groups : int
    what : str, optional
        Names the data in the message (:func:`data_name`).

    Raises
    ------
    hbnn.errors.InputError
        With fewer than 2 groups.
    """
    if n_groups < 2:
        raise InputError(f"the transfer stages need at least 2 groups (one to fit, one to hold out); {what} has "
                         f"{n_groups}")


def data_name(params) -> str:
    """Name the data of ``params`` as :func:`require_groups` calls it: a table by its file and group column.

    Parameters
    ----------
    params : hbnn.config.Params

    Returns
    -------
    str
    """
    d = params.data
    return f"table {d.path} (groups: data.group={d.group!r})" if d.source == "table" else "the data"


def refit_sizes(n_train: int, t: TransferParams) -> list[tuple[str, int]]:
    """List the fits of a held-out group with ``n_train`` training rows.

    Each of ``transfer.sizes`` below ``n_train`` (with as many or more it would be the group's ``all`` fit, or repeat a
    smaller size), then every row (``all``) where ``transfer.all_rows``.

    Parameters
    ----------
    n_train : int
    t : hbnn.config.TransferParams

    Returns
    -------
    list of tuple of (str, int)
        ``(label, rows)`` per fit, e.g. ``("n8", 8)``.
    """
    return [(f"n{n}", n) for n in t.sizes if n < n_train] + ([(ALL, n_train)] if t.all_rows else [])


def refit_rows(t: TransferParams) -> list[int]:
    """Return the sizes the hierarchical refit runs at: each of ``transfer.refit_sizes`` that is one of ``sizes``.

    A refit size without flat and informed fits beside it would be a line with nothing to compare.

    Parameters
    ----------
    t : hbnn.config.TransferParams

    Returns
    -------
    list of int
    """
    return [n for n in t.sizes if n in t.refit_sizes]


def check_refits(train_rows: Sequence[int], t: TransferParams) -> None:
    """Refuse held-out groups whose training rows leave nothing to fit.

    This is what ``transfer`` would find, said by ``check_params`` before any stage samples and by ``transfer_prior``
    before its fit.

    Parameters
    ----------
    train_rows : sequence of int
        Training rows of each held-out group.
    t : hbnn.config.TransferParams

    Raises
    ------
    hbnn.errors.InputError
        Where no held-out group has a fit (:func:`refit_sizes`).
    """
    if not any(refit_sizes(n, t) for n in train_rows):
        raise InputError(f"transfer: no held-out group has more training rows than transfer.sizes={list(t.sizes)} "
                         "and transfer.all_rows is false; nothing to fit")


def holdout_count(n_groups: int, t: TransferParams) -> int:
    """Count the groups to hold out: ``max(min_holdout, round(holdout_fraction * n_groups))``.

    At least 2 groups are left to fit (1 with 2 groups).

    Parameters
    ----------
    n_groups : int
    t : hbnn.config.TransferParams

    Returns
    -------
    int

    Raises
    ------
    hbnn.errors.InputError
        With fewer than 2 groups (:func:`require_groups`).
    """
    require_groups(n_groups)
    k = max(t.min_holdout, round(t.holdout_fraction * n_groups))
    return max(1, min(k, n_groups - 2))


def holdout(group_names: Sequence[str], t: TransferParams) -> list[str]:
    """Choose the held-out groups: a seeded choice (``transfer.seed``) of :func:`holdout_count` groups.

    Parameters
    ----------
    group_names : sequence of str
        The groups, in tasks order.
    t : hbnn.config.TransferParams

    Returns
    -------
    list of str
        The held-out groups' names, in tasks order.

    Raises
    ------
    hbnn.errors.InputError
        With fewer than 2 groups (:func:`require_groups`).
    """
    k = holdout_count(len(group_names), t)
    rng = np.random.default_rng(derive_seed(t.seed, STAGE_KEYS["transfer_split"], 0))
    picked = rng.choice(len(group_names), size=k, replace=False)
    return [group_names[i] for i in sorted(picked)]


def nested_order(y: np.ndarray, stratify: bool, rng: np.random.Generator) -> np.ndarray:
    """Order a group's training rows so that every prefix is a seeded subset, stratified by label if asked.

    Stratified: rows of each label in a random order, interleaved so that after
    ``i`` rows each label has as close to its share of ``i`` as possible (ties go to
    the label with more rows left, then the smaller label); the first two rows of
    a group with both labels are one of each. Otherwise a random permutation.

    Parameters
    ----------
    y : numpy.ndarray
        The group's training labels.
    stratify : bool
        Interleave the labels (classifiers) rather than permute.
    rng : numpy.random.Generator

    Returns
    -------
    numpy.ndarray
        Positions into ``y``, int64.
    """
    n = y.size
    if not stratify:
        return rng.permutation(n)
    labels, counts = np.unique(y, return_counts=True)
    pools = [list(rng.permutation(np.flatnonzero(y == lab))) for lab in labels]
    taken = np.zeros(labels.size)
    order = []
    for i in range(1, n + 1):
        left = np.array([len(p) for p in pools])
        deficit = np.where(left > 0, i * counts / n - taken, -np.inf)
        best = max(range(labels.size), key=lambda c: (deficit[c], left[c], -c))
        order.append(pools[best].pop(0))
        taken[best] += 1
    return np.array(order, dtype=np.int64)


@dataclass(frozen=True)
class Refit:
    """One fit of a held-out group on a subset of its training rows: the name of its pseudo-group."""

    group: str
    size: str  # n2, n4, ..., all
    rows: int  # training rows it sees

    @property
    def name(self) -> str:
        """The pseudo-group's name, ``<group>/<size>`` (``g05/n8``, ``g05/all``)."""
        return f"{self.group}/{self.size}"


def size_labels(t: TransferParams) -> list[str]:
    """Return the size labels ``n2, n4, ..., all`` in fit order.

    Parameters
    ----------
    t : hbnn.config.TransferParams
        ``sizes`` and ``all_rows``.

    Returns
    -------
    list of str
    """
    return [f"n{n}" for n in t.sizes] + ([ALL] if t.all_rows else [])


def groups_by_size(fits: Iterable[str]) -> dict[str, list[str]]:
    """Collect the held-out groups fitted at each size, in increasing size.

    A group with fewer training rows than a size is not fitted at it, so with groups of unequal sizes the larger sizes
    pool fewer groups.

    Parameters
    ----------
    fits : iterable of str
        The fits' names (``<group>/<size>``, :attr:`Refit.name`; the keys of a ``fits.<model>`` section of the transfer
        metrics).

    Returns
    -------
    dict of str to list of str
        Size label -> the groups fitted at it.
    """
    out: dict[str, list[str]] = {}
    for name in fits:
        group, _, size = name.rpartition("/")
        out.setdefault(size, []).append(group)
    return in_size_order(out)


def pools_differ(by_size: dict[str, list[str]]) -> bool:
    """Return whether the sizes pool different groups.

    Parameters
    ----------
    by_size : dict of str to list of str
        :func:`groups_by_size`.

    Returns
    -------
    bool
    """
    return len({tuple(groups) for groups in by_size.values()}) > 1


def in_size_order(by_size: dict) -> dict:
    """Return ``by_size`` in increasing size.

    Parameters
    ----------
    by_size : dict
        Keyed by size label (``n2``, ``n16``, ``all``); JSON files hold them sorted as text.

    Returns
    -------
    dict
    """
    return dict(sorted(by_size.items(), key=lambda kv: float("inf") if kv[0] == ALL else int(kv[0][1:])))


def refit_tasks(tasks: Tasks, heldout: Sequence[str], t: TransferParams) -> tuple[Tasks, list[Refit], list[str]]:
    """Build tasks with one pseudo-group per (held-out group, size), what each is, and the skipped pairs.

    A group's fits are :func:`refit_sizes`. The nested row order of each group comes from ``transfer.seed`` and the
    group's position in the tasks, so it is the same for every size and model.

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
    heldout : sequence of str
        The held-out groups (:func:`holdout`).
    t : hbnn.config.TransferParams

    Returns
    -------
    hbnn.data.tasks.Tasks
        The pseudo-groups' rows: the subset of training rows and all of the group's test rows.
    list of Refit
        What each pseudo-group is, in the tasks' order.
    list of str
        Every skipped pair, as ``"<group>/n<size> (<rows> training rows)"``.

    Raises
    ------
    hbnn.errors.InputError
        Where no held-out group has a fit (:func:`check_refits`).
    """
    from hbnn.data.layout import group_slices
    from hbnn.data.tasks import Tasks

    lik = likelihoods.get(tasks.likelihood)
    ds = tasks.ds
    split = ds["split"].values.astype(str)
    position = {name: g for g, name in enumerate(tasks.group_names)}
    # split: (order, bounds) of its rows by group (hbnn.data.layout.group_slices), each group in stored order
    rows_of = {}
    for part in ("train", "test"):
        idx = np.flatnonzero(split == part)
        order, bounds = group_slices(tasks.group_codes[idx], tasks.n_groups)
        rows_of[part] = idx[order], bounds

    def group_rows(part: str, g: int) -> np.ndarray:
        ordered, bounds = rows_of[part]
        return ordered[bounds[g]:bounds[g + 1]]

    check_refits([group_rows("train", position[name]).size for name in heldout], t)
    picked, names, refits, skipped = [], [], [], []
    for name in heldout:
        g = position[name]
        train, test = group_rows("train", g), group_rows("test", g)
        rng = np.random.default_rng(derive_seed(t.seed, STAGE_KEYS["transfer_split"], 1, g))
        order = train[nested_order(ds["y"].values[train], lik.classifier, rng)]
        skipped += [f"{name}/n{n} ({train.size} training rows)" for n in t.sizes if n >= train.size]
        for label, n in refit_sizes(train.size, t):
            refit = Refit(name, label, int(n))
            # Rows in stored order: the subset is a set; its order came from the nested draw.
            picked.append(np.concatenate([np.sort(order[:n]), test]))
            names.append(refit.name)
            refits.append(refit)
    out = ds.isel(obs=np.concatenate(picked))  # one selection of every refit's rows, not a dataset per refit
    out["group"] = ("obs", np.repeat(np.array(names), [r.size for r in picked]))
    out = out.assign_coords(source_obs=("obs", out["obs"].values))
    return Tasks(out.assign_coords(obs=np.arange(out.sizes["obs"]))), refits, skipped


def subset(pred: dict[str, list], indices: Sequence[int]) -> dict[str, list]:
    """Select the fits ``indices`` of one split of :func:`hbnn.diagnostics.predictions.evaluate_groups` (for its
    ``split_scores``).

    Parameters
    ----------
    pred : dict of str to list
        One split's ``draws``, ``y`` and ``noise`` (``None`` or one per fit).
    indices : sequence of int

    Returns
    -------
    dict of str to list
        The same keys, for the fits ``indices``.
    """
    return {"draws": [pred["draws"][i] for i in indices], "y": [pred["y"][i] for i in indices],
            "noise": None if pred["noise"] is None else [pred["noise"][i] for i in indices]}


def row_lpd(lik: likelihoods.Likelihood, pred: dict[str, list]) -> np.ndarray:
    """Compute the log predictive density of each test row: ``log mean_s p(y_i | draw s)``.

    Parameters
    ----------
    lik : hbnn.model.likelihoods.base.Likelihood
    pred : dict of str to list
        Fits of one split (a :func:`subset`).

    Returns
    -------
    numpy.ndarray
        One value per row, the fits' rows one after another.
    """
    noise = pred["noise"] or [None] * len(pred["draws"])
    out = []
    for draws, sd, y in zip(pred["draws"], noise, pred["y"], strict=True):
        logp = lik.log_density(draws, sd, y).reshape(-1, y.size)
        top = logp.max(axis=0)
        out.append(top + np.log(np.exp(logp - top).mean(axis=0)))
    return np.concatenate(out)


def paired_difference(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Compute the mean of ``a - b`` over rows and its standard error (:func:`mean_se`), paired: the rows are shared.

    Parameters
    ----------
    a, b : numpy.ndarray
        Per-row values of two models on the same rows.

    Returns
    -------
    dict of str to float
        ``mean``, ``se`` (NaN for one row) and ``n``.
    """
    d = a - b
    return {"mean": float(d.mean()), "se": mean_se(d), "n": int(d.size)}


def mean_se(values: np.ndarray) -> float:
    """Return the standard error of the mean of per-row values, ``sd / sqrt(n)``; NaN for one row.

    Parameters
    ----------
    values : numpy.ndarray

    Returns
    -------
    float
    """
    return float(values.std(ddof=1) / np.sqrt(values.size)) if values.size > 1 else float("nan")


def stops_mattering(differences: dict[str, dict[str, float]], z: float = 2.0) -> str | None:
    """Find the size from which on the informed prior stops mattering.

    The smallest size from which on the informed-minus-flat difference in test log density lies within ``z``
    standard errors of zero at every larger size.

    Parameters
    ----------
    differences : dict of str to dict of str to float
        :func:`paired_difference` per size label, in increasing size order.
    z : float, optional

    Returns
    -------
    str or None
        That size's label; ``None`` if it still matters at the largest size.
    """
    answer = None
    for label, d in reversed(differences.items()):
        if not abs(d["mean"]) <= z * d["se"]:
            break
        answer = label
    return answer


def pooled_tasks(tasks: Tasks, kept: Sequence[str], refit: Tasks, refits: Sequence[Refit], size: str
                 ) -> tuple[Tasks, list[str]]:
    """Build the tasks of one hierarchical refit: the training groups' rows plus each held-out group's rows at ``size``.

    The held-out groups keep their names, as when a user adds new groups' rows to the data; the rows are
    :func:`refit_tasks`' at that size, those of the flat and informed fits.

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
        Every group's rows.
    kept : sequence of str
        The training groups, every row of which the refit takes.
    refit, refits : hbnn.data.tasks.Tasks, sequence of Refit
        :func:`refit_tasks`' pseudo-groups and what each is.
    size : str
        The size label (``n2``, ``all``).

    Returns
    -------
    hbnn.data.tasks.Tasks
        The rows in stored order (every group in its tasks order).
    list of str
        The held-out groups fitted at ``size``, in tasks order (those with more training rows than it).
    """
    import pandas as pd

    from hbnn.data.tasks import Tasks

    names = refit.ds["group"].values.astype(str)
    at_size = [r for r in refits if r.size == size]
    source = refit.ds["source_obs"].values[np.isin(names, [r.name for r in at_size])]
    position = pd.Index(tasks.ds["obs"].values).get_indexer(source)  # source_obs: the rows' obs in ``tasks``
    own = np.flatnonzero(np.isin(tasks.ds["group"].values.astype(str), list(kept)))
    return Tasks(tasks.ds.isel(obs=np.sort(np.concatenate([own, position])))), [r.group for r in at_size]
