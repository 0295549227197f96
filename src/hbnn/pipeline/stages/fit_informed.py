"""Stage ``fit_informed``: one flat BNN per group with the informed MvNormal layer priors."""

from __future__ import annotations

from pathlib import Path

from hbnn.config import Params
from hbnn.data.tasks import load_tasks
from hbnn.fitting import common as fitting
from hbnn.fitting import per_group
from hbnn.fitting.models import informed_model
from hbnn.model.prior import load_prior


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
