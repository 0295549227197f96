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
    """:class:`InputError` with fewer than 2 groups: nothing could be held out and fitted. The pipeline's
    ``check_params`` and ``make_data`` check it too, before any stage samples; ``what`` names the data."""
    if n_groups < 2:
        raise InputError(f"the transfer stages need at least 2 groups (one to fit, one to hold out); {what} has "
                         f"{n_groups}")


def data_name(params) -> str:
    """What :func:`require_groups` calls the data of ``params``: a table by its file and group column."""
    d = params.data
    return f"table {d.path} (groups: data.group={d.group!r})" if d.source == "table" else "the data"


def refit_sizes(n_train: int, t: TransferParams) -> list[tuple[str, int]]:
    """The fits of a held-out group with ``n_train`` training rows, as ``(label, rows)``: each of ``transfer.sizes``
    below ``n_train`` (with as many or more it would be the group's ``all`` fit, or repeat a smaller size), then
    every row (``all``) where ``transfer.all_rows``."""
    return [(f"n{n}", n) for n in t.sizes if n < n_train] + ([(ALL, n_train)] if t.all_rows else [])


def check_refits(train_rows: Sequence[int], t: TransferParams) -> None:
    """:class:`InputError` where held-out groups of these training rows leave nothing to fit: what ``transfer``
    would find, said by ``check_params`` before any stage samples and by ``transfer_prior`` before its fit."""
    if not any(refit_sizes(n, t) for n in train_rows):
        raise InputError(f"transfer: no held-out group has more training rows than transfer.sizes={list(t.sizes)} "
                         "and transfer.all_rows is false; nothing to fit")


def holdout_count(n_groups: int, t: TransferParams) -> int:
    """``max(min_holdout, round(holdout_fraction * n_groups))``, leaving at least 2 groups (1 with 2 groups).

    Raises :class:`InputError` with fewer than 2 groups (:func:`require_groups`).
    """
    require_groups(n_groups)
    k = max(t.min_holdout, round(t.holdout_fraction * n_groups))
    return max(1, min(k, n_groups - 2))


def holdout(group_names: Sequence[str], t: TransferParams) -> list[str]:
    """The held-out groups: a seeded choice (``transfer.seed``) of :func:`holdout_count` groups, in tasks order."""
    k = holdout_count(len(group_names), t)
    rng = np.random.default_rng(derive_seed(t.seed, STAGE_KEYS["transfer_split"], 0))
    picked = rng.choice(len(group_names), size=k, replace=False)
    return [group_names[i] for i in sorted(picked)]


def nested_order(y: np.ndarray, stratify: bool, rng: np.random.Generator) -> np.ndarray:
    """An order of a group's training rows whose every prefix is a seeded subset, stratified by label if asked.

    Stratified: rows of each label in a random order, interleaved so that after
    ``i`` rows each label has as close to its share of ``i`` as possible (ties go to
    the label with more rows left, then the smaller label); the first two rows of
    a group with both labels are one of each. Otherwise a random permutation.
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
        return f"{self.group}/{self.size}"


def size_labels(t: TransferParams) -> list[str]:
    """``n2, n4, ..., all`` in fit order."""
    return [f"n{n}" for n in t.sizes] + ([ALL] if t.all_rows else [])


def groups_by_size(fits: Iterable[str]) -> dict[str, list[str]]:
    """The held-out groups fitted at each size, from the fits' names (``<group>/<size>``, :attr:`Refit.name`; the
    keys of a ``fits.<model>`` section of the transfer metrics), in increasing size. A group with fewer training
    rows than a size is not fitted at it, so with groups of unequal sizes the larger sizes pool fewer groups."""
    out: dict[str, list[str]] = {}
    for name in fits:
        group, _, size = name.rpartition("/")
        out.setdefault(size, []).append(group)
    return in_size_order(out)


def pools_differ(by_size: dict[str, list[str]]) -> bool:
    """Whether the sizes of :func:`groups_by_size` pool different groups."""
    return len({tuple(groups) for groups in by_size.values()}) > 1


def in_size_order(by_size: dict) -> dict:
    """``by_size`` (keyed ``n2``, ``n16``, ``all``; JSON files hold them sorted as text) in increasing size."""
    return dict(sorted(by_size.items(), key=lambda kv: float("inf") if kv[0] == ALL else int(kv[0][1:])))


def refit_tasks(tasks: Tasks, heldout: Sequence[str], t: TransferParams) -> tuple[Tasks, list[Refit], list[str]]:
    """Tasks with one pseudo-group per (held-out group, size) and what each is; plus the skipped pairs.

    A group's fits are :func:`refit_sizes`; every skipped pair is returned as
    ``"<group>/n<size> (<rows> training rows)"``.
    The nested row order of each group comes from ``transfer.seed`` and the
    group's position in the tasks, so it is the same for every size and model.
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
    """The fits ``indices`` of one split of :func:`hbnn.diagnostics.predictions.evaluate_groups` (for its
    ``split_scores``)."""
    return {"draws": [pred["draws"][i] for i in indices], "y": [pred["y"][i] for i in indices],
            "noise": None if pred["noise"] is None else [pred["noise"][i] for i in indices]}


def row_lpd(lik: likelihoods.Likelihood, pred: dict[str, list]) -> np.ndarray:
    """Log predictive density of each test row of ``pred`` (a :func:`subset`): ``log mean_s p(y_i | draw s)``."""
    noise = pred["noise"] or [None] * len(pred["draws"])
    out = []
    for draws, sd, y in zip(pred["draws"], noise, pred["y"], strict=True):
        logp = lik.log_density(draws, sd, y).reshape(-1, y.size)
        top = logp.max(axis=0)
        out.append(top + np.log(np.exp(logp - top).mean(axis=0)))
    return np.concatenate(out)


def paired_difference(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Mean of ``a - b`` over rows and its standard error (``sd / sqrt(n)``): paired, as the rows are shared."""
    d = a - b
    se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("nan")
    return {"mean": float(d.mean()), "se": se, "n": int(d.size)}


def stops_mattering(differences: dict[str, dict[str, float]], z: float = 2.0) -> str | None:
    """The smallest size from which on the informed-minus-flat difference in test log density lies within ``z``
    standard errors of zero at every larger size; ``None`` if it still matters at the largest size.

    ``differences`` is keyed by size label, in increasing size order.
    """
    answer = None
    for label, d in reversed(differences.items()):
        if not abs(d["mean"]) <= z * d["se"]:
            break
        answer = label
    return answer
