"""Figures for the report, drawn from already-computed numbers.

Every function takes arrays, draws one figure and returns ``(fig, axes)``; none of them computes posterior quantities,
saves or shows anything. The caller renders the figure (see :func:`png_bytes`) and closes it. Every text a caller passes
(group and feature names, titles, labels) is drawn as written (:func:`literal`); matplotlib's own tick labels keep their
mathtext (``10^2`` on log axes).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from hbnn.errors import counted  # noqa: E402
from hbnn.pipeline.variants import VARIANTS  # noqa: E402

# The report shows one figure inch per CSS inch (hbnn.report.document), so a figure up to
# MAX_WIDTH_IN wide keeps its point sizes on a 1150-px page; PNGs carry DPI pixels per inch.
DPI = 150
MAX_WIDTH_IN = 11.3
SMALL = 9  # axis labels, tick labels, legends: the smallest text in any figure
TITLE = 10
PANEL_IN = 1.9  # inches per surface panel, less where a page's columns would pass MAX_WIDTH_IN
GROUPS_PER_ROW = 40  # per-group charts wrap onto a new row of axes after this many groups
MODEL_COLORS = {v.name: v.color for v in VARIANTS}
# y = 0 white circles ringed in black, y = 1 black triangles ringed in white: shape tells the
# classes apart and the thick ring keeps each visible on dark and light parts of both colour maps.
CLASS_STYLE = (
    {"c": "white", "edgecolors": "black", "marker": "o"},
    {"c": "black", "edgecolors": "white", "marker": "^"},
)
SURFACE_STYLE = {
    "mean": {"cmap": "RdBu_r", "vmin": 0.0, "vmax": 1.0, "label": "posterior mean P(y = 1)"},
    # sd of a probability is at most 0.5; a fixed scale keeps models and pages comparable.
    "sd": {"cmap": "viridis", "vmin": 0.0, "vmax": 0.5, "label": "posterior sd of P(y = 1)"},
    # Regression: the colour range comes from the data (value_range / the page's largest sd).
    "value_mean": {"cmap": "RdBu_r", "vmin": None, "vmax": None, "label": "posterior mean prediction"},
    "value_sd": {"cmap": "viridis", "vmin": 0.0, "vmax": None, "label": "posterior sd of the mean prediction"},
}


def literal(text: str) -> str:
    """``text`` for a matplotlib text that draws it as written: every ``$`` escaped as ``\\$``.

    matplotlib reads a text with an even number of unescaped ``$`` as mathtext: a group named ``$\\undefinedmacro$``
    would stop the report, ``50$ and 60$`` would be drawn as maths. With none unescaped, it draws ``\\$`` as ``$`` and
    every other character as it is. Every text these functions take from their callers goes through here; matplotlib's
    own tick labels (``$\\mathdefault{10^{2}}$`` on a log axis) stay mathtext, which ``text.parse_math: False`` would
    draw as code.

    Parameters
    ----------
    text : str

    Returns
    -------
    str
    """
    return str(text).replace("$", r"\$")


# Names drawn where their neighbours' stand beside them (panel titles, tick labels) are cut to these many characters
# (the rest as "..."): a group name as long as names.py allows would overprint the next panels' titles.
# The report's tables and the plots data hold every name whole.
TITLE_CHARS = 24
TICK_CHARS = 16


def short(text: str, limit: int) -> str:
    """:func:`literal` of ``text`` cut to ``limit`` characters, its end shown as ``...``.

    Returns
    -------
    str
    """
    text = str(text)
    return literal(text if len(text) <= limit else text[: limit - 3] + "...")


def png_bytes(fig, dpi: int = DPI, tight: bool = False) -> bytes:
    """Render ``fig`` to PNG bytes and close it.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    dpi : int, default :data:`DPI`
    tight : bool, default False
        Crop (or grow) the canvas to what is drawn, for figures laid out by other libraries whose text
        :func:`readable` enlarged.

    Returns
    -------
    bytes
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, **({"bbox_inches": "tight", "pad_inches": 0.1} if tight else {}))
    plt.close(fig)
    return buf.getvalue()


