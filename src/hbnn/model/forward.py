"""The tanh MLP's forward pass over many posterior draws, compiled: what scoring and the report's surfaces run.

:func:`outputs` gives the network's output for every draw at every row, as
:func:`hbnn.model.network.mlp_logit` does in NumPy, but in one compiled loop: rows go through the whole
network in blocks of :data:`BLOCK` that stay in the L1 cache, every inner loop runs over a block's
rows (so it vectorises), and ``tanh`` is computed without a library call (float64: from a vectorisable
``exp``; float32: :mod:`hbnn.density.kernel`'s rational function). NumPy's version spends most of its time in
a scalar library ``tanh`` and in temporaries the size of a whole layer: on the default data the fit
stages scored their draws ~5x faster (benchmarks/FINDINGS.md).

* ``float64`` (scores, metrics, the traces' predictions): ``tanh`` within 2.3e-16 absolute, sums
  contracted into fused multiply-adds; outputs agree with NumPy's to ~1e-15 relative (tested),
  far below the 6 decimals the metrics keep.
* ``float32`` (the report's surfaces, 10^4 grid points x 500 draws a group): the log density's
  float32 ``tanh`` (within 3.5e-7), outputs within ~1e-6 of float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np
from numba import types
from numba.extending import overload

from hbnn.density.numerics import _tanh_inplace

BLOCK = 512  # rows per pass through the network: 2 x width x 512 values stay in the L1 cache

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 in two parts (Cody and Waite): k * _LN2_HI is exact for |k| < 2**20
_LN2_LO = 1.90821492927058770002e-10
_EXP_SHIFT = 1.5 * 2.0**52 + 1023.0  # added to an integer-valued float below 2**51, holds it + 1023 in the low bits


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _exp_reduced64(x):
    """``exp(x) = p * 2**k`` in float64: ``k = round(x / ln 2)``, ``p = exp(r)`` for ``|r| <= ln(2) / 2`` as its
    degree-12 Taylor polynomial (error < 1e-16 relative) by Estrin's scheme; returns ``p`` and ``k +
    _EXP_SHIFT``, whose low mantissa bits are ``k + 1023`` (float64's version of
    :func:`hbnn.density.numerics._exp_reduced`: no library call and no float-to-integer conversion, so loops over it
    vectorise on AVX2)."""
    k = np.floor(x * _LOG2E + 0.5)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    r2 = r * r
    r4 = r2 * r2
    low = (1.0 + r + r2 * (1 / 2 + r * (1 / 6))) + r4 * (1 / 24 + r * (1 / 120) + r2 * (1 / 720 + r * (1 / 5040)))
    high = 1 / 40320 + r * (1 / 362880) + r2 * (1 / 3628800 + r * (1 / 39916800)) + r4 * (1 / 479001600)
    return low + (r4 * r4) * high, k + _EXP_SHIFT


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _tanh64_inplace(a: np.ndarray, n: int, e: np.ndarray, bits: np.ndarray) -> None:
    """``a[:n] = tanh(a[:n])`` in float64, within 2.3e-16 absolute (``e``: ``n`` float64, ``bits``: ``n`` int64
    of scratch)."""
    shifted = bits[:n].view(np.float64)
    for i in range(n):
        # tanh(|a|) = (1 - e) / (1 + e) with e = exp(-2|a|); past |a| = 19, e < 2**-54 and tanh rounds to 1
        e[i], shifted[i] = _exp_reduced64(-2.0 * min(abs(a[i]), 19.0))
    for i in range(n):
        bits[i] = (bits[i] & 0x7FF) << 52  # the float 2**k
    scale = bits[:n].view(np.float64)
    for i in range(n):
        x = e[i] * scale[i]
        t = (1.0 - x) / (1.0 + x)
        a[i] = t if a[i] >= 0.0 else -t


def tanh_block(a, n, e, bits):
    """``a[:n] = tanh(a[:n])`` for a float32 or float64 block, in compiled code: float32's from the log density
    (no scratch), float64's :func:`_tanh64_inplace` (``e``, ``bits``: its scratch, float64 and int64)."""
    a[:n] = np.tanh(a[:n])


