"""Mean-field ADVI over a hand-written log density's coordinates (:mod:`hbnn.density`), without PyTensor.

The approximation and its optimisation are PyMC's (``pm.ADVI`` with ``pm.adam``, as
:class:`hbnn.sampling.advi._Advi` runs them), over the unconstrained coordinates nutpie samples, whose log density
(:meth:`hbnn.density.densities.Density.logp_grad`) includes the log transforms' Jacobians:

- ``q(theta) = N(mu, sd^2)`` per coordinate, ``sd = softplus(rho)``;
- one reparametrised Monte Carlo draw per step, ``theta = mu + sd * eps`` with ``eps ~ N(0, 1)``;
- the loss of a step is PyMC's ``score=True`` loss, the negative ELBO at that draw:
  ``log q(theta) - log p(theta)`` with ``log q = sum(-eps^2 / 2 - log(2 pi) / 2 - log sd)`` (MeanField's entropy
  term and constants), at the parameters before the step's update;
- with ``advi.minibatch_size`` (the hierarchical fit), the rows of each step drawn with replacement and the
  likelihood scaled by ``n_rows / minibatch_size``, as PyMC's minibatch model does (:class:`_Minibatch`), and the
  loss and its gradient divided by that scale, as PyMC's objective is (``scale_cost_to_minibatch``);
- Adam at ``advi.learning_rate`` with ``pm.adam``'s defaults (:data:`BETA1`, :data:`BETA2`, :data:`EPSILON`).

The Monte Carlo noise comes from NumPy's generator in chunks of :data:`CHUNK` steps, the next drawn on another core
while this one's steps run (:func:`_noise`); a step (:class:`_Step`) is NumPy's float32 ``exp`` and ``log`` and a
few compiled loops around the density's own compiled ``logp_grad``. At 1,000 groups (40,043 parameters) on 2 cores a
full-batch step costs about 2.3 ms, twice one gradient of the density, and a step of 500 rows 0.9 ms, most of it the
per-parameter work: a fifth of PyTensor's minibatch step (4.3 ms).
"""

from __future__ import annotations

import contextlib
import math

import numba
import numpy as np
import pandas as pd
import xarray as xr

from hbnn.config import SamplerParams
from hbnn.density.kernel import _HEADER, _PER_LAYER
from hbnn.density.numerics import ROW_DTYPE
from hbnn.sampling.advi_common import check_loss, split_seed
from hbnn.sampling.backend import Iterations

BETA1, BETA2, EPSILON = 0.9, 0.999, 1e-8  # pm.adam's defaults, which hbnn.sampling.advi._Advi uses
CHUNK = 64  # steps whose noise is drawn in one generator call: the call's overhead shared, 64 x n_dim floats held
DRAW_CHUNK = 100  # draws from the fitted approximation expanded per generator call
MINIBATCH_STREAM = 1  # a minibatch fit's rows come from the generator of [fit seed, this], the noise from fit seed's
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
# exp and log come from NumPy's float32 SIMD loops: without AVX-512 its float64 ones are scalar, 3-4x slower, and
# a step's three per parameter were half its time at 1,000 groups (benchmarks/FINDINGS.md, "Measurements behind code
# comments"). Their relative error, about |rho| x 6e-8 (rho rounded to float32 first), is far below the step's Monte
# Carlo noise; where rho < FLOAT32_RHO, whose exp float32 cannot hold, the loops use float64's own. They may reorder
# sums and fuse multiply-adds (vectorised, the same on every run) but keep IEEE inf and NaN, which the loss check reads
_FAST = {"reassoc", "contract", "nsz", "arcp"}
FLOAT32_RHO = -80.0  # exp(-80) = 1.8e-35, above float32's smallest normal (1.2e-38)


@numba.njit(cache=True, error_model="numpy")
def _minus_abs(rho, out):
    """``out = -|rho|`` in float32, the argument of :func:`numpy.exp` in a step; returns the lowest ``rho``."""
    lowest = np.inf
    for i in range(rho.size):
        out[i] = -abs(rho[i])
        lowest = min(lowest, rho[i])
    return lowest


@numba.njit(cache=True, error_model="numpy")
def _float64_below(rho, mu, eps, theta, sd, sig, log_sd):
    """:func:`_draw`'s values where ``rho < FLOAT32_RHO``, whose ``exp`` float32 cannot hold, in float64: there
    ``softplus(rho) = log1p(e) = e``, ``sigmoid(rho) = e`` and ``log(sd) = rho`` to float64's precision."""
    for i in range(rho.size):
        if rho[i] < FLOAT32_RHO:
            s = math.exp(rho[i])
            sd[i] = s
            sig[i] = s
            theta[i] = mu[i] + s * eps[i]
            log_sd[i] = rho[i]


