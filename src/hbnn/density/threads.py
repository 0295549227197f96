"""The cores a sampler's chains leave, given to the hierarchical density: each gradient's groups split over threads.

nutpie runs each chain on a thread of its own, so a fit with fewer chains than ``cores`` leaves cores idle. The
hierarchical density can use them inside each gradient: :func:`hbnn.density.kernel.logp_grad_threads` splits the
groups' passes over their rows across numba's threads and sums the groups on the chain's thread in group order, so
the draws are the same, to the bit, whatever the number of threads. :func:`per_chain` says how many threads a chain
gets, :func:`usable` whether numba can run them from several chains at once, and :func:`same_bits` checks a split
callback against the serial one before a fit samples it.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)


def per_chain(cores: int, chains: int, groups: int, cpus: int | None = None) -> int:
    """The threads each chain's gradient may use: the cores the chains leave, shared out.

    Parameters
    ----------
    cores : int
        The fit's ``cores`` setting: chains run side by side on up to this many.
    chains : int
        The fit's chains.
    groups : int
        The density's groups; a block of groups is the smallest share of a gradient a thread takes.
    cpus : int, optional
        The CPUs this process may run on (default: its affinity's); ``cores`` past them would only make threads
        wait for each other.

    Returns
    -------
    int
        ``min(cores, cpus) // chains``, at least 1 and at most ``groups``.
    """
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    return max(1, min(min(cores, cpus) // max(chains, 1), groups))


@functools.cache
def usable(threads: int) -> int:
    """``threads``, or fewer where numba cannot run them: its threading layer must be safe to enter from several
    chains' threads at once (TBB or OpenMP; numba's own workqueue layer is not), and ``NUMBA_NUM_THREADS`` caps
    the count.

    Where the process has not started numba's threads yet and ``NUMBA_THREADING_LAYER`` is numba's default, this
    asks numba for a thread-safe layer; a layer the user chose is kept, and used only if it is thread-safe.

    Parameters
    ----------
    threads : int
        The threads a chain's gradient would use (:func:`per_chain`).

    Returns
    -------
    int
        The threads it can use: 1 where no safe layer runs (with a warning that says why).
    """
    if threads <= 1:
        return 1
    import numba

    cap = numba.config.NUMBA_NUM_THREADS
    if threads > cap:
        log.info("density threads: %d a chain, capped at NUMBA_NUM_THREADS=%d", threads, cap)
        threads = cap
    if threads <= 1:
        return 1
    try:
        layer = numba.threading_layer()  # chosen once a process, when its threads start
    except ValueError:  # not started yet
        chosen = numba.config.THREADING_LAYER
        if chosen == "default":
            numba.config.THREADING_LAYER = "threadsafe"
        try:
            numba.get_num_threads()  # starts them
            layer = numba.threading_layer()
        except Exception as err:  # noqa: BLE001 - no layer starts: the fit samples on one thread a chain
            numba.config.THREADING_LAYER = chosen
            layer = f"none that starts ({type(err).__name__}: {err})"
    if layer not in ("tbb", "omp"):
        log.warning("density threads: numba's threading layer is %s, which chains cannot share; each chain's "
                    "gradient runs on one thread (with TBB, or OpenMP's libgomp, it would split)", layer)
        return 1
    return threads


def same_bits(serial, split, buf: np.ndarray, point: np.ndarray) -> bool:
    """Whether two logp callbacks give the same value and gradient, to the bit, at ``point`` and at a point beside it.

    Parameters
    ----------
    serial, split : numba.core.ccallback.CFunc
        nutpie logp callbacks (:data:`hbnn.density.callbacks._C_SIG`) over the same buffer.
    buf : numpy.ndarray
        Their ``user_data``: :func:`hbnn.density.buffer.pack`'s buffer.
    point : numpy.ndarray
        A point of the sampler's flat vector (a chain's centre).

    Returns
    -------
    bool
        True where both give the same return code, value and gradient at both points.
    """
    import ctypes

    import numba
    import numpy as np

    pointer = ctypes.POINTER(ctypes.c_double)
    results = []
    threads = numba.get_num_threads()  # the split callback sets the calling thread's: put back after
    try:
        for x in (point, point + np.random.default_rng(0).uniform(-1.0, 1.0, point.size)):
            x = np.ascontiguousarray(x, dtype=np.float64)
            for callback in (serial, split):
                grad, value = np.zeros(x.size), np.zeros(1)
                code = callback.ctypes(x.size, x.ctypes.data_as(pointer), grad.ctypes.data_as(pointer),
                                       value.ctypes.data_as(pointer), buf.ctypes.data)
                results.append(np.concatenate([[code], value, grad]).tobytes())
    finally:
        numba.set_num_threads(threads)
    return results[0] == results[1] and results[2] == results[3]
