"""nutpie's NUTS: the default backend, sampling the hand-written density, with run-length control and restarts."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import xarray as xr

from hbnn import logs
from hbnn.config import SamplerParams
from hbnn.errors import DENSITY_OVERFLOW, SamplingError
from hbnn.files.trace import Trace
from hbnn.pipeline.variants import derive_seed
from hbnn.sampling.backend import Backend, _leapfrog_steps
from hbnn.sampling.nutpie_adapter import (
    check_version,
    draws_done,
    trace_from_batches,
    trace_from_raw,
    with_initial_points,
    with_user_data,
)
from hbnn.sampling.restarts import RESTART_SEED_KEY, _restart_record, _warn_divergent_stop, restart_reason
from hbnn.sampling.runlength import _next_check, look_unit

if TYPE_CHECKING:
    import pymc as pm

log = logging.getLogger(__name__)


class NutpieBackend(Backend):
    """nutpie (Rust NUTS over numba): compiled once, refitted to new data with ``with_data``.

    With a hand-written log density (``density``, :mod:`hbnn.density.densities`), nutpie's model is built from it
    alone (:meth:`~hbnn.density.densities.Density.checked_nutpie_model`: no PyMC model is built or compiled once the
    density has been checked against it), and new rows are packed into its buffer; where the check fails, PyMC's
    compiled density is sampled instead, with a warning.
    With ``max_draws`` and a :attr:`~hbnn.sampling.backend.Backend.until` check, the chains run on towards
    ``max_draws`` while the first ``n`` draws of every chain are judged at each look (defined in
    :mod:`hbnn.sampling.runlength`: ``n = draws``, then where :func:`hbnn.sampling.runlength._next_check` places the
    next, in whole units of :func:`hbnn.sampling.runlength.look_unit`); the fit keeps exactly the first ``n`` that
    meet the bar (defined in :mod:`hbnn.diagnostics.criterion`), or ``max_draws``, and stops the chains. Which draws
    are kept depends on the draws only, never on timing, so the trace is the same on every run.

    Parameters
    ----------
    model : pymc.Model or callable
        The PyMC model, or a function that builds it (only where it is needed: no density, or its first check).
    settings : hbnn.config.SamplerParams
        The sampler's settings.
    density : hbnn.density.densities.Density, optional
        The hand-written log density of the same model.

    Raises
    ------
    hbnn.errors.InputError
        Where the installed nutpie is outside :data:`hbnn.sampling.nutpie_adapter.SUPPORTED`.
    hbnn.errors.SamplingError
        Where PyMC's own log density is not finite near the initial point (the density's check).
    """

    name = "nutpie"
    poll_seconds = 1.0  # how often a run-length-controlled fit looks at the draws so far, at most

    density = None  # the hand-written log density in use, to repack for other rows
    # After a run-length-controlled fit's first look: (draws per chain so far, at the next look, draws per second
    # of the slowest chain or None, when), for the heartbeat; before it, the cost estimate speaks
    towards: tuple[int, int, float | None, float] | None = None
    restarting: str | None = None  # while restarted chains warm up again, what the heartbeat says

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None,
                 full_batch: Callable[[], pm.Model] | None = None):
        super().__init__(model, settings, density, full_batch)
        check_version()  # before anything is built: the model class and trace it uses are nutpie's own
        if density is not None:
            from hbnn.density.pymc_check import DensityMismatch

            try:
                self.compiled = density.checked_nutpie_model(self.full_batch_model)
                self.density = density
                return
            except DensityMismatch as err:  # not the model's density: PyTensor's is the same model, only slower
                log.warning("sampling PyTensor's log density, not the hand-written one: %s", err)
                self.compiled = err.compiled  # the check's own compile of PyMC's model
                return
        from hbnn.sampling.nutpie_adapter import compile_numba

        self.compiled = compile_numba(self.model)

    def _with_data(self, data: Mapping[str, np.ndarray] | None):
        if not data:
            return self.compiled
        if self.density is None:
            return self.compiled.with_data(**data)
        if set(data) != {"x", "y"}:
            raise ValueError(f"the hand-written log density takes new rows as x and y, not {sorted(data)}")
        rows = self.density.with_rows(data["x"], data["y"])
        return with_user_data(self.compiled, rows.pack(rows.offsets()))

    def run(self, seed, data):
        """Start a fit and wait for it (:meth:`start`, :meth:`finish`).

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
        return self.finish(self.start(seed, data))

    def start(self, seed: int, data: Mapping[str, np.ndarray] | None) -> _NutpieRun:
        """Start a fit in nutpie's threads and return at once.

        Parameters
        ----------
        seed : int
            nutpie's seed.
        data : mapping of str to numpy.ndarray or None
            New rows (``x`` and ``y`` for a hand-written density), or ``None`` for the compiled model's own.

        Returns
        -------
        _NutpieRun
            :meth:`finish` waits for it (or cancel its ``running``).

        Raises
        ------
        ValueError
            Where a hand-written density is given new data other than ``x`` and ``y``.
        """
        s = self.settings
        compiled = self._with_data(data)
        blocks = s.max_draws > s.draws and self.until is not None
        return _NutpieRun(self._launch(compiled, seed, blocks), compiled, blocks, seed)

    def _launch(self, compiled, seed: int, blocks: bool):
        """nutpie's running sampler of ``compiled`` (non-blocking), with this backend's settings."""
        from hbnn.sampling.nutpie_adapter import load as load_nutpie

        s = self.settings
        return load_nutpie().sample(
            compiled,
            draws=s.max_draws if blocks else s.draws,
            tune=s.tune,
            chains=s.chains,
            cores=s.cores,
            seed=seed,
            target_accept=s.target_accept,
            low_rank_modified_mass_matrix=s.mass_matrix == "low_rank",
            **({"use_grad_based_mass_matrix": False} if s.mass_matrix == "diag_stan" else {}),
            progress_bar=logs.interactive(),  # on a terminal; in a log, Sampler.sample's heartbeat
            save_warmup=True,  # only to count the tuning phase's gradient evaluations
            blocking=False,
            return_raw_trace=True,  # converted by nutpie_adapter.trace_from_raw
        )

    def finish(self, run: _NutpieRun) -> tuple[Trace, None, int]:
        """The trace of a fit :meth:`start` started, once it is over.

        Parameters
        ----------
        run : _NutpieRun
            What :meth:`start` returned.

        Returns
        -------
        tuple of (hbnn.files.trace.Trace, None, int)
            The trace, no ADVI loss, and the leapfrog steps taken (warmup and restarted chains included).

        Raises
        ------
        hbnn.errors.SamplingError
            Where nutpie finds no initial point with a finite log density and gradient.
        """
        # nutpie's blocking call turns Ctrl-C into an early return with the draws so far;
        # here an interrupt stops the chains and propagates, so no partial trace is used.
        with _no_start_refused():
            if run.blocks:
                try:
                    return self._first_converged_blocks(run)
                finally:
                    self.towards = self.restarting = None
            try:
                idata = trace_from_raw(run.running.wait(), run.compiled.coords)
            except BaseException:
                run.running.cancel()
                raise
        return idata, None, _leapfrog_steps(idata, "warmup_sample_stats", "sample_stats")

    def progress(self, elapsed: float) -> str | None:
        """Past the first look, how far the chains are from the next one.

        The cost estimate covers the first block only, so past it a heartbeat would otherwise say only that the fit
        runs over.

        Parameters
        ----------
        elapsed : float
            Seconds since the fit started.

        Returns
        -------
        str or None
            The heartbeat's text, or ``None`` before the first look (the cost estimate speaks).
        """
        if self.towards is None:
            return self.restarting
        drawn, target, rate, at = self.towards
        text = f"{drawn}/{target} draws per chain at the next look (up to max_draws={self.settings.max_draws})"
        if rate:
            text += f", ~{max(0.0, (target - drawn) / rate - (time.monotonic() - at)):.0f}s to it at this rate"
        return text

    def _first_converged_blocks(self, run: _NutpieRun) -> tuple[Trace, None, int]:
        """The first ``n`` draws of every chain, for the first ``n`` of the checks (``draws``, then as
        :func:`_next_check` says) whose draws :attr:`until` passes (or ``max_draws``); the chains are stopped
        once that is known. At any look, chains that :func:`~hbnn.sampling.restarts.restart_reason` finds failing
        start again from the best chain's draws (a restart, defined in :mod:`hbnn.sampling.restarts`; up to
        ``restarts`` times in all, at any look, since a chain can drift into a worse region after the first), recorded
        in the trace's
        ``sample_stats`` attribute ``hbnn_restarts``; the gradient evaluations returned count the attempts left
        behind too (up to their cancel). Any error or interrupt stops the chains running."""
        s = self.settings
        running, restarts, spent = run.running, [], 0
        try:
            while True:
                poll = _Poll(running, run.compiled.coords, self)
                kept = s.draws
                head = poll.first(kept)
                missing = self.until(head.posterior)
                # at every look: chains that went wrong start again (restart_reason), else the fit looks further on
                while (why := restart_reason(head, missing) if len(restarts) < s.restarts else None) is None:
                    following = _next_check(missing, kept, s, look_unit(s.backend, s.draws))
                    if following is None:
                        break
                    kept = following
                    head = poll.first(kept)
                    missing = self.until(head.posterior)
                if why is None:
                    _warn_divergent_stop(head, missing, len(restarts), s.restarts)
                    break
                reason, best = why
                # the cost: every step until the cancel (timing-dependent, for the timings only); the record: the
                # steps up to the look, which the draws decide, so that the trace and metrics stay the same
                spent += poll.steps_so_far()
                running.cancel()
                restarts.append(_restart_record(head, reason, best,
                                                _leapfrog_steps(head, "warmup_sample_stats", "sample_stats")))
                log.warning("restarting the chains from chain %d's draws (restart %d of at most %d): %s",
                            best, len(restarts), s.restarts, reason)
                self.restarting = (f"restart {len(restarts)} of at most {s.restarts}: warming up again from chain "
                                   f"{best}'s draws")
                self.towards = None  # a look past the first set it: the heartbeat says the restart instead
                running = self._launch(starting_from(run.compiled, head.posterior, best),
                                       derive_seed(run.seed, RESTART_SEED_KEY, len(restarts)), True)
            self.restarting = None
            running.cancel()
        except BaseException:
            running.cancel()
            raise
        if restarts:
            head.sample_stats.attrs["hbnn_restarts"] = json.dumps(restarts, sort_keys=True)
        return head, None, spent + _leapfrog_steps(head, "warmup_sample_stats", "sample_stats")


