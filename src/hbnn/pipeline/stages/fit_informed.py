"""Stage ``fit_informed``: one flat BNN per group with the informed MvNormal layer priors."""

from __future__ import annotations

from pathlib import Path

from hbnn.config import Params
from hbnn.data.tasks import Tasks, load_tasks
from hbnn.density.densities import InformedDensity
from hbnn.model.network import layer_specs
from hbnn.model.prior import load_prior
from hbnn.pipeline.stages import fitting, per_group


def fit_informed(
    params: Params, tasks_path: Path, prior_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path
) -> dict:
    """One flat BNN per group with the informed MvNormal layer priors."""
    m = params.model
    tasks = load_tasks(tasks_path, m.likelihood, params)
    fitting.enforce_budget("fit_informed", params, tasks)
    layer_prior = load_prior(prior_path, layer_specs(tasks.n_features, m.hidden_layers, m.bias), params)
    sampled = per_group.fit_per_group("fit_informed", params, tasks,
                                    *informed_model(params, tasks, layer_prior, "fit_informed"))
    return fitting.finish_fit("fit_informed", params, tasks, sampled, trace_out, metrics_out, timing_out,
                              settings_extra={"prior_file": str(prior_path)})


def informed_model(params: Params, tasks: Tasks, layer_prior: dict, stage: str):
    """``build(X, y)``, the BNN with the informed prior ``layer_prior`` as a PyMC model
    (:func:`hbnn.model.builders.build_informed_model`, imported only when built), and ``density(X, y)``, its
    hand-written log density, on one group's rows, for fit ``stage`` (``None`` where the model has none:
    :func:`hbnn.pipeline.stages.fitting.hand_written`)."""
    m = params.model
    batch = fitting.minibatch(params, stage)

    def build(X, y):
        from hbnn.model.builders import build_informed_model

        return build_informed_model(X, y, tasks.features, m.hidden_layers, layer_prior, minibatch_size=batch,
                                    likelihood=m.likelihood, noise_sd=m.noise_sd, bias=m.bias,
                                    activation=m.activation)

    def density(X, y):
        return InformedDensity.on_rows(X, y, m.hidden_layers, m.bias, m.likelihood, m.noise_sd, prior=layer_prior,
                                       features=tuple(tasks.features), activation=m.activation)

    return build, density if fitting.hand_written(params, stage) else None
