"""The `report` stage: figures, a Markdown and a self-contained HTML report, summary metrics.

Accuracies (RMSE, lpd and coverage for gaussian tasks) and diagnostics are read
from the fit stages' metrics files, never recomputed. Posterior quantities the
metrics do not hold (decision surfaces, group sds, weight correlations) come
from the traces, one model and one group at a time, so memory does not grow
with draws x grid x groups.

Surfaces are drawn over the first two features; with more features the others
are held at their training mean, and with a single feature there are no
surfaces (the report says so).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from hbnn import plots
from hbnn.config import Params, ReportParams
from hbnn.data import Split, Tasks, load_tasks
from hbnn.evaluation import group_weights, predict_output, predict_proba, reliability
from hbnn.io import InputError, Outputs, as_builtin, load_trace, settings_from_attrs, staged_outputs
from hbnn.network import LayerSpec, layer_specs
from hbnn.prior import load_prior
from hbnn.variants import VARIANTS

log = logging.getLogger(__name__)

MODELS = tuple(v.name for v in VARIANTS)
LABELS = {v.name: v.label for v in VARIANTS}
METRICS_FILES = {v.name: f"{v.stem}.json" for v in VARIANTS}
LOSS_POINTS = 500  # rows of plots/advi_loss.csv at most

# Train / test accuracy (%) printed by the seed notebooks; None = not done there.
REFERENCES: dict[str, dict[str, tuple[float, float] | None]] = {
    "PyMC3 original": {"flat": (86.78, 83.78), "hierarchical": (91.11, 89.78), "informed": (91.56, 87.11)},
    "NumPyro port": {"flat": (86.67, 83.56), "hierarchical": (90.78, 89.33), "informed": (91.44, 86.67)},
    "BlackJAX port": {"flat": (86.56, 83.67), "hierarchical": (91.11, 89.56), "informed": None},
}
# The data those numbers came from; they are only comparable on the same data.
REFERENCE_DATA = {
    "n_groups": 18,
    "seed": 31,
    "data.n_samples": 100,
    "data.noise": 0.3,
    "data.rotation_deg": 90.0,
    "data.train_fraction": 0.5,
}
RHAT_OK = 1.01
CHUNK_VALUES = 2**21  # float64 values per intermediate array of a surface chunk (16 MB)

CSS = """
body { font-family: sans-serif; max-width: 1150px; margin: 0 auto; padding: 1em 2em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 2px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f0f0; }
img { max-width: 100%; height: auto; display: block; margin: 0.4em 0; }
figure { margin: 0.8em 0; } figcaption { font-size: 0.85em; color: #555; }
.how { color: #444; background: #f6f6f6; padding: 0.4em 0.8em; border-left: 3px solid #999; }
.warn { color: #8a1c00; font-weight: bold; }
"""


# ----------------------------------------------------------------------------- document model
@dataclass(frozen=True)
class Para:
    text: str
    warn: bool = False


@dataclass(frozen=True)
class Heading:
    text: str


@dataclass(frozen=True)
class Table:
    header: Sequence[str]
    rows: Sequence[Sequence[str]]


@dataclass(frozen=True)
class Figure:
    name: str  # file name under figures/
    caption: str


@dataclass(frozen=True)
class Section:
    title: str
    how_to_read: str
    blocks: Sequence[Para | Heading | Table | Figure]


def render_markdown(title: str, intro: Sequence[Para], sections: Sequence[Section]) -> str:
    """The report as Markdown; figures are linked as ``figures/<name>``."""
    out = [f"# {title}", ""]
    for p in intro:
        out += [f"**{p.text}**" if p.warn else p.text, ""]
    for sec in sections:
        out += [f"## {sec.title}", "", f"*How to read this:* {sec.how_to_read}", ""]
        for b in sec.blocks:
            if isinstance(b, Heading):
                out += [f"### {b.text}", ""]
            elif isinstance(b, Para):
                out += [f"**{b.text}**" if b.warn else b.text, ""]
            elif isinstance(b, Table):
                out.append("| " + " | ".join(b.header) + " |")
                out.append("|" + "|".join(["---"] + ["---:"] * (len(b.header) - 1)) + "|")
                out += ["| " + " | ".join(row) + " |" for row in b.rows]
                out.append("")
            else:
                out += [f"![{b.caption}](figures/{b.name})", "", f"*{b.caption}*", ""]
    return "\n".join(out)


def render_html(title: str, intro: Sequence[Para], sections: Sequence[Section], figures: dict[str, bytes]) -> str:
    """The report as one offline HTML page: inline CSS, images as base64 data URIs."""
    e = html.escape

    def para(p: Para) -> str:
        return f'<p class="warn">{e(p.text)}</p>' if p.warn else f"<p>{e(p.text)}</p>"

    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{e(title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>", f"<h1>{e(title)}</h1>"]
    out += [para(p) for p in intro]
    for sec in sections:
        out += [f"<h2>{e(sec.title)}</h2>", f'<p class="how"><b>How to read this:</b> {e(sec.how_to_read)}</p>']
        for b in sec.blocks:
            if isinstance(b, Heading):
                out.append(f"<h3>{e(b.text)}</h3>")
            elif isinstance(b, Para):
                out.append(para(b))
            elif isinstance(b, Table):
                out.append("<table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in b.header) + "</tr></thead>")
                out.append("<tbody>")
                out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in b.rows]
                out.append("</tbody></table>")
            else:
                data = base64.b64encode(figures[b.name]).decode("ascii")
                out.append(f'<figure><img src="data:image/png;base64,{data}" alt="{e(b.caption)}">'
                           f"<figcaption>{e(b.caption)}</figcaption></figure>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- numbers
def _get(d: Any, *keys: str) -> Any:
    """``d[k1][k2]...`` or None where any level is missing."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _fmt(x: Any, spec: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "n/a"
    return format(x, spec)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}"


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def read_json(path: Path, what: str) -> dict:
    """A metrics JSON file, or :class:`InputError` naming it."""
    if not path.is_file():
        raise InputError(f"{what} {path} does not exist; run the stage that writes it first (dvc repro)")
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise InputError(f"{what} {path} is not valid JSON ({err})") from err


def surface_points(limit: float, size: int, centre: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Axis values ``(size,)`` and grid points ``(size * size, feature)`` in row-major ``(x2, x1)`` order.

    The grid spans the first two features; further features (``centre`` has one
    value per feature, default two features) are held at their ``centre`` value.
    """
    axis = np.linspace(-limit, limit, size)
    x1, x2 = np.meshgrid(axis, axis)
    points = np.zeros((size * size, 2 if centre is None else len(centre)))
    if centre is not None:
        points[:] = centre
    points[:, 0], points[:, 1] = x1.ravel(), x2.ravel()
    return axis, points


def thin_indices(n_total: int, n_keep: int) -> np.ndarray:
    """``min(n_keep, n_total)`` evenly spaced, distinct indices into ``range(n_total)``."""
    return np.unique(np.linspace(0, n_total - 1, min(n_keep, n_total)).round().astype(np.int64))


def surface_stats(
    weights: Sequence[np.ndarray], points: np.ndarray, scale: tuple[float, float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and sd of ``P(y = 1)`` (or, with ``scale``, of the predicted mean) at ``points (n, feature)``.

    ``weights`` are per-layer ``(sample, *shape)`` draws. ``scale = (y_mean,
    y_sd)`` selects the gaussian output ``y_mean + y_sd * output`` instead of the
    probability. Draws are taken in chunks and only running sums are kept, so
    memory is ``chunk * n`` values. The network runs in float32 (4x faster on
    the default 100 x 100 grid; mean and sd differ from float64 by about 1e-8,
    far below what a plot shows); the sums are float64.
    """
    weights = [np.asarray(w, dtype=np.float32) for w in weights]
    points = np.asarray(points, dtype=np.float32)
    n_samples = weights[0].shape[0]
    width = max(w.shape[-1] for w in weights)
    chunk = max(1, CHUNK_VALUES // (points.shape[0] * width))
    s1 = np.zeros(points.shape[0])
    s2 = np.zeros(points.shape[0])
    for lo in range(0, n_samples, chunk):
        batch = [w[None, lo : lo + chunk] for w in weights]
        if scale is None:
            p = predict_proba(batch, points, chunk=chunk)[0]
        else:
            p = scale[0] + scale[1] * predict_output(batch, points, chunk=chunk)[0]
        s1 += p.sum(axis=0, dtype=np.float64)
        s2 += np.square(p, dtype=np.float64).sum(axis=0)
    mean = s1 / n_samples
    return mean, np.sqrt(np.clip(s2 / n_samples - mean**2, 0.0, None))


def correlation_from_cov(cov: np.ndarray) -> np.ndarray:
    """Correlation matrix of a covariance matrix; NaN rows/columns where a variance is 0."""
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    denom = np.outer(sd, sd)
    corr = np.full(cov.shape, np.nan)
    np.divide(cov, denom, out=corr, where=denom > 0)
    return np.clip(corr, -1.0, 1.0)


def correlation_of_draws(draws: np.ndarray) -> np.ndarray:
    """Correlation matrix ``(k, k)`` of ``(n, k)`` draws (all NaN with fewer than 2 draws)."""
    if draws.shape[0] < 2:
        return np.full((draws.shape[1], draws.shape[1]), np.nan)
    return correlation_from_cov(np.atleast_2d(np.cov(draws, rowvar=False)))


def weight_labels(spec: LayerSpec, features: Sequence[str]) -> list[str]:
    """``feature->unit`` labels of the first layer's weights in row-major (flattened) order.

    A linear model's only layer maps features to the output: ``feature->out``.
    """
    rows = list(features) if spec.dims[0] == "feature" else [str(i) for i in range(spec.shape[0])]
    if len(spec.shape) == 1:
        return [f"{r}->out" for r in rows]
    return [f"{r}->{u}" for r in rows for u in range(spec.shape[1])]


# ----------------------------------------------------------------------------- inputs
def _open_traces(paths: dict[str, Path]) -> dict[str, Any]:
    """Every trace opened lazily (variant checked, nothing loaded yet)."""
    return {v: load_trace(p, v, groups=()) for v, p in paths.items()}


def _close(idata) -> None:
    for name in idata.groups():
        idata[name].close()


def _needed_vars(variant: str, specs: Sequence[LayerSpec]) -> list[str]:
    """Posterior variables the report reads from a trace of ``variant``."""
    extra = [*(f"sd_{s.name}" for s in specs), f"mu_{specs[0].name}"] if variant == "hierarchical" else []
    return [s.var for s in specs] + extra


def _check_traces(traces: dict[str, Any], paths: dict[str, Path], specs: Sequence[LayerSpec],
                  names: Sequence[str]) -> None:
    """Every trace has the variables the report reads and the tasks file's groups, in order."""
    for v, idata in traces.items():
        missing = [n for n in _needed_vars(v, specs) if n not in idata.posterior]
        if missing:
            raise InputError(f"trace {paths[v]} lacks posterior variables {missing}")
        _check_groups(idata.posterior, paths[v], names)


def _load_vars(idata, names: Sequence[str]) -> xr.Dataset:
    """Load only ``names`` from a lazily opened trace's posterior, into a new dataset."""
    # compute(), not load(): load() would also fill the lazy dataset, keeping every model in memory.
    return idata.posterior[list(names)].compute()


def _specs(traces: dict[str, Any], paths: dict[str, Path], params: Params, tasks: Tasks) -> list[LayerSpec]:
    """Layer layout shared by all three traces (from their settings attrs)."""
    found = {}
    for v, idata in traces.items():
        settings = settings_from_attrs(idata.posterior.attrs)
        found[v] = tuple(settings.get("hidden_layers", params.model.hidden_layers))
        features = settings.get("features", tasks.features)
        if list(features) != tasks.features:
            raise InputError(f"trace {paths[v]} was fit on features {features}, the tasks file has {tasks.features}")
    if len(set(found.values())) != 1:
        raise InputError(f"the traces disagree on hidden_layers: {found}; rerun the fit stages")
    return layer_specs(tasks.n_features, next(iter(found.values())))


def _check_groups(post: xr.Dataset, path: Path, names: Sequence[str]) -> None:
    found = [str(g) for g in post["group"].values]
    if found != list(names):
        raise InputError(f"trace {path} holds groups {found[:5]}... ({len(found)}), the tasks file "
                         f"{list(names)[:5]}... ({len(names)}); rerun the fit stages")


def _check_metrics(metrics: dict[str, dict], metrics_dir: Path, names: Sequence[str]) -> None:
    for v, m in metrics.items():
        groups = _get(m, "per_group") or {}
        if sorted(groups) != sorted(names):
            raise InputError(f"metrics file {metrics_dir / METRICS_FILES[v]} covers groups {sorted(groups)[:5]}... "
                             f"({len(groups)}), the tasks file has {len(names)}; rerun the fit stages")


def _data_settings(tasks: Tasks, params: Params) -> dict[str, Any]:
    """The data settings the tasks file was made with (from its attrs, else params)."""
    s = settings_from_attrs(tasks.ds.attrs)
    data = s.get("data", {})
    out = {
        "n_groups": tasks.n_groups,
        "seed": s.get("seed", params.seed),
        **{f"data.{k}": data.get(k, getattr(params.data, k)) for k in
           ("n_samples", "noise", "rotation_deg", "train_fraction")},
    }
    if tasks.ds.attrs.get("source") == "table":
        out["data.source"] = "table"
        out["data.path"] = tasks.ds.attrs.get("table", data.get("path"))
    return out


# ----------------------------------------------------------------------------- figures
@dataclass(frozen=True)
class SurfaceSetup:
    """What the surfaces show: ``P(y = 1)`` (``scale`` None) or the gaussian predicted mean.

    ``centre`` holds every feature's training mean (the value of features beyond
    the first two); ``scale = (y_mean, y_sd)``; ``value_range`` fixes the colour
    scale of predicted means and training labels across pages and models.
    """

    centre: np.ndarray
    features: tuple[str, ...]
    scale: tuple[float, float] | None = None
    value_range: tuple[float, float] | None = None
    axis_labels: tuple[str, str] | None = None

    @staticmethod
    def of(tasks: Tasks) -> SurfaceSetup:
        train = tasks.split("train")
        centre = train.X.mean(axis=0)
        labels = None
        if tasks.ds.attrs.get("source") == "table":
            labels = (f"{tasks.features[0]} (standardised)", f"{tasks.features[1]} (standardised)")
        if tasks.likelihood != "gaussian":
            return SurfaceSetup(centre, tuple(tasks.features), axis_labels=labels)
        y = tasks.y_mean + tasks.y_sd * train.y
        return SurfaceSetup(centre, tuple(tasks.features), (tasks.y_mean, tasks.y_sd),
                            (float(np.quantile(y, 0.01)), float(np.quantile(y, 0.99))), labels)


def model_surfaces(
    variant: str, post: xr.Dataset, specs: Sequence[LayerSpec], names: Sequence[str], train: Split, rp: ReportParams,
    setup: SurfaceSetup | None = None,
) -> tuple[dict[str, bytes], int]:
    """Decision-surface and uncertainty pages of one model.

    Each group's surface is computed once (mean and sd together) from
    ``surface_draws`` draws thinned evenly over all chains and draws; only one
    page of surfaces is held at a time. Returns ``({file name: png}, draws used)``.
    """
    setup = setup or SurfaceSetup(np.zeros(2), ("x1", "x2"))
    axis, points = surface_points(rp.grid_limit, rp.grid_size, setup.centre)
    gaussian = setup.scale is not None
    n_chain, n_draw = post.sizes["chain"], post.sizes["draw"]
    keep = thin_indices(n_chain * n_draw, rp.surface_draws)
    page_list = plots.pages(len(names), rp.panels_per_page)
    width = max(2, len(str(len(page_list))))
    out = {}
    for p, page in enumerate(page_list, start=1):
        means, sds, points_on_page = [], [], []
        for g in page:
            w = [x.reshape(n_chain * n_draw, *x.shape[2:])[keep] for x in group_weights(post, specs, names[g])]
            mean, sd = surface_stats(w, points, setup.scale)
            means.append(mean.reshape(axis.size, axis.size))
            sds.append(sd.reshape(axis.size, axis.size))
            rows = train.rows(g)
            y = train.y[rows] if not gaussian else setup.scale[0] + setup.scale[1] * train.y[rows]
            points_on_page.append((train.X[rows][:, :2], y))
        titles = [names[g] for g in page]
        kinds = (("mean", means, "surface", "posterior mean P(y=1)"), ("sd", sds, "uncertainty",
                                                                      "posterior sd of P(y=1)"))
        if gaussian:
            kinds = (("value_mean", means, "surface", "posterior mean prediction"),
                     ("value_sd", sds, "uncertainty", "posterior sd of the mean prediction"))
        held = f"; {', '.join(setup.features[2:])} at training mean" if len(setup.features) > 2 else ""
        for kind, fields, stem, what in kinds:
            fig, _ = plots.plot_surface_page(np.stack(fields), titles, rp.grid_limit, points_on_page, kind,
                                             title=f"{LABELS[variant]}: {what}{held} (page {p}/{len(page_list)})",
                                             axis_labels=setup.axis_labels, value_range=setup.value_range)
            out[f"{stem}_{variant}_p{p:0{width}d}.png"] = plots.png_bytes(fig)
        log.info("report: %s surfaces page %d/%d done", variant, p, len(page_list))
    return out, int(keep.size)


def test_mean_probabilities(post: xr.Dataset, specs: Sequence[LayerSpec], names: Sequence[str], test: Split):
    """Posterior mean P(y=1) over all draws at every test row, in ``test`` (group-sorted) order."""
    parts = [
        predict_proba(group_weights(post, specs, names[g]), test.X[test.rows(g)]).mean(axis=(0, 1))
        for g in range(len(names))
    ]
    return np.concatenate(parts) if parts else np.zeros(0)


def _trace_figures(
    traces: dict[str, Any], specs: Sequence[LayerSpec], tasks: Tasks, rp: ReportParams
) -> tuple[dict[str, bytes], dict[str, list[str]], dict[str, int], xr.Dataset, dict[str, dict]]:
    """Surface pages and test-set reliability of every model, loading one model's weights at a time.

    Returns the pages ``{file name: png}`` (none with a single feature), each
    model's sorted page names, the draws each used, the hierarchical
    ``sd_<layer>`` and first-layer ``mu`` draws (all that is kept of the traces
    afterwards) and each model's reliability table on the pooled test rows
    (bernoulli only; empty for gaussian tasks).
    """
    train, test = tasks.split("train"), tasks.split("test")
    setup = SurfaceSetup.of(tasks)
    figures, surface_files, used_draws, hier_extra, calibration = {}, {}, {}, None, {}
    for v in MODELS:
        post = _load_vars(traces[v], _needed_vars(v, specs))
        pages, used_draws[v] = {}, 0
        if tasks.n_features >= 2:
            pages, used_draws[v] = model_surfaces(v, post, specs, tasks.group_names, train, rp, setup)
        surface_files[v] = sorted(pages)
        figures.update(pages)
        if tasks.likelihood == "bernoulli":
            calibration[v] = reliability(test_mean_probabilities(post, specs, tasks.group_names, test), test.y)
        if v == "hierarchical":
            hier_extra = post[[n for n in post.data_vars if not n.startswith("w_")]]
        del post
    return figures, surface_files, used_draws, hier_extra, calibration


def _correlation_figure(hier_extra: xr.Dataset, prior: dict, spec: LayerSpec, features: Sequence[str],
                        ref_chain: int) -> bytes:
    """Heatmaps: correlations of the informed prior's ``cov_<layer>`` and of ``mu_<layer>`` draws of one chain."""
    mu = hier_extra[f"mu_{spec.name}"].transpose("chain", "draw", *spec.dims).values[ref_chain]
    corr = {
        f"informed prior: corr from cov_{spec.name}": correlation_from_cov(prior[spec.name][1]),
        f"hierarchical mu_{spec.name} draws (chain {ref_chain})": correlation_of_draws(mu.reshape(mu.shape[0], -1)),
    }
    return plots.png_bytes(plots.plot_correlations(corr, weight_labels(spec, features))[0])


def _per_group_values(metrics: dict[str, dict], names: Sequence[str], *keys: str) -> dict[str, np.ndarray]:
    """``{model: (group,)}`` of ``per_group.<g>.<keys>`` (NaN where missing)."""
    return {v: np.array([_get(metrics[v], "per_group", g, *keys) for g in names], dtype=float) for v in MODELS}


def _regression_figures(metrics: dict[str, dict], names: Sequence[str]) -> dict:
    """Per-group test RMSE and per-group R-hat figures of a gaussian run, from the metrics files."""
    rmse = _per_group_values(metrics, names, "test", "rmse")
    rhat = _per_group_values(metrics, names, "rhat_fn")
    return {
        "per_group_rmse.png": plots.png_bytes(plots.plot_per_group(
            names, rmse, kind="bar", ylabel="test RMSE")[0]),
        "rhat_fn.png": plots.png_bytes(plots.plot_per_group(
            names, rhat, kind="point", ylabel="function-space R-hat", hlines=(RHAT_OK,))[0]),
    }


def _metrics_figures(metrics: dict[str, dict], names: Sequence[str], accuracy: dict[str, np.ndarray]) -> dict:
    """Accuracy, per-group accuracy and per-group R-hat figures, all from the metrics files."""
    # Start the axis at chance (or lower if needed) so differences between models stay visible.
    low = min(0.5, np.floor(np.nanmin([*np.concatenate(list(accuracy.values())), 1.0]) * 10) / 10)
    refs = {r: tuple(np.array([np.nan if vals[v] is None else vals[v][i] / 100 for v in MODELS]) for i in (0, 1))
            for r, vals in REFERENCES.items()}
    train = np.array([_get(metrics[v], "train", "accuracy") for v in MODELS], dtype=float)
    test = np.array([_get(metrics[v], "test", "accuracy") for v in MODELS], dtype=float)
    rhat = _per_group_values(metrics, names, "rhat_fn")
    return {
        "per_group_accuracy.png": plots.png_bytes(plots.plot_per_group(
            names, accuracy, kind="bar", ylabel="test accuracy", ylim=(low, 1.0))[0]),
        "rhat_fn.png": plots.png_bytes(plots.plot_per_group(
            names, rhat, kind="point", ylabel="function-space R-hat", hlines=(RHAT_OK,))[0]),
        "accuracy.png": plots.png_bytes(plots.plot_accuracy([LABELS[v] for v in MODELS], train, test, refs)[0]),
    }


# ----------------------------------------------------------------------------- sections
def _intro(tasks: Tasks, specs, settings: dict[str, dict], used_draws: dict[str, int]) -> list:
    hidden = [s.shape[-1] for s in specs[:-1]]
    net = f"tanh MLP with hidden layers {hidden} (no biases)" if hidden else "linear model (no hidden layers, no bias)"
    if tasks.likelihood == "gaussian":
        net += (", gaussian likelihood with noise sd sigma (labels standardised with training mean "
                f"{tasks.y_mean:.4g} and sd {tasks.y_sd:.4g}; scores are in the label's units)")
    else:
        net += ", Bernoulli likelihood on the logit"
    sizes = np.bincount(tasks.split("train").group, minlength=tasks.n_groups)
    source = tasks.ds.attrs.get("table")
    data = f"table {source}, " if source else ""
    out = [Para(f"{data}{tasks.n_groups} groups ({sizes.min()} to {sizes.max()} training rows per group), "
                f"features {', '.join(tasks.features)}, {net}. "
                "Flat: an independent net per group with iid Normal(0, model.prior_sd) weights. "
                "Hierarchical: one model over all groups, w[g] = mu + sd * z[g] per layer (non-centred). "
                "Informed prior: an independent net per group with a multivariate-normal prior per layer fitted "
                "to new-group draws of the hierarchical posterior.")]
    runs = []
    for v in MODELS:
        s = settings[v].get("sampler", {})
        runs.append(f"{LABELS[v]}: {s.get('chains', '?')} chains x {s.get('draws', '?')} draws "
                    f"({s.get('tune', '?')} tuning, backend {s.get('backend', '?')}); "
                    + (f"surfaces use {used_draws[v]} draws" if used_draws[v] else "no surfaces"))
    out.append(Para("Sampling: " + "; ".join(runs) + "."))
    return out


def _reference_note(data: dict[str, Any]) -> Para:
    defaults = ", ".join(f"{k} {v}" for k, v in REFERENCE_DATA.items())
    if data.get("data.source") == "table":
        return Para(f"The reference numbers below are NOT comparable with this run: they were obtained on the moons "
                    f"data ({defaults}) but this run uses the table {data.get('data.path')}.", warn=True)
    diff = [f"{k} = {data[k]} (reference {ref})" for k, ref in REFERENCE_DATA.items() if data[k] != ref]
    if diff:
        return Para("The reference numbers below are NOT comparable with this run: they were obtained on the default "
                    f"data ({defaults}) but this run differs in: {'; '.join(diff)}.", warn=True)
    return Para(f"The data parameters are the defaults ({defaults}), so this run is comparable with the reference "
                "numbers, up to sampler randomness and the reference runs' own sampler settings.")


def _accuracy_section(metrics: dict[str, dict], data: dict[str, Any]) -> Section:
    header = ["Model", "Train %", "Test %", "Test log loss", "Test Brier",
              *[f"{r} (train / test %)" for r in REFERENCES]]
    rows = []
    for v in MODELS:
        m = metrics[v]
        refs = [f"{r[v][0]:.2f} / {r[v][1]:.2f}" if r[v] else "not done" for r in REFERENCES.values()]
        rows.append([LABELS[v], _pct(_get(m, "train", "accuracy")), _pct(_get(m, "test", "accuracy")),
                     _fmt(_get(m, "test", "log_loss")), _fmt(_get(m, "test", "brier")), *refs])
    return Section(
        "Accuracy",
        "accuracy thresholds the posterior-mean probability at 0.5, pooled over all groups' rows; log loss and Brier "
        "score (lower is better) use the same mean probability. Train accuracy is on the rows each model was fit "
        "to, test accuracy on held-out rows of the same groups. The last columns are the numbers printed by the "
        "seed notebooks.",
        [_reference_note(data), Table(header, rows),
         Figure("accuracy.png", "Train and test accuracy of this run (filled) and the reference runs (hollow).")],
    )


def _scores_section(metrics: dict[str, dict]) -> Section:
    """The gaussian counterpart of the accuracy section (no reference numbers exist for regression)."""
    header = ["Model", "Train RMSE", "Test RMSE", "Test lpd", "Test 94% coverage", "Train 94% coverage"]
    rows = [[LABELS[v], _fmt(_get(metrics[v], "train", "rmse"), ".4g"), _fmt(_get(metrics[v], "test", "rmse"), ".4g"),
             _fmt(_get(metrics[v], "test", "lpd")), _pct(_get(metrics[v], "test", "coverage_94")),
             _pct(_get(metrics[v], "train", "coverage_94"))] for v in MODELS]
    return Section(
        "Scores",
        "RMSE (lower is better) of the posterior-mean prediction in the label's units, pooled over all groups' rows; "
        "lpd is the mean log predictive density of the test rows (higher is better; it rewards honest "
        "uncertainty); coverage is the percentage of rows inside their central 94% posterior predictive interval "
        "(noise included), which should be close to 94.",
        [Table(header, rows)],
    )


def _per_group_rmse_section(n_groups: int) -> Section:
    return Section(
        "Per-group test RMSE",
        "one group of bars per task; partial pooling helps most where a group's own data are few, so look for "
        "groups where the flat bar is highest. The numbers are in metrics/*.json (per_group.<g>.test.rmse).",
        [Figure("per_group_rmse.png", f"Test RMSE of every group ({n_groups}) for the three models.")],
    )


def _no_surface_section(tasks: Tasks) -> Section:
    return Section("Decision surfaces", "surfaces need two features.",
                   [Para(f"This run has a single feature ({tasks.features[0]}), so no surfaces are drawn.")])


def _per_group_section(n_groups: int) -> Section:
    return Section(
        "Per-group test accuracy",
        "one group of bars per task (the axis starts at 0.5, chance level, or lower if needed); partial pooling "
        "helps most where a group's own data are few or ambiguous, "
        "so look for groups where the flat bar is lowest. The numbers are in plots/per_group_accuracy.csv.",
        [Figure("per_group_accuracy.png", f"Test accuracy of every group ({n_groups}) for the three models.")],
    )


def _calibration_section() -> Section:
    return Section(
        "Calibration on the test rows",
        "each point is one bin of predicted probability (10 equal-width bins over all groups' test rows): "
        "x is the mean predicted P(y=1) in the bin, y the fraction of rows that are 1. Points on the diagonal "
        "mean the stated uncertainty is honest; below it, over-confident in class 1. The bin values are in "
        "plots/calibration.csv (x = bin centre there).",
        [Figure("calibration.png", "Reliability diagram of the posterior-predictive mean probabilities.")],
    )


def _loss_section(losses: dict[str, tuple[np.ndarray, np.ndarray]]) -> Section:
    fitted = ", ".join(LABELS[v] for v in losses)
    return Section(
        "ADVI loss",
        f"{fitted} fitted with ADVI (sampler.backend: advi). The loss is the negative ELBO, averaged over blocks "
        "of iterations; for the per-group models it is summed over groups (the ELBO of independent fits adds "
        "up). A curve still falling at the end means more iterations (sampler.advi.iterations) would help. "
        "The values are in plots/advi_loss.csv.",
        [Figure("advi_loss.png", "ADVI loss per iteration block.")],
    )


def _page_blocks(surface_files: dict[str, list[str]], used: dict[str, int], stem: str, what: str) -> list:
    """A heading per model followed by its ``<stem>_*`` figure pages."""
    out = []
    for v in MODELS:
        names = [n for n in surface_files[v] if n.startswith(f"{stem}_")]
        out.append(Heading(LABELS[v]))
        out += [Figure(n, f"{LABELS[v]}: {what}, page {i}/{len(names)} ({used[v]} draws).")
                for i, n in enumerate(names, start=1)]
    return out


def _regression_surface_sections(surface_files: dict[str, list[str]], rp: ReportParams, used: dict[str, int],
                                 tasks: Tasks) -> list[Section]:
    held = (f" Features {', '.join(tasks.features[2:])} are held at their training mean."
            if tasks.n_features > 2 else "")
    grid = f"a {rp.grid_size} x {rp.grid_size} grid over [-{rp.grid_limit:g}, {rp.grid_limit:g}]^2"
    out = []
    for stem, title, what, how in (
        ("surface", "Prediction surfaces", "posterior mean prediction",
         f"each panel is one group: colour is the posterior mean of the predicted label on {grid} of the first two "
         "(standardised) features, markers the group's training rows coloured on the same scale."),
        ("uncertainty", "Uncertainty of the mean prediction", "posterior sd of the mean prediction",
         "posterior standard deviation of the predicted mean (without the noise sd) on the same grid: bright "
         "regions are where the posterior draws disagree."),
    ):
        out.append(Section(title, how + held, _page_blocks(surface_files, used, stem, what)))
    return out


def _surface_sections(surface_files: dict[str, list[str]], rp: ReportParams, used: dict[str, int],
                      tasks: Tasks | None = None) -> list[Section]:
    grid = f"a {rp.grid_size} x {rp.grid_size} grid over [-{rp.grid_limit:g}, {rp.grid_limit:g}]^2"
    if tasks is not None and tasks.n_features > 2:
        grid += (f" of the first two (standardised) features, with {', '.join(tasks.features[2:])} held at their "
                 "training mean")
    return [
        Section(
            "Decision surfaces",
            f"each panel is one group: colour is the posterior-mean probability of class 1 on {grid}, the black "
            "line the 0.5 boundary, markers the group's training rows (white circles class 0, black triangles "
            "class 1). A good surface separates the two moons with a smooth boundary; the hierarchical and "
            "informed models should give groups with awkward data boundaries shaped like their neighbours'.",
            _page_blocks(surface_files, used, "surface", "posterior mean P(y=1)"),
        ),
        Section(
            "Predictive uncertainty",
            "posterior standard deviation of the class-1 probability on the same grid (shared scale 0 to 0.5): bright "
            "regions are where the posterior draws disagree. Expect high uncertainty along the boundary and away "
            "from the data, less of it where pooling constrains a group.",
            _page_blocks(surface_files, used, "uncertainty", "posterior sd of P(y=1)"),
        ),
    ]


def _group_sd_section(sd_vars: Sequence[str], specs, prior_metrics: dict) -> Section:
    rows = []
    for s, var in zip(specs, sd_vars, strict=True):
        g = _get(prior_metrics, "layers", s.name, "group_sd") or {}
        rows.append([var, _fmt(g.get("mean")), _fmt(g.get("sd")), _fmt(g.get("q05")), _fmt(g.get("q95"))])
    return Section(
        "Posterior of the group standard deviations",
        f"{', '.join(sd_vars)}: how far the groups' weights of each layer spread around the shared mean. "
        "Near 0: groups share that layer; large: groups differ. The chains' curves should overlap; if they do not, "
        "the chains disagree and R-hat below will be high.",
        [Figure("group_sd.png", "Hierarchical model: posterior density of each layer's group sd, one line per chain."),
         Para("Summary used by the informed prior (metrics/prior.json, pooled over the chains it used):"),
         Table(["Variable", "Mean", "SD", "5%", "95%"], rows)],
    )


def _correlation_section(layer: str, name: str, ref_chain: int, prior_metrics: dict) -> Section:
    align = _get(prior_metrics, "alignment") or {}
    moved = [c for c, a in align.items() if _get(a, "relabelled")]
    note = (f"derive_prior relabelled hidden units of {', '.join(moved)} to match the reference chain."
            if moved else "derive_prior did not need to relabel any chain.")
    return Section(
        f"Correlation of the first-layer weights (w_{layer})",
        "each cell is the correlation of two weights feature->hidden unit. Left: the informed prior's covariance "
        "(fitted to aligned new-group draws of the hierarchical posterior). Right: the posterior draws of the "
        f"hierarchical group mean mu_{layer}, chain {ref_chain} only, because different chains may label the hidden "
        "units differently (permutations and sign flips leave the network unchanged). Strong off-diagonal cells are "
        "structure the informed prior passes on to new groups.",
        [Figure(name, f"Correlations of w_{layer}: informed prior vs hierarchical mu_{layer} (chain {ref_chain})."),
         Para(note)],
    )


def _diagnostics_section(metrics: dict[str, dict], names: Sequence[str]) -> Section:
    header = ["Model", "Sampling s", "Compile s", "Divergences", "Max R-hat (fn)", "Min bulk ESS (fn)",
              "Max R-hat (all)", "Min bulk ESS (all)"]
    rows, flagged = [], []
    for v in MODELS:
        s = _get(metrics[v], "sampling") or {}
        rows.append([LABELS[v], _fmt(s.get("seconds"), ".1f"), _fmt(s.get("compile_seconds"), ".1f"),
                     _fmt(s.get("divergences"), "d"), _fmt(s.get("max_rhat_fn")), _fmt(s.get("min_ess_bulk_fn"), ".0f"),
                     _fmt(s.get("max_rhat")), _fmt(s.get("min_ess_bulk"), ".0f")])
        rhat = [_get(metrics[v], "per_group", g, "rhat_fn") for g in names]
        flagged.append(f"{LABELS[v]} {sum(r is not None and r > RHAT_OK for r in rhat)}/{len(names)}")
    sd_rows = [[var, _fmt(d.get("rhat")), _fmt(d.get("ess_bulk"), ".0f"), _fmt(d.get("ess_tail"), ".0f")]
               for var, d in sorted((_get(metrics["hierarchical"], "sampling", "group_sd") or {}).items())]
    return Section(
        "Sampler diagnostics",
        "R-hat (want < 1.01) and effective sample size (ESS, want hundreds) are computed in function space, on "
        "the predicted test probabilities of each group, because weight space has exact symmetries (hidden-unit "
        "permutations and sign flips) that make weight-space R-hat meaningless. 'all' adds the hierarchical "
        "group sds, which are scalars free of those symmetries. Divergences should be 0.",
        [Table(header, rows),
         Para(f"Groups with function-space R-hat above {RHAT_OK}: {', '.join(flagged)}."),
         Heading("Hierarchical group sds"),
         Table(["Variable", "R-hat", "Bulk ESS", "Tail ESS"], sd_rows),
         Figure("rhat_fn.png", f"Per-group function-space R-hat; dashed line at {RHAT_OK}.")],
    )


# ----------------------------------------------------------------------------- outputs
def summary(metrics: dict[str, dict], n_groups: int) -> dict:
    """``metrics/summary.json``: headline numbers per model and their differences (dicts only).

    Gaussian runs (metrics with ``rmse`` instead of ``accuracy``) report RMSE,
    lpd and coverage instead of the classification scores.
    """
    gaussian = _get(metrics[MODELS[0]], "train", "rmse") is not None
    score = "rmse" if gaussian else "accuracy"
    extra = (("lpd", "coverage_94") if gaussian else ("log_loss", "brier"))
    fields = [(f"train_{score}", "train", score), (f"test_{score}", "test", score),
              *((f"test_{k}", "test", k) for k in extra), ("divergences", "sampling", "divergences")]
    models = {v: {name: _get(metrics[v], *path) for name, *path in fields} for v in MODELS}
    test = {v: models[v][f"test_{score}"] for v in MODELS}
    comparison = {
        f"hier_minus_flat_test_{score}": _diff(test["hierarchical"], test["flat"]),
        f"informed_minus_flat_test_{score}": _diff(test["informed"], test["flat"]),
        f"hier_minus_informed_test_{score}": _diff(test["hierarchical"], test["informed"]),
    }
    return as_builtin({"models": models, "comparison": comparison, "n_groups": n_groups})


def per_group_csv(per_group: dict[str, np.ndarray], names: Sequence[str]) -> str:
    """``group,flat,hierarchical,informed`` rows of test accuracy (empty where a group has no test rows)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["group", *MODELS])
    for g, name in enumerate(names):
        vals = [per_group[v][g] for v in MODELS]
        writer.writerow([name, *("" if not np.isfinite(x) else as_builtin(float(x)) for x in vals)])
    return buf.getvalue()


def advi_loss(idata, points: int = LOSS_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """``(iteration, loss)`` of an ADVI trace, summed over groups, averaged over blocks.

    Iterations are cut into at most ``points`` equal blocks; each point is the
    block's mean loss, placed at the block's last iteration.
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
    """``iteration,<model>...`` rows of the ADVI loss (header only when no model used ADVI)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["iteration", *MODELS])
    table: dict[int, dict[str, float]] = {}
    for v, (it, loss) in losses.items():
        for i, x in zip(it, loss, strict=True):
            table.setdefault(int(i), {})[v] = as_builtin(float(x))
    for i in sorted(table):
        writer.writerow([i, *(table[i].get(v, "") for v in MODELS)])
    return buf.getvalue()


def calibration_csv(tables: dict[str, dict[str, np.ndarray]]) -> str:
    """``bin,<model>...`` rows: observed fraction of ``y = 1`` per probability bin (empty where no rows)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    models = list(tables)
    writer.writerow(["bin", *(models or MODELS)])
    if not tables:  # gaussian runs: no class probabilities to calibrate
        return buf.getvalue()
    mids = next(iter(tables.values()))["bin_mid"]
    for b, mid in enumerate(mids):
        cells = [tables[m]["observed"][b] for m in models]
        writer.writerow([as_builtin(float(mid)), *("" if not np.isfinite(x) else as_builtin(float(x)) for x in cells)])
    return buf.getvalue()


def write_figures(figures: dict[str, bytes], fig_dir: Path, outputs: Outputs) -> None:
    """Stage ``figures`` into ``fig_dir``, and the removal of PNGs a previous run left that are not rewritten."""
    if fig_dir.is_dir():
        for stale in fig_dir.glob("*.png"):
            if stale.name not in figures:
                outputs.remove(stale)
    for name, data in figures.items():
        outputs.write_bytes(data, fig_dir / name)


# ----------------------------------------------------------------------------- stage body
def report(
    params: Params,
    tasks_path: Path,
    flat_trace: Path,
    hier_trace: Path,
    informed_trace: Path,
    prior_path: Path,
    metrics_dir: Path,
    timings_dir: Path,
    out_dir: Path,
) -> dict:
    """Build the report from the fitted traces, the informed prior and the metrics files.

    Writes ``out_dir/figures/*.png``, ``out_dir/report.md``, ``out_dir/report.html``
    (self-contained), ``out_dir/plots/{per_group_accuracy,calibration}.csv`` and
    ``out_dir/plots/advi_loss.csv`` and ``metrics_dir/summary.json``; returns the
    summary dict. Wall-clock times come from ``timings_dir``. All inputs are
    checked before anything is computed and nothing is written until every
    figure has been drawn. For gaussian tasks accuracy and class calibration do
    not exist: the two CSV files then hold only their header row and the report
    shows RMSE, lpd and coverage instead.
    """
    rp = params.report
    tasks = load_tasks(tasks_path)
    gaussian = tasks.likelihood == "gaussian"
    names = tasks.group_names
    metrics = {v: read_json(metrics_dir / f, "metrics file") for v, f in METRICS_FILES.items()}
    prior_metrics = read_json(metrics_dir / "prior.json", "metrics file")
    _check_metrics(metrics, metrics_dir, names)
    for v, f in METRICS_FILES.items():  # wall-clock times, for the diagnostics table only
        timing = read_json(timings_dir / f, "timing file")
        metrics[v].setdefault("sampling", {}).update(_get(timing, "sampling") or {})
    paths = {"flat": flat_trace, "hierarchical": hier_trace, "informed": informed_trace}
    traces = _open_traces(paths)
    try:
        specs = _specs(traces, paths, params, tasks)
        prior = load_prior(prior_path, specs)
        _check_traces(traces, paths, specs, names)
        settings = {v: settings_from_attrs(traces[v].posterior.attrs) for v in MODELS}
        figures, surface_files, used_draws, hier_extra, calibration = _trace_figures(traces, specs, tasks, rp)
        losses = {v: advi_loss(traces[v]) for v in MODELS
                  if "sample_stats" in traces[v].groups() and "loss" in traces[v].sample_stats}
    finally:
        for idata in traces.values():
            _close(idata)
    first = specs[0]
    sd_vars = [f"sd_{s.name}" for s in specs]
    ref_chain = params.prior.reference_chain if params.prior.reference_chain < hier_extra.sizes["chain"] else 0
    corr_name = f"correlation_{first.name}.png"
    figures[corr_name] = _correlation_figure(hier_extra, prior, first, tasks.features, ref_chain)
    sd_draws = {var: hier_extra[var].transpose("chain", "draw").values for var in sd_vars}
    figures["group_sd.png"] = plots.png_bytes(plots.plot_group_sd(sd_draws)[0])
    if losses:
        figures["advi_loss.png"] = plots.png_bytes(plots.plot_loss(losses)[0])
    data = _data_settings(tasks, params)
    if gaussian:
        accuracy = {v: np.zeros(0) for v in MODELS}
        figures.update(_regression_figures(metrics, names))
        sections = [_scores_section(metrics), _per_group_rmse_section(len(names))]
    else:
        accuracy = _per_group_values(metrics, names, "test", "accuracy")
        figures.update(_metrics_figures(metrics, names, accuracy))
        figures["calibration.png"] = plots.png_bytes(plots.plot_reliability(calibration)[0])
        sections = [_accuracy_section(metrics, data), _per_group_section(len(names)), _calibration_section()]
    if tasks.n_features < 2:
        sections.append(_no_surface_section(tasks))
    elif gaussian:
        sections += _regression_surface_sections(surface_files, rp, used_draws, tasks)
    else:
        sections += _surface_sections(surface_files, rp, used_draws, tasks)

    title = "Hierarchical Bayesian neural networks: report"
    intro = _intro(tasks, specs, settings, used_draws)
    if losses:
        sections.append(_loss_section(losses))
    sections += [
        _group_sd_section(sd_vars, specs, prior_metrics),
        _correlation_section(first.name, corr_name, ref_chain, prior_metrics),
        _diagnostics_section(metrics, names),
    ]
    result = summary(metrics, len(names))

    with staged_outputs() as outputs:
        write_figures(figures, out_dir / "figures", outputs)
        outputs.write_text(render_markdown(title, intro, sections), out_dir / "report.md")
        outputs.write_text(render_html(title, intro, sections, figures), out_dir / "report.html")
        outputs.write_text(per_group_csv(accuracy, [] if gaussian else names),
                           out_dir / "plots" / "per_group_accuracy.csv")
        outputs.write_text(calibration_csv(calibration), out_dir / "plots" / "calibration.csv")
        outputs.write_text(loss_csv(losses), out_dir / "plots" / "advi_loss.csv")
        outputs.write_json(result, metrics_dir / "summary.json")
    log.info("report: %d figures, %d groups -> %s", len(figures), len(names), out_dir)
    return result
