"""Stage ``fit_flat``: one flat BNN per group."""

from __future__ import annotations

from pathlib import Path

from hbnn.config import Params
from hbnn.data import load_tasks
from hbnn.kernel import FlatDensity
from hbnn.models import build_flat_model
from hbnn.stages import fitting


def fit_flat(params: Params, tasks_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path) -> dict:
    """One flat BNN per group, ``Normal(0, prior_sd)`` weights."""
    m = params.model
    tasks = load_tasks(tasks_path, m.likelihood, params)
    fitting.enforce_budget("fit_flat", params, tasks)

    def build(X, y):
        return build_flat_model(X, y, tasks.features, m.hidden_layers, m.prior_sd,
                                minibatch_size=fitting.minibatch(params, "fit_flat"), likelihood=m.likelihood,
                                noise_sd=m.noise_sd, bias=m.bias)

    def density(X, y):
        return FlatDensity.on_rows(X, y, m.hidden_layers, m.bias, m.likelihood, m.noise_sd, prior_sd=m.prior_sd)

    sampled = fitting.fit_per_group("fit_flat", params, tasks, build, density)
    return fitting.finish_fit("fit_flat", params, tasks, sampled, trace_out, metrics_out, timing_out)
