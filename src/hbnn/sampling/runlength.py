"""Run-length control: when a fit whose draws miss the convergence bar looks at its draws again."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from hbnn.config import SamplerParams

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


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
    (``missing.min_ess``, :class:`hbnn.diagnostics.criterion.Shortfall`) extrapolates to, times :data:`ESS_SPARE`, are
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
        from hbnn.config import ESS_MIN

        short = max(drawn * ESS_MIN * ESS_SPARE / ess - drawn, LOOK_GROWTH * drawn)
        step = min(s.draws, max(unit, -(-short // unit) * unit))
    step = min(step, max(unit, -(-(LOOK_MAX_GROWTH * drawn) // unit) * unit))
    following = min(drawn + int(step), s.max_draws)
    log.info("after %d draws per chain, %s; looking again at %d (up to max_draws=%d)",
             drawn, missing, following, s.max_draws)
    return following
