"""Stage ``fit_flat``: one flat BNN per group."""

from __future__ import annotations

from pathlib import Path

from hbnn.config import Params
from hbnn.data.tasks import load_tasks
from hbnn.fitting import common as fitting
from hbnn.fitting import per_group
from hbnn.fitting.models import flat_model


def fit_flat(params: Params, tasks_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path) -> dict:
    """One flat BNN per group, ``Normal(0, prior_sd)`` weights."""
    tasks = load_tasks(tasks_path, params.model.likelihood, params)
    spec = fitting.model_spec(params, tasks)
    settings = params.sampler_for("fit_flat")
    fitting.enforce_budget("fit_flat", params, tasks)
    sampled = per_group.fit_per_group("fit_flat", settings, spec, tasks, *flat_model(spec, settings, "fit_flat"))
    return fitting.finish_fit("fit_flat", params, spec, tasks, sampled, trace_out, metrics_out, timing_out,
                              settings_extra={"prior_sd": spec.prior_sd})
