"""Turn (model, sampler settings, seed) into ``InferenceData``, whatever the backend.

:class:`Sampler` compiles a model once; :meth:`Sampler.sample` can then be called
repeatedly, optionally with new values for the model's ``pm.Data`` containers
(another group's rows), without recompiling.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd
import xarray as xr

from hbnn import logs
from hbnn.config import ConfigError, SamplerParams
from hbnn.errors import DENSITY_OVERFLOW, SamplingError
from hbnn.files.trace import Trace
from hbnn.pipeline.variants import derive_seed

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


def _require_jax(backend: str) -> None:
    """Fail before any sampling, naming the param, when the JAX extra is missing."""
    missing = [m for m in ("jax", backend) if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"invalid parameter sampler.backend={backend!r}: needs the JAX extra ({', '.join(missing)} not "
            "installed); run `make jax` (pins in requirements-jax.lock)"
        )


def _use_host_devices(n: int) -> None:
    """Let JAX see ``n`` CPU devices so chains can run in parallel (before JAX starts)."""
    flag = f"--xla_force_host_platform_device_count={n}"
    current = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in current:
        os.environ["XLA_FLAGS"] = f"{current} {flag}".strip()


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


class NutpieBackend(Backend):
    """nutpie (Rust NUTS over numba): compiled once, refitted to new data with ``with_data``.

    With a hand-written log density (``density``, :mod:`hbnn.density.kernel`), nutpie's model is built from it alone
    (:meth:`hbnn.density.kernel.Density.checked_nutpie_model`: no PyMC model is built or compiled once the density has
    been checked against it), and new rows are packed into its buffer.
    With ``max_draws`` and a :attr:`Backend.until` check, the chains run on towards ``max_draws`` while the
    first ``n`` draws of every chain are checked as they arrive (``n = draws``, then as :func:`_next_check`
    extrapolates, in steps of :data:`CHECK_UNIT` draws); the fit keeps exactly the first ``n`` that meet the
    bar (or ``max_draws``) and stops the chains. Which draws are kept depends on the draws only, never on
    timing, so the trace is the same on every run.
    """

    name = "nutpie"
    poll_seconds = 1.0  # how often a run-length-controlled fit looks at the draws so far

    density = None  # the hand-written log density in use, to repack for other rows
    # After a run-length-controlled fit's first look: (draws per chain so far, at the next look, draws per second
    # of the slowest chain or None, when), for the heartbeat; before it, the cost estimate speaks
    towards: tuple[int, int, float | None, float] | None = None
    restarting: str | None = None  # while restarted chains warm up again, what the heartbeat says

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None):
        super().__init__(model, settings)
        if density is not None:
            from hbnn.density.kernel import DensityMismatch

            try:
                self.compiled = density.checked_nutpie_model(lambda: self.model)
                self.density = density
                return
            except DensityMismatch as err:  # not the model's density: PyTensor's is the same model, only slower
                log.warning("sampling PyTensor's log density, not the hand-written one: %s", err)
                self.compiled = err.compiled  # the check's own compile of PyMC's model
                return
        from hbnn.sampling.nutpie_cache import compile_numba

        self.compiled = compile_numba(self.model)

    def _with_data(self, data: Mapping[str, np.ndarray] | None):
        if not data:
            return self.compiled
        if self.density is None:
            return self.compiled.with_data(**data)
        if set(data) != {"x", "y"}:
            raise ValueError(f"the hand-written log density takes new rows as x and y, not {sorted(data)}")
        rows = self.density.with_rows(data["x"], data["y"])
        return replace(self.compiled, user_data=rows.pack(rows.offsets()))

    def run(self, seed, data):
        return self.finish(self.start(seed, data))

    def start(self, seed: int, data: Mapping[str, np.ndarray] | None) -> _NutpieRun:
        """Start a fit in nutpie's threads and return at once; :meth:`finish` waits for it (or cancel the
        returned run's ``running``)."""
        s = self.settings
        compiled = self._with_data(data)
        blocks = s.max_draws > s.draws and self.until is not None
        return _NutpieRun(self._launch(compiled, seed, blocks), compiled, blocks, seed)

    def _launch(self, compiled, seed: int, blocks: bool):
        """nutpie's running sampler of ``compiled`` (non-blocking), with this backend's settings."""
        from hbnn.sampling.nutpie_loader import nutpie as load_nutpie

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
            return_raw_trace=True,  # converted by _nutpie_idata
        )

    def finish(self, run: _NutpieRun) -> tuple[Trace, None, int]:
        """The trace of a fit :meth:`start` started, once it is over."""
        # nutpie's blocking call turns Ctrl-C into an early return with the draws so far;
        # here an interrupt stops the chains and propagates, so no partial trace is used.
        with _no_start_refused():
            if run.blocks:
                try:
                    return self._first_converged_blocks(run)
                finally:
                    self.towards = self.restarting = None
            try:
                idata = _nutpie_idata(run.running.wait(), run.compiled.coords)
            except BaseException:
                run.running.cancel()
                raise
        return idata, None, _leapfrog_steps(idata, "warmup_sample_stats", "sample_stats")

    def progress(self, elapsed: float) -> str | None:
        """Past the first look, how far the chains are from the next one (the cost estimate covers the first
        block only, so past it a heartbeat would otherwise say only that the fit runs over)."""
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
        once that is known. At any look, chains that :func:`restart_reason` finds failing start again from
        the best chain's draws (up to ``restarts`` times in all; a chain can drift into a worse region after the
        first look: on 30 groups one did between 600 and 800 draws per chain), recorded in the trace's
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


