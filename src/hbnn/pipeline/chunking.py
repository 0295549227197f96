"""How many rows ``hbnn predict`` scores at a time, so that its memory stays within :data:`SCORING_BUDGET` whatever
the number of rows (:func:`chunk_rows`), and how a group's rows are cut (:func:`chunks`)."""

from __future__ import annotations

from dataclasses import dataclass

from hbnn.errors import InputError
from hbnn.model import likelihoods
from hbnn.model.forward import BLOCK

# bytes the arrays scoring one chunk of rows may hold: the default hierarchical trace (2 chains of up to 10,000 draws)
# is scored 333 rows or more at a time, and traces of up to ~48,000 draws (of a 40-weight network) fit at all
SCORING_BUDGET = 256 * 2**20
WEIGHT_COPIES = 4  # (draw, weight) arrays: the new-group draws, and per chunk the forward pass's flat copy and reshape


@dataclass(frozen=True)
class Plan:
    """How a group's rows are scored: the forward pass over ``rows`` at a time (whole
    :data:`~hbnn.model.forward.BLOCK` s), their summaries over ``summary_rows`` at a time; ``peak``: the most bytes one
    chunk's arrays hold."""

    rows: int
    summary_rows: int
    peak: int


def chunk_rows(samples: int, n_weights: int, likelihood: str, largest_group: int, budget: int | None = None
               ) -> Plan:
    """Plan chunks of rows whose scoring arrays stay within a memory budget.

    The arrays are ``samples`` kept draws x rows x the likelihood's
    :attr:`~hbnn.model.likelihoods.base.Likelihood.summary_arrays`, plus :data:`WEIGHT_COPIES` of the network
    weights per draw, all float64. The forward pass takes whole :data:`~hbnn.model.forward.BLOCK` s of rows, so the
    compiled loop sees every row in the same place of its block as when a group is scored at once. Where a block's
    summaries do not fit beside it, they are taken a few rows at a time. A piece has one row in hand: a group's last
    row is never a piece of its own (:func:`chunks`).

    Parameters
    ----------
    samples, n_weights : int
        Kept posterior draws (chains x draws); network weights per draw.
    likelihood : str
        The likelihood's name (:func:`hbnn.model.likelihoods.get`).
    largest_group : int
        The most rows one group has.
    budget : int, optional
        Bytes the arrays may hold; default :data:`SCORING_BUDGET`.

    Returns
    -------
    Plan
        Rows per forward pass and per summary, and the peak bytes.

    Raises
    ------
    hbnn.errors.InputError
        If even the smallest chunk would not fit within ``budget``.
    """
    budget = SCORING_BUDGET if budget is None else budget
    value = 8 * samples  # bytes of one row's draws
    arrays = likelihoods.get(likelihood).summary_arrays
    room = budget - value * n_weights * WEIGHT_COPIES
    whole = min(BLOCK + 1, largest_group)
    if arrays * value * whole <= room:  # whole blocks summarised at once
        rows = max(BLOCK, (room // (arrays * value) - 1) // BLOCK * BLOCK)
        return Plan(rows, rows, budget - room + arrays * value * min(rows + 1, largest_group))
    summary_rows = (room - value * whole) // (arrays * value) - 1
    smallest = min(3, largest_group)  # pieces of 2 rows, one of them 3
    if summary_rows + 1 < smallest:
        need = budget - room + value * (whole + arrays * smallest)
        raise InputError(f"scoring with this trace needs about {size_text(need)} at the least (the network outputs of "
                         f"{whole} rows x {samples:,} posterior draws, {arrays} float64 arrays of them to summarise "
                         f"{smallest} rows, and {WEIGHT_COPIES} copies of the draws' {n_weights:,} weights), over the "
                         f"limit of {size_text(budget)}; score with a trace that keeps fewer draws")
    summary_rows = max(2, summary_rows)
    return Plan(BLOCK, summary_rows, budget - room + value * (whole + arrays * min(summary_rows + 1, whole)))


def size_text(n: int) -> str:
    """Bytes as MiB (KiB below one MiB), for messages.

    Parameters
    ----------
    n : int
        Bytes.

    Returns
    -------
    str
    """
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


def chunks(n: int, size: int) -> list[slice]:
    """Split ``range(n)`` into slices of ``size`` rows, never leaving a last row alone.

    The last slice takes one row more rather than leaving one alone: NumPy sums a single column pairwise, so a row's
    mean alone would differ in the last bit from the same row's beside others.

    Parameters
    ----------
    n, size : int
        Number of rows; rows per slice.

    Returns
    -------
    list of slice
        Consecutive slices covering ``range(n)``.
    """
    starts = list(range(0, n, size))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return [slice(a, b) for a, b in zip(starts, [*starts[1:], n], strict=True)]
