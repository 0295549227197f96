"""The informed prior from a hierarchical posterior (:func:`derive`), for the ``derive_prior`` stage, the transfer
experiment and the Python API.

Two methods (``prior.method``), both one ``(mean, cov)`` per layer in the prior file's layout
(:func:`hbnn.model.prior.prior_dataset`): ``mvnormal`` fits one MvNormal per layer to new-group weight draws
``mu_s + sd_s * z`` over the posterior's draws (chains aligned); ``plugin`` takes ``mean = mu`` and
``cov = sd^2 I`` at the one posterior draw of the highest log density (the trace's ``sample_stats``), the
hierarchical model's own new-group prior at that value of ``(mu, sd)``. ``mvnormal`` also averages over where
``mu`` sits across the draws, which widens its input and hidden layers' prior well past the new-group spread
(benchmarks/transfer_priors.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from hbnn.config import PRIOR_METHODS, Params, PriorParams
from hbnn.errors import NonFiniteError
from hbnn.files.io import InputError, check_made_with
from hbnn.files.outputs import check_finite
from hbnn.model import activations, alignment, prior
from hbnn.pipeline.variants import derive_seed

# The log density per draw in a trace's sample_stats: nutpie's name, then PyMC's (NumPyro and BlackJAX through PyMC)
LOG_DENSITY_STATS = ("logp", "lp")


def recorded(p: PriorParams) -> dict:
    """The ``prior`` settings a prior file records in its ``hbnn_settings`` attr.

    ``method`` is left out where it is the default, as :meth:`hbnn.config.Params.section_hash` leaves it out: an
    ``mvnormal`` prior file is the same bytes whether ``params.yaml`` names the key or not; absent means ``mvnormal``.

    Parameters
    ----------
    p : hbnn.config.PriorParams
        The settings.

    Returns
    -------
    dict
    """
    out = dataclasses.asdict(p)
    if out["method"] == PRIOR_METHODS[0]:
        del out["method"]
    return out


def load_checked(path: Path, specs, params: Params, stage: str = "derive_prior") -> dict[str, tuple[np.ndarray,
                                                                                                np.ndarray]]:
    """Return :func:`hbnn.model.prior.load_prior`'s layers of a prior file a stage is handed, which must also have
    been made with the run's ``params`` (:func:`hbnn.files.io.check_made_with`).

    Parameters
    ----------
    path, specs, stage
        As :func:`hbnn.model.prior.load_prior`'s.
    params : hbnn.config.Params
        The run's params.
    """
    return prior.load_prior(path, specs, stage, check_attrs=lambda attrs: check_made_with(attrs, params, path, stage))


def derive(p: PriorParams, posterior, specs, activation: str, seed_key: int, hier_trace: Path, sample_stats=None
           ) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict]:
    """The informed prior of a hierarchical posterior, per layer ``(mean, cov)``, by ``p.method``.

    ``mvnormal`` fits one MvNormal per layer to new-group weight draws; ``plugin`` takes one posterior draw's ``mu``
    and ``sd^2 I`` (:func:`plugin`; ``draws_per_sample``, ``align``, ``reference_chain`` and ``seed`` do not apply).
    Every number is the same on any x86-64 machine for the same ``posterior`` (see :mod:`hbnn.model.prior`): the sums
    are :func:`hbnn.model.prior.fixed_sum`'s, the noise :func:`hbnn.model.prior.standard_normal`'s, and nothing calls
    BLAS.

    Parameters
    ----------
    p : hbnn.config.PriorParams
        The ``prior`` settings (method, draws per sample, chain alignment, jitter, seed).
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
    sample_stats : xarray.Dataset, optional
        The trace's sample stats, with a log density per draw (:data:`LOG_DENSITY_STATS`); ``plugin`` needs them.

    Returns
    -------
    tuple
        ``(fitted, metrics)``: per layer ``(mean, cov)``, and the metrics that describe them (draws used, group sds;
        ``mvnormal``: chain alignment; ``plugin``: the method and the draw taken).

    Raises
    ------
    hbnn.errors.InputError
        If the trace lacks a hierarchical variable, holds non-finite draws, has too few chains for
        ``prior.reference_chain`` (``mvnormal``), or lacks finite log densities per draw (``plugin``).
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
    if p.method == "plugin":
        return plugin(p, mu, sd, specs, activation, log_densities(sample_stats, sd[0].shape, hier_trace))
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
        layer_metrics[s.name] = _layer_metrics(sd_s, mean, cov)
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


