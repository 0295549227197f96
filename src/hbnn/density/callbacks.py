"""nutpie's callbacks around the hand-written density: the log density's (:data:`CALLBACK_SOURCE`, compiled by
:func:`callback`, or written into a cached module by :func:`hbnn.density.written.callback_for`) and the expanded
draw's (:func:`expand`).

Both read ``user_data``, :func:`hbnn.density.buffer.pack`'s buffer, through a raw pointer; :mod:`hbnn.density.written`
compiles this module's functions from its text as imported (:data:`SOURCE`).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numba
import numpy as np

from hbnn.density.kernel import _HEADER, _PER_LAYER, HIERARCHICAL, INFORMED, _mean_plus_chol

SOURCE = Path(__file__).read_text()  # as imported: hbnn.density.written compiles expand from this text


_C_SIG = numba.types.int64(numba.types.uint64, numba.types.CPointer(numba.types.double),
                           numba.types.CPointer(numba.types.double), numba.types.CPointer(numba.types.double),
                           numba.types.voidptr)


# nutpie's logp callback, as text: :func:`callback` compiles it with ``SKIP`` and ``logp_grad`` bound, and
# :func:`hbnn.density.written.callback_for` writes it into a module that numba caches on disk.
CALLBACK_SOURCE = """\
def logp_callback(dim, x_, out_, logp_, user_data_):
    size = int(numba.carray(user_data_, (SKIP + 1,), np.float64)[SKIP])
    buf = numba.carray(user_data_, (SKIP + size,), np.float64)[SKIP:]
    n_dim = int(buf[10])
    if dim != n_dim:
        return -1
    x = numba.carray(x_, (n_dim,))
    out = numba.carray(out_, (n_dim,))
    value = logp_grad(x, out, buf)
    logp_[0] = value
    if not np.all(np.isfinite(out)):
        return 3
    if not np.isfinite(value):
        return 4
    return 0
"""


@functools.cache
def callback(skip: int, fn):
    """nutpie's logp callback, compiled in this process.

    Never cached: a fit takes the cached one of :func:`hbnn.density.written.callback_for`
    (:meth:`hbnn.density.densities.Density.callback`); the tests compare the two.

    Parameters
    ----------
    skip : int
        How many float64 slots into ``user_data`` the :func:`hbnn.density.buffer.pack` buffer starts (0 for
        :meth:`hbnn.density.densities.Density.nutpie_model`, whose ``user_data`` is the buffer).
    fn : callable
        Computes the density, with :func:`logp_grad`'s signature (a written module's).

    Returns
    -------
    numba.core.ccallback.CFunc
        Returns 0 on success, as nutpie expects (3: a non-finite gradient, 4: a non-finite value, -1: a vector
        of the wrong size).
    """
    namespace = {"numba": numba, "np": np, "SKIP": int(skip), "logp_grad": fn}
    exec(CALLBACK_SOURCE, namespace)  # noqa: S102 - our own text, the same that callback_for writes out
    return numba.cfunc(_C_SIG)(namespace["logp_callback"])


@numba.njit(error_model="numpy", cache=True)
def expand(theta: np.ndarray, out: np.ndarray, buf: np.ndarray) -> int:
    """nutpie's expanded draw at ``theta``, in PyMC's order.

    Parameters
    ----------
    theta : numpy.ndarray
        The sampler's flat vector, in the layout packed in ``buf``.
    out : numpy.ndarray
        Receives ``theta`` itself, each log-transformed variable on its own scale (the group sds, then the
        likelihood's extra parameter), then the weights that are not value variables (hierarchical
        ``w[g] = mu + sd * z[g]``, informed ``w = mean + L @ z``), each row-major.
    buf : numpy.ndarray
        :func:`hbnn.density.buffer.pack`'s buffer.

    Returns
    -------
    int
        How many values it wrote (:meth:`hbnn.density.densities.Density.variables`, then
        :meth:`hbnn.density.densities.Density.derived`, list them).
    """
    n_layers = int(buf[1])
    G = int(buf[2])
    bias = int(buf[5])
    extra_at = int(buf[7])
    n_dim = int(buf[10])
    kind = int(buf[11])
    lay = buf[_HEADER: _HEADER + _PER_LAYER * n_layers]
    for i in range(n_dim):
        out[i] = theta[i]
    at = n_dim
    if kind == HIERARCHICAL:
        for li in range(n_layers):
            out[at] = math.exp(theta[int(lay[_PER_LAYER * li + 3])])
            at += 1
    if extra_at >= 0:
        out[at] = math.exp(theta[extra_at])
        at += 1
    for li in range(n_layers):
        size = (int(lay[_PER_LAYER * li]) + bias) * int(lay[_PER_LAYER * li + 1])
        a_at = int(lay[_PER_LAYER * li + 2])
        if kind == HIERARCHICAL:
            sd = math.exp(theta[int(lay[_PER_LAYER * li + 3])])
            z_at = int(lay[_PER_LAYER * li + 4])
            for k in range(G * size):
                out[at + k] = theta[a_at + k % size] + sd * theta[z_at + k]
            at += G * size
        elif kind == INFORMED:
            _mean_plus_chol(theta, a_at, buf, lay, li, size, out, at)
            at += size
    return at


_EXPAND_SIG = numba.types.int64(numba.types.uint64, numba.types.uint64, numba.types.CPointer(numba.types.double),
                                numba.types.CPointer(numba.types.double), numba.types.voidptr)


def _expand_callback(dim, n_expanded, x_, out_, user_data_):
    """nutpie's expand callback over a ``user_data`` that is :func:`hbnn.density.buffer.pack`'s buffer (its size in
    slot 0): 0 on success, -1 for vectors of the wrong sizes."""
    size = int(numba.carray(user_data_, (1,), np.float64)[0])
    buf = numba.carray(user_data_, (size,), np.float64)
    if dim != int(buf[10]) or n_expanded != int(buf[13]):  # before writing: expand does not check bounds
        return -1
    out = numba.carray(out_, (n_expanded,))
    if expand(numba.carray(x_, (dim,)), out, buf) != n_expanded:
        return -1
    return 0
