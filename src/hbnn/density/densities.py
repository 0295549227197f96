"""A model's data and settings as the hand-written density needs them (:class:`Density` and one subclass per
model: hierarchical, flat, informed): the buffer nutpie passes to the density's callbacks (:meth:`Density.pack`),
nutpie's model built from it (:meth:`Density.nutpie_model`), and the check against PyMC's model of the same
data and settings before it is first sampled (:meth:`Density.checked_nutpie_model`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import KW_ONLY, dataclass
from typing import ClassVar

import numpy as np

from hbnn.density import buffer, pymc_check
from hbnn.density.kernel import _HALFNORMAL_CONST, _LOG_2PI, FLAT, HIERARCHICAL, INFORMED
from hbnn.density.pymc_check import ROW_RTOL


def unsupported(likelihood: str, activation: str, noise: str = "shared") -> str | None:
    """Why the hand-written density cannot compute a model, or ``None`` where it can.

    Parameters
    ----------
    likelihood, activation : str
        The model's registered likelihood and activation (``model.likelihood``, ``model.activation``).
    noise : str, optional
        The hierarchical model's ``model.noise``: the density computes one shared noise sd, not one per ``group``.

    Returns
    -------
    str or None
        A phrase naming what has no compiled code (the likelihood's
        :attr:`~hbnn.model.likelihoods.base.Likelihood.density_source`, the activation's
        :attr:`~hbnn.model.activations.base.Activation.compiled_source`); such a model is sampled with PyMC's
        compiled density.
    """
    from hbnn.model import activations, likelihoods

    missing = []
    if likelihoods.get(likelihood).density_source is None:
        missing.append(f"the likelihood {likelihood!r}")
    if activations.get(activation).compiled_source is None:
        missing.append(f"the activation {activation!r}")
    if noise != "shared":
        missing.append(f"per-group noise (model.noise: {noise})")
    if not missing:
        return None
    return f"{' and '.join(missing)} {'have' if len(missing) > 1 else 'has'} no compiled code for it"


def _initial_point(center: np.ndarray, seed: int) -> np.ndarray:
    """A chain's first point: ``center`` plus PyMC's ``U(-1, 1)`` jitter on every entry, from ``seed``."""
    return center + np.random.default_rng(seed).uniform(-1.0, 1.0, center.size)


@dataclass(frozen=True)
class Density:
    """A model's data and settings, as the hand-written log density needs them.

    Subclasses (:class:`HierarchicalDensity`, :class:`FlatDensity`, :class:`InformedDensity`) say how the weights
    come from the sampler's flat vector; this class is not sampled itself.

    Parameters
    ----------
    X_padded : numpy.ndarray
        ``(group, row, feature)``, each group's ``counts[g]`` real rows first
        (:meth:`hbnn.data.tasks.Tasks.padded`).
    y : numpy.ndarray
        The labels of the real rows, in group order.
    counts : numpy.ndarray
        Each group's number of real rows.
    hidden_layers : tuple of int
        The hidden layers' widths.
    bias : bool
        Whether every layer has a bias row.
    likelihood : str
        The registered likelihood (:mod:`hbnn.model.likelihoods`).
    noise_sd : float
        The scale of the likelihood's extra parameter's prior, ``HalfNormal(noise_sd)``, where it has one.
    features : tuple of str, optional
        The feature names, the trace's coordinates (``x1, x2, ...`` where not given).
    groups : tuple of str, optional
        The hierarchical model's group names (``g00, g01, ...`` where not given).
    activation : str, default "tanh"
        The hidden units' registered activation (:mod:`hbnn.model.activations`).
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
    activation: str = "tanh"  # the hidden units' (model.activation)

    kind: ClassVar[int] = -1
    _extra_fields: ClassVar[tuple[str, ...]] = ()  # the subclass's own fields, kept by with_rows

    @classmethod
    def on_rows(cls, x: np.ndarray, y: np.ndarray, hidden_layers, bias: bool, likelihood: str, noise_sd: float,
                **extra) -> Density:
        """A per-group model's density on one group's rows.

        Parameters
        ----------
        x : numpy.ndarray
            ``(row, feature)``.
        y : numpy.ndarray
            The rows' labels.
        hidden_layers, bias, likelihood, noise_sd
            As for :class:`Density`.
        **extra
            The keyword fields (``features``, ``activation``, a subclass's ``prior_sd`` or ``prior``).

        Returns
        -------
        hbnn.density.densities.Density
            An instance of ``cls`` with one group.
        """
        x = np.asarray(x, dtype=np.float64)
        return cls(x[None], np.asarray(y, dtype=np.float64), np.array([x.shape[0]]), tuple(hidden_layers), bias,
                   likelihood, noise_sd, **extra)

    def with_rows(self, x: np.ndarray, y: np.ndarray) -> Density:
        """The same model on other rows.

        Parameters
        ----------
        x : numpy.ndarray
            ``(row, feature)``: one group's rows.
        y : numpy.ndarray
            Their labels.

        Returns
        -------
        hbnn.density.densities.Density
            This density's class and settings, with one group of these rows.
        """
        return self.on_rows(x, y, self.hidden_layers, self.bias, self.likelihood, self.noise_sd,
                            features=self.features, activation=self.activation,
                            **{f: getattr(self, f) for f in self._extra_fields})

    def logp_grad(self):
        """The compiled function that computes this density from :meth:`pack`'s buffer.

        Returns
        -------
        numba.core.registry.CPUDispatcher
            With :func:`hbnn.density.kernel.logp_grad`'s signature: the network's passes written out
            (:func:`hbnn.density.written.logp_grad_for`).
        """
        from hbnn.density.written import logp_grad_for

        return logp_grad_for(*self._network(), self.likelihood, self.activation)

    def callback(self, skip: int):
        """nutpie's logp callback for this network, from numba's disk cache (:func:`hbnn.density.written.callback_for`).

        Parameters
        ----------
        skip : int
            How many float64 slots into nutpie's ``user_data`` the :meth:`pack` buffer starts.

        Returns
        -------
        numba.core.ccallback.CFunc
            The callback, as :func:`hbnn.density.callbacks.callback` describes it.
        """
        from hbnn.density.written import callback_for

        return callback_for(*self._network(), self.likelihood, self.activation, skip)

    def _network(self) -> tuple[int, tuple[int, ...], bool]:
        """``(features, hidden widths, bias)``: what :mod:`hbnn.density.written` writes out and caches for."""
        return int(self.X_padded.shape[2]), tuple(int(h) for h in self.hidden_layers), bool(self.bias)

    @functools.cached_property
    def specs(self) -> tuple:
        """The network's layers, as :func:`hbnn.model.network.layer_specs` lays them out for these features: computed
        once per density (a tuple of :class:`hbnn.model.network.LayerSpec`)."""
        from hbnn.model.network import layer_specs

        return tuple(layer_specs(self.X_padded.shape[2], self.hidden_layers, self.bias))

    def names(self) -> dict[str, tuple[int, ...]]:
        """The model's value variables, in order, with their shapes.

        Returns
        -------
        dict of str to tuple of int
        """
        return {name: shape for name, shape, _ in self.variables()}

    def variables(self) -> list[tuple[str, tuple[int, ...], tuple[str, ...]]]:
        """The model's value variables in PyMC's order (the flat vector's).

        Returns
        -------
        list of tuple
            ``(name, shape, dims)`` for each.
        """
        raise NotImplementedError

    def derived(self) -> list[tuple[str, tuple[int, ...], tuple[str, ...]]]:
        """What nutpie's expanded draw holds after the value variables (:func:`hbnn.density.callbacks.expand`).

        Returns
        -------
        list of tuple
            ``(name, shape, dims)`` of the log-transformed variables on their own scale, then of the weights that
            are not value variables.
        """
        return self._extra_var("")

    def _extra_var(self, suffix: str) -> list:
        """The likelihood's extra parameter (``suffix`` ``_log__``: its value variable), where it has one."""
        from hbnn.model import likelihoods

        extra = likelihoods.get(self.likelihood).extra
        return [(f"{extra}{suffix}", (), ())] if extra else []

    def offsets(self) -> dict[str, int]:
        """Where each value variable starts in the flat vector.

        Returns
        -------
        dict of str to int
        """
        out, at = {}, 0
        for name, shape in self.names().items():
            out[name] = at
            at += math.prod(shape)
        return out

    def coords(self) -> dict[str, list]:
        """The coordinates of the trace's dims.

        Returns
        -------
        dict of str to list
            Each dim's coordinates (:func:`hbnn.model.network.layer_coords`).
        """
        from hbnn.model.network import layer_coords

        D = self.X_padded.shape[2]
        features = list(self.features) or [f"x{i + 1}" for i in range(D)]
        groups = None
        if self.kind == HIERARCHICAL:
            groups = list(self.groups) or [f"g{g:02d}" for g in range(self.X_padded.shape[0])]
        return layer_coords(features, self.hidden_layers, groups, self.bias)

    def nutpie_model(self):
        """nutpie's model of this density, built without PyTensor.

        The log density is :meth:`callback`'s, the expanded draws :func:`hbnn.density.callbacks.expand`'s, the data
        :meth:`pack`'s buffer (``user_data``), and each chain starts as PyMC would start it (:meth:`initial_center`
        plus PyMC's ``U(-1, 1)`` jitter). :meth:`check` compares it with PyMC's model.

        Returns
        -------
        nutpie.compile_pymc.CompiledPyMCModel
            Built through :func:`hbnn.sampling.nutpie_adapter.compiled_model`.
        """
        import pandas as pd

        from hbnn.density.written import expand_callback
        from hbnn.sampling.nutpie_adapter import compiled_model

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
        return compiled_model(
            dims={name: dims for name, _, dims in expanded if dims}, _n_dim=n_dim, _coords=coords,
            _shapes={name: tuple(int(d) for d in shape) for name, shape in zip(names, shapes, strict=True)},
            compiled_logp_func=self.callback(0), compiled_expand_func=expand_callback(),
            initial_point_func=functools.partial(_initial_point, self.initial_center()), shared_data={},
            user_data=self.pack(self.offsets()), n_expanded=at, shape_info=(names, slices, shapes), logp_func=None,
            expand_func=None)

    def checked_nutpie_model(self, build):
        """:meth:`nutpie_model`, checked against PyMC's model once per code version and model.

        Parameters
        ----------
        build : callable
            Returns PyMC's model of the same data and settings.

        Returns
        -------
        nutpie.compile_pymc.CompiledPyMCModel
            As :func:`hbnn.density.pymc_check.checked_nutpie_model` returns it.

        Raises
        ------
        hbnn.density.pymc_check.DensityMismatch
            Where the density is not PyMC's.
        """
        return pymc_check.checked_nutpie_model(self, build)

    def check_key(self) -> str:
        """What a check of this density depends on, hashed (:func:`hbnn.density.pymc_check.check_key`).

        Returns
        -------
        str
        """
        return pymc_check.check_key(self)

    def initial_center(self) -> np.ndarray:
        """PyMC's initial point before its jitter.

        Returns
        -------
        numpy.ndarray
            Every value variable at its prior's support point on the unconstrained scale: 0 for the normals and
            for ``log sd`` (``sd ~ HalfNormal(1)``), ``log noise_sd`` for the likelihood's extra parameter
            (``HalfNormal(noise_sd)``).
        """
        center = np.zeros(sum(math.prod(shape) for shape in self.names().values()))
        for name, _, _ in self._extra_var("_log__"):
            center[self.offsets()[name]] = math.log(self.noise_sd)
        return center

    def check(self, compiled, rtol: float = ROW_RTOL, expand_rtol: float = 1e-9):
        """This density's nutpie model, once it is known to be ``compiled`` (:func:`hbnn.density.pymc_check.check`).

        Parameters
        ----------
        compiled : nutpie.compile_pymc.CompiledPyMCModel
            nutpie's compile of PyMC's model of the same data and settings.
        rtol : float, default :data:`hbnn.density.pymc_check.ROW_RTOL`
            Relative tolerance on the log density and its gradient.
        expand_rtol : float, default 1e-9
            Relative and absolute tolerance on the expanded draw.

        Returns
        -------
        nutpie.compile_pymc.CompiledPyMCModel
            :meth:`nutpie_model`.

        Raises
        ------
        hbnn.density.pymc_check.DensityMismatch
            Where the two models differ.
        hbnn.errors.SamplingError
            Where PyMC's own log density is not finite near the initial point.
        """
        return pymc_check.check(self, compiled, rtol, expand_rtol)

    def _layers(self, offsets: dict[str, int], at: int) -> tuple[list[float], list[np.ndarray], float]:
        """Per layer the three kind-specific slots, extra arrays to append at ``at``, and the prior's constant."""
        raise NotImplementedError

    def pack(self, offsets: dict[str, int]) -> np.ndarray:
        """The buffer the compiled density reads (:func:`hbnn.density.buffer.pack`).

        Parameters
        ----------
        offsets : dict of str to int
            Each value variable's start in the flat vector (:meth:`offsets`).

        Returns
        -------
        numpy.ndarray
            float64.
        """
        return buffer.pack(self, offsets)


