"""Informed prior: from the hierarchical posterior's (aligned, :mod:`hbnn.model.alignment`) group
distribution to one MvNormal per layer.

The prior file (``priors/informed.nc``) holds ``mean_<layer>`` and
``cov_<layer>`` per layer and a JSON ``layers`` attr with each layer's shape and
dims; :func:`prior_dataset` writes that layout and :func:`load_prior` reads and
checks it.

The derivation gives the same bytes on any x86-64 machine from the same trace and
pins (``tests/test_reproducible.py``). It therefore calls no BLAS (whose kernels,
picked by CPU, sum products in different orders and with or without FMA), sums
in an order fixed here (:func:`fixed_sum`, element-wise additions only) rather
than in whatever order a reduction's kernel picks, and draws its noise with
:func:`standard_normal`, whose bits do not depend on the C math library.
Element-wise ``+ - * /`` and ``sqrt`` are correctly rounded by IEEE 754 under
every SIMD width, so NumPy's SIMD dispatch cannot move them either.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from hbnn.files.io import InputError, check_made_with, load_dataset
from hbnn.model.network import LayerSpec

# NumPy's ziggurat tail point (``ziggurat_nor_r``): the only standard normals it computes with the C library (log1p,
# whose last bit differs between libm builds and between glibc's FMA and non-FMA code) lie beyond it.
ZIGGURAT_R = 3.6541528853610088


LN2_HI, LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # ln 2 = HI + LO, HI with 32 bits


SQRT_HALF = 0.70710678118654752440  # ieee_log reduces mantissas to [sqrt(1/2), sqrt(2)), where its series is short


# 1/3, 1/5, ..., 1/23: the series 2 atanh(s) = log((1 + s) / (1 - s)), |s| <= 0.172, to below 1e-17 relative.
_ATANH_TERMS = tuple(1.0 / k for k in range(23, 2, -2))


def fixed_sum(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """The sum of ``x`` along ``axis`` in a pairwise order fixed by the length alone.

    Each step adds the second half of the rows to the first, element by element (an odd last row goes into
    the first), so the result is made of correctly rounded additions in an order that no BLAS, SIMD width or
    reduction kernel can change; its error grows with ``log2(n)``, as NumPy's pairwise sum's does.

    Parameters
    ----------
    x : numpy.ndarray
        The values (taken as floats).
    axis : int, optional
        The axis to sum over.

    Returns
    -------
    numpy.ndarray
        The sums, with ``axis`` removed; zeros for an empty axis.
    """
    x = np.moveaxis(np.asarray(x, dtype=float), axis, 0)
    if x.shape[0] == 0:
        return np.zeros(x.shape[1:])
    while x.shape[0] > 1:
        half = x.shape[0] // 2
        head = x[:half] + x[half : 2 * half]
        if x.shape[0] % 2:
            head[0] = head[0] + x[-1]
        x = head
    return np.array(x[0], copy=True)


def fixed_mean(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """The mean along ``axis`` in :func:`fixed_sum`'s order.

    Parameters
    ----------
    x : numpy.ndarray
        The values (taken as floats).
    axis : int, optional
        The axis to average over.

    Returns
    -------
    numpy.ndarray
        :func:`fixed_sum` over the length of ``axis``.
    """
    x = np.asarray(x, dtype=float)
    return fixed_sum(x, axis) / x.shape[axis]


def ieee_log(x: np.ndarray) -> np.ndarray:
    """Natural log from ``frexp`` and ``+ - * /`` alone, with the same bits on every machine.

    ``x = m 2^e`` with ``m`` in ``[sqrt(1/2), sqrt(2))``; ``log m = 2 atanh(s)``, ``s = (m - 1) / (m + 1)``, by its
    series. Unlike ``np.log`` (NumPy's own SIMD code or the C library's, by CPU) it gives the same bits everywhere.

    Parameters
    ----------
    x : numpy.ndarray
        Positive finite values.

    Returns
    -------
    numpy.ndarray
        Their natural logs, within ~2 ulp of ``np.log``.
    """
    m, e = np.frexp(np.asarray(x, dtype=float))
    low = m < SQRT_HALF
    m = np.where(low, m + m, m)
    e = (e - low).astype(float)
    f = m - 1.0
    s = f / (m + 1.0)
    z = s * s
    series = np.zeros_like(z)
    for c in _ATANH_TERMS:
        series = series * z + c
    # log m = 2s + 2s z series, and 2s = f - s f (f = m - 1 is exact; the small s f carries the rounding)
    return e * LN2_HI + (f - s * f + ((s + s) * z * series + e * LN2_LO))


def normal_tail(n: int, rng: np.random.Generator) -> np.ndarray:
    """Draws of ``|x|`` for a standard normal ``x`` beyond :data:`ZIGGURAT_R`.

    Marsaglia's tail method, as NumPy's ziggurat draws them, with :func:`ieee_log`: ``R + a`` with
    ``a = -log(u1) / R``, kept where ``-2 log(u2) > a^2``. Uniforms are ``1 - rng.random()``, in (0, 1]; each
    round draws two per value missing.

    Parameters
    ----------
    n : int
        The number of draws.
    rng : numpy.random.Generator
        The source of the uniforms.

    Returns
    -------
    numpy.ndarray
        ``n`` values, each past :data:`ZIGGURAT_R`.
    """
    out = np.empty(n)
    filled = 0
    while filled < n:
        u = 1.0 - rng.random((2, n - filled))
        a = -ieee_log(u[0]) / ZIGGURAT_R
        b = -ieee_log(u[1])
        kept = a[b + b > a * a]
        out[filled : filled + kept.size] = ZIGGURAT_R + kept
        filled += kept.size
    return out


def standard_normal(shapes: Sequence[tuple[int, ...]], rng: np.random.Generator) -> list[np.ndarray]:
    """Standard normal arrays of ``shapes`` whose bits depend on ``rng``'s state alone, not on the C library.

    ``rng.standard_normal`` draws every array first, then each value beyond :data:`ZIGGURAT_R` (about 1 in 3,800;
    the values NumPy computes with libm's ``log1p``, which differ in their last bit between machines) is replaced, in
    order, by :func:`normal_tail` drawn from ``rng`` with its sign kept. Replacing a normal beyond a point by an
    independent draw from the normal beyond that point leaves the draws standard normal. What libm still decides:
    whether a draw in a ziggurat wedge is kept (``u < exp(-x^2 / 2)``), which a last-bit change of ``exp`` flips
    only where the two sides agree to ~16 digits.

    Parameters
    ----------
    shapes : sequence of tuple of int
        The arrays' shapes, drawn in this order.
    rng : numpy.random.Generator
        The source of the draws.

    Returns
    -------
    list of numpy.ndarray
        One standard normal array per shape.
    """
    eps = [rng.standard_normal(shape) for shape in shapes]
    for e in eps:
        flat = e.reshape(-1)
        tail = np.flatnonzero(np.abs(flat) > ZIGGURAT_R)
        if tail.size:
            flat[tail] = np.copysign(normal_tail(tail.size, rng), flat[tail])
    return eps


def new_group_draws(
    mu: Sequence[np.ndarray], sd: Sequence[np.ndarray], draws_per_sample: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Weights of unseen groups: ``w = mu + sd * eps`` for each posterior draw.

    The ``eps`` of all layers come from :func:`standard_normal`, layer by layer.

    Parameters
    ----------
    mu : sequence of numpy.ndarray
        Per layer, the group means ``(sample, *shape)``.
    sd : sequence of numpy.ndarray
        Per layer, the group sds ``(sample,)``.
    draws_per_sample : int
        New groups drawn per posterior draw.
    rng : numpy.random.Generator
        The source of ``eps``.

    Returns
    -------
    list of numpy.ndarray
        Per layer, flattened draws ``(sample * draws_per_sample, layer.size)``.
    """
    shapes = [(m.shape[0], draws_per_sample, int(np.prod(m.shape[1:], dtype=int))) for m in mu]
    out = []
    for m, s, eps in zip(mu, sd, standard_normal(shapes, rng), strict=True):
        n = m.shape[0]
        flat = m.reshape(n, 1, -1)
        out.append((flat + s.reshape(n, 1, 1) * eps).reshape(n * draws_per_sample, -1))
    return out


def fit_mvnormal(samples: np.ndarray, jitter: float) -> tuple[np.ndarray, np.ndarray]:
    """Sample mean and covariance of draws, the same on every machine.

    No BLAS: the covariance's entry ``(i, j)``, ``i <= j``, is the :func:`fixed_sum` of the centred columns'
    element-wise products over ``n - 1``, mirrored below the diagonal.

    Parameters
    ----------
    samples : numpy.ndarray
        The draws, ``(n, k)``.
    jitter : float
        Added to the covariance's diagonal.

    Returns
    -------
    tuple of numpy.ndarray
        The mean ``(k,)`` and the covariance ``(k, k)`` (``n - 1`` divisor, as ``np.cov``; plus ``jitter * I``).
    """
    samples = np.asarray(samples, dtype=float)
    n, k = samples.shape
    mean = fixed_mean(samples)
    centred = samples - mean
    cov = np.empty((k, k))
    for i in range(k):
        row = fixed_sum(centred[:, i : i + 1] * centred[:, i:]) / (n - 1)
        cov[i, i:] = row
        cov[i:, i] = row
    cov[np.diag_indices(k)] += jitter
    return mean, cov


def layer_arrays(posterior, specs: Sequence[LayerSpec], prefix: str) -> list[np.ndarray]:
    """Per-layer arrays of a posterior's ``<prefix>_<layer>`` variables.

    Parameters
    ----------
    posterior : xarray.Dataset
        The draws.
    specs : sequence of hbnn.model.network.LayerSpec
        The network's layers.
    prefix : str
        The variables' prefix (``mu``, ``w``, ...).

    Returns
    -------
    list of numpy.ndarray
        Per layer, ``(chain, draw, *shape)``.
    """
    return [posterior[f"{prefix}_{s.name}"].transpose("chain", "draw", *s.dims).values for s in specs]


def prior_dataset(specs: Sequence[LayerSpec], layers: Sequence[tuple[np.ndarray, np.ndarray]]) -> xr.Dataset:
    """The prior file's layout.

    Parameters
    ----------
    specs : sequence of hbnn.model.network.LayerSpec
        The network's layers.
    layers : sequence of tuple of numpy.ndarray
        Per layer, ``(mean, cov)`` of its flattened weights.

    Returns
    -------
    xarray.Dataset
        ``mean_<layer>``, ``cov_<layer>`` and the ``layers`` attr (each layer's shape and dims, as JSON).
    """
    data_vars, meta = {}, {}
    for s, (mean, cov) in zip(specs, layers, strict=True):
        data_vars[f"mean_{s.name}"] = (f"weight_{s.name}", mean)
        data_vars[f"cov_{s.name}"] = ((f"weight_{s.name}", f"weight_{s.name}_col"), cov)
        meta[s.name] = {"shape": list(s.shape), "dims": list(s.dims)}
    ds = xr.Dataset(data_vars)
    ds.attrs["layers"] = json.dumps(meta)
    return ds


def load_prior(path: Path, specs, stage: str = "derive_prior", check_attrs=None
               ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read and check an informed prior file (``priors/informed.nc``), opened once.

    Whether the file was made with the run's params is the stage's check, which holds the params
    (:func:`hbnn.fitting.prior.load_checked`); this one takes only the layers they give.

    Parameters
    ----------
    path : pathlib.Path
        The prior file.
    specs : sequence of hbnn.model.network.LayerSpec
        The layers the model needs; the file's must match.
    stage : str, optional
        The stage that writes it: ``derive_prior``, or ``transfer_prior`` for the transfer experiment's.
    check_attrs : callable, optional
        Called with the file's attrs before its layers are read; it raises where they are not what the caller needs.

    Returns
    -------
    dict of str to tuple of numpy.ndarray
        Per layer name, ``(mean, cov)``.

    Raises
    ------
    hbnn.errors.InputError
        If the file is missing or unreadable, was made by another stage, fails ``check_attrs``, or its layers do not
        match ``specs``.
    """
    ds = load_dataset(path, "prior file")
    check_made_with(ds.attrs, None, path, stage)
    if check_attrs is not None:
        check_attrs(ds.attrs)
    return prior_layers(ds, specs, f"prior file {path}")


def prior_layers(ds: xr.Dataset, specs, where: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The layers of an informed prior (:func:`prior_dataset`'s layout), checked against the model's.

    Parameters
    ----------
    ds : xarray.Dataset
        The prior.
    specs : sequence of hbnn.model.network.LayerSpec
        The layers the model needs; the prior's must match.
    where : str
        The prior's name in error messages.

    Returns
    -------
    dict of str to tuple of numpy.ndarray
        Per layer name, ``(mean, cov)``.

    Raises
    ------
    hbnn.errors.InputError
        If it has no valid ``layers`` attr or its layers do not match ``specs``.
    """
    try:
        layers = json.loads(ds.attrs["layers"])
        found = {name: meta["shape"] for name, meta in layers.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise InputError(f"{where} has no valid 'layers' attribute; it was not written by derive_prior") from err
    expected = {s.name: list(s.shape) for s in specs}
    if found != expected:
        raise InputError(f"{where} has layer shapes {found} but the model needs {expected}")
    out = {}
    for s in specs:
        try:
            mean, cov = ds[f"mean_{s.name}"].values, ds[f"cov_{s.name}"].values
        except KeyError as err:
            raise InputError(f"{where} lacks the variable {err}") from None
        if mean.shape != (s.size,) or cov.shape != (s.size, s.size):
            raise InputError(f"{where}: layer {s.name} has mean {mean.shape} / cov {cov.shape}, "
                             f"expected ({s.size},) / ({s.size}, {s.size})")
        out[s.name] = (mean, cov)
    return out
