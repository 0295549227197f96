"""Numbers the report shows: the models, reference accuracies, formatting, surface grids and correlations."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from scipy.special import expit

from hbnn.config import ESS_MIN, RHAT_MAX
from hbnn.density.numerics import _exp_nonpositive
from hbnn.model import forward
from hbnn.model.network import BIAS, BIAS_SUFFIX, LayerSpec
from hbnn.pipeline.variants import VARIANTS

MODELS = tuple(v.name for v in VARIANTS)
LABELS = {v.name: v.label for v in VARIANTS}
METRICS_FILES = {v.name: f"{v.stem}.json" for v in VARIANTS}
LOSS_POINTS = 500  # rows of plots/advi_loss.csv at most

# Train / test accuracy (%) printed by the seed notebooks; None = not done there.
REFERENCES: dict[str, dict[str, tuple[float, float] | None]] = {
    "PyMC3 original": {"flat": (86.78, 83.78), "hierarchical": (91.11, 89.78), "informed": (91.56, 87.11)},
    "NumPyro port": {"flat": (86.67, 83.56), "hierarchical": (90.78, 89.33), "informed": (91.44, 86.67)},
    "BlackJAX port": {"flat": (86.56, 83.67), "hierarchical": (91.11, 89.56), "informed": None},
}
# The data those numbers came from; they are only comparable on the same data.
REFERENCE_DATA = {
    "n_groups": 18,
    "seed": 31,
    "data.n_samples": 100,
    "data.noise": 0.3,
    "data.rotation_deg": 90.0,
    "data.train_fraction": 0.5,
}
# The networks those numbers came from (the flat net's weight prior N(0, 1)), as the traces' settings record them.
REFERENCE_MODEL = {
    "model.hidden_layers": [5, 5],
    "model.bias": False,
    "model.likelihood": "bernoulli",
    "model.prior_sd": 1.0,
}
RHAT_OK, ESS_OK = RHAT_MAX, ESS_MIN  # the convergence bar the metrics judge groups by
CHUNK_VALUES = 2**21  # network outputs per chunk of a surface's draws: bounds memory (8 MB of float32)




def lookup(d: Any, *keys: str) -> Any:
    """``d[k1][k2]...``, or ``None`` where any level is missing.

    Parameters
    ----------
    d : object
        Nested dicts (a metrics file).
    *keys : str
        The path.

    Returns
    -------
    object or None
    """
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def fmt(x: Any, spec: str = ".3f") -> str:
    """``x`` formatted with ``spec`` for a table; ``"n/a"`` for ``None`` and non-finite floats.

    Parameters
    ----------
    x : object
    spec : str, optional
        A ``format`` spec.

    Returns
    -------
    str
    """
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "n/a"
    return format(x, spec)


def ess_text(x: Any) -> str:
    """A bulk ESS for a table, rounded down: a value short of the bar never reads as meeting it (399.6 is "399").

    Parameters
    ----------
    x : float or None

    Returns
    -------
    str
        ``"n/a"`` for ``None`` and non-finite values.
    """
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "n/a"
    return str(math.floor(x))


def pct(x: float | None) -> str:
    """A fraction ``x`` as a percentage with two decimals; ``"n/a"`` for ``None``.

    Parameters
    ----------
    x : float or None

    Returns
    -------
    str
    """
    return "n/a" if x is None else f"{100 * x:.2f}"


def difference(a: float | None, b: float | None) -> float | None:
    """``a - b``, or ``None`` where either is missing.

    Parameters
    ----------
    a, b : float or None

    Returns
    -------
    float or None
    """
    return None if a is None or b is None else a - b


def surface_points(limit: float, size: int, centre: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Axis values ``(size,)`` and grid points ``(size * size, feature)`` in row-major ``(x2, x1)`` order.

    The grid spans the first two features; further features are held at their ``centre`` value.

    Parameters
    ----------
    limit : float
        The grid spans ``[-limit, limit]`` on each axis.
    size : int
        Points per axis.
    centre : numpy.ndarray, optional
        One value per feature (default: two features).

    Returns
    -------
    tuple of (numpy.ndarray, numpy.ndarray)
        The axis values and the grid points.
    """
    axis = np.linspace(-limit, limit, size)
    x1, x2 = np.meshgrid(axis, axis)
    points = np.zeros((size * size, 2 if centre is None else len(centre)))
    if centre is not None:
        points[:] = centre
    points[:, 0], points[:, 1] = x1.ravel(), x2.ravel()
    return axis, points


def thin_indices(n_total: int, n_keep: int) -> np.ndarray:
    """``min(n_keep, n_total)`` evenly spaced, distinct indices into ``range(n_total)``.

    Parameters
    ----------
    n_total, n_keep : int

    Returns
    -------
    numpy.ndarray
        int64, sorted.
    """
    return np.unique(np.linspace(0, n_total - 1, min(n_keep, n_total)).round().astype(np.int64))


