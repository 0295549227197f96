"""Stage ``fit_hier``: the non-centred hierarchical BNN over all groups."""

from __future__ import annotations

from pathlib import Path

from hbnn.config import Params
from hbnn.data.tasks import Tasks, load_tasks
from hbnn.density.densities import HierarchicalDensity
from hbnn.diagnostics import criterion
from hbnn.model.spec import ModelSpec
from hbnn.pipeline.stages import fitting
from hbnn.pipeline.variants import STAGE_KEYS, derive_seed
from hbnn.sampling.sampler import Sampler


def fit_hier(params: Params, tasks_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path) -> dict:
    """The non-centred hierarchical BNN over all groups."""
    tasks = load_tasks(tasks_path, params.model.likelihood, params)
    spec = fitting.model_spec(params, tasks)
    sampled = sample_hierarchical("fit_hier", params, spec, tasks)
    return fitting.finish_fit("fit_hier", params, spec, tasks, sampled, trace_out, metrics_out, timing_out)


def sample_hierarchical(stage: str, params: Params, spec: ModelSpec, tasks: Tasks) -> fitting.Sampled:
    """Check the cost, build and sample the hierarchical model ``spec`` of ``tasks`` (fit ``stage``,
    :data:`hbnn.pipeline.variants.FITS`); the group sds' R-hat and ESS are its extra diagnostics. With ``max_draws`` the
    fit draws on, in blocks, until every group's test points and every group sd meet the bar (or ``max_draws`` is
    reached)."""
    settings = params.sampler_for(stage)
    estimate = fitting.enforce_budget(stage, params, tasks)
    batch = fitting.minibatch(settings)
    density = None  # a hand-written log density of the full-batch model, for the backends that take one
    if batch:
        train = tasks.split("train")

        def model():
            from hbnn.model.builders import build_hierarchical_minibatch_model

            return build_hierarchical_minibatch_model(
                train.X, train.group, train.y, tasks.group_names, spec.features, spec.hidden_layers, batch,
                likelihood=spec.likelihood, noise_sd=spec.noise_sd, bias=spec.bias, activation=spec.activation,
            )
    else:
        padded = tasks.padded("train")

        def model():  # PyMC's model: built where a backend samples it, or to check the hand-written density
            from hbnn.model.builders import build_hierarchical_model

            return build_hierarchical_model(
                padded.X, padded.y, padded.valid, tasks.group_names, spec.features, spec.hidden_layers,
                likelihood=spec.likelihood, noise_sd=spec.noise_sd, bias=spec.bias, activation=spec.activation,
            )
        if fitting.hand_written(spec, settings, stage):
            density = HierarchicalDensity(padded.X, padded.y, padded.counts, spec.hidden_layers, spec.bias,
                                          spec.likelihood, spec.noise_sd, features=spec.features,
                                          groups=tuple(tasks.group_names), activation=spec.activation)
    sampler = Sampler(model, settings, density)
    sd_vars = [f"sd_{s.name}" for s in spec.layers]
    fit = sampler.sample(derive_seed(settings.seed, STAGE_KEYS[stage]),
                         expected_seconds=60 * (estimate.first_minutes or estimate.minutes),
                         until=criterion.ShortfallCheck(tasks, spec.layers, spec.activation, sd_vars))
    posterior = fit.posterior.posterior
    return fitting.Sampled(posterior, fit.posterior.sample_stats,
                           fitting.Cost(fit.seconds, sampler.compile_seconds, fit.grad_evals),
                           criterion.scalar_diagnostics(posterior, sd_vars))