@dataclass(frozen=True)
class HierarchicalDensity(Density):
    """The density of :func:`hbnn.model.builders.build_hierarchical_model` (same data and settings).

    Fields as :class:`Density`'s; ``w[g] = mu + sd * z[g]`` per layer.
    """

    kind = HIERARCHICAL

    def variables(self):
        out = []
        for s in self.specs:
            out += [(f"mu_{s.name}", s.shape, s.dims), (f"sd_{s.name}_log__", (), ()),
                    (f"z_{s.name}", (self.X_padded.shape[0], *s.shape), ("group", *s.dims))]
        return out + self._extra_var("_log__")

    def derived(self):
        specs = self.specs
        return ([(f"sd_{s.name}", (), ()) for s in specs] + self._extra_var("")
                + [(s.var, (self.X_padded.shape[0], *s.shape), ("group", *s.dims)) for s in specs])

    def _layers(self, offsets, at):
        specs = self.specs
        slots = [[offsets[f"mu_{s.name}"], offsets[f"sd_{s.name}_log__"], offsets[f"z_{s.name}"]] for s in specs]
        n_normal = sum((self.X_padded.shape[0] + 1) * s.size for s in specs)
        return slots, [], -0.5 * _LOG_2PI * n_normal + _HALFNORMAL_CONST * len(specs)


