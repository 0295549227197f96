"""Which groups the report draws decision surfaces for (``report.surface_groups``): every group of a run that has at
most that many; of a larger run, the groups a reader needs first (those that miss the convergence bar or are
flagged in any model, then each model's worst-fitted) and a seeded sample of the rest, the same groups for every
model so that their pages compare panel by panel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hbnn.report.document import Para, Table
from hbnn.report.numbers import LABELS, MODELS, lookup

# At most this share of the places goes to groups that miss the bar: a run where most groups miss it still shows its
# worst-fitted groups and a sample.
FLAGGED_SHARE = 0.5
SAMPLE_SHARE = 0.25  # at least this share goes to the seeded sample: a view of the typical group, not only the tails
SAMPLE_STREAM = 51  # mixed with params' seed, so the sample's draws are a stream of their own, not the data's
# The per-group test score that ranks a model's groups, worst first: (key of per_group.<g>.test, +1 where higher is
# worse, -1 where lower is), the first one the metrics hold. Log loss and lpd tell apart groups that accuracy ties.
BADNESS = {True: (("log_loss", 1.0), ("accuracy", -1.0)), False: (("lpd", -1.0), ("rmse", 1.0))}
WORDS = {"log_loss": "highest test log loss", "accuracy": "lowest test accuracy", "lpd": "lowest test lpd",
         "rmse": "highest test RMSE"}


@dataclass(frozen=True)
class SurfaceChoice:
    """The groups whose surfaces are drawn, in the order drawn, and why each one.

    Parameters
    ----------
    groups : tuple of int
        Indices into the tasks' group names.
    reasons : tuple of str
        Why each group is drawn, aligned with ``groups``.
    n_groups : int
        The run's groups.
    limit : int
        ``report.surface_groups`` (0: every group).
    seed : int
        The seed the sample was drawn with.
    score : str
        The words for the ranking of the worst-fitted groups (``"highest test log loss"``).
    n_missing : int
        The groups that miss the bar or are flagged in a model that does not miss it in every group.
    """

    groups: tuple[int, ...]
    reasons: tuple[str, ...]
    n_groups: int
    limit: int
    seed: int
    score: str
    n_missing: int

    @property
    def every_group(self) -> bool:
        """Whether every group is drawn (in the tasks' order)."""
        return len(self.groups) == self.n_groups


def _badness(metrics: Mapping[str, dict], names: Sequence[str], classifier: bool) -> tuple[dict, float, str]:
    """Per model, each group's score times its sign in :data:`BADNESS`, so that higher is worse (NaN where missing);
    the sign; the ranking's words."""
    for key, sign in BADNESS[classifier]:
        if any(lookup(metrics[v], "per_group", g, "test", key) is not None for v in MODELS for g in names):
            return ({v: np.array([np.nan if (x := lookup(metrics[v], "per_group", g, "test", key)) is None
                                  else sign * float(x) for g in names]) for v in MODELS}, sign, WORDS[key])
    return {v: np.full(len(names), np.nan) for v in MODELS}, 1.0, "no test score recorded"


def _worst_first(bad: np.ndarray) -> list[int]:
    """Indices ordered worst first; groups without a score last, ties in the tasks' order."""
    index = np.arange(bad.size)
    return [int(i) for i in np.lexsort((index, -np.nan_to_num(bad, nan=-np.inf), np.isnan(bad)))]


def choose_surface_groups(metrics: Mapping[str, dict], names: Sequence[str], limit: int, seed: int,
                          classifier: bool = True) -> SurfaceChoice:
    """The groups to draw surfaces for: every one where ``limit`` is 0 or covers them all, else ``limit`` of them.

    In order: the groups that miss the convergence bar (``per_group.<g>.converged``) or are flagged as non-mixing
    (``sampling.flagged_groups``) in any model, those missing it in more models and then the worse-fitted first, in
    at most :data:`FLAGGED_SHARE` of the places (a model that misses it in every group, as a joint fit does, singles
    out none of them); then each model's worst-fitted groups in turn (:data:`BADNESS`);
    then a sample of the remaining groups drawn with ``seed`` (at least :data:`SAMPLE_SHARE` of the places), in the
    tasks' order. The same metrics, ``limit`` and ``seed`` give the same choice.

    Parameters
    ----------
    metrics : mapping of str to dict
        Each model's detail metrics (checked by :func:`hbnn.report.inputs.read_metrics`).
    names : sequence of str
        The tasks' group names.
    limit : int
        ``report.surface_groups``: groups drawn per model; 0 draws every group.
    seed : int
        The sample's seed (params' ``seed``, mixed with :data:`SAMPLE_STREAM`).
    classifier : bool, optional
        Whether the likelihood is a classifier (its groups ranked by log loss, else by lpd).

    Returns
    -------
    SurfaceChoice
    """
    n = len(names)
    bad, sign, score = _badness(metrics, names, classifier)
    if limit <= 0 or limit >= n:
        return SurfaceChoice(tuple(range(n)), ("every group",) * n, n, limit, seed, score, 0)
    ranked = {v: _worst_first(bad[v]) for v in MODELS}
    rank = {v: np.argsort(ranked[v]) for v in MODELS}  # position of each group in its model's worst-first order
    missing: dict[int, list[str]] = {}
    for v in MODELS:
        flagged = lookup(metrics[v], "sampling", "flagged_groups") or {}
        misses = [i for i, g in enumerate(names) if not lookup(metrics[v], "per_group", g, "converged") or g in flagged]
        for i in misses if len(misses) < n else []:
            missing.setdefault(i, []).append(v)
    chosen: dict[int, str] = {}
    n_sample = int(np.ceil(SAMPLE_SHARE * limit)) if limit >= 2 else 0
    by_need = sorted(missing, key=lambda i: (-len(missing[i]), min(int(rank[v][i]) for v in MODELS), i))
    for i in by_need[:min(len(by_need), int(FLAGGED_SHARE * limit))]:
        chosen[i] = f"misses the convergence bar or is flagged: {', '.join(LABELS[v] for v in missing[i])}"
    pointers = dict.fromkeys(MODELS, 0)
    while len(chosen) < limit - n_sample:
        for v in MODELS:
            while pointers[v] < n and ranked[v][pointers[v]] in chosen:
                pointers[v] += 1
            if pointers[v] < n and len(chosen) < limit - n_sample:
                i = ranked[v][pointers[v]]
                chosen[i] = f"{score}, {LABELS[v]}: rank {pointers[v] + 1} of {n} ({sign * bad[v][i]:.3g})"
    rest = np.array([i for i in range(n) if i not in chosen])
    rng = np.random.default_rng([SAMPLE_STREAM, seed])
    for i in np.sort(rng.choice(rest, size=min(limit - len(chosen), rest.size), replace=False)):
        chosen[int(i)] = f"seeded sample of the other groups (seed {seed})"
    return SurfaceChoice(tuple(chosen), tuple(chosen.values()), n, limit, seed, score, len(missing))


def choice_blocks(choice: SurfaceChoice, names: Sequence[str], per_page: int) -> list:
    """What the surface sections say about the groups drawn: which, why, and how to draw the others.

    Parameters
    ----------
    choice : SurfaceChoice
        The groups drawn.
    names : sequence of str
        The tasks' group names.
    per_page : int
        ``report.panels_per_page``, to place each group on its page.

    Returns
    -------
    list
        A paragraph, and where groups were chosen, a table of them (page and panel, group, why).
    """
    if choice.every_group:
        limit = ("report.surface_groups: 0" if choice.limit <= 0 else
                 f"report.surface_groups: {choice.limit} draws every group of a run with at most that many, and "
                 "a chosen few of a larger run; 0 draws every group")
        return [Para(f"Every group's surfaces are drawn ({choice.n_groups} groups; {limit}).")]
    shown = sum(r.startswith("misses") for r in choice.reasons)
    text = (f"Surfaces are drawn for {len(choice.groups)} of the {choice.n_groups} groups "
            f"(report.surface_groups: {choice.limit}), the same groups for every model, in this order: the groups "
            f"that miss the convergence bar or are flagged as non-mixing in any model ({shown} of the "
            f"{choice.n_missing} such groups; at most {FLAGGED_SHARE:.0%} of the places, those missing it in more "
            "models and the worse-fitted first; a model that misses the bar in every group, as a joint fit can, "
            "singles out none), then "
            f"each model's worst-fitted groups in turn ({choice.score}), then a sample of the other groups drawn "
            f"with params' seed ({choice.seed}). Every group's scores and diagnostics are in the per-group figures, "
            "the status and diagnostics sections and metrics/detail/*.json. To draw the others, run the report "
            "stage again with report.surface_groups: 0 (every group) or a larger number (dvc exp run -S "
            "report.surface_groups=0): it reads the same traces (no fit runs again), and its time grows with the "
            "groups drawn.")
    rows = [[f"{k // per_page + 1}, {k % per_page + 1}", names[g], why]
            for k, (g, why) in enumerate(zip(choice.groups, choice.reasons, strict=True))]
    return [Para(text), Table(["Page, panel", "Group", "Why drawn"], rows, text_columns=(1, 2))]
