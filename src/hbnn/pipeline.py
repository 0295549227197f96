"""What each DVC stage does, as functions of (params, input paths, output paths).

The scripts in ``stages/`` only parse paths and call these. Inputs are checked
before anything is sampled; outputs are written atomically at the very end.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import arviz as az
import numpy as np
import xarray as xr

from hbnn import budget, evaluation, prior
from hbnn.config import Params
from hbnn.data import Tasks, make_tasks
from hbnn.inference import Sampler, derive_seed
from hbnn.io import (
    InputError,
    as_builtin,
    load_dataset,
    load_trace,
    provenance,
    settings_from_attrs,
    staged_outputs,
    stamp,
)
from hbnn.models import (
    build_flat_model,
    build_hierarchical_minibatch_model,
    build_hierarchical_model,
    build_informed_model,
    layer_specs,
)

log = logging.getLogger(__name__)

# Distinct keys so stages never share a sampler stream for the same group.
STAGE_KEYS = {"fit_flat": 1, "fit_hier": 2, "fit_informed": 3, "derive_prior": 4}
VARIANTS = {"fit_flat": "flat", "fit_hier": "hierarchical", "fit_informed": "informed"}
# The params each stage reads, exactly as listed under its `params:` in dvc.yaml (a test
# keeps the two equal); the provenance hash in each output covers these and nothing else.
STAGE_PARAMS = {
    # model.likelihood: labels are checked (0/1 for bernoulli) and stored per likelihood.
    "make_data": ("n_groups", "seed", "data", "model.likelihood"),
    "fit_flat": ("model", "sampler"),
    "fit_hier": ("model.hidden_layers", "model.likelihood", "model.noise_sd", "sampler"),
    "derive_prior": ("prior",),
    "fit_informed": ("model.hidden_layers", "model.likelihood", "model.noise_sd", "sampler"),
}


# ----------------------------------------------------------------------------- data
def make_data(params: Params, out: Path) -> None:
    """Generate (moons) or read and check (table) the tasks and write ``data/tasks.nc``.

    For tables ``n_groups`` is not used: the groups are the table's.
    """
    estimate = budget.data_estimate(params)
    if estimate is not None:
        budget.enforce(estimate, params)
    ds = make_tasks(params)
    ds.attrs.update(provenance("make_data", params.data.source, params.section_hash(*STAGE_PARAMS["make_data"]),
                               {"n_groups": params.n_groups, "seed": params.seed,
                                "data": dataclasses.asdict(params.data),
                                "likelihood": params.model.likelihood}))
    with staged_outputs() as outputs:
        outputs.write_netcdf(ds, out)
    log.info("wrote %s: %d groups, %d rows", out, Tasks(ds).n_groups, ds.sizes["obs"])


def _enforce_budget(stage: str, params: Params, tasks: Tasks) -> None:
    """Refuse (before any compile or sampling) a fit estimated past ``params.limits``."""
    n_train = tasks.split("train").y.size
    budget.enforce(budget.fit_estimate(stage, params, tasks.n_groups, n_train, tasks.ds.sizes["obs"] - n_train,
                                       tasks.n_features), params)


def load_tasks(path: Path, likelihood: str | None = None) -> Tasks:
    """Read ``data/tasks.nc``; with ``likelihood``, check the file was made for it."""
    ds = load_dataset(path, "tasks file", required=("X", "y", "group", "split"))
    tasks = Tasks(ds)
    if likelihood is not None and tasks.likelihood != likelihood:
        raise InputError(f"tasks file {path} was made for model.likelihood={tasks.likelihood!r} but the params say "
                         f"{likelihood!r}; rerun make_data (dvc repro)")
    return tasks


# ----------------------------------------------------------------------------- fits
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


def _settings(params: Params, tasks: Tasks, **extra) -> dict:
    return {
        "sampler": dataclasses.asdict(params.sampler),
        "hidden_layers": list(params.model.hidden_layers),
        "features": tasks.features,
        "likelihood": tasks.likelihood,
        "group_column": tasks.group_column,
        **extra,
    }


def _finish_fit(
    stage: str,
    params: Params,
    tasks: Tasks,
    posterior: xr.Dataset,
    sample_stats: xr.Dataset,
    cost: Cost,
    trace_out: Path,
    metrics_out: Path,
    timing_out: Path,
    extra_diagnostics=None,
    settings_extra: dict | None = None,
) -> dict:
    observed, constant = _observed(tasks)
    idata = az.InferenceData(
        posterior=posterior, sample_stats=sample_stats, observed_data=observed, constant_data=constant
    )
    settings = _settings(params, tasks, **(settings_extra or {}))
    stamp(idata, provenance(stage, VARIANTS[stage], params.section_hash(*STAGE_PARAMS[stage]), settings))
    specs = layer_specs(tasks.n_features, params.model.hidden_layers)
    predictions = evaluation.evaluate_groups(
        tasks,
        lambda g: evaluation.group_weights(posterior, specs, tasks.group_names[g]),
        noise_of=lambda g: evaluation.group_noise(posterior, tasks.group_names[g]),
    )
    metrics = evaluation.fit_metrics(
        tasks,
        predictions,
        divergences=int(sample_stats["diverging"].sum()),
        extra_diagnostics=extra_diagnostics,
    )
    advi_iterations = sample_stats.sizes.get("advi_iteration")
    s = params.sampler
    timing = evaluation.timing_metrics(s.backend, cost.seconds, cost.compile_seconds, cost.grad_evals,
                                       min(s.chains, s.cores), advi_iterations)
    with staged_outputs() as outputs:
        outputs.write_netcdf(idata, trace_out)
        outputs.write_json(as_builtin(timing), timing_out)
        outputs.write_json(as_builtin(metrics), metrics_out)
    score = "accuracy" if "accuracy" in metrics["train"] else "rmse"
    log.info(
        "%s: train %s %.4f, test %s %.4f, %d divergences, %.1fs sampling",
        stage, score, metrics["train"][score], score, metrics["test"].get(score, float("nan")),
        metrics["sampling"]["divergences"], cost.seconds,
    )
    return metrics


@dataclass(frozen=True)
class Cost:
    """Wall-clock seconds of a stage's sampling and compiling, and its gradient evaluations."""

    seconds: float
    compile_seconds: float
    grad_evals: int | None


