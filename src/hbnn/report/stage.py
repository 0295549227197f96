"""Stage ``report``: read everything, draw the figures, write the report and summary together."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from hbnn.config import Params
from hbnn.diagnostics import evaluation
from hbnn.files.io import close_trace, settings_from_attrs
from hbnn.files.outputs import staged_outputs
from hbnn.fitting.prior import load_checked
from hbnn.model import likelihoods
from hbnn.model.network import has_bias
from hbnn.pipeline import budget
from hbnn.pipeline.stages import load_run_tasks
from hbnn.pipeline.stages.baselines import LABELS as BASELINE_LABELS
from hbnn.pipeline.variants import BY_NAME
from hbnn.report import metric_plots, plots
from hbnn.report.document import render_html, render_markdown
from hbnn.report.figures import all_model_outputs
from hbnn.report.inputs import (
    check_traces,
    data_settings,
    group_level_vars,
    load_vars,
    open_traces,
    read_metrics,
    trace_network,
)
from hbnn.report.metric_figures import (
    _correlation_figure,
    _diagnostic_figures,
    _metrics_figures,
    _per_group_values,
    _regression_figures,
    compare_figure,
    group_sd_diagnostic_figures,
    transfer_figure,
)
from hbnn.report.numbers import LABELS, MODELS, lookup
from hbnn.report.outputs import advi_loss, calibration_csv, loss_csv, per_group_csv, summary, write_figures
from hbnn.report.sections import (
    _accuracy_section,
    _calibration_section,
    _comparison_section,
    _correlation_section,
    _group_sd_section,
    _intro,
    _loss_section,
    _no_surface_section,
    _per_group_rmse_section,
    _per_group_section,
    _regression_surface_sections,
    _scores_section,
    _settings_section,
    _surface_sections,
    model_settings,
    on_moons,
)
from hbnn.report.seeds_study import SEEDS_FILE, read_study, seeds_blocks
from hbnn.report.selection import choose_surface_groups
from hbnn.report.status import _diagnostics_section, _status_section
from hbnn.report.transfer_section import _transfer_section
from hbnn.report.winner import baseline_rows, read_baselines, winner_line

log = logging.getLogger(__name__)


def report(
    params: Params,
    tasks_path: Path,
    flat_trace: Path,
    hier_trace: Path,
    informed_trace: Path,
    prior_path: Path,
    metrics_dir: Path,
    out_dir: Path,
    seeds_path: Path = SEEDS_FILE,
) -> dict:
    """Build the report from the fitted traces, the informed prior and the metrics files.

    Writes ``out_dir/figures/*.png``, ``out_dir/report.md``, ``out_dir/report.html``
    (self-contained), ``out_dir/plots/{per_group_accuracy,calibration,advi_loss}.csv``,
    ``out_dir/plots/{compare,group_sd}.png`` (``dvc plots`` data, in git) and
    ``metrics_dir/summary.json``; returns the
    summary dict. No wall-clock time goes into it (the fit stages' ``timings/*.json`` are outside DVC and git), so
    the same fits give the same bytes and ``dvc.lock``. All inputs are
    checked before anything is computed and nothing is written until every
    figure has been drawn. For likelihoods that are not classifiers accuracy and
    class calibration do not exist: the two CSV files then hold their header and one
    row without values, and the report shows the likelihood's scores (RMSE, lpd and coverage).

    Parameters
    ----------
    params : hbnn.config.Params
        The run's params.
    tasks_path : pathlib.Path
        The tasks file.
    flat_trace, hier_trace, informed_trace : pathlib.Path
        The three models' traces.
    prior_path : pathlib.Path
        The informed prior.
    metrics_dir : pathlib.Path
        The metrics folder.
    out_dir : pathlib.Path
        The report's folder.
    seeds_path : pathlib.Path, optional
        The transfer experiment over data seeds (``benchmarks/transfer_seeds.py``); shown where it measured these
        params, one line where it is absent or measured others.

    Returns
    -------
    dict
        ``metrics/summary.json``'s content (:func:`hbnn.report.outputs.summary`).

    Raises
    ------
    hbnn.errors.InputError
        Where an input is missing, malformed, stale or disagrees with another (before anything is computed).
    """
    rp = params.report
    study = read_study(seeds_path)
    tasks = load_run_tasks(tasks_path, params)
    lik = likelihoods.get(tasks.likelihood)
    names = tasks.group_names
    metrics, prior_metrics, transfer_metrics = read_metrics(metrics_dir, names, lik.score)
    seeds = seeds_blocks(study, params, seeds_path, lookup(prior_metrics, "layers"))
    baselines = read_baselines(metrics_dir, params)
    chosen = choose_surface_groups(metrics, names, rp.surface_groups, params.seed, lik.classifier)
    paths = {"flat": flat_trace, "hierarchical": hier_trace, "informed": informed_trace}
    traces = open_traces(paths, params)
    try:
        specs, activation = trace_network(traces, paths, params, tasks)
        prior = load_checked(prior_path, specs, params)
        check_traces(traces, paths, specs, names)
        settings = {v: settings_from_attrs(traces[v].posterior.attrs) for v in MODELS}
        drawn = {v: int(traces[v].posterior.sizes["draw"]) for v in MODELS}
        budget.enforce(budget.report_estimate(params, len(names), tasks.n_features, max(
            int(traces[v].posterior.sizes["chain"]) * drawn[v] for v in MODELS), tasks.split("train").y.size), params)
        losses = {v: advi_loss(traces[v]) for v in MODELS
                  if "sample_stats" in traces[v].groups() and "loss" in traces[v].sample_stats}
        grouped = next(v for v in MODELS if BY_NAME[v].has_group_distribution)
        hier_extra = load_vars(traces[grouped], group_level_vars(specs))
        hier_stats = None
        if "sample_stats" in traces[grouped].groups():
            stats = traces[grouped].sample_stats
            hier_stats = stats[[n for n in ("energy", "diverging") if n in stats]].compute()
    finally:  # closed before the workers fork; each opens its own model's trace
        for idata in traces.values():
            close_trace(idata)
    first = specs[0]
    sd_vars = [f"sd_{s.name}" for s in specs]
    ref_chain = params.prior.reference_chain if params.prior.reference_chain < hier_extra.sizes["chain"] else 0
    corr_name = f"correlation_{first.name}.png"
    # The models' surfaces, reliability and PSIS-LOO in worker processes; the rest here, beside them. ArviZ is
    # imported only once they have forked (its import takes seconds of a core, and the workers, reading with xarray,
    # do not need it). Said first: the next line comes only once the first surface page is done.
    work = [f"surfaces ({len(chosen.groups)} of {len(names)} groups, up to {rp.surface_draws} draws on a "
            f"{rp.grid_size} x {rp.grid_size} grid)"] if tasks.n_features >= 2 else []
    work += (["reliability"] if lik.classifier else []) + (["PSIS-LOO"] if params.trace.pointwise else [])
    log.info("report: computing %s, beside the group-sd figures",
             f"each model's {', '.join(work)}" if work else "the figures")
    with all_model_outputs(paths, specs, activation, tasks, rp, params, chosen.groups) as wait_for_models:
        import arviz as az

        later = {corr_name: _correlation_figure(hier_extra, prior, first, tasks.features, ref_chain)}
        sd_draws = {var: hier_extra[var].transpose("chain", "draw").values for var in sd_vars}
        later["group_sd.png"] = plots.png_bytes(metric_plots.plot_group_sd(sd_draws)[0])
        later.update(group_sd_diagnostic_figures(hier_extra[sd_vars], hier_stats))
        later.update(_diagnostic_figures(metrics, names))
        # The figures drawn from the metrics files alone, here too: the last model's worker is still running
        # (placed in the report's order below)
        data = data_settings(tasks, params)
        transfer_png = (transfer_figure(transfer_metrics, lik.score)
                        if transfer_metrics is not None and transfer_metrics["sizes"] else None)
        loss_png = plots.png_bytes(metric_plots.plot_loss(losses)[0]) if losses else None
        if not lik.classifier:
            accuracy = {v: np.zeros(0) for v in MODELS}
            scored = _regression_figures(metrics, names)
        else:
            accuracy = _per_group_values(metrics, names, "test", "accuracy")
            scored = _metrics_figures(metrics, names, accuracy, on_moons(data))
        base_rows, dispersion = ({}, None) if baselines is None else baseline_rows(tasks, params, baselines,
                                                                                 metrics_dir)
        models = wait_for_models()
    figures = {name: png for v in MODELS for name, png in models[v].pages.items()}
    figures.update(later)
    surface_files = {v: sorted(models[v].pages) for v in MODELS}
    used_draws = {v: models[v].used_draws for v in MODELS}
    calibration = {v: models[v].calibration for v in MODELS if models[v].calibration is not None}
    loo = {v: models[v].loo for v in MODELS if models[v].loo is not None}
    bfmi = ([float(b) for b in az.bfmi(hier_stats)] if hier_stats is not None and "energy" in hier_stats
            else None)
    table = None
    if len(loo) == len(MODELS):
        table = az.compare({LABELS[v]: loo[v].to_arviz() for v in MODELS})
        figures["compare.png"] = compare_figure(table)
    bad_k = {LABELS[v]: (int(evaluation.high_k(loo[v]).sum()), int(np.size(loo[v].pareto_k)),
                         evaluation.bad_k_threshold(loo[v].n_samples)) for v in loo}
    if transfer_png is not None:
        figures["transfer.png"] = transfer_png
    if loss_png is not None:
        figures["advi_loss.png"] = loss_png
    status = _status_section(metrics, names, sd_vars, transfer_metrics, settings, drawn, sd_draws)
    figures.update(scored)
    if not lik.classifier:
        sections = [status, _scores_section(metrics, baselines),
                    _per_group_rmse_section(len(names), _per_group_values(metrics, names, "test", "rmse"), names)]
    else:
        figures["calibration.png"] = plots.png_bytes(metric_plots.plot_reliability(calibration)[0])
        sections = [status, _accuracy_section(metrics, data, model_settings(settings), baselines),
                    _per_group_section(len(names), accuracy, names),
                    _calibration_section()]
    if tasks.n_features < 2:
        sections.append(_no_surface_section(tasks))
    elif not lik.classifier:
        sections += _regression_surface_sections(surface_files, rp, used_draws, tasks, chosen, names)
    else:
        sections += _surface_sections(surface_files, rp, used_draws, tasks, moons=on_moons(data), chosen=chosen,
                                      names=names)

    title = "Hierarchical Bayesian neural networks: report"
    rows = {LABELS[v]: models[v].row_lpd for v in MODELS} | {BASELINE_LABELS[m]: r for m, r in base_rows.items()}
    intro = [winner_line(lik, rows, [] if baselines is not None else ["the baselines (no metrics/baselines.json)"],
                         [BASELINE_LABELS[m] for m in base_rows], dispersion),
             *_intro(tasks, specs, settings, lookup(prior_metrics, "method") or "mvnormal")]
    if losses:
        sections.append(_loss_section(losses))
    sections += [
        _group_sd_section(sd_vars, specs, prior_metrics),
        _correlation_section(first.name, corr_name, ref_chain, prior_metrics, hidden=len(specs) > 1,
                             bias=has_bias(specs)),
        _comparison_section(table, bad_k, "Accuracy" if lik.classifier else "Scores"),
        _transfer_section(transfer_metrics, lik, seeds),
        _settings_section(settings, used_draws, drawn),
        _diagnostics_section(metrics, names, sd_vars, list(figures), bfmi, lik, hidden=len(specs) > 1),
    ]
    result = summary(metrics, len(names), lik, loo)

    with staged_outputs() as outputs:
        write_figures(figures, out_dir / "figures", outputs)
        outputs.write_text(render_markdown(title, intro, sections), out_dir / "report.md")
        outputs.write_text(render_html(title, intro, sections, figures), out_dir / "report.html")
        outputs.write_text(per_group_csv(accuracy, names if lik.classifier else []),
                           out_dir / "plots" / "per_group_accuracy.csv")
        outputs.write_text(calibration_csv(calibration), out_dir / "plots" / "calibration.csv")
        outputs.write_text(loss_csv(losses), out_dir / "plots" / "advi_loss.csv")
        # `dvc plots` images, kept in git: the LOO comparison (or why there is none) and the group sds
        no_loo = "No LOO comparison: the traces hold no log_likelihood group (trace.pointwise: false)."
        # (at most 1000 px wide: DVC's page shows them at their pixel size)
        compare = figures.get("compare.png") or plots.png_bytes(plots.plot_message(no_loo)[0])
        outputs.write_bytes(plots.shrink_png(compare, 1000), out_dir / "plots" / "compare.png")
        outputs.write_bytes(plots.shrink_png(figures["group_sd.png"], 1000), out_dir / "plots" / "group_sd.png")
        outputs.write_json(result, metrics_dir / "summary.json")
    log.info("report: %d figures, %d groups -> %s", len(figures), len(names), out_dir)
    return result