# A poll copies every draw so far, warmup included (nutpie's inspect, on a thread beside the chains'): polls are
# spaced so that the copies take at most this share of the time. At 1,000 groups, polls every second had that thread
# using 37 s of CPU a minute 25 minutes into warmup, taken from the chains (benchmarks/FINDINGS.md, "Polls").
POLL_COST_SHARE = 0.02


class _Poll:
    """The draws of a running nutpie fit as they arrive: :meth:`first` waits for a number of draws per chain
    (polling, or once the chains have finished) and returns that prefix of every chain. It polls again when the
    slowest chain's rate says the draws will be there, after at least :attr:`NutpieBackend.poll_seconds` and
    :data:`POLL_COST_SHARE`'s spacing, and at most ten times that."""

    def __init__(self, running, coords, backend: NutpieBackend):
        self.running, self.coords, self.backend = running, coords, backend
        self.final = None  # the whole trace, once the chains have finished (nutpie hands it over once)
        self.rate = None  # iterations (tuning and draws) per second of the slowest chain, from the last two polls
        self.last = None

    def steps_so_far(self) -> int:
        """Leapfrog steps the chains have taken so far, warmup included (they run on past the last look)."""
        import pyarrow

        if self.final is not None:
            return _leapfrog_steps(self.final, "warmup_sample_stats", "sample_stats")
        _, stats = self.running.inspect().get_arrow_trace()
        return int(sum(np.asarray(pyarrow.array(batch.column("n_steps")).to_numpy(zero_copy_only=False)).sum()
                       for batch in stats))

    def first(self, kept: int) -> Trace:
        """The first ``kept`` draws per chain, waiting for them (polling, or until the chains have finished).

        Parameters
        ----------
        kept : int
            Draws per chain.

        Returns
        -------
        hbnn.files.trace.Trace
            ``posterior`` and ``sample_stats`` cut to ``kept`` draws, and ``warmup_sample_stats``.
        """
        backend, s = self.backend, self.backend.settings
        trace = self.final
        while trace is None:
            if _finished(self.running):
                trace = self.final = trace_from_raw(self.running.wait(), self.coords)
                backend.towards = None  # no more polls: the heartbeat's own estimate speaks again
                break
            began = time.monotonic()
            draws, stats = self.running.inspect().get_arrow_trace()
            drawn = draws_done(stats)
            if drawn >= kept:
                trace = trace_from_batches(draws, stats, self.coords)
                break
            now = time.monotonic()
            done = min((batch.num_rows for batch in stats), default=0)  # iterations, tuning included
            if self.last is not None and done > self.last[1]:
                self.rate = (done - self.last[1]) / (now - self.last[0])
            self.last = (now, done)
            if kept > s.draws:  # past tuning: iterations are draws
                backend.towards = (drawn, kept, self.rate, now)
            # Each poll copies the whole trace, so poll again about when the block should be complete.
            wait = (s.tune + kept - done) / self.rate if self.rate else backend.poll_seconds
            least = max(backend.poll_seconds, (now - began) / POLL_COST_SHARE)
            time.sleep(min(max(wait, least), 10 * least))
        return Trace(warmup_sample_stats=trace["warmup_sample_stats"],
                     **{g: trace[g].isel(draw=slice(0, kept)) for g in ("posterior", "sample_stats")})


