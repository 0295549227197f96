"""A model's data and settings as the hand-written density needs them (:class:`Density` and one subclass per
model: hierarchical, flat, informed): the buffer nutpie passes to the density's callbacks (:meth:`Density.pack`),
nutpie's model built from it (:meth:`Density.nutpie_model`), and the check against PyMC's model of the same
data and settings before it is first sampled (:meth:`Density.checked_nutpie_model`).
"""

from __future__ import annotations

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

from hbnn.density.kernel import (
    _HALFNORMAL_CONST,
    _HEADER,
    _LOG_2PI,
    _PER_LAYER,
    FLAT,
    HIERARCHICAL,
    INFORMED,
    SOURCE,
    call,
    call_expand,
)
from hbnn.density.numerics import ROW_DTYPE
from hbnn.errors import DENSITY_OVERFLOW, SamplingError

log = logging.getLogger(__name__)


# ... so the density equals PyMC's (float64 throughout) to this share of max(1, |log density|) and its gradient to
# this share of max(1, largest gradient component): measured up to 6e-7 on tests/test_kernel.py's networks and
# points (rates up to e^20 excepted: there float32 rounding of the network's output, which exp amplifies, costs a
# Poisson gradient more). A Poisson output past 88 overflows float32 (e^88 > 3.4e38): the density is then not
# finite and the sampler treats the point as it treats any other such (float64 went on to 709).
ROW_RTOL = 1e-5


class DensityMismatch(ValueError):
    """The hand-written density is not the PyMC model's (:meth:`Density.check`); ``compiled`` is nutpie's compile
    of the PyMC model, which the sampler then samples instead."""

    def __init__(self, message: str, compiled):
        super().__init__(message)
        self.compiled = compiled


def check_dir() -> Path:
    """Where passed :meth:`Density.check` results are recorded: ``$HBNN_DENSITY_CHECKS``, else ``checked/`` beside the
    written-out kernels (:func:`hbnn.density.modules.cache_dir`). The test suite gives each of its runs its own, so
    every run checks every density it samples."""
    from hbnn.density.modules import cache_dir

    return Path(os.environ["HBNN_DENSITY_CHECKS"]) if os.environ.get("HBNN_DENSITY_CHECKS") else cache_dir() / "checked"


def unsupported(likelihood: str, activation: str) -> str | None:
    """Why the hand-written density cannot compute a model, or ``None`` where it can.

    Parameters
    ----------
    likelihood, activation : str
        The model's registered likelihood and activation (``model.likelihood``, ``model.activation``).

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
    if not missing:
        return None
    return f"{' and '.join(missing)} {'have' if len(missing) > 1 else 'has'} no compiled code for it"


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
    activation: str = "tanh"  # the hidden units' (model.activation)

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
                            features=self.features, activation=self.activation,
                            **{f: getattr(self, f) for f in self._extra_fields})

    def logp_grad(self):
        """The function that computes this density from :meth:`pack`'s buffer (:func:`logp_grad`'s signature):
        the network's passes written out (:func:`hbnn.density.written.logp_grad_for`)."""
        from hbnn.density.written import logp_grad_for

        return logp_grad_for(*self._network(), self.likelihood, self.activation)

    def callback(self, skip: int):
        """nutpie's callback (:func:`callback`) for this network, its buffer ``skip`` slots in: numba's disk-cached
        one (:func:`hbnn.density.written.callback_for`)."""
        from hbnn.density.written import callback_for

        return callback_for(*self._network(), self.likelihood, self.activation, skip)

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
        return self._extra_var("")

    def _extra_var(self, suffix: str) -> list:
        """The likelihood's extra parameter (``suffix`` ``_log__``: its value variable), where it has one."""
        from hbnn.model import likelihoods

        extra = likelihoods.get(self.likelihood).extra
        return [(f"{extra}{suffix}", (), ())] if extra else []

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
        from hbnn.sampling.nutpie_adapter import compile_numba

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
                       tuple(self.hidden_layers), bool(self.bias), self.likelihood, self.activation,
                       float(self.noise_sd),
                       getattr(self, "prior_sd", None), tuple(self.features), tuple(self.groups))).encode())
        return h.hexdigest()[:32]

    def initial_center(self) -> np.ndarray:
        """PyMC's initial point before its jitter: every value variable at its prior's support point on the
        unconstrained scale (0 for the normals and for ``log sd``, ``sd ~ HalfNormal(1)``; ``log noise_sd`` for the
        likelihood's extra parameter, ``HalfNormal(noise_sd)``)."""
        center = np.zeros(sum(math.prod(shape) for shape in self.names().values()))
        for name, _, _ in self._extra_var("_log__"):
            center[self.offsets()[name]] = math.log(self.noise_sd)
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
        from hbnn.model import likelihoods

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
        extra_at = next((offsets[name] for name, _, _ in self._extra_var("_log__")), -1)
        const += likelihoods.get(self.likelihood).density_constant(y, self.noise_sd)
        n_expanded = n_dim + sum(math.prod(shape) for _, shape, _ in self.derived())
        # slot 6 is unused (0)
        header = [0.0, len(specs), G, R, D, int(self.bias), 0, extra_at, self.noise_sd, const, n_dim, self.kind,
                  getattr(self, "prior_sd", 1.0), n_expanded, lanes]
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
    :func:`hbnn.density.modules.cache_dir` named by what decides it (the CPU and its features as numba targets them,
    numba's and llvmlite's versions, this module's source), since the probe's compile costs ~0.4 s a process."""
    import llvmlite
    import llvmlite.binding as llvm
    from numba.core import codegen, config

    from hbnn.density.modules import cache_dir

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
        return out + self._extra_var("_log__")

    def derived(self):
        specs = self.specs()
        return ([(f"sd_{s.name}", (), ()) for s in specs] + self._extra_var("")
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
        return [(s.var, s.shape, s.dims) for s in self.specs()] + self._extra_var("_log__")

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
                + self._extra_var("_log__"))

    def derived(self):
        return self._extra_var("") + [(s.var, s.shape, s.dims) for s in self.specs()]

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
