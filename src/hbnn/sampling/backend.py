"""What every sampler backend is: a model compiled once, fitted by :meth:`Backend.run`, and its results."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hbnn.config import SamplerParams
from hbnn.files.trace import Trace

if TYPE_CHECKING:
    import pymc as pm

log = logging.getLogger(__name__)


@dataclass
class Fit:
    """Posterior draws and sampler statistics of one run.

    ``posterior`` holds the groups ``posterior`` and ``sample_stats``; ``seconds`` is the run's wall time.
    ``loss`` is the ADVI loss (negative ELBO) per iteration, ``None`` for NUTS.
    ``grad_evals`` counts leapfrog steps over tuning and draws; ``None`` where the
    backend does not report its tuning steps (numpyro, blackjax) and for ADVI.
    """

    posterior: Trace  # groups: posterior, sample_stats
    seconds: float
    loss: np.ndarray | None = None
    grad_evals: int | None = None


def _leapfrog_steps(idata: Trace, *groups: str) -> int:
    return int(sum(idata[g]["n_steps"].sum() for g in groups))


class Backend:
    """One way to fit a compiled model; subclasses are looked up by name in :data:`hbnn.sampling.sampler.BACKENDS`.

    A backend compiles in ``__init__`` (timed as compile seconds by :class:`hbnn.sampling.sampler.Sampler`) and fits in
    :meth:`run`.

    Parameters
    ----------
    model : pymc.Model or callable
        The PyMC model, or a function that builds it (on first use of :attr:`model`).
    settings : hbnn.config.SamplerParams
    density : hbnn.density.densities.Density, optional
        A hand-written log density, for the backends that fit one (nutpie, ADVI).
    full_batch : callable, optional
        Builds PyMC's full-batch model where ``model`` is a minibatch one: what a hand-written density is checked
        against (:meth:`full_batch_model`).
    """

    name: str

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None,
                 full_batch: Callable[[], pm.Model] | None = None):
        self._model = model
        self._full_batch = full_batch
        self.settings = settings

    @property
    def model(self) -> pm.Model:
        """The PyMC model, built on first use where the backend was given a function that builds it."""
        if not hasattr(self._model, "free_RVs"):
            from hbnn.density.cache_guard import guard_pytensor

            guard_pytensor()  # a damaged PyTensor cache is built again, not loaded: before PyMC imports PyTensor
            self._model = self._model()
        return self._model

    def full_batch_model(self) -> pm.Model:
        """PyMC's full-batch model, which a hand-written density is checked against: :attr:`model`, or where that is a
        minibatch model, the one ``full_batch`` builds.

        Returns
        -------
        pymc.Model
        """
        if self._full_batch is None:
            return self.model
        from hbnn.density.cache_guard import guard_pytensor

        guard_pytensor()
        return self._full_batch()

    @staticmethod
    def minibatch_size(settings: SamplerParams) -> int | None:
        """Return the rows per gradient step, ``None`` for the full-batch likelihood.

        Parameters
        ----------
        settings : hbnn.config.SamplerParams

        Returns
        -------
        int or None
        """
        return None

    @staticmethod
    def parallel_chains(settings: SamplerParams) -> int:
        """Return the chains that step at the same time, on their own cores (for the cost per gradient).

        Parameters
        ----------
        settings : hbnn.config.SamplerParams

        Returns
        -------
        int
        """
        return max(1, min(settings.chains, settings.cores))

    compiles_in_sampling = False  # True: pm.sample compiles (or jits) on every call, inside its seconds

    def label(self) -> str:
        """Return what runs, for log lines: backend and settings."""
        s = self.settings
        return f"sampling: backend={self.name} chains={s.chains} tune={s.tune} draws={s.draws}"

    def describe(self, seed: int) -> str:
        """Return :meth:`label` with the run's ``seed``, for the log line of one fit.

        Parameters
        ----------
        seed : int

        Returns
        -------
        str
        """
        return f"{self.label()} seed={seed}"

    iterations = None  # Iterations of the running fit, where the backend reports them
    # ``until(posterior)``: what in the draws so far misses the convergence bar, ``None`` when nothing does;
    # set by :meth:`Sampler.sample` for backends that can go on drawing (``max_draws``)
    until = None

    def progress(self, elapsed: float) -> str | None:
        """Report the running fit's progress for the heartbeat.

        Parameters
        ----------
        elapsed : float
            Seconds since the fit started.

        Returns
        -------
        str or None
            ``None`` where the backend reports nothing.
        """
        return self.iterations.status() if self.iterations is not None else None

    def run(self, seed: int, data: Mapping[str, np.ndarray] | None) -> tuple[Trace, np.ndarray | None, int | None]:
        """Fit the compiled model once.

        Parameters
        ----------
        seed : int
        data : mapping of str to numpy.ndarray or None
            New values of the model's ``pm.Data`` containers.

        Returns
        -------
        hbnn.files.trace.Trace
            ``posterior`` and ``sample_stats`` (or ArviZ's ``InferenceData`` with them).
        numpy.ndarray or None
            The ADVI loss, ``None`` for NUTS.
        int or None
            The gradient evaluations made, ``None`` where the backend cannot tell.
        """
        raise NotImplementedError

    def _set_data(self, data: Mapping[str, np.ndarray] | None) -> None:
        if data:
            import pymc as pm

            with self.model:
                pm.set_data(dict(data))


class Iterations:
    """Iterations a running fit has done (for NUTS: over its chains, tuning included), and the time left at
    their rate.

    Parameters
    ----------
    total : int, optional
        Iterations the fit will do; 0 where unknown (no status).
    unit : str, optional
        What an iteration is, for the status line.
    """

    def __init__(self, total: int = 0, unit: str = "iterations (tuning included)"):
        self.total, self.unit = total, unit
        self.done = 0
        self.started: float | None = None  # first report: compiling is over
        self.divergences: int | None = None  # after tuning, where the backend reports them as it goes

    def add(self, n: int) -> None:
        """Count ``n`` more iterations; the first call marks the end of compiling (the rate's start).

        Parameters
        ----------
        n : int
        """
        if self.started is None:
            self.started = time.monotonic()
        self.done += n

    def status(self) -> str | None:
        """Return the heartbeat's status: iterations done, divergences so far and the time left at this rate.

        Returns
        -------
        str or None
            ``None`` before the first iterations or without a total.
        """
        if self.started is None or not self.total:
            return None
        text = f"{self.done}/{self.total} {self.unit}"
        if self.divergences is not None:
            text += f", {self.divergences} divergences so far"
        elapsed = time.monotonic() - self.started
        if self.done and elapsed > 0:
            text += f", ~{(self.total - self.done) * elapsed / self.done:.0f}s left at this rate"
        return text
