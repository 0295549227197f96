"""Stage ``fit_informed``: one flat BNN per group with the informed MvNormal layer priors."""

from __future__ import annotations

from pathlib import Path

from hbnn.config import Params, SamplerParams
from hbnn.data.tasks import load_tasks
from hbnn.density.densities import InformedDensity
from hbnn.model.prior import load_prior
from hbnn.model.spec import ModelSpec
from hbnn.pipeline.stages import fitting, per_group


def fit_informed(
    params: Params, tasks_path: Path, prior_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path
) -> dict:
    """One flat BNN per group with the informed MvNormal layer priors."""
    tasks = load_tasks(tasks_path, params.model.likelihood, params)
    spec = fitting.model_spec(params, tasks)
    settings = params.sampler_for("fit_informed")
    fitting.enforce_budget("fit_informed", params, tasks)
    layer_prior = load_prior(prior_path, spec.layers, params)
    sampled = per_group.fit_per_group("fit_informed", settings, spec, tasks,
                                      *informed_model(spec, settings, layer_prior, "fit_informed"))
    return fitting.finish_fit("fit_informed", params, spec, tasks, sampled, trace_out, metrics_out, timing_out,
                              settings_extra={"prior_file": str(prior_path)})


def informed_model(spec: ModelSpec, settings: SamplerParams, layer_prior: dict, stage: str):
    """``build(X, y)``, the BNN of ``spec`` with the informed prior ``layer_prior`` as a PyMC model
    (:func:`hbnn.model.builders.build_informed_model`, imported only when built), and ``density(X, y)``, its
    hand-written log density, on one group's rows, for fit ``stage`` sampled with ``settings`` (``None`` where the
    model has none: :func:`hbnn.pipeline.stages.fitting.hand_written`)."""
    batch = fitting.minibatch(settings)

    def build(X, y):
        from hbnn.model.builders import build_informed_model

        return build_informed_model(X, y, spec.features, spec.hidden_layers, layer_prior, minibatch_size=batch,
                                    likelihood=spec.likelihood, noise_sd=spec.noise_sd, bias=spec.bias,
                                    activation=spec.activation)

    def density(X, y):
        return InformedDensity.on_rows(X, y, spec.hidden_layers, spec.bias, spec.likelihood, spec.noise_sd,
                                       prior=layer_prior, features=spec.features, activation=spec.activation)

    return build, density if fitting.hand_written(spec, settings, stage) else None