class _Poll:
    """The draws of a running nutpie fit as they arrive: :meth:`first` waits for a number of draws per chain
    (polling, or once the chains have finished) and returns that prefix of every chain."""

    def __init__(self, running, coords, backend: NutpieBackend):
        self.running, self.coords, self.backend = running, coords, backend
        self.final = None  # the whole trace, once the chains have finished (nutpie hands it over once)
        self.rate = None  # draws per second of the slowest chain, from the last two polls
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
        backend, s = self.backend, self.backend.settings
        trace = self.final
        while trace is None:
            if _finished(self.running):
                trace = self.final = _nutpie_idata(self.running.wait(), self.coords)
                backend.towards = None  # no more polls: the heartbeat's own estimate speaks again
                break
            draws, stats = self.running.inspect().get_arrow_trace()
            drawn = _draws_done(stats)
            if drawn >= kept:
                trace = _arrow_idata(draws, stats, self.coords)
                break
            now = time.monotonic()
            if self.last is not None and drawn > self.last[1]:
                self.rate = (drawn - self.last[1]) / (now - self.last[0])
            self.last = (now, drawn)
            if kept > s.draws:
                backend.towards = (drawn, kept, self.rate, now)
            # Each look copies the whole trace, so look again about when the block should be complete.
            wait = (kept - drawn) / self.rate if self.rate else backend.poll_seconds
            time.sleep(min(max(wait, backend.poll_seconds), 10 * backend.poll_seconds))
        return Trace(warmup_sample_stats=trace["warmup_sample_stats"],
                     **{g: trace[g].isel(draw=slice(0, kept)) for g in ("posterior", "sample_stats")})


RESTART_SEED_KEY = 100  # derive_seed(fit seed, RESTART_SEED_KEY, k): the k-th restart's chains
# At a run-length-controlled fit's look, divergences restart the chains where a Poisson count at the bar's share
# of the draws reaches them with less than this chance (one-sided): 5 or more at 2 x 500 draws, 87 in one chain seen
RESTART_DIVERGENCE_P = 0.01
# At a run-length-controlled fit's look, an R-hat past this says the chains sit in different places, more than
# slow mixing explains: on 30 groups, chains stuck where the input layer's group sd is ~0.3 (the rest: ~0.009) gave
# 1.3-1.45 at 500 draws; slow but healthy chains of the default fit up to ~1.08 (benchmarks/FINDINGS.md, "Chains
# started again")
RESTART_RHAT = 1.2
# ... and a chain is in a worse region where its mean log density lies this many standard errors (from each chain's
# ESS of the mean) below the best chain's: the stuck chains above were 7-8 below
RESTART_LOGP_Z = 4.0


