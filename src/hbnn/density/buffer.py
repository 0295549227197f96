"""The buffer the hand-written density reads (:func:`pack`), with its rows padded to the vector width numba
compiles the row loops for on this machine (:func:`row_lanes`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os

import numba
import numpy as np

from hbnn.density.kernel import _HEADER, _PER_LAYER, SOURCE
from hbnn.density.numerics import ROW_DTYPE

log = logging.getLogger(__name__)


def pack(density, offsets: dict[str, int]) -> np.ndarray:
    """The buffer :func:`hbnn.density.kernel.logp_grad` reads, nutpie's ``user_data``.

    Parameters
    ----------
    density : hbnn.density.densities.Density
        The model's data and settings.
    offsets : dict of str to int
        Each value variable's start in the flat vector
        (:meth:`hbnn.density.densities.Density.offsets`).

    Returns
    -------
    numpy.ndarray
        float64: a header (its size in slot 0), the layers, the counts, ``X`` (group, feature, row) and ``Y``
        (group, row) as float32 (:func:`_rows`), each group's rows padded to whole vectors of :func:`row_lanes`,
        then whatever the kind needs (an informed prior's means and Cholesky factors).
    """
    from hbnn.model import likelihoods

    X = np.asarray(density.X_padded, dtype=np.float64)
    G, R, D = X.shape
    counts = np.asarray(density.counts, dtype=np.int64)
    # Rows padded to whole vectors (zeros past each group's real rows): the row loops then run with no scalar
    # remainder, which would cost a share of every gradient
    # (measured: benchmarks/FINDINGS.md, section 'Measurements behind code comments').
    lanes = row_lanes()
    R8 = -(-R // lanes) * lanes
    X = np.concatenate([X, np.zeros((G, R8 - R, D))], axis=1)
    X[np.arange(R8)[None, :] >= counts[:, None]] = 0.0
    R = R8
    y = np.asarray(density.y, dtype=np.float64)
    Y = np.zeros((G, R))
    starts = np.concatenate([[0], np.cumsum(counts)])
    for g in range(G):
        Y[g, : counts[g]] = y[starts[g]: starts[g + 1]]
    specs = density.specs
    at = _HEADER + _PER_LAYER * len(specs) + G + G * R * D + G * R
    slots, extra, const = density._layers(offsets, at)
    lay = []
    for s, three in zip(specs, slots, strict=True):
        lay += [s.shape[0] - int(density.bias), s.shape[1] if len(s.shape) == 2 else 1, *three]
    n_dim = sum(math.prod(shape) for shape in density.names().values())
    extra_at = next((offsets[name] for name, _, _ in density._extra_var("_log__")), -1)
    const += likelihoods.get(density.likelihood).density_constant(y, density.noise_sd)
    n_expanded = n_dim + sum(math.prod(shape) for _, shape, _ in density.derived())
    # slot 6: the rows each row present stands for in the likelihood (1 here; a minibatch's n_rows / batch_size,
    # hbnn.sampling.density_advi)
    header = [0.0, len(specs), G, R, D, int(density.bias), 1.0, extra_at, density.noise_sd, const, n_dim, density.kind,
              getattr(density, "prior_sd", 1.0), n_expanded, lanes]
    buf = np.concatenate([np.asarray(header, dtype=np.float64), np.asarray(lay, dtype=np.float64),
                          counts.astype(np.float64), _rows(X.transpose(0, 2, 1)), _rows(Y), *extra])
    buf[0] = buf.size
    return buf


@functools.cache
def row_lanes() -> int:
    """float32 rows per vector in the kernel's loops as numba compiles them on this machine.

    Found by compiling a small loop of the same kind (:func:`_axpy`) and reading its assembly: padding the rows to
    the other width costs time either way (measured: benchmarks/FINDINGS.md, section 'Measurements behind code
    comments'). The padding decides the order of the loops' float32 sums, so the draws of one machine differ in
    their last bits from those of a machine with the other width (as they do between other CPUs). The answer is
    kept in a file of :func:`hbnn.density.modules.cache_dir` named by what decides it (the CPU and its features as
    numba targets them, numba's and llvmlite's versions, the kernel's source), so the probe compiles once per
    machine, not once a process.

    Returns
    -------
    int
        16 where LLVM emits 512-bit vectors (AVX-512 CPUs it tunes for them, e.g. AMD Zen 4), else 8 (AVX2, and
        the AVX-512 CPUs it tunes for 256-bit vectors, most Intel ones, and any machine whose assembly cannot be
        read).
    """
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
