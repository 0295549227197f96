"""The network's layout and forward pass, in plain NumPy (no PyMC, so stages that only read draws stay light).

Layer naming follows the maths: ``w_in`` maps features to the first hidden
layer, ``w_h1_h2`` hidden layer 1 to 2 (and so on), ``w_out`` the last hidden
layer to the output. With no hidden layers ``w_out`` maps the features straight
to the output (a linear model). :func:`mlp_logit` also takes PyTensor tensors
(with ``tanh=pt.tanh``), so the PyMC models in :mod:`hbnn.models` share it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


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
    """Layers of an MLP ``features -> hidden_layers... -> 1 output`` (no biases).

    Empty ``hidden_layers`` gives the single layer ``out`` with dims ``(feature,)``.
    """
    sizes = [n_features, *hidden_layers]
    dims = ["feature"] + [f"hidden_{i + 1}" for i in range(len(hidden_layers))]
    specs = []
    for i in range(len(hidden_layers)):
        name = "in" if i == 0 else f"h{i}_h{i + 1}"
        specs.append(LayerSpec(name, (dims[i], dims[i + 1]), (sizes[i], sizes[i + 1])))
    specs.append(LayerSpec("out", (dims[-1],), (sizes[-1],)))
    return specs


def layer_coords(features: Sequence[str], hidden_layers: Sequence[int],
                 groups: Sequence[str] | None = None) -> dict[str, list]:
    """Coordinates for the feature and hidden-unit dims, and the ``group`` dim when ``groups`` is given."""
    coords: dict[str, list] = {"feature": list(features)}
    for i, h in enumerate(hidden_layers):
        coords[f"hidden_{i + 1}"] = list(range(h))
    if groups is not None:
        coords["group"] = list(groups)
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
