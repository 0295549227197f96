"""The float32 arithmetic of the hand-written density's passes over rows: ``exp``, ``tanh`` and the Bernoulli
terms, written so that numba vectorises the loops that call them (no library call, no float-to-integer
conversion). Every constant is a float32: a Python float in a numba expression is a float64 and would turn
the whole expression into float64.
"""

from __future__ import annotations

import logging

import numba
import numpy as np

log = logging.getLogger(__name__)


# The passes over rows run in float32 (:data:`ROW_DTYPE`): twice the values per vector of float64 and shorter
# polynomials, so faster (measured: benchmarks/FINDINGS.md, section 'Measurements behind code comments'). Every
# constant they use is a float32 below: a Python float in a numba expression is a float64 and would turn the whole
# expression into float64.
ROW_DTYPE = np.float32


_F0 = np.float32(0.0)


_F1 = np.float32(1.0)


_F2 = np.float32(2.0)


_HALF = np.float32(0.5)


_LOG2E = np.float32(1.4426950408889634)


_LN2_HI = np.float32(0.693145751953125)  # ln 2 in two parts (Cody and Waite): k * _LN2_HI is exact for |k| < 2**8


_LN2_LO = np.float32(1.428606765330187e-06)


# added to an integer-valued float below 2**22, holds it + 127 in the low bits
_EXP_SHIFT = np.float32(1.5 * 2.0**23 + 127.0)


# tanh's rational approximation (:func:`_tanh_inplace`): the odd numerator's and even denominator's
# coefficients in x**2, lowest degree first, and the clamp (tanh(7.905) is 2.7e-7 below 1, ~4.5 float32 spacings).
_TANH_CLAMP = np.float32(7.90531110763549805)


_TANH_P = (np.float32(4.89352455891786e-03), np.float32(6.37261928875436e-04), np.float32(1.48572235717979e-05),
           np.float32(5.12229709037114e-08), np.float32(-8.60467152213735e-11), np.float32(2.00018790482477e-13),
           np.float32(-2.76076847742355e-16))


_TANH_Q = (np.float32(4.89352518554385e-03), np.float32(2.26843463243900e-03), np.float32(1.18534705686654e-04),
           np.float32(1.19825839466702e-06))


_EXP_CAP = np.float32(87.0)  # exp(-87) = 1.6e-38 is still a normal float32 (smallest 1.2e-38)


# The Bernoulli terms' exp(-|l|) stops here: past it their u**2 (~e**-2|l| / 4) would be subnormal, which x86
# computes slower (measured: benchmarks/FINDINGS.md, section 'Measurements behind code comments'); what it changes
# is below 4.3e-18 in each term and in each row's gradient.
_BERNOULLI_CAP = np.float32(40.0)


_E2, _E3, _E4, _E5, _E6, _E7 = (np.float32(1 / 2), np.float32(1 / 6), np.float32(1 / 24), np.float32(1 / 120),
                                np.float32(1 / 720), np.float32(1 / 5040))


