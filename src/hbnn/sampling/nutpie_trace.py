"""nutpie's raw trace (Arrow record batches) as a :class:`~hbnn.files.trace.Trace`, without ArviZ."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import xarray as xr

from hbnn.files.trace import Trace

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


# nutpie's per-draw statistics that a trace leaves out: its own chain and draw numbers (the coordinates), and the
# vectors it fills only when asked to store them (gradients, mass matrices, divergences' ends), null otherwise
_NUTPIE_STATS_LEFT_OUT = frozenset({
    "chain", "draw", "unconstrained_draw", "gradient", "mass_matrix_inv", "mass_matrix_eigvals", "mass_matrix_stds",
    "divergence_start", "divergence_start_gradient", "divergence_end", "divergence_momentum",
})


def _tuning_rows(stats) -> int:
    """How many of a chain's rows (its record batch of sample stats) are tuning."""
    import pyarrow

    return int(np.asarray(pyarrow.array(stats.column("tuning")).to_numpy(zero_copy_only=False)).sum())


def _draws_done(stats) -> int:
    """Draws after tuning that every chain holds (the slowest chain's), from its record batches of sample stats:
    a poll that only counts the draws does not convert them (:func:`_arrow_idata`)."""
    return min((s.num_rows - _tuning_rows(s) for s in stats), default=0)


def _nutpie_idata(trace, coords: Mapping[str, Sequence]) -> Trace:
    """nutpie's raw trace (``return_raw_trace=True``) as ``posterior`` and ``sample_stats`` of the draws after
    tuning and, of tuning, the ``n_steps`` only (``warmup_sample_stats``, to count gradient evaluations).

    The same arrays, dims and coordinates as nutpie's own conversion (tests/test_inference.py compares them),
    which goes through ArviZ's ``from_dict`` for every group of draws: ~65 ms a fit, ~7 s over the default
    pipeline's 108 per-group fits. Chains shorter than the longest (a trace inspected while it runs) are
    padded as nutpie pads them: NaN for floats, 0 otherwise.
    """
    return _arrow_idata(*trace.get_arrow_trace(), coords)


def _arrow_idata(draws, stats, coords: Mapping[str, Sequence]) -> Trace:
    """:func:`_nutpie_idata` of the record batches a raw trace hands over (once: ``get_arrow_trace``)."""
    tuned = [_tuning_rows(s) for s in stats]
    kept = [d.num_rows - t for d, t in zip(draws, tuned, strict=True)]
    posterior = _arrow_dataset(draws, tuned, kept, lambda name: True, coords)
    sample_stats = _arrow_dataset(stats, tuned, kept, lambda name: name not in _NUTPIE_STATS_LEFT_OUT, coords)
    tuning = _arrow_dataset(stats, [0] * len(stats), tuned, lambda name: name == "n_steps", coords)
    return Trace(posterior=posterior, sample_stats=sample_stats, warmup_sample_stats=tuning)


def _arrow_dataset(batches, starts: Sequence[int], lengths: Sequence[int], keep, coords) -> xr.Dataset:
    """Rows ``starts[c]`` to ``starts[c] + lengths[c]`` of every chain's record batch as one ``(chain, draw, ...)``
    dataset of the columns ``keep(name)`` accepts, each column's dims and shape from nutpie's field metadata."""
    import pyarrow

    n_draws = max(lengths, default=0)
    arrays, dims = {}, {}
    for c, (batch, start, length) in enumerate(zip(batches, starts, lengths, strict=True)):
        for name in batch.column_names:
            if not keep(name):
                continue
            column = batch.column(name)
            meta = column.field.metadata
            shape = tuple(int(n) for n in meta[b"shape"].decode().split(",")) if meta.get(b"shape") else ()
            col = pyarrow.array(column).slice(start, length)
            values = col.flatten() if hasattr(col, "flatten") else col
            if name not in arrays:
                dtype = values.type.to_pandas_dtype()
                fill = np.nan if np.issubdtype(dtype, np.floating) else 0
                arrays[name] = np.full((len(batches), n_draws, *shape), fill, dtype=dtype)
                named = meta[b"dims"].decode().split(",") if meta.get(b"dims") else []
                dims[name] = ("chain", "draw", *(named or [f"{name}_dim_{i}" for i in range(len(shape))]))
            valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False))
            arrays[name][c, :length][valid] = values.to_numpy(zero_copy_only=False).reshape(-1, *shape)
    sizes = {d: n for name, a in arrays.items() for d, n in zip(dims[name], a.shape, strict=True)}
    return xr.Dataset(
        {name: (dims[name], a) for name, a in arrays.items()},
        # as ArviZ's from_dict: a dim without coordinates of its own gets 0, 1, ...
        coords={"chain": np.arange(len(batches)), "draw": np.arange(n_draws),
                **{d: pd.Index(coords[d]) if d in coords else np.arange(n) for d, n in sizes.items()
                   if d not in ("chain", "draw")}},
        attrs={"arviz_version": _ARVIZ_VERSION},
    )


# nutpie's conversion stamps ArviZ's version on every group; read from the package's metadata, not its import
_ARVIZ_VERSION = metadata.version("arviz")
