"""Fitted estimators from trace files (:func:`load`), and the informed prior of a hierarchical posterior."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import xarray as xr

import hbnn.api.settings as settings
from hbnn.api.base import BNNEstimator
from hbnn.errors import InputError
from hbnn.files.io import close_trace, load_trace, provenance, settings_from_attrs


def load(path: str | Path) -> BNNEstimator:
    """A fitted estimator from a trace: one :meth:`hbnn.api.base.BNNEstimator.save` wrote, or a pipeline trace
    (``traces/hier.nc``, ``traces/flat.nc``, ``traces/informed.nc``).

    Its settings are those the trace records (network, likelihood, group column, sampler); the others keep their
    defaults.

    Parameters
    ----------
    path : str or pathlib.Path
        The trace.

    Returns
    -------
    hbnn.api.base.BNNEstimator
        A :class:`~hbnn.HierarchicalBNN`, :class:`~hbnn.FlatBNN` or :class:`~hbnn.InformedBNN`, fitted: it predicts,
        and shows its diagnostics and ``idata_``.

    Raises
    ------
    hbnn.errors.InputError
        If the file is missing, unreadable, damaged (its checksums), or not a fit's trace.
    """
    from hbnn.pipeline.predict import load_fitted
    from hbnn.pipeline.variants import FITS

    path = Path(path)
    variant = load_fitted(path).posterior.attrs["hbnn_variant"]  # checks the file as hbnn predict does
    trace = load_trace(path, variant, groups=("posterior",))
    for ds in trace.values():
        ds.load()
    close_trace(trace)
    cls = next(c for c in BNNEstimator.__subclasses__() if FITS[c._stage][1].name == variant)
    recorded = settings_from_attrs(trace.posterior.attrs, f"trace {path}")
    values: dict[str, Any] = {}
    for kw, dotted in cls._names.items():
        section, _, key = dotted.partition(".")
        if section in ("sampler", "hier_sampler"):
            node: Any = recorded.get("sampler", {})
            for part in key.split("."):
                node = node.get(part, {}) if isinstance(node, dict) else {}
            if node != {}:
                values[kw] = node
        elif section == "model" and key in recorded:
            values[kw] = recorded[key]
    if "hidden_layers" in values:
        values["hidden_layers"] = tuple(values["hidden_layers"])
    extra = {"prior": recorded.get("prior_file") or None} if "prior" in cls().get_params() else {}
    estimator = cls(group=str(recorded.get("group_column", "group")), **values, **extra)
    estimator._fitted(trace)
    return estimator


def derive_prior(posterior: xr.Dataset, values: dict[str, Any], sample_stats: xr.Dataset | None = None
                 ) -> xr.Dataset:
    """The informed prior of a hierarchical ``posterior``, as the ``derive_prior`` stage derives and stamps it.

    Parameters
    ----------
    posterior : xarray.Dataset
        A hierarchical fit's posterior (with its ``hbnn_settings`` attr).
    values : dict
        The ``prior`` settings by name (``draws_per_sample``, ``align``, ``reference_chain``, ``jitter``, ``seed``,
        ``method``).
    sample_stats : xarray.Dataset, optional
        The fit's sample stats, whose log density per draw ``method="plugin"`` needs.

    Returns
    -------
    xarray.Dataset
        The prior, in ``priors/informed.nc``'s layout.

    Raises
    ------
    hbnn.errors.InputError
        Naming the setting whose value cannot be used.
    """
    from hbnn.config import ConfigError, Params
    from hbnn.config_read import parse_params
    from hbnn.fitting.prior import derive, recorded
    from hbnn.model import prior
    from hbnn.model.network import layer_specs
    from hbnn.pipeline.variants import STAGE_KEYS, STAGE_PARAMS

    chains = posterior.sizes["chain"]
    try:
        params: Params = parse_params({"prior": dict(values), "hier_sampler": {"chains": chains}})
    except ConfigError as err:
        raise InputError(settings.renamed(str(err), {k: f"prior.{k}" for k in values})) from None
    found = settings_from_attrs(posterior.attrs, "the hierarchical trace")
    features = [str(f) for f in found.get("features") or posterior["feature"].values]
    hidden, bias = tuple(found.get("hidden_layers", ())), bool(found.get("bias", False))
    activation = str(found.get("activation", "tanh"))
    specs = layer_specs(len(features), hidden, bias)
    fitted, _ = derive(params.prior, posterior, specs, activation, STAGE_KEYS["derive_prior"], "the hierarchical trace",
                       sample_stats)
    ds = prior.prior_dataset(specs, fitted)
    ds.attrs.update(provenance("derive_prior", "informed_prior", params.section_hash(*STAGE_PARAMS["derive_prior"]),
                               {"prior": recorded(params.prior), "hidden_layers": list(hidden), "bias": bias,
                                "activation": activation, "features": features, "hier_trace": ""}))
    return ds
