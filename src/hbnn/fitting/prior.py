"""The informed prior: one MvNormal per layer, fitted to new-group weight draws of a hierarchical posterior
(:func:`derive`), for the ``derive_prior`` stage, the transfer experiment and the Python API."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hbnn.config import PriorParams
from hbnn.errors import NonFiniteError
from hbnn.files.io import InputError
from hbnn.files.outputs import check_finite
from hbnn.model import activations, alignment, prior
from hbnn.pipeline.variants import derive_seed


def derive(p: PriorParams, posterior, specs, activation: str, seed_key: int, hier_trace: Path
           ) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict]:
    """Fit one MvNormal per layer to new-group weight draws of a hierarchical posterior.

    Every number is the same on any x86-64 machine for the same ``posterior`` (see :mod:`hbnn.model.prior`): the sums
    are :func:`hbnn.model.prior.fixed_sum`'s, the noise :func:`hbnn.model.prior.standard_normal`'s, and nothing calls
    BLAS.

    Parameters
    ----------
    p : hbnn.config.PriorParams
        The ``prior`` settings (draws per sample, chain alignment, jitter, seed).
    posterior : xarray.Dataset
        The hierarchical posterior (``mu_*``, ``sd_*`` per layer).
    specs : sequence of hbnn.model.network.LayerSpec
        The network's layers.
    activation : str
        The hidden units' activation, which says whether chains are matched by sign flips as well as permutations.
    seed_key : int
        Picks the random stream of the draws (:data:`hbnn.pipeline.variants.STAGE_KEYS`).
    hier_trace : pathlib.Path
        The trace's file, named in errors.

    Returns
    -------
    tuple
        ``(fitted, metrics)``: per layer ``(mean, cov)``, and the metrics that describe them (draws used, group sds,
        chain alignment).

    Raises
    ------
    hbnn.errors.InputError
        If the trace lacks a hierarchical variable, holds non-finite draws, or has too few chains for
        ``prior.reference_chain``.
    """
    try:
        mu = prior.layer_arrays(posterior, specs, "mu")
        sd = [posterior[f"sd_{s.name}"].transpose("chain", "draw").values for s in specs]
    except KeyError as err:
        raise InputError(f"trace {hier_trace} lacks hierarchical variable {err}") from err
    try:  # the fit stages write finite draws only: a non-finite one is a trace made elsewhere, bad input
        check_finite(posterior[[f"{kind}_{s.name}" for kind in ("mu", "sd") for s in specs]], f"trace {hier_trace}")
    except NonFiniteError as err:
        raise InputError(str(err)) from err
    n_chains = mu[0].shape[0]
    if p.reference_chain >= n_chains:
        raise InputError(
            f"prior.reference_chain={p.reference_chain} but trace {hier_trace} has only {n_chains} chains"
        )

    signs = activations.get(activation).sign_symmetric
    aligned = alignment.align_to_reference(mu, p.reference_chain, signs)
    if p.align == "chains":
        mu_used, sd_used, chains_used = aligned.mu, sd, list(range(n_chains))
    else:  # reference_chain: one chain, nothing to align
        ref = p.reference_chain
        mu_used = [m[ref : ref + 1] for m in mu]
        sd_used = [s[ref : ref + 1] for s in sd]
        chains_used = [ref]
    flat_mu = [m.reshape(-1, *m.shape[2:]) for m in mu_used]
    flat_sd = [s.reshape(-1) for s in sd_used]
    rng = np.random.default_rng(derive_seed(p.seed, seed_key))
    draws = prior.new_group_draws(flat_mu, flat_sd, p.draws_per_sample, rng)

    fitted, layer_metrics = [], {}
    for s, samples, sd_s in zip(specs, draws, flat_sd, strict=True):
        mean, cov = prior.fit_mvnormal(samples, p.jitter)
        fitted.append((mean, cov))
        sd_mean = prior.fixed_mean(sd_s)
        dev = sd_s - sd_mean
        layer_metrics[s.name] = {
            "group_sd": {
                "mean": sd_mean,
                "sd": np.sqrt(prior.fixed_mean(dev * dev)),
                "q05": np.quantile(sd_s, 0.05),  # a sort and an interpolation: the same bits everywhere
                "q95": np.quantile(sd_s, 0.95),
            },
            "prior_mean_abs": prior.fixed_mean(np.abs(mean)),
            "prior_sd_mean": prior.fixed_mean(np.sqrt(np.diag(cov))),
        }
    metrics = {
        "draws": {
            "chains_used": len(chains_used),
            "posterior_draws": int(flat_sd[0].size),
            "draws_per_sample": p.draws_per_sample,
            "new_group_draws": int(draws[0].shape[0]),
        },
        "layers": layer_metrics,
        "activation": activation,
        "unit_matching": "permutations and sign flips" if signs else "permutations",
        "alignment": {
            f"chain_{c}": {
                "distance_before": aligned.distance_before[c],
                "distance_after": aligned.distance_after[c],
                "relabelled": int(not aligned.symmetries[c].is_identity),
            }
            for c in range(n_chains)
        },
    }
    return fitted, metrics
