"""Hand-written log densities and gradients of the three BNNs, for nutpie.

PyTensor's compiled gradients (its numba backend, or XLA) are bound by per-op overhead and a scalar ``tanh``, not by
the arithmetic, which on these small networks is a small share of each gradient's time, the more so for a per-group
flat or informed model (measured: benchmarks/FINDINGS.md, section 'Measurements behind code comments'). This module
computes exactly the densities PyMC gives NUTS for :mod:`hbnn.model.builders`' full-batch models, in the
unconstrained space the sampler sees, with manual backpropagation in one numba function: every layer count, width,
bias row and ragged group size the builders accept, for every likelihood and activation that provides compiled code
(:func:`hbnn.density.densities.unsupported` says which do not).

* weights, in ``model.value_vars`` order: hierarchical (:class:`~hbnn.density.densities.HierarchicalDensity`): per
  layer ``mu_<layer>``, ``sd_<layer>_log__`` (``sd = exp(s)``, the density includes the log-Jacobian ``s``,
  ``sd ~ HalfNormal(1)``) and ``z_<layer>`` ``(group, *layer.shape)``, with ``w[g] = mu + sd * z[g]``; flat
  (:class:`~hbnn.density.densities.FlatDensity`): ``w_<layer> ~ Normal(0, prior_sd)``; informed
  (:class:`~hbnn.density.densities.InformedDensity`): ``z_<layer> ~ Normal(0, I)`` and ``w = mean + chol(cov) @ z``
  per flattened layer;
* the likelihood of :mod:`hbnn.model.likelihoods` over each group's real rows, its terms computed by the likelihood's
  compiled source (:attr:`~hbnn.model.likelihoods.base.Likelihood.density_source`), and its extra parameter, where
  it has one (gaussian's ``sigma``, negative_binomial's ``alpha``), with the prior ``HalfNormal(noise_sd)`` as value
  variable ``<extra>_log__``, last.

The functions here are templates: a likelihood's terms (``_likelihood_rows``) and an activation's
(``_activation_inplace``, ``_activation_slope``) are bound only in the modules :mod:`hbnn.density.written` writes
for one network, likelihood and activation, which compile this module's functions around them (from its text as
imported, :data:`SOURCE`): with the layers' loops reading the widths at run time, or, on networks up to
:data:`hbnn.density.written.MAX_WEIGHTS` weights, with passes written out for the widths (faster, for the reasons
:mod:`hbnn.density.written` gives). Every fit uses them (:meth:`~hbnn.density.densities.Density.logp_grad`). Every
loop runs over rows, and every function uses numba's ``error_model="numpy"``: with Python's, each float division
checks for zero, and a loop with that check does not vectorise.

The passes over a group's rows (forward, likelihood terms, backward) run in float32
(:data:`~hbnn.density.numerics.ROW_DTYPE`, :mod:`hbnn.density.numerics`): twice as many rows per vector as float64
and shorter polynomials (measured: benchmarks/FINDINGS.md, section 'Measurements behind code comments'). Each
group's log-likelihood terms are summed in float64, and the weights, priors, sums over groups and the chain rule to
the sampler's coordinates are float64. tanh is a rational function (Eigen's float32 minimax approximation), within
3.5e-7 absolute; the Bernoulli terms' ``exp`` a degree-7 Taylor polynomial after the usual ``k ln 2`` range
reduction (:mod:`hbnn.density.numerics`). The log density and gradient equal PyMC's compiled (float64) ones to
:data:`~hbnn.density.pymc_check.ROW_RTOL` of their scale, including every normalising constant:
``tests/test_kernel.py`` checks values and gradients against PyMC for each supported configuration, and
:func:`~hbnn.density.pymc_check.check` checks them again, at two points, for the model at hand before it is first
sampled (once per network, likelihood, settings, data shapes and code version:
:func:`~hbnn.density.pymc_check.checked_nutpie_model`). NUTS stays exact for the density it is given: the leapfrog
steps are reversible and volume-preserving for any gradient that is a function of the position, and the accept step
uses this density's own value, which differs from PyMC's by less than ``ROW_RTOL`` of its scale.

nutpie's model is built from the density alone (:meth:`~hbnn.density.densities.Density.nutpie_model`): the log
density through nutpie's logp callback, the draws expanded to every model variable by
:func:`hbnn.density.callbacks.expand` (the group sds, ``w = mu + sd * z``, ``w = mean + L @ z``), chains started as
PyMC starts them. Where the values live:
:func:`~hbnn.density.buffer.pack` writes the layout and the data into one float64 buffer, the ``user_data`` that
nutpie passes to both callbacks; so the machine code depends on neither the data nor the model's sizes, and numba's
disk cache serves every process after the first.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numba
import numpy as np

from hbnn.density.numerics import _F0, ROW_DTYPE

log = logging.getLogger(__name__)


SOURCE = Path(__file__).read_text()  # as imported: hbnn.density.written compiles its functions from this text


HIERARCHICAL, FLAT, INFORMED = 0, 1, 2  # how a layer's weights come from the flat vector


_HEADER = 15  # buffer slots before the per-layer layout (see hbnn.density.buffer.pack)


_PER_LAYER = 5  # n_in (without bias), n_out, then three offsets that depend on the kind (hbnn.density.buffer.pack)


_LOG_2PI = math.log(2.0 * math.pi)


_HALFNORMAL_CONST = math.log(2.0) - 0.5 * _LOG_2PI


def _likelihood_rows(out, y, dlogit, n, e, bits, extra):
    """The likelihood's terms over a group's ``n`` rows: in each written module, the likelihood's compiled source
    (:attr:`hbnn.model.likelihoods.base.Likelihood.density_source`)."""
    raise NotImplementedError("compiled only in the modules hbnn.density.written writes")


def _activation_inplace(a, n):
    """``a[:n] = f(a[:n])`` in float32: in each written module, the activation's compiled source
    (:attr:`hbnn.model.activations.base.Activation.compiled_source`)."""
    raise NotImplementedError("compiled only in the modules hbnn.density.written writes")


def _activation_slope(h):
    """``f'`` where the activation is ``h``: in each written module, the activation's."""
    raise NotImplementedError("compiled only in the modules hbnn.density.written writes")


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _forward(W, H, X, g, n8, R, D, lay, n_layers, bias):
    """The network's pass over one group's rows at weights ``W`` (layer after layer, ``(n_in + bias, n_out)``
    row-major): ``H[l]`` is what enters layer ``l`` (``H[0]`` the features), ``H[n_layers]`` the output.

    Activations are ``(unit, row)`` with rows contiguous, so every inner loop runs over rows: over ``n8``, the
    real rows rounded up to a multiple of 8 (``R`` is one), whose padding rows hold finite values in ``X`` (zeros,
    or a minibatch's earlier rows), which the backward pass weighs by 0.
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
            _activation_inplace(a, n_out * R)
        w_at += (n_in + bias) * n_out


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _output(out, delta, dlogit, e, bits, Y, g, n, n8, R, extra):
    """The likelihood of one group's ``n`` rows at the network's output ``out`` (:func:`_likelihood_rows`): returns
    ``(loglik, d loglik / d log extra)`` and writes ``d loglik / d out`` into ``delta[:n8]`` (0 on padding rows)."""
    ll, g_extra = _likelihood_rows(out, Y[g * R: g * R + n], dlogit, n, e, bits, extra)
    for r in range(n):
        delta[r] = dlogit[r]
    for r in range(n, n8):
        delta[r] = 0.0
    return ll, g_extra


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
                    bk[r] *= _activation_slope(hi)
            for k in range(n_in * R):
                delta[k] = back[k]


@numba.njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _group_loglik(W, gW, H, delta, back, dlogit, e, bits, X, Y, g, n, R, D, lay, n_layers, bias, extra, lanes):
    """One group's log-likelihood at weights ``W``; adds its gradient to ``gW`` and returns ``(loglik,
    d loglik / d log extra)``. The passes run over the ``n`` real rows rounded up to whole vectors of ``lanes``
    rows (:func:`hbnn.density.buffer.row_lanes`). Its source is also compiled in :mod:`hbnn.density.written`'s
    modules, where
    ``_forward`` and ``_backward`` are the ones written out for one network."""
    n8 = min(R, -(-n // lanes) * lanes)
    _forward(W, H, X, g, n8, R, D, lay, n_layers, bias)
    ll, g_extra = _output(H[n_layers], delta, dlogit, e, bits, Y, g, n, n8, R, extra)
    _backward(W, gW, H, delta, back, X, g, n8, R, D, lay, n_layers, bias)
    return ll, g_extra


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
    """The log density at ``theta``, its gradient written into ``grad``.

    Parameters
    ----------
    theta : numpy.ndarray
        The sampler's flat vector, in the layout packed in ``buf``.
    grad : numpy.ndarray
        As long as ``theta``; overwritten with the gradient.
    buf : numpy.ndarray
        :func:`hbnn.density.buffer.pack`'s buffer.

    Returns
    -------
    float
        The log density, every normalising constant included.
    """
    n_layers = int(buf[1])
    G = int(buf[2])
    R = int(buf[3])
    D = int(buf[4])
    bias = int(buf[5])
    extra_at = int(buf[7])  # the likelihood's extra parameter, log-transformed (-1: none)
    noise_sd = buf[8]
    lp = buf[9]  # every normalising constant, data-only terms included
    n_dim = int(buf[10])
    kind = int(buf[11])
    prior_sd = buf[12]
    lanes = int(buf[14])
    scale = buf[6]  # the rows each row present stands for: 1, or a minibatch's n_rows / batch_size
    minibatch = scale != 1.0
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
    extra = 1.0
    if extra_at >= 0:  # HalfNormal(noise_sd) on the log scale, instead of the standard normal
        s = theta[extra_at]
        extra = math.exp(s)
        u = extra / noise_sd
        lp += 0.5 * s * s - 0.5 * u * u + s
        grad[extra_at] = 1.0 - u * u

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
    g_extra = 0.0
    for g in range(G):
        n = int(counts[g])
        if minibatch and n == 0:  # none of the group's rows in this minibatch: its weights add nothing here
            continue
        _group_weights(theta, W, gW, g, buf, lay, n_layers, bias, kind, sds)
        ll, gs = _group_loglik(W, gW, H, delta, back, dlogit, e, bits, X, Y, g, n, R, D, lay, n_layers, bias, extra,
                               lanes)
        if minibatch:
            ll *= scale
            gs *= scale
            for k in range(n_w):
                gW[k] *= scale
        lp += ll
        g_extra += gs
        _group_chain_rule(theta, grad, gW, g, buf, lay, n_layers, bias, kind, sds, g_sd)
    if kind == HIERARCHICAL:
        for li in range(n_layers):
            grad[int(lay[_PER_LAYER * li + 3])] += g_sd[li]
    if extra_at >= 0:
        grad[extra_at] += g_extra
    return lp