def _minibatch(params: Params) -> int | None:
    """Rows per ADVI gradient step, or ``None`` for full-batch likelihoods (and NUTS)."""
    s = params.sampler
    return (s.advi.minibatch_size or None) if s.backend == "advi" else None


def _fit_per_group(stage: str, params: Params, tasks: Tasks, build) -> tuple[xr.Dataset, xr.Dataset, Cost]:
    """Fit ``build(X, y)`` to every group's training rows, compiling it once.

    Returns posterior and sample stats stacked along a ``group`` dim, and the
    summed cost over groups.
    """
    train = tasks.split("train")
    first = train.rows(0)
    sampler = Sampler(build(train.X[first], train.y[first]), params.sampler)
    posts, stats, seconds, grads = [], [], 0.0, []
    for g, name in enumerate(tasks.group_names):
        rows = train.rows(g)
        fit = sampler.sample(
            derive_seed(params.sampler.seed, STAGE_KEYS[stage], g),
            data={"x": train.X[rows], "y": train.y[rows]},
        )
        posts.append(fit.posterior.posterior.expand_dims(group=[name]))
        stats.append(fit.posterior.sample_stats.expand_dims(group=[name]))
        seconds += fit.seconds
        grads.append(fit.grad_evals)
        log.info("%s: group %s (%d rows) sampled in %.1fs", stage, name, rows.size, fit.seconds)

    def stack(parts):
        ds = xr.concat(parts, dim="group", combine_attrs="drop_conflicts")
        order = ["chain", "draw", "group"]
        return ds.transpose(*order, ...)

    grad_evals = None if any(g is None for g in grads) else sum(grads)
    return stack(posts), stack(stats), Cost(seconds, sampler.compile_seconds, grad_evals)