def surface_stats(
    weights: Sequence[np.ndarray], points: np.ndarray, activation: str,
    values: Callable[[np.ndarray], np.ndarray] = expit,
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and sd of ``values(output)`` at ``points (n, feature)``: by default ``P(y = 1)``.

    The network runs in float32 in a compiled loop over draws (:func:`hbnn.model.forward.outputs`, the log
    density's float32 tanh), faster than NumPy's float32; mean and sd differ from float64 by about 1e-7, far below
    what a plot shows. Draws are taken in chunks and only running float64 sums are kept, so memory is
    ``chunk * n`` values. With ``values`` SciPy's ``expit`` (a classifier's), the probabilities and their sums are
    one compiled pass over the outputs (:func:`_add_expit_moments`, the kernel's float32 ``exp``) instead of three
    NumPy passes (measured: benchmarks/FINDINGS.md, section 'Measurements behind code comments').

    Parameters
    ----------
    weights : sequence of numpy.ndarray
        Per-layer ``(sample, *shape)`` draws (a layer's last input row its bias where it has one more row than
        inputs).
    points : numpy.ndarray
        ``(n, feature)``.
    activation : str
        The hidden units' activation.
    values : callable, default scipy.special.expit
        Maps network outputs to the plotted quantity (the likelihood's
        :meth:`~hbnn.model.likelihoods.base.Likelihood.mean`).

    Returns
    -------
    tuple of (numpy.ndarray, numpy.ndarray)
        The mean and the sd at each point.
    """
    n_samples = weights[0].shape[0]
    chunk = max(1, CHUNK_VALUES // points.shape[0])
    s1 = np.zeros(points.shape[0])
    s2 = np.zeros(points.shape[0])
    out = np.empty((min(chunk, n_samples), points.shape[0]), dtype=np.float32)
    for lo in range(0, n_samples, chunk):
        block = [w[lo : lo + chunk] for w in weights]
        outputs = forward.outputs(points, block, np.float32, out, activation)[: block[0].shape[0]]
        if values is expit:
            _add_expit_moments(outputs, s1, s2)
        else:
            _add_moments(values(outputs), s1, s2)
    mean = s1 / n_samples
    return mean, np.sqrt(np.clip(s2 / n_samples - mean**2, 0.0, None))


# fastmath without its no-NaN and no-inf assumptions: a non-finite output or value stays non-finite in the sums, as
# NumPy's did, for the report's checks to refuse
_FINITE_UNASSUMED = {"contract", "arcp", "afn", "nsz", "reassoc"}


@numba.njit(fastmath=_FINITE_UNASSUMED, error_model="numpy", cache=True, nogil=True)
def _add_expit_moments(outputs: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> None:
    """``s1 += sum(p)`` and ``s2 += sum(p**2)`` over the draws (rows) of ``outputs (draw, point)`` (float32), with
    ``p = expit(output)`` in float32 from ``exp(-|output|)`` (the kernel's, within 3e-7 relative, so ``p`` is within
    ~2e-7), summed in float64."""
    n = outputs.shape[1]
    neg = np.empty(n, dtype=np.float32)
    e = np.empty(n, dtype=np.float32)
    bits = np.empty(n, dtype=np.int32)
    one = np.float32(1.0)
    for s in range(outputs.shape[0]):
        o = outputs[s]
        for i in range(n):
            neg[i] = -abs(o[i])
        _exp_nonpositive(neg, e, n, bits)  # exp(-|o|), held at exp(-87) below -87
        for i in range(n):
            inv = one / (one + e[i])
            p = np.float64(inv if o[i] >= 0 else e[i] * inv)
            s1[i] += p
            s2[i] += p * p


@numba.njit(fastmath=_FINITE_UNASSUMED, error_model="numpy", cache=True, nogil=True)
def _add_moments(values: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> None:
    """``s1 += sum(v)`` and ``s2 += sum(v**2)`` over the rows of ``values (draw, point)``, in float64."""
    for s in range(values.shape[0]):
        v = values[s]
        for i in range(values.shape[1]):
            x = np.float64(v[i])
            s1[i] += x
            s2[i] += x * x


def correlation_from_cov(cov: np.ndarray) -> np.ndarray:
    """Correlation matrix of a covariance matrix; NaN rows/columns where a variance is 0.

    Parameters
    ----------
    cov : numpy.ndarray
        ``(k, k)``.

    Returns
    -------
    numpy.ndarray
    """
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    denom = np.outer(sd, sd)
    corr = np.full(cov.shape, np.nan)
    np.divide(cov, denom, out=corr, where=denom > 0)
    return np.clip(corr, -1.0, 1.0)


def correlation_of_draws(draws: np.ndarray) -> np.ndarray:
    """Correlation matrix ``(k, k)`` of ``(n, k)`` draws (all NaN with fewer than 2 draws).

    Parameters
    ----------
    draws : numpy.ndarray
        ``(n, k)``.

    Returns
    -------
    numpy.ndarray
    """
    if draws.shape[0] < 2:
        return np.full((draws.shape[1], draws.shape[1]), np.nan)
    return correlation_from_cov(np.atleast_2d(np.cov(draws, rowvar=False)))


def weight_labels(spec: LayerSpec, features: Sequence[str]) -> list[str]:
    """``feature->unit`` labels of the first layer's weights in row-major (flattened) order.

    A linear model's only layer maps features to the output: ``feature->out``.

    Parameters
    ----------
    spec : hbnn.model.network.LayerSpec
        The first layer.
    features : sequence of str
        The feature names.

    Returns
    -------
    list of str
    """
    if spec.dims[0] == "feature":
        rows = list(features)
    elif spec.dims[0] == f"feature{BIAS_SUFFIX}":
        rows = [*features, BIAS]
    else:
        rows = [str(i) for i in range(spec.shape[0])]
    if len(spec.shape) == 1:
        return [f"{r}->out" for r in rows]
    return [f"{r}->{u}" for r in rows for u in range(spec.shape[1])]
