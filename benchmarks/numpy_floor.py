"""Hand-written NumPy log density and gradient of the hierarchical BNN.

This is the cost floor that a sampler's per-gradient cost is compared with
(DESIGN.md: "about 90 us per evaluation"). It evaluates exactly the density
that PyMC gives NUTS for :func:`hbnn.model.builders.build_hierarchical_model`, in the
unconstrained space the sampler sees:

* per layer, in PyMC's ``model.value_vars`` order: ``mu_<layer>`` (per weight),
  ``sd_<layer>_log__`` (scalar, ``sd = exp(s)``; the density includes the
  log-Jacobian ``s``), ``z_<layer>`` (``(group, *layer.shape)``);
* ``w[g] = mu + sd * z[g]``, tanh MLP without biases, Bernoulli-logit likelihood
  over the rows listed in ``valid`` only (padding never enters).

The gradient is manual backpropagation; no autodiff library is involved.

Usage::

    floor = NumpyFloor.from_tasks(Tasks(make_moons_tasks(DataSpec.of(parse_params({})))), (5, 5))
    logp, grad = floor.logp_and_grad(theta)
    us = us_per_grad(floor, repeats=7)

``python benchmarks/numpy_floor.py`` prints the floor for the default data.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hbnn.data.tasks import Tasks
from hbnn.model.network import layer_specs

_LOG_2PI = math.log(2.0 * math.pi)
_HALFNORMAL_CONST = math.log(2.0) - 0.5 * _LOG_2PI


@dataclass(frozen=True)
class _Block:
    """Where one value variable sits in the flat vector."""

    name: str
    start: int
    shape: tuple[int, ...]
    size: int = 0
    stop: int = 0

    @classmethod
    def at(cls, name: str, start: int, shape: tuple[int, ...]) -> _Block:
        size = math.prod(shape)
        return cls(name, start, shape, size, start + size)

    def view(self, theta: np.ndarray) -> np.ndarray:
        return theta[self.start : self.stop].reshape(self.shape)


class NumpyFloor:
    """Log density and gradient of the default hierarchical model for one data set.

    ``X`` is the padded ``(group, row, feature)`` block, ``y`` the labels of the
    real rows and ``valid`` their positions in the flattened ``group*row`` axis
    (see :class:`hbnn.data.tasks.Padded`).
    """

    def __init__(self, X: np.ndarray, y: np.ndarray, valid: np.ndarray, hidden_layers: Sequence[int]):
        X = np.ascontiguousarray(X, dtype=np.float64)
        G, R, D = X.shape
        self.X = X
        self.XT = np.ascontiguousarray(X.transpose(0, 2, 1))  # (G, D, R) for the input-layer gradient
        self.n_groups = G
        self.specs = layer_specs(D, tuple(hidden_layers))
        valid = np.asarray(valid, dtype=np.int64)
        self.ragged = valid.size != G * R
        y_full = np.zeros(G * R)
        y_full[valid] = np.asarray(y, dtype=np.float64)
        mask = np.zeros(G * R)
        mask[valid] = 1.0
        self.y_full = y_full.reshape(G, R)
        self.mask = mask.reshape(G, R)
        # Flat layout, in PyMC's value_vars order: mu, log sd, z per layer.
        self.blocks: list[tuple[_Block, _Block, _Block]] = []
        start = 0
        for s in self.specs:
            mu = _Block.at(f"mu_{s.name}", start, s.shape)
            start += mu.size
            sd = _Block.at(f"sd_{s.name}_log__", start, ())
            start += 1
            z = _Block.at(f"z_{s.name}", start, (G, *s.shape))
            start += z.size
            self.blocks.append((mu, sd, z))
        self.n_dim = start
        self._const = -0.5 * _LOG_2PI * sum(mu.size + z.size for mu, _, z in self.blocks) + _HALFNORMAL_CONST * len(
            self.blocks
        )

    @classmethod
    def from_tasks(cls, tasks: Tasks, hidden_layers: Sequence[int], split: str = "train") -> NumpyFloor:
        pad = tasks.padded(split)
        return cls(pad.X, pad.y, pad.valid, hidden_layers)

    @property
    def names(self) -> list[str]:
        return [b.name for triple in self.blocks for b in triple]

    def unravel(self, theta: np.ndarray) -> dict[str, np.ndarray]:
        """The flat vector as a PyMC point dict (value-variable names)."""
        return {b.name: b.view(theta).copy() for triple in self.blocks for b in triple}

    def ravel(self, point: dict[str, np.ndarray]) -> np.ndarray:
        out = np.empty(self.n_dim)
        for triple in self.blocks:
            for b in triple:
                out[b.start : b.stop] = np.asarray(point[b.name]).ravel()
        return out

    def logp_and_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Log density (with log-Jacobian) and its gradient at the flat vector ``theta``."""
        theta = np.asarray(theta, dtype=np.float64)
        grad = np.empty_like(theta)
        # Priors and per-group weights w[g] = mu + sd * z[g].
        lp = self._const
        ws, sds = [], []
        for mu_b, sd_b, z_b in self.blocks:
            s = float(theta[sd_b.start])
            sd = math.exp(s)
            sds.append(sd)
            mu_f, z_f = theta[mu_b.start : mu_b.stop], theta[z_b.start : z_b.stop]
            lp += -0.5 * (np.dot(mu_f, mu_f) + np.dot(z_f, z_f) + sd * sd) + s
            ws.append(mu_b.view(theta) + sd * z_b.view(theta))
        # Forward pass: (G, R, H) activations; the output layer is a batched mat-vec.
        hs = [self.X]
        h = self.X
        for w in ws[:-1]:
            h = np.tanh(np.matmul(h, w))
            hs.append(h)
        w_out = ws[-1]  # (G, H)
        logit = np.matmul(h, w_out[:, :, None])[:, :, 0]  # (G, R)
        # Bernoulli-logit: y * l - softplus(l), softplus(l) = logaddexp(0, l); d/dl = y - sigmoid(l).
        ll = self.y_full * logit - np.logaddexp(0.0, logit)
        dlogit = self.y_full - (0.5 + 0.5 * np.tanh(0.5 * logit))
        if self.ragged:
            ll *= self.mask
            dlogit *= self.mask
        lp += float(ll.sum())
        # Backward pass to the per-group weights.
        gws = [None] * len(ws)
        gws[-1] = np.matmul(dlogit[:, None, :], h)[:, 0, :]  # (G, H)
        delta = dlogit[:, :, None] * w_out[:, None, :]  # d/d(h_last), (G, R, H)
        for i in range(len(ws) - 2, -1, -1):
            h_out = hs[i + 1]
            da = delta * (1.0 - h_out * h_out)  # through tanh
            h_in_T = self.XT if i == 0 else hs[i].transpose(0, 2, 1)
            gws[i] = np.matmul(h_in_T, da)
            if i > 0:
                delta = np.matmul(da, ws[i].transpose(0, 2, 1))
        # Chain rule to mu, log sd, z (plus the prior terms).
        for (mu_b, sd_b, z_b), gw, sd in zip(self.blocks, gws, sds, strict=True):
            z_f = theta[z_b.start : z_b.stop]
            gw_f = gw.ravel()
            grad[mu_b.start : mu_b.stop] = gw.sum(axis=0).ravel() - theta[mu_b.start : mu_b.stop]
            grad[sd_b.start] = sd * float(np.dot(gw_f, z_f)) - sd * sd + 1.0
            grad[z_b.start : z_b.stop] = sd * gw_f - z_f
        return lp, grad


def us_per_grad(floor: NumpyFloor, repeats: int = 7, number: int = 2000, seed: int = 0) -> float:
    """Minimum over ``repeats`` of the mean wall time (us) of ``number`` calls."""
    theta = np.random.default_rng(seed).normal(scale=0.5, size=floor.n_dim)
    floor.logp_and_grad(theta)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            floor.logp_and_grad(theta)
        best = min(best, (time.perf_counter() - start) / number)
    return best * 1e6


def default_floor() -> NumpyFloor:
    from hbnn.config_read import parse_params
    from hbnn.data.moons import make_moons_tasks
    from hbnn.data.spec import DataSpec

    params = parse_params({})
    return NumpyFloor.from_tasks(Tasks(make_moons_tasks(DataSpec.of(params))), params.model.hidden_layers)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    floor = default_floor()
    print(f"n_dim={floor.n_dim} numpy floor: {us_per_grad(floor, args.repeats, args.number):.1f} us/grad")
