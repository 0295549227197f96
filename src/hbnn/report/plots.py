"""Figures for the report, drawn from already-computed numbers.

Every function takes arrays, draws one figure and returns ``(fig, axes)``; none of them computes posterior quantities,
saves or shows anything. The caller renders the figure (see :func:`png_bytes`) and closes it. Every text a caller passes
(group and feature names, titles, labels) is drawn as written (:func:`literal`); matplotlib's own tick labels keep their
mathtext (``10^2`` on log axes).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

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

    Parameters
    ----------
    text : str
        A name or label.
    limit : int
        The most characters shown.

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
    """Bring every text of ``fig`` (titles, labels, ticks, legends) into ``[size, largest]`` points, for figures
    drawn by other libraries (ArviZ scales its text with the figure size).

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure, changed in place.
    size, largest : float
        The smallest and largest font sizes, in points.

    Returns
    -------
    matplotlib.figure.Figure
        ``fig``.
    """
    for text in fig.findobj(matplotlib.text.Text):
        if text.get_text():
            text.set_fontsize(min(max(text.get_fontsize(), size), largest))
    return fig


def shrink_png(data: bytes, max_width_px: int) -> bytes:
    """``data`` (a PNG) scaled down to at most ``max_width_px`` wide (unchanged if narrower), for pages that show images
    at their pixel size (``dvc plots``).

    Parameters
    ----------
    data : bytes
        A PNG.
    max_width_px : int
        The widest it may be.

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
    """A figure that only says ``text``: it stands in for a plot that cannot be drawn, so a page that shows it
    (``dvc plots show``) says why instead of failing.

    Parameters
    ----------
    text : str
        What to say.

    Returns
    -------
    tuple
        ``(fig, ax)``.
    """
    fig, ax = plt.subplots(figsize=(6.0, 1.6))
    ax.set_axis_off()
    ax.text(0.5, 0.5, literal(text), ha="center", va="center", wrap=True, fontsize=SMALL + 1)
    return fig, ax


def panel_grid(n: int) -> tuple[int, int]:
    """Near-square ``(rows, cols)`` for ``n >= 1`` panels: ``cols = ceil(sqrt(n))``, rows as needed.

    Parameters
    ----------
    n : int
        The number of panels.

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


def model_color(name: str, i: int) -> str:
    """A model's colour in every figure (:attr:`hbnn.pipeline.variants.Variant.color`), else matplotlib's ``i``-th.

    Parameters
    ----------
    name : str
        The model variant's name.
    i : int
        Its position, for a series that is not a model variant.

    Returns
    -------
    str
    """
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

    Parameters
    ----------
    fields : numpy.ndarray
        ``(panel, grid, grid)`` with rows along the second feature (``fields[k, i, j]`` at ``x2 = grid[i]``,
        ``x1 = grid[j]``).
    names : sequence of str
        The panels' titles.
    limit : float
        Half the side of the square.
    points : sequence of tuple of numpy.ndarray
        ``points[k] = (X (n, 2), y (n,))``: the training rows overlaid, white for class 0, black for class 1.
    kind : str, optional
        ``"mean"`` (probability, 0.5 contour drawn) or ``"sd"`` (its posterior sd); for regression ``"value_mean"``
        (predicted mean, colour scale ``value_range``, rows coloured by their label on the same scale) or
        ``"value_sd"`` (scale 0 to the page's largest sd).
    title : str, optional
        The page's title.
    axis_labels : tuple of (str, str), optional
        The two axes' names.
    value_range : tuple of (float, float), optional
        ``"value_mean"``'s colour scale.
    boundary : numpy.ndarray, optional
        Shaped as ``fields``: the posterior mean probabilities whose 0.5 contour is drawn on an ``"sd"`` page, so
        uncertainty can be read against the decision boundary.

    Returns
    -------
    tuple
        ``(fig, axes (rows, cols))``; unused panels are hidden and all panels share one colorbar.
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