def restart_reason(head: Trace, missing) -> tuple[str, int] | None:
    """Why the chains of a fit's look (``head``: ``posterior``, ``sample_stats``; ``missing``: its
    :class:`hbnn.diagnostics.evaluation.Shortfall` or ``None``) should start again, and from which chain's draws, or
    ``None``.

    - More divergences than the bar's share (:data:`hbnn.diagnostics.evaluation.DIVERGENT_SHARE_MAX` of the draws)
    explains
      by chance: a one-sided Poisson test at :data:`RESTART_DIVERGENCE_P` (at 2 x 500 draws: 5 or more). A chain
      whose warmup ended on too large a step size diverges at a steady rate, so drawing on does not dilute them.
      At the look where everything else meets the bar (``missing`` is ``None``: the fit would stop there), any
      count past the bar's share restarts: stopping would report every group not converged (a joint fit's
      divergences count against each). The chains restart from the chain with the fewest divergences (then the
      highest mean log density).
    - Chains that disagree (some quantity's R-hat past :data:`RESTART_RHAT`) while a chain's mean log density lies
      :data:`RESTART_LOGP_Z` standard errors (each chain's, from its ESS of the mean) below the highest: a chain
      stuck in a worse region. The chains restart from the chain with the highest mean log density.

    Where the chains disagree at similar log densities nothing restarts: that may be the posterior's own shape,
    which the metrics then report (R-hat). A lower mean log density is evidence of a worse region, not proof: a
    real mode that is wider but lower would be left behind too, which is why every restart is recorded with its
    numbers.
    """
    from scipy.special import pdtrc

    from hbnn.diagnostics.convergence import ess_mean
    from hbnn.diagnostics.evaluation import DIVERGENT_SHARE_MAX

    stats = head.sample_stats
    diverging, mean = _chain_numbers(stats)
    logp = stats["logp"].values
    chains, n = logp.shape
    total = int(diverging.sum())
    by_chance = total and pdtrc(total - 1, DIVERGENT_SHARE_MAX * logp.size) < RESTART_DIVERGENCE_P  # P(X >= total)
    if by_chance or _stops_past_the_bar(head, missing):
        best = min(range(chains), key=lambda c: (diverging[c], -mean[c]))
        each = ", ".join(f"chain {c}: {int(k)} at step size {float(stats['step_size'].values[c, 0]):.3g}"
                         for c, k in enumerate(diverging))
        why = (f"more than the {DIVERGENT_SHARE_MAX:.1%} of draws the bar allows explains by chance" if by_chance
               else f"past the bar's {DIVERGENT_SHARE_MAX:.1%} of draws where everything else meets it")
        return f"{total} divergences in the first {n} draws per chain ({each}), {why}", best
    rhat = getattr(missing, "max_rhat", float("nan"))
    if not rhat > RESTART_RHAT:
        return None
    ess = np.array([ess_mean(chain[None, :, None])[0] for chain in logp])
    se = logp.std(axis=1, ddof=1) / np.sqrt(ess)  # NaN where too few draws for an ESS: no verdict
    best = int(np.argmax(mean))
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (mean[best] - mean) / np.hypot(se[best], se)
    worse = [c for c in range(chains) if c != best and z[c] > RESTART_LOGP_Z]
    if not worse:
        return None
    each = ", ".join(f"chain {c}'s mean log density, {mean[c]:.1f}, lies {z[c]:.1f} standard errors below chain "
                     f"{best}'s, {mean[best]:.1f}" for c in worse)
    what = getattr(missing, "rhat_of", "") or "a quantity's"
    return f"the chains disagree ({what} R-hat {rhat:.2f} after {n} draws per chain) and {each}", best


def _stops_past_the_bar(head: Trace, missing) -> tuple[int, int] | None:
    """``(divergences, draws)`` of a look that would stop the fit (``missing`` is ``None``: R-hat and ESS meet the
    bar) with divergences past the bar's share of its draws; ``None`` otherwise."""
    from hbnn.diagnostics.evaluation import divergences_within_bar

    diverging = head.sample_stats["diverging"].values
    total = int(diverging.sum())
    if missing is None and not divergences_within_bar(total, diverging.size):
        return total, int(diverging.size)
    return None


def _warn_divergent_stop(head: Trace, missing, used: int, allowed: int) -> None:
    """Log a fit that stops meeting the R-hat and ESS bar with divergences past it and no restart left to mend
    them (:func:`restart_reason` restarts such a fit while it can)."""
    from hbnn.diagnostics.evaluation import DIVERGENT_SHARE_MAX

    if (past := _stops_past_the_bar(head, missing)) is not None:
        total, draws = past
        log.warning("stopped with %d divergences in %d draws, past the bar's %.1f%%, and no restart left "
                    "(hier_sampler.restarts=%d, %d used): the metrics and the report count every group not converged",
                    total, draws, 100 * DIVERGENT_SHARE_MAX, allowed, used)


def _restart_record(head: Trace, reason: str, best: int, steps: int) -> dict:
    """What the trace and the metrics keep of an attempt left behind: why, its draws per chain and its gradient
    evaluations up to the look that left it behind (``steps``: warmup and those draws; its chains ran on a little
    until they were cancelled, which the fit's timing counts but a record that must be the same on every run
    cannot), and per chain its step size, divergences and mean log density."""
    stats = head.sample_stats
    diverging, mean = _chain_numbers(stats)
    return {
        "reason": reason,
        "restarted_from_chain": int(best),
        "draws_per_chain": int(stats.sizes["draw"]),
        "leapfrog_steps": int(steps),
        "chains": [{"chain": c, "step_size": float(stats["step_size"].values[c, 0]),
                    "divergences": int(diverging[c]), "mean_log_density": float(mean[c])}
                   for c in range(stats.sizes["chain"])],
    }