_L3, _L5, _L7, _L9, _L11, _L13, _L15 = (np.float32(1 / 3), np.float32(1 / 5), np.float32(1 / 7), np.float32(1 / 9),
                                        np.float32(1 / 11), np.float32(1 / 13), np.float32(1 / 15))


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _exp_reduced(x):
    """``exp(x) = p * 2**k`` in float32: ``k = round(x / ln 2)`` and ``p = exp(r)``, ``|r| <= ln(2) / 2``, as its
    degree-7 Taylor polynomial (error < 6e-9 relative, below float32's rounding), evaluated by Estrin's scheme.
    Returns ``p`` and ``k + _EXP_SHIFT``, whose low mantissa bits are ``k + 127``: :func:`_scale_bits` turns them
    into the float ``2**k``. No library call and no float-to-integer conversion, so loops over it vectorise on
    every x86-64 (a vector conversion to int64 needs AVX-512: with AVX2 alone each value goes through a scalar
    conversion, which costs time: benchmarks/FINDINGS.md, section 'Measurements behind code comments')."""
    k = np.floor(x * _LOG2E + _HALF)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    r2 = r * r
    return (_F1 + r + r2 * (_E2 + r * _E3)) + (r2 * r2) * (_E4 + r * _E5 + r2 * (_E6 + r * _E7)), k + _EXP_SHIFT


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _scale_bits(bits: np.ndarray, n: int) -> np.ndarray:
    """``bits[:n]`` (int32) holding :func:`_exp_reduced`'s ``k + _EXP_SHIFT`` (as float32) rewritten in place as
    the floats ``2**k``, and returned as float32: the low 8 bits of each are ``k + 127``, the exponent of ``2**k``."""
    for i in range(n):
        bits[i] = (bits[i] & 0xFF) << 23
    return bits[:n].view(np.float32)


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _exp_nonpositive(x: np.ndarray, out: np.ndarray, n: int, bits: np.ndarray) -> None:
    """``out[:n] = exp(x[:n])`` in float32 for ``x <= 0``, below -87 ``exp(-87)`` (1.6e-38, near the smallest
    normal float32; ``bits``: ``n`` int32 of scratch; ``out`` is not ``x``)."""
    shifted = bits[:n].view(np.float32)
    for i in range(n):
        out[i], shifted[i] = _exp_reduced(max(x[i], -_EXP_CAP))
    scale = _scale_bits(bits, n)
    for i in range(n):
        out[i] *= scale[i]


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _tanh_inplace(a: np.ndarray, n: int) -> None:
    """``a[:n] = tanh(a[:n])`` in float32, within 3.5e-7 of the exact value (float32's spacing below 1: 6e-8;
    checked over every float32 in ``(0, 9.06]``: benchmarks/FINDINGS.md, section 'Measurements behind code
    comments').

    ``tanh(x) = x P(x**2) / Q(x**2)`` on ``|x| <= 7.905`` (clamped past it, where ``tanh`` is 2.7e-7 below 1 and
    this returns 0.99999976), with ``P`` of degree 6 and ``Q`` of degree 3: Eigen's minimax coefficients for
    float32 (``Eigen::internal::generic_fast_tanh_float``). Nine multiply-adds, two multiplications, the clamp and
    one division, with no exponent arithmetic and no scratch arrays: less time than ``(1 - e) / (1 + e)`` with
    ``e = exp(-2|x|)`` from :func:`_exp_reduced` (measured: benchmarks/FINDINGS.md, section 'Measurements behind
    code comments')."""
    for i in range(n):
        x = min(max(a[i], -_TANH_CLAMP), _TANH_CLAMP)
        x2 = x * x
        p = x2 * (x2 * (x2 * (x2 * (x2 * (x2 * _TANH_P[6] + _TANH_P[5]) + _TANH_P[4]) + _TANH_P[3])
                               + _TANH_P[2]) + _TANH_P[1]) + _TANH_P[0]
        q = x2 * (x2 * (x2 * _TANH_Q[3] + _TANH_Q[2]) + _TANH_Q[1]) + _TANH_Q[0]
        a[i] = x * p / q


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _log1p_series(u2):
    """``sum(u2**k / (2k + 1))`` for ``k`` = 0..7 in float32, by Horner's rule written out (a loop over a tuple
    of coefficients stops LLVM vectorising the loop that calls it)."""
    s = _L15
    s = s * u2 + _L13
    s = s * u2 + _L11
    s = s * u2 + _L9
    s = s * u2 + _L7
    s = s * u2 + _L5
    s = s * u2 + _L3
    return s * u2 + _F1


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _bernoulli_logit(logit: np.ndarray, y: np.ndarray, d: np.ndarray, n: int, e: np.ndarray,
                     bits: np.ndarray) -> float:
    """``sum(y * l - softplus(l))`` over ``n`` rows (float32 terms, summed in float64); writes ``d = y -
    sigmoid(l)``.

    ``softplus(l) = max(l, 0) + log1p(e)`` with ``e = exp(-|l|)`` in ``(0, 1]``;
    ``log1p(e) = 2 atanh(u)``, ``u = e / (2 + e)`` in ``(0, 1/3]``, summed as its
    odd power series to 8 terms (error < 2e-9, below float32's rounding); ``e`` stops at ``exp(-40)``
    (:data:`_BERNOULLI_CAP`).
    """
    for i in range(n):
        d[i] = -min(abs(logit[i]), _BERNOULLI_CAP)
    _exp_nonpositive(d, e, n, bits)
    total = 0.0
    for i in range(n):
        z = logit[i]
        inv = _F1 / (_F1 + e[i])
        u = e[i] / (_F2 + e[i])
        total += y[i] * z - (max(z, _F0) + _F2 * u * _log1p_series(u * u))
        d[i] = y[i] - (inv if z >= _F0 else e[i] * inv)
    return total


# float64: the forward pass that scores posterior draws (hbnn.model.forward)
_LOG2E64 = 1.4426950408889634
_LN2_HI64 = 6.93147180369123816490e-01  # ln 2 in two parts (Cody and Waite): k * _LN2_HI64 is exact for |k| < 2**20
_LN2_LO64 = 1.90821492927058770002e-10
_EXP_SHIFT64 = 1.5 * 2.0**52 + 1023.0  # added to an integer-valued float below 2**51, holds it + 1023 in the low bits


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _exp_reduced64(x):
    """``exp(x) = p * 2**k`` in float64: ``k = round(x / ln 2)``, ``p = exp(r)`` for ``|r| <= ln(2) / 2`` as its
    degree-12 Taylor polynomial (error < 1e-16 relative) by Estrin's scheme; returns ``p`` and ``k +
    _EXP_SHIFT64``, whose low mantissa bits are ``k + 1023`` (float64's version of
    :func:`_exp_reduced`: no library call and no float-to-integer conversion, so loops over it
    vectorise on AVX2)."""
    k = np.floor(x * _LOG2E64 + 0.5)
    r = (x - k * _LN2_HI64) - k * _LN2_LO64
    r2 = r * r
    r4 = r2 * r2
    low = (1.0 + r + r2 * (1 / 2 + r * (1 / 6))) + r4 * (1 / 24 + r * (1 / 120) + r2 * (1 / 720 + r * (1 / 5040)))
    high = 1 / 40320 + r * (1 / 362880) + r2 * (1 / 3628800 + r * (1 / 39916800)) + r4 * (1 / 479001600)
    return low + (r4 * r4) * high, k + _EXP_SHIFT64


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
