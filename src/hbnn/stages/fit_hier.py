"""Stage ``fit_hier``: the non-centred hierarchical BNN over all groups."""

from __future__ import annotations

from pathlib import Path

from hbnn import evaluation
from hbnn.config import Params
from hbnn.data import load_tasks
from hbnn.inference import Sampler
from hbnn.models import build_hierarchical_minibatch_model, build_hierarchical_model
from hbnn.network import layer_specs
from hbnn.stages import fitting
from hbnn.variants import STAGE_KEYS, derive_seed


def fit_hier(params: Params, tasks_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path) -> dict:
    """The non-centred hierarchical BNN over all groups."""
    m = params.model
    tasks = load_tasks(tasks_path, m.likelihood, params)
    estimate = fitting.enforce_budget("fit_hier", params, tasks)
    batch = fitting.minibatch(params, "fit_hier")
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
    settings = params.sampler_for("fit_hier")
    sampler = Sampler(model, settings)
    fit = sampler.sample(derive_seed(settings.seed, STAGE_KEYS["fit_hier"]), expected_seconds=60 * estimate.minutes)
    posterior = fit.posterior.posterior
    specs = layer_specs(tasks.n_features, m.hidden_layers)
    sd_vars = [f"sd_{s.name}" for s in specs]
    return fitting.finish_fit(
        "fit_hier", params, tasks, posterior, fit.posterior.sample_stats,
        fitting.Cost(fit.seconds, sampler.compile_seconds, fit.grad_evals), trace_out, metrics_out, timing_out,
        extra_diagnostics=evaluation.scalar_diagnostics(posterior, sd_vars),
    )