@numba.njit(cache=True, error_model="numpy", fastmath=_FAST)
def _draw(mu, rho, eps, e, u, log_u, theta, sd, sd32, sig):
    """``sd = softplus(rho)``, ``sig = sigmoid(rho)`` and ``theta = mu + sd * eps`` from float32 ``e = exp(-|rho|)``,
    ``u = 1 + e`` and ``log(u)``: ``softplus(rho) = max(rho, 0) + log1p(e)``, ``sigmoid(rho) = 1 / (1 + e)`` for
    ``rho >= 0``, ``e / (1 + e)`` below. ``log1p(e) = log(u) * e / (u - 1)`` keeps float32's relative precision for
    an ``e`` that ``1 + e`` rounds away (``u - 1`` is exact); ``sd32`` is ``sd`` for the float32 ``log``."""
    for i in range(mu.size):
        r, ei, ui = rho[i], np.float64(e[i]), np.float64(u[i])
        log1p_e = np.float64(log_u[i]) * (ei / (ui - 1.0)) if ui != 1.0 else ei
        s = max(r, 0.0) + log1p_e
        sd[i] = s
        sd32[i] = s
        sig[i] = (1.0 if r >= 0.0 else ei) / (1.0 + ei)
        theta[i] = mu[i] + s * eps[i]


@numba.njit(cache=True, error_model="numpy", fastmath=_FAST)
def _update(mu, rho, sd, sig, log_sd, eps, grad, m_mu, v_mu, m_rho, v_rho, logp, step_size, norm):
    """One Adam step of ``mu`` and ``rho`` down the negative ELBO's gradient; returns the step's loss.

    ``grad`` is the log density's gradient at ``theta = mu + sd * eps``; ``step_size`` is Adam's
    ``learning_rate * sqrt(1 - beta2^t) / (1 - beta1^t)``; ``norm`` is 1 over PyMC's normalising constant of the
    objective (1 full batch; ``batch_size / n_rows`` for a minibatch, whose loss PyMC scales to one minibatch's
    rows). The loss's gradient is ``-grad`` for ``mu`` and ``-(grad * eps + 1 / sd) * sigmoid(rho)`` for ``rho``
    (``d sd / d rho = sigmoid(rho)``), each times ``norm``.
    """
    logq = 0.0
    for i in range(mu.size):
        e, s, g = eps[i], sd[i], grad[i] * norm
        logq -= 0.5 * e * e + log_sd[i]
        g_mu = -g
        g_rho = -(g * e + norm / s) * sig[i]
        m = BETA1 * m_mu[i] + (1.0 - BETA1) * g_mu
        v = BETA2 * v_mu[i] + (1.0 - BETA2) * g_mu * g_mu
        m_mu[i], v_mu[i] = m, v
        mu[i] -= step_size * m / (math.sqrt(v) + EPSILON)
        m = BETA1 * m_rho[i] + (1.0 - BETA1) * g_rho
        v = BETA2 * v_rho[i] + (1.0 - BETA2) * g_rho * g_rho
        m_rho[i], v_rho[i] = m, v
        rho[i] -= step_size * m / (math.sqrt(v) + EPSILON)
    return (logq - mu.size * _HALF_LOG_2PI - logp) * norm


@numba.njit(cache=True)
def _row_slots(G, R, D, at):
    """Where ``X`` starts, ``Y`` starts and ``Y`` ends in a :func:`hbnn.density.buffer.pack` buffer of ``G`` groups of
    ``R`` rows of ``D`` features whose group counts start at slot ``at`` (each float32 value in a float64 slot)."""
    X_at = at + G
    Y_at = X_at + G * R * D
    return X_at, Y_at, Y_at + G * R


