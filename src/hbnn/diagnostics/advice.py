"""What to try when most of a model's groups miss the convergence bar: the model, not only the sampler.

A few groups short of the bar usually need a longer run (the status box and the log say which setting to raise). When
most groups miss, a longer run rarely helps: the network does not suit the data (a table's features and groups are
not centred where a network without biases puts its fixed point; a curved network fitted to a near-linear relation
has many equivalent weight settings that the chains cannot all visit). :func:`model_advice` names the settings to try,
given what the fit used, and what they did on a public table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A model whose groups miss the bar in at least this share (and at least 2 of them): the model is the likely cause
WIDESPREAD = 0.5

# What the settings did on a public table (docs/tables.md has the recipe and the command)
MEASURED = ("on statsmodels' grunfeld table (11 firms, gaussian), the default network without biases left 10 of 11 "
            "groups of the hierarchical fit short of the bar (max R-hat 1.13, min bulk ESS 18); with model.bias: "
            "true and model.hidden_layers: [] every group met it, at an RMSE of 39.7 against 68.1")


def model_advice(per_group: Mapping[str, Mapping[str, Any]], settings: Mapping[str, Any], label: str) -> str | None:
    """The model settings to try for a fit whose groups mostly miss the bar; ``None`` where few or none do.

    Parameters
    ----------
    per_group : mapping
        The fit's per-group metrics (each with ``converged``).
    settings : mapping
        The fit's settings as its trace records them (``hidden_layers``, ``bias``, ``likelihood``, ``prior_sd``).
    label : str
        The model's name, for the sentence.

    Returns
    -------
    str or None
        One paragraph: how many groups miss, the settings to try (those the fit did not use already), what they did
        on a public table, and how to compare.
    """
    missing = sum(not g.get("converged") for g in per_group.values())
    if missing < max(2, WIDESPREAD * len(per_group)):
        return None
    tries = []
    if not settings.get("bias", False):
        tries.append("model.bias: true (without biases every unit's response is fixed at the features' means, "
                     "which a table's groups rarely share)")
    if settings.get("hidden_layers"):
        tries.append("a smaller network or model.hidden_layers: [] (a linear model), where the relation is close "
                     "to linear")
    if settings.get("likelihood") == "gaussian" and settings.get("noise") == "shared":  # the hierarchical fit's
        tries.append("model.noise: group (one noise sd per group, where the groups' scales differ)")
    if "prior_sd" in settings and float(settings["prior_sd"]) >= 1.0:
        tries.append("a smaller model.prior_sd (tighter weights for the per-group fits)")
    if not tries:
        tries.append("a different network (model.hidden_layers, model.activation) or prior scales "
                     "(model.prior_sd, model.noise_sd)")
    return (f"{label}: {missing} of {len(per_group)} groups miss the bar, more than a longer run usually fixes: the "
            f"model may not suit the data. Try {'; '.join(tries)}. For example, {MEASURED} (docs/tables.md). Compare "
            "settings with `dvc exp run -S <key>=<value>` and `dvc metrics diff`.")
