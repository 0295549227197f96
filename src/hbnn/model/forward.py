"""The network's forward pass over many posterior draws, compiled: what scoring and the report's surfaces run.

:func:`outputs` gives the network's output for every draw at every row, as
:func:`hbnn.model.network.mlp_logit` does in NumPy, but in one compiled loop: rows go through the whole
network in blocks of :data:`BLOCK` that stay in the L1 cache, every inner loop runs over a block's
rows (so it vectorises), and the activation is the activation's own compiled code
(:attr:`hbnn.model.activations.base.Activation.compiled_source`; tanh's has no library call). NumPy's version
spends most of its time in a scalar library ``tanh`` and in temporaries the size of a whole layer, so the fit
stages score their draws several times faster this way (benchmarks/FINDINGS.md, "Writing, scoring and the report's
imports").

* ``float64`` (scores, metrics, the traces' predictions): tanh within 2.3e-16 absolute, sums
  contracted into fused multiply-adds; outputs agree with NumPy's to ~1e-15 relative (tested),
  far below the 6 decimals the metrics keep.
* ``float32`` (the report's surfaces, 10^4 grid points x 500 draws a group): the log density's
  float32 tanh (within 3.5e-7), outputs within ~1e-6 of float64.

The loop is compiled once per activation, in a module :func:`module_source` writes and
:func:`hbnn.density.modules.load` loads from numba's disk cache. An activation without compiled code is computed
by :func:`hbnn.model.network.mlp_logit` in NumPy.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hbnn.model import activations

SOURCE = Path(__file__).read_text()  # as imported: the compiled modules are written from this text

BLOCK = 512  # rows per pass through the network: 2 x width x 512 values stay in the L1 cache

_DECORATOR = '@numba.njit(fastmath=True, error_model="numpy", cache=True, nogil=True)'

# the activation of a float32 or float64 block, picked by its dtype when the loop is compiled
_BLOCK_DISPATCH = '''\
def _activation_block(a, n, e, bits):
    pass


@overload(_activation_block, inline="always")
def _activation_block_by_dtype(a, n, e, bits):
    if a.dtype == types.float32:
        return lambda a, n, e, bits: _activation_inplace(a, n)
    return lambda a, n, e, bits: _activation_inplace64(a, n, e, bits)
'''


def _activation_block(a, n, e, bits):
    """``a[:n] = f(a[:n])`` for a float32 or float64 block: in each compiled module, the activation's
    ``_activation_inplace`` or ``_activation_inplace64`` (:data:`_BLOCK_DISPATCH`)."""
    raise NotImplementedError("compiled only in the modules module_source writes")


def _outputs(columns, flat, layout, out, h, e, bits):
    """``out[s, i]``: the network's output for draw ``s`` (``flat[s]``: its layers' weights, row-major, one after
    another) at row ``i`` (``columns``: ``(feature, row)``). ``layout`` holds each layer's inputs, outputs, offset
    in ``flat[s]`` and whether its last input row is a bias; ``h`` ``(2, width, BLOCK)``, ``e`` and ``bits``
    (``BLOCK`` of int32 for float32, int64 for float64) are scratch, all in ``out``'s dtype (a float32 activation
    uses neither ``e`` nor ``bits``). Compiled only in the modules :func:`module_source` writes."""
    n = columns.shape[1]
    last = layout.shape[0] - 1
    zero = out.dtype.type(0.0)
    for lo in range(0, n, BLOCK):
        m = min(BLOCK, n - lo)
        for s in range(flat.shape[0]):
            w = flat[s]
            for layer in range(last + 1):
                n_in, n_out, at, bias = layout[layer, 0], layout[layer, 1], layout[layer, 2], layout[layer, 3]
                dst = h[layer % 2]
                for j in range(n_out):
                    acc = dst[j]
                    b = w[at + n_in * n_out + j] if bias else zero
                    for i in range(m):
                        acc[i] = b
                    for k in range(n_in):
                        wk = w[at + k * n_out + j]
                        x = columns[k, lo:lo + m] if layer == 0 else h[(layer - 1) % 2, k]
                        for i in range(m):
                            acc[i] += wk * x[i]
                    if layer < last:
                        _activation_block(acc, m, e, bits)
            out[s, lo:lo + m] = h[last % 2, 0, :m]



def module_source(activation: str) -> str:
    """The module that compiles :func:`_outputs` for one activation.

    Parameters
    ----------
    activation : str
        A registered activation with compiled code.

    Returns
    -------
    str
        Python source: the activation's compiled text, the dispatch on the block's dtype and :func:`_outputs` (from
        this module's text as imported), headed by a hash of this module's and :mod:`hbnn.density.numerics`'
        sources, whose functions it compiles in.
    """
    from hbnn.density import modules, numerics

    act = activations.get(activation)
    sources = SOURCE + Path(numerics.__file__).read_text()
    return "\n".join([
        f'"""hbnn.model.forward for activation {act.name}: written by hbnn.model.forward; do not edit."""',
        f"# hbnn.model.forward and numerics source sha256 {hashlib.sha256(sources.encode()).hexdigest()}",
        "import math", "import numba", "import numpy as np", "from numba import types",
        "from numba.extending import overload", "from hbnn.model.forward import BLOCK", "",
        modules.compiled(act.compiled_source), "", _BLOCK_DISPATCH, "",
        _DECORATOR, modules.function_source(SOURCE, "_outputs"),
    ])


@functools.cache
def _compiled(activation: str):
    """The compiled :func:`_outputs` for ``activation`` (:func:`module_source`), loaded from numba's disk cache with
    both of its specialisations (float32 and float64) compiled at once and its entries recorded
    (:func:`hbnn.density.modules.record`): a process that calls it later, a forked report worker included, adds
    none that the cache's manifest does not vouch for."""
    from hbnn.density import modules

    source = module_source(activation)
    name = "hbnn_forward_" + hashlib.sha256(source.encode()).hexdigest()[:20]
    with modules.LOADING:
        fn = modules.load(name, source, "_outputs")._outputs
        for dtype in (np.float32, np.float64):  # the only two types outputs() passes: compile both now
            _call(fn, np.zeros((1, 1)), [np.zeros((1, 1, 1)), np.zeros((1, 1))], np.dtype(dtype),
                  np.empty((1, 1), dtype=dtype))
        modules.record(name)
    return fn


def prepare(activation: str) -> None:
    """Load (or compile) the pass for ``activation`` now, in both dtypes: before forking workers that use it, which
    then inherit it.

    Parameters
    ----------
    activation : str
        A registered activation; one without compiled code needs nothing.
    """
    if activations.get(activation).compiled_source is not None:
        _compiled(activation)


def _call(fn, X, weights, dtype, out):
    """Run the compiled pass ``fn`` with arrays of the types it was compiled for (all C-contiguous and writable)."""
    n_samples = weights[0].shape[0]
    n_in = X.shape[1]
    layout, at, width = [], 0, n_in
    for i, w in enumerate(weights):
        n_out = w.shape[-1] if i < len(weights) - 1 else 1
        rows = w[0].size // n_out
        layout.append((n_in, n_out, at, int(rows == n_in + 1)))
        n_in, at, width = n_out, at + w[0].size, max(width, n_out)
    flat = np.ascontiguousarray(np.concatenate([np.reshape(w, (n_samples, -1)) for w in weights], axis=1),
                                dtype=dtype)
    columns = np.array(np.asarray(X).T, dtype=dtype, order="C")  # a copy, never a read-only view
    h = np.zeros((2, width, BLOCK), dtype=dtype)
    bits = np.empty(BLOCK, dtype=np.int32 if dtype == np.float32 else np.int64)
    fn(columns, flat, np.array(layout, dtype=np.int64), out, h, np.empty(BLOCK, dtype=dtype), bits)


def outputs(X: np.ndarray, weights: Sequence[np.ndarray], dtype=np.float64, out: np.ndarray | None = None,
            activation: str = "tanh") -> np.ndarray:
    """The network's outputs at rows ``X`` for many weight draws, compiled.

    Parameters
    ----------
    X : numpy.ndarray
        Rows ``(row, feature)``.
    weights : sequence of numpy.ndarray
        Per-layer weight draws ``(sample, *layer shape)``, in :func:`hbnn.model.network.layer_specs` order; a layer
        whose input rows are one more than its inputs has its bias in the last row.
    dtype : numpy dtype, default float64
        What the pass computes in: float64 or float32.
    out : numpy.ndarray, optional
        Where to write them: ``(sample, row)`` of ``dtype``, at least ``sample`` rows.
    activation : str, default "tanh"
        The hidden units' activation (``model.activation``).

    Returns
    -------
    numpy.ndarray
        ``(sample, row)`` of ``dtype``: ``out`` where given.
    """
    dtype = np.dtype(dtype)
    n_samples = weights[0].shape[0]
    if out is None:
        out = np.empty((n_samples, X.shape[0]), dtype=dtype)
    if activations.get(activation).compiled_source is None:
        from hbnn.model.network import mlp_logit

        out[:n_samples] = mlp_logit(np.asarray(X, dtype=dtype), [np.asarray(w, dtype=dtype) for w in weights],
                                    activations.get(activation).numpy)
        return out
    _call(_compiled(activation), X, weights, dtype, out)
    return out