def _chain_numbers(stats: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Per chain of a look's ``sample_stats``: its divergences and its mean log density."""
    return stats["diverging"].values.sum(axis=1), stats["logp"].values.mean(axis=1)


def starting_from(compiled, posterior: xr.Dataset, chain: int):
    """``compiled`` whose chains start at draws of ``posterior``'s ``chain`` (its second half: past where it came
    from), one drawn for each chain from the seed nutpie gives its initial point, on the unconstrained scale
    (the value variables of ``compiled.shape_info``, ``*_log__`` for the sds)."""
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

    return replace(compiled, initial_point_func=initial_point)


# nutpie's per-draw statistics that a trace leaves out: its own chain and draw numbers (the coordinates), and the
# vectors it fills only when asked to store them (gradients, mass matrices, divergences' ends), null otherwise
_NUTPIE_STATS_LEFT_OUT = frozenset({
    "chain", "draw", "unconstrained_draw", "gradient", "mass_matrix_inv", "mass_matrix_eigvals", "mass_matrix_stds",
    "divergence_start", "divergence_start_gradient", "divergence_end", "divergence_momentum",
})


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


def _tuning_rows(stats) -> int:
    """How many of a chain's rows (its record batch of sample stats) are tuning."""
    import pyarrow

    return int(np.asarray(pyarrow.array(stats.column("tuning")).to_numpy(zero_copy_only=False)).sum())


def _draws_done(stats) -> int:
    """Draws after tuning that every chain holds (the slowest chain's), from its record batches of sample stats:
    a poll that only counts the draws does not convert them (:func:`_arrow_idata`)."""
    return min((s.num_rows - _tuning_rows(s) for s in stats), default=0)


def _nutpie_idata(trace, coords: Mapping[str, Sequence]) -> Trace:
    """nutpie's raw trace (``return_raw_trace=True``) as ``posterior`` and ``sample_stats`` of the draws after
    tuning and, of tuning, the ``n_steps`` only (``warmup_sample_stats``, to count gradient evaluations).

    The same arrays, dims and coordinates as nutpie's own conversion (tests/test_inference.py compares them),
    which goes through ArviZ's ``from_dict`` for every group of draws: ~65 ms a fit, ~7 s over the default
    pipeline's 108 per-group fits. Chains shorter than the longest (a trace inspected while it runs) are
    padded as nutpie pads them: NaN for floats, 0 otherwise.
    """
    return _arrow_idata(*trace.get_arrow_trace(), coords)


def _arrow_idata(draws, stats, coords: Mapping[str, Sequence]) -> Trace:
    """:func:`_nutpie_idata` of the record batches a raw trace hands over (once: ``get_arrow_trace``)."""
    tuned = [_tuning_rows(s) for s in stats]
    kept = [d.num_rows - t for d, t in zip(draws, tuned, strict=True)]
    posterior = _arrow_dataset(draws, tuned, kept, lambda name: True, coords)
    sample_stats = _arrow_dataset(stats, tuned, kept, lambda name: name not in _NUTPIE_STATS_LEFT_OUT, coords)
    tuning = _arrow_dataset(stats, [0] * len(stats), tuned, lambda name: name == "n_steps", coords)
    return Trace(posterior=posterior, sample_stats=sample_stats, warmup_sample_stats=tuning)


def _arrow_dataset(batches, starts: Sequence[int], lengths: Sequence[int], keep, coords) -> xr.Dataset:
    """Rows ``starts[c]`` to ``starts[c] + lengths[c]`` of every chain's record batch as one ``(chain, draw, ...)``
    dataset of the columns ``keep(name)`` accepts, each column's dims and shape from nutpie's field metadata."""
    import pyarrow

    n_draws = max(lengths, default=0)
    arrays, dims = {}, {}
    for c, (batch, start, length) in enumerate(zip(batches, starts, lengths, strict=True)):
        for name in batch.column_names:
            if not keep(name):
                continue
            column = batch.column(name)
            meta = column.field.metadata
            shape = tuple(int(n) for n in meta[b"shape"].decode().split(",")) if meta.get(b"shape") else ()
            col = pyarrow.array(column).slice(start, length)
            values = col.flatten() if hasattr(col, "flatten") else col
            if name not in arrays:
                dtype = values.type.to_pandas_dtype()
                fill = np.nan if np.issubdtype(dtype, np.floating) else 0
                arrays[name] = np.full((len(batches), n_draws, *shape), fill, dtype=dtype)
                named = meta[b"dims"].decode().split(",") if meta.get(b"dims") else []
                dims[name] = ("chain", "draw", *(named or [f"{name}_dim_{i}" for i in range(len(shape))]))
            valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False))
            arrays[name][c, :length][valid] = values.to_numpy(zero_copy_only=False).reshape(-1, *shape)
    sizes = {d: n for name, a in arrays.items() for d, n in zip(dims[name], a.shape, strict=True)}
    return xr.Dataset(
        {name: (dims[name], a) for name, a in arrays.items()},
        # as ArviZ's from_dict: a dim without coordinates of its own gets 0, 1, ...
        coords={"chain": np.arange(len(batches)), "draw": np.arange(n_draws),
                **{d: pd.Index(coords[d]) if d in coords else np.arange(n) for d, n in sizes.items()
                   if d not in ("chain", "draw")}},
        attrs={"arviz_version": _ARVIZ_VERSION},
    )


