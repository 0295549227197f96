"""PyMC model builders: flat, hierarchical (non-centred) and informed-prior BNNs.

All three share :func:`mlp_logit` and the layer layout from :func:`layer_specs`;
they differ only in how each layer's weights are drawn. Builders return a
``pm.Model`` and never sample.

Layer naming follows the maths: ``w_in`` maps features to the first hidden
layer, ``w_h1_h2`` hidden layer 1 to 2 (and so on), ``w_out`` the last hidden
layer to the logit. Hierarchical models add ``mu_<layer>``, ``sd_<layer>`` and
``z_<layer>`` with ``w[g] = mu + sd * z[g]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pymc as pm
import pytensor.tensor as pt


@dataclass(frozen=True)
class LayerSpec:
    """One weight matrix: its name (``in``, ``h1_h2``, ``out``), dims and shape."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]

    @property
    def var(self) -> str:
        return f"w_{self.name}"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


def layer_specs(n_features: int, hidden_layers: Sequence[int]) -> list[LayerSpec]:
    """Layers of an MLP ``features -> hidden_layers... -> 1 logit`` (no biases)."""
    sizes = [n_features, *hidden_layers]
    dims = ["feature"] + [f"hidden_{i + 1}" for i in range(len(hidden_layers))]
    specs = []
    for i in range(len(hidden_layers)):
        name = "in" if i == 0 else f"h{i}_h{i + 1}"
        specs.append(LayerSpec(name, (dims[i], dims[i + 1]), (sizes[i], sizes[i + 1])))
    specs.append(LayerSpec("out", (dims[-1],), (sizes[-1],)))
    return specs


def layer_coords(features: Sequence[str], hidden_layers: Sequence[int]) -> dict[str, list]:
    """Coordinates for the feature and hidden-unit dims."""
    coords: dict[str, list] = {"feature": list(features)}
    for i, h in enumerate(hidden_layers):
        coords[f"hidden_{i + 1}"] = list(range(h))
    return coords


def mlp_logit(x, weights: Sequence, tanh: Callable = np.tanh):
    """Forward pass of the tanh MLP, for NumPy arrays or PyTensor tensors.

    ``x`` is ``(..., n, feature)``; ``weights`` follow :func:`layer_specs`, each with
    optional leading batch dims (draws, groups) that broadcast against ``x``'s
    leading dims. Returns logits ``(..., n)``.
    """
    h = x
    for w in weights[:-1]:
        h = tanh(h @ w)
    return (h @ weights[-1][..., None])[..., 0]


def _bernoulli_likelihood(logit, y) -> None:
    pm.Bernoulli("y_obs", logit_p=logit, observed=y, dims="obs")


def _bernoulli_logit_logp(value, logit):
    """``log Bernoulli(value | sigmoid(logit))`` for ``value`` in {0, 1}, written directly.

    Equal to ``pm.Bernoulli(logit_p=logit)``'s log density, but without its
    route through ``p = sigmoid(logit)``, the support switch and the ``0 <= p <=
    1`` check, so the log density and its gradient compile to fewer ops.
    """
    return value * logit - pt.softplus(logit)


def build_flat_model(
    X: np.ndarray,
    y: np.ndarray,
    features: Sequence[str],
    hidden_layers: Sequence[int],
    prior_sd: float = 1.0,
) -> pm.Model:
    """One group's BNN with iid ``Normal(0, prior_sd)`` weights.

    ``X`` is ``(obs, feature)`` and ``y`` is ``(obs,)``; both are ``pm.Data`` named
    ``x`` and ``y`` so a compiled model can be refit on another group's rows.
    """
    specs = layer_specs(len(features), hidden_layers)
    with pm.Model(coords=layer_coords(features, hidden_layers)) as model:
        x = pm.Data("x", X, dims=("obs", "feature"))
        y_data = pm.Data("y", y, dims="obs")
        weights = [pm.Normal(s.var, 0.0, prior_sd, dims=s.dims) for s in specs]
        _bernoulli_likelihood(mlp_logit(x, weights, pt.tanh), y_data)
    return model