@overload(tanh_block, inline="always")
def _tanh_block(a, n, e, bits):
    if a.dtype == types.float32:
        return lambda a, n, e, bits: _tanh_inplace(a, n)
    return lambda a, n, e, bits: _tanh64_inplace(a, n, e, bits)


@numba.njit(fastmath=True, error_model="numpy", cache=True, nogil=True)
def _outputs(columns, flat, layout, out, h, e, bits):
    """``out[s, i]``: the tanh MLP's output for draw ``s`` (``flat[s]``: its layers' weights, row-major, one after
    another) at row ``i`` (``columns``: ``(feature, row)``). ``layout`` holds each layer's inputs, outputs, offset
    in ``flat[s]`` and whether its last input row is a bias; ``h`` ``(2, width, BLOCK)``, ``e`` and ``bits``
    (``BLOCK`` of int32 for float32, int64 for float64) are scratch, all in ``out``'s dtype (the float32
    ``tanh`` uses neither ``e`` nor ``bits``)."""
    n = columns.shape[1]
    last = layout.shape[0] - 1
    zero = out.dtype.type(0.0)
    for lo in range(0, n, BLOCK):
        m = min(BLOCK, n - lo)
        for s in range(flat.shape[0]):
            w = flat[s]
            for layer in range(last + 1):
                n_in, n_out, at, bias = layout[layer, 0], layout[layer, 1], layout[layer, 2], layout[layer, 3]
                dst = h[layer % 2]
                for j in range(n_out):
                    acc = dst[j]
                    b = w[at + n_in * n_out + j] if bias else zero
                    for i in range(m):
                        acc[i] = b
                    for k in range(n_in):
                        wk = w[at + k * n_out + j]
                        x = columns[k, lo:lo + m] if layer == 0 else h[(layer - 1) % 2, k]
                        for i in range(m):
                            acc[i] += wk * x[i]
                    if layer < last:
                        tanh_block(acc, m, e, bits)
            out[s, lo:lo + m] = h[last % 2, 0, :m]


def outputs(X: np.ndarray, weights: Sequence[np.ndarray], dtype=np.float64, out: np.ndarray | None = None
            ) -> np.ndarray:
    """The network's outputs ``(sample, row)`` at rows ``X (row, feature)`` for per-layer weight draws ``weights``
    (``(sample, *layer shape)``, in :func:`hbnn.model.network.layer_specs` order; a layer whose input rows are one more
    than its inputs has its bias in the last row), computed in ``dtype`` (float64 or float32); ``out``: where to
    write them (``(sample, row)`` of ``dtype``; at least ``sample`` rows)."""
    dtype = np.dtype(dtype)
    n_samples = weights[0].shape[0]
    n_in = X.shape[1]
    layout, at, width = [], 0, n_in
    for i, w in enumerate(weights):
        n_out = w.shape[-1] if i < len(weights) - 1 else 1
        rows = w[0].size // n_out
        layout.append((n_in, n_out, at, int(rows == n_in + 1)))
        n_in, at, width = n_out, at + w[0].size, max(width, n_out)
    flat = np.ascontiguousarray(np.concatenate([np.reshape(w, (n_samples, -1)) for w in weights], axis=1),
                                dtype=dtype)
    columns = np.ascontiguousarray(np.asarray(X, dtype=dtype).T)
    if out is None:
        out = np.empty((n_samples, X.shape[0]), dtype=dtype)
    h = np.zeros((2, width, BLOCK), dtype=dtype)
    bits = np.empty(BLOCK, dtype=np.int32 if dtype == np.float32 else np.int64)
    _outputs(columns, flat, np.array(layout, dtype=np.int64), out, h, np.empty(BLOCK, dtype=dtype), bits)
    return out
