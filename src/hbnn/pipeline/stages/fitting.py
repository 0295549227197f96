"""What the fit stages share: the per-group loop, the trace layout, metrics and the cost check."""

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

from hbnn.config import DIVERGENT_SHARE_MAX, ESS_MIN, Params, SamplerParams
from hbnn.data.tasks import Tasks
from hbnn.diagnostics import criterion, evaluation
from hbnn.diagnostics.predictions import (
    evaluate_groups,
    group_extra,
    group_weights,
    pointwise_log_likelihood,
    quantity_draws,
    split_order,
)
from hbnn.files.io import as_builtin, detail_path, made_by, provenance, staged_outputs, stamp
from hbnn.files.trace import Trace
from hbnn.logs import watch
from hbnn.model import likelihoods
from hbnn.model.network import layer_specs
from hbnn.pipeline import budget
from hbnn.pipeline.variants import FITS, STAGE_KEYS, STAGE_PARAMS, derive_seed
from hbnn.sampling import cluster
from hbnn.sampling.runlength import ESS_SPARE
from hbnn.sampling.sampler import backend_class

log = logging.getLogger(__name__)


def enforce_budget(stage: str, params: Params, tasks: Tasks) -> budget.Estimate:
    """Refuse (before any compile or sampling) a fit estimated past ``params.limits``; return the estimate."""
    train = tasks.split("train")
    n_train = train.y.size
    largest = int(np.bincount(train.group, minlength=tasks.n_groups).max()) if n_train else 0
    estimate = budget.fit_estimate(stage, params, tasks.n_groups, n_train, tasks.ds.sizes["obs"] - n_train,
                                   tasks.n_features, max_group_rows=largest)
    budget.enforce(estimate, params)
    return estimate


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


def _settings(stage: str, params: Params, tasks: Tasks, **extra) -> dict:
    return {
        "sampler": dataclasses.asdict(params.sampler_for(stage)),
        "hidden_layers": list(params.model.hidden_layers),
        "bias": params.model.bias,
        "activation": params.model.activation,
        "features": tasks.features,
        "likelihood": tasks.likelihood,
        "group_column": tasks.group_column,
        **extra,
    }


def finish_fit(stage: str, params: Params, tasks: Tasks, sampled: Sampled, trace_out: Path, metrics_out: Path,
               timing_out: Path, settings_extra: dict | None = None) -> dict:
    """Score a fit (:func:`score_fit`) and write its trace, timing, headline and detail metrics together."""
    what = f"{stage}: scoring the draws, PSIS-LOO and writing the outputs"
    log.info("%s (sampling took %.1fs)", what, sampled.cost.seconds)
    with watch(log, what):
        idata, metrics, timing, _ = score_fit(stage, params, tasks, sampled, settings_extra)
        metrics["made_by"] = made_by(FITS[stage][0], params)
        metrics["model"] = {"likelihood": tasks.likelihood, "activation": params.model.activation}
        score = likelihoods.get(tasks.likelihood).score
        with staged_outputs() as outputs:
            outputs.write_netcdf(idata, trace_out)
            outputs.write_json(as_builtin(timing), timing_out)
            outputs.write_json(as_builtin(metrics), detail_path(metrics_out))
            outputs.write_json(as_builtin(evaluation.headline(metrics, score)), metrics_out)
        log.info(
            "%s: train %s %.4f, test %s %.4f, LOO elpd %.1f (se %.1f), %d divergences, %.1fs sampling",
            stage, score, metrics["train"][score], score, metrics["test"].get(score, float("nan")),
            metrics["loo"]["elpd"], metrics["loo"]["se"], metrics["sampling"]["divergences"], sampled.cost.seconds,
        )
        falling = metrics["sampling"].get("advi_still_falling")
        if falling:
            s = params.sampler_for(stage)
            fits = ("the joint fit, so every group misses the bar" if sampled.sample_stats["loss"].ndim == 1
                    else f"{falling} of {len(tasks.group_names)} fits, so those groups miss the bar")
            log.warning("%s: the ADVI loss is still falling in %s; raise %s.advi.iterations (now %d)", stage, fits,
                        "hier_sampler" if s is params.hier_sampler else "sampler", s.advi.iterations)
        return metrics


