"""What to try when a fit misses the convergence bar because of the model, not only the sampler.

A few groups short of the bar usually need a longer run (the status box and the log say which setting to raise). Two
signs point at the model instead, and :func:`model_advice` names the settings to try, given what the fit used, with
what those settings did on a public table (:data:`MEASURED`):

- most groups miss the bar (:data:`WIDESPREAD`): the network does not suit the data (a table's features and groups are
  not centred where a network without biases puts its fixed point; a curved network fitted to a near-linear relation
  has many equivalent weight settings that the chains cannot all visit);
- the fit misses the bar while a hierarchical group sd runs to its prior's tail (:func:`sds_in_tail`): the groups'
  weights in that layer differ by more than the ``HalfNormal(1)`` prior expects, which is how the weights make up for
  what the model lacks (a per-group intercept, a per-group noise scale, a linear relation fitted by a curved network).
  A large sd on its own is not a fault: it says the groups differ in that layer, and a fit that meets the bar with it
  (the default moons' output layer, whose sd sits near 3.7) needs no advice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

# A model whose groups miss the bar in at least this share (and at least 2 of them): the model is the likely cause
WIDESPREAD = 0.5

# The group sds' prior, HalfNormal(1) (hbnn.model.builders, hbnn.density): its 95% quantile, sqrt(2) erfinv(0.95)
SD_PRIOR_Q95 = 1.959964

# An sd runs to its prior's tail where its posterior median is past the prior's 95% quantile: half its draws lie where
# the prior put 5% of its mass, so the data pull it out against the prior rather than the prior setting its scale
TAIL_SHARE = 0.5

# What each setting did on a public table, by the cause it addresses; reproduce with the recipe's params.yaml
# (examples/tables/grunfeld/params.yaml) edited as said and `python scripts/make_example_tables.py grunfeld --run`
MEASURED = {
    "network": ("on statsmodels' grunfeld table (11 firms, gaussian, a noise sd per firm), model.bias: false with "
                "model.hidden_layers: [5, 5] left 11 of 11 groups of the hierarchical fit short of the bar after "
                "5,000 draws per chain and 2 restarts (max R-hat 1.13, min bulk ESS 17, 152 divergences) at a test "
                "RMSE of 50.6; the recipe's model.bias: true with model.hidden_layers: [] met it in every group at "
                "an RMSE of 40.6"),
    "noise": ("on statsmodels' grunfeld table (11 firms whose investment runs from about 1 to over 1,000 a year), "
              "model.noise: shared gave a hierarchical test lpd of -5.167, 2.96 se behind the per-firm GLM; "
              "model.noise: group gave -4.051, 1.96 se ahead"),
}
# Which measurement speaks for each setting :func:`model_advice` may name
CAUSES = {"bias": "network", "hidden_layers": "network", "noise": "noise"}


def sds_in_tail(sd_draws: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The hierarchical group sds that run to their prior's tail, with their posterior medians.

    Parameters
    ----------
    sd_draws : mapping of str to numpy.ndarray
        Each group sd's draws (``sd_<layer>``, any shape: every chain and draw).

    Returns
    -------
    dict of str to float
        The sds whose share of draws past :data:`SD_PRIOR_Q95` is at least :data:`TAIL_SHARE`, i.e. whose posterior
        median is past the prior's 95% quantile, in ``sd_draws``' order; empty where none are.
    """
    out = {}
    for var, draws in sd_draws.items():
        values = np.asarray(draws, dtype=float).ravel()
        if values.size and np.mean(values > SD_PRIOR_Q95) >= TAIL_SHARE:
            out[var] = float(np.median(values))
    return out


def _tries(settings: Mapping[str, Any], tail: bool) -> tuple[list[str], list[str]]:
    """The settings to try (those the fit did not use already) and the :data:`MEASURED` causes that fit them."""
    tries, causes = [], []
    if not settings.get("bias", False):
        tries.append("model.bias: true (without biases every unit's response is fixed at the features' means, "
                     "which a table's groups rarely share" + ("; the weights then spread apart to make up for the "
                                                              "missing intercepts)" if tail else ")"))
        causes.append("bias")
    if settings.get("hidden_layers"):
        tries.append("a smaller network or model.hidden_layers: [] (a linear model), where the relation is close "
                     "to linear")
        causes.append("hidden_layers")
    if settings.get("likelihood") == "gaussian" and settings.get("noise") == "shared":  # the hierarchical fit's
        tries.append("model.noise: group (one noise sd per group, where the groups' scales differ)")
        causes.append("noise")
    if "prior_sd" in settings and float(settings["prior_sd"]) >= 1.0:
        tries.append("a smaller model.prior_sd (tighter weights for the per-group fits)")
    if not tries:
        tries.append("a different network (model.hidden_layers, model.activation) or prior scales "
                     "(model.prior_sd, model.noise_sd)")
    return tries, causes


def model_advice(per_group: Mapping[str, Mapping[str, Any]], settings: Mapping[str, Any], label: str,
                 sd_draws: Mapping[str, np.ndarray] | None = None, sds_missing: int = 0) -> str | None:
    """The model settings to try for a fit that misses the bar for a model's reason; ``None`` where none shows.

    Parameters
    ----------
    per_group : mapping
        The fit's per-group metrics (each with ``converged``).
    settings : mapping
        The fit's settings as its trace records them (``hidden_layers``, ``bias``, ``likelihood``, ``noise``,
        ``prior_sd``).
    label : str
        The model's name, for the sentence.
    sd_draws : mapping of str to numpy.ndarray, optional
        A hierarchical fit's group sd draws (:func:`sds_in_tail`); ``None`` for the other fits.
    sds_missing : int, optional
        How many of those sds miss the bar themselves (the metrics' ``sampling.sds_not_converged``).

    Returns
    -------
    str or None
        One paragraph: how many groups miss and which sds run to their prior's tail, the settings to try (those the
        fit did not use already), what they did on a public table, and how to compare. ``None`` where fewer than
        :data:`WIDESPREAD` of the groups miss and no sd runs to its prior's tail while anything misses.
    """
    missing = sum(not g.get("converged") for g in per_group.values())
    widespread = missing >= max(2, WIDESPREAD * len(per_group))
    tail = sds_in_tail(sd_draws or {}) if missing or sds_missing else {}
    if not widespread and not tail:
        return None
    tries, causes = _tries(settings, bool(tail))
    said = [f"{missing} of {len(per_group)} groups miss the bar"]
    if tail:
        sds = ", ".join(f"{v} (posterior median {m:.2f})" for v, m in tail.items())
        said.append(f"the group sd{'s' if len(tail) > 1 else ''} {sds} run{'' if len(tail) > 1 else 's'} past "
                    f"{'their' if len(tail) > 1 else 'its'} HalfNormal(1) prior's 95% quantile ({SD_PRIOR_Q95:.2f}): "
                    "the groups' weights differ by more than the prior expects")
    measured = "; ".join(MEASURED[m] for m in dict.fromkeys(CAUSES[c] for c in causes) or ["network"])
    return (f"{label}: {' and '.join(said)}, which a longer run rarely fixes: the model may not suit the data. Try "
            f"{'; '.join(tries)}. Measured: {measured} (docs/tables.md). Compare settings with "
            "`dvc exp run -S <key>=<value>` and `dvc metrics diff`.")
