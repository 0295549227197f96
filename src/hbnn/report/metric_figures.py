"""The report's figures drawn from the metrics files and the hierarchical fit's group-level draws: accuracy and
per-group scores, convergence diagnostics, the weight correlations, the model comparison and the transfer curve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib
import numpy as np
import xarray as xr

from hbnn.model.network import LayerSpec
from hbnn.pipeline.transfer import in_size_order
from hbnn.report import metric_plots, plots
from hbnn.report.numbers import (
    ESS_OK,
    LABELS,
    MODELS,
    REFERENCES,
    RHAT_OK,
    correlation_from_cov,
    correlation_of_draws,
    lookup,
    weight_labels,
)


def _correlation_figure(hier_extra: xr.Dataset, prior: dict, spec: LayerSpec, features: Sequence[str],
                        ref_chain: int) -> bytes:
    """Heatmaps: correlations of the informed prior's ``cov_<layer>`` and of ``mu_<layer>`` draws of one chain."""
    mu = hier_extra[f"mu_{spec.name}"].transpose("chain", "draw", *spec.dims).values[ref_chain]
    corr = {
        f"informed prior: corr from cov_{spec.name}": correlation_from_cov(prior[spec.name][1]),
        f"hierarchical mu_{spec.name} draws (chain {ref_chain})": correlation_of_draws(mu.reshape(mu.shape[0], -1)),
    }
    return plots.png_bytes(metric_plots.plot_correlations(corr, weight_labels(spec, features))[0])


def _per_group_values(metrics: dict[str, dict], names: Sequence[str], *keys: str) -> dict[str, np.ndarray]:
    """``{model: (group,)}`` of ``per_group.<g>.<keys>`` (NaN where missing)."""
    return {v: np.array([lookup(metrics[v], "per_group", g, *keys) for g in names], dtype=float) for v in MODELS}


def _regression_figures(metrics: dict[str, dict], names: Sequence[str]) -> dict:
    """Per-group test RMSE of a run scored by RMSE, from the metrics files."""
    rmse = _per_group_values(metrics, names, "test", "rmse")
    return {
        "per_group_rmse.png": plots.png_bytes(metric_plots.plot_per_group(
            names, rmse, kind="bar", ylabel="test RMSE")[0]),
    }


def _diagnostic_figures(metrics: dict[str, dict], names: Sequence[str]) -> dict[str, bytes]:
    """Per-group function-space R-hat and bulk ESS of every model, against the bar."""
    rhat = _per_group_values(metrics, names, "rhat_fn")
    ess = _per_group_values(metrics, names, "ess_bulk_fn")
    return {
        "rhat_fn.png": plots.png_bytes(metric_plots.plot_per_group(
            names, rhat, kind="point", ylabel="function-space R-hat", hlines=(RHAT_OK,))[0]),
        "ess_fn.png": plots.png_bytes(metric_plots.plot_per_group(
            names, ess, kind="point", ylabel="function-space bulk ESS", hlines=(ESS_OK,), log=True)[0]),
    }


def group_sd_diagnostic_figures(sds: xr.Dataset, stats: xr.Dataset | None) -> dict[str, bytes]:
    """ArviZ's rank plots and trace plot (divergent draws marked) of the group sds, and its energy plot (BFMI).

    Parameters
    ----------
    sds : xarray.Dataset
        The ``sd_<layer>`` draws.
    stats : xarray.Dataset or None
        The hierarchical fit's sample stats (``None`` or without ``energy``/``diverging`` for ADVI, which has
        neither: those plots are skipped).

    Returns
    -------
    dict of str to bytes
        ``{file name: png}``.
    """
    import arviz as az  # here, not at the top: the report's workers fork without it (their draws need no ArviZ)

    names = list(sds.data_vars)
    out = {}
    with matplotlib.rc_context({"font.size": plots.SMALL}):
        axes = az.plot_rank(sds, var_names=names, kind="bars", figsize=(min(3.4 * len(names), plots.MAX_WIDTH_IN), 3.4),
                            backend_kwargs={"layout": "constrained"})
        out["rank_group_sd.png"] = plots.png_bytes(plots.readable(np.ravel(axes)[0].figure), tight=True)
        has = set(stats.data_vars) if stats is not None else set()
        if "diverging" in has:
            idata = az.InferenceData(posterior=sds, sample_stats=stats[["diverging"]])
            axes = az.plot_trace(idata, var_names=names, divergences="bottom", compact=False,
                                 figsize=(plots.MAX_WIDTH_IN * 0.85, 2.0 * len(names)),
                                 backend_kwargs={"layout": "constrained"})
            out["trace_group_sd.png"] = plots.png_bytes(plots.readable(np.ravel(axes)[0].figure), tight=True)
        if "energy" in has:
            ax = az.plot_energy(stats, figsize=(6.0, 3.8), textsize=plots.SMALL + 1, bfmi=True)
            first = np.ravel(ax)[0]
            first.set_title("Hierarchical fit: energy")
            first.set_xlabel("energy minus its mean")
            out["energy.png"] = plots.png_bytes(plots.readable(np.ravel(ax)[0].figure), tight=True)
    return out


