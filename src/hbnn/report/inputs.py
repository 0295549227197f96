"""Reading and checking the report's inputs: traces, metrics and the tasks they were fit to."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xarray as xr

from hbnn.config import Params
from hbnn.data import Tasks
from hbnn.io import InputError, detail_path, load_trace, settings_from_attrs
from hbnn.network import LayerSpec, layer_specs
from hbnn.report.numbers import METRICS_FILES, lookup
from hbnn.variants import BY_NAME


def read_json(path: Path, what: str) -> dict:
    """A metrics JSON file, or :class:`InputError` naming it."""
    if not path.is_file():
        raise InputError(f"{what} {path} does not exist; run the stage that writes it first (dvc repro)")
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise InputError(f"{what} {path} is not valid JSON ({err})") from err

def open_traces(paths: dict[str, Path], params: Params) -> dict[str, Any]:
    """Every trace's ``posterior`` and ``sample_stats`` opened lazily (variant and params checked, nothing loaded
    yet): what the report's own process reads; each model's worker opens what it reads itself."""
    return {v: load_trace(p, v, groups=(), params=params, only=("posterior", "sample_stats"))
            for v, p in paths.items()}


def group_level_vars(specs: Sequence[LayerSpec]) -> list[str]:
    """The hierarchical fit's draws the report reads besides the weights: every ``sd_<layer>`` and the first
    layer's ``mu``."""
    return [*(f"sd_{s.name}" for s in specs), f"mu_{specs[0].name}"]


def needed_vars(variant: str, specs: Sequence[LayerSpec]) -> list[str]:
    """Posterior variables the report reads from a trace of ``variant``."""
    extra = group_level_vars(specs) if BY_NAME[variant].has_group_distribution else []
    return [s.var for s in specs] + extra


def check_traces(traces: dict[str, Any], paths: dict[str, Path], specs: Sequence[LayerSpec],
                  names: Sequence[str]) -> None:
    """Every trace has the variables the report reads and the tasks file's groups, in order."""
    for v, idata in traces.items():
        missing = [n for n in needed_vars(v, specs) if n not in idata.posterior]
        if missing:
            raise InputError(f"trace {paths[v]} lacks posterior variables {missing}")
        _check_groups(idata.posterior, paths[v], names)


def load_vars(idata, names: Sequence[str]) -> xr.Dataset:
    """Load only ``names`` from a lazily opened trace's posterior, into a new dataset."""
    # compute(), not load(): load() would also fill the lazy dataset, keeping every model in memory.
    return idata.posterior[list(names)].compute()


def trace_specs(traces: dict[str, Any], paths: dict[str, Path], params: Params, tasks: Tasks) -> list[LayerSpec]:
    """Layer layout shared by all three traces (from their settings attrs)."""
    found = {}
    for v, idata in traces.items():
        settings = settings_from_attrs(idata.posterior.attrs)
        found[v] = (tuple(settings.get("hidden_layers", params.model.hidden_layers)), bool(settings.get("bias", False)))
        features = settings.get("features", tasks.features)
        if list(features) != tasks.features:
            raise InputError(f"trace {paths[v]} was fit on features {features}, the tasks file has {tasks.features}")
    if len(set(found.values())) != 1:
        raise InputError(f"the traces disagree on (hidden_layers, bias): {found}; rerun the fit stages")
    return layer_specs(tasks.n_features, *next(iter(found.values())))


def _check_groups(post: xr.Dataset, path: Path, names: Sequence[str]) -> None:
    found = [str(g) for g in post["group"].values]
    if found != list(names):
        raise InputError(f"trace {path} holds groups {found[:5]}... ({len(found)}), the tasks file "
                         f"{list(names)[:5]}... ({len(names)}); rerun the fit stages")


def check_metrics(metrics: dict[str, dict], metrics_dir: Path, names: Sequence[str]) -> None:
    for v, m in metrics.items():
        groups = lookup(m, "per_group") or {}
        if sorted(groups) != sorted(names):
            raise InputError(f"metrics file {detail_path(metrics_dir / METRICS_FILES[v])} covers groups "
                             f"{sorted(groups)[:5]}... ({len(groups)}), the tasks file has {len(names)}; rerun the "
                             "fit stages")


def data_settings(tasks: Tasks, params: Params) -> dict[str, Any]:
    """The data settings the tasks file was made with (from its attrs, else params)."""
    s = settings_from_attrs(tasks.ds.attrs)
    data = s.get("data", {})
    out = {
        "n_groups": tasks.n_groups,
        "seed": s.get("seed", params.seed),
        **{f"data.{k}": data.get(k, getattr(params.data, k)) for k in
           ("n_samples", "noise", "rotation_deg", "train_fraction")},
    }
    if tasks.ds.attrs.get("source") == "table":
        out["data.source"] = "table"
        out["data.path"] = tasks.ds.attrs.get("table", data.get("path"))
    return out