def score_fit(stage: str, params: Params, tasks: Tasks, sampled: Sampled, settings_extra: dict | None = None
              ) -> tuple[Trace, dict, dict, dict[str, dict[str, list]]]:
    """The trace (stamped with the provenance of the DVC stage that runs ``stage``), the metrics of
    :func:`hbnn.diagnostics.evaluation.fit_metrics` (with PSIS-LOO), the timing of a fit and the predictions behind the
    metrics (:func:`hbnn.diagnostics.predictions.evaluate_groups`); nothing is written.

    ``stage`` is a fit of :data:`hbnn.pipeline.variants.FITS`.
    """
    posterior, cost = sampled.posterior, sampled.cost
    observed, constant = _observed(tasks)
    specs = layer_specs(tasks.n_features, params.model.hidden_layers, params.model.bias)
    predictions = evaluate_groups(
        tasks,
        lambda g: group_weights(posterior, specs, tasks.group_names[g]),
        params.model.activation,
        noise_of=lambda g: group_extra(posterior, likelihoods.get(tasks.likelihood).extra, tasks.group_names[g]),
    )
    log_lik = pointwise_log_likelihood(tasks, predictions["train"])
    # PSIS-LOO (FFTs and sorts over every training row's draws, which release the GIL) beside the rest: after the
    # sampling only this thread is busy, and LOO is ~half of what it does here
    s = params.sampler_for(stage)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="psis") as pool:
        loo = pool.submit(evaluation.psis_loo, log_lik)
        idata, metrics = _scored(stage, params, s, tasks, sampled, settings_extra, predictions, log_lik, observed,
                                 constant, loo)
    advi_iterations = sampled.sample_stats.sizes.get("advi_iteration")
    timing = evaluation.timing_metrics(s.backend, cost.seconds, cost.compile_seconds, cost.grad_evals,
                                       backend_class(s).parallel_chains(s), advi_iterations)
    return idata, metrics, timing, predictions