def build_informed_model(
    X: np.ndarray,
    y: np.ndarray,
    features: Sequence[str],
    hidden_layers: Sequence[int],
    prior: Mapping[str, tuple[np.ndarray, np.ndarray]],
) -> pm.Model:
    """One group's BNN with a multivariate-normal prior on each flattened layer.

    ``prior[layer] = (mean, cov)`` with ``mean`` of length ``layer.size`` (row-major
    flattening of the layer's weight matrix). The prior is written non-centred,
    ``w = mean + chol(cov) @ z`` with ``z ~ N(0, I)``, which is the same
    distribution as ``MvNormal(mean, cov)`` but easier for NUTS.
    """
    specs = layer_specs(len(features), hidden_layers)
    coords = layer_coords(features, hidden_layers)
    for s in specs:
        coords[f"weight_{s.name}"] = list(range(s.size))
    with pm.Model(coords=coords) as model:
        x = pm.Data("x", X, dims=("obs", "feature"))
        y_data = pm.Data("y", y, dims="obs")
        weights = []
        for s in specs:
            mean, cov = prior[s.name]
            chol = np.linalg.cholesky(cov)
            z = pm.Normal(f"z_{s.name}", 0.0, 1.0, dims=f"weight_{s.name}")
            flat = pt.as_tensor(mean) + pt.as_tensor(chol) @ z
            weights.append(pm.Deterministic(s.var, flat.reshape(s.shape), dims=s.dims))
        _bernoulli_likelihood(mlp_logit(x, weights, pt.tanh), y_data)
    return model


def build_hierarchical_model(
    X_padded: np.ndarray,
    y: np.ndarray,
    valid: np.ndarray,
    group_names: Sequence[str],
    features: Sequence[str],
    hidden_layers: Sequence[int],
) -> pm.Model:
    """Non-centred hierarchical BNN over all groups.

    ``X_padded`` is ``(group, row, feature)`` (see :class:`hbnn.data.Padded`);
    ``valid`` lists the flattened ``group*row`` positions of real rows and ``y``
    their labels. Only those positions enter the likelihood, so padding rows
    contribute nothing. Per layer: ``mu ~ N(0, 1)`` per weight, ``sd ~
    HalfNormal(1)``, ``z[g] ~ N(0, 1)`` and ``w[g] = mu + sd * z[g]``.

    The likelihood is the Bernoulli-logit log density written out (see
    :func:`_bernoulli_logit_logp`); benchmarks/grad_forms.py compares this
    graph with the alternatives under nutpie's numba backend.
    """
    specs = layer_specs(len(features), hidden_layers)
    coords = layer_coords(features, hidden_layers)
    coords["group"] = list(group_names)
    ragged = valid.size != X_padded.shape[0] * X_padded.shape[1]
    with pm.Model(coords=coords) as model:
        x = pm.Data("x", X_padded, dims=("group", "row", "feature"))
        y_data = pm.Data("y", y, dims="obs")
        weights = []
        for s in specs:
            mu = pm.Normal(f"mu_{s.name}", 0.0, 1.0, dims=s.dims)
            sd = pm.HalfNormal(f"sd_{s.name}", 1.0)
            z = pm.Normal(f"z_{s.name}", 0.0, 1.0, dims=("group", *s.dims))
            weights.append(pm.Deterministic(s.var, mu + sd * z, dims=("group", *s.dims)))
        logit = mlp_logit(x, weights, pt.tanh).reshape((-1,))
        if ragged:
            logit = logit[pt.as_tensor(valid)]
        # An observed CustomDist keeps ``y_obs`` an observed variable (unlike pm.Potential).
        pm.CustomDist("y_obs", logit, logp=_bernoulli_logit_logp, observed=y_data, dims="obs")
    return model
