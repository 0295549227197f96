"""The report's figures and numbers computed from each model's trace (its surfaces, calibration, PSIS-LOO and
test-row lpd), one model and one group at a time, in worker processes (:func:`all_model_outputs`); the figures drawn
from the metrics files are :mod:`hbnn.report.metric_figures`'.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from scipy.special import expit

from hbnn.config import Params, ReportParams
from hbnn.data.tasks import Split, Tasks
from hbnn.diagnostics import evaluation
from hbnn.diagnostics.evaluation import reliability
from hbnn.diagnostics.predictions import evaluate_groups, group_extra, group_weights
from hbnn.files.io import close_trace, load_trace
from hbnn.model import forward, likelihoods
from hbnn.model.network import LayerSpec
from hbnn.pipeline.transfer import row_lpd
from hbnn.pipeline.variants import BY_NAME
from hbnn.report import plots
from hbnn.report.inputs import load_vars
from hbnn.report.numbers import (
    LABELS,
    surface_points,
    surface_stats,
    thin_indices,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SurfaceSetup:
    """What the surfaces show: the likelihood's function-space quantity (``P(y = 1)``, a mean, a rate).

    ``centre`` holds every feature's training mean (the value of features beyond
    the first two); ``scale = (y_mean, y_sd)`` maps stored labels to their units;
    ``value_range`` fixes the colour scale of predictions and training labels
    across pages and models (``None`` for probabilities, which span 0 to 1).

    Parameters
    ----------
    centre : numpy.ndarray
        Every feature's training mean.
    features : tuple of str
        The feature names.
    likelihood : hbnn.model.likelihoods.base.Likelihood, optional
        The table's likelihood (Bernoulli by default).
    scale : tuple of float, default (0.0, 1.0)
        ``(y_mean, y_sd)``.
    value_range : tuple of float, optional
        The colour scale's range.
    axis_labels : tuple of str, optional
        The axes' labels (``None``: the default ``x1``, ``x2``).
    activation : str, default "tanh"
        The network's hidden units' activation.
    """

    centre: np.ndarray
    features: tuple[str, ...]
    likelihood: likelihoods.Likelihood = likelihoods.LIKELIHOODS["bernoulli"]
    scale: tuple[float, float] = (0.0, 1.0)
    value_range: tuple[float, float] | None = None
    axis_labels: tuple[str, str] | None = None
    activation: str = "tanh"  # the network's hidden units'

    @staticmethod
    def of(tasks: Tasks, activation: str) -> SurfaceSetup:
        """The setup for a tasks file's data and likelihood.

        Parameters
        ----------
        tasks : hbnn.data.tasks.Tasks
            The run's groups and splits.
        activation : str
            The network's hidden units' activation.

        Returns
        -------
        SurfaceSetup
            Predictions of a regression or count model coloured on the 1% to 99% quantiles of its training labels.
        """
        train = tasks.split("train")
        centre = train.X.mean(axis=0)
        labels = None
        if tasks.ds.attrs.get("source") == "table":
            labels = (f"{tasks.features[0]} (standardised)", f"{tasks.features[1]} (standardised)")
        lik, scale = likelihoods.get(tasks.likelihood), (tasks.y_mean, tasks.y_sd)
        if lik.classifier:
            return SurfaceSetup(centre, tuple(tasks.features), lik, scale, axis_labels=labels, activation=activation)
        y = lik.mean_label(train.y, *scale)
        return SurfaceSetup(centre, tuple(tasks.features), lik, scale,
                            (float(np.quantile(y, 0.01)), float(np.quantile(y, 0.99))), labels, activation)

    def values(self) -> Callable[[np.ndarray], np.ndarray]:
        """The plotted quantity as a function of network outputs.

        Returns
        -------
        callable
            SciPy's ``expit`` itself where the likelihood's mean is the Bernoulli's (the logistic link), which
            :func:`hbnn.report.numbers.surface_stats` computes in one compiled pass with its sums; else the
            likelihood's mean in the labels' units.
        """
        if type(self.likelihood).mean is likelihoods.Bernoulli.mean:
            return expit
        return functools.partial(self.likelihood.mean, y_mean=self.scale[0], y_sd=self.scale[1])


def model_surfaces(
    variant: str, post: xr.Dataset, specs: Sequence[LayerSpec], names: Sequence[str], train: Split, rp: ReportParams,
    setup: SurfaceSetup | None = None, groups: Sequence[int] | None = None,
) -> tuple[dict[str, bytes], int]:
    """Decision-surface and uncertainty pages of one model, for every group or those in ``groups``.

    Each group's surface is computed once (mean and sd together) from
    ``surface_draws`` draws thinned evenly over all chains and draws; only one
    page of surfaces is held at a time.

    Parameters
    ----------
    variant : str
        The model (``flat``, ``hierarchical``, ``informed``).
    post : xarray.Dataset
        Its posterior's weights.
    specs : sequence of hbnn.model.network.LayerSpec
        The network's layers.
    names : sequence of str
        The group names.
    train : hbnn.data.tasks.Split
        The training rows, drawn over the surfaces.
    rp : hbnn.config.ReportParams
        The report's settings.
    setup : SurfaceSetup, optional
        What the surfaces show (default: two features, ``P(y = 1)``).
    groups : sequence of int, optional
        Indices into ``names`` of the groups drawn, in the order drawn (default: every group in order;
        :func:`hbnn.report.selection.choose_surface_groups`).

    Returns
    -------
    tuple of (dict of str to bytes, int)
        ``({file name: png}, draws used)``.
    """
    setup = setup or SurfaceSetup(np.zeros(2), ("x1", "x2"))
    axis, points = surface_points(rp.grid_limit, rp.grid_size, setup.centre)
    lik = setup.likelihood
    n_chain, n_draw = post.sizes["chain"], post.sizes["draw"]
    keep = thin_indices(n_chain * n_draw, rp.surface_draws)
    drawn = list(range(len(names))) if groups is None else list(groups)
    page_list = [[drawn[k] for k in page] for page in plots.pages(len(drawn), rp.panels_per_page)]
    width = max(2, len(str(len(page_list))))
    of = f"; {len(drawn)} chosen groups of {len(names)}" if len(drawn) < len(names) else ""
    out = {}
    for p, page in enumerate(page_list, start=1):
        means, sds, points_on_page = [], [], []
        for g in page:
            w = [x.reshape(n_chain * n_draw, *x.shape[2:])[keep] for x in group_weights(post, specs, names[g])]
            mean, sd = surface_stats(w, points, setup.activation, setup.values())
            means.append(mean.reshape(axis.size, axis.size))
            sds.append(sd.reshape(axis.size, axis.size))
            rows = train.rows(g)
            y = lik.mean_label(train.y[rows], *setup.scale)
            points_on_page.append((train.X[rows][:, :2], y))
        titles = [names[g] for g in page]
        (mean_title, sd_title), prefix = lik.surface_titles, "" if lik.classifier else "value_"
        kinds = ((f"{prefix}mean", means, "surface", mean_title), (f"{prefix}sd", sds, "uncertainty", sd_title))
        held = f"; {', '.join(setup.features[2:])} at training mean" if len(setup.features) > 2 else ""
        boundary = np.stack(means) if lik.classifier else None  # the 0.5 contour, drawn on the sd pages too
        for kind, fields, stem, what in kinds:
            fig, _ = plots.plot_surface_page(np.stack(fields), titles, rp.grid_limit, points_on_page, kind,
                                             title=f"{LABELS[variant]}: {what}{held} (page {p}/{len(page_list)}{of})",
                                             axis_labels=setup.axis_labels, value_range=setup.value_range,
                                             boundary=boundary)
            out[f"{stem}_{variant}_p{p:0{width}d}.png"] = plots.png_bytes(fig)
        log.info("report: %s surfaces page %d/%d done", variant, p, len(page_list))
    return out, int(keep.size)


@dataclass
class ModelOutputs:
    """What the report takes from one model's trace: its surface pages ``{file name: png}`` (none with a single
    feature), the draws they used, its reliability table on the pooled test rows (classifiers only, else
    ``None``), its PSIS-LOO (``None`` without a ``log_likelihood`` group) and the log predictive density of each
    test row in the tasks' group-sorted test order (:func:`hbnn.pipeline.transfer.row_lpd`), which the report's
    first line compares paired across models.

    Parameters
    ----------
    pages : dict of str to bytes
    used_draws : int
    calibration : dict or None
    loo : object
        :func:`hbnn.diagnostics.evaluation.psis_loo`'s result, or ``None``.
    row_lpd : numpy.ndarray
    """

    pages: dict[str, bytes]
    used_draws: int
    calibration: dict | None
    loo: Any
    row_lpd: np.ndarray


def model_outputs(variant: str, path: Path, specs: Sequence[LayerSpec], activation: str, tasks: Tasks,
                  rp: ReportParams, params: Params, groups: Sequence[int] | None = None) -> ModelOutputs:
    """:class:`ModelOutputs` of the trace of ``variant`` at ``path`` (checked by the caller; a network of ``specs``
    whose hidden units are ``activation``'s), which it opens, reads and closes: the report runs one per model in
    worker processes (:func:`all_model_outputs`).

    Parameters
    ----------
    variant : str
        The model.
    path : pathlib.Path
        Its trace.
    specs : sequence of hbnn.model.network.LayerSpec
        The network's layers.
    activation : str
        The hidden units' activation.
    tasks : hbnn.data.tasks.Tasks
        The run's groups and splits.
    rp : hbnn.config.ReportParams
        The report's settings.
    params : hbnn.config.Params
        The run's params, which the trace must have been fitted with.
    groups : sequence of int, optional
        The groups whose surfaces are drawn (:func:`model_surfaces`; default every group). Every other output
        covers every group.

    Returns
    -------
    ModelOutputs
    """
    idata = load_trace(path, variant, groups=(), params=params, only=("posterior", "log_likelihood"),
                       stage=BY_NAME[variant].stage)
    lik = likelihoods.get(tasks.likelihood)
    try:
        post = load_vars(idata, [s.var for s in specs] + ([lik.extra] if lik.extra else []))
        loo = None
        if "log_likelihood" in idata.groups():
            loo = evaluation.psis_loo(idata.log_likelihood["y"].transpose("chain", "draw", "obs").values)
    finally:
        close_trace(idata)
    pages, used = {}, 0
    if tasks.n_features >= 2:
        pages, used = model_surfaces(variant, post, specs, tasks.group_names, tasks.split("train"), rp,
                                     SurfaceSetup.of(tasks, activation), groups)
    names = tasks.group_names
    test_draws = evaluate_groups(tasks, lambda g: group_weights(post, specs, names[g]), activation, ("test",),
                                 noise_of=lambda g: group_extra(post, lik.extra, names[g]))["test"]
    calibration = None
    if lik.classifier:  # a classifier's quantity is P(y = 1): its mean over the draws is the predictive probability
        mean = [d.mean(axis=(0, 1)) for d in test_draws["draws"]]
        calibration = reliability(np.concatenate(mean) if mean else np.zeros(0), tasks.split("test").y)
    return ModelOutputs(pages, used, calibration, loo, row_lpd(lik, test_draws))


def all_model_outputs(paths: dict[str, Path], specs: Sequence[LayerSpec], activation: str, tasks: Tasks,
                      rp: ReportParams, params: Params, groups: Sequence[int] | None = None
                      ) -> contextlib.AbstractContextManager[Callable[[], dict[str, ModelOutputs]]]:
    """Start :func:`model_outputs` for every model at once, each in a process of its own, and yield a function
    that waits for them (``{model: outputs}`` in ``paths`` order): the surfaces take most of the report's time,
    and the models' are independent, so the report's other work runs beside them on the machine's other cores.

    The workers are forked (they inherit the loaded libraries instead of importing them again, which takes
    seconds: benchmarks/FINDINGS.md, section 'Measurements behind code comments') while no trace is
    open in this process. Where fork is not available or not safe (a process that has loaded JAX, which runs
    threads: library use, the test suite), or on one core, they run here, one after another, when the function
    is called. Leaving the block early stops the workers.

    Parameters
    ----------
    paths : dict of str to pathlib.Path
        Each model's trace.
    specs, activation, tasks, rp, params, groups
        As for :func:`model_outputs`.

    Returns
    -------
    contextlib.AbstractContextManager
        Yields the function that waits for ``{model: ModelOutputs}``.
    """
    if "fork" not in multiprocessing.get_all_start_methods() or "jax" in sys.modules or (os.cpu_count() or 1) < 2:
        return contextlib.nullcontext(lambda: {v: model_outputs(v, p, specs, activation, tasks, rp, params, groups)
                                               for v, p in paths.items()})
    return _forked(paths, specs, activation, tasks, rp, params, groups)


_STOPS = {signal.SIGINT, signal.SIGTERM}
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _end_with(parent: int) -> None:
    """End this forked process when ``parent`` (the process that forked it) ends, however it ends: on Linux the
    kernel sends it SIGKILL then (``prctl(PR_SET_PDEATHSIG)``), so a ``kill -9`` of the report leaves no worker
    blocked for ever on a pipe that no one reads. Where that is not available, nothing; a parent already gone
    (before the request took effect) ends this process at once. (Linux sends the signal when the *thread* that
    forked ends: :func:`_forked` forks and joins its workers in one thread, so that is never before the parent
    is done with them.)"""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            unsigned = ctypes.c_ulong
            if libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), unsigned(signal.SIGKILL), unsigned(0), unsigned(0),
                          unsigned(0)) != 0:
                log.debug("report worker: prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
        except (OSError, AttributeError):  # no prctl in this libc: the parent's own cleanup still applies
            pass
    if os.getppid() != parent:
        os._exit(1)


def _worker(conn, parent: int, variant: str, path: Path, specs, activation, tasks, rp, params, groups) -> None:
    """A forked worker: :func:`model_outputs` of one model, sent back through ``conn`` as ``("ok", outputs)`` or
    ``("error", exception)``. It ignores Ctrl-C (sent to the whole process group): the parent reports the
    interrupt once and stops the workers with SIGTERM, which ends them quietly; if the parent is killed
    outright, the worker ends with it (:func:`_end_with`)."""
    _end_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
    try:
        result = ("ok", model_outputs(variant, path, specs, activation, tasks, rp, params, groups))
    except Exception as err:  # noqa: BLE001 - raised again in the parent: an InputError stays one error line
        result = ("error", err)
    try:
        conn.send(result)
    except Exception as err:  # noqa: BLE001 - an exception that does not pickle: its text
        conn.send(("error", RuntimeError(f"{type(err).__name__}: {err}")))
    conn.close()


def _result(variant: str, process, conn) -> ModelOutputs:
    try:
        status, value = conn.recv()
    except EOFError:  # the worker ended without sending anything
        process.join()
        raise RuntimeError(f"the report's worker for the {variant} model ended without a result (exit code "
                           f"{process.exitcode})") from None
    if status == "error":
        raise value
    return value


@contextlib.contextmanager
def _forked(paths, specs, activation, tasks, rp, params, groups):
    """One forked process and one pipe per model. The parent closes each pipe's sending end once the worker has
    it, so a worker that dies reads as the end of its pipe, never as a wait; Ctrl-C and SIGTERM are held back
    while the workers start, so none is forked still holding this process's handler."""
    context = multiprocessing.get_context("fork")
    parent = os.getpid()
    workers = {}
    forward.prepare(activation)  # compiled once, here: the workers inherit it and neither compile nor cache anything
    finished = False
    try:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        try:
            for v, p in paths.items():
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_worker,
                                          args=(send, parent, v, p, specs, activation, tasks, rp, params, groups),
                                          daemon=True)
                workers[v] = (process, receive)
                process.start()
                send.close()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a signal that arrived meanwhile is raised here
        yield lambda: {v: _result(v, process, receive) for v, (process, receive) in workers.items()}
        finished = True
    finally:
        for process, receive in workers.values():  # an error or Ctrl-C: no worker left behind
            if process.pid is not None:  # started
                if not finished:
                    process.terminate()
                process.join()
            receive.close()
