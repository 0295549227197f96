"""Stage ``fit_informed``: one flat BNN per group with the informed MvNormal layer priors
(:class:`hbnn.InformedBNN`)."""

from __future__ import annotations

from pathlib import Path

from hbnn.api.estimators import InformedBNN
from hbnn.config import Params
from hbnn.files.io import check_made_with, load_dataset
from hbnn.fitting.common import write_fit
from hbnn.pipeline.stages import load_run_tasks


def fit_informed(
    params: Params, tasks_path: Path, prior_path: Path, trace_out: Path, metrics_out: Path, timing_out: Path
) -> dict:
    """Fit one BNN per group with the informed prior of ``prior_path`` to ``data/tasks.nc`` and write its trace,
    metrics and timing.

    Parameters
    ----------
    params : hbnn.config.Params
        The run's params: the estimator's settings (:meth:`hbnn.api.base.BNNEstimator.from_params`).
    tasks_path : pathlib.Path
        The tasks (``make_data``'s output).
    prior_path : pathlib.Path
        The informed prior (``derive_prior``'s output), which must have been made with ``params``.
    trace_out, metrics_out, timing_out : pathlib.Path
        Where the trace, headline metrics and timing go (:func:`hbnn.fitting.common.write_fit`).

    Returns
    -------
    dict
        The detail metrics written.

    Raises
    ------
    hbnn.errors.InputError
        If the tasks or prior file is missing, damaged, made with other params or does not fit the network, or
        the fit is estimated past ``params.limits``.
    """
    tasks = load_run_tasks(tasks_path, params)
    with load_dataset(prior_path, "prior file") as prior:
        check_made_with(prior.attrs, params, prior_path, "derive_prior")
    fit = InformedBNN.from_params(params, prior=prior_path).fit_tasks(tasks)
    return write_fit(fit, params, trace_out, metrics_out, timing_out)
