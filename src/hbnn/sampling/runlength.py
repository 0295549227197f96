"""Run-length control: when a fit whose draws miss the bar looks at its draws again.

**A look** is a check of a run-length-controlled fit's draws so far during sampling: the draws are judged
against the bar (defined in :mod:`hbnn.diagnostics.criterion`), after which sampling stops (everything meets the
bar, or ``max_draws`` is reached) or draws on to the next look, whose place this module decides. A look may
also restart the chains (:mod:`hbnn.sampling.restarts`).
"""

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
# them), so looks every CHECK_UNIT draws add up on long fits; this way a fit stops at most ~10% past the first
# draws that pass (benchmarks/FINDINGS.md, "An AVX2 machine: the kernel's float-to-int conversion").
LOOK_GROWTH = 0.1


# ... and at most this share further (at least CHECK_UNIT): the ESS so far is a noisy estimate, and a look that
# overshoots the draws the bar needs costs whole draws of both chains, while one more look costs far less; replayed
# fits kept fewer draws this way at the price of a few more looks (benchmarks/FINDINGS.md, "Looks at most 20%
# further").
LOOK_MAX_GROWTH = 0.2


def look_unit(backend: str, draws: int) -> int:
    """The draws per chain between a run-length-controlled fit's possible looks.

    Parameters
    ----------
    backend : str
        The sampler backend: ``"nutpie"`` looks every :data:`CHECK_UNIT` draws; NumPyro's compiled loop draws
        whole blocks of ``draws``.
    draws : int
        The fit's block of draws per chain (``draws`` of its sampler params).

    Returns
    -------
    int
        Draws per chain between possible looks.
    """
    return CHECK_UNIT if backend == "nutpie" else draws


def at_draw_limit(drawn: int, draws: int, max_draws: int, unit: int) -> bool:
    """Whether a run-length-controlled fit can look no further.

    The fit stops there (:func:`_next_check`), which may be short of ``max_draws`` where ``unit`` does not
    divide it.

    Parameters
    ----------
    drawn : int
        Draws per chain so far.
    draws : int
        The fit's block of draws per chain.
    max_draws : int
        The most draws per chain the fit may take.
    unit : int
        Draws per chain between possible looks (:func:`look_unit`).

    Returns
    -------
    bool
        Whether the next possible look would pass ``max_draws``.
    """
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
