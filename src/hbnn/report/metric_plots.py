"""The report's charts of numbers from the metrics files: per-group bars, the accuracy table's chart, reliability,
ADVI losses, group-sd posteriors, weight correlations and the transfer curve (the drawing helpers and styles are
:mod:`hbnn.report.plots`'). Each function takes arrays, draws one figure and returns ``(fig, axes)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from hbnn.errors import counted
from hbnn.report.plots import (
    GROUPS_PER_ROW,
    MAX_WIDTH_IN,
    MODEL_COLORS,
    SMALL,
    TICK_CHARS,
    TITLE,
    literal,
    model_color,
    pages,
    short,
)

# Past this many groups a per-group chart shows each model's values sorted, one point a group, on one axes: a named
# bar per group would take a row of axes per GROUPS_PER_ROW groups (25 rows at 1,000 groups) that no one can read.
NAMED_GROUPS_MAX = 3 * GROUPS_PER_ROW


def plot_per_group(
    names: Sequence[str],
    values: Mapping[str, np.ndarray],
    kind: str = "bar",
    ylabel: str = "",
    ylim: tuple[float, float] | None = None,
    hlines: Sequence[float] = (),
    title: str | None = None,
    per_row: int = GROUPS_PER_ROW,
    log: bool = False,
):
    """Grouped bars (``kind="bar"``) or dots (``"point"``) of one value per group and series; past
    :data:`NAMED_GROUPS_MAX` groups, each series' values sorted (:func:`plot_sorted`).

    Parameters
    ----------
    names : sequence of str
        The groups.
    values : mapping of str to numpy.ndarray
        Per series, ``(group,)`` aligned with ``names`` (NaN: missing).
    kind : {"bar", "point"}, optional
        Bars or dots.
    ylabel : str, optional
        The value axis' label.
    ylim : tuple of (float, float), optional
        The value axis' range.
    hlines : sequence of float, optional
        Dashed reference levels.
    title : str, optional
        The figure's title.
    per_row : int, optional
        Groups per row of axes: more wrap onto further stacked axes, so every group keeps a readable tick label.
    log : bool, optional
        The value axis on a log scale.

    Returns
    -------
    tuple
        ``(fig, axes (rows,))``.
    """
    n = len(names)
    if n > NAMED_GROUPS_MAX:
        return plot_sorted(values, ylabel, ylim, hlines, title, log)
    chunks = pages(n, per_row)
    width = min(per_row, n)
    fig, axes = plt.subplots(
        len(chunks), 1, figsize=(min(max(6.0, 0.22 * width + 2.0), MAX_WIDTH_IN), 2.8 * len(chunks) + 0.6),
        squeeze=False, layout="constrained",
    )
    axes = axes[:, 0]
    k = len(values)
    step = 0.8 / max(k, 1)
    for ax, chunk in zip(axes, chunks, strict=True):
        x = np.arange(len(chunk))
        for i, (series, v) in enumerate(values.items()):
            offset = (i - (k - 1) / 2) * step
            vals = np.asarray(v, dtype=float)[chunk.start : chunk.stop]
            color = model_color(series, i)
            if kind == "bar":
                ax.bar(x + offset, vals, width=step, color=color, label=literal(series))
            else:  # a marker shape per series too, not only a colour
                ax.plot(x + offset, vals, "os^Dv"[i % 5], ms=4, color=color, label=literal(series))
        for level in hlines:
            ax.axhline(level, color="k", lw=0.7, ls="--")
        ax.set_xticks(x, [short(names[i], TICK_CHARS) for i in chunk], rotation=90, fontsize=SMALL)
        ax.set_xlim(-0.6, width - 0.4)
        ax.tick_params(axis="y", labelsize=SMALL)
        ax.set_ylabel(literal(ylabel), fontsize=SMALL)
        _value_axis(ax, ylim, log)
        ax.grid(axis="y", lw=0.3, alpha=0.6)
    axes[0].legend(fontsize=SMALL, ncols=max(k, 1), loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False)
    if title:
        fig.suptitle(literal(title), fontsize=TITLE)
    return fig, axes


def plot_sorted(
    values: Mapping[str, np.ndarray],
    ylabel: str = "",
    ylim: tuple[float, float] | None = None,
    hlines: Sequence[float] = (),
    title: str | None = None,
    log: bool = False,
):
    """Every group's value of each series, sorted within the series: a point per group, so that a chart of
    thousands of groups shows every one of them, its spread and how many pass a reference level.

    Parameters
    ----------
    values : mapping of str to numpy.ndarray
        Per series, ``(group,)`` (NaN: missing, left out and counted in the legend).
    ylabel, ylim, hlines, title, log
        As for :func:`plot_per_group`.

    Returns
    -------
    tuple
        ``(fig, axes (1,))``.
    """
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN * 0.7, 3.6), layout="constrained")
    n = max((np.size(v) for v in values.values()), default=0)
    for i, (series, v) in enumerate(values.items()):
        vals = np.asarray(v, dtype=float)
        kept = np.sort(vals[~np.isnan(vals)])
        gone = vals.size - kept.size
        label = literal(series) + (f" ({gone} missing)" if gone else "")
        ax.plot(np.arange(1, kept.size + 1), kept, "-" + "os^Dv"[i % 5], ms=2.5, lw=1.0, markevery=max(1, n // 60),
                color=model_color(series, i), label=label)
    for level in hlines:
        ax.axhline(level, color="k", lw=0.7, ls="--")
    ax.set_xlabel(f"groups ({n}), sorted by value within each model", fontsize=SMALL)
    ax.set_ylabel(literal(ylabel), fontsize=SMALL)
    ax.tick_params(labelsize=SMALL)
    ax.set_xlim(0, n + 1)
    _value_axis(ax, ylim, log)
    ax.grid(lw=0.3, alpha=0.6)
    ax.legend(fontsize=SMALL, ncols=max(len(values), 1), loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False)
    if title:
        fig.suptitle(literal(title), fontsize=TITLE)
    return fig, np.array([ax])


def plot_accuracy(
    models: Sequence[str],
    train: np.ndarray,
    test: np.ndarray,
    references: Mapping[str, tuple[np.ndarray, np.ndarray]],
):
    """Train and test accuracy of this run (filled dots) beside reference numbers (hollow markers).

    Parameters
    ----------
    models : sequence of str
        The models' labels.
    train, test : numpy.ndarray
        ``(model,)`` fractions.
    references : mapping of str to tuple of numpy.ndarray
        ``references[label] = (train, test)``, arrays as long as ``models``, NaN where a reference has no number.

    Returns
    -------
    tuple
        ``(fig, axes (2,))``.
    """
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.2), sharey=True, layout="constrained")
    markers = ["s", "^", "D", "v", "P"]
    x = np.arange(len(models))
    every = [np.asarray(train, float), np.asarray(test, float)]
    every += [np.asarray(a, float) for pair in references.values() for a in pair]
    finite = np.concatenate(every)
    finite = finite[np.isfinite(finite)]
    lo = math.floor((finite.min() - 0.02) * 20) / 20 if finite.size else 0.0
    for ax, split, ours, idx in ((axes[0], "train", train, 0), (axes[1], "test", test, 1)):
        for j, (label, pair) in enumerate(references.items()):
            ax.plot(x + 0.12 * (j + 1), pair[idx], markers[j % len(markers)], ms=6, mfc="none", label=label)
        ax.plot(x, ours, "o", ms=9, color="k", label="this run")
        ax.set_xticks(x, models, fontsize=SMALL)
        ax.set_xlim(-0.5, len(models) - 0.2)
        ax.set_ylim(max(0.0, lo), 1.0)
        ax.set_title(f"{split} accuracy", fontsize=TITLE)
        ax.tick_params(axis="y", labelsize=SMALL)
        ax.grid(axis="y", lw=0.3, alpha=0.6)
    axes[1].legend(fontsize=SMALL, loc="lower right")
    return fig, axes


def plot_reliability(tables: Mapping[str, Mapping[str, np.ndarray]]):
    """Reliability diagram: observed frequency of ``y = 1`` against mean predicted probability.

    Parameters
    ----------
    tables : mapping of str to mapping
        Per model, :func:`hbnn.diagnostics.evaluation.reliability`'s output; empty bins are skipped.

    Returns
    -------
    tuple
        ``(fig, ax)``.
    """
    fig, ax = plt.subplots(figsize=(4.2, 4.0), layout="constrained")
    ax.plot([0, 1], [0, 1], ls="--", lw=0.8, color="k", label="perfect calibration")
    for i, (name, t) in enumerate(tables.items()):
        ok = t["count"] > 0
        ax.plot(t["mean_predicted"][ok], t["observed"][ok], "o-", ms=4, color=model_color(name, i), label=name)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="mean predicted P(y = 1)", ylabel="observed fraction y = 1")
    ax.tick_params(labelsize=SMALL)
    ax.legend(fontsize=SMALL, loc="upper left")
    return fig, ax


def plot_loss(curves: Mapping[str, tuple[np.ndarray, np.ndarray]]):
    """ADVI loss (negative ELBO) against iteration, one line per model fitted with ADVI.

    The y axis is logarithmic where the (positive) loss falls by more than a factor of 10, as it often does early on,
    else linear: within one decade a log (or symlog) axis may hold no labelled tick.

    Parameters
    ----------
    curves : mapping of str to tuple of numpy.ndarray
        Per model, ``(iteration, loss)``.

    Returns
    -------
    tuple
        ``(fig, ax)``.
    """
    fig, ax = plt.subplots(figsize=(6.0, 3.6), layout="constrained")
    for i, (name, (it, loss)) in enumerate(curves.items()):
        ax.plot(it, loss, lw=1.0, color=model_color(name, i), label=name)
    values = np.concatenate([np.asarray(loss, dtype=float) for _, loss in curves.values()] or [np.ones(1)])
    values = values[np.isfinite(values)]
    wide = values.size and values.min() > 0 and values.max() > 10 * values.min()
    ax.set(xlabel="iteration", ylabel="loss (negative ELBO)", yscale="log" if wide else "linear")
    ax.tick_params(labelsize=SMALL)
    ax.legend(fontsize=SMALL, loc="upper right")
    return fig, ax


def plot_group_sd(samples: Mapping[str, np.ndarray], bins: int = 30):
    """Posterior density of each layer's group sd, one step line per chain.

    Parameters
    ----------
    samples : mapping of str to numpy.ndarray
        Per group-sd variable, its ``(chain, draw)`` draws.
    bins : int, optional
        Histogram bins per chain.

    Returns
    -------
    tuple
        ``(fig, axes (layer,))``.
    """
    n = len(samples)
    rows, cols = math.ceil(n / 3), min(n, 3)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols + 0.5, 2.9 * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[n:]:
        ax.set_axis_off()
    axes = axes.flat[:n]
    for ax, (var, draws) in zip(axes, samples.items(), strict=True):
        draws = np.asarray(draws, dtype=float)
        edges = np.histogram_bin_edges(draws, bins=bins)
        for c, chain in enumerate(draws):
            ax.hist(chain, bins=edges, density=True, histtype="step", lw=1.2, label=f"chain {c}")
        ax.set_title(var, fontsize=TITLE)
        ax.set_xlabel("group sd", fontsize=SMALL)
        ax.tick_params(labelsize=SMALL)
    for ax in axes[::3]:
        ax.set_ylabel("density", fontsize=SMALL)
    axes[-1].legend(fontsize=SMALL)
    return fig, axes


def plot_correlations(matrices: Mapping[str, np.ndarray], labels: Sequence[str]):
    """Side-by-side correlation heatmaps on one ``[-1, 1]`` colour scale.

    Parameters
    ----------
    matrices : mapping of str to numpy.ndarray
        Per title, a ``(k, k)`` correlation matrix.
    labels : sequence of str
        The ``k`` labels of both axes; where they would not fit at the smallest font, only every n-th is shown.

    Returns
    -------
    tuple
        ``(fig, axes)``.
    """
    n = len(matrices)
    k = len(labels)
    side = float(np.clip(0.25 * k + 1.5, 3.2, (MAX_WIDTH_IN - 0.9) / n))
    max_labels = int((side - 1.2) / (1.6 * SMALL / 72))  # label pitch: 1.6 line heights
    fig, axes = plt.subplots(1, n, figsize=(side * n + 0.9, side + 0.4), squeeze=False, layout="constrained")
    axes = axes[0]
    stride = max(1, math.ceil(k / max_labels))
    ticks = np.arange(0, k, stride)
    image = None
    for ax, (title, mat) in zip(axes, matrices.items(), strict=True):
        image = ax.imshow(mat, cmap="RdBu_r", vmin=-1.0, vmax=1.0, interpolation="nearest")
        ax.set_xticks(ticks, [short(labels[i], TICK_CHARS) for i in ticks], rotation=90, fontsize=SMALL)
        ax.set_yticks(ticks, [literal(labels[i]) for i in ticks], fontsize=SMALL)
        ax.set_title(literal(title), fontsize=SMALL)
    cbar = fig.colorbar(image, ax=axes, shrink=0.8)
    cbar.set_label("correlation", fontsize=SMALL)
    cbar.ax.tick_params(labelsize=SMALL)
    return fig, axes


def plot_transfer(rows: Sequence[float], labels: Sequence[str], score_name: str, series: Mapping[str, Mapping],
                  population: Mapping, differences: Mapping[str, Sequence[Mapping]],
                  groups: Sequence[int] | None = None):
    """The transfer curve: test score, test log loss and the informed prior's log density against the other models',
    against the held-out groups' training rows (the sizes at even steps, "all" last).

    Bars are +-2 standard errors over test rows.

    Parameters
    ----------
    rows, labels : sequence
        Each size's mean training rows and its label.
    score_name : str
        The headline score's name, for the axis.
    series : mapping of str to mapping
        Per model (``flat``, ``informed``, ``hier_refit``), ``score``, ``log_loss`` and ``lpd_se`` per size (NaN where
        a model did not run at a size).
    population : mapping
        The same scalars of the population model (drawn as a dashed line: no rows).
    differences : mapping of str to sequence of mapping
        Per comparison (``informed - flat``, ``informed - hierarchical refit``), per size, the paired ``mean`` and
        ``se``.
    groups : sequence of int, optional
        The held-out groups each size pools, written under its tick where they are not the same at every size.

    Returns
    -------
    tuple
        ``(fig, axes)``.
    """
    fig, axes = plt.subplots(1, 3, figsize=(11.0, 3.3), layout="constrained")
    # Sizes at even steps (2, 4, 8, ... are log-spaced already); "all" last, whatever its mean row count.
    x = np.arange(len(rows), dtype=float)
    pop_color = MODEL_COLORS["hierarchical"]
    for ax, key, title in ((axes[0], "score", f"test {score_name}"), (axes[1], "log_loss", "test log loss")):
        for name, values in series.items():
            y = np.asarray(values[key], dtype=float)
            err = 2 * np.asarray(values["lpd_se"], dtype=float) if key == "log_loss" else None
            ax.errorbar(x, y, yerr=err, marker="o", ms=4, lw=1.5, capsize=2, color=_transfer_color(name),
                        label=TRANSFER_LABELS.get(name, name))
        ax.axhline(population[key], color=pop_color, ls="--", lw=1.2, label="population (no rows)")
        ax.set_title(title, fontsize=TITLE)
    axes[2].axhline(0.0, color="black", lw=0.8)
    for k, (name, difference) in enumerate(differences.items()):
        diff = np.array([d["mean"] for d in difference], dtype=float)
        se = np.array([d["se"] for d in difference], dtype=float)
        axes[2].errorbar(x + 0.08 * k, diff, yerr=2 * se, marker="os"[k % 2], ms=4, lw=1.5, capsize=2,
                         color=_transfer_color("flat" if k == 0 else "hier_refit"), label=name)
    axes[2].set_title("informed prior's log density per test row", fontsize=TITLE)
    if len(differences) > 1:
        axes[2].legend(fontsize=SMALL)
    ticks = [f"{lab}\n(mean {r:.3g})" if not lab.startswith("n") else lab[1:] for lab, r in zip(labels, rows,
                                                                                                  strict=True)]
    if groups is not None and len(set(groups)) > 1:
        ticks = [f"{t}\n{counted(k, 'group')}" for t, k in zip(ticks, groups, strict=True)]
    for ax in axes:
        ax.set_xticks(x, ticks)
        ax.set_xlabel("training rows of each held-out group", fontsize=SMALL)
        ax.tick_params(labelsize=SMALL)
    axes[0].legend(fontsize=SMALL)
    return fig, axes


TRANSFER_LABELS = {"hier_refit": "hierarchical refit"}
# the hierarchical refit is the hierarchical model: a darker shade of its blue, apart from the population's dashed line
REFIT_COLOR = "#08519c"


def _transfer_color(name: str) -> str:
    """A transfer curve's colour: the variant's, a darker hierarchical blue for the refit."""
    return MODEL_COLORS.get(name, REFIT_COLOR)


def _value_axis(ax, ylim: tuple[float, float] | None, log: bool) -> None:
    """A per-group chart's value axis: its limits where given, and on a log scale with 1-2-5 ticks where asked."""
    if ylim is not None:
        ax.set_ylim(*ylim)
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
