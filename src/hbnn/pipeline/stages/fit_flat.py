"""Stage ``fit_flat``: one flat BNN per group."""

from __future__ import annotations

from pathlib import Path

from hbnn.config import Params, SamplerParams
from hbnn.data.tasks import load_tasks
from hbnn.density.densities import FlatDensity
from hbnn.model.spec import ModelSpec
from hbnn.pipeline.stages import fitting, per_group


def fit_flat(params: Params, tasks_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path) -> dict:
    """One flat BNN per group, ``Normal(0, prior_sd)`` weights."""
    tasks = load_tasks(tasks_path, params.model.likelihood, params)
    spec = fitting.model_spec(params, tasks)
    settings = params.sampler_for("fit_flat")
    fitting.enforce_budget("fit_flat", params, tasks)
    sampled = per_group.fit_per_group("fit_flat", settings, spec, tasks, *flat_model(spec, settings, "fit_flat"))
    return fitting.finish_fit("fit_flat", params, spec, tasks, sampled, trace_out, metrics_out, timing_out,
                              settings_extra={"prior_sd": spec.prior_sd})


def flat_model(spec: ModelSpec, settings: SamplerParams, stage: str):
    """``build(X, y)``, the flat BNN of ``spec`` as a PyMC model (:func:`hbnn.model.builders.build_flat_model`,
    imported only when built), and ``density(X, y)``, its hand-written log density, on one group's rows, for fit
    ``stage`` sampled with ``settings`` (``None`` where the model has none:
    :func:`hbnn.pipeline.stages.fitting.hand_written`)."""
    batch = fitting.minibatch(settings)

    def build(X, y):
        from hbnn.model.builders import build_flat_model

        return build_flat_model(X, y, spec.features, spec.hidden_layers, spec.prior_sd, minibatch_size=batch,
                                likelihood=spec.likelihood, noise_sd=spec.noise_sd, bias=spec.bias,
                                activation=spec.activation)

    def density(X, y):
        return FlatDensity.on_rows(X, y, spec.hidden_layers, spec.bias, spec.likelihood, spec.noise_sd,
                                   prior_sd=spec.prior_sd, features=spec.features, activation=spec.activation)

    return build, density if fitting.hand_written(spec, settings, stage) else None