def compare_figure(table) -> bytes:
    """ArviZ's ``az.plot_compare`` of an ``az.compare`` table.

    Parameters
    ----------
    table : pandas.DataFrame
        ``az.compare``'s table.

    Returns
    -------
    bytes
        A PNG.
    """
    import arviz as az

    with matplotlib.rc_context({"font.size": plots.SMALL}):
        ax = az.plot_compare(table, figsize=(7.0, 1.2 + 0.7 * len(table)), textsize=plots.SMALL + 1,
                             legend=True, title=False, plot_ic_diff=True)
    return plots.png_bytes(plots.readable(np.ravel(ax)[0].figure), tight=True)


def _metrics_figures(metrics: dict[str, dict], names: Sequence[str], accuracy: dict[str, np.ndarray],
                     references: bool = True) -> dict:
    """Accuracy and per-group accuracy figures, from the metrics files; ``references``: the seed notebooks' numbers
    beside this run's (moons, not a table)."""
    # Start the axis at chance (or lower if needed) so differences between models stay visible.
    low = min(0.5, np.floor(np.nanmin([*np.concatenate(list(accuracy.values())), 1.0]) * 10) / 10)
    refs = {r: tuple(np.array([np.nan if vals[v] is None else vals[v][i] / 100 for v in MODELS]) for i in (0, 1))
            for r, vals in REFERENCES.items()} if references else {}
    train = np.array([lookup(metrics[v], "train", "accuracy") for v in MODELS], dtype=float)
    test = np.array([lookup(metrics[v], "test", "accuracy") for v in MODELS], dtype=float)
    return {
        "per_group_accuracy.png": plots.png_bytes(metric_plots.plot_per_group(
            names, accuracy, kind="bar", ylabel="test accuracy", ylim=(low, 1.0))[0]),
        "accuracy.png": plots.png_bytes(metric_plots.plot_accuracy([LABELS[v] for v in MODELS], train, test, refs)[0]),
    }


def transfer_figure(tm: dict, score: str) -> bytes:
    """:func:`hbnn.report.metric_plots.plot_transfer` of ``metrics/detail/transfer.json``.

    Parameters
    ----------
    tm : dict
        The transfer metrics (checked by :func:`hbnn.report.inputs.transfer_shape`).
    score : str
        The headline score's key in each size's test metrics.

    Returns
    -------
    bytes
        A PNG.
    """
    sizes = in_size_order(tm["sizes"])
    nan = {"test": {score: math.nan, "lpd_mean": math.nan}, "lpd_se": math.nan}  # a size the refit did not run at
    models = ("flat", "informed", *(["hier_refit"] if any("hier_refit" in r for r in sizes.values()) else []))
    series = {m: {"score": [r.get(m, nan)["test"][score] for r in sizes.values()],
                  "log_loss": [-r.get(m, nan)["test"]["lpd_mean"] for r in sizes.values()],
                  "lpd_se": [r.get(m, nan)["lpd_se"] for r in sizes.values()]} for m in models}
    pop = tm["population"]
    population = {"score": pop["test"][score], "log_loss": -pop["test"]["lpd_mean"]}
    differences = {"informed - flat": [r["difference"] for r in sizes.values()]}
    if "hier_refit" in models:
        differences["informed - hierarchical refit"] = [r.get("informed_vs_refit", {"mean": math.nan, "se": math.nan})
                                                        for r in sizes.values()]
    fig, _ = metric_plots.plot_transfer([r["rows_mean"] for r in sizes.values()], list(sizes), score, series,
                                        population, differences, [r["groups"] for r in sizes.values()])
    return plots.png_bytes(fig)
