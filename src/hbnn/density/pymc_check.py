"""The check of a hand-written density against PyMC's model of the same data and settings.

:func:`check` compares the two models' variables, dims, coordinates, log densities, gradients and expanded draws;
:func:`checked_nutpie_model` runs it once per code version and model (:func:`check_key`) and records each check
passed in :func:`check_dir`. :class:`hbnn.density.densities.Density` calls these through its methods of the same
names. :func:`call` and :func:`call_expand` call a model's callbacks as nutpie calls them.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from pathlib import Path

import numpy as np

from hbnn.density.kernel import SOURCE
from hbnn.errors import DENSITY_OVERFLOW, SamplingError

log = logging.getLogger(__name__)


# The passes over rows run in float32 (hbnn.density.numerics.ROW_DTYPE), so the density equals PyMC's (float64
# throughout) to this share of max(1, |log density|) and its gradient to this share of max(1, largest gradient
# component), with a margin over the largest difference on tests/test_kernel.py's networks and points
# (measured: benchmarks/FINDINGS.md, section 'Measurements behind code comments'); rates up to e^20 excepted:
# there float32 rounding of the network's output, which exp amplifies, costs a Poisson gradient more.
# A Poisson output past 88 overflows float32 (e^88 > 3.4e38): the density is then not finite and the sampler
# treats the point as it treats any other such (float64 goes on to 709).
ROW_RTOL = 1e-5


class DensityMismatch(ValueError):
    """The hand-written density is not the PyMC model's (:func:`check`).

    Parameters
    ----------
    message : str
        What differs.
    compiled : nutpie.compile_pymc.CompiledPyMCModel
        nutpie's compile of the PyMC model, which the sampler then samples instead (kept as ``compiled``).
    """

    def __init__(self, message: str, compiled):
        super().__init__(message)
        self.compiled = compiled


def check_dir() -> Path:
    """Where passed checks (:func:`checked_nutpie_model`) are recorded.

    Returns
    -------
    pathlib.Path
        ``$HBNN_DENSITY_CHECKS``, else ``checked/`` beside the written-out kernels
        (:func:`hbnn.density.modules.cache_dir`). The test suite gives each of its runs its own, so every run
        checks every density it samples.
    """
    from hbnn.density.modules import cache_dir

    return Path(os.environ["HBNN_DENSITY_CHECKS"]) if os.environ.get("HBNN_DENSITY_CHECKS") else cache_dir() / "checked"


def checked_nutpie_model(density, build):
    """The density's nutpie model, checked against PyMC's the first time this code meets this model.

    The check (:func:`check`, against nutpie's compile of ``build()``) runs the first time this code and these pins
    meet this network, likelihood, settings and data shapes: a file in :func:`check_dir`, named by
    :func:`check_key`, records each check passed, so later fits of the same model neither import PyMC nor compile
    PyTensor's graphs, the larger part of a fit's start-up (measured: benchmarks/FINDINGS.md, section
    'Measurements behind code comments').

    Parameters
    ----------
    density : hbnn.density.densities.Density
        The hand-written density.
    build : callable
        Returns PyMC's model of the same data and settings (called only where the check runs).

    Returns
    -------
    nutpie.compile_pymc.CompiledPyMCModel
        :meth:`hbnn.density.densities.Density.nutpie_model`.

    Raises
    ------
    DensityMismatch
        Where the check fails.
    hbnn.errors.SamplingError
        Where PyMC's own log density is not finite near the initial point.
    """
    key = density.check_key()
    stamp = check_dir() / key
    if stamp.exists():
        log.debug("kernel: %s was checked against PyMC's model before (%s)", type(density).__name__, key)
        return density.nutpie_model()
    from hbnn.sampling.nutpie_adapter import compile_numba

    log.info("kernel: checking the hand-written %s against PyMC's model (once per network, likelihood, "
             "settings, data shapes and code version)", type(density).__name__)
    checked = density.check(compile_numba(build()))
    if density.check_key() != key:  # the code changed on disk while it was checked: do not vouch for the new one
        return checked
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
    except OSError as err:  # a read-only cache: the check runs again next time, nothing else changes
        log.warning("kernel: cannot record the check in %s (%s)", stamp, err)
    return checked


def check_key(density) -> str:
    """What a :func:`check` depends on, hashed.

    Parameters
    ----------
    density : hbnn.density.densities.Density
        The hand-written density.

    Returns
    -------
    str
        32 hex digits of a SHA-256 over every source file of ``hbnn`` (the density, the PyMC models, the stages'
        builders, the data layout, nutpie's compile), the pins of PyMC, PyTensor, nutpie, numba and NumPy, and the
        model's kind, network, likelihood, settings, data shapes and coordinates (not the data's values, nor an
        informed prior's: the same code computes every value).
    """
    from importlib import metadata

    h = hashlib.sha256(SOURCE.encode())  # hbnn.density.kernel as imported
    package = Path(__file__).parents[1]  # all of hbnn, not only this subpackage
    for path in sorted(package.rglob("*.py")):
        h.update(path.relative_to(package).as_posix().encode() + path.read_bytes())
    for package in ("pymc", "pytensor", "nutpie", "numba", "numpy"):
        h.update(f"{package}=={metadata.version(package)}".encode())
    h.update(repr((type(density).__name__, density.X_padded.shape, tuple(int(c) for c in density.counts),
                   tuple(density.hidden_layers), bool(density.bias), density.likelihood, density.activation,
                   float(density.noise_sd),
                   getattr(density, "prior_sd", None), tuple(density.features), tuple(density.groups))).encode())
    return h.hexdigest()[:32]


def check(density, compiled, rtol: float = ROW_RTOL, expand_rtol: float = 1e-9):
    """The density's nutpie model, once it is known to compute the same model as ``compiled``.

    Checked: the same value variables at the same places, the same expanded variables, dims and coordinates, and,
    at two points, the same log density and gradient (through the callback as nutpie calls it; to ``rtol``, as the
    passes over rows run in float32) and the same expanded draw (float64 throughout, to ``expand_rtol``).

    Parameters
    ----------
    density : hbnn.density.densities.Density
        The hand-written density.
    compiled : nutpie.compile_pymc.CompiledPyMCModel
        nutpie's compile of the PyMC model of the same data and settings.
    rtol : float, default :data:`ROW_RTOL`
        Relative tolerance on the log density and its gradient.
    expand_rtol : float, default 1e-9
        Relative and absolute tolerance on the expanded draw.

    Returns
    -------
    nutpie.compile_pymc.CompiledPyMCModel
        :meth:`hbnn.density.densities.Density.nutpie_model`.

    Raises
    ------
    DensityMismatch
        Where anything checked differs.
    hbnn.errors.SamplingError
        Where PyMC's own log density or gradient is not finite at a checked point: no sampler could start.
    """
    names, slices, shapes = compiled.shape_info
    layout = {n: (int(sl.start), tuple(int(d) for d in shape))
              for n, sl, shape in zip(names, slices, shapes, strict=True) if sl.stop <= compiled.n_dim}
    offsets = density.offsets()
    want = {n: (offsets[n], shape) for n, shape in density.names().items()}
    if layout != want:
        raise DensityMismatch(f"not the model this log density computes: value variables {layout}, expected "
                              f"{want}", compiled)
    ours = density.nutpie_model()
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


def call(compiled, theta: np.ndarray) -> tuple[float, np.ndarray]:
    """The log density and gradient at ``theta`` through ``compiled``'s logp callback, called as nutpie calls it.

    Parameters
    ----------
    compiled : nutpie.compile_pymc.CompiledPyMCModel
        Either the hand-written density's model or nutpie's compile of PyMC's.
    theta : numpy.ndarray
        The sampler's flat vector.

    Returns
    -------
    tuple of (float, numpy.ndarray)
        The value and the gradient (not finite where the callback reports so).

    Raises
    ------
    ValueError
        Where the callback refuses the vector.
    """
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    grad, value = np.empty(theta.size), np.empty(1)
    pointers = [a.ctypes.data_as(ctypes.POINTER(ctypes.c_double)) for a in (theta, grad, value)]
    status = compiled.compiled_logp_func.ctypes(theta.size, *pointers, compiled.user_data.ctypes.data)
    if status not in (0, 3, 4):
        raise ValueError(f"the logp callback refused a vector of {theta.size}: status {status}")
    return float(value[0]), grad


def call_expand(compiled, theta: np.ndarray) -> np.ndarray:
    """The expanded draw at ``theta`` through ``compiled``'s expand callback, called as nutpie calls it.

    Parameters
    ----------
    compiled : nutpie.compile_pymc.CompiledPyMCModel
        Either the hand-written density's model or nutpie's compile of PyMC's.
    theta : numpy.ndarray
        The sampler's flat vector.

    Returns
    -------
    numpy.ndarray
        ``compiled.n_expanded`` values.

    Raises
    ------
    ValueError
        Where the callback refuses the vector.
    """
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    out = np.empty(compiled.n_expanded)
    pointers = [a.ctypes.data_as(ctypes.POINTER(ctypes.c_double)) for a in (theta, out)]
    status = compiled.compiled_expand_func.ctypes(theta.size, out.size, *pointers, compiled.user_data.ctypes.data)
    if status != 0:
        raise ValueError(f"the expand callback refused a vector of {theta.size}: status {status}")
    return out
