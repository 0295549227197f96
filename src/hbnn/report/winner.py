"""The report's first line: which model (a BNN or a baseline) scores best on the test rows, and by how many
standard errors over the runner-up, paired over the same rows.

The score is the proper one every model has: the log predictive density of each test row
(:func:`hbnn.pipeline.transfer.row_lpd`), reported as the log loss (its negative mean) for 0/1 labels and as the
lpd for the others, as the metrics name them. The BNNs' rows come from their posterior draws, the baselines'
(:mod:`hbnn.pipeline.stages.baselines`) from refitting them on the same tasks, which is checked against
``metrics/baselines.json`` so that the line never mixes a stale file with new fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hbnn.config import Params
from hbnn.data.tasks import Tasks
from hbnn.errors import InputError
from hbnn.files.io import as_builtin, check_made_by
from hbnn.files.outputs import detail_path
from hbnn.model import likelihoods
from hbnn.pipeline.transfer import paired_difference, row_lpd
from hbnn.report.document import Para
from hbnn.report.inputs import read_json

BASELINES_FILE = "baselines.json"  # metrics/<this>: the baselines stage's headline metrics

# Counts whose Pearson dispersion around the best baseline's rates is past this are overdispersed for the winner
# line: half as much variance again as a Poisson count has, well past the statistic's sampling sd (about sqrt(2 / n)
# at n test rows) and enough that a Poisson predictive's lpd pays for it row by row
OVERDISPERSED = 1.5


def score_name(lik: likelihoods.Likelihood) -> str:
    """The headline proper score of ``lik``'s models.

    Parameters
    ----------
    lik : hbnn.model.likelihoods.base.Likelihood

    Returns
    -------
    str
        ``log loss`` (lower is better) for a classifier, else ``lpd`` (higher is better).
    """
    return "log loss" if lik.classifier else "lpd"


def shown(lik: likelihoods.Likelihood, mean_lpd: float) -> float:
    """A mean row lpd as :func:`score_name` reports it (negated into a log loss for a classifier).

    Parameters
    ----------
    lik : hbnn.model.likelihoods.base.Likelihood
    mean_lpd : float

    Returns
    -------
    float
    """
    return -mean_lpd if lik.classifier else mean_lpd


def read_baselines(metrics_dir: Path, params: Params) -> dict | None:
    """The baselines stage's detail metrics beside ``metrics_dir/baselines.json`` (per model ``train``, ``test``,
    ``per_group``), checked to be that stage's with these params.

    Parameters
    ----------
    metrics_dir : pathlib.Path
        The metrics folder.
    params : hbnn.config.Params
        The run's params.

    Returns
    -------
    dict or None
        ``None`` where the stage has not run.

    Raises
    ------
    hbnn.errors.InputError
        Where the file is unreadable or was made by another stage or other params.
    """
    path = metrics_dir / BASELINES_FILE
    if not path.exists():
        return None
    detail_file = detail_path(path)
    detail = read_json(detail_file, "baselines detail metrics")
    check_made_by(detail, detail_file, "baselines", params)
    return detail


def pearson_dispersion(y: np.ndarray, rate: np.ndarray) -> float:
    """The Pearson dispersion of counts around predicted rates: ``mean((y - rate)**2 / rate)``.

    Parameters
    ----------
    y : numpy.ndarray
        The counts.
    rate : numpy.ndarray
        Each count's predicted rate (> 0), the same shape.

    Returns
    -------
    float
        About 1 for Poisson counts with these rates; above 1 where the counts vary more (overdispersion).
    """
    y, rate = np.asarray(y, dtype=float), np.asarray(rate, dtype=float)
    return float(np.mean((y - rate) ** 2 / rate))


def baseline_rows(tasks: Tasks, params: Params, detail: dict,
                  metrics_dir: Path) -> tuple[dict[str, np.ndarray], float | None]:
    """Each baseline's test-row lpd in the tasks' group-sorted test order, from refitting the baselines, and how
    overdispersed the test counts are for them.

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
        The run's groups and splits.
    params : hbnn.config.Params
        The run's params.
    detail : dict
        :func:`read_baselines`.
    metrics_dir : pathlib.Path
        The metrics folder, for messages.

    Returns
    -------
    rows : dict of str to numpy.ndarray
        Per baseline.
    dispersion : float or None
        Where the baselines are scored with another likelihood than the BNNs (counts: Poisson baselines beside a
        negative binomial), the test counts' :func:`pearson_dispersion` around the rates of the baseline with the
        best mean row lpd; else ``None``.

    Raises
    ------
    hbnn.errors.InputError
        Where the test scores of ``detail`` differ from the refitted models' (a stale or edited file).
    """
    from hbnn.pipeline.stages import baselines

    preds = baselines.all_predictions(tasks, params)
    scored = as_builtin(baselines.score_models(tasks, {m: {"test": p["test"]} for m, p in preds.items()}))
    lik = baselines.scoring_likelihood(tasks.likelihood)
    for model in baselines.MODELS:
        found = detail[model].get("test") if isinstance(detail.get(model), dict) else None
        if found != scored[model]["test"]:
            raise InputError(f"{detail_path(metrics_dir / BASELINES_FILE)}: the test scores of {model} are not those "
                             f"of its refit on these tasks ({found} against {scored[model]['test']}); rerun the "
                             "baselines stage (dvc repro)")
    rows = {model: row_lpd(lik, preds[model]["test"]) for model in baselines.MODELS}
    if lik.name == tasks.likelihood:
        return rows, None
    best = preds[max(rows, key=lambda m: float(np.mean(rows[m])))]["test"]
    return rows, pearson_dispersion(np.concatenate(best["y"]), np.concatenate([np.ravel(d) for d in best["draws"]]))


def _versus(lik: likelihoods.Likelihood, rows: dict[str, np.ndarray], best: str, other: str) -> tuple[str, float]:
    """``other`` with its score, and how many standard errors of the paired per-row difference it is behind
    ``best``."""
    d = paired_difference(rows[best], rows[other])
    z = d["mean"] / d["se"] if d["se"] > 0 else float("inf")
    return f"{other} ({shown(lik, float(np.mean(rows[other]))):.4f})", z


def winner_line(lik: likelihoods.Likelihood, rows: dict[str, np.ndarray], missing: Sequence[str] = (),
                baselines: Sequence[str] = (), dispersion: float | None = None) -> Para:
    """One sentence: which model is best on the test rows, and by how much.

    Parameters
    ----------
    lik : hbnn.model.likelihoods.base.Likelihood
        The tasks' likelihood, which names the score (:func:`score_name`).
    rows : dict of str to numpy.ndarray
        Test-row lpd per model name, the same rows in the same order.
    missing : sequence of str, optional
        Models not compared (said at the end).
    baselines : sequence of str, optional
        Which names of ``rows`` are baselines. Where the runner-up is of the same kind as the best (two BNNs, or two
        baselines), the best of the other kind is named too, so the line always says how the BNNs stand against
        the plain models.
    dispersion : float, optional
        :func:`baseline_rows`' dispersion: past :data:`OVERDISPERSED`, the line says that the baselines are Poisson
        models of overdispersed counts, so that part of the BNNs' margin over them is the likelihood, not the network.

    Returns
    -------
    Para
        The model with the best mean, its score and the runner-up's, and the paired difference in standard errors
        (:func:`hbnn.pipeline.transfer.paired_difference`: mean / (sd / sqrt(n)) of the per-row differences).
    """
    ranked = sorted(rows, key=lambda m: -float(np.mean(rows[m])))
    name = score_name(lik)
    better = "lower" if lik.classifier else "higher"
    best = ranked[0]
    text = (f"Best on the test rows by {name} ({better} is better): {best} "
            f"({shown(lik, float(np.mean(rows[best]))):.4f}")
    if len(ranked) > 1:
        second = ranked[1]
        n = paired_difference(rows[best], rows[second])["n"]
        runner_up, z = _versus(lik, rows, best, second)
        text += (f"), ahead of {runner_up} by {z:.1f} standard errors of the per-row difference, paired over the {n} "
                 "test rows.")
        kind = best in baselines
        others = [m for m in ranked[2:] if (m in baselines) != kind] if (second in baselines) == kind else []
        if others:
            what = "BNN" if kind else "plain model (baseline)"
            other, z = _versus(lik, rows, best, others[0])
            text += f" The best {what}, {other}, is {z:.1f} standard errors behind."
    else:
        text += ")."
    if baselines and dispersion is not None and dispersion > OVERDISPERSED:
        text += (f" The baselines are Poisson models (GLMs; gradient boosting with a Poisson loss), scored with a "
                 f"Poisson predictive, and around the best baseline's rates the test counts' variance is "
                 f"{dispersion:.1f} times their mean (a Poisson count's is 1): part of the margin between the BNNs "
                 f"({lik.name.replace('_', ' ')}) and the baselines is the likelihood, not the network.")
    if missing:
        text += f" Not compared: {', '.join(missing)}."
    return Para(text)
