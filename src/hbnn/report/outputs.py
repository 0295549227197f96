"""The report's machine-readable outputs: the summary metrics and the DVC plots CSVs."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hbnn.diagnostics import evaluation
from hbnn.files.io import as_builtin
from hbnn.files.outputs import Outputs
from hbnn.model import likelihoods
from hbnn.report.numbers import LOSS_POINTS, MODELS, difference, lookup


def summary(metrics: dict[str, dict], n_groups: int, lik: likelihoods.Likelihood, loo: dict | None = None) -> dict:
    """``metrics/summary.json``: how the models differ (dicts only; each model's own numbers are in its metrics).

    ``<a>_minus_<b>_test_<score>``: the difference of the likelihood's headline
    test score; with ``loo`` (:func:`hbnn.diagnostics.evaluation.psis_loo` per model, all
    three), ``<a>_minus_<b>_elpd`` and its paired standard error ``..._elpd_se``.

    Parameters
    ----------
    metrics : dict of str to dict
        Each model's detail metrics.
    n_groups : int
        The number of groups.
    lik : hbnn.model.likelihoods.base.Likelihood
        The run's likelihood (its headline score).
    loo : dict, optional
        Each model's PSIS-LOO.

    Returns
    -------
    dict
        ``{"comparison": {...}, "n_groups": n}``, JSON-ready.
    """
    score = lik.score
    test = {v: lookup(metrics[v], "test", score) for v in MODELS}
    pairs = {"hier_minus_flat": ("hierarchical", "flat"), "informed_minus_flat": ("informed", "flat"),
             "hier_minus_informed": ("hierarchical", "informed")}
    comparison = {f"{name}_test_{score}": difference(test[a], test[b]) for name, (a, b) in pairs.items()}
    if loo is not None and set(loo) == set(MODELS):
        for name, (a, b) in pairs.items():
            comparison[f"{name}_elpd"], comparison[f"{name}_elpd_se"] = evaluation.elpd_difference(loo[a], loo[b])
    return as_builtin({"comparison": comparison, "n_groups": n_groups})


def plot_label(name: str) -> str:
    """A group's name as the ``dvc plots`` data hold it: ``</`` and ``<!--`` written ``<\\/`` and ``<\\!--``.

    DVC's plots page embeds each plot's data as JSON inside a ``<script>`` element without escaping it, so a name
    holding ``</script>`` would end that element there and run what follows (``report.html`` and ``report.md``
    escape names themselves). A backslash stops the browser seeing either sequence; the label shows it.

    Parameters
    ----------
    name : str
        The group's name.

    Returns
    -------
    str
    """
    return name.replace("</", "<\\/").replace("<!--", "<\\!--")


def per_group_csv(per_group: dict[str, np.ndarray], names: Sequence[str]) -> str:
    """``group,flat,hierarchical,informed`` rows of test accuracy (empty where a group has no test rows; one row
    without values where there are no groups to show, as for likelihoods that are not classifiers:
    :func:`_nothing_to_plot`).

    Parameters
    ----------
    per_group : dict of str to numpy.ndarray
        Each model's test accuracy per group.
    names : sequence of str
        The groups.

    Returns
    -------
    str
        CSV text.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["group", *MODELS])
    for g, name in enumerate(names):
        vals = [per_group[v][g] for v in MODELS]
        writer.writerow([plot_label(name), *("" if not np.isfinite(x) else as_builtin(float(x)) for x in vals)])
    if not names:
        _nothing_to_plot(writer, "")
    return buf.getvalue()


def advi_loss(idata, points: int = LOSS_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """``(iteration, loss)`` of an ADVI trace, summed over groups, averaged over blocks.

    Iterations are cut into at most ``points`` equal blocks; each point is the
    block's mean loss, placed at the block's last iteration.

    Parameters
    ----------
    idata : hbnn.files.trace.Trace
        A trace whose ``sample_stats`` hold ``loss``.
    points : int, default :data:`hbnn.report.numbers.LOSS_POINTS`
        The most points returned.

    Returns
    -------
    tuple of (numpy.ndarray, numpy.ndarray)
        Iterations and mean losses.
    """
    loss = idata.sample_stats["loss"]
    total = loss.sum([d for d in loss.dims if d != "advi_iteration"]).values
    block = max(1, -(-total.size // points))
    n_blocks = -(-total.size // block)
    padded = np.full(n_blocks * block, np.nan)
    padded[: total.size] = total
    means = np.nanmean(padded.reshape(n_blocks, block), axis=1)
    ends = np.minimum(np.arange(1, n_blocks + 1) * block, total.size)
    return ends, means


def loss_csv(losses: dict[str, tuple[np.ndarray, np.ndarray]]) -> str:
    """``iteration,<model>...`` rows of the ADVI loss (one row without values when no model used ADVI:
    :func:`_nothing_to_plot`).

    Parameters
    ----------
    losses : dict of str to tuple
        Each ADVI model's :func:`advi_loss`.

    Returns
    -------
    str
        CSV text.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["iteration", *MODELS])
    table: dict[int, dict[str, float]] = {}
    for v, (it, loss) in losses.items():
        for i, x in zip(it, loss, strict=True):
            table.setdefault(int(i), {})[v] = as_builtin(float(x))
    for i in sorted(table):
        writer.writerow([i, *(table[i].get(v, "") for v in MODELS)])
    if not table:
        _nothing_to_plot(writer, 0)
    return buf.getvalue()


def _nothing_to_plot(writer, x) -> None:
    """One row at ``x`` whose values are all empty. A plots CSV with a header only makes DVC hand its page an empty
    specification, which the page shows as an error ("Invalid specification {}"); with this row it shows the plot's
    title and axes with nothing drawn (Vega-Lite leaves out empty values), which is what there is to show."""
    writer.writerow([x, *[""] * len(MODELS)])


def calibration_csv(tables: dict[str, dict[str, np.ndarray]]) -> str:
    """``bin,<model>...`` rows: observed fraction of ``y = 1`` per probability bin (empty where no rows; one row
    without values for likelihoods that are not classifiers: :func:`_nothing_to_plot`).

    Parameters
    ----------
    tables : dict of str to dict
        Each model's reliability table (:func:`hbnn.diagnostics.evaluation.reliability`).

    Returns
    -------
    str
        CSV text.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    models = list(tables)
    writer.writerow(["bin", *(models or MODELS)])
    if not tables:  # likelihoods that are not classifiers: no class probabilities to calibrate
        _nothing_to_plot(writer, 0.5)
        return buf.getvalue()
    mids = next(iter(tables.values()))["bin_mid"]
    for b, mid in enumerate(mids):
        cells = [tables[m]["observed"][b] for m in models]
        writer.writerow([as_builtin(float(mid)), *("" if not np.isfinite(x) else as_builtin(float(x)) for x in cells)])
    return buf.getvalue()


def write_figures(figures: dict[str, bytes], fig_dir: Path, outputs: Outputs) -> None:
    """Stage ``figures`` into ``fig_dir``, and the removal of PNGs a previous run left that are not rewritten.

    Parameters
    ----------
    figures : dict of str to bytes
        PNGs by file name.
    fig_dir : pathlib.Path
        The report's figures folder.
    outputs : hbnn.files.outputs.Outputs
        The stage's staged outputs, written together once the stage succeeds.
    """
    if fig_dir.is_dir():
        for stale in fig_dir.glob("*.png"):
            if stale.name not in figures:
                outputs.remove(stale)
    for name, data in figures.items():
        outputs.write_bytes(data, fig_dir / name)
