"""Hand-written log densities and gradients of the three BNNs, for nutpie.

PyTensor's numba backend runs the hierarchical model's gradient at ~250 us (about
1.8x a NumPy version of the same arithmetic), and XLA at ~60 us, both bound by
per-op overhead and a scalar ``tanh``: the arithmetic is ~100 kflop and ~10k
``tanh`` per gradient on the default data (benchmarks/FINDINGS.md). A per-group
flat or informed model (~40 weights, 50 rows) pays ~20 us per step in PyTensor
for ~1 us of arithmetic. This module computes exactly the densities PyMC gives
NUTS for :mod:`hbnn.model.builders`' full-batch models, in the unconstrained space the
sampler sees, with manual backpropagation in one numba function: every layer
count, width, bias row, likelihood and ragged group size the builders accept.

* weights, in ``model.value_vars`` order:
  hierarchical (:class:`HierarchicalDensity`): per layer ``mu_<layer>``,
  ``sd_<layer>_log__`` (``sd = exp(s)``, the density includes the log-Jacobian
  ``s``, ``sd ~ HalfNormal(1)``) and ``z_<layer>`` ``(group, *layer.shape)``, with
  ``w[g] = mu + sd * z[g]``; flat (:class:`FlatDensity`): ``w_<layer> ~ Normal(0,
  prior_sd)``; informed (:class:`InformedDensity`): ``z_<layer> ~ Normal(0, I)`` and
  ``w = mean + chol(cov) @ z`` per flattened layer;
* the likelihood of :mod:`hbnn.model.likelihoods` over each group's real rows
  (``bernoulli``: ``y * l - softplus(l)``; ``gaussian``: ``Normal(l, sigma)``
  with ``sigma ~ HalfNormal(noise_sd)``, value variable ``sigma_log__``, last;
  ``poisson``: ``y * l - exp(l) - log(y!)``).

:func:`logp_grad` reads the network's widths at run time; :mod:`hbnn.density.written` compiles the same
function around passes written out for one network's widths (~1.6x faster on the default network), which
every fit uses (:meth:`Density.logp_grad`). Every loop runs over rows, and every function here uses
numba's ``error_model="numpy"``: with Python's, each float division checks for zero, and a loop with that
check does not vectorise.

The passes over a group's rows (forward, likelihood terms, backward) run in
float32 (:data:`ROW_DTYPE`): twice as many rows per vector as float64 and
shorter polynomials, 1.6-1.8x faster on the default network (benchmarks/FINDINGS.md).
Each group's log-likelihood terms are summed in float64, and the weights,
priors, sums over groups and the chain rule to the sampler's coordinates are
float64. ``tanh`` is a rational function (Eigen's float32 minimax approximation),
within 3.5e-7 absolute; the Bernoulli terms' ``exp`` a degree-7 Taylor polynomial
after the usual ``k ln 2`` range reduction.
The log density and gradient equal PyMC's compiled (float64) ones to
:data:`ROW_RTOL` of their scale, including every normalising constant:
``tests/test_kernel.py`` checks values and gradients against PyMC for each
supported configuration, and :meth:`Density.check` checks them again, at two
points, for the model at hand before it is first sampled (once per network,
likelihood, settings, data shapes and code version:
:meth:`Density.checked_nutpie_model`). NUTS stays exact for the density it is
given: the leapfrog steps are reversible and volume-preserving for any
gradient that is a function of the position, and the accept step uses this
density's own value, which differs from PyMC's by less than 1e-5 of its scale.

nutpie's model is built from the density alone (:meth:`Density.nutpie_model`):
the log density through nutpie's logp callback, the draws expanded to every
model variable by :func:`expand` (the group sds, ``w = mu + sd * z``, ``w = mean
+ L @ z``), chains started as PyMC starts them. Where the values live:
:meth:`Density.pack` writes the layout and the data into one float64 buffer,
the ``user_data`` that nutpie passes to both callbacks; so the machine code
depends on neither the data nor the model's sizes, and numba's disk cache
serves every process after the first.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import os
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import ClassVar

import numba
import numpy as np

from hbnn.errors import DENSITY_OVERFLOW, SamplingError

log = logging.getLogger(__name__)

SOURCE = Path(__file__).read_text()  # as imported: hbnn.density.written compiles its functions from this text
LIKELIHOODS = {"bernoulli": 0, "gaussian": 1, "poisson": 2}
HIERARCHICAL, FLAT, INFORMED = 0, 1, 2  # how a layer's weights come from the flat vector
_HEADER = 15  # buffer slots before the per-layer layout (see Density.pack)
_PER_LAYER = 5  # n_in (without bias), n_out, then three offsets that depend on the kind (see Density.pack)
_LOG_2PI = math.log(2.0 * math.pi)
_HALFNORMAL_CONST = math.log(2.0) - 0.5 * _LOG_2PI

# The passes over rows run in float32 (:data:`ROW_DTYPE`): twice the values per vector of float64 and shorter
# polynomials, 1.6-1.8x faster on the default network. Every constant they use is a float32 below: a Python float
# in a numba expression is a float64 and would turn the whole expression into float64.
ROW_DTYPE = np.float32
# ... so the density equals PyMC's (float64 throughout) to this share of max(1, |log density|) and its gradient to
# this share of max(1, largest gradient component): measured up to 6e-7 on tests/test_kernel.py's networks and
# points (rates up to e^20 excepted: there float32 rounding of the network's output, which exp amplifies, costs a
# Poisson gradient more). A Poisson output past 88 overflows float32 (e^88 > 3.4e38): the density is then not
# finite and the sampler treats the point as it treats any other such (float64 went on to 709).
ROW_RTOL = 1e-5
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
# computes ~2x slower (measured: 512 rows at |l| = 90 took 3.1 us against 1.65 us); what it changes is below
# 4.3e-18 in each term and in each row's gradient.
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
    every x86-64 (a vector conversion to int64 needs AVX-512: with AVX2 alone each value went through a scalar
    conversion, ~1.8x the time)."""
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
    measured with fused multiply-adds: 2.9e-7 at most over every float32 in ``(0, 9.06]``, 3.4e-7 without them).

    ``tanh(x) = x P(x**2) / Q(x**2)`` on ``|x| <= 7.905`` (clamped past it, where ``tanh`` is 2.7e-7 below 1 and
    this returns 0.99999976), with ``P`` of degree 6 and ``Q`` of degree 3: Eigen's minimax coefficients for
    float32 (``Eigen::internal::generic_fast_tanh_float``). Nine multiply-adds, two multiplications, the clamp and
    one division, with no exponent arithmetic and no scratch arrays: 9% less time for the hierarchical gradient
    than ``(1 - e) / (1 + e)`` with ``e = exp(-2|x|)`` from :func:`_exp_reduced` (benchmarks/FINDINGS.md)."""
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


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _forward(W, H, X, g, n8, R, D, lay, n_layers, bias):
    """The network's pass over one group's rows at weights ``W`` (layer after layer, ``(n_in + bias, n_out)``
    row-major): ``H[l]`` is what enters layer ``l`` (``H[0]`` the features), ``H[n_layers]`` the output.

    Activations are ``(unit, row)`` with rows contiguous, so every inner loop runs over rows: over ``n8``, the
    real rows rounded up to a multiple of 8 (``R`` is one), whose padding rows hold zeros in ``X``.
    """
    for i in range(D):
        for r in range(n8):
            H[0, i * R + r] = X[(g * D + i) * R + r]
    w_at = 0
    for li in range(n_layers):
        n_in = int(lay[_PER_LAYER * li])
        n_out = int(lay[_PER_LAYER * li + 1])
        h = H[li]
        a = H[li + 1]
        for j in range(n_out):
            b = W[w_at + n_in * n_out + j] if bias else _F0
            for r in range(n8):
                a[j * R + r] = b
            for i in range(n_in):
                w = W[w_at + i * n_out + j]
                for r in range(n8):
                    a[j * R + r] += w * h[i * R + r]
        if li < n_layers - 1:  # padding rows hold finite values (H starts at 0), so one call covers the layer
            _tanh_inplace(a, n_out * R)
        w_at += (n_in + bias) * n_out


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _output(out, delta, dlogit, e, bits, Y, g, n, n8, R, lik, sigma):
    """The likelihood of one group's ``n`` rows at the network's output ``out``: returns ``(loglik,
    d loglik / d log sigma)`` and writes ``d loglik / d out`` into ``delta[:n8]`` (0 on padding rows). The
    Gaussian and Poisson terms are computed in float64 from the float32 rows."""
    ll = 0.0
    g_sigma = 0.0
    if lik == 0:
        ll = _bernoulli_logit(out, Y[g * R: g * R + n], dlogit, n, e, bits)
    elif lik == 1:
        log_sigma = math.log(sigma)
        for r in range(n):
            u = (np.float64(Y[g * R + r]) - np.float64(out[r])) / sigma
            ll += -0.5 * u * u - log_sigma
            dlogit[r] = u / sigma
            g_sigma += u * u - 1.0
    else:
        for r in range(n):
            o = np.float64(out[r])
            rate = math.exp(o)
            ll += np.float64(Y[g * R + r]) * o - rate
            dlogit[r] = Y[g * R + r] - rate
    for r in range(n):
        delta[r] = dlogit[r]
    for r in range(n, n8):
        delta[r] = 0.0
    return ll, g_sigma


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _backward(W, gW, H, delta, back, X, g, n8, R, D, lay, n_layers, bias):
    """Backpropagation of ``delta`` (the output's gradient, ``[:n8]``) through :func:`_forward`'s pass: adds
    the weights' gradient to ``gW``; overwrites ``delta`` and ``back``."""
    w_at = 0
    for li in range(n_layers):
        w_at += (int(lay[_PER_LAYER * li]) + bias) * int(lay[_PER_LAYER * li + 1])
    for li in range(n_layers - 1, -1, -1):
        n_in = int(lay[_PER_LAYER * li])
        n_out = int(lay[_PER_LAYER * li + 1])
        w_at -= (n_in + bias) * n_out
        h = H[li]
        for j in range(n_out):
            d = delta[j * R: j * R + n8]
            for i in range(n_in):
                acc = _F0
                for r in range(n8):
                    acc += h[i * R + r] * d[r]
                gW[w_at + i * n_out + j] += acc
            if bias:
                acc = _F0
                for r in range(n8):
                    acc += d[r]
                gW[w_at + n_in * n_out + j] += acc
        if li > 0:
            for i in range(n_in):
                bk = back[i * R: i * R + n8]
                for r in range(n8):
                    bk[r] = 0.0
                for j in range(n_out):
                    w = W[w_at + i * n_out + j]
                    for r in range(n8):
                        bk[r] += w * delta[j * R + r]
                for r in range(n8):
                    hi = h[i * R + r]
                    bk[r] *= _F1 - hi * hi
            for k in range(n_in * R):
                delta[k] = back[k]


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _group_loglik(W, gW, H, delta, back, dlogit, e, bits, X, Y, g, n, R, D, lay, n_layers, bias, lik, sigma,
                  lanes):
    """One group's log-likelihood at weights ``W``; adds its gradient to ``gW`` and returns ``(loglik,
    d loglik / d log sigma)``. The passes run over the ``n`` real rows rounded up to whole vectors of ``lanes``
    rows (:func:`row_lanes`). Its source is also compiled in :mod:`hbnn.density.written`'s modules, where
    ``_forward`` and ``_backward`` are the ones written out for one network."""
    n8 = min(R, -(-n // lanes) * lanes)
    _forward(W, H, X, g, n8, R, D, lay, n_layers, bias)
    ll, g_sigma = _output(H[n_layers], delta, dlogit, e, bits, Y, g, n, n8, R, lik, sigma)
    _backward(W, gW, H, delta, back, X, g, n8, R, D, lay, n_layers, bias)
    return ll, g_sigma


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _mean_plus_chol(theta, z_at, buf, lay, li, size, out, out_at):
    """An informed layer's weights ``out[out_at:out_at + size] = mean + L @ z``, ``z = theta[z_at:z_at + size]``, with
    the layer's ``mean`` and lower-triangular ``L`` (row-major) where ``lay`` places them in ``buf``."""
    mean = buf[int(lay[_PER_LAYER * li + 3]):]
    chol = buf[int(lay[_PER_LAYER * li + 4]):]
    for k in range(size):
        acc = mean[k]
        for m in range(k + 1):
            acc += chol[k * size + m] * theta[z_at + m]
        out[out_at + k] = acc


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _group_weights(theta, W, gW, g, buf, lay, n_layers, bias, kind, sds):
    """Group ``g``'s weights from the flat vector into ``W`` (layer after layer, float32), and ``gW`` zeroed.
    :mod:`hbnn.density.written` writes it out with one network's sizes as constants."""
    w_at = 0
    for li in range(n_layers):
        size = (int(lay[_PER_LAYER * li]) + bias) * int(lay[_PER_LAYER * li + 1])
        a_at = int(lay[_PER_LAYER * li + 2])
        if kind == HIERARCHICAL:  # mu + sd * z[g]
            sd = sds[li]
            z_at = int(lay[_PER_LAYER * li + 4]) + g * size
            for k in range(size):
                W[w_at + k] = theta[a_at + k] + sd * theta[z_at + k]
        elif kind == FLAT:
            for k in range(size):
                W[w_at + k] = theta[a_at + k]
        else:
            _mean_plus_chol(theta, a_at, buf, lay, li, size, W, w_at)
        for k in range(size):
            gW[w_at + k] = _F0
        w_at += size


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _group_chain_rule(theta, grad, gW, g, buf, lay, n_layers, bias, kind, sds, g_sd):
    """Group ``g``'s weight gradient ``gW`` back to the flat vector's ``grad`` (and to ``g_sd``, each layer's
    d/d log sd, hierarchical). :mod:`hbnn.density.written` writes it out with one network's sizes as constants."""
    w_at = 0
    for li in range(n_layers):
        size = (int(lay[_PER_LAYER * li]) + bias) * int(lay[_PER_LAYER * li + 1])
        a_at = int(lay[_PER_LAYER * li + 2])
        if kind == HIERARCHICAL:
            sd = sds[li]
            z_at = int(lay[_PER_LAYER * li + 4]) + g * size
            acc = 0.0
            for k in range(size):
                gw = gW[w_at + k]
                grad[a_at + k] += gw
                grad[z_at + k] += sd * gw
                acc += gw * theta[z_at + k]
            g_sd[li] += sd * acc
        elif kind == FLAT:
            for k in range(size):
                grad[a_at + k] += gW[w_at + k]
        else:  # d/dz = L^T gW
            chol = buf[int(lay[_PER_LAYER * li + 4]):]
            for k in range(size):
                gw = gW[w_at + k]
                for m in range(k + 1):
                    grad[a_at + m] += chol[k * size + m] * gw
        w_at += size


@numba.njit(fastmath=True, error_model="numpy", cache=True)
def logp_grad(theta: np.ndarray, grad: np.ndarray, buf: np.ndarray) -> float:
    """Log density at ``theta`` (flat, in the layout packed in ``buf``); writes its gradient into ``grad``."""
    n_layers = int(buf[1])
    G = int(buf[2])
    R = int(buf[3])
    D = int(buf[4])
    bias = int(buf[5])
    lik = int(buf[6])
    sigma_at = int(buf[7])
    noise_sd = buf[8]
    lp = buf[9]  # every normalising constant, data-only terms included
    n_dim = int(buf[10])
    kind = int(buf[11])
    prior_sd = buf[12]
    lanes = int(buf[14])
    lay = buf[_HEADER: _HEADER + _PER_LAYER * n_layers]
    at = _HEADER + _PER_LAYER * n_layers
    counts = buf[at: at + G]
    at += G
    X = buf[at: at + G * R * D].view(ROW_DTYPE)[:G * R * D]  # float32 values in the first half of their slots
    at += G * R * D
    Y = buf[at: at + G * R].view(ROW_DTYPE)[:G * R]

    # Standard-normal priors on every entry; the other priors are corrected below.
    for i in range(n_dim):
        grad[i] = -theta[i]
        lp -= 0.5 * theta[i] * theta[i]
    widest = D
    n_w = 0
    for li in range(n_layers):
        n_in = int(lay[_PER_LAYER * li])
        n_out = int(lay[_PER_LAYER * li + 1])
        widest = max(widest, n_out)
        size = (n_in + bias) * n_out
        if kind == HIERARCHICAL:
            # sd ~ HalfNormal(1) on the log scale: -sd^2 / 2 + s (Jacobian), instead of the standard normal
            s_at = int(lay[_PER_LAYER * li + 3])
            s = theta[s_at]
            sd = math.exp(s)
            lp += 0.5 * s * s - 0.5 * sd * sd + s
            grad[s_at] = 1.0 - sd * sd
        elif kind == FLAT:  # Normal(0, prior_sd)
            w_at = int(lay[_PER_LAYER * li + 2])
            for k in range(size):
                t = theta[w_at + k]
                lp += 0.5 * t * t * (1.0 - 1.0 / (prior_sd * prior_sd))
                grad[w_at + k] = -t / (prior_sd * prior_sd)
        n_w += size
    sigma = 1.0
    if sigma_at >= 0:
        s = theta[sigma_at]
        sigma = math.exp(s)
        u = sigma / noise_sd
        lp += 0.5 * s * s - 0.5 * u * u + s
        grad[sigma_at] = 1.0 - u * u

    # One group's weights, layer after layer, (n_in + bias, n_out) row-major, their gradients and the passes'
    # arrays, all float32: the passes over rows (ROW_DTYPE); the sums over groups and the chain rule are float64.
    W = np.empty(n_w, dtype=ROW_DTYPE)
    gW = np.empty(n_w, dtype=ROW_DTYPE)
    H = np.zeros((n_layers + 1, R * widest), dtype=ROW_DTYPE)
    delta = np.empty(R * widest, dtype=ROW_DTYPE)
    back = np.empty(R * widest, dtype=ROW_DTYPE)
    e = np.empty(R, dtype=ROW_DTYPE)  # the Bernoulli terms' exp, over a group's rows
    bits = np.empty(R, dtype=np.int32)
    dlogit = np.empty(R, dtype=ROW_DTYPE)
    g_sd = np.zeros(n_layers)
    sds = np.ones(n_layers)  # each layer's group sd, exp(s) (hierarchical)
    if kind == HIERARCHICAL:
        for li in range(n_layers):
            sds[li] = math.exp(theta[int(lay[_PER_LAYER * li + 3])])
    g_sigma = 0.0
    for g in range(G):
        _group_weights(theta, W, gW, g, buf, lay, n_layers, bias, kind, sds)
        ll, gs = _group_loglik(W, gW, H, delta, back, dlogit, e, bits, X, Y, g, int(counts[g]), R, D, lay,
                               n_layers, bias, lik, sigma, lanes)
        lp += ll
        g_sigma += gs
        _group_chain_rule(theta, grad, gW, g, buf, lay, n_layers, bias, kind, sds, g_sd)
    if kind == HIERARCHICAL:
        for li in range(n_layers):
            grad[int(lay[_PER_LAYER * li + 3])] += g_sd[li]
    if sigma_at >= 0:
        grad[sigma_at] += g_sigma
    return lp


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
def callback(skip: int = 0, fn=None):
    """nutpie's logp callback for a ``user_data`` whose :meth:`Density.pack` buffer starts ``skip`` float64
    slots in (0 for :meth:`Density.nutpie_model`, whose ``user_data`` is the buffer), computed by ``fn``
    (:func:`logp_grad`'s signature; by default :func:`logp_grad`); 0 on success, as nutpie expects (3: a
    non-finite gradient, 4: a non-finite value, -1: a vector of the wrong size).

    Compiled in this process (~1 s), never cached: a fit takes the cached one of
    :func:`hbnn.density.written.callback_for` (:meth:`Density.callback`), which falls back to this one.
    """
    namespace = {"numba": numba, "np": np, "SKIP": int(skip), "logp_grad": logp_grad if fn is None else fn}
    exec(CALLBACK_SOURCE, namespace)  # noqa: S102 - our own text, the same that callback_for writes out
    return numba.cfunc(_C_SIG)(namespace["logp_callback"])


@numba.njit(error_model="numpy", cache=True)
def expand(theta: np.ndarray, out: np.ndarray, buf: np.ndarray) -> int:
    """nutpie's expanded draw at ``theta`` (the layout packed in ``buf``), in PyMC's order: ``theta`` itself, each
    log-transformed variable on its own scale (the group sds, then ``sigma``), then the weights that are not value
    variables (hierarchical ``w[g] = mu + sd * z[g]``, informed ``w = mean + L @ z``), each row-major. Returns
    how many values it wrote (:meth:`Density.variables`, then :meth:`Density.derived`, list them)."""
    n_layers = int(buf[1])
    G = int(buf[2])
    bias = int(buf[5])
    sigma_at = int(buf[7])
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
    if sigma_at >= 0:
        out[at] = math.exp(theta[sigma_at])
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
    """nutpie's expand callback over a ``user_data`` that is :meth:`Density.pack`'s buffer (its size in slot 0):
    0 on success, -1 for vectors of the wrong sizes."""
    size = int(numba.carray(user_data_, (1,), np.float64)[0])
    buf = numba.carray(user_data_, (size,), np.float64)
    if dim != int(buf[10]) or n_expanded != int(buf[13]):  # before writing: expand does not check bounds
        return -1
    out = numba.carray(out_, (n_expanded,))
    if expand(numba.carray(x_, (dim,)), out, buf) != n_expanded:
        return -1
    return 0


def call(compiled, theta: np.ndarray) -> tuple[float, np.ndarray]:
    """Log density and gradient at ``theta`` through ``compiled``'s logp callback, called as nutpie calls it;
    :class:`ValueError` where it reports a failure."""
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    grad, value = np.empty(theta.size), np.empty(1)
    pointers = [a.ctypes.data_as(ctypes.POINTER(ctypes.c_double)) for a in (theta, grad, value)]
    status = compiled.compiled_logp_func.ctypes(theta.size, *pointers, compiled.user_data.ctypes.data)
    if status not in (0, 3, 4):
        raise ValueError(f"the logp callback refused a vector of {theta.size}: status {status}")
    return float(value[0]), grad


class DensityMismatch(ValueError):
    """The hand-written density is not the PyMC model's (:meth:`Density.check`); ``compiled`` is nutpie's compile
    of the PyMC model, which the sampler then samples instead."""

    def __init__(self, message: str, compiled):
        super().__init__(message)
        self.compiled = compiled


def check_dir() -> Path:
    """Where passed :meth:`Density.check` results are recorded: ``$HBNN_DENSITY_CHECKS``, else ``checked/`` beside the
    written-out kernels (:func:`hbnn.density.written.cache_dir`). The test suite gives each session its own, so
    every session checks every density it samples."""
    from hbnn.density.written import cache_dir

    return Path(os.environ["HBNN_DENSITY_CHECKS"]) if os.environ.get("HBNN_DENSITY_CHECKS") else cache_dir() / "checked"


def call_expand(compiled, theta: np.ndarray) -> np.ndarray:
    """The expanded draw at ``theta`` through ``compiled``'s expand callback, called as nutpie calls it."""
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    out = np.empty(compiled.n_expanded)
    pointers = [a.ctypes.data_as(ctypes.POINTER(ctypes.c_double)) for a in (theta, out)]
    status = compiled.compiled_expand_func.ctypes(theta.size, out.size, *pointers, compiled.user_data.ctypes.data)
    if status != 0:
        raise ValueError(f"the expand callback refused a vector of {theta.size}: status {status}")
    return out


def _initial_point(center: np.ndarray, seed: int) -> np.ndarray:
    """A chain's first point: ``center`` plus PyMC's ``U(-1, 1)`` jitter on every entry, from ``seed``."""
    return center + np.random.default_rng(seed).uniform(-1.0, 1.0, center.size)


@dataclass(frozen=True)
class Density:
    """A model's data and settings, as the hand-written log density needs them; subclasses say how the weights
    come from the flat vector.

    ``X_padded`` is ``(group, row, feature)`` with each group's ``counts[g]`` real rows first
    (:meth:`hbnn.data.tasks.Tasks.padded`), and ``y`` the labels of the real rows in group order.
    """

    X_padded: np.ndarray
    y: np.ndarray
    counts: np.ndarray
    hidden_layers: tuple[int, ...]
    bias: bool
    likelihood: str
    noise_sd: float
    _: KW_ONLY
    features: tuple[str, ...] = ()  # the feature names, the trace's coordinates (x1, x2, ... where not given)
    groups: tuple[str, ...] = ()  # the hierarchical model's group names (g00, g01, ... where not given)

    kind: ClassVar[int] = -1
    _extra_fields: ClassVar[tuple[str, ...]] = ()  # the subclass's own fields, kept by with_rows

    @classmethod
    def on_rows(cls, x: np.ndarray, y: np.ndarray, hidden_layers, bias: bool, likelihood: str, noise_sd: float,
                **extra) -> Density:
        """A per-group model's density on one group's rows ``x (row, feature)`` and ``y``."""
        x = np.asarray(x, dtype=np.float64)
        return cls(x[None], np.asarray(y, dtype=np.float64), np.array([x.shape[0]]), tuple(hidden_layers), bias,
                   likelihood, noise_sd, **extra)

    def with_rows(self, x: np.ndarray, y: np.ndarray) -> Density:
        """The same model on one group's rows ``x (row, feature)`` and ``y``."""
        return self.on_rows(x, y, self.hidden_layers, self.bias, self.likelihood, self.noise_sd,
                            features=self.features, **{f: getattr(self, f) for f in self._extra_fields})

    def logp_grad(self):
        """The function that computes this density from :meth:`pack`'s buffer (:func:`logp_grad`'s signature):
        the network's passes written out (:func:`hbnn.density.written.logp_grad_for`)."""
        from hbnn.density.written import logp_grad_for

        return logp_grad_for(*self._network())

    def callback(self, skip: int):
        """nutpie's callback (:func:`callback`) for this network, its buffer ``skip`` slots in: numba's disk-cached
        one (:func:`hbnn.density.written.callback_for`)."""
        from hbnn.density.written import callback_for

        return callback_for(*self._network(), skip)

    def _network(self) -> tuple[int, tuple[int, ...], bool]:
        """``(features, hidden widths, bias)``: what :mod:`hbnn.density.written` writes out and caches for."""
        return int(self.X_padded.shape[2]), tuple(int(h) for h in self.hidden_layers), bool(self.bias)

    def specs(self):
        from hbnn.model.network import layer_specs

        return layer_specs(self.X_padded.shape[2], self.hidden_layers, self.bias)

    def names(self) -> dict[str, tuple[int, ...]]:
        """The model's value variables, in order, with their shapes."""
        return {name: shape for name, shape, _ in self.variables()}

    def variables(self) -> list[tuple[str, tuple[int, ...], tuple[str, ...]]]:
        """The model's value variables in PyMC's order (the flat vector's): name, shape and dims."""
        raise NotImplementedError

    def derived(self) -> list[tuple[str, tuple[int, ...], tuple[str, ...]]]:
        """What nutpie's expanded draw holds after the value variables (:func:`expand`): the log-transformed
        variables on their own scale, then the weights that are not value variables; name, shape and dims."""
        return self._sigma_var("sigma")

    def _sigma_var(self, name: str) -> list:
        return [(name, (), ())] if self.likelihood == "gaussian" else []

    def offsets(self) -> dict[str, int]:
        """Where each value variable starts in the flat vector."""
        out, at = {}, 0
        for name, shape in self.names().items():
            out[name] = at
            at += math.prod(shape)
        return out

    def coords(self) -> dict[str, list]:
        """The coordinates of the trace's dims."""
        from hbnn.model.network import layer_coords

        D = self.X_padded.shape[2]
        features = list(self.features) or [f"x{i + 1}" for i in range(D)]
        groups = None
        if self.kind == HIERARCHICAL:
            groups = list(self.groups) or [f"g{g:02d}" for g in range(self.X_padded.shape[0])]
        return layer_coords(features, self.hidden_layers, groups, self.bias)

    def nutpie_model(self):
        """nutpie's model of this density, built without PyTensor: the log density is :meth:`callback`'s, the
        expanded draws :func:`expand`'s, the data :meth:`pack`'s buffer (``user_data``), and each chain starts as
        PyMC would start it (:meth:`initial_center` plus PyMC's jitter). :meth:`check` compares it with PyMC's
        model."""
        import pandas as pd

        from hbnn.density.written import expand_callback
        from hbnn.sampling.nutpie_loader import nutpie

        CompiledPyMCModel = nutpie().compile_pymc.CompiledPyMCModel

        value = self.variables()
        expanded = value + self.derived()
        names, slices, shapes, at = [], [], [], 0
        for name, shape, _ in expanded:
            names.append(name)
            slices.append(slice(at, at + math.prod(shape)))
            shapes.append(np.array(shape, dtype=np.int64))
            at += math.prod(shape)
        n_dim = sum(math.prod(shape) for _, shape, _ in value)
        coords = {d: pd.Index(v) for d, v in self.coords().items()}
        coords["unconstrained_parameter"] = pd.Index(
            [name if not shape else f"{name}_{'.'.join(map(str, i))}" for name, shape, _ in value
             for i in np.ndindex(*shape)])
        return CompiledPyMCModel(
            dims={name: dims for name, _, dims in expanded if dims}, _n_dim=n_dim, _coords=coords,
            _shapes={name: tuple(int(d) for d in shape) for name, shape in zip(names, shapes, strict=True)},
            compiled_logp_func=self.callback(0), compiled_expand_func=expand_callback(),
            initial_point_func=functools.partial(_initial_point, self.initial_center()), shared_data={},
            user_data=self.pack(self.offsets()), n_expanded=at, shape_info=(names, slices, shapes), logp_func=None,
            expand_func=None)

    def checked_nutpie_model(self, build):
        """:meth:`nutpie_model`, checked (:meth:`check`) against nutpie's compile of PyMC's model ``build()`` the first
        time this code and these pins meet this network, likelihood, settings and data shapes: a file in
        :func:`check_dir`, named by :meth:`check_key`, records each check passed, so later fits of the same model
        neither import PyMC nor compile PyTensor's graphs (~2.6 s a process on an AVX2 machine).
        :class:`DensityMismatch` where the check fails."""
        key = self.check_key()
        stamp = check_dir() / key
        if stamp.exists():
            log.debug("kernel: %s was checked against PyMC's model before (%s)", type(self).__name__, key)
            return self.nutpie_model()
        from hbnn.sampling.nutpie_cache import compile_numba

        log.info("kernel: checking the hand-written %s against PyMC's model (once per network, likelihood, "
                 "settings, data shapes and code version)", type(self).__name__)
        checked = self.check(compile_numba(build()))
        if self.check_key() != key:  # the code changed on disk while it was checked: do not vouch for the new one
            return checked
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.touch()
        except OSError as err:  # a read-only cache: the check runs again next time, nothing else changes
            log.warning("kernel: cannot record the check in %s (%s)", stamp, err)
        return checked

    def check_key(self) -> str:
        """What a :meth:`check` depends on, hashed: every source file of ``hbnn`` (the density, the PyMC models,
        the stages' builders, the data layout, nutpie's compile), the pins of PyMC, PyTensor, nutpie, numba and
        NumPy, and the model's kind, network, likelihood, settings, data shapes and coordinates (not the data's
        values, nor an informed prior's: the same code computes every value)."""
        from importlib import metadata

        h = hashlib.sha256(SOURCE.encode())  # this module as imported
        package = Path(__file__).parents[1]  # all of hbnn, not only this subpackage
        for path in sorted(package.rglob("*.py")):
            h.update(path.relative_to(package).as_posix().encode() + path.read_bytes())
        for package in ("pymc", "pytensor", "nutpie", "numba", "numpy"):
            h.update(f"{package}=={metadata.version(package)}".encode())
        h.update(repr((type(self).__name__, self.X_padded.shape, tuple(int(c) for c in self.counts),
                       tuple(self.hidden_layers), bool(self.bias), self.likelihood, float(self.noise_sd),
                       getattr(self, "prior_sd", None), tuple(self.features), tuple(self.groups))).encode())
        return h.hexdigest()[:32]

    def initial_center(self) -> np.ndarray:
        """PyMC's initial point before its jitter: every value variable at its prior's support point on the
        unconstrained scale (0 for the normals and for ``log sd``, ``sd ~ HalfNormal(1)``; ``log noise_sd`` for
        ``sigma_log__``)."""
        center = np.zeros(sum(math.prod(shape) for shape in self.names().values()))
        if self.likelihood == "gaussian":
            center[self.offsets()["sigma_log__"]] = math.log(self.noise_sd)
        return center

    def check(self, compiled, rtol: float = ROW_RTOL, expand_rtol: float = 1e-9):
        """:meth:`nutpie_model`, once it is known to be ``compiled``, nutpie's compile of the PyMC model of the same
        data and settings: the same value variables at the same places, the same expanded variables, dims and
        coordinates, and, at two points, the same log density and gradient (through the callback as nutpie calls
        it; to ``rtol``, as the passes over rows run in float32) and the same expanded draw (float64 throughout, to
        ``expand_rtol``); :class:`DensityMismatch` otherwise."""
        names, slices, shapes = compiled.shape_info
        layout = {n: (int(sl.start), tuple(int(d) for d in shape))
                  for n, sl, shape in zip(names, slices, shapes, strict=True) if sl.stop <= compiled.n_dim}
        offsets = self.offsets()
        want = {n: (offsets[n], shape) for n, shape in self.names().items()}
        if layout != want:
            raise DensityMismatch(f"not the model this log density computes: value variables {layout}, expected "
                                  f"{want}", compiled)
        ours = self.nutpie_model()
        theirs = [(n, tuple(int(d) for d in shape)) for n, shape in zip(names, shapes, strict=True)]
        mine = [(n, tuple(int(d) for d in shape)) for n, shape in zip(ours.shape_info[0], ours.shape_info[2],
                                                                      strict=True)]
        if mine != theirs:
            raise DensityMismatch(f"nutpie's expanded draw holds {theirs}, the hand-written one {mine}", compiled)
        dims = {name: tuple(d) for name, d in compiled.dims.items() if name in names}
        coords = {d: list(compiled.coords[d]) for ds in dims.values() for d in ds}
        if ours.dims != dims or {d: list(ours.coords[d]) for d in coords} != coords:
            raise DensityMismatch(f"the trace's dims and coordinates would differ from PyMC's: {ours.dims} "
                                  f"{dict(ours.coords)} against {dims} {coords}", compiled)
        rng = np.random.default_rng(0)
        for point in (np.zeros(compiled.n_dim), rng.normal(0.0, 0.5, compiled.n_dim)):
            want_value, want_grad = compiled.logp_func(point)
            if not (np.isfinite(want_value) and np.isfinite(want_grad).all()):  # no density could agree with it
                raise SamplingError(f"the model's own log density (PyMC's) is {want_value} near its initial point, so "
                                    f"no sampler can start: {DENSITY_OVERFLOW}")
            value, grad = call(ours, point)
            scale = max(1.0, float(np.abs(want_grad).max()))
            off = float(np.abs(grad - want_grad).max())
            if not (abs(value - want_value) <= rtol * max(1.0, abs(want_value)) and off <= rtol * scale):
                raise DensityMismatch(f"hand-written log density disagrees with PyMC's: {value} vs {want_value}, "
                                      f"gradient off by {off:.3g}", compiled)
            got, want_draw = call_expand(ours, point), call_expand(compiled, point)
            if not np.allclose(got, want_draw, rtol=expand_rtol, atol=expand_rtol):
                raise DensityMismatch(f"hand-written expanded draw disagrees with PyMC's by up to "
                                      f"{float(np.abs(got - want_draw).max()):.3g}", compiled)
        return ours

    def _layers(self, offsets: dict[str, int], at: int) -> tuple[list[float], list[np.ndarray], float]:
        """Per layer the three kind-specific slots, extra arrays to append at ``at``, and the prior's constant."""
        raise NotImplementedError

    def pack(self, offsets: dict[str, int]) -> np.ndarray:
        """The buffer :func:`logp_grad` reads: a header, the layers, counts, ``X`` (group, feature, row) and
        ``Y`` (group, row), then whatever the kind needs; ``offsets``: each value variable's start in the flat
        vector."""
        from scipy.special import gammaln

        X = np.asarray(self.X_padded, dtype=np.float64)
        G, R, D = X.shape
        counts = np.asarray(self.counts, dtype=np.int64)
        # Rows padded to whole vectors (zeros past each group's real rows): the row loops then run with no scalar
        # remainder (~9% of a gradient on the default data with 8-row vectors, ~9% more with 16 where numba
        # compiles 512-bit vectors: benchmarks/FINDINGS.md).
        lanes = row_lanes()
        R8 = -(-R // lanes) * lanes
        X = np.concatenate([X, np.zeros((G, R8 - R, D))], axis=1)
        X[np.arange(R8)[None, :] >= counts[:, None]] = 0.0
        R = R8
        y = np.asarray(self.y, dtype=np.float64)
        Y = np.zeros((G, R))
        starts = np.concatenate([[0], np.cumsum(counts)])
        for g in range(G):
            Y[g, : counts[g]] = y[starts[g]: starts[g + 1]]
        specs = self.specs()
        at = _HEADER + _PER_LAYER * len(specs) + G + G * R * D + G * R
        slots, extra, const = self._layers(offsets, at)
        lay = []
        for s, three in zip(specs, slots, strict=True):
            lay += [s.shape[0] - int(self.bias), s.shape[1] if len(s.shape) == 2 else 1, *three]
        n_dim = sum(math.prod(shape) for shape in self.names().values())
        sigma_at = -1
        if self.likelihood == "gaussian":
            sigma_at = offsets["sigma_log__"]
            const += _HALFNORMAL_CONST - math.log(self.noise_sd) - 0.5 * _LOG_2PI * int(counts.sum())
        elif self.likelihood == "poisson":
            const -= float(gammaln(y + 1.0).sum())
        n_expanded = n_dim + sum(math.prod(shape) for _, shape, _ in self.derived())
        header = [0.0, len(specs), G, R, D, int(self.bias), LIKELIHOODS[self.likelihood], sigma_at, self.noise_sd,
                  const, n_dim, self.kind, getattr(self, "prior_sd", 1.0), n_expanded, lanes]
        buf = np.concatenate([np.asarray(header, dtype=np.float64), np.asarray(lay, dtype=np.float64),
                              counts.astype(np.float64), _rows(X.transpose(0, 2, 1)), _rows(Y), *extra])
        buf[0] = buf.size
        return buf


@functools.cache
def row_lanes() -> int:
    """float32 rows per vector in the kernel's loops as numba compiles them on this machine: 16 where LLVM emits
    512-bit vectors (AVX-512 CPUs it tunes for them, e.g. AMD Zen 4), else 8 (AVX2, and the AVX-512 CPUs it tunes for
    256-bit vectors, most Intel ones). Found by compiling a small loop of the same kind and reading its assembly,
    once a process: padding the rows to 16 where the vectors hold 8 costs ~6%, to 8 where they hold 16 ~9%. The
    padding decides the order of the loops' float32 sums, so the draws of one machine differ in their last bits
    from those of a machine with the other width (as they do between other CPUs). The answer is kept in a file of
    :func:`hbnn.density.written.cache_dir` named by what decides it (the CPU and its features as numba targets them,
    numba's and llvmlite's versions, this module's source), since the probe's compile costs ~0.4 s a process."""
    import llvmlite
    import llvmlite.binding as llvm
    from numba.core import codegen, config

    from hbnn.density.written import cache_dir

    # as numba targets the CPU (its own reading of the host's features, NUMBA_ENABLE_AVX, NUMBA_OPT, NUMBA_CPU_*)
    target = (config.CPU_NAME or llvm.get_host_cpu_name(), config.CPU_FEATURES or codegen.get_host_cpu_features(),
              config.ENABLE_AVX, config.OPT, numba.__version__, llvmlite.__version__, SOURCE)
    path = cache_dir() / f"row_lanes_{hashlib.sha256(repr(target).encode()).hexdigest()[:20]}"
    try:
        kept = path.read_bytes()
    except OSError:
        kept = b""
    if kept in (b"8", b"16"):
        return int(kept)
    signature = (numba.float32, numba.float32[::1], numba.float32[::1], numba.int64)
    try:
        probe = numba.njit(signature, fastmath=True, error_model="numpy")(_axpy)
        lanes = 16 if "zmm" in probe.inspect_asm(signature) else 8
    except Exception as err:  # noqa: BLE001 - no assembly to read: 8 rows, right for most CPUs and correct for all
        log.warning("kernel: cannot read the vector width numba compiles (%s: %s); padding rows to 8",
                    type(err).__name__, err)
        return 8
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(str(lanes))
        os.replace(tmp, path)
    except OSError as err:  # a read-only cache: the probe runs again next time, nothing else changes
        log.debug("kernel: cannot record the row lanes in %s (%s)", path, err)
    return lanes


def _axpy(a, x, y, n):
    """``y[:n] += a * x[:n]``: the shape of the kernel's row loops, for :func:`row_lanes`."""
    for i in range(n):
        y[i] += a * x[i]


def _rows(values: np.ndarray) -> np.ndarray:
    """``values`` as :data:`ROW_DTYPE` (float32) in the first half of as many float64 slots as there are values,
    which keeps the buffer's layout (every offset) as it is for float64."""
    slots = np.zeros(values.size)
    slots.view(ROW_DTYPE)[: values.size] = values.ravel()
    return slots


@dataclass(frozen=True)
class HierarchicalDensity(Density):
    """:func:`hbnn.model.builders.build_hierarchical_model` (same data and settings)."""

    kind = HIERARCHICAL

    def variables(self):
        out = []
        for s in self.specs():
            out += [(f"mu_{s.name}", s.shape, s.dims), (f"sd_{s.name}_log__", (), ()),
                    (f"z_{s.name}", (self.X_padded.shape[0], *s.shape), ("group", *s.dims))]
        return out + self._sigma_var("sigma_log__")

    def derived(self):
        specs = self.specs()
        return ([(f"sd_{s.name}", (), ()) for s in specs] + self._sigma_var("sigma")
                + [(s.var, (self.X_padded.shape[0], *s.shape), ("group", *s.dims)) for s in specs])

    def _layers(self, offsets, at):
        specs = self.specs()
        slots = [[offsets[f"mu_{s.name}"], offsets[f"sd_{s.name}_log__"], offsets[f"z_{s.name}"]] for s in specs]
        n_normal = sum((self.X_padded.shape[0] + 1) * s.size for s in specs)
        return slots, [], -0.5 * _LOG_2PI * n_normal + _HALFNORMAL_CONST * len(specs)


@dataclass(frozen=True)
class FlatDensity(Density):
    """:func:`hbnn.model.builders.build_flat_model` (one group: ``X_padded`` is ``(1, row, feature)``)."""

    prior_sd: float = 1.0
    kind = FLAT
    _extra_fields = ("prior_sd",)

    def variables(self):
        return [(s.var, s.shape, s.dims) for s in self.specs()] + self._sigma_var("sigma_log__")

    def _layers(self, offsets, at):
        specs = self.specs()
        n_w = sum(s.size for s in specs)
        return ([[offsets[s.var], -1, -1] for s in specs], [],
                n_w * (-0.5 * _LOG_2PI - math.log(self.prior_sd)))


@dataclass(frozen=True)
class InformedDensity(Density):
    """:func:`hbnn.model.builders.build_informed_model`: ``prior[layer] = (mean, cov)`` of the flattened layer."""

    prior: dict = None

    kind = INFORMED
    _extra_fields = ("prior",)

    def variables(self):
        return ([(f"z_{s.name}", (s.size,), (f"weight_{s.name}",)) for s in self.specs()]
                + self._sigma_var("sigma_log__"))

    def derived(self):
        return self._sigma_var("sigma") + [(s.var, s.shape, s.dims) for s in self.specs()]

    def coords(self):
        return {**super().coords(), **{f"weight_{s.name}": list(range(s.size)) for s in self.specs()}}

    def _layers(self, offsets, at):
        slots, extra = [], []
        for s in self.specs():
            mean, cov = self.prior[s.name]
            chol = np.linalg.cholesky(np.asarray(cov, dtype=np.float64))  # as build_informed_model factors it
            slots.append([offsets[f"z_{s.name}"], at, at + s.size])
            extra += [np.asarray(mean, dtype=np.float64).ravel(), chol.ravel()]
            at += s.size + s.size * s.size
        n_w = sum(s.size for s in self.specs())
        return slots, extra, -0.5 * _LOG_2PI * n_w