def fit_flat(params: Params, tasks_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path) -> dict:
    """One flat BNN per group, ``Normal(0, prior_sd)`` weights."""
    m = params.model
    tasks = load_tasks(tasks_path, m.likelihood)
    _enforce_budget("fit_flat", params, tasks)

    def build(X, y):
        return build_flat_model(X, y, tasks.features, m.hidden_layers, m.prior_sd, minibatch_size=_minibatch(params),
                                likelihood=m.likelihood, noise_sd=m.noise_sd)

    posterior, stats, cost = _fit_per_group("fit_flat", params, tasks, build)
    return _finish_fit("fit_flat", params, tasks, posterior, stats, cost, trace_out, metrics_out, timing_out)


def fit_hier(params: Params, tasks_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path) -> dict:
    """The non-centred hierarchical BNN over all groups."""
    m = params.model
    tasks = load_tasks(tasks_path, m.likelihood)
    _enforce_budget("fit_hier", params, tasks)
    batch = _minibatch(params)
    if batch:
        train = tasks.split("train")
        model = build_hierarchical_minibatch_model(
            train.X, train.group, train.y, tasks.group_names, tasks.features, m.hidden_layers, batch,
            likelihood=m.likelihood, noise_sd=m.noise_sd,
        )
    else:
        padded = tasks.padded("train")
        model = build_hierarchical_model(
            padded.X, padded.y, padded.valid, tasks.group_names, tasks.features, m.hidden_layers,
            likelihood=m.likelihood, noise_sd=m.noise_sd,
        )
    sampler = Sampler(model, params.sampler)
    fit = sampler.sample(derive_seed(params.sampler.seed, STAGE_KEYS["fit_hier"]))
    posterior = fit.posterior.posterior
    specs = layer_specs(tasks.n_features, m.hidden_layers)
    sd_vars = [f"sd_{s.name}" for s in specs]
    return _finish_fit(
        "fit_hier", params, tasks, posterior, fit.posterior.sample_stats,
        Cost(fit.seconds, sampler.compile_seconds, fit.grad_evals), trace_out, metrics_out, timing_out,
        extra_diagnostics=evaluation.scalar_diagnostics(posterior, sd_vars),
    )


def fit_informed(
    params: Params, tasks_path: Path, prior_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path
) -> dict:
    """One flat BNN per group with the informed MvNormal layer priors."""
    m = params.model
    tasks = load_tasks(tasks_path, m.likelihood)
    _enforce_budget("fit_informed", params, tasks)
    specs = layer_specs(tasks.n_features, m.hidden_layers)
    layer_prior = load_prior(prior_path, specs)

    def build(X, y):
        return build_informed_model(X, y, tasks.features, m.hidden_layers, layer_prior,
                                    minibatch_size=_minibatch(params), likelihood=m.likelihood, noise_sd=m.noise_sd)

    posterior, stats, cost = _fit_per_group("fit_informed", params, tasks, build)
    return _finish_fit(
        "fit_informed", params, tasks, posterior, stats, cost, trace_out, metrics_out, timing_out,
        settings_extra={"prior_file": str(prior_path)},
    )


