"""Turn (model, sampler settings, seed) into ``InferenceData``, whatever the backend.

:class:`Sampler` compiles a model once; :meth:`Sampler.sample` can then be called
repeatedly, optionally with new values for the model's ``pm.Data`` containers
(another group's rows), without recompiling. The backends are looked up by name in :data:`BACKENDS`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from hbnn import logs
from hbnn.config import SamplerParams
from hbnn.errors import SamplingError
from hbnn.files.trace import Trace
from hbnn.sampling.advi import AdviBackend
from hbnn.sampling.backend import Backend, Fit
from hbnn.sampling.nutpie_backend import NutpieBackend
from hbnn.sampling.pymc_backends import BlackjaxBackend, NumpyroBackend, PymcBackend

if TYPE_CHECKING:
    import pymc as pm

log = logging.getLogger(__name__)

BACKENDS: dict[str, type[Backend]] = {
    b.name: b for b in (NutpieBackend, PymcBackend, NumpyroBackend, BlackjaxBackend, AdviBackend)
}


def backend_class(settings: SamplerParams) -> type[Backend]:
    """Look up the :class:`~hbnn.sampling.backend.Backend` that ``settings.backend`` names.

    Parameters
    ----------
    settings : hbnn.config.SamplerParams

    Returns
    -------
    type
        A subclass of :class:`hbnn.sampling.backend.Backend`, from :data:`BACKENDS`.
    """
    return BACKENDS[settings.backend]


class Sampler:
    """A model compiled once for the configured backend (:data:`BACKENDS`).

    ``nutpie`` compiles the model with numba once and refits new data with
    ``with_data``; ``advi`` compiles one optimisation step (with a hand-written
    density: fits that density, :mod:`hbnn.sampling.density_advi`) and resets its state per
    fit; ``pymc``, ``numpyro`` and ``blackjax`` go through ``pm.sample``, which
    compiles (PyMC) or traces and jits (JAX) on every call.

    Parameters
    ----------
    model : pymc.Model or callable
        The PyMC model or a function that builds it: with a hand-written ``density`` (nutpie, and ADVI,
        :mod:`hbnn.density.kernel`) it is built only where the density has yet to be checked against it.
    settings : hbnn.config.SamplerParams
    density : hbnn.density.densities.Density, optional
        The hand-written log density nutpie samples, and ADVI fits, instead of PyMC's.
    full_batch : callable, optional
        Builds PyMC's full-batch model where ``model`` is a minibatch one (ADVI's ``advi.minibatch_size``): the
        hand-written density is checked against it.
    """

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None,
                 full_batch: Callable[[], pm.Model] | None = None):
        self.settings = settings
        start = time.perf_counter()
        self.backend = backend_class(settings)(model, settings, density, full_batch)
        # None where the compile happens inside every sampling call (counted in its seconds)
        self.compile_seconds = None if self.backend.compiles_in_sampling else time.perf_counter() - start

    def sample(self, seed: int, data: Mapping[str, np.ndarray] | None = None, *, watch: bool = True,
               expected_seconds: float | None = None, until=None) -> Fit:
        """Fit with the configured settings.

        ``until(posterior)`` says what in a posterior (model variables, ``chain``/``draw`` dims) misses
        the convergence bar, or ``None``; with ``max_draws`` the fit goes on in blocks of ``draws`` while
        it says something (backends that can, :class:`~hbnn.sampling.pymc_backends.NumpyroBackend`), else it is not
        called.

        In a log (not a terminal) and with ``watch``, a heartbeat line every 10 s
        says how long the fit has run and, given ``expected_seconds``, about how long is left.

        Parameters
        ----------
        seed : int
        data : mapping of str to numpy.ndarray, optional
            New values of the model's ``pm.Data`` containers (another group's rows).
        watch : bool, optional
            Log a heartbeat; a caller that reports its own progress (a loop over groups) passes ``False``.
        expected_seconds : float, optional
            The cost estimate of :mod:`hbnn.pipeline.budget`.
        until : callable, optional
            The convergence check described above.

        Returns
        -------
        hbnn.sampling.backend.Fit

        Raises
        ------
        hbnn.errors.SamplingError
            Where the run stopped early (an interrupt) or drew non-finite values: such a trace is never taken for a
            finished run.
        """
        description = self.backend.describe(seed)
        log.debug("%s", description)
        start = time.perf_counter()
        estimate = _time_left(expected_seconds)

        def status(elapsed: float) -> str | None:
            return self.backend.progress(elapsed) or (estimate(elapsed) if estimate else None)

        watching = logs.watch(log, self.backend.label(), status) if watch else contextlib.nullcontext()
        self.backend.until = until
        try:
            with watching:
                idata, loss, grad_evals = self.backend.run(seed, data)
        finally:
            self.backend.until = None
        return self._fit(idata, loss, grad_evals, time.perf_counter() - start)

    def _fit(self, idata, loss, grad_evals, seconds: float) -> Fit:
        _check_complete(idata, self.settings)
        # Model variables only: nutpie also stores the unconstrained values (sd_in_log__, ...),
        # the other backends do not, and every backend must write the same layout.
        posterior = idata.posterior[[v for v in idata.posterior.data_vars if not str(v).endswith("__")]]
        idata = Trace(posterior=posterior, sample_stats=idata.sample_stats)
        return Fit(posterior=idata, seconds=seconds, loss=loss, grad_evals=grad_evals)

    def sample_each(self, jobs: Sequence[tuple[int, Mapping[str, np.ndarray]]]) -> Iterator[Fit]:
        """Run :meth:`sample` for every ``(seed, data)`` in ``jobs``, in order, without a heartbeat.

        The caller reports its groups' progress. With nutpie, the next fit starts before this one is over: the
        chains of one fit end at different times, and the core a finished chain leaves would otherwise wait for the
        slowest one. Each fit's draws are its own seed's whatever runs beside it; its ``seconds`` are the wall time
        from its start, or the previous fit's end if later, to its end, so they add up to the loop's.

        Parameters
        ----------
        jobs : sequence of tuple of (int, mapping of str to numpy.ndarray)

        Yields
        ------
        hbnn.sampling.backend.Fit
            One per job, in order.

        Raises
        ------
        hbnn.errors.SamplingError
            As :meth:`sample`; chains still running are cancelled first.
        """
        if not hasattr(self.backend, "start"):
            for seed, data in jobs:
                yield self.sample(seed, data, watch=False)
            return
        runs: list = []
        last = time.perf_counter()
        try:
            for seed, data in jobs:
                log.debug("%s", self.backend.describe(seed))
                runs.append(self.backend.start(seed, data))
                if len(runs) > 1:
                    yield self._finish_first(runs, last)
                    last = time.perf_counter()
            while runs:
                yield self._finish_first(runs, last)
                last = time.perf_counter()
        except BaseException:
            # an error or Ctrl-C: no chains left running (per-group fits never restart, so a run's sampler is
            # the one it started with: SamplerParams.check refuses sampler.restarts)
            for run in runs:
                run.running.cancel()
            raise

    def _finish_first(self, runs: list, since: float) -> Fit:
        idata, loss, grad_evals = self.backend.finish(runs[0])
        runs.pop(0)
        return self._fit(idata, loss, grad_evals, time.perf_counter() - since)


def _time_left(expected: float | None):
    """A heartbeat status from the cost estimate: ``~Ns left by the cost estimate`` (``None`` without one)."""
    if not expected:
        return None

    def status(elapsed: float) -> str:
        if elapsed < expected:
            return f"~{expected - elapsed:.0f}s left by the cost estimate ({expected:.0f}s in all)"
        return f"past the cost estimate of {expected:.0f}s"

    return status


def _check_complete(idata: Trace, s: SamplerParams) -> None:
    """Every chain holds all ``draws`` finite draws (with ``max_draws``: at least ``draws`` and at most
    ``max_draws``, wherever the run-length control's last look was), else :class:`SamplingError`.

    Samplers return early with what they have when interrupted (PyMC and nutpie
    both do on Ctrl-C); such a trace must never be taken for a finished run.
    """
    sizes = idata.posterior.sizes
    chains, draws = sizes.get("chain"), sizes.get("draw")
    if chains != s.chains or not draws or not s.draws <= draws <= s.draw_limit:
        raise SamplingError(f"sampling stopped early: {chains} chains x {draws} draws "
                            f"of {s.chains} x {s.draws}; nothing was written")
    for name, da in idata.posterior.data_vars.items():
        if np.issubdtype(da.dtype, np.floating) and not np.isfinite(da.values).all():
            raise SamplingError(f"sampling produced non-finite draws of {name}; nothing was written")
