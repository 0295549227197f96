"""Reading and checking the report's inputs: traces, metrics and the tasks they were fit to.

The metrics files are checked against the shape the report reads (:func:`conform`): a key it needs that is
missing, or a value of another type, is one :class:`InputError` naming the file and the key, before anything is
drawn. Numbers must be finite (the stages write a non-finite value as ``null``); where the report does arithmetic
on a number the stages may write as ``null`` (a standard error of one row), ``null`` is read as NaN.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xarray as xr

from hbnn.config import Params
from hbnn.data.tasks import Tasks
from hbnn.files.io import InputError, load_trace, settings_from_attrs
from hbnn.files.outputs import detail_path
from hbnn.model import activations
from hbnn.model.network import LayerSpec, layer_specs
from hbnn.pipeline.variants import BY_NAME
from hbnn.report.numbers import METRICS_FILES, lookup


def read_json(path: Path, what: str) -> Any:
    """A metrics JSON file, parsed.

    Parameters
    ----------
    path : pathlib.Path
        The file.
    what : str
        What it is, for messages (``"metrics file"``).

    Returns
    -------
    object
        The parsed JSON.

    Raises
    ------
    hbnn.errors.InputError
        Naming the file where it is missing, unreadable, not JSON or nested too deeply.
    """
    if not path.is_file():
        raise InputError(f"{what} {path} does not exist; run the stage that writes it first (dvc repro)")
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise InputError(f"{what} {path} cannot be read ({err.strerror or err})") from err
    except ValueError as err:
        raise InputError(f"{what} {path} is not valid JSON ({err})") from err
    except RecursionError:  # json's decoder recurses once per level of nesting
        raise InputError(f"{what} {path} is not a metrics file: its JSON nests too deeply") from None


# ----------------------------------------------------------------------------- shapes of the metrics files
NUM = "a finite number or null"  # kept as written (the report's fmt shows null as n/a)
NUM_NAN = "a finite number (or null, read as NaN)"  # the report computes with it
COUNT = "a whole number >= 0"
COUNT_OR_NULL = "a whole number >= 0 or null"
TEXT = "a string"
TEXT_OR_NULL = "a string or null"
ANY = "anything"


@dataclass(frozen=True)
class Each:
    """A shape for :func:`conform`: an object whose every value has ``shape``.

    Parameters
    ----------
    shape : object
        Every value's shape.
    keys : str, optional
        A regular expression every key must match in full.
    keys_say : str, optional
        What such a key looks like, for messages.
    """

    shape: Any
    keys: str | None = None  # a regular expression every key must match in full
    keys_say: str = ""  # what such a key looks like, for messages


@dataclass(frozen=True)
class ListOf:
    """A shape for :func:`conform`: a list whose every item has ``shape``."""

    shape: Any


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), "a number")


def _is_number(value: Any) -> bool:
    """A JSON number that is finite as a float (an integer of hundreds of digits is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def conform(value: Any, shape: Any, where: str = "") -> Any:
    """A parsed JSON value checked against a shape.

    Parameters
    ----------
    value : object
        The parsed JSON.
    shape : object
        A dict of keys (``"key?"`` optional), :class:`Each`, :class:`ListOf` or one of the leaf kinds of this
        module (:data:`NUM`, :data:`NUM_NAN`, :data:`COUNT`, ...).
    where : str, optional
        The value's key path, for messages.

    Returns
    -------
    object
        ``value``, with ``null`` read as NaN where the shape is :data:`NUM_NAN`.

    Raises
    ------
    ValueError
        ``"<where> is missing"`` or ``"<where> is <kind>, expected <shape>"``.
    """
    def bad(expected: str) -> ValueError:
        return ValueError(f"{where or 'the file'} is {_kind(value)}, expected {expected}")

    if isinstance(shape, dict):
        if not isinstance(value, dict):
            raise bad("an object")
        out = dict(value)
        for key, inner in shape.items():
            name = key.rstrip("?")
            if name not in value:
                if key.endswith("?"):
                    continue
                raise ValueError(f"{where + '.' if where else ''}{name} is missing")
            out[name] = conform(value[name], inner, f"{where + '.' if where else ''}{name}")
        return out
    if isinstance(shape, Each):
        if not isinstance(value, dict):
            raise bad("an object")
        for key in value:
            if shape.keys is not None and not re.fullmatch(shape.keys, key):
                shown = key if len(key) <= 40 else f"{key[:37]}..."
                raise ValueError(f"{where} has the key {shown!r}, expected {shape.keys_say}")
        return {k: conform(v, shape.shape, f"{where}.{k}") for k, v in value.items()}
    if isinstance(shape, ListOf):
        if not isinstance(value, list):
            raise bad("a list")
        return [conform(v, shape.shape, f"{where}[{i}]") for i, v in enumerate(value)]
    if shape in (NUM, NUM_NAN):
        if value is None:
            return math.nan if shape == NUM_NAN else None
        if not _is_number(value):
            raise bad(shape)
        return value
    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    ok = {COUNT: count, COUNT_OR_NULL: lambda v: v is None or count(v),
          TEXT: lambda v: isinstance(v, str), TEXT_OR_NULL: lambda v: v is None or isinstance(v, str),
          ANY: lambda v: True}[shape]
    if not ok(value):
        raise bad(shape)
    return value


_SCORES = Each(NUM)  # a train or test section: accuracy, log_loss, rmse, lpd, coverage_94, n ...
SAMPLING = {  # a fit's ``sampling`` section
    **{f"{k}?": NUM for k in ("max_rhat", "max_rhat_fn", "min_ess_bulk", "min_ess_bulk_fn")},
    "divergences?": COUNT_OR_NULL,
    "group_sd?": Each({"rhat?": NUM, "ess_bulk?": NUM, "ess_tail?": NUM}),
    "flagged_groups?": Each({"reason?": TEXT}),
    "thinned_groups?": Each({"draws_per_chain": ANY, "thinned_by": ANY,
                             "missed": {"draws_per_chain": ANY, "max_rhat?": NUM, "min_ess_bulk?": NUM}}),
    "target_accept_raised?": Each({"missed": {"divergences": ANY, "transitions": ANY}, "divergences": ANY,
                                   "transitions": ANY, "target_accept": ANY}),
    "restarted?": ListOf({"draws_per_chain": ANY, "reason": TEXT, "restarted_from_chain": ANY,
                          "leapfrog_steps": NUM_NAN}),
}
FIT_METRICS = {  # metrics/detail/{flat,hier,informed}.json
    "per_group": Each({"rhat_fn?": NUM, "ess_bulk_fn?": NUM, "test?": _SCORES, "train?": _SCORES,
                       "advi_loss?": {"still_falling": ANY, "drop?": NUM_NAN, "z?": NUM_NAN}}),
    "train?": _SCORES, "test?": _SCORES, "sampling?": SAMPLING,
}
PRIOR_METRICS = {  # metrics/detail/prior.json
    "layers?": Each({"group_sd?": {f"{k}?": NUM for k in ("mean", "sd", "q05", "q95")}}),
    "alignment?": Each(ANY),
}
SIZE_LABEL = r"n[0-9]{1,9}|all"  # transfer's sizes: n<rows> or all (hbnn.pipeline.transfer.in_size_order)


def transfer_shape(score: str) -> dict:
    """What the report reads of ``metrics/detail/transfer.json``.

    Parameters
    ----------
    score : str
        The likelihood's headline score (a key of each size's test metrics).

    Returns
    -------
    dict
        A shape for :func:`conform`.
    """
    test = {score: NUM_NAN, "lpd_mean": NUM_NAN}
    model = {"test": test, "lpd_se": NUM_NAN, "fits_not_converged": COUNT}
    fits = {"fits": COUNT, "fits_not_converged": COUNT}
    return {
        "heldout_groups": ListOf(TEXT), "training_groups": ListOf(TEXT), "skipped": ListOf(TEXT),
        "stops_mattering": TEXT_OR_NULL,
        "sizes": Each({"rows_mean": NUM_NAN, "groups": COUNT, "difference": {"mean": NUM_NAN, "se": NUM_NAN},
                       "flat": model, "informed": model, "hier_refit?": model,
                       "informed_vs_refit?": {"mean": NUM_NAN, "se": NUM_NAN},
                       "refit_vs_flat?": {"mean": NUM_NAN, "se": NUM_NAN}}, SIZE_LABEL, "n<rows> or all"),
        "population": {"test": test},
        "fits": {"flat": Each(ANY, rf".*/({SIZE_LABEL})", "<group>/<size>")},
        "sampling": {"flat": fits, "informed": fits, "hier_refit?": fits,
                     "hierarchical": {"max_rhat": NUM, "min_ess_bulk": NUM, "groups_not_converged": COUNT,
                                      "group_sd?": SAMPLING["group_sd?"], "restarted?": ListOf({"reason": TEXT})}},
    }


def read_checked(path: Path, what: str, shape: Any) -> Any:
    """:func:`read_json` of ``path`` checked against ``shape`` (:func:`conform`).

    Parameters
    ----------
    path : pathlib.Path
        The file.
    what : str
        What it is, for messages.
    shape : object
        Its shape.

    Returns
    -------
    object

    Raises
    ------
    hbnn.errors.InputError
        Naming the file and the key; rerunning the stage that writes it rewrites it in its shape.
    """
    doc = read_json(path, what)
    try:
        return conform(doc, shape)
    except ValueError as err:
        raise InputError(f"{what} {path}: {err}; rerun the stage that writes it (dvc repro)") from None


def read_metrics(metrics_dir: Path, names: Sequence[str], score: str) -> tuple[dict[str, dict], dict, dict | None]:
    """Every model's detail metrics, ``prior.json``'s and ``transfer.json``'s (``None`` where the transfer stages
    have not run), each checked for the shape the report reads and for covering ``names``.

    Parameters
    ----------
    metrics_dir : pathlib.Path
        The folder of the metrics files.
    names : sequence of str
        The tasks file's groups.
    score : str
        The likelihood's headline score.

    Returns
    -------
    tuple of (dict of str to dict, dict, dict or None)
        The models' metrics by variant, the prior's, the transfer experiment's.

    Raises
    ------
    hbnn.errors.InputError
        Where a file is missing, malformed or covers other groups.
    """
    metrics = {v: read_checked(detail_path(metrics_dir / f), "metrics file", FIT_METRICS)
               for v, f in METRICS_FILES.items()}
    prior = read_checked(detail_path(metrics_dir / "prior.json"), "metrics file", PRIOR_METRICS)
    transfer_path = detail_path(metrics_dir / "transfer.json")
    transfer = (read_checked(transfer_path, "metrics file", transfer_shape(score)) if transfer_path.is_file()
                else None)
    check_metrics(metrics, metrics_dir, names)
    return metrics, prior, transfer


def open_traces(paths: dict[str, Path], params: Params) -> dict[str, Any]:
    """Every trace's ``posterior`` and ``sample_stats`` opened lazily (variant and params checked, nothing loaded
    yet). Checked against their checksums: what this process reads the values of (each ``sample_stats``, the grouped
    model's posterior); each model's worker opens, reads and checks its posterior before anything is written.

    Parameters
    ----------
    paths : dict of str to pathlib.Path
        Each model's trace file.
    params : hbnn.config.Params
        The run's params, which each trace must have been fitted with.

    Returns
    -------
    dict of str to object
        Each model's trace (:func:`hbnn.files.io.load_trace`).

    Raises
    ------
    hbnn.errors.InputError
        Where a trace is missing, unreadable or fitted with other params.
    """
    return {v: load_trace(p, v, groups=(), params=params, only=("posterior", "sample_stats"), stage=BY_NAME[v].stage,
                          verify=("posterior",) * BY_NAME[v].has_group_distribution + ("sample_stats",))
            for v, p in paths.items()}


def group_level_vars(specs: Sequence[LayerSpec]) -> list[str]:
    """The hierarchical fit's draws the report reads besides the weights.

    Parameters
    ----------
    specs : sequence of hbnn.model.network.LayerSpec
        The network's layers.

    Returns
    -------
    list of str
        Every ``sd_<layer>`` and the first layer's ``mu``.
    """
    return [*(f"sd_{s.name}" for s in specs), f"mu_{specs[0].name}"]


def needed_vars(variant: str, specs: Sequence[LayerSpec]) -> list[str]:
    """Posterior variables the report reads from a trace of ``variant`` (a model's name), a network of ``specs``.

    Parameters
    ----------
    variant : str
    specs : sequence of hbnn.model.network.LayerSpec

    Returns
    -------
    list of str
    """
    extra = group_level_vars(specs) if BY_NAME[variant].has_group_distribution else []
    return [s.var for s in specs] + extra


def check_traces(traces: dict[str, Any], paths: dict[str, Path], specs: Sequence[LayerSpec],
                  names: Sequence[str]) -> None:
    """Check that every trace has the variables the report reads and the tasks file's groups, in order.

    Parameters
    ----------
    traces : dict of str to object
        Each model's trace, opened lazily (:func:`open_traces`).
    paths : dict of str to pathlib.Path
        Each model's trace file, for messages.
    specs : sequence of hbnn.model.network.LayerSpec
        The network's layers.
    names : sequence of str
        The tasks file's groups.

    Raises
    ------
    hbnn.errors.InputError
        Naming the trace that lacks a variable or holds other groups.
    """
    for v, idata in traces.items():
        missing = [n for n in needed_vars(v, specs) if n not in idata.posterior]
        if missing:
            raise InputError(f"trace {paths[v]} lacks posterior variables {missing}")
        _check_groups(idata.posterior, paths[v], names)


def load_vars(idata, names: Sequence[str]) -> xr.Dataset:
    """Load only ``names`` from a lazily opened trace's posterior, into a new dataset.

    Parameters
    ----------
    idata : arviz.InferenceData
    names : sequence of str

    Returns
    -------
    xarray.Dataset
    """
    # compute(), not load(): load() would also fill the lazy dataset, keeping every model in memory.
    return idata.posterior[list(names)].compute()


def trace_network(traces: dict[str, Any], paths: dict[str, Path], params: Params, tasks: Tasks
                  ) -> tuple[list[LayerSpec], str]:
    """The network shared by all three traces, from their settings attrs.

    Parameters
    ----------
    traces : dict of str to object
        Each model's trace, opened lazily (:func:`open_traces`).
    paths : dict of str to pathlib.Path
        Each model's trace file, for messages.
    params : hbnn.config.Params
        The run's params (the hidden layers where a trace does not record them).
    tasks : hbnn.data.tasks.Tasks
        The run's groups and features.

    Returns
    -------
    tuple of (list of hbnn.model.network.LayerSpec, str)
        The layer layout and the hidden units' activation (tanh where a trace's settings name none).

    Raises
    ------
    hbnn.errors.InputError
        Where the traces disagree, were fit on other features, or name an unknown activation.
    """
    found = {}
    for v, idata in traces.items():
        settings = settings_from_attrs(idata.posterior.attrs)
        found[v] = (tuple(settings.get("hidden_layers", params.model.hidden_layers)), bool(settings.get("bias", False)),
                    str(settings.get("activation", "tanh")))
        features = settings.get("features", tasks.features)
        if list(features) != tasks.features:
            raise InputError(f"trace {paths[v]} was fit on features {features}, the tasks file has {tasks.features}")
    if len(set(found.values())) != 1:
        raise InputError(f"the traces disagree on (hidden_layers, bias, activation): {found}; rerun the fit stages")
    hidden, bias, activation = next(iter(found.values()))
    activations.get(activation)  # an unknown name is one error line
    return layer_specs(tasks.n_features, hidden, bias), activation


def _check_groups(post: xr.Dataset, path: Path, names: Sequence[str]) -> None:
    found = [str(g) for g in post["group"].values]
    if found != list(names):
        raise InputError(f"trace {path} holds groups {found[:5]}... ({len(found)}), the tasks file "
                         f"{list(names)[:5]}... ({len(names)}); rerun the fit stages")


def check_metrics(metrics: dict[str, dict], metrics_dir: Path, names: Sequence[str]) -> None:
    """Check that every model's metrics cover the tasks file's groups.

    Parameters
    ----------
    metrics : dict of str to dict
        Each model's detail metrics.
    metrics_dir : pathlib.Path
        Their folder, for messages.
    names : sequence of str
        The tasks file's groups.

    Raises
    ------
    hbnn.errors.InputError
        Naming the metrics file that covers other groups.
    """
    for v, m in metrics.items():
        groups = lookup(m, "per_group") or {}
        if sorted(groups) != sorted(names):
            raise InputError(f"metrics file {detail_path(metrics_dir / METRICS_FILES[v])} covers groups "
                             f"{sorted(groups)[:5]}... ({len(groups)}), the tasks file has {len(names)}; rerun the "
                             "fit stages")


def data_settings(tasks: Tasks, params: Params) -> dict[str, Any]:
    """The data settings the tasks file was made with (from its attrs, else params).

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
    params : hbnn.config.Params

    Returns
    -------
    dict of str to object
        ``n_groups``, ``seed`` and the ``data.*`` settings, by name.
    """
    s = settings_from_attrs(tasks.ds.attrs)
    data = s.get("data", {})
    out = {"n_groups": tasks.n_groups, "seed": s.get("seed", params.seed),
           **{f"data.{k}": data.get(k, getattr(params.data, k)) for k in
              ("n_samples", "noise", "rotation_deg", "train_fraction")}}
    if tasks.ds.attrs.get("source") == "table":
        out["data.source"] = "table"
        out["data.path"] = tasks.ds.attrs.get("table", data.get("path"))
    return out
