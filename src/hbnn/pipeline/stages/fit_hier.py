"""Stage ``fit_hier``: the non-centred hierarchical BNN over all groups (:class:`hbnn.HierarchicalBNN`)."""

from __future__ import annotations

from pathlib import Path

from hbnn.api.estimators import HierarchicalBNN
from hbnn.config import Params
from hbnn.fitting.common import write_fit
from hbnn.pipeline.stages import load_run_tasks


def fit_hier(params: Params, tasks_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path) -> dict:
    """Fit the hierarchical BNN of ``params`` to ``data/tasks.nc`` and write its trace, metrics and timing.

    Parameters
    ----------
    params : hbnn.config.Params
        The run's params: the estimator's settings (:meth:`hbnn.api.base.BNNEstimator.from_params`).
    tasks_path : pathlib.Path
        The tasks (``make_data``'s output).
    trace_out, metrics_out, timing_out : pathlib.Path
        Where the trace, headline metrics and timing go (:func:`hbnn.fitting.common.write_fit`).

    Returns
    -------
    dict
        The detail metrics written.

    Raises
    ------
    hbnn.errors.InputError
        If the tasks file is missing, damaged or made with other params, or the fit is estimated past
        ``params.limits``.
    """
    tasks = load_run_tasks(tasks_path, params)
    fit = HierarchicalBNN.from_params(params).fit_tasks(tasks)
    return write_fit(fit, params, trace_out, metrics_out, timing_out)
