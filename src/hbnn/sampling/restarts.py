"""Restarts: when a run-length-controlled fit's chains start again, and what the trace records of it.

**A restart**: every chain of a fit starts again, warmup included, from the best chain's draws, when a look
(defined in :mod:`hbnn.sampling.runlength`) finds the chains diverging past the bar (defined in
:mod:`hbnn.diagnostics.criterion`) or stuck in different places. :func:`restart_reason` decides whether and from
which chain; the attempt left behind is recorded in the trace and the metrics.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

from hbnn.files.trace import Trace

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


RESTART_SEED_KEY = 100  # derive_seed(fit seed, RESTART_SEED_KEY, k): each restart's chains get seeds of their own


# At a run-length-controlled fit's look, divergences restart the chains where a Poisson count at the bar's share
# of the draws reaches them with less than this chance (one-sided): 5 or more at 2 x 500 draws, so a stray
# divergence does not restart, a chain diverging steadily does (benchmarks/FINDINGS.md, "Chains started again")
RESTART_DIVERGENCE_P = 0.01


# At a run-length-controlled fit's look, an R-hat past this says the chains sit in different places, more than
# slow mixing explains: it lies between what slow but healthy chains reach at a first look and what chains stuck
# in a worse region gave (benchmarks/FINDINGS.md, "Chains started again")
RESTART_RHAT = 1.2


# ... and a chain is in a worse region where its mean log density lies this many standard errors (from each chain's
# ESS of the mean) below the best chain's: well short of how far the stuck chains lay below (benchmarks/FINDINGS.md,
# "Chains started again")
RESTART_LOGP_Z = 4.0


def restart_reason(head: Trace, missing) -> tuple[str, int] | None:
    """Why the chains of a fit's look should start again, and from which chain's draws.

    - More divergences than the bar's share (:data:`hbnn.config.DIVERGENT_SHARE_MAX` of the draws) explains
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

    Parameters
    ----------
    head : hbnn.files.trace.Trace
        The draws so far, with ``posterior`` and ``sample_stats`` (``diverging``, ``logp``, ``step_size``).
    missing : hbnn.diagnostics.criterion.Shortfall or None
        What the look found short of the bar; ``None`` when R-hat and ESS meet it.

    Returns
    -------
    tuple of (str, int) or None
        The reason, as the log and the trace say it, and the chain to restart from; ``None`` for no restart.
    """
    from scipy.special import pdtrc

    from hbnn.config import DIVERGENT_SHARE_MAX
    from hbnn.diagnostics.convergence import ess_mean

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
    from hbnn.diagnostics.criterion import divergences_within_bar

    diverging = head.sample_stats["diverging"].values
    total = int(diverging.sum())
    if missing is None and not divergences_within_bar(total, diverging.size):
        return total, int(diverging.size)
    return None


def _warn_divergent_stop(head: Trace, missing, used: int, allowed: int) -> None:
    """Log a fit that stops meeting the R-hat and ESS bar with divergences past it and no restart left to mend
    them (:func:`restart_reason` restarts such a fit while it can)."""
    from hbnn.config import DIVERGENT_SHARE_MAX

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
