"""Stage ``transfer_refit``: the hierarchical model refitted with the held-out groups' few rows, the transfer's
reference line.

A user with a new group and a handful of its rows would add them to the data and fit the hierarchical model again:
partial pooling with every group at once. That refit is what the informed prior (one group at a time, from a prior
derived without the new group) should approach. For each size of ``transfer.refit_sizes`` that ``transfer.sizes``
lists too (and every training row where ``transfer.refit_all_rows`` and ``all_rows``) this stage fits the hierarchical
model on the training groups' rows plus each held-out group's rows at that size, the same rows the flat and informed
fits of ``transfer`` see, and scores the held-out groups on their own test rows. All held-out groups join one refit per
size: they inform each other only through the population, as several new groups would. ``transfer`` reads the scores and
the per-row log predictive densities from ``metrics/detail/transfer_refit.json`` to put this line beside the other two.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from hbnn.config import Params
from hbnn.data.tasks import Tasks
from hbnn.diagnostics import evaluation, predictions
from hbnn.errors import InputError, counted
from hbnn.files.io import as_builtin, made_by
from hbnn.files.outputs import staged_outputs
from hbnn.fitting import common as fitting
from hbnn.fitting.models import sample_hierarchical
from hbnn.logs import watch
from hbnn.model import likelihoods
from hbnn.pipeline import transfer
from hbnn.pipeline.stages import load_run_tasks

log = logging.getLogger(__name__)

STAGE = "transfer_refit"
# what a size's refit records of its sampling: fit_hier's headline keys (the group sds' and restarts' included)
SAMPLING_KEYS = (*evaluation.HEADLINE_SAMPLING, *evaluation.HEADLINE_SAMPLING_IF_PRESENT)


def refit_labels(t) -> list[str]:
    """Return the size labels the hierarchical refit runs at, in increasing size.

    Parameters
    ----------
    t : hbnn.config.TransferParams
        ``refit_sizes`` and ``refit_all_rows``.

    Returns
    -------
    list of str
        ``n2``, ..., and ``all`` where ``refit_all_rows`` and ``all_rows``.
    """
    return [f"n{n}" for n in transfer.refit_rows(t)] + ([transfer.ALL] if t.refit_all_rows and t.all_rows else [])


def run_transfer_refit(params: Params, tasks_path: Path, trace_dir: Path, metrics_out: Path, timing_out: Path
                       ) -> dict:
    """Stage body: one hierarchical refit per size, each held-out group scored on its test rows.

    Parameters
    ----------
    params : hbnn.config.Params
        The run's settings (``transfer``, ``hier_sampler``, the model).
    tasks_path : pathlib.Path
        The tasks file.
    trace_dir : pathlib.Path
        A folder: one trace per size, ``<size>.nc`` (``n2.nc``, ``all.nc``); other ``.nc`` files in it are removed.
    metrics_out : pathlib.Path
        A detail file (not a DVC metric): per size, the held-out groups' pooled test scores, their per-row log
        predictive densities (in held-out group order, each group's test rows in stored order) and the fit's sampling.
    timing_out : pathlib.Path
        Each size's sampling cost.

    Returns
    -------
    dict
        What ``metrics_out`` holds.

    Raises
    ------
    hbnn.errors.InputError
        If the tasks file is bad, no held-out group has a fit at any of ``transfer.sizes`` (or all rows), ``trace_dir``
        is not a folder, or an estimate exceeds the budget.
    """
    if trace_dir.exists() and not trace_dir.is_dir():
        raise InputError(f"{trace_dir} exists and is not a folder: transfer_refit writes one trace per size into it; "
                         "move it away")
    tasks = load_run_tasks(tasks_path, params)
    heldout = transfer.holdout(tasks.group_names, params.transfer)
    kept = [g for g in tasks.group_names if g not in heldout]
    refit, refits, _ = transfer.refit_tasks(tasks, heldout, params.transfer)
    labels = refit_labels(params.transfer)
    unused = [n for n in params.transfer.refit_sizes if n not in params.transfer.sizes]
    if unused:
        log.warning("%s: transfer.refit_sizes %s are not among transfer.sizes %s (no flat or informed fits to compare "
                    "with): not refitted", STAGE, unused, list(params.transfer.sizes))
    if params.transfer.refit_all_rows and not params.transfer.all_rows:
        log.warning("%s: transfer.refit_all_rows is true but transfer.all_rows is false (no flat or informed fits on "
                    "every row to compare with): no refit with every row", STAGE)
    fits = {}
    for label in labels:
        pooled, groups = transfer.pooled_tasks(tasks, kept, refit, refits, label)
        if groups:
            fits[label] = (pooled, groups)
            fitting.enforce_budget(STAGE, params, pooled)  # every size's cost, before the first one samples
        else:
            log.info("%s: skipping %s: no held-out group has more training rows", STAGE, label)
    log.info("%s: %s (sizes %s) of the %s with the held-out %s rows", STAGE, counted(len(fits), "hierarchical refit"),
             ", ".join(fits) or "none", counted(len(kept), "training group"),
             "group's" if len(heldout) == 1 else f"{len(heldout)} groups'")
    spec = fitting.model_spec(params, tasks)
    score = likelihoods.get(tasks.likelihood).score
    sizes, traces, timings = {}, {}, {}
    for label, (pooled, groups) in fits.items():
        log.info("%s: %s: fitting %d groups (%s with %s rows%s)", STAGE, label, pooled.n_groups, ", ".join(groups),
                 label.removeprefix("n"), " each" if len(groups) > 1 else "")
        sampled = sample_hierarchical(STAGE, params, spec, pooled)
        with watch(log, f"{STAGE}: {label}: scoring the draws"):
            traces[label], metrics, timings[label], pred = fitting.score_fit(
                STAGE, params, spec, pooled, sampled, {"size": label, "heldout_groups": groups})
        sizes[label] = size_metrics(tasks.likelihood, pooled, groups, metrics, pred["test"])
        s = sizes[label]["sampling"]
        log.info("%s: %s: %d of %d groups and %d group sds not converged (max R-hat %.4f, min ESS %.0f, %d "
                 "divergences, %.1fs sampling); held-out test %s %.4f", STAGE, label, s["groups_not_converged"],
                 pooled.n_groups, s.get("sds_not_converged", 0), s["max_rhat"], s["min_ess_bulk"], s["divergences"],
                 sampled.cost.seconds, score, sizes[label]["test"][score])
    out = {"heldout_groups": heldout, "training_groups": kept, "sizes": sizes, "made_by": made_by(STAGE, params)}
    trace_dir.mkdir(parents=True, exist_ok=True)
    with staged_outputs() as outputs:
        for label, trace in traces.items():
            outputs.write_netcdf(trace, trace_dir / f"{label}.nc")
        for stale in sorted(trace_dir.glob("*.nc")):
            if stale.stem not in traces:
                outputs.remove(stale)
        outputs.write_json(as_builtin(timings), timing_out)
        outputs.write_json(as_builtin(out), metrics_out)
    return out


def size_metrics(likelihood: str, pooled: Tasks, groups: list[str], metrics: dict, test: dict[str, list]) -> dict:
    """What one size's refit records: the held-out groups' test scores and per-row log densities, and its sampling.

    Parameters
    ----------
    likelihood : str
        The likelihood's name.
    pooled : hbnn.data.tasks.Tasks
        The refit's tasks.
    groups : list of str
        The held-out groups in it.
    metrics : dict
        The refit's :func:`hbnn.diagnostics.evaluation.fit_metrics`.
    test : dict of str to list
        Its test predictions (every group's, in ``pooled``'s order).

    Returns
    -------
    dict
        ``groups``, ``test`` (pooled over the held-out groups' test rows, with ``lpd_mean``), ``row_lpd``, ``lpd_se``,
        ``heldout_not_converged`` and ``sampling`` (the whole fit's, as ``fit_hier``'s headline judges it).
    """
    lik = likelihoods.get(likelihood)
    held = transfer.subset(test, [pooled.group_names.index(g) for g in groups])
    scores, _ = predictions.split_scores(lik, held)
    lpd = transfer.row_lpd(lik, held)
    return {"groups": groups, "test": scores | {"lpd_mean": float(lpd.mean())}, "row_lpd": lpd.tolist(),
            "lpd_se": transfer.mean_se(lpd),
            "heldout_not_converged": sum(not metrics["per_group"][g]["converged"] for g in groups),
            "sampling": {k: metrics["sampling"][k] for k in SAMPLING_KEYS if k in metrics["sampling"]}}


def refit_line(refit: dict, groups: list[str], informed_lpd: np.ndarray, flat_lpd: np.ndarray, label: str
               ) -> tuple[dict, dict, dict]:
    """One size's hierarchical refit as ``transfer`` records it, and its paired differences from the other two.

    Parameters
    ----------
    refit : dict
        The size's entry of this stage's metrics (:func:`size_metrics`).
    groups : list of str
        The held-out groups the flat and informed fits scored at this size, in their order.
    informed_lpd, flat_lpd : numpy.ndarray
        The informed and flat fits' per-row test log predictive density on those groups' rows.
    label : str
        The size, for the message.

    Returns
    -------
    tuple of dict
        The refit's line (scores, ``lpd_se``, convergence), then informed minus refit and refit minus flat
        (:func:`hbnn.pipeline.transfer.paired_difference`).

    Raises
    ------
    hbnn.errors.InputError
        Where the refit scored other groups or rows.
    """
    lpd = np.asarray(refit.get("row_lpd", []), dtype=float)
    if refit.get("groups") != groups or lpd.shape != informed_lpd.shape:  # check_refit_metrics said it first
        raise InputError(f"transfer_refit's {label} fit scored other held-out groups ({refit.get('groups')}) or "
                         f"rows ({lpd.size}) than the flat and informed fits ({groups}, {informed_lpd.size} rows); "
                         "rerun transfer_refit (dvc repro)")
    s = refit["sampling"]
    line = {"test": refit["test"], "lpd_se": refit["lpd_se"], "fits_not_converged": int(_missed(s)),
            "groups_not_converged": s["groups_not_converged"], "heldout_not_converged": refit["heldout_not_converged"],
            "max_rhat": s["max_rhat"], "min_ess_bulk": s["min_ess_bulk"], "divergences": s["divergences"]}
    return line, transfer.paired_difference(informed_lpd, lpd), transfer.paired_difference(lpd, flat_lpd)


def refit_sampling(hier_refit: dict) -> dict:
    """The hierarchical refits' convergence over every size: counts summed, the worst R-hat and ESS.

    Parameters
    ----------
    hier_refit : dict
        This stage's metrics.

    Returns
    -------
    dict
        ``fits``, ``fits_not_converged`` (a fit with any group or group sd short of the bar), ``groups_not_converged``,
        ``sds_not_converged``, ``divergences``, ``max_rhat`` and ``min_ess_bulk``.
    """
    s = [r["sampling"] for r in hier_refit["sizes"].values()]
    return {"fits": len(s), "fits_not_converged": sum(_missed(x) for x in s),
            "groups_not_converged": sum(x["groups_not_converged"] for x in s),
            "sds_not_converged": sum(x.get("sds_not_converged", 0) for x in s),
            "divergences": sum(x["divergences"] for x in s), "max_rhat": max(x["max_rhat"] for x in s),
            "min_ess_bulk": min(x["min_ess_bulk"] for x in s)}


def _missed(sampling: dict) -> bool:
    """Whether a refit has a group or a group sd short of the convergence bar."""
    return sampling["groups_not_converged"] > 0 or sampling.get("sds_not_converged", 0) > 0


def check_refit_metrics(doc: dict, path: Path, expected: dict[str, tuple[list[str], int]]) -> None:
    """Refuse ``transfer_refit``'s metrics where they are not what ``transfer`` needs for these params and rows.

    Checked before ``transfer`` fits anything: every size the params refit at (and only those) with the held-out
    groups fitted at it, one log density per test row, and the scores and sampling counts it reads.

    Parameters
    ----------
    doc : dict
        The metrics as read.
    path : pathlib.Path
        Their file, named in errors.
    expected : dict of str to tuple
        Per size label the refit must hold: the held-out groups fitted at it, in order, and their test rows.

    Raises
    ------
    hbnn.errors.InputError
        Naming the file, the size and what is wrong.
    """
    def bad(what: str) -> InputError:
        return InputError(f"metrics file {path}: {what}; rerun transfer_refit (dvc repro)")

    sizes = doc.get("sizes")
    if not isinstance(sizes, dict):
        raise bad("no sizes object")
    if sorted(sizes) != sorted(expected):
        raise bad(f"holds sizes {sorted(sizes)}, and these params refit at {sorted(expected)}")
    for label, (groups, rows) in expected.items():
        entry = sizes[label]
        found = entry.get("groups") if isinstance(entry, dict) else entry
        if not isinstance(entry, dict) or found != groups:
            raise bad(f"its {label} refit scored held-out groups {found!r}, not {groups}")
        lpd = entry.get("row_lpd")
        if not isinstance(lpd, list) or len(lpd) != rows or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in lpd):
            raise bad(f"its {label} refit has no row_lpd of {rows} numbers (one per held-out test row)")
        sampling = entry.get("sampling")
        numbers = (entry.get("test"), sampling, entry.get("heldout_not_converged"))
        if not isinstance(numbers[0], dict) or not isinstance(sampling, dict) or not all(
                isinstance(sampling.get(k), (int, float)) for k in evaluation.HEADLINE_SAMPLING) \
                or not isinstance(numbers[2], int):
            raise bad(f"its {label} refit lacks its test scores or sampling counts")
