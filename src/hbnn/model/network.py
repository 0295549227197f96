"""The network's layout and forward pass, in plain NumPy (no PyMC, so stages that only read draws stay light).

Layer naming follows the maths: ``w_in`` maps features to the first hidden
layer, ``w_h1_h2`` hidden layer 1 to 2 (and so on), ``w_out`` the last hidden
layer to the output. With no hidden layers ``w_out`` maps the features straight
to the output (a linear model). :func:`mlp_logit` also takes PyTensor tensors
(with the activation's PyTensor function, :meth:`hbnn.model.activations.base.Activation.pytensor`), so the PyMC
models in :mod:`hbnn.model.builders` share it.

With biases (``model.bias: true``) each layer's matrix has one more input row,
the bias of each of its units: ``w_in`` is ``(feature_and_bias, hidden_1)``,
whose last row (coordinate ``bias``) holds the first layer's biases, and so on
to ``w_out``, whose last entry is the output's bias. Biases are thus part of
their layer everywhere a layer is handled whole (its prior, the hierarchical
``mu``/``sd``/``z``, the informed prior's multivariate normal, the unit
relabelling of :mod:`hbnn.model.prior`).
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


def layer_specs(n_features: int, hidden_layers: Sequence[int], bias: bool = False) -> list[LayerSpec]:
    """Layers of an MLP ``features -> hidden_layers... -> 1 output``; with ``bias``, each with a bias row.

    Empty ``hidden_layers`` gives the single layer ``out`` with dims ``(feature,)``
    (``(feature_and_bias,)`` with a bias).
    """
    sizes = [n_features, *hidden_layers]
    dims = ["feature"] + [f"hidden_{i + 1}" for i in range(len(hidden_layers))]
    inputs = [f"{d}{BIAS_SUFFIX}" if bias else d for d in dims]
    extra = int(bias)
    specs = []
    for i in range(len(hidden_layers)):
        name = "in" if i == 0 else f"h{i}_h{i + 1}"
        specs.append(LayerSpec(name, (inputs[i], dims[i + 1]), (sizes[i] + extra, sizes[i + 1])))
    specs.append(LayerSpec("out", (inputs[-1],), (sizes[-1] + extra,)))
    return specs


BIAS_SUFFIX = "_and_bias"  # the input dim of a layer with a bias row: feature_and_bias, hidden_1_and_bias, ...
BIAS = "bias"  # that row's coordinate


def layer_coords(features: Sequence[str], hidden_layers: Sequence[int],
                 groups: Sequence[str] | None = None, bias: bool = False) -> dict[str, list]:
    """Coordinates for the feature and hidden-unit dims (and their ``_and_bias`` input dims with ``bias``), and
    the ``group`` dim when ``groups`` is given."""
    coords: dict[str, list] = {"feature": list(features)}
    for i, h in enumerate(hidden_layers):
        coords[f"hidden_{i + 1}"] = list(range(h))
    if bias:
        coords[f"feature{BIAS_SUFFIX}"] = [*map(str, features), BIAS]
        for i, h in enumerate(hidden_layers):
            coords[f"hidden_{i + 1}{BIAS_SUFFIX}"] = [*map(str, range(h)), BIAS]
    if groups is not None:
        coords["group"] = list(groups)
    return coords


def has_bias(specs: Sequence[LayerSpec]) -> bool:
    """Whether the layers of :func:`layer_specs` carry bias rows."""
    return specs[0].dims[0].endswith(BIAS_SUFFIX)


def mlp_logit(x, weights: Sequence, activation: Callable = np.tanh, bias: bool | None = None):
    """Forward pass of the MLP, for NumPy arrays or PyTensor tensors.

    ``x`` is ``(..., n, feature)``; ``weights`` follow :func:`layer_specs`, each with
    optional leading batch dims (draws, groups) that broadcast against ``x``'s
    leading dims. Returns the outputs ``(..., n)`` (a logit, a mean, a log rate: the
    likelihood says). ``activation``: the hidden units' function, element-wise. ``bias``: whether each layer's
    last input row is its bias; ``None`` reads it from the shapes (NumPy arrays only:
    a layer with one more input row than its input has units has a bias row).
    """
    if bias is None:
        bias = weights[0].shape[-2 if len(weights) > 1 else -1] == x.shape[-1] + 1
    h = x
    # The bias row is indexed and given a new axis, not sliced: PyTensor then knows that axis broadcasts.
    for w in weights[:-1]:
        h = activation(h @ w[..., :-1, :] + w[..., -1, :][..., None, :]) if bias else activation(h @ w)
    out = weights[-1]
    if bias:
        return (h @ out[..., :-1, None])[..., 0] + out[..., -1][..., None]
    return (h @ out[..., None])[..., 0]