def readable(fig, size: float = SMALL, largest: float = TITLE + 1):
    """Bring every text of ``fig`` (titles, labels, ticks, legends) into ``[size, largest]`` points; for
    figures drawn by other libraries (ArviZ scales its text with the figure size). Returns ``fig``."""
    for text in fig.findobj(matplotlib.text.Text):
        if text.get_text():
            text.set_fontsize(min(max(text.get_fontsize(), size), largest))
    return fig


def shrink_png(data: bytes, max_width_px: int) -> bytes:
    """``data`` (a PNG) scaled down to at most ``max_width_px`` wide (unchanged if narrower), for pages
    that show images at their pixel size (``dvc plots``).

    Returns
    -------
    bytes
        A PNG.
    """
    from PIL import Image  # pillow: a dependency of matplotlib

    image = Image.open(io.BytesIO(data))
    if image.width <= max_width_px:
        return data
    height = round(image.height * max_width_px / image.width)
    buf = io.BytesIO()
    image.resize((max_width_px, height), Image.LANCZOS).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def plot_message(text: str):
    """A figure that only says ``text``: stands in for a plot that cannot be drawn, so a page that shows
    it (``dvc plots show``) says why instead of failing. Returns ``(fig, ax)``."""
    fig, ax = plt.subplots(figsize=(6.0, 1.6))
    ax.set_axis_off()
    ax.text(0.5, 0.5, literal(text), ha="center", va="center", wrap=True, fontsize=SMALL + 1)
    return fig, ax


def panel_grid(n: int) -> tuple[int, int]:
    """Near-square ``(rows, cols)`` for ``n >= 1`` panels: ``cols = ceil(sqrt(n))``, rows as needed.

    Returns
    -------
    tuple of (int, int)
    """
    cols = math.ceil(math.sqrt(n))
    return math.ceil(n / cols), cols


def pages(n: int, per_page: int) -> list[range]:
    """Split ``range(n)`` into consecutive pages of at most ``per_page`` items.

    Parameters
    ----------
    n, per_page : int

    Returns
    -------
    list of range
    """
    return [range(lo, min(lo + per_page, n)) for lo in range(0, n, per_page)]


def _model_color(name: str, i: int) -> str:
    return MODEL_COLORS.get(name, f"C{i}")


