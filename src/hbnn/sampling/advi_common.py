"""What every mean-field ADVI fit shares, whichever log density it fits (PyTensor's, :mod:`hbnn.sampling.advi`, or
the hand-written one, :mod:`hbnn.sampling.density_advi`): its random streams, the starting points, the check of its
loss and the trace it leaves."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

from hbnn.config import SamplerParams
from hbnn.files.trace import Trace

log = logging.getLogger(__name__)


def start_seed(seed: int, start: int) -> int:
    """The seed of an ADVI fit's ``start``-th starting point: ``seed`` itself for the first, so that one start is the
    fit of ``seed``; each further one its own stream derived from both.

    Parameters
    ----------
    seed : int
        The fit's seed.
    start : int
        0, 1, ... up to ``advi.starts - 1``.

    Returns
    -------
    int
    """
    return seed if start == 0 else int(np.random.SeedSequence([seed, start]).generate_state(1)[0])


def final_loss(loss: np.ndarray) -> float:
    """A fit's final loss: the mean over the last quarter of its steps (each step's loss is one Monte Carlo draw).

    Parameters
    ----------
    loss : numpy.ndarray
        The loss per step.

    Returns
    -------
    float
    """
    return float(np.mean(loss[-max(1, len(loss) // 4):]))


def keep_best(fit: Callable[[int], tuple[Any, np.ndarray]], seed: int, starts: int) -> tuple[Any, np.ndarray]:
    """Fit from ``starts`` starting points and keep the fit with the lowest :func:`final_loss` (the highest ELBO).

    From different starting points mean-field ADVI of a network can settle in optima whose ELBO differs by thousands
    of nats (benchmarks/FINDINGS.md, "Full-batch ADVI on the hand-written density"). The starts run one after
    another and at most two fits' draws are held at once; the first start wins ties.

    Parameters
    ----------
    fit : callable
        Fits from a seed; returns ``(posterior, loss)``.
    seed : int
        The fit's seed: start ``i`` is fitted from :func:`start_seed` ``(seed, i)``.
    starts : int
        ``advi.starts``.

    Returns
    -------
    tuple
        The ``(posterior, loss)`` kept.

    Raises
    ------
    FloatingPointError
        Where a start's loss is not finite; with several starts the message names the start and its seed.
    """
    best, finals = None, []
    for i in range(starts):
        try:
            posterior, loss = fit(start_seed(seed, i))
        except FloatingPointError as err:
            if starts == 1:
                raise
            raise FloatingPointError(f"{err} (start {i + 1} of {starts}, seed {start_seed(seed, i)})") from None
        finals.append(final_loss(loss))
        if best is None or finals[-1] < min(finals[:-1]):
            best = (posterior, loss)
        del posterior, loss  # only ``best`` keeps a fit's draws
    if starts > 1:
        log.info("ADVI from %d starting points: final loss (mean over the last quarter of the steps) %s; keeping start "
                 "%d", starts, ", ".join(f"{f:.6g}" for f in finals), int(np.argmin(finals)) + 1)
    return best


def split_seed(seed: int) -> tuple[int, int, int]:
    """An ADVI fit's three streams from its seed: the optimisation's (Monte Carlo ELBO draws, minibatch indices),
    the draws from the fitted approximation, and the starting means' jitter.

    Parameters
    ----------
    seed : int

    Returns
    -------
    tuple of int
        ``(fit_seed, draw_seed, init_seed)``.
    """
    fit_seed, draw_seed, init_seed = np.random.SeedSequence(seed).generate_state(3)
    return int(fit_seed), int(draw_seed), int(init_seed)


def check_loss(loss: np.ndarray, learning_rate: float) -> None:
    """Refuse a fit whose loss is not finite.

    Parameters
    ----------
    loss : numpy.ndarray
        The loss per step so far.
    learning_rate : float
        ``advi.learning_rate``, for the message.

    Raises
    ------
    FloatingPointError
        Naming the first non-finite step and ``sampler.advi.learning_rate``.
    """
    if not np.all(np.isfinite(loss)):
        bad = int(np.flatnonzero(~np.isfinite(loss))[0])
        raise FloatingPointError(
            f"ADVI loss became {loss[bad]} at iteration {bad}; lower sampler.advi.learning_rate "
            f"(now {learning_rate})"
        )


def advi_trace(posterior: xr.Dataset, loss: np.ndarray, s: SamplerParams) -> Trace:
    """An ADVI fit's trace: its ``(chain, draw)`` posterior, and ``sample_stats`` with no divergence and the loss.

    Parameters
    ----------
    posterior : xarray.Dataset
        ``chains x draws`` draws from the approximation.
    loss : numpy.ndarray
        The loss per step.
    s : hbnn.config.SamplerParams
        ``chains``, ``draws`` and ``advi.iterations``.

    Returns
    -------
    hbnn.files.trace.Trace
        ``sample_stats``: ``diverging`` all False over ``(chain, draw)``, ``loss`` over ``advi_iteration``.
    """
    stats = xr.Dataset(
        {
            "diverging": (("chain", "draw"), np.zeros((s.chains, s.draws), dtype=bool)),
            "loss": ("advi_iteration", loss),
        },
        coords={"chain": posterior["chain"], "draw": posterior["draw"],
                "advi_iteration": np.arange(s.advi.iterations)},
    )
    return Trace(posterior=posterior, sample_stats=stats)
