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
    """One way to fit a compiled model; subclasses are looked up by name in :data:`BACKENDS`.

    A backend compiles in ``__init__`` (timed as compile seconds by
    :class:`Sampler`) and fits in :meth:`run`, returning a :class:`~hbnn.files.trace.Trace` (or ArviZ's
    ``InferenceData``) with
    ``posterior`` and ``sample_stats``, the ADVI loss (or ``None``) and the
    gradient evaluations it made (or ``None`` where it cannot tell).
    """

    name: str

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None):
        self._model = model
        self.settings = settings

    @property
    def model(self) -> pm.Model:
        """The PyMC model, built on first use where the backend was given a function that builds it."""
        if not hasattr(self._model, "free_RVs"):
            from hbnn.density.cache_guard import guard_pytensor

            guard_pytensor()  # a damaged PyTensor cache is built again, not loaded: before PyMC imports PyTensor
            self._model = self._model()
        return self._model

    @staticmethod
    def minibatch_size(settings: SamplerParams) -> int | None:
        """Rows per gradient step, ``None`` for the full-batch likelihood."""
        return None

    @staticmethod
    def parallel_chains(settings: SamplerParams) -> int:
        """Chains that step at the same time, on their own cores (for the cost per gradient)."""
        return max(1, min(settings.chains, settings.cores))

    compiles_in_sampling = False  # True: pm.sample compiles (or jits) on every call, inside its seconds

    def label(self) -> str:
        """What runs, for log lines: backend and settings."""
        s = self.settings
        return f"sampling: backend={self.name} chains={s.chains} tune={s.tune} draws={s.draws}"

    def describe(self, seed: int) -> str:
        return f"{self.label()} seed={seed}"

    iterations = None  # Iterations of the running fit, where the backend reports them
    # ``until(posterior)``: what in the draws so far misses the convergence bar, ``None`` when nothing does;
    # set by :meth:`Sampler.sample` for backends that can go on drawing (``max_draws``)
    until = None

    def progress(self, elapsed: float) -> str | None:
        """What the running fit reports of its progress, for the heartbeat (``None``: nothing)."""
        return self.iterations.status() if self.iterations is not None else None

    def run(self, seed: int, data: Mapping[str, np.ndarray] | None) -> tuple[Trace, np.ndarray | None, int | None]:
        raise NotImplementedError

    def _set_data(self, data: Mapping[str, np.ndarray] | None) -> None:
        if data:
            import pymc as pm

            with self.model:
                pm.set_data(dict(data))


class Iterations:
    """Iterations a running fit has done (for NUTS: over its chains, tuning included), and the time left at
    their rate."""

    def __init__(self, total: int = 0, unit: str = "iterations (tuning included)"):
        self.total, self.unit = total, unit
        self.done = 0
        self.started: float | None = None  # first report: compiling is over
        self.divergences: int | None = None  # after tuning, where the backend reports them as it goes

    def add(self, n: int) -> None:
        if self.started is None:
            self.started = time.monotonic()
        self.done += n

    def status(self) -> str | None:
        if self.started is None or not self.total:
            return None
        text = f"{self.done}/{self.total} {self.unit}"
        if self.divergences is not None:
            text += f", {self.divergences} divergences so far"
        elapsed = time.monotonic() - self.started
        if self.done and elapsed > 0:
            text += f", ~{(self.total - self.done) * elapsed / self.done:.0f}s left at this rate"
        return text