def plot_surface_page(
    fields: np.ndarray,
    names: Sequence[str],
    limit: float,
    points: Sequence[tuple[np.ndarray, np.ndarray]],
    kind: str = "mean",
    title: str | None = None,
    axis_labels: tuple[str, str] | None = None,
    value_range: tuple[float, float] | None = None,
    boundary: np.ndarray | None = None,
):
    """One page of per-group surfaces on the square ``[-limit, limit]^2``.

    ``fields`` is ``(panel, grid, grid)`` with rows along the second feature (``fields[k, i, j]`` at ``x2 = grid[i], x1
    = grid[j]``); ``names`` titles the panels; ``points[k] = (X (n, 2), y (n,))`` are the training rows overlaid, white
    for class 0, black for class 1. ``kind`` is ``"mean"`` (probability, 0.5 contour drawn) or ``"sd"`` (its posterior
    sd); for regression ``"value_mean"`` (predicted mean, colour scale ``value_range``, rows coloured by their label on
    the same scale) or ``"value_sd"`` (scale 0 to the page's largest sd). ``boundary`` (same shape as ``fields``): the
    posterior mean probabilities whose 0.5 contour is drawn on an ``"sd"`` page, so uncertainty can be read against the
    decision boundary. ``axis_labels`` names the two axes. Returns ``(fig, axes (rows, cols))``; unused panels are
    hidden and all panels share one colorbar.
    """
    style = dict(SURFACE_STYLE[kind])
    if kind == "value_mean":
        style["vmin"], style["vmax"] = value_range if value_range else (float(fields.min()), float(fields.max()))
    elif kind == "value_sd":
        style["vmax"] = max(float(fields.max()), 1e-12)
    n = len(names)
    rows, cols = panel_grid(n)
    # A fixed layout in inches: matplotlib's layout engines measure every tick label of every panel, most of the
    # report's time otherwise (measured: benchmarks/FINDINGS.md, section 'Measurements behind code comments').
    left, right = (0.65 if axis_labels else 0.5), 1.0  # right: colorbar and its label
    bottom, top = (0.55 if axis_labels else 0.4), (0.55 if title else 0.3)
    gap_w, gap_h = 0.15, 0.3  # between panels; gap_h leaves room for the panel titles
    fit = (MAX_WIDTH_IN - left - right - (cols - 1) * gap_w) / cols
    panel = min(PANEL_IN if n > 4 else 1.4 * PANEL_IN, fit)
    width = max(left + right + cols * panel + (cols - 1) * gap_w, 5.0)
    panel_w = (width - left - right - (cols - 1) * gap_w) / cols
    height = bottom + top + rows * panel + (rows - 1) * gap_h
    fig, axes = plt.subplots(
        rows, cols, figsize=(width, height), sharex=True, sharey=True, squeeze=False,
        gridspec_kw={"left": left / width, "right": 1 - right / width, "bottom": bottom / height,
                     "top": 1 - top / height, "wspace": gap_w / panel_w, "hspace": gap_h / panel},
    )
    extent = (-limit, limit, -limit, limit)
    grid = np.linspace(-limit, limit, fields.shape[-1])
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.set_axis_off()
            continue
        field = fields[k]
        image = ax.imshow(field, origin="lower", extent=extent, cmap=style["cmap"],
                          vmin=style["vmin"], vmax=style["vmax"], interpolation="nearest", aspect="equal")
        edge = field if kind == "mean" else (boundary[k] if boundary is not None else None)
        if edge is not None and edge.min() < 0.5 < edge.max():
            ax.contour(grid, grid, edge, levels=[0.5], colors="k" if kind == "mean" else "white",
                       linewidths=0.8 if kind == "mean" else 1.0, linestyles="solid" if kind == "mean" else "dashed")
        X, y = points[k]
        if kind == "value_mean":
            ax.scatter(X[:, 0], X[:, 1], c=y, cmap=style["cmap"], vmin=style["vmin"], vmax=style["vmax"], s=13,
                       linewidths=0.7, edgecolors="black")
        elif kind == "value_sd":
            ax.scatter(X[:, 0], X[:, 1], s=6, c="white", edgecolors="black", linewidths=0.5)
        else:
            for cls, marker in enumerate(CLASS_STYLE):
                sel = y == cls
                ax.scatter(X[sel, 0], X[sel, 1], s=13, linewidths=0.7, **marker)
        ax.set_xlim(-limit, limit)
        ax.set_ylim(-limit, limit)
        # y given: matplotlib does not measure every tick label of the panel to place the title (a cost per page)
        ax.set_title(short(names[k], TITLE_CHARS), fontsize=SMALL, pad=2, y=1.0)
        ax.tick_params(labelsize=SMALL, length=2, pad=1)
        ax.label_outer()
    if image is not None:
        grid_h = height - bottom - top
        bar_h = min(0.9, 0.35 + 0.15 * rows) * grid_h
        cax = fig.add_axes(((width - right + 0.12) / width, (bottom + (grid_h - bar_h) / 2) / height,
                            0.12 / width, bar_h / height))
        cbar = fig.colorbar(image, cax=cax)
        cbar.set_label(style["label"], fontsize=SMALL)
        cbar.ax.tick_params(labelsize=SMALL)
    if axis_labels is not None:
        for ax in axes[-1, :]:
            ax.set_xlabel(literal(axis_labels[0]), fontsize=SMALL, labelpad=1)
        for ax in axes[:, 0]:
            ax.set_ylabel(literal(axis_labels[1]), fontsize=SMALL, labelpad=1)
    if title:
        fig.suptitle(literal(title), fontsize=TITLE, y=1 - 0.1 / height, va="top")
    return fig, axes


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
    """Grouped bars (``kind="bar"``) or dots (``"point"``) of one value per group and series.

    ``values[series]`` is ``(group,)`` aligned with ``names`` (NaN = missing). More than ``per_row`` groups wrap onto
    further stacked axes so every group keeps a readable tick label. ``hlines`` are dashed reference levels; ``log``
    draws the value axis on a log scale. Returns ``(fig, axes (rows,))``.
    """
    n = len(names)
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
            color = _model_color(series, i)
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
        if ylim is not None:
            ax.set_ylim(*ylim)
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(axis="y", lw=0.3, alpha=0.6)
    axes[0].legend(fontsize=SMALL, ncols=max(k, 1), loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False)
    if title:
        fig.suptitle(literal(title), fontsize=TITLE)
    return fig, axes


