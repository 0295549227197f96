"""Stage ``fit_flat``: one flat BNN per group."""

from __future__ import annotations

from pathlib import Path

from hbnn.config import Params
from hbnn.data.tasks import Tasks, load_tasks
from hbnn.density.densities import FlatDensity
from hbnn.pipeline.stages import fitting, per_group


def fit_flat(params: Params, tasks_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path) -> dict:
    """One flat BNN per group, ``Normal(0, prior_sd)`` weights."""
    tasks = load_tasks(tasks_path, params.model.likelihood, params)
    fitting.enforce_budget("fit_flat", params, tasks)
    sampled = per_group.fit_per_group("fit_flat", params, tasks, *flat_model(params, tasks, "fit_flat"))
    return fitting.finish_fit("fit_flat", params, tasks, sampled, trace_out, metrics_out, timing_out,
                              settings_extra={"prior_sd": params.model.prior_sd})


def flat_model(params: Params, tasks: Tasks, stage: str):
    """``build(X, y)``, the flat BNN as a PyMC model (:func:`hbnn.model.builders.build_flat_model`, imported only when
    built), and ``density(X, y)``, its hand-written log density, on one group's rows, for fit ``stage`` (``None`` where
    the model has none: :func:`hbnn.pipeline.stages.fitting.hand_written`)."""
    m = params.model
    batch = fitting.minibatch(params, stage)

    def build(X, y):
        from hbnn.model.builders import build_flat_model

        return build_flat_model(X, y, tasks.features, m.hidden_layers, m.prior_sd, minibatch_size=batch,
                                likelihood=m.likelihood, noise_sd=m.noise_sd, bias=m.bias, activation=m.activation)

    def density(X, y):
        return FlatDensity.on_rows(X, y, m.hidden_layers, m.bias, m.likelihood, m.noise_sd, prior_sd=m.prior_sd,
                                   features=tuple(tasks.features), activation=m.activation)

    return build, density if fitting.hand_written(params, stage) else None
