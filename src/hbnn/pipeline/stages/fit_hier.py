"""Stage ``fit_hier``: the non-centred hierarchical BNN over all groups."""

from __future__ import annotations

from pathlib import Path

from hbnn.config import Params
from hbnn.data.tasks import load_tasks
from hbnn.fitting import common as fitting
from hbnn.fitting.models import sample_hierarchical


def fit_hier(params: Params, tasks_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path) -> dict:
    """The non-centred hierarchical BNN over all groups."""
    tasks = load_tasks(tasks_path, params.model.likelihood, params)
    spec = fitting.model_spec(params, tasks)
    sampled = sample_hierarchical("fit_hier", params, spec, tasks)
    return fitting.finish_fit("fit_hier", params, spec, tasks, sampled, trace_out, metrics_out, timing_out)