def log_densities(sample_stats, shape: tuple[int, int], hier_trace: Path) -> np.ndarray:
    """The log density of every posterior draw, ``(chain, draw)``, from a trace's sample stats.

    Parameters
    ----------
    sample_stats : xarray.Dataset or None
        The trace's sample stats.
    shape : tuple of int
        The posterior's ``(chain, draw)`` sizes, which the log densities must match.
    hier_trace : pathlib.Path
        The trace's file, named in errors.

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    hbnn.errors.InputError
        If there is no log density per draw (an ADVI fit stores none), it does not match the posterior's draws, or
        one is not finite.
    """
    names = [n for n in LOG_DENSITY_STATS if sample_stats is not None and n in sample_stats]
    if not names:
        raise InputError(f"trace {hier_trace} has no log density per draw ({' or '.join(LOG_DENSITY_STATS)} in "
                         "sample_stats), which prior.method: plugin needs (an ADVI fit stores none)")
    lp = sample_stats[names[0]].transpose("chain", "draw").values
    if lp.shape != shape:
        raise InputError(f"trace {hier_trace}: sample_stats {names[0]} has (chain, draw) {lp.shape}, the posterior "
                         f"{shape}")
    if not np.all(np.isfinite(lp)):
        raise InputError(f"trace {hier_trace}: sample_stats {names[0]} holds non-finite log densities")
    return lp


def plugin(p: PriorParams, mu: list[np.ndarray], sd: list[np.ndarray], specs, activation: str, lp: np.ndarray
           ) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict]:
    """Per layer ``N(mu, sd^2 I)`` at the posterior draw of the highest log density: the plug-in prior.

    The draw is the first maximum of ``lp`` in (chain, draw) order, so a tie goes to the lowest chain, then the
    lowest draw; chains need no alignment, as one draw's ``mu`` is one labelling. ``cov`` is ``sd^2 + jitter`` on
    the diagonal, zero elsewhere: element-wise arithmetic, the same bits everywhere.

    Parameters
    ----------
    p : hbnn.config.PriorParams
        The settings (``jitter``).
    mu, sd : list of numpy.ndarray
        Per layer, the posterior's ``mu`` ``(chain, draw, *shape)`` and ``sd`` ``(chain, draw)``.
    specs : sequence of hbnn.model.network.LayerSpec
        The network's layers.
    activation : str
        The hidden units' activation, recorded in the metrics.
    lp : numpy.ndarray
        The log density of each draw, ``(chain, draw)`` (:func:`log_densities`): the sampler's record of the
        hierarchical model's unnormalised log posterior.

    Returns
    -------
    tuple
        ``(fitted, metrics)`` as :func:`derive` returns them; ``metrics["draws"]["chosen"]`` names the draw.
    """
    chain, draw = (int(i) for i in np.unravel_index(int(np.argmax(lp)), lp.shape))
    fitted, layer_metrics = [], {}
    for s, mu_s, sd_s in zip(specs, mu, sd, strict=True):
        mean = np.array(mu_s[chain, draw], dtype=float).reshape(-1)
        sd_top = float(sd_s[chain, draw])
        cov = np.zeros((mean.size, mean.size))
        np.fill_diagonal(cov, sd_top * sd_top + p.jitter)  # a product, not pow(): correctly rounded everywhere
        fitted.append((mean, cov))
        layer_metrics[s.name] = {**_layer_metrics(sd_s.reshape(-1), mean, cov), "chosen_sd": sd_top}
    metrics = {
        "method": p.method,
        "draws": {"chains_used": lp.shape[0], "posterior_draws": int(lp.size),
                  "chosen": {"chain": chain, "draw": draw, "log_density": float(lp[chain, draw])}},
        "layers": layer_metrics,
        "activation": activation,
    }
    return fitted, metrics


def _layer_metrics(sd_s: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> dict:
    """A layer's group sd over the posterior's draws and its prior's mean |mean| and mean sd."""
    sd_mean = prior.fixed_mean(sd_s)
    dev = sd_s - sd_mean
    return {
        "group_sd": {
            "mean": sd_mean,
            "sd": np.sqrt(prior.fixed_mean(dev * dev)),
            "q05": np.quantile(sd_s, 0.05),  # a sort and an interpolation: the same bits everywhere
            "q95": np.quantile(sd_s, 0.95),
        },
        "prior_mean_abs": prior.fixed_mean(np.abs(mean)),
        "prior_sd_mean": prior.fixed_mean(np.sqrt(np.diag(cov))),
    }