def _scored(stage: str, params: Params, s: SamplerParams, tasks: Tasks, sampled: Sampled,
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
    settings = _settings(stage, params, tasks, **(settings_extra or {}))
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


class GroupProgress:
    """Where a loop over groups stands, for its heartbeat: groups and draws done, divergences, time left."""

    def __init__(self, n_groups: int, draws_per_group: int):
        self.n_groups, self.draws_per_group = n_groups, draws_per_group
        self.groups = self.divergences = 0
        self.seconds = 0.0

    def done(self, seconds: float, divergences: int) -> None:
        self.groups += 1
        self.seconds += seconds
        self.divergences += divergences

    def _counts(self) -> str:
        return (f"{self.groups}/{self.n_groups} groups, {self.groups * self.draws_per_group}/"
                f"{self.n_groups * self.draws_per_group} draws, {self.divergences} divergences so far")

    def status(self, elapsed: float) -> str:
        """``7/18 groups, 14000/36000 draws, 0 divergences so far, ~19s left`` (time left from the groups done)."""
        left = f", ~{elapsed / self.groups * (self.n_groups - self.groups):.0f}s left" if self.groups else ""
        return self._counts() + left

    def summary(self) -> str:
        """The counts and the seconds spent sampling, once the loop is done."""
        return self._counts() + f", {self.seconds:.1f}s sampling"


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


_SAID: set[tuple[str, str]] = set()  # the models whose fallback to PyMC's density has been said, once a process


def hand_written(params: Params, stage: str) -> bool:
    """Whether fit ``stage`` samples the model's hand-written log density (:mod:`hbnn.density`).

    Parameters
    ----------
    params : Params
        The run's params: ``model.likelihood`` and ``model.activation`` say which model, the stage's sampler which
        backend.
    stage : str
        The fit (:data:`hbnn.pipeline.variants.FITS`).

    Returns
    -------
    bool
        False where the likelihood or the activation has no compiled code for it
        (:func:`hbnn.density.densities.unsupported`): with nutpie, one INFO line says that PyMC's compiled density is
        sampled instead, which is slower and otherwise the same model.
    """
    from hbnn.density.densities import unsupported

    m = params.model
    why = unsupported(m.likelihood, m.activation)
    if why is None:
        return True
    if params.sampler_for(stage).backend == "nutpie" and (m.likelihood, m.activation) not in _SAID:
        _SAID.add((m.likelihood, m.activation))
        log.info("%s: %s; nutpie samples PyMC's compiled density instead (the same model, slower)", stage, why)
    return False


def minibatch(params: Params, stage: str) -> int | None:
    """Rows per gradient step of ``stage``'s backend, ``None`` for the full-batch likelihood."""
    s = params.sampler_for(stage)
    return backend_class(s).minibatch_size(s)


def fit_per_group(stage: str, params: Params, tasks: Tasks, build, density=None) -> Sampled:
    """Fit ``build(X, y)`` to every group's training rows, compiled once per process.

    ``density(X, y)``: the model's hand-written log density on those rows (:mod:`hbnn.density.kernel`), which nutpie
    samples instead of PyTensor's (the same density, checked before sampling).

    The fits run where ``HBNN_DASK_SCHEDULER`` says (:mod:`hbnn.sampling.cluster`): in this
    process by default, or in shards on a Dask cluster, with the same draws.
    Returns the posterior and sample stats stacked along a ``group`` dim, and the
    cost summed over groups, as :class:`Sampled`.
    """
    train = tasks.split("train")
    first = train.rows(0)
    settings = params.sampler_for(stage)
    x, y = train.X[first], train.y[first]
    model = cluster.Model(build, settings, x, y, None if density is None else density(x, y))
    jobs = []
    for g, name in enumerate(tasks.group_names):
        rows = train.rows(g)
        jobs.append(cluster.GroupJob(g, name, derive_seed(settings.seed, STAGE_KEYS[stage], g), train.X[rows],
                                     train.y[rows]))
    progress = GroupProgress(tasks.n_groups, settings.chains * settings.draws)

    def done(result: cluster.GroupResult) -> None:
        progress.done(result.seconds, result.divergences)
        log.debug("%s: group %s (%d/%d, %d rows) sampled in %.1fs, %d divergences", stage, result.name,
                  progress.groups, tasks.n_groups, jobs[result.index].y.size, result.seconds, result.divergences)

    with watch(log, stage, status=progress.status):
        fitted = cluster.fit_groups(stage, model, jobs, done)
        results, thinned, raised, diagnostics = fitted.results, {}, {}, None
        compile_seconds = fitted.compile_seconds
        # ADVI's draws are one approximation's independent draws, judged by its loss: a refit from the same seed
        # would give the same approximation
        if settings.backend != "advi" and (settings.max_draws > settings.draws or settings.refit_applies):
            specs = layer_specs(tasks.n_features, params.model.hidden_layers, params.model.bias)
            results, thinned, raised, diagnostics, refits = _lengthen(stage, tasks, specs, params.model.activation,
                                                                      model, jobs, results, progress)
            compile_seconds = None if compile_seconds is None or None in refits else compile_seconds + sum(refits)
    log.info("%s: %s", stage, progress.summary())

    def stack(parts):
        ds = xr.concat(parts, dim="group", combine_attrs="drop_conflicts")
        order = ["chain", "draw", "group"]
        return ds.transpose(*order, ...)

    posts = [r.posterior.expand_dims(group=[r.name]) for r in results]
    stats = [r.sample_stats.expand_dims(group=[r.name]) for r in results]
    grads = [r.grad_evals for r in results]
    grad_evals = None if any(g is None for g in grads) else sum(grads)
    return Sampled(stack(posts), stack(stats), Cost(progress.seconds, compile_seconds, grad_evals),
                   thinned=thinned or None, raised=raised or None, test_diagnostics=diagnostics)


def _group_test_diagnostics(tasks: Tasks, g: int, posterior: xr.Dataset, specs, activation: str
                            ) -> dict[str, float] | None:
    """Function-space max R-hat and min bulk ESS of group ``g``'s test points at one per-group fit's draws (the
    numbers the metrics judge it by; hidden units of ``activation``); ``None`` for a group without test rows."""
    test = tasks.split("test")
    rows = test.rows(g)
    if not rows.size:
        return None
    draws = quantity_draws(tasks, group_weights(posterior, specs, None), test.X[rows], activation)
    return criterion.function_space_diagnostics(draws)


def _lengthen(stage: str, tasks: Tasks, specs, activation: str, model: cluster.Model, jobs: Sequence[cluster.GroupJob],
              results: Sequence[cluster.GroupResult], progress: GroupProgress
              ) -> tuple[list[cluster.GroupResult], dict[str, dict], dict[str, dict], dict[str, dict[str, float]],
                         list]:
    """Every group whose fit misses the convergence bar is fitted again from its own seed:

    - with ``sampler.max_draws``, where its ``draws`` miss function-space R-hat <= 1.01 or bulk ESS >= 400 on its
      test points: with ``k`` times the draws per chain and each chain thinned to every ``k``-th draw, ``k``
      growing (where the ESS extrapolates, at least by one) until the thinned draws meet the bar or ``k * draws``
      would pass ``max_draws``;
    - with ``sampler.refit_target_accept`` above ``target_accept``, where more of its transitions diverge than the
      bar allows: once, at that target_accept (and longer where R-hat or ESS miss too).

    A stage's per-group traces share one ``draw`` dim, so a group cannot simply keep more draws; thinned,
    it keeps ``draws`` draws of a longer chain (nutpie's longer run from the same seed starts with the same
    draws). Its divergences are those of the whole run (a kept draw is marked divergent where any draw it stands
    for diverged) and ``n_steps`` the steps they took; its seconds and gradients count every run. Returns the
    results; per group drawn longer what it missed, ``thinned_by``, the draws per chain drawn and the whole
    run's divergences (:func:`hbnn.diagnostics.evaluation.fit_metrics` judges them against its ``k * draws``
    transitions); per group fitted again at a higher target_accept, that target_accept, its divergences before and after
    and the draws per chain; every group's diagnostics at the draws it keeps (the metrics' own, so they are not computed
    twice); and the refits' compile seconds."""
    s = model.settings
    out = list(results)
    thinned: dict[str, dict] = {}
    raised: dict[str, dict] = {}
    diagnostics: dict[str, dict[str, float]] = {}
    # what made each fix necessary, at the fit that first needed it: R-hat/ESS for a longer fit, divergences for a
    # higher target_accept
    short_at: dict[int, dict] = {}
    diverged_at: dict[int, dict] = {}
    pending = {}  # group -> (draws factor k, target_accept, diagnostics, divergences) of its fit so far
    for r in out:
        d = _group_test_diagnostics(tasks, r.index, r.posterior, specs, activation)
        if d is not None:
            diagnostics[r.name] = d
        pending[r.index] = (1, s.target_accept, d, r.divergences)
    compiles: list = []
    while pending:
        by_fit: dict[tuple[int, float], list[int]] = {}
        for g, (k, ta, d, div) in pending.items():
            transitions = s.chains * k * s.draws
            short = d is not None and not criterion.meets_bar(d["max_rhat"], d["min_ess_bulk"])
            diverging = not criterion.divergences_within_bar(div, transitions)
            if not short and not diverging:
                continue
            k_next = k
            if short:
                ess = d["min_ess_bulk"]
                grow = k + 1
                if np.isfinite(ess) and 0 < ess < ESS_MIN:
                    grow = max(grow, int(np.ceil(k * ESS_MIN * ESS_SPARE / ess)))
                k_next = max(k, min(grow, s.max_refit_factor))
            ta_next = s.refit_target_accept if diverging and s.refit_target_accept > ta else ta
            what = ", ".join(([f"function-space R-hat {d['max_rhat']:.3f}, bulk ESS {d['min_ess_bulk']:.0f}"]
                              if short else []) +
                             ([f"{div} divergences, past the bar's {DIVERGENT_SHARE_MAX:.1%} of "
                               f"{transitions} transitions"] if diverging else []))
            if k_next == k and ta_next == ta:
                if short and s.max_draws > s.draws:
                    log.warning("%s: group %s misses the bar at %d draws per chain (%s), and sampler.max_draws=%d "
                                "allows no longer fit; the metrics and the report say so", stage, jobs[g].name,
                                k * s.draws, what, s.max_draws)
                if diverging and s.refit_applies:
                    log.warning("%s: group %s still diverges at sampler.refit_target_accept=%s (%d divergences in "
                                "%d transitions); the metrics and the report say so", stage, jobs[g].name, ta, div,
                                transitions)
                continue
            if k_next > k:
                short_at.setdefault(g, {"draws_per_chain": k * s.draws, **{key: float(v) for key, v in d.items()}})
            if ta_next != ta:
                diverged_at.setdefault(g, {"draws_per_chain": k * s.draws, "divergences": int(div),
                                           "transitions": transitions})
            how = []
            if k_next > k:
                how.append(f"with {k_next * s.draws} draws per chain, thinned by {k_next}")
            if ta_next != ta:
                how.append(f"at target_accept {ta_next} (sampler.refit_target_accept)")
            log.info("%s: group %s misses the bar at %d draws per chain (%s); fitting it again %s", stage,
                     jobs[g].name, k * s.draws, what, " and ".join(how))
            by_fit.setdefault((k_next, ta_next), []).append(g)
        pending_next = {}
        for (k, ta), groups in sorted(by_fit.items()):
            again = dataclasses.replace(model, settings=dataclasses.replace(s, draws=k * s.draws, max_draws=0,
                                                                             target_accept=ta))
            refit = cluster.fit_groups(f"{stage}-x{k}" + (f"-ta{ta}" if ta != s.target_accept else ""), again,
                                       [jobs[g] for g in groups])
            compiles.append(refit.compile_seconds)
            for r in refit.results:
                progress.seconds += r.seconds
                thin = _thinned(r, k, s.draws, out[r.index])
                out[r.index] = thin
                d = _group_test_diagnostics(tasks, r.index, thin.posterior, specs, activation)
                if d is not None:
                    diagnostics[r.name] = d
                # k and target_accept only grow, so a group's records are replaced, never dropped
                if k > 1:
                    thinned[r.name] = {"thinned_by": k, "draws_per_chain": k * s.draws, "divergences": r.divergences,
                                       "missed": short_at[r.index]}
                if ta != s.target_accept:
                    raised[r.name] = {"target_accept": ta, "draws_per_chain": k * s.draws,
                                      "divergences": r.divergences, "transitions": s.chains * k * s.draws,
                                      "missed": diverged_at[r.index]}
                pending_next[r.index] = (k, ta, d, r.divergences)
        pending = pending_next
    return out, dict(sorted(thinned.items())), dict(sorted(raised.items())), diagnostics, compiles


def _thinned(r: cluster.GroupResult, k: int, draws: int, before: cluster.GroupResult) -> cluster.GroupResult:
    """A longer run's result with each chain thinned to every ``k``-th draw (``draws`` of them), divergences and
    steps kept whole; seconds and gradients add those of the runs before it."""
    keep = slice(k - 1, None, k)
    post = r.posterior.isel(draw=keep).assign_coords(draw=np.arange(draws))
    stats = r.sample_stats.isel(draw=keep).assign_coords(draw=np.arange(draws))
    for name, reduce in (("diverging", np.any), ("n_steps", np.sum)):
        if name in r.sample_stats:
            da = r.sample_stats[name].transpose("chain", "draw", ...)
            blocks = da.values.reshape(da.shape[0], draws, k, *da.shape[2:])
            stats[name] = (da.dims, reduce(blocks, axis=2).astype(da.dtype))
    grads = None if r.grad_evals is None or before.grad_evals is None else r.grad_evals + before.grad_evals
    return dataclasses.replace(r, posterior=post, sample_stats=stats, seconds=r.seconds + before.seconds,
                               grad_evals=grads, divergences=r.divergences)