# nutpie's conversion stamps ArviZ's version on every group; read from the package's metadata, not its import
_ARVIZ_VERSION = metadata.version("arviz")

CHECK_UNIT = 100  # nutpie's run-length control looks again in whole multiples of this many draws per chain
ESS_SPARE = 1.1  # ... aiming 10% past ESS_MIN, so that one look usually suffices
# ... and at least this share of the draws so far further on: a look ranks every draw so far (its cost grows with
# them), so looks every CHECK_UNIT draws where only R-hat missed cost ~2 s of a core each at 3000-4000 draws per
# chain on an AVX2 machine, 41 s over one fit's 20 looks; this way a fit stops at most ~10% past the first draws
# that pass.
LOOK_GROWTH = 0.1
# ... and at most this share further (at least CHECK_UNIT): the ESS so far is a noisy estimate (g02's fell from 389 at
# 500 draws to 206 at 600 in the default fit), and a look that overshoots the draws the bar needs costs whole draws
# of both chains, while one more look costs ~0.5 s of one core at 1000-2000 draws. Replayed on six hierarchical fits
# (fit_hier and transfer_prior at seeds 1-3), looks at most a block (500) further kept 8900 draws per chain in all,
# at most 20% further 8000 (the first draws that pass: 7900), with 29 looks instead of 19
# (benchmarks/FINDINGS.md, "Looks at most 20% further").
LOOK_MAX_GROWTH = 0.2


def look_unit(backend: str, draws: int) -> int:
    """The draws per chain between a run-length-controlled fit's possible looks: nutpie's :data:`CHECK_UNIT`,
    NumPyro's whole blocks of ``draws``."""
    return CHECK_UNIT if backend == "nutpie" else draws


def at_draw_limit(drawn: int, draws: int, max_draws: int, unit: int) -> bool:
    """Whether a run-length-controlled fit with ``drawn`` draws per chain can look no further (:func:`_next_check`
    stops there; it may be short of ``max_draws`` where ``unit`` does not divide it)."""
    return drawn + min(unit, draws) > max_draws


