"""The model variants and the stages that fit them: one registry, looked up by name.

Stages, the report, ``hbnn predict`` and the plots take a variant's names from
here (its ``hbnn_variant`` attr, its label, its stage and the file stem of its
trace, metrics and timings) instead of repeating them. Also here: the params
each stage reads (exactly its ``params:`` in ``dvc.yaml``; a test keeps the two
equal, and each output's provenance hash covers these and nothing else) and
the per-stage seed streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Variant:
    """A fitted model variant."""

    name: str  # the trace's hbnn_variant attr: flat, hierarchical, informed
    label: str  # for people: tables and figure legends
    stage: str  # the DVC stage that fits it
    stem: str  # traces/<stem>.nc, metrics/<stem>.json, timings/<stem>.json
    has_group_distribution: bool  # mu and sd per layer: scores unseen groups (hbnn predict), feeds the prior
    color: str  # in every figure


FLAT = Variant("flat", "Flat", "fit_flat", "flat", False, "tab:gray")
HIERARCHICAL = Variant("hierarchical", "Hierarchical", "fit_hier", "hier", True, "tab:blue")
INFORMED = Variant("informed", "Informed prior", "fit_informed", "informed", False, "tab:orange")
VARIANTS = (FLAT, HIERARCHICAL, INFORMED)
BY_NAME = {v.name: v for v in VARIANTS}
BY_STAGE = {v.stage: v for v in VARIANTS}

# The params each stage reads, exactly as listed under its `params:` in dvc.yaml.
STAGE_PARAMS = {
    # model.likelihood: labels are checked (0/1 for bernoulli) and stored per likelihood.
    "make_data": ("n_groups", "seed", "data", "model.likelihood"),
    "fit_flat": ("model", "sampler", "trace"),
    "fit_hier": ("model.hidden_layers", "model.likelihood", "model.noise_sd", "model.bias", "model.activation",
                 "model.noise", "hier_sampler", "trace"),
    "derive_prior": ("prior",),
    "fit_informed": ("model.hidden_layers", "model.likelihood", "model.noise_sd", "model.bias", "model.activation",
                     "sampler", "trace"),
    # transfer.sizes and transfer.all_rows only say what `transfer` refits: changing them keeps this fit.
    "transfer_prior": ("transfer.holdout_fraction", "transfer.min_holdout", "transfer.seed", "transfer.tune",
                       "model.hidden_layers", "model.likelihood", "model.noise_sd", "model.bias", "model.activation",
                       "model.noise", "hier_sampler", "prior", "trace"),
    # the hierarchical refits with the held-out groups' rows: which groups and rows, not transfer.sizes' other fits
    "transfer_refit": ("transfer.holdout_fraction", "transfer.min_holdout", "transfer.seed", "transfer.tune",
                       "transfer.refit_sizes", "transfer.refit_all_rows", "model.hidden_layers", "model.likelihood",
                       "model.noise_sd", "model.bias", "model.activation", "model.noise", "hier_sampler", "trace"),
    "transfer": ("transfer", "model", "sampler", "trace"),
    "baselines": ("baselines", "model.likelihood"),
}

# Every fit, by the name its log lines and seed stream use: the DVC stage that runs it (whose params stamp
# its outputs) and the variant it fits. The transfer stages run fits of the three variants on other data.
FITS = {
    "fit_flat": ("fit_flat", FLAT),
    "fit_hier": ("fit_hier", HIERARCHICAL),
    "fit_informed": ("fit_informed", INFORMED),
    "transfer_hier": ("transfer_prior", HIERARCHICAL),
    "transfer_flat": ("transfer", FLAT),
    "transfer_informed": ("transfer", INFORMED),
    "transfer_refit": ("transfer_refit", HIERARCHICAL),
}

# Distinct keys so stages never share a random stream for the same group.
STAGE_KEYS = {"fit_flat": 1, "fit_hier": 2, "fit_informed": 3, "derive_prior": 4, "transfer_hier": 5,
              "transfer_prior": 6, "transfer_split": 7, "transfer_flat": 8, "transfer_informed": 9,
              "transfer_population": 10, "baselines": 11, "transfer_refit": 12}


def derive_seed(base: int, *keys: int) -> int:
    """A 32-bit seed derived from ``base`` and integer ``keys`` (stage, group, ...).

    Uses ``SeedSequence`` so nearby keys give unrelated streams.

    Parameters
    ----------
    base : int
        The params' seed.
    *keys : int
        The stage (:data:`STAGE_KEYS`), group and so on.

    Returns
    -------
    int
    """
    return int(np.random.SeedSequence(base, spawn_key=keys).generate_state(1)[0])