def starting_from(compiled, posterior: xr.Dataset, chain: int):
    """``compiled`` whose chains start at draws of one chain of ``posterior``.

    Parameters
    ----------
    compiled : nutpie.compile_pymc.CompiledPyMCModel
        The model sampled.
    posterior : xarray.Dataset
        Draws of it, on the unconstrained scale (the value variables of ``compiled.shape_info``, ``*_log__`` for
        the sds).
    chain : int
        The chain whose second half (past where it came from) the chains start from: one draw for each chain,
        drawn from the seed nutpie gives its initial point.

    Returns
    -------
    nutpie.compile_pymc.CompiledPyMCModel

    Raises
    ------
    ValueError
        Where the chain's draws do not fill every unconstrained coordinate with finite values.
    """
    names, slices, _ = compiled.shape_info
    draws = posterior.isel(chain=chain)
    n = draws.sizes["draw"]
    points = np.full((n - n // 2, compiled.n_dim), np.nan)
    for name, where in zip(names, slices, strict=True):
        if where.stop <= compiled.n_dim:
            points[:, where] = draws[name].values[n // 2:].reshape(len(points), -1)
    if not np.isfinite(points).all():
        raise ValueError(f"chain {chain}'s draws do not fill every unconstrained coordinate with finite values")

    def initial_point(seed) -> np.ndarray:
        return points[np.random.default_rng(seed).integers(len(points))].copy()

    return with_initial_points(compiled, initial_point)


@contextlib.contextmanager
def _no_start_refused():
    """nutpie's refusal to start (no initial point with a finite log density and gradient: a Rust error with its
    backtrace) as one :class:`SamplingError` line; any other error as it is."""
    try:
        yield
    except RuntimeError as err:
        if not str(err).startswith("All initialization points failed"):
            raise
        cause = next((line.strip() for line in str(err).splitlines()[1:] if "error" in line.lower()), "")
        raise SamplingError("nutpie found no initial point where the log density and its gradient are finite"
                            f"{f' ({cause})' if cause else ''}: {DENSITY_OVERFLOW}") from None


class _NutpieRun(NamedTuple):
    """A fit :meth:`NutpieBackend.start` started: nutpie's running sampler, the model it samples, and whether it
    draws in blocks until the bar is met."""

    running: object
    compiled: object
    blocks: bool
    seed: int


def _finished(running) -> bool:
    """Whether a non-blocking nutpie run is over (nutpie 0.16 answers a running one with ``TimeoutError``)."""
    try:
        return bool(running.is_finished)
    except TimeoutError:
        return False