# ----------------------------------------------------------------------------- prior
def derive_prior(params: Params, hier_trace: Path, prior_out: Path, metrics_out: Path) -> dict:
    """Fit one MvNormal per layer to new-group weight draws of the hierarchical posterior."""
    p = params.prior
    idata = load_trace(hier_trace, "hierarchical", groups=("posterior",))
    settings = settings_from_attrs(idata.posterior.attrs)
    hidden = tuple(settings.get("hidden_layers", params.model.hidden_layers))
    features = settings.get("features", [str(f) for f in idata.posterior["feature"].values])
    specs = layer_specs(len(features), hidden)
    try:
        mu = prior.layer_arrays(idata.posterior, specs, "mu")
        sd = [idata.posterior[f"sd_{s.name}"].transpose("chain", "draw").values for s in specs]
    except KeyError as err:
        raise InputError(f"trace {hier_trace} lacks hierarchical variable {err}") from err
    n_chains = mu[0].shape[0]
    if p.reference_chain >= n_chains:
        raise InputError(
            f"prior.reference_chain={p.reference_chain} but trace {hier_trace} has only {n_chains} chains"
        )

    alignment = prior.align_to_reference(mu, p.reference_chain)
    if p.align == "chains":
        mu_used, sd_used, chains_used = alignment.mu, sd, list(range(n_chains))
    else:  # reference_chain: one chain, nothing to align
        ref = p.reference_chain
        mu_used = [m[ref : ref + 1] for m in mu]
        sd_used = [s[ref : ref + 1] for s in sd]
        chains_used = [ref]
    flat_mu = [m.reshape(-1, *m.shape[2:]) for m in mu_used]
    flat_sd = [s.reshape(-1) for s in sd_used]
    rng = np.random.default_rng(derive_seed(p.seed, STAGE_KEYS["derive_prior"]))
    draws = prior.new_group_draws(flat_mu, flat_sd, p.draws_per_sample, rng)

    data_vars, layer_meta, layer_metrics = {}, {}, {}
    for s, samples, sd_s in zip(specs, draws, flat_sd, strict=True):
        mean, cov = prior.fit_mvnormal(samples, p.jitter)
        data_vars[f"mean_{s.name}"] = (f"weight_{s.name}", mean)
        data_vars[f"cov_{s.name}"] = ((f"weight_{s.name}", f"weight_{s.name}_col"), cov)
        layer_meta[s.name] = {"shape": list(s.shape), "dims": list(s.dims)}
        layer_metrics[s.name] = {
            "group_sd": {
                "mean": sd_s.mean(),
                "sd": sd_s.std(),
                "q05": np.quantile(sd_s, 0.05),
                "q95": np.quantile(sd_s, 0.95),
            },
            "prior_mean_abs": np.abs(mean).mean(),
            "prior_sd_mean": np.sqrt(np.diag(cov)).mean(),
        }
    ds = xr.Dataset(data_vars)
    ds.attrs.update(provenance("derive_prior", "informed_prior",
                               params.section_hash(*STAGE_PARAMS["derive_prior"]),
                               {"prior": dataclasses.asdict(p), "hidden_layers": list(hidden),
                                "features": list(features), "hier_trace": str(hier_trace)}))
    ds.attrs["layers"] = json.dumps(layer_meta)
    metrics = {
        "draws": {
            "chains_used": len(chains_used),
            "posterior_draws": int(flat_sd[0].size),
            "draws_per_sample": p.draws_per_sample,
            "new_group_draws": int(draws[0].shape[0]),
        },
        "layers": layer_metrics,
        "alignment": {
            f"chain_{c}": {
                "distance_before": alignment.distance_before[c],
                "distance_after": alignment.distance_after[c],
                "relabelled": int(not alignment.symmetries[c].is_identity),
            }
            for c in range(n_chains)
        },
    }
    with staged_outputs() as outputs:
        outputs.write_netcdf(ds, prior_out)
        outputs.write_json(as_builtin(metrics), metrics_out)
    log.info("derive_prior: %d new-group draws per layer from %d chains", draws[0].shape[0], len(chains_used))
    return metrics


def load_prior(path: Path, specs) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read ``priors/informed.nc`` and check its layers match ``specs``."""
    ds = load_dataset(path, "prior file")
    try:
        layers = json.loads(ds.attrs["layers"])
    except (KeyError, ValueError) as err:
        raise InputError(
            f"prior file {path} has no valid 'layers' attribute; it was not written by derive_prior"
        ) from err
    expected = {s.name: list(s.shape) for s in specs}
    found = {name: meta["shape"] for name, meta in layers.items()}
    if found != expected:
        raise InputError(f"prior file {path} has layer shapes {found} but the model needs {expected}")
    out = {}
    for s in specs:
        mean, cov = ds[f"mean_{s.name}"].values, ds[f"cov_{s.name}"].values
        if mean.shape != (s.size,) or cov.shape != (s.size, s.size):
            raise InputError(f"prior file {path}: layer {s.name} has mean {mean.shape} / cov {cov.shape}, "
                             f"expected ({s.size},) / ({s.size}, {s.size})")
        out[s.name] = (mean, cov)
    return out
