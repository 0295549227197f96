"""What the fit stages share: the trace layout, metrics, the cost check and which density is sampled."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from hbnn.config import Params, SamplerParams
from hbnn.data.tasks import Tasks
from hbnn.diagnostics import evaluation
from hbnn.diagnostics.advice import model_advice
from hbnn.diagnostics.predictions import (
    evaluate_groups,
    group_extra,
    group_weights,
    pointwise_log_likelihood,
    split_order,
)
from hbnn.files.io import as_builtin, made_by, provenance, stamp
from hbnn.files.outputs import detail_path, staged_outputs
from hbnn.files.trace import Trace
from hbnn.logs import watch
from hbnn.model import likelihoods
from hbnn.model.spec import ModelSpec
from hbnn.pipeline import budget
from hbnn.pipeline.variants import FITS, STAGE_KEYS, STAGE_PARAMS, derive_seed
from hbnn.sampling.sampler import backend_class

log = logging.getLogger(__name__)


def enforce_budget(stage: str, params: Params, tasks: Tasks) -> budget.Estimate:
    """Refuse (before any compile or sampling) a fit estimated past ``params.limits``.

    Parameters
    ----------
    stage : str
        A fit of :data:`hbnn.pipeline.variants.FITS`.
    params : hbnn.config.Params
        The run's settings (the stage's sampler, ``model``, ``limits``).
    tasks : hbnn.data.tasks.Tasks
        The rows the fit will see.

    Returns
    -------
    hbnn.pipeline.budget.Estimate
        The fit's estimated cost.

    Raises
    ------
    hbnn.config.ConfigError
        If the estimated memory or time is past ``params.limits``.
    """
    estimate = estimate_fit(stage, params, tasks)
    budget.enforce(estimate, params)
    return estimate


def estimate_fit(stage: str, params: Params, tasks: Tasks) -> budget.Estimate:
    """The budget's estimate of a fit of ``tasks`` (:func:`hbnn.pipeline.budget.fit_estimate` on their sizes), which
    :func:`enforce_budget` holds against ``params.limits``.

    Parameters
    ----------
    stage, params, tasks
        As :func:`enforce_budget`'s.

    Returns
    -------
    hbnn.pipeline.budget.Estimate
    """
    train = tasks.split("train")
    n_train = train.y.size
    largest = int(np.bincount(train.group, minlength=tasks.n_groups).max()) if n_train else 0
    return budget.fit_estimate(stage, params, tasks.n_groups, n_train, tasks.ds.sizes["obs"] - n_train,
                               tasks.n_features, max_group_rows=largest)


def _observed(tasks: Tasks) -> tuple[xr.Dataset, xr.Dataset]:
    """``observed_data`` (training labels) and ``constant_data`` (training inputs, standardisation stats).

    Labels and inputs are on the model scale; ``x_mean``/``x_sd`` and
    ``y_mean``/``y_sd`` map raw values to it, so a trace alone can score new rows.
    """
    train = tasks.split("train")
    coords = {"obs": train.obs, "obs_group": ("obs", np.array(tasks.group_names)[train.group])}
    observed = xr.Dataset({"y": ("obs", train.y)}, coords=coords)
    constant = xr.Dataset(
        {
            "x": (("obs", "feature"), train.X),
            "x_mean": ("feature", tasks.x_mean),
            "x_sd": ("feature", tasks.x_sd),
            "y_mean": ((), tasks.y_mean),
            "y_sd": ((), tasks.y_sd),
        },
        coords={**coords, "feature": tasks.features},
    )
    return observed, constant


def model_spec(params: Params, tasks: Tasks) -> ModelSpec:
    """The model a fit stage fits to ``tasks``: built once per stage from ``params.model`` and handed down.

    Parameters
    ----------
    params : Params
        The run's params.
    tasks : Tasks
        The data, whose feature columns the network reads.

    Returns
    -------
    ModelSpec
    """
    return ModelSpec.of(params.model, tasks.features)


def _settings(stage: str, params: Params, spec: ModelSpec, tasks: Tasks, **extra) -> dict:
    return {
        "sampler": dataclasses.asdict(params.sampler_for(stage)),
        "hidden_layers": list(spec.hidden_layers),
        "bias": spec.bias,
        "activation": spec.activation,
        "noise_sd": spec.noise_sd,
        "noise": spec.noise,
        "features": tasks.features,
        "likelihood": tasks.likelihood,
        "group_column": tasks.group_column,
        **extra,
    }


@dataclass(frozen=True)
class Fit:
    """A scored fit, before anything is written: what a fit stage writes and the Python API's estimators hold.

    Parameters
    ----------
    stage : str
        The fit (:data:`hbnn.pipeline.variants.FITS`).
    spec : hbnn.model.spec.ModelSpec
        The model fitted.
    tasks : hbnn.data.tasks.Tasks
        The data it was fitted to and scored on.
    trace : hbnn.files.trace.Trace
        The trace: posterior, sample stats, data and, with ``trace.pointwise``, the pointwise groups.
    metrics : dict
        :func:`hbnn.diagnostics.evaluation.fit_metrics`' metrics with PSIS-LOO and the model's likelihood and
        activation; the stage adds ``made_by``.
    timing : dict
        Wall-clock seconds and gradient counts (:func:`hbnn.diagnostics.evaluation.timing_metrics`).
    """

    stage: str
    spec: ModelSpec
    tasks: Tasks
    trace: Trace
    metrics: dict
    timing: dict


def score(stage: str, params: Params, spec: ModelSpec, tasks: Tasks, sampled: Sampled,
          settings_extra: dict | None = None) -> Fit:
    """Score a fit of ``spec`` (:func:`score_fit`) and say how it went in the log.

    Parameters
    ----------
    stage : str
        The fit (:data:`hbnn.pipeline.variants.FITS`).
    params : hbnn.config.Params
        The settings it was fitted with.
    spec : hbnn.model.spec.ModelSpec
        The model.
    tasks : hbnn.data.tasks.Tasks
        The data.
    sampled : Sampled
        The draws.
    settings_extra : dict, optional
        More settings for the trace's ``hbnn_settings`` attr (the flat prior's sd, the informed prior's file).

    Returns
    -------
    Fit
        The trace, metrics and timing; nothing is written.
    """
    what = f"{stage}: scoring the draws and PSIS-LOO"
    log.info("%s (sampling took %.1fs)", what, sampled.cost.seconds)
    with watch(log, what):
        idata, metrics, timing, _ = score_fit(stage, params, spec, tasks, sampled, settings_extra)
    metrics["model"] = {"likelihood": tasks.likelihood, "activation": spec.activation}
    idata.sample_stats.attrs["hbnn_diagnostics"] = json.dumps(evaluation.group_diagnostics(as_builtin(metrics)),
                                                              sort_keys=True)
    score_name = likelihoods.get(tasks.likelihood).score
    log.info(
        "%s: train %s %.4f, test %s %.4f, LOO elpd %.1f (se %.1f), %d divergences, %.1fs sampling",
        stage, score_name, metrics["train"][score_name], score_name, metrics["test"].get(score_name, float("nan")),
        metrics["loo"]["elpd"], metrics["loo"]["se"], metrics["sampling"]["divergences"], sampled.cost.seconds,
    )
    sd_draws = {v: sampled.posterior[v].values for v in sampled.extra_diagnostics or {} if v in sampled.posterior}
    advice = None if "loss" in sampled.sample_stats else model_advice(
        metrics["per_group"], _settings(stage, params, spec, tasks, **(settings_extra or {})), stage,
        sd_draws=sd_draws, sds_missing=metrics["sampling"].get("sds_not_converged", 0))
    if advice:
        log.warning("%s", advice)
    falling = metrics["sampling"].get("advi_still_falling")
    if falling:
        s = params.sampler_for(stage)
        fits = ("the joint fit, so every group misses the bar" if sampled.sample_stats["loss"].ndim == 1
                else f"{falling} of {len(tasks.group_names)} fits, so those groups miss the bar")
        log.warning("%s: the ADVI loss is still falling in %s; raise %s.advi.iterations (now %d)", stage, fits,
                    "hier_sampler" if s is params.hier_sampler else "sampler", s.advi.iterations)
    return Fit(stage, spec, tasks, idata, metrics, timing)


def write_fit(fit: Fit, params: Params, trace_out: Path, metrics_out: Path, timing_out: Path) -> dict:
    """Write a fit stage's outputs together: its trace, timing, detail metrics and headline metrics.

    Parameters
    ----------
    fit : Fit
        The scored fit.
    params : hbnn.config.Params
        The run's params, whose hash ``made_by`` records.
    trace_out, metrics_out, timing_out : pathlib.Path
        Where the trace, the headline metrics and the timing go; the detail metrics go beside the headline's
        (:func:`hbnn.files.outputs.detail_path`).

    Returns
    -------
    dict
        The detail metrics written.
    """
    metrics = {**fit.metrics, "made_by": made_by(FITS[fit.stage][0], params)}
    score_name = likelihoods.get(fit.tasks.likelihood).score
    with staged_outputs() as outputs:
        outputs.write_netcdf(fit.trace, trace_out)
        outputs.write_json(as_builtin(fit.timing), timing_out)
        outputs.write_json(as_builtin(metrics), detail_path(metrics_out))
        outputs.write_json(as_builtin(evaluation.headline(metrics, score_name)), metrics_out)
    return metrics


def score_fit(stage: str, params: Params, spec: ModelSpec, tasks: Tasks, sampled: Sampled,
              settings_extra: dict | None = None) -> tuple[Trace, dict, dict, dict[str, dict[str, list]]]:
    """Score a sampled fit: its trace, metrics, timing and the predictions behind the metrics; nothing is written.

    Parameters
    ----------
    stage : str
        A fit of :data:`hbnn.pipeline.variants.FITS`; the trace is stamped with the provenance of the DVC stage that
        runs it.
    params : hbnn.config.Params
        The run's settings.
    spec : hbnn.model.spec.ModelSpec
        The model that was sampled.
    tasks : hbnn.data.tasks.Tasks
        The data it was fitted to; each group is scored on its rows of each split.
    sampled : hbnn.fitting.common.Sampled
        The posterior, sample stats and cost.
    settings_extra : dict, optional
        More settings for the trace's ``hbnn_settings`` attr.

    Returns
    -------
    tuple
        ``(trace, metrics, timing, predictions)``: the trace, the metrics of
        :func:`hbnn.diagnostics.evaluation.fit_metrics` (with PSIS-LOO), the timing, and the predictions of
        :func:`hbnn.diagnostics.predictions.evaluate_groups`.
    """
    posterior, cost = sampled.posterior, sampled.cost
    observed, constant = _observed(tasks)
    predictions = evaluate_groups(
        tasks,
        lambda g: group_weights(posterior, spec.layers, tasks.group_names[g]),
        spec.activation,
        noise_of=lambda g: group_extra(posterior, likelihoods.get(tasks.likelihood).extra, tasks.group_names[g]),
    )
    log_lik = pointwise_log_likelihood(tasks, predictions["train"])
    # PSIS-LOO (FFTs and sorts over every training row's draws, which release the GIL) beside the rest: after the
    # sampling only this thread is busy, and LOO is ~half of what it does here
    s = params.sampler_for(stage)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="psis") as pool:
        loo = pool.submit(evaluation.psis_loo, log_lik)
        idata, metrics = _scored(stage, params, spec, s, tasks, sampled, settings_extra, predictions, log_lik,
                                 observed, constant, loo)
    advi_iterations = sampled.sample_stats.sizes.get("advi_iteration")
    timing = evaluation.timing_metrics(s.backend, cost.seconds, cost.compile_seconds, cost.grad_evals,
                                       backend_class(s).parallel_chains(s), advi_iterations)
    return idata, metrics, timing, predictions


def _scored(stage: str, params: Params, spec: ModelSpec, s: SamplerParams, tasks: Tasks, sampled: Sampled,
            settings_extra: dict | None, predictions: dict, log_lik: np.ndarray, observed, constant,
            loo: concurrent.futures.Future) -> tuple[Trace, dict]:
    """:func:`score_fit`'s trace and metrics of a fit with sampler params ``s``, with PSIS-LOO from ``loo`` (a
    future)."""
    dvc_stage, variant = FITS[stage]
    posterior, sample_stats = sampled.posterior, sampled.sample_stats
    groups = {"posterior": posterior, "sample_stats": sample_stats, "observed_data": observed,
              "constant_data": constant}
    if params.trace.pointwise:
        groups.update(_pointwise_groups(stage, params, tasks, predictions["test"], log_lik, observed))
    idata = Trace(**groups)
    settings = _settings(stage, params, spec, tasks, **(settings_extra or {}))
    diverging = sample_stats["diverging"]
    group_divergences = None  # per-group fits: each group's own, a thinned group's over its whole run
    if "group" in diverging.dims:
        group_divergences = diverging.sum(("chain", "draw")).sel(group=tasks.group_names).values
        for g, t in (sampled.thinned or {}).items():
            group_divergences[tasks.group_names.index(g)] = t["divergences"]
    stamp(idata, provenance(dvc_stage, variant.name, params.section_hash(*STAGE_PARAMS[dvc_stage]), settings))
    metrics = evaluation.fit_metrics(
        tasks,
        predictions,
        divergences=int(diverging.sum() if group_divergences is None else group_divergences.sum()),
        extra_diagnostics=sampled.extra_diagnostics,
        group_divergences=group_divergences,
        advi_loss=_advi_loss(sample_stats, tasks.group_names),
        test_diagnostics=sampled.test_diagnostics,
        thinned=sampled.thinned,
    )
    evaluation.add_loo(metrics, evaluation.loo_metrics(loo.result(), tasks.split("train").group, tasks.group_names))
    if sampled.thinned:  # groups drawn longer and thinned to the stage's draws (sampler.max_draws): why and how much
        metrics["sampling"]["thinned_groups"] = sampled.thinned
        idata.sample_stats.attrs["hbnn_thinned_groups"] = json.dumps(sampled.thinned, sort_keys=True)
    if sampled.raised:  # groups fitted again at a higher target_accept (sampler.refit_target_accept): why, what came
        metrics["sampling"]["target_accept_raised"] = sampled.raised
        idata.sample_stats.attrs["hbnn_target_accept_raised"] = json.dumps(sampled.raised, sort_keys=True)
    if s.restarts_apply:  # a fit whose chains may start again at its looks: how often they did, why and from where
        restarts = json.loads(sample_stats.attrs.get("hbnn_restarts", "[]"))
        metrics["sampling"]["restarts"] = len(restarts)
        if restarts:
            metrics["sampling"]["restarted"] = restarts
    return idata, metrics


def _advi_loss(sample_stats: xr.Dataset, names: Sequence[str]) -> np.ndarray | None:
    """An ADVI fit's loss per iteration: ``(groups, iterations)`` in ``names`` order for per-group fits,
    ``(iterations,)`` for one joint fit; ``None`` for MCMC."""
    if "loss" not in sample_stats:
        return None
    loss = sample_stats["loss"]
    return loss.sel(group=list(names)).transpose("group", ...).values if "group" in loss.dims else loss.values


def _pointwise_groups(stage: str, params: Params, tasks: Tasks, test: dict[str, list], log_lik: np.ndarray,
                      observed: xr.Dataset) -> dict[str, xr.Dataset]:
    """The trace's ``log_likelihood`` (training rows, as ``observed_data``) and ``predictions`` (test rows).

    ``predictions`` holds the function-space quantity behind every score and
    diagnostic (``p``, ``mu`` or ``rate``, in the label's units) and, where the
    likelihood has predictive noise, one predictive draw ``y`` per posterior
    draw (seeded from the stage's sampler seed); ``predictions_constant_data``
    holds the test rows' inputs (model scale) and labels (label units), so the
    test scores can be recomputed from the trace alone.
    """
    lik = likelihoods.get(tasks.likelihood)
    split = tasks.split("test")
    coords = {"obs": split.obs, "obs_group": ("obs", np.array(tasks.group_names)[split.group])}
    dims = ("chain", "draw", "obs")
    quantity = split_order(split, test["draws"]) if split.y.size else np.zeros((*log_lik.shape[:2], 0))
    pred = {lik.quantity: (dims, quantity)}
    rng = np.random.default_rng(derive_seed(params.sampler_for(stage).seed, STAGE_KEYS[stage], *PREDICTIVE_KEYS))
    noise = test["noise"] or [None] * tasks.n_groups
    draws = [lik.predictive_draws(d, n, rng) for d, n in zip(test["draws"], noise, strict=True)]
    if split.y.size and draws[0] is not None:
        pred["y"] = (dims, split_order(split, draws))
    return {
        "log_likelihood": xr.Dataset({"y": (dims, log_lik)}, coords=dict(observed.coords)),
        "predictions": xr.Dataset(pred, coords=coords),
        "predictions_constant_data": xr.Dataset(
            {"x": (("obs", "feature"), split.X), "y": ("obs", lik.mean_label(split.y, tasks.y_mean, tasks.y_sd))},
            coords={**coords, "feature": tasks.features}),
    }


# Random stream of the predictive draws stored in a trace: a three-part key (stage, 0, 1), which no
# sampler stream uses (those are (stage,) and (stage, group)).
PREDICTIVE_KEYS = (0, 1)


@dataclass(frozen=True)
class Sampled:
    """A fit's draws before they are scored: posterior, sample stats, what sampling cost, and the R-hat and ESS
    of scalar variables the function-space diagnostics do not cover (the hierarchical group sds)."""

    posterior: xr.Dataset
    sample_stats: xr.Dataset
    cost: Cost
    extra_diagnostics: dict[str, dict[str, float]] | None = None
    # per-group fits with sampler.max_draws: the groups drawn longer and thinned, {group: what and why}
    thinned: dict[str, dict] | None = None
    # ... the groups fitted again at sampler.refit_target_accept, {group: what and why}
    raised: dict[str, dict] | None = None
    # ... and every group's function-space diagnostics on its test points, judged as it was fitted
    test_diagnostics: dict[str, dict[str, float]] | None = None


@dataclass(frozen=True)
class Cost:
    """Wall-clock seconds of a stage's sampling and compiling, and its gradient evaluations."""

    seconds: float
    compile_seconds: float | None  # None: the backend compiles inside sampling (PyMC, JAX)
    grad_evals: int | None


_SAID: set[tuple[str, str, str]] = set()  # the models whose fallback to PyMC's density has been said, once a process


def hand_written(spec: ModelSpec, settings: SamplerParams, stage: str, noise: str = "shared") -> bool:
    """Whether fit ``stage`` samples the model's hand-written log density (:mod:`hbnn.density`).

    Parameters
    ----------
    spec : ModelSpec
        The model: its likelihood and activation say whether the density has compiled code for it.
    settings : SamplerParams
        The stage's sampler settings: the backend.
    stage : str
        The fit (:data:`hbnn.pipeline.variants.FITS`), for the log line.
    noise : str, optional
        The hierarchical fits' ``model.noise`` (the per-group fits always have one noise sd per group, which the
        density computes).

    Returns
    -------
    bool
        False where the likelihood, the activation or per-group noise has no compiled code for it
        (:func:`hbnn.density.densities.unsupported`): with nutpie, one INFO line says that PyMC's compiled density is
        sampled instead, which is slower and otherwise the same model.
    """
    from hbnn.density.densities import unsupported

    why = unsupported(spec.likelihood, spec.activation, noise)
    if why is None:
        return True
    if settings.backend == "nutpie" and (spec.likelihood, spec.activation, noise) not in _SAID:
        _SAID.add((spec.likelihood, spec.activation, noise))
        log.info("%s: %s; nutpie samples PyMC's compiled density instead (the same model, slower)", stage, why)
    return False


def minibatch(settings: SamplerParams) -> int | None:
    """Rows per gradient step of the backend of ``settings``.

    Parameters
    ----------
    settings : hbnn.config.SamplerParams

    Returns
    -------
    int or None
        The batch size; ``None`` for the full-batch likelihood.
    """
    return backend_class(settings).minibatch_size(settings)
