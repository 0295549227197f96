"""Mean-field ADVI over a hand-written log density's coordinates (:mod:`hbnn.density`), without PyTensor.

The approximation and its optimisation are PyMC's (``pm.ADVI`` with ``pm.adam``, as
:class:`hbnn.sampling.advi._Advi` runs them), over the unconstrained coordinates nutpie samples, whose log density
(:meth:`hbnn.density.densities.Density.logp_grad`) includes the log transforms' Jacobians:

- ``q(theta) = N(mu, sd^2)`` per coordinate, ``sd = softplus(rho)``;
- one reparametrised Monte Carlo draw per step, ``theta = mu + sd * eps`` with ``eps ~ N(0, 1)``;
- the loss of a step is PyMC's ``score=True`` loss, the negative ELBO at that draw:
  ``log q(theta) - log p(theta)`` with ``log q = sum(-eps^2 / 2 - log(2 pi) / 2 - log sd)`` (MeanField's entropy
  term and constants), at the parameters before the step's update;
- Adam at ``advi.learning_rate`` with ``pm.adam``'s defaults (:data:`BETA1`, :data:`BETA2`, :data:`EPSILON`).

The Monte Carlo noise comes from NumPy's generator in chunks of :data:`CHUNK` steps; a step (:class:`_Step`) is
NumPy's SIMD ``exp`` and ``log`` and four compiled loops around the density's own compiled ``logp_grad``: at 1,000
groups about twice one gradient of the density, where PyTensor's minibatch step of 500 rows costs twice as much again.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import pandas as pd
import xarray as xr

from hbnn.config import SamplerParams
from hbnn.sampling.advi_common import check_loss, split_seed
from hbnn.sampling.backend import Iterations

BETA1, BETA2, EPSILON = 0.9, 0.999, 1e-8  # pm.adam's defaults, which hbnn.sampling.advi._Advi uses
CHUNK = 64  # steps whose noise is drawn in one generator call: the call's overhead shared, 64 x n_dim floats held
DRAW_CHUNK = 100  # draws from the fitted approximation expanded per generator call
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
# exp and log come from NumPy's SIMD loops, several times faster than numba's scalar calls; the loops here may
# reorder sums and fuse multiply-adds (vectorised, the same on every run) but keep IEEE inf and NaN, which the loss
# check reads
_FAST = {"reassoc", "contract", "nsz", "arcp"}
LOG1P_BELOW = 1e-4  # where e = exp(-|rho|) is smaller, log(1 + e) loses over 1e-12 of log1p(e): log1p is used


@numba.njit(cache=True, error_model="numpy")
def _minus_abs(rho, out):
    """``out = -|rho|``: the argument of :func:`numpy.exp` in a step."""
    for i in range(rho.size):
        out[i] = -abs(rho[i])


@numba.njit(cache=True, error_model="numpy")
def _log1p_where_small(e, log1p_e):
    """``log1p_e = log1p(e)`` where ``log(1 + e)`` (NumPy's, already there) loses too much of a small ``e``."""
    for i in range(e.size):
        if e[i] < LOG1P_BELOW:
            log1p_e[i] = math.log1p(e[i])


@numba.njit(cache=True, error_model="numpy", fastmath=_FAST)
def _draw(mu, rho, eps, e, log1p_e, theta, sd, sig):
    """``sd = softplus(rho)``, ``sig = sigmoid(rho)`` and ``theta = mu + sd * eps``, from ``e = exp(-|rho|)`` and
    ``log1p(e)``: ``softplus(rho) = max(rho, 0) + log1p(e)``, ``sigmoid(rho) = 1 / (1 + e)`` for ``rho >= 0``,
    ``e / (1 + e)`` below."""
    for i in range(mu.size):
        r, ei = rho[i], e[i]
        s = max(r, 0.0) + log1p_e[i]
        sd[i] = s
        sig[i] = (1.0 if r >= 0.0 else ei) / (1.0 + ei)
        theta[i] = mu[i] + s * eps[i]


@numba.njit(cache=True, error_model="numpy", fastmath=_FAST)
def _update(mu, rho, sd, sig, log_sd, eps, grad, m_mu, v_mu, m_rho, v_rho, logp, step_size):
    """One Adam step of ``mu`` and ``rho`` down the negative ELBO's gradient; returns the step's loss.

    ``grad`` is the log density's gradient at ``theta = mu + sd * eps``; ``step_size`` is Adam's
    ``learning_rate * sqrt(1 - beta2^t) / (1 - beta1^t)``. The loss's gradient is ``-grad`` for ``mu`` and
    ``-(grad * eps + 1 / sd) * sigmoid(rho)`` for ``rho`` (``d sd / d rho = sigmoid(rho)``).
    """
    logq = 0.0
    for i in range(mu.size):
        e, s, g = eps[i], sd[i], grad[i]
        logq -= 0.5 * e * e + log_sd[i]
        g_mu = -g
        g_rho = -(g * e + 1.0 / s) * sig[i]
        m = BETA1 * m_mu[i] + (1.0 - BETA1) * g_mu
        v = BETA2 * v_mu[i] + (1.0 - BETA2) * g_mu * g_mu
        m_mu[i], v_mu[i] = m, v
        mu[i] -= step_size * m / (math.sqrt(v) + EPSILON)
        m = BETA1 * m_rho[i] + (1.0 - BETA1) * g_rho
        v = BETA2 * v_rho[i] + (1.0 - BETA2) * g_rho * g_rho
        m_rho[i], v_rho[i] = m, v
        rho[i] -= step_size * m / (math.sqrt(v) + EPSILON)
    return logq - mu.size * _HALF_LOG_2PI - logp


def _softplus(rho: np.ndarray) -> np.ndarray:
    """``softplus(rho)``, elementwise, without overflow."""
    return np.maximum(rho, 0.0) + np.log1p(np.exp(-np.abs(rho)))


class _Step:
    """The working arrays of one fit's steps, and the step itself (:meth:`__call__`)."""

    def __init__(self, mu: np.ndarray, logp_grad, buf: np.ndarray):
        n = mu.size
        self.mu, self.rho = mu, np.zeros(n)  # rho = 0 where PyMC's MeanField starts it (no start_sigma)
        self.moments = tuple(np.zeros(n) for _ in range(4))  # Adam's m and v of mu, then of rho
        self.e, self.log1p_e, self.theta, self.grad, self.sd, self.sig, self.log_sd = (np.empty(n) for _ in range(7))
        self.logp_grad, self.buf = logp_grad, buf

    def __call__(self, eps: np.ndarray, step_size: float) -> float:
        """One step at the noise ``eps``; returns its loss."""
        e, log1p_e = self.e, self.log1p_e
        _minus_abs(self.rho, e)
        np.exp(e, out=e)
        np.add(e, 1.0, out=log1p_e)
        np.log(log1p_e, out=log1p_e)
        _log1p_where_small(e, log1p_e)
        _draw(self.mu, self.rho, eps, e, log1p_e, self.theta, self.sd, self.sig)
        np.log(self.sd, out=self.log_sd)
        logp = self.logp_grad(self.theta, self.grad, self.buf)
        return _update(self.mu, self.rho, self.sd, self.sig, self.log_sd, eps, self.grad, *self.moments, logp,
                       step_size)


class DensityAdvi:
    """Mean-field ADVI of one hand-written density, refitted to other rows by :meth:`with_rows`.

    Parameters
    ----------
    density : hbnn.density.densities.Density
        The model's hand-written log density (checked against PyMC's model by the caller).
    """

    def __init__(self, density):
        self.density = density
        self.logp_grad = density.logp_grad()
        self.buf = density.pack(density.offsets())
        self.n_dim = int(self.buf[10])
        self.n_expanded = int(self.buf[13])

    def with_rows(self, x: np.ndarray, y: np.ndarray) -> DensityAdvi:
        """The same model on other rows (a per-group model's next group).

        Parameters
        ----------
        x : numpy.ndarray
            ``(row, feature)``.
        y : numpy.ndarray
            Their labels.

        Returns
        -------
        DensityAdvi
        """
        return DensityAdvi(self.density.with_rows(x, y))

    def fit(self, seed: int, s: SamplerParams, progress: Iterations | None = None
            ) -> tuple[xr.Dataset, np.ndarray]:
        """Fit the approximation from ``seed`` and draw ``chains x draws`` from it.

        The streams are :class:`hbnn.sampling.advi._Advi`'s (:func:`hbnn.sampling.advi_common.split_seed`): the
        Monte Carlo noise, the draws, and the starting means' ``N(0, init_jitter)`` jitter around the model's initial
        point (:meth:`hbnn.density.densities.Density.initial_center`); ``rho`` starts at 0, as PyMC's does. The
        parameters are :meth:`hbnn.sampling.advi._Advi.fit`'s.

        Returns
        -------
        tuple
            ``(posterior, loss)``: the draws as :func:`posterior` lays them out, and the loss per step.

        Raises
        ------
        FloatingPointError
            At the first chunk of steps whose loss is not finite (:func:`hbnn.sampling.advi_common.check_loss`).
        """
        a = s.advi
        fit_seed, draw_seed, init_seed = split_seed(seed)
        n = self.n_dim
        mu = self.density.initial_center() + np.random.default_rng(init_seed).normal(0.0, a.init_jitter, n)
        step = _Step(mu, self.logp_grad, self.buf)
        noise = np.random.default_rng(fit_seed)
        loss = np.empty(a.iterations)
        for start in range(0, a.iterations, CHUNK):
            stop = min(start + CHUNK, a.iterations)
            eps = noise.standard_normal((stop - start, n))
            with np.errstate(all="ignore"):  # an sd that underflows to 0 shows as a non-finite loss, refused below
                for k in range(stop - start):
                    t = start + k + 1
                    loss[t - 1] = step(eps[k], a.learning_rate * math.sqrt(1.0 - BETA2 ** t) / (1.0 - BETA1 ** t))
            check_loss(loss[:stop], a.learning_rate)
            if progress is not None:
                progress.add(stop - start)
        return self._draws(step.mu, _softplus(step.rho), draw_seed, s.chains, s.draws), loss

    def _draws(self, mu: np.ndarray, sd: np.ndarray, seed: int, chains: int, draws: int) -> xr.Dataset:
        """``chains x draws`` draws from ``N(mu, sd^2)``, expanded as nutpie expands a draw."""
        from hbnn.density.kernel import expand

        total = chains * draws
        out = np.empty((total, self.n_expanded))
        rng = np.random.default_rng(seed)
        for start in range(0, total, DRAW_CHUNK):
            stop = min(start + DRAW_CHUNK, total)
            thetas = mu + sd * rng.standard_normal((stop - start, self.n_dim))
            for k in range(stop - start):
                expand(thetas[k], out[start + k], self.buf)
        return posterior(self.density, out.reshape(chains, draws, -1))


def posterior(density, expanded: np.ndarray) -> xr.Dataset:
    """Expanded draws as the posterior of nutpie's trace of the same density
    (:func:`hbnn.sampling.nutpie_adapter.trace_from_raw`): the value variables, then the derived ones, with their
    dims and coordinates.

    Parameters
    ----------
    density : hbnn.density.densities.Density
        The density the draws are of.
    expanded : numpy.ndarray
        ``(chain, draw, n_expanded)``: :func:`hbnn.density.kernel.expand`'s output per draw.

    Returns
    -------
    xarray.Dataset
    """
    from hbnn.sampling.nutpie_adapter import _ARVIZ_VERSION

    chains, draws, _ = expanded.shape
    coords = density.coords()
    data, sizes, at = {}, {}, 0
    for name, shape, dims in density.variables() + density.derived():
        size = math.prod(shape)
        data[name] = (("chain", "draw", *dims), expanded[:, :, at:at + size].reshape(chains, draws, *shape))
        sizes.update(zip(dims, shape, strict=True))
        at += size
    return xr.Dataset(
        data,
        coords={"chain": np.arange(chains), "draw": np.arange(draws),
                **{d: pd.Index(coords[d]) if d in coords else np.arange(n) for d, n in sizes.items()}},
        attrs={"arviz_version": _ARVIZ_VERSION},
    )