@numba.njit(cache=True, error_model="numpy")
def _fill(rows, group, row, X_all, Y_all, R_all, buf, at):
    """Write the drawn ``rows`` (indices into every real row, in group order) into a minibatch buffer ``buf`` whose
    group counts start at ``at``: each group's drawn rows first, in the order drawn, and ``R`` (slot 3) the most rows
    any group drew, rounded up to whole vectors of the buffer's lanes (slot 14), as :func:`hbnn.density.buffer.pack`
    pads them. ``group`` and ``row`` say where each real row lives in the full buffer's ``X_all`` and ``Y_all``
    (``R_all`` rows a group).

    ``R`` is the step's, not the batch size: the passes over a group's rows cover all ``R`` in places (the
    activation's one call per layer, :func:`hbnn.density.kernel._forward`). The buffer was packed for groups of the
    batch size, so ``X`` and ``Y`` at a smaller ``R`` fit where the packed ones were, before anything packed after
    them.
    """
    G, D, lanes = int(buf[2]), int(buf[4]), int(buf[14])
    counts = buf[at:at + G]
    counts[:] = 0.0
    most = 1
    for k in range(rows.size):
        g = group[rows[k]]
        counts[g] += 1.0
        most = max(most, int(counts[g]))
    R = -(-most // lanes) * lanes
    buf[3] = R
    X_at, Y_at, end = _row_slots(G, R, D, at)
    X = buf[X_at:Y_at].view(np.float32)
    Y = buf[Y_at:end].view(np.float32)
    counts[:] = 0.0
    for k in range(rows.size):
        g, r_all = group[rows[k]], row[rows[k]]
        r = int(counts[g])
        counts[g] = r + 1
        for i in range(D):
            X[(g * D + i) * R + r] = X_all[(g * D + i) * R_all + r_all]
        Y[g * R + r] = Y_all[g * R_all + r_all]


class _Minibatch:
    """The rows of each step of a minibatch fit, drawn as PyMC's ``pm.Minibatch`` draws them for
    :func:`hbnn.model.builders.build_hierarchical_minibatch_model`: ``size`` rows with replacement from every real
    row, the likelihood scaled by ``n_rows / size``.

    They are written into a buffer of the density's layout (:func:`hbnn.density.buffer.pack`) whose groups hold up to
    ``size`` rows, with the scale in its slot 6, so the density's own ``logp_grad`` computes the minibatch's log
    density and skips the groups with no row drawn. Each step's constant is the priors' plus the scaled data-only
    terms of the rows drawn (:meth:`hbnn.model.likelihoods.base.Likelihood.density_constant`).

    Parameters
    ----------
    density : hbnn.density.densities.Density
        The full-batch density.
    full : numpy.ndarray
        Its buffer.
    size : int
        Rows per step.
    """

    def __init__(self, density, full: np.ndarray, size: int):
        import dataclasses

        from hbnn.model import likelihoods

        counts = np.asarray(density.counts, dtype=np.int64)
        G, D = counts.size, int(full[4])
        self.n_rows = int(counts.sum())
        self.group = np.repeat(np.arange(G), counts)  # every real row's group and row in it, in group order
        self.row = np.arange(self.n_rows) - np.repeat(np.cumsum(counts) - counts, counts)
        empty = dataclasses.replace(density, X_padded=np.zeros((G, size, D)), y=np.zeros(0),
                                    counts=np.zeros(G, dtype=np.int64))
        self.buf = empty.pack(empty.offsets())
        self.buf[6] = self.n_rows / size
        self.y, self.noise_sd = np.asarray(density.y, dtype=np.float64), density.noise_sd
        self.constant = likelihoods.get(density.likelihood).density_constant
        self.empty = self.constant(self.y[:0], self.noise_sd)  # the extra parameter prior's constant, no row's
        self.priors = self.buf[9]  # the priors' constants, the extra parameter's included (no rows in it yet)
        self.source = (*_rows(full), int(full[3]))
        self.counts_at = _HEADER + _PER_LAYER * int(self.buf[1])

    def fill(self, rows: np.ndarray) -> None:
        """Make ``rows`` (indices into every real row, in group order) the buffer's minibatch.

        Parameters
        ----------
        rows : numpy.ndarray
            int64, ``size`` of them.
        """
        _fill(rows, self.group, self.row, *self.source, self.buf, self.counts_at)
        terms = self.constant(self.y[rows], self.noise_sd) - self.empty
        self.buf[9] = self.priors + self.buf[6] * terms


def _rows(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``X`` and ``Y`` (float32) of a :func:`hbnn.density.buffer.pack` buffer, as views."""
    G, R, D = int(buf[2]), int(buf[3]), int(buf[4])
    X_at, Y_at, end = _row_slots(G, R, D, _HEADER + _PER_LAYER * int(buf[1]))
    return buf[X_at:Y_at].view(ROW_DTYPE)[:G * R * D], buf[Y_at:end].view(ROW_DTYPE)[:G * R]


def _noise(seed: int, iterations: int, n: int):
    """``(start, eps)`` for every :data:`CHUNK` of steps: ``eps`` their ``(steps, n)`` standard normal noise, from
    the generator of ``seed``, in order.

    The next chunk is drawn on another thread while the steps of this one run (NumPy's generator releases the GIL
    while it fills an array): the noise is a third of a step's time at 1,000 groups, and ADVI's steps keep one core
    busy. One generator draws every chunk in turn, so the noise is the same as drawn in line.
    """
    from concurrent.futures import ThreadPoolExecutor

    noise = np.random.default_rng(seed)
    starts = range(0, iterations, CHUNK)
    with ThreadPoolExecutor(1, thread_name_prefix="advi-noise") as pool:
        ahead = pool.submit(noise.standard_normal, (min(CHUNK, iterations), n))
        for start in starts:
            eps = ahead.result()
            after = start + CHUNK
            if after < iterations:
                ahead = pool.submit(noise.standard_normal, (min(after + CHUNK, iterations) - after, n))
            yield start, eps


def _softplus(rho: np.ndarray) -> np.ndarray:
    """``softplus(rho)``, elementwise, without overflow."""
    return np.maximum(rho, 0.0) + np.log1p(np.exp(-np.abs(rho)))


class _Step:
    """The working arrays of one fit's steps, and the step itself (:meth:`__call__`)."""

    def __init__(self, mu: np.ndarray, logp_grad, buf: np.ndarray, norm: float = 1.0):
        n = mu.size
        self.mu, self.rho = mu, np.zeros(n)  # rho = 0 where PyMC's MeanField starts it (no start_sigma)
        self.moments = tuple(np.zeros(n) for _ in range(4))  # Adam's m and v of mu, then of rho
        self.theta, self.grad, self.sd, self.sig = (np.empty(n) for _ in range(4))
        self.e, self.u, self.log_u, self.sd32, self.log_sd = (np.empty(n, dtype=np.float32) for _ in range(5))
        self.logp_grad, self.buf, self.norm = logp_grad, buf, norm

    def __call__(self, eps: np.ndarray, step_size: float) -> float:
        """One step at the noise ``eps``; returns its loss."""
        e, u, log_u = self.e, self.u, self.log_u
        lowest = _minus_abs(self.rho, e)
        np.exp(e, out=e)
        np.add(e, np.float32(1.0), out=u)
        np.log(u, out=log_u)
        _draw(self.mu, self.rho, eps, e, u, log_u, self.theta, self.sd, self.sd32, self.sig)
        np.log(self.sd32, out=self.log_sd)
        if lowest < FLOAT32_RHO:  # rare: a branch in the loops above would run float64's exp for every rho
            _float64_below(self.rho, self.mu, eps, self.theta, self.sd, self.sig, self.log_sd)
        logp = self.logp_grad(self.theta, self.grad, self.buf)
        return _update(self.mu, self.rho, self.sd, self.sig, self.log_sd, eps, self.grad, *self.moments, logp,
                       step_size, self.norm)


class DensityAdvi:
    """Mean-field ADVI of one hand-written density, refitted to other rows by :meth:`with_rows`.

    Parameters
    ----------
    density : hbnn.density.densities.Density
        The model's hand-written log density (checked against PyMC's model by the caller).
    """

    def __init__(self, density, minibatch_size: int = 0):
        self.density = density
        self.logp_grad = density.logp_grad()
        self.buf = density.pack(density.offsets())
        self.n_dim = int(self.buf[10])
        self.n_expanded = int(self.buf[13])
        self.minibatch_size = minibatch_size

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
        return DensityAdvi(self.density.with_rows(x, y), self.minibatch_size)

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
        batch = _Minibatch(self.density, self.buf, self.minibatch_size) if self.minibatch_size else None
        step = (_Step(mu, self.logp_grad, self.buf) if batch is None
                else _Step(mu, self.logp_grad, batch.buf, self.minibatch_size / batch.n_rows))
        rows = np.random.default_rng([fit_seed, MINIBATCH_STREAM])
        loss = np.empty(a.iterations)
        # closed on an error too, which ends its thread and frees the chunk drawn ahead
        with contextlib.closing(_noise(fit_seed, a.iterations, n)) as chunks:
            for start, eps in chunks:
                stop = start + eps.shape[0]
                drawn = None if batch is None else rows.integers(0, batch.n_rows, (stop - start, self.minibatch_size))
                with np.errstate(all="ignore"):  # an sd that underflows to 0 shows as a non-finite loss, refused below
                    for k in range(stop - start):
                        t = start + k + 1
                        if batch is not None:
                            batch.fill(drawn[k])
                        loss[t - 1] = step(eps[k], a.learning_rate * math.sqrt(1.0 - BETA2 ** t) / (1.0 - BETA1 ** t))
                check_loss(loss[:stop], a.learning_rate)
                if progress is not None:
                    progress.add(stop - start)
        return self._draws(step.mu, _softplus(step.rho), draw_seed, s.chains, s.draws), loss

    def _draws(self, mu: np.ndarray, sd: np.ndarray, seed: int, chains: int, draws: int) -> xr.Dataset:
        """``chains x draws`` draws from ``N(mu, sd^2)``, expanded as nutpie expands a draw."""
        from hbnn.density.callbacks import expand

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
        ``(chain, draw, n_expanded)``: :func:`hbnn.density.callbacks.expand`'s output per draw.

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