def plot_accuracy(
    models: Sequence[str],
    train: np.ndarray,
    test: np.ndarray,
    references: Mapping[str, tuple[np.ndarray, np.ndarray]],
):
    """Train and test accuracy of this run (filled dots) beside reference numbers (hollow markers).

    ``train``/``test`` are ``(model,)`` fractions; ``references[label] = (train, test)`` arrays of the same length, NaN
    where a reference has no number. Returns ``(fig, axes (2,))``.
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

    ``tables[model]`` is :func:`hbnn.diagnostics.evaluation.reliability` output; empty bins are
    skipped. Returns ``(fig, ax)``.
    """
    fig, ax = plt.subplots(figsize=(4.2, 4.0), layout="constrained")
    ax.plot([0, 1], [0, 1], ls="--", lw=0.8, color="k", label="perfect calibration")
    for i, (name, t) in enumerate(tables.items()):
        ok = t["count"] > 0
        ax.plot(t["mean_predicted"][ok], t["observed"][ok], "o-", ms=4, color=_model_color(name, i), label=name)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="mean predicted P(y = 1)", ylabel="observed fraction y = 1")
    ax.tick_params(labelsize=SMALL)
    ax.legend(fontsize=SMALL, loc="upper left")
    return fig, ax


def plot_loss(curves: Mapping[str, tuple[np.ndarray, np.ndarray]]):
    """ADVI loss (negative ELBO) against iteration, one line per model fitted with ADVI.

    ``curves[model] = (iteration, loss)``; the y axis is logarithmic where the (positive) loss falls by more than
    a factor of 10, as it often does early on, else linear: within one decade a log (or symlog) axis may hold no
    labelled tick. Returns ``(fig, ax)``.
    """
    fig, ax = plt.subplots(figsize=(6.0, 3.6), layout="constrained")
    for i, (name, (it, loss)) in enumerate(curves.items()):
        ax.plot(it, loss, lw=1.0, color=_model_color(name, i), label=name)
    values = np.concatenate([np.asarray(loss, dtype=float) for _, loss in curves.values()] or [np.ones(1)])
    values = values[np.isfinite(values)]
    wide = values.size and values.min() > 0 and values.max() > 10 * values.min()
    ax.set(xlabel="iteration", ylabel="loss (negative ELBO)", yscale="log" if wide else "linear")
    ax.tick_params(labelsize=SMALL)
    ax.legend(fontsize=SMALL, loc="upper right")
    return fig, ax


def plot_group_sd(samples: Mapping[str, np.ndarray], bins: int = 30):
    """Posterior density of each layer's group sd, one step line per chain.

    ``samples[var]`` is ``(chain, draw)``. Returns ``(fig, axes (layer,))``.
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

    ``matrices[title]`` is ``(k, k)`` with ``labels`` (length ``k``) on both axes; where they would not fit at the
    smallest font, only every n-th label is shown. Returns ``(fig, axes)``.
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
                  population: Mapping, difference: Sequence[Mapping], groups: Sequence[int] | None = None):
    """The transfer curve: test score, test log loss and the informed-minus-flat log density against the held-out
    groups' training rows (the sizes at even steps, "all" last).

    Bars are +-2 standard errors over test rows.

    Parameters
    ----------
    rows, labels : sequence
        Each size's mean training rows and its label.
    score_name : str
        The headline score's name, for the axis.
    series : mapping of str to mapping
        Per model, ``score``, ``log_loss`` and ``lpd_se`` per size.
    population : mapping
        The same scalars of the population model (drawn as a dashed line: no rows).
    difference : sequence of mapping
        Per size, the informed-minus-flat ``mean`` and ``se``.
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
            ax.errorbar(x, y, yerr=err, marker="o", ms=4, lw=1.5, capsize=2, color=MODEL_COLORS[name],
                        label=name)
        ax.axhline(population[key], color=pop_color, ls="--", lw=1.2, label="population (no rows)")
        ax.set_title(title, fontsize=TITLE)
    diff = np.array([d["mean"] for d in difference])
    se = np.array([d["se"] for d in difference])
    axes[2].axhline(0.0, color="black", lw=0.8)
    axes[2].errorbar(x, diff, yerr=2 * se, marker="o", ms=4, lw=1.5, capsize=2, color=MODEL_COLORS["informed"])
    axes[2].set_title("informed - flat, log density per test row", fontsize=TITLE)
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
