"""Stages ``transfer_prior`` and ``transfer``: the informed prior, measured on groups the hierarchy never saw.

See :mod:`hbnn.pipeline.transfer` for the design. ``transfer_prior`` writes the
hierarchical fit of the training groups, the prior derived from it (with the
held-out groups in its settings attr, ``hbnn_settings``) and their metrics;
``transfer`` refits the held-out groups and writes ``metrics/transfer.json``
(headline: scores per model and size), its detail file, the ``dvc plots`` CSV
and the two refit traces.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from hbnn.config import Params
from hbnn.data.tasks import Tasks
from hbnn.diagnostics import evaluation, predictions
from hbnn.files.io import (
    InputError,
    as_builtin,
    check_made_by,
    check_made_with,
    load_dataset,
    load_posterior,
    made_by,
    provenance,
    settings_from_attrs,
)
from hbnn.files.outputs import detail_path, staged_outputs
from hbnn.fitting import common as fitting
from hbnn.fitting import per_group
from hbnn.fitting.models import flat_model, informed_model, sample_hierarchical
from hbnn.fitting.prior import derive, load_checked, recorded
from hbnn.logs import watch
from hbnn.model import likelihoods
from hbnn.model.prior import prior_dataset
from hbnn.model.spec import ModelSpec
from hbnn.pipeline import budget, transfer
from hbnn.pipeline.predict import population_extra, population_weights
from hbnn.pipeline.stages import load_run_tasks
from hbnn.pipeline.stages.transfer_refit import check_refit_metrics, refit_labels, refit_line, refit_sampling
from hbnn.pipeline.variants import FLAT, INFORMED, STAGE_KEYS, STAGE_PARAMS, derive_seed

log = logging.getLogger(__name__)

MODELS = (FLAT.name, INFORMED.name)
REFIT = "hier_refit"  # the hierarchical refit's key in the transfer metrics and its model in the plots' CSV
HELDOUT_ATTR = "heldout_groups"


def transfer_prior(params: Params, tasks_path: Path, trace_out: Path, prior_out: Path, metrics_out: Path,
                   timing_out: Path) -> dict:
    """Stage body: hold out groups, fit the hierarchical model on the rest and derive the informed prior from that fit.

    Parameters
    ----------
    params : hbnn.config.Params
        The run's settings (``transfer``, ``hier_sampler``, ``prior``, the model).
    tasks_path : pathlib.Path
        The tasks file.
    trace_out : pathlib.Path
        Where the hierarchical fit's trace goes.
    prior_out : pathlib.Path
        Where the informed prior goes.
    metrics_out : pathlib.Path
        A detail file (not a DVC metric): the held-out and training groups, the fit's metrics and the prior's.
    timing_out : pathlib.Path
        Where the fit's timing goes.

    Returns
    -------
    dict
        What ``metrics_out`` holds.

    Raises
    ------
    hbnn.errors.InputError
        If the tasks file is bad, no held-out group has more training rows than a size, or an estimate exceeds
        the budget.
    """
    tasks = load_run_tasks(tasks_path, params)
    heldout = transfer.holdout(tasks.group_names, params.transfer)
    kept = [g for g in tasks.group_names if g not in heldout]
    log.info("transfer_prior: holding out %d of %d groups (%s); fitting the hierarchical model on the other %d",
             len(heldout), tasks.n_groups, ", ".join(heldout), len(kept))
    train_tasks = tasks.subset(kept)
    # Refused before the fit rather than by `transfer` after it: no held-out group with more training rows than a
    # size (transfer.sizes, all_rows; check_params did it with the params' data, this checks the tasks as they are)
    train_rows = np.bincount(tasks.split("train").group, minlength=tasks.n_groups)
    transfer.check_refits([int(train_rows[tasks.group_names.index(g)]) for g in heldout], params.transfer)
    s = params.hier_sampler  # the prior is derived after the fit: its cost is refused before it
    budget.enforce(budget.prior_estimate("transfer_prior", params, s.chains * s.draw_limit, len(kept),
                                         tasks.n_features), params)
    spec = fitting.model_spec(params, tasks)
    sampled = sample_hierarchical("transfer_hier", params, spec, train_tasks)
    what = "transfer_prior: scoring the draws, PSIS-LOO and deriving the prior"
    log.info("%s (sampling took %.1fs)", what, sampled.cost.seconds)
    with watch(log, what):
        idata, hier_metrics, timing, _ = fitting.score_fit("transfer_hier", params, spec, train_tasks, sampled,
                                                           {HELDOUT_ATTR: heldout})
        fitted, prior_metrics = derive(params.prior, sampled.posterior, spec.layers, spec.activation,
                                       STAGE_KEYS["transfer_prior"], trace_out, sampled.sample_stats)
        ds = prior_dataset(spec.layers, fitted)
        ds.attrs.update(provenance("transfer_prior", "informed_prior",
                                   params.section_hash(*STAGE_PARAMS["transfer_prior"]),
                                   {"prior": recorded(params.prior),
                                    "hidden_layers": list(spec.hidden_layers), "bias": spec.bias,
                                    "activation": spec.activation,
                                    "features": tasks.features,
                                    "hier_trace": str(trace_out), HELDOUT_ATTR: heldout}))
        metrics = {"heldout_groups": heldout, "training_groups": kept, "hierarchical": hier_metrics,
                   "prior": prior_metrics, "made_by": made_by("transfer_prior", params)}
        with staged_outputs() as outputs:
            outputs.write_netcdf(idata, trace_out)
            outputs.write_netcdf(ds, prior_out)
            outputs.write_json(as_builtin(timing), timing_out)
            outputs.write_json(as_builtin(metrics), metrics_out)
    s = hier_metrics["sampling"]
    log.info("transfer_prior: hierarchical fit of %d groups: %d groups and %d group sds not converged, max R-hat "
             "%.4f, min ESS %.0f, %d divergences, %.1fs sampling", len(kept), s["groups_not_converged"],
             s.get("sds_not_converged", 0), s["max_rhat"], s["min_ess_bulk"], s["divergences"], sampled.cost.seconds)
    return metrics


def heldout_groups(prior_path: Path, tasks: Tasks) -> list[str]:
    """The held-out groups that ``transfer_prior`` recorded in the prior file's settings.

    Parameters
    ----------
    prior_path : pathlib.Path
        The transfer prior file.
    tasks : hbnn.data.tasks.Tasks
        The tasks; each held-out group must be one of theirs.

    Returns
    -------
    list of str
        The held-out group names.

    Raises
    ------
    hbnn.errors.InputError
        If the file is unreadable, was not written by ``transfer_prior``, records no held-out groups, or holds out
        groups the tasks lack.
    """
    attrs = load_dataset(prior_path, "prior file").attrs
    check_made_with(attrs, None, prior_path, "transfer_prior")
    heldout = settings_from_attrs(attrs).get(HELDOUT_ATTR)
    if not isinstance(heldout, list):
        raise InputError(f"prior file {prior_path} records no held-out groups; it was not written by transfer_prior")
    missing = [g for g in heldout if g not in tasks.group_names]
    if missing:
        raise InputError(f"prior file {prior_path} holds out groups {missing} that the tasks file lacks; rerun "
                         "transfer_prior (dvc repro)")
    return heldout


def run_transfer(params: Params, tasks_path: Path, hier_trace: Path, prior_path: Path, prior_metrics: Path,
                 refit_metrics: Path, flat_trace_out: Path, informed_trace_out: Path, metrics_out: Path,
                 plot_out: Path, timing_out: Path) -> dict:
    """Stage body: refit each held-out group on nested subsets of its rows (flat and informed prior) and score them.

    Every refit, and the hierarchical population's prediction, is scored on the group's own test rows; the
    hierarchical refits' scores (``transfer_refit``) join them, paired on the same rows.

    Parameters
    ----------
    params : hbnn.config.Params
        The run's settings.
    tasks_path : pathlib.Path
        The tasks file.
    hier_trace : pathlib.Path
        ``transfer_prior``'s hierarchical trace (for the population's prediction).
    prior_path : pathlib.Path
        ``transfer_prior``'s informed prior.
    prior_metrics : pathlib.Path
        ``transfer_prior``'s metrics (held-out groups, the hierarchical fit's sampling).
    refit_metrics : pathlib.Path
        ``transfer_refit``'s metrics (the hierarchical refits' scores and per-row log densities).
    flat_trace_out, informed_trace_out : pathlib.Path
        Where the two models' traces go.
    metrics_out : pathlib.Path
        The headline metrics file; the detail file goes beside it.
    plot_out : pathlib.Path
        Where :func:`transfer_csv` goes.
    timing_out : pathlib.Path
        Where the fits' timing goes.

    Returns
    -------
    dict
        The detail metrics (:func:`transfer_metrics` plus ``made_by`` and ``model``).

    Raises
    ------
    hbnn.errors.InputError
        If an input is missing, unreadable, made with other settings or not ``transfer_prior``'s, or an estimate
        exceeds the budget.
    """
    tasks = load_run_tasks(tasks_path, params)
    spec = fitting.model_spec(params, tasks)
    heldout = heldout_groups(prior_path, tasks)
    layer_prior = load_checked(prior_path, spec.layers, params, stage="transfer_prior")
    hier_posterior = load_posterior(hier_trace, "hierarchical", params=params, stage="transfer_prior")
    upstream = _upstream(prior_metrics, "transfer_prior", params, heldout, prior_path)
    hier_refit = _upstream(refit_metrics, "transfer_refit", params, heldout, prior_path)
    refit, refits, skipped = transfer.refit_tasks(tasks, heldout, params.transfer)
    test_rows = dict(zip(refit.group_names, np.bincount(refit.split("test").group, minlength=refit.n_groups),
                         strict=True))
    expected = {label: ([r.group for r in refits if r.size == label],
                        int(sum(test_rows[r.name] for r in refits if r.size == label)))
                for label in refit_labels(params.transfer)}
    check_refit_metrics(hier_refit, refit_metrics, {k: v for k, v in expected.items() if v[0]})
    if not any(groups for groups, _ in expected.values()):
        log.info("transfer: no hierarchical refit to compare with (transfer.refit_sizes and transfer.refit_all_rows "
                 "select none)")
    for line in skipped:
        log.info("transfer: skipping %s: a size must be smaller than the group's training rows", line)
    by_size = transfer.groups_by_size(r.name for r in refits)
    log.info("transfer: %d fits per model (%d held-out groups; sizes %s)", len(refits), len(heldout),
             ", ".join(f"{size}: {len(groups)}" for size, groups in by_size.items()))
    if transfer.pools_differ(by_size):
        log.warning("transfer: the sizes are scored on different held-out groups (a group is fitted only at sizes "
                    "below its training rows): compare the models within a size, not one size with another")
    settings = {name: params.sampler_for(f"transfer_{name}") for name in MODELS}
    models = {FLAT.name: flat_model(spec, settings[FLAT.name], f"transfer_{FLAT.name}"),
              INFORMED.name: informed_model(spec, settings[INFORMED.name], layer_prior, f"transfer_{INFORMED.name}")}
    for name in MODELS:
        fitting.enforce_budget(f"transfer_{name}", params, refit)
    traces, fit_metrics, timings, tests = {}, {}, {}, {}
    for name in MODELS:
        stage = f"transfer_{name}"
        sampled = per_group.fit_per_group(stage, settings[name], spec, refit, *models[name])
        with watch(log, f"{stage}: scoring the draws"):
            traces[name], fit_metrics[name], timings[name], predictions = fitting.score_fit(
                stage, params, spec, refit, sampled, settings_extra={"prior_file": str(prior_path)})
            tests[name] = predictions["test"]
    population = population_predictions(params, spec, tasks, hier_posterior, heldout)
    metrics = transfer_metrics(tasks.likelihood, params, refits, fit_metrics, tests, population, upstream, skipped,
                               hier_refit)
    metrics["made_by"] = made_by("transfer", params)
    metrics["model"] = {"likelihood": tasks.likelihood, "activation": spec.activation}
    headline = transfer_headline(metrics)
    csv = transfer_csv(metrics, tasks.likelihood)
    with staged_outputs() as outputs:
        outputs.write_netcdf(traces[FLAT.name], flat_trace_out)
        outputs.write_netcdf(traces[INFORMED.name], informed_trace_out)
        outputs.write_json(as_builtin(timings), timing_out)
        outputs.write_text(csv, plot_out)
        outputs.write_json(as_builtin(metrics), detail_path(metrics_out))
        outputs.write_json(as_builtin(headline), metrics_out)
    score = likelihoods.get(tasks.likelihood).score
    for label, row in metrics["sizes"].items():
        refit = (f"; hierarchical refit {row[REFIT]['test'][score]:.4f} (informed - refit "
                 f"{row['informed_vs_refit']['mean']:+.3f}, se {row['informed_vs_refit']['se']:.3f})"
                 if REFIT in row else "")
        log.info("transfer: %-4s test %s flat %.4f, informed %.4f (informed - flat log density per row %+.3f, "
                 "se %.3f)%s", label, score, row["flat"]["test"][score], row["informed"]["test"][score],
                 row["difference"]["mean"], row["difference"]["se"], refit)
    stop = metrics["stops_mattering"]
    log.info("transfer: population (no rows of the group) test %s %.4f; %s", score,
             metrics["population"]["test"][score],
             (f"the informed prior stops mattering from size {stop}"
              + (" (every training row)" if stop == transfer.ALL else "")) if stop else
             "the informed prior still matters at the largest size (beyond 2 standard errors)")
    return metrics


def _upstream(path: Path, stage: str, params: Params, heldout: list[str], prior_path: Path) -> dict:
    """An upstream transfer stage's detail metrics, checked: readable, made with these params, these held-out groups.
    """
    try:
        upstream = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"metrics file {path} cannot be read ({err}); rerun {stage} (dvc repro)") from err
    if not isinstance(upstream, dict):
        raise InputError(f"metrics file {path} holds no metrics object; rerun {stage} (dvc repro)")
    check_made_by(upstream, path, stage, params)
    if upstream.get("heldout_groups") != heldout:
        raise InputError(f"{path} does not belong to {prior_path} (other held-out groups); rerun {stage} (dvc repro)")
    return upstream


def population_predictions(params: Params, spec: ModelSpec, tasks: Tasks, posterior, heldout: list[str]
                           ) -> dict[str, list]:
    """The hierarchical population's predictive on each held-out group's test rows.

    One new-group network per posterior draw, as ``hbnn predict`` scores an unseen group.

    Parameters
    ----------
    params : hbnn.config.Params
        The run's settings (``transfer.seed``).
    spec : hbnn.model.spec.ModelSpec
        The model.
    tasks : hbnn.data.tasks.Tasks
        The tasks.
    posterior : xarray.Dataset
        The hierarchical posterior.
    heldout : list of str
        The held-out groups, in the order of the output.

    Returns
    -------
    dict of str to list
        One split of :func:`hbnn.diagnostics.predictions.evaluate_groups`: ``draws``, ``noise`` and ``y`` per group.
    """
    lik = likelihoods.get(tasks.likelihood)
    rng = np.random.default_rng(derive_seed(params.transfer.seed, STAGE_KEYS["transfer_population"]))
    weights = population_weights(posterior, spec.layers, rng)
    noise = None
    if lik.extra:  # the population's: shared by the groups, or a new group's (model.noise: group)
        noise = lik.extra_in_label_units(population_extra(posterior, lik.extra, rng), tasks.y_sd)
    test = tasks.split("test")
    out = {"draws": [], "noise": [] if lik.extra else None, "y": []}
    for name in heldout:
        rows = test.rows(tasks.group_names.index(name))
        out["draws"].append(predictions.quantity_draws(tasks, weights, test.X[rows], spec.activation))
        if lik.extra:
            out["noise"].append(noise)
        out["y"].append(lik.mean_label(test.y[rows], tasks.y_mean, tasks.y_sd))
    return out


def transfer_metrics(likelihood: str, params: Params, refits: list[transfer.Refit], fits: dict[str, dict],
                     tests: dict[str, dict[str, list]], population: dict[str, list], upstream: dict,
                     skipped: list[str], hier_refit: dict | None = None) -> dict:
    """Everything ``metrics/detail/transfer.json`` holds.

    Per size: each model's pooled test scores, the paired informed-minus-flat difference in test log density and
    convergence, and where the hierarchical refit ran at that size, its scores and the paired informed-minus-refit
    difference; per fit: its scores and diagnostics.

    Parameters
    ----------
    likelihood : str
        The likelihood's name.
    params : hbnn.config.Params
        The run's settings (``transfer`` sizes).
    refits : list of hbnn.pipeline.transfer.Refit
        The refits, in the order of ``tests``' groups.
    fits : dict of str to dict
        Per model, :func:`hbnn.diagnostics.evaluation.fit_metrics`.
    tests : dict of str to dict
        Per model, its test predictions.
    population : dict of str to list
        :func:`population_predictions`.
    upstream : dict
        ``transfer_prior``'s metrics.
    skipped : list of str
        The refits left out (a size not below a group's training rows).
    hier_refit : dict, optional
        ``transfer_refit``'s metrics.

    Returns
    -------
    dict
        The detail metrics.
    """
    lik = likelihoods.get(likelihood)
    heldout = upstream["heldout_groups"]
    # per held-out group (population is in heldout order), so each size takes its groups' rows
    pop_lpd = [transfer.row_lpd(lik, transfer.subset(population, [g])) for g in range(len(heldout))]
    sizes = {}
    for label in transfer.size_labels(params.transfer):
        idx = [i for i, r in enumerate(refits) if r.size == label]
        if not idx:
            continue
        row: dict = {"groups": len(idx), "rows_mean": float(np.mean([refits[i].rows for i in idx]))}
        lpd = {}
        for name in MODELS:
            pred = transfer.subset(tests[name], idx)
            pooled, _ = predictions.split_scores(lik, pred)
            lpd[name] = transfer.row_lpd(lik, pred)
            per_fit = [fits[name]["per_group"][refits[i].name] for i in idx]
            row[name] = {"test": pooled | {"lpd_mean": float(lpd[name].mean())}, "lpd_se": transfer.mean_se(lpd[name]),
                         "fits_not_converged": sum(not f["converged"] for f in per_fit),
                         "max_rhat": max(f["rhat_fn"] for f in per_fit),
                         "min_ess_bulk": min(f["ess_bulk_fn"] for f in per_fit),
                         "divergences": sum(f["divergences"] for f in per_fit)}
        row["difference"] = transfer.paired_difference(lpd[INFORMED.name], lpd[FLAT.name])
        # the same groups' rows, in the same order (a size can be skipped for some groups)
        pop = np.concatenate([pop_lpd[heldout.index(refits[i].group)] for i in idx])
        row["informed_vs_population"] = transfer.paired_difference(lpd[INFORMED.name], pop)
        refit = (hier_refit or {}).get("sizes", {}).get(label)
        if refit is not None:
            row[REFIT], row["informed_vs_refit"], row["refit_vs_flat"] = refit_line(
                refit, [refits[i].group for i in idx], lpd[INFORMED.name], lpd[FLAT.name], label)
        sizes[label] = row
    pop_scores, _ = predictions.split_scores(lik, population)
    all_pop = np.concatenate(pop_lpd)
    per_fit = {name: [fits[name]["per_group"][r.name] for r in refits] for name in MODELS}
    return {
        "heldout_groups": upstream["heldout_groups"],
        "training_groups": upstream["training_groups"],
        "sizes": sizes,
        "population": {"test": pop_scores | {"lpd_mean": float(all_pop.mean())}, "lpd_se": transfer.mean_se(all_pop)},
        "stops_mattering": transfer.stops_mattering({k: v["difference"] for k, v in sizes.items()}),
        "skipped": skipped,
        "sampling": {**({REFIT: refit_sampling(hier_refit)} if hier_refit and hier_refit["sizes"] else {}),
                     **{name: {"fits": len(f), "fits_not_converged": sum(not x["converged"] for x in f),
                               "divergences": sum(x["divergences"] for x in f),
                               # fits drawn longer and thinned (sampler.max_draws), with why
                               "thinned_fits": fits[name]["sampling"].get("thinned_groups", {}),
                               # fits drawn again at a higher target_accept (sampler.refit_target_accept), with why
                               "raised_fits": fits[name]["sampling"].get("target_accept_raised", {})}
                        for name, f in per_fit.items()},
                     "hierarchical": {k: upstream["hierarchical"]["sampling"][k]
                                      for k in (*evaluation.HEADLINE_SAMPLING,
                                                *evaluation.HEADLINE_SAMPLING_IF_PRESENT, "restarted", "group_sd")
                                      if k in upstream["hierarchical"]["sampling"]}},
        "fits": {name: {r.name: {"group": r.group, "size": r.size, "rows": r.rows,
                                 **{k: v for k, v in fits[name]["per_group"][r.name].items() if k != "train"}}
                        for r in refits} for name in MODELS},
    }


def transfer_headline(metrics: dict) -> dict:
    """``metrics/transfer.json``: the test scores per model and size and the convergence counts behind them.

    Parameters
    ----------
    metrics : dict
        :func:`transfer_metrics`.

    Returns
    -------
    dict
        ``<model>.<size>.test.<score>`` (``flat``, ``informed``, ``hier_refit`` where it ran),
        ``population.n0.test.<score>`` and ``sampling``.
    """
    def scores(test: dict) -> dict:
        return {k: v for k, v in test.items() if k not in ("n", "lpd_mean")}

    out: dict = {name: {label: {"test": scores(row[name]["test"])} for label, row in metrics["sizes"].items()}
                 for name in MODELS}
    refit = {label: {"test": scores(row[REFIT]["test"])} for label, row in metrics["sizes"].items() if REFIT in row}
    if refit:
        out[REFIT] = refit
    out["population"] = {transfer.POPULATION: {"test": scores(metrics["population"]["test"])}}
    sampling = metrics["sampling"]
    out["sampling"] = {name: {k: sampling[name][k] for k in ("fits_not_converged", "divergences")}
                       for name in (*MODELS, REFIT) if name in sampling}
    # the fit the transfer prior comes from, judged as fit_hier's headline judges that fit (its group sds included)
    headline = (*evaluation.HEADLINE_SAMPLING, *evaluation.HEADLINE_SAMPLING_IF_PRESENT)
    out["sampling"]["hierarchical"] = {k: v for k, v in sampling["hierarchical"].items() if k in headline}
    return out


def transfer_csv(metrics: dict, likelihood: str) -> str:
    """``reports/plots/transfer.csv``: one row per model and size, the population at ``n = 0``.

    The models are ``flat``, ``informed`` and ``hier_refit`` (the hierarchical refit, at the sizes it ran).

    ``n`` is the mean training rows per group. The columns ``dvc plots`` draws are the same for every likelihood:
    ``score`` (its headline test score: accuracy, RMSE; named in ``score_name``) and ``log_loss``, the mean negative
    log predictive density of the test labels (the log loss of a classifier); the likelihood's other test scores
    follow.

    Parameters
    ----------
    metrics : dict
        :func:`transfer_metrics`.
    likelihood : str
        The likelihood's name.

    Returns
    -------
    str
        The CSV text.
    """
    score = likelihoods.get(likelihood).score
    pop = metrics["population"]["test"]
    others = [k for k in pop if k not in ("n", "lpd_mean", score, "log_loss")]

    def line(model: str, size: str, n: float, test: dict) -> str:
        values = [test[score], test.get("log_loss", -test["lpd_mean"]), *(test[k] for k in others)]
        return ",".join([model, size, f"{n:.6g}", score, *(f"{v:.6g}" for v in values)])

    lines = [",".join(["model", "size", "n", "score_name", "score", "log_loss", *others]),
             line("population", transfer.POPULATION, 0, pop)]
    lines += [line(name, label, row["rows_mean"], row[name]["test"]) for name in (*MODELS, REFIT)
              for label, row in transfer.in_size_order(metrics["sizes"]).items()
              if name in row]  # dvc plots: x in this order
    return "\n".join(lines) + "\n"