@dataclass(frozen=True)
class FlatDensity(Density):
    """The density of :func:`hbnn.model.builders.build_flat_model`.

    Fields as :class:`Density`'s, with one group (``X_padded`` is ``(1, row, feature)``), and

    Parameters
    ----------
    prior_sd : float, default 1.0
        The weights' prior, ``Normal(0, prior_sd)``.
    """

    prior_sd: float = 1.0
    kind = FLAT
    _extra_fields = ("prior_sd",)

    def variables(self):
        return [(s.var, s.shape, s.dims) for s in self.specs] + self._extra_var("_log__")

    def _layers(self, offsets, at):
        specs = self.specs
        n_w = sum(s.size for s in specs)
        return ([[offsets[s.var], -1, -1] for s in specs], [],
                n_w * (-0.5 * _LOG_2PI - math.log(self.prior_sd)))


@dataclass(frozen=True)
class InformedDensity(Density):
    """The density of :func:`hbnn.model.builders.build_informed_model`.

    Fields as :class:`Density`'s, with one group, and

    Parameters
    ----------
    prior : dict
        ``prior[layer] = (mean, cov)`` of the flattened layer's weights; ``w = mean + chol(cov) @ z``.
    """

    prior: dict = None

    kind = INFORMED
    _extra_fields = ("prior",)

    def variables(self):
        return ([(f"z_{s.name}", (s.size,), (f"weight_{s.name}",)) for s in self.specs]
                + self._extra_var("_log__"))

    def derived(self):
        return self._extra_var("") + [(s.var, s.shape, s.dims) for s in self.specs]

    def coords(self):
        return {**super().coords(), **{f"weight_{s.name}": list(range(s.size)) for s in self.specs}}

    def _layers(self, offsets, at):
        slots, extra = [], []
        for s in self.specs:
            mean, cov = self.prior[s.name]
            chol = np.linalg.cholesky(np.asarray(cov, dtype=np.float64))  # as build_informed_model factors it
            slots.append([offsets[f"z_{s.name}"], at, at + s.size])
            extra += [np.asarray(mean, dtype=np.float64).ravel(), chol.ravel()]
            at += s.size + s.size * s.size
        n_w = sum(s.size for s in self.specs)
        return slots, extra, -0.5 * _LOG_2PI * n_w
