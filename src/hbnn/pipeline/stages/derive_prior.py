"""Stage ``derive_prior``: the informed prior from the hierarchical posterior."""

from __future__ import annotations

import logging
from pathlib import Path

from hbnn.config import Params
from hbnn.files.io import as_builtin, load_posterior, made_by, provenance, settings_from_attrs
from hbnn.files.outputs import detail_path, staged_outputs
from hbnn.fitting.prior import derive, recorded
from hbnn.model import prior
from hbnn.model.network import layer_specs
from hbnn.pipeline import budget
from hbnn.pipeline.variants import STAGE_KEYS, STAGE_PARAMS

log = logging.getLogger(__name__)


def headline(metrics: dict) -> dict:
    """What ``metrics/prior.json`` holds (the rest is in the detail file, :func:`hbnn.files.outputs.detail_path`).

    Parameters
    ----------
    metrics : dict
        :func:`hbnn.fitting.prior.derive`'s metrics.

    Returns
    -------
    dict
        The chains used (``plugin``: and the draw taken, with its log density) and each layer's mean prior sd.
    """
    draws = {key: metrics["draws"][key] for key in ("chains_used", "chosen") if key in metrics["draws"]}
    return {"draws": draws,
            "layers": {name: {"prior_sd_mean": m["prior_sd_mean"]} for name, m in metrics["layers"].items()}}


def derive_prior(params: Params, hier_trace: Path, prior_out: Path, metrics_out: Path) -> dict:
    """Stage body: the informed prior of the hierarchical posterior, by ``prior.method`` (:mod:`hbnn.fitting.prior`).

    Parameters
    ----------
    params : hbnn.config.Params
        The run's settings (``prior`` and the model).
    hier_trace : pathlib.Path
        The hierarchical fit's trace.
    prior_out : pathlib.Path
        Where the informed prior (netCDF) goes.
    metrics_out : pathlib.Path
        The headline metrics file; the detail file goes beside it.

    Returns
    -------
    dict
        The detail metrics.

    Raises
    ------
    hbnn.errors.InputError
        If the trace is missing, unreadable or made with other settings, or the estimate exceeds the budget.
    """
    p = params.prior
    posterior = load_posterior(hier_trace, "hierarchical", params=params, stage="fit_hier")
    settings = settings_from_attrs(posterior.attrs)
    hidden = tuple(settings.get("hidden_layers", params.model.hidden_layers))
    bias = bool(settings.get("bias", False))
    features = settings.get("features") or [str(f) for f in posterior["feature"].values]
    activation = settings.get("activation", "tanh")  # traces written before model.activation existed are tanh's
    specs = layer_specs(len(features), hidden, bias)
    budget.enforce(budget.prior_estimate("derive_prior", params, posterior.sizes["chain"] * posterior.sizes["draw"],
                                         posterior.sizes.get("group", 1), len(features)), params)
    stats = None
    if p.method == "plugin":  # the log density of each draw picks the draw
        stats = load_posterior(hier_trace, "hierarchical", params=params, stage="fit_hier", group="sample_stats")
    fitted, metrics = derive(p, posterior, specs, activation, STAGE_KEYS["derive_prior"], hier_trace, stats)
    ds = prior.prior_dataset(specs, fitted)
    ds.attrs.update(provenance("derive_prior", "informed_prior",
                               params.section_hash(*STAGE_PARAMS["derive_prior"]),
                               {"prior": recorded(p), "hidden_layers": list(hidden), "bias": bias,
                                "activation": activation, "features": list(features), "hier_trace": str(hier_trace)}))
    metrics["made_by"] = made_by("derive_prior", params)
    with staged_outputs() as outputs:
        outputs.write_netcdf(ds, prior_out)
        outputs.write_json(as_builtin(metrics), detail_path(metrics_out))
        outputs.write_json(as_builtin(headline(metrics)), metrics_out)
    if p.method == "plugin":
        log.info("derive_prior: plug-in prior at chain %(chain)d, draw %(draw)d (log density %(log_density).2f)",
                 metrics["draws"]["chosen"])
    else:
        log.info("derive_prior: %d new-group draws per layer from %d chains", metrics["draws"]["new_group_draws"],
                 metrics["draws"]["chains_used"])
    return metrics