def _next_check(missing, drawn: int, s: SamplerParams, unit: int) -> int | None:
    """How many draws per chain a run-length-controlled fit has when it looks again, given what its ``drawn``
    draws miss (``None``: nothing, and so is the answer: stop); logs why it goes on, or that it stopped at
    ``max_draws`` still short.

    A bulk ESS grows in proportion to the draws of a mixing chain, so the draws that the smallest ESS so far
    (``missing.min_ess``, :class:`hbnn.diagnostics.evaluation.Shortfall`) extrapolates to, times :data:`ESS_SPARE`, are
    what the fit needs: the next look is there, rounded up to whole ``unit`` draws, at least ``unit`` and
    :data:`LOOK_GROWTH` of the draws so far further, and at most ``unit`` or :data:`LOOK_MAX_GROWTH` of them
    (rounded up to whole units) and at most ``draws`` (a ``missing`` without an ESS: that most; one whose ESS
    already suffices, where only R-hat misses: the least), and never past ``max_draws``. NumPyro's compiled
    loop draws whole blocks, so its ``unit`` is ``draws``.
    """
    if missing is None:
        return None
    if at_draw_limit(drawn, s.draws, s.max_draws, unit):
        log.warning("stopped at max_draws=%d draws per chain, and %s: the metrics and the report say "
                    "which groups miss the bar", s.max_draws, missing)
        return None
    step = s.draws
    ess = getattr(missing, "min_ess", None)
    if ess is not None and np.isfinite(ess) and ess > 0:
        from hbnn.diagnostics.evaluation import ESS_MIN

        short = max(drawn * ESS_MIN * ESS_SPARE / ess - drawn, LOOK_GROWTH * drawn)
        step = min(s.draws, max(unit, -(-short // unit) * unit))
    step = min(step, max(unit, -(-(LOOK_MAX_GROWTH * drawn) // unit) * unit))
    following = min(drawn + int(step), s.max_draws)
    log.info("after %d draws per chain, %s; looking again at %d (up to max_draws=%d)",
             drawn, missing, following, s.max_draws)
    return following


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


class PymcBackend(Backend):
    """PyMC's own NUTS through ``pm.sample``, which compiles on every call."""

    name = "pymc"
    compiles_in_sampling = True

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None):
        super().__init__(model, settings)
        self.model  # noqa: B018 - built now, not inside the first fit's sampling seconds

    def _sample_kwargs(self) -> dict:
        # keep the tuning steps to count gradient evaluations
        return {"discard_tuned_samples": False, "mp_ctx": _chain_process_context()}

    def run(self, seed, data, progressbar: bool | None = None):
        import pymc as pm

        s = self.settings
        self._set_data(data)
        with self.model:
            idata = pm.sample(
                draws=s.draws,
                tune=s.tune,
                chains=s.chains,
                cores=min(s.cores, s.chains),
                random_seed=seed,
                target_accept=s.target_accept,
                progressbar=logs.interactive() if progressbar is None else progressbar,
                compute_convergence_checks=False,
                nuts_sampler=self.name,
                **self._sample_kwargs(),
            )
        return idata, None, self._grad_evals(idata)

    def _grad_evals(self, idata) -> int | None:
        return _leapfrog_steps(idata, "warmup_sample_stats", "sample_stats")


def _chain_process_context() -> str | None:
    """How PyMC starts its chain processes: its default (fork on Linux) unless JAX is loaded.

    JAX runs threads from import on; a forked child of a multithreaded process can deadlock
    (JAX warns so at every fork). A process that has used a JAX backend and then samples with
    PyMC's NUTS (library use, the test suite) starts its chains from a forkserver instead.
    """
    return "forkserver" if "jax" in sys.modules else None


class JaxBackend(PymcBackend):
    """NumPyro's or BlackJAX's NUTS through PyMC's JAX bridge (the JAX extra: ``make jax``).

    The bridge traces and jits on every call and does not report tuning steps,
    so gradient evaluations are unknown (``None``).
    """

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None):
        _require_jax(self.name)
        super().__init__(model, settings)
        _use_host_devices(max(settings.cores, 1))

    def _sample_kwargs(self) -> dict:
        s = self.settings
        return {"discard_tuned_samples": True,
                "nuts_sampler_kwargs": {"chain_method": "parallel" if s.chains <= s.cores else "sequential"}}

    def _grad_evals(self, idata) -> int | None:
        return None


class NumpyroBackend(JaxBackend):
    """NumPyro's NUTS. In a log, its progress callbacks are recorded (not drawn) for the heartbeat.

    With ``max_draws`` and a :attr:`Backend.until` check, a run whose draws miss the convergence bar goes
    on from where it stopped (no new warmup: the adapted step size and mass matrix are kept) in blocks of
    ``draws`` per chain, up to ``max_draws``; the trace holds every block.
    """

    name = "numpyro"

    def run(self, seed, data, progressbar=None):
        # NumPyro reports progress from inside its compiled loop only when the chains run in parallel;
        # sequential chains with a progress bar fall back to a Python loop, one dispatch per step.
        count = not logs.interactive() and self._sample_kwargs()["nuts_sampler_kwargs"]["chain_method"] == "parallel"
        extend = self._extension() if self.settings.max_draws > self.settings.draws and self.until else None
        if not count and extend is None:
            return super().run(seed, data, progressbar)
        with _numpyro_patched(count, extend) as self.iterations:
            try:
                return super().run(seed, data, progressbar=True if count else progressbar)
            finally:
                self.iterations = None

    def _extension(self):
        """``more(states)``: whether to draw another block, given NumPyro's states so far (chain, draw, ...)."""
        import arviz
        import jax
        from pymc.backends.arviz import coords_and_dims_for_inferencedata
        from pymc.sampling.jax import get_jaxified_graph
        from pymc.util import get_default_varnames

        s, model, until = self.settings, self.model, self.until
        outputs = list(get_default_varnames(model.unobserved_value_vars, include_transformed=False))
        constrain = jax.jit(jax.vmap(jax.vmap(get_jaxified_graph(inputs=model.value_vars, outputs=outputs))))
        coords, dims = coords_and_dims_for_inferencedata(model)

        def more(states: dict) -> bool:
            drawn = states["diverging"].shape[1]
            values = constrain(*states["z"])
            posterior = arviz.dict_to_dataset({v.name: np.asarray(x) for v, x in zip(outputs, values, strict=True)},
                                           coords=coords, dims=dims, library=None)
            return _next_check(until(posterior), drawn, s, look_unit(s.backend, s.draws)) is not None

        return more


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


@contextlib.contextmanager
def _numpyro_patched(count: bool, extend=None):
    """NumPyro's ``MCMC``, as PyMC's bridge runs it, changed in two ways while the context lasts.

    ``count``: its progress-bar updates are counted instead of drawn (``numpyro.util.progress_bar_factory``
    makes one ``tqdm_auto`` bar per chain and updates it from a host callback every few iterations), and
    every draw after tuning reports whether it diverged (a host callback from NUTS's sample step), so the
    heartbeat shows divergences as they happen; the context yields the :class:`Iterations` (``None``
    without ``count``). ``extend``: after the run, while
    ``extend(states)`` says so, the chains go on from their last state for another ``num_samples`` draws
    (no warmup), NumPyro's own recipe for more draws (``post_warmup_state = last_state``), and every block
    is kept.
    """
    import jax
    import numpyro.infer
    import numpyro.util

    iterations = Iterations() if count else None
    lock = threading.Lock()

    def diverged(flag) -> None:  # called from NumPyro's compiled loop, one thread per chain
        with lock:
            iterations.divergences += int(flag)

    class CountedNUTS(numpyro.infer.NUTS):
        def init(self, rng_key, num_warmup, *args, **kwargs):
            self.tuning = num_warmup  # iterations with state.i below this are tuning (also on going on)
            return super().init(rng_key, num_warmup, *args, **kwargs)

        def sample(self, state, model_args, model_kwargs):
            new = super().sample(state, model_args, model_kwargs)
            jax.debug.callback(diverged, new.diverging & (state.i >= self.tuning))
            return new

    class Recorder:
        def __init__(self, iterable, **_):
            iterations.total += len(iterable)

        def set_description(self, *args, **kwargs) -> None:
            pass

        def update(self, n: int) -> None:
            iterations.add(int(n))

        def close(self) -> None:
            pass

    class Patched(numpyro.infer.MCMC):
        def __init__(self, *args, progress_bar: bool = True, **kwargs):
            super().__init__(*args, progress_bar=progress_bar, **kwargs)
            # NumPyro turns its progress callbacks off where ``CI`` is set (CI services, `dvc repro` in a
            # pipeline): exactly the logs the heartbeat is for. Keep them on; they are counted, never drawn.
            if count and self.chain_method == "parallel":
                self.progress_bar = progress_bar

        def run(self, rng_key, *args, **kwargs):
            super().run(rng_key, *args, **kwargs)
            if extend is None:
                return
            states = jax.device_get(self._states)
            while extend(states):
                self.post_warmup_state = self.last_state
                super().run(self.post_warmup_state.rng_key, *args, **kwargs)
                states = jax.tree.map(lambda a, b: np.concatenate([a, b], axis=1), states,
                                      jax.device_get(self._states))
            self._states, self._states_flat = states, None

    real = numpyro.util.tqdm_auto, numpyro.infer.MCMC, numpyro.infer.NUTS
    if count:
        numpyro.util.tqdm_auto, numpyro.infer.NUTS = Recorder, CountedNUTS
        iterations.divergences = 0
    numpyro.infer.MCMC = Patched
    try:
        yield iterations
    finally:
        numpyro.util.tqdm_auto, numpyro.infer.MCMC, numpyro.infer.NUTS = real


class BlackjaxBackend(JaxBackend):
    name = "blackjax"


class AdviBackend(Backend):
    """Mean-field ADVI (:class:`_Advi`), then ``chains x draws`` draws from the approximation."""

    name = "advi"

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None):
        super().__init__(model, settings)
        self.advi = _Advi(self.model, settings.advi.learning_rate)

    @staticmethod
    def minibatch_size(settings: SamplerParams) -> int | None:
        return settings.advi.minibatch_size or None

    @staticmethod
    def parallel_chains(settings: SamplerParams) -> int:
        return 1

    def label(self) -> str:
        a = self.settings.advi
        return f"fitting: backend=advi iterations={a.iterations} minibatch={a.minibatch_size}"

    def run(self, seed, data):
        self._set_data(data)
        self.iterations = Iterations(self.settings.advi.iterations, "ADVI iterations")
        try:
            idata, loss = self.advi.fit(seed, self.settings, self.iterations)
        finally:
            self.iterations = None
        return idata, loss, None


BACKENDS: dict[str, type[Backend]] = {
    b.name: b for b in (NutpieBackend, PymcBackend, NumpyroBackend, BlackjaxBackend, AdviBackend)
}


def backend_class(settings: SamplerParams) -> type[Backend]:
    """The :class:`Backend` that ``settings.backend`` names."""
    return BACKENDS[settings.backend]


class Sampler:
    """A model compiled once for the configured backend (:data:`BACKENDS`).

    ``nutpie`` compiles the model with numba once and refits new data with
    ``with_data``; ``advi`` compiles one optimisation step and resets its state per
    fit; ``pymc``, ``numpyro`` and ``blackjax`` go through ``pm.sample``, which
    compiles (PyMC) or traces and jits (JAX) on every call.

    ``model`` is the PyMC model or a function that builds it: with a hand-written ``density`` (nutpie only,
    :mod:`hbnn.density.kernel`) it is built only where the density has yet to be checked against it.
    """

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None):
        self.settings = settings
        start = time.perf_counter()
        self.backend = backend_class(settings)(model, settings, density)
        # None where the compile happens inside every sampling call (counted in its seconds)
        self.compile_seconds = None if self.backend.compiles_in_sampling else time.perf_counter() - start

    def sample(self, seed: int, data: Mapping[str, np.ndarray] | None = None, *, watch: bool = True,
               expected_seconds: float | None = None, until=None) -> Fit:
        """Fit with the configured settings; ``data`` replaces ``pm.Data`` values.

        ``until(posterior)`` says what in a posterior (model variables, ``chain``/``draw`` dims) misses
        the convergence bar, or ``None``; with ``max_draws`` the fit goes on in blocks of ``draws`` while
        it says something (backends that can, :class:`NumpyroBackend`), else it is not called.

        In a log (not a terminal) and with ``watch``, a heartbeat line every 10 s
        says how long the fit has run and, given ``expected_seconds`` (the cost
        estimate of :mod:`hbnn.pipeline.budget`), about how long is left; a caller that
        reports its own progress (a loop over groups) passes ``watch=False``.
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
        """:meth:`sample` of every ``(seed, data)`` in ``jobs``, in order, without a heartbeat (the caller
        reports its groups' progress).

        With nutpie, the next fit starts before this one is over: the chains of one fit end at different times,
        and the core a finished chain leaves would otherwise wait for the slowest one. Each fit's draws are its
        own seed's whatever runs beside it; its ``seconds`` are the wall time from its start, or the previous
        fit's end if later, to its end, so they add up to the loop's."""
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


class _Advi:
    """Mean-field ADVI whose optimisation step is compiled once and reused.

    Every :meth:`fit` restores the approximation's and the optimiser's starting
    state, reseeds every random stream (Monte Carlo ELBO draws, minibatch indices)
    and runs ``iterations`` Adam steps, so fits do not depend on earlier fits.
    The approximation's means start at the model's initial point plus
    ``N(0, init_jitter)`` noise: at all-zero weights a tanh network sits on a
    saddle where every hidden unit looks alike, and ADVI started there stays
    near it (hierarchical test accuracy 0.44 instead of 0.86 on the default data).
    """

    def __init__(self, model: pm.Model, learning_rate: float):
        import pymc as pm
        from pytensor.tensor.random.type import RandomType

        self.model = model
        with model:
            self.inference = pm.ADVI()
            self.step = self.inference.objective.step_function(
                obj_optimizer=pm.adam(learning_rate=learning_rate), score=True
            )
        data = {id(v) for v in model.data_vars}
        self.state = [v for v in self.step.get_shared() if id(v) not in data]
        self.initial = [copy.deepcopy(v.get_value(borrow=False)) for v in self.state]
        self.rngs = [v for v in self.state if isinstance(v.type, RandomType)]
        (group,) = self.inference.approx.groups
        self.mean = group.params_dict["mu"]
        self.mean_start = self.mean.get_value(borrow=False).copy()

    def fit(self, seed: int, s: SamplerParams, progress: Iterations | None = None
            ) -> tuple[Trace, np.ndarray]:
        from pymc.pytensorf import reseed_rngs

        for var, value in zip(self.state, self.initial, strict=True):
            var.set_value(copy.deepcopy(value))
        fit_seed, draw_seed, init_seed = np.random.SeedSequence(seed).generate_state(3)
        reseed_rngs(self.rngs, int(fit_seed))
        jitter = np.random.default_rng(init_seed).normal(0.0, s.advi.init_jitter, self.mean_start.shape)
        self.mean.set_value(self.mean_start + jitter)
        loss = np.empty(s.advi.iterations)
        for i in range(s.advi.iterations):
            loss[i] = self.step()
            if progress is not None:
                progress.add(1)
        if not np.all(np.isfinite(loss)):
            bad = int(np.flatnonzero(~np.isfinite(loss))[0])
            raise FloatingPointError(
                f"ADVI loss became {loss[bad]} at iteration {bad}; lower sampler.advi.learning_rate "
                f"(now {s.advi.learning_rate})"
            )
        with self.model:
            draws = self.inference.approx.sample(s.chains * s.draws, random_seed=int(draw_seed),
                                                 return_inferencedata=True)
        posterior = _as_chains(draws.posterior, s.chains, s.draws)
        stats = xr.Dataset(
            {
                "diverging": (("chain", "draw"), np.zeros((s.chains, s.draws), dtype=bool)),
                "loss": ("advi_iteration", loss),
            },
            coords={"chain": posterior["chain"], "draw": posterior["draw"],
                    "advi_iteration": np.arange(s.advi.iterations)},
        )
        return Trace(posterior=posterior, sample_stats=stats), loss


def _as_chains(posterior: xr.Dataset, chains: int, draws: int) -> xr.Dataset:
    """Split one chain of ``chains * draws`` independent draws into ``(chain, draw)``."""
    out = {}
    for name, da in posterior.data_vars.items():
        da = da.isel(chain=0, drop=True)
        values = da.values.reshape(chains, draws, *da.shape[1:])
        dims = ("chain", "draw", *da.dims[1:])
        coords = {d: da.coords[d] for d in da.dims[1:] if d in da.coords}
        out[name] = xr.DataArray(values, dims=dims, coords=coords)
    return xr.Dataset(out, coords={"chain": np.arange(chains), "draw": np.arange(draws)})
