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
    """One weight matrix of the network.

    Parameters
    ----------
    name : str
        The layer's name: ``in``, ``h1_h2`` (and so on), ``out``.
    dims : tuple of str
        The matrix's dims, input dim first (``feature_and_bias`` etc. with a bias row).
    shape : tuple of int
        The matrix's shape.
    """

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]

    @property
    def var(self) -> str:
        """The model variable holding the layer's weights, ``w_<name>``."""
        return f"w_{self.name}"

    @property
    def size(self) -> int:
        """The number of weights in the layer."""
        return int(np.prod(self.shape))


def layer_specs(n_features: int, hidden_layers: Sequence[int], bias: bool = False) -> list[LayerSpec]:
    """Layers of an MLP ``features -> hidden_layers... -> 1 output``.

    Parameters
    ----------
    n_features : int
        The number of input features.
    hidden_layers : sequence of int
        Units per hidden layer; empty gives the single layer ``out`` with dims ``(feature,)``
        (``(feature_and_bias,)`` with a bias): a linear model.
    bias : bool, optional
        Whether each layer has a bias row.

    Returns
    -------
    list of LayerSpec
        The layers, input to output.
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


BIAS_SUFFIX = "_and_bias"  # names the input dim of a layer with a bias row, so its coordinates differ from the inputs'
BIAS = "bias"  # that row's coordinate, so the bias row is found by name in the draws


def layer_coords(features: Sequence[str], hidden_layers: Sequence[int],
                 groups: Sequence[str] | None = None, bias: bool = False) -> dict[str, list]:
    """Coordinates of the network's dims.

    Parameters
    ----------
    features : sequence of str
        The feature columns.
    hidden_layers : sequence of int
        Units per hidden layer.
    groups : sequence of str or None, optional
        The group names, for a ``group`` dim.
    bias : bool, optional
        Whether to add the ``_and_bias`` input dims (the inputs' coordinates and :data:`BIAS`).

    Returns
    -------
    dict of str to list
        Coordinates per dim name.
    """
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
    """Whether the layers of :func:`layer_specs` carry bias rows.

    Parameters
    ----------
    specs : sequence of LayerSpec
        The network's layers.

    Returns
    -------
    bool
        Whether the first layer's input dim has the bias suffix.
    """
    return specs[0].dims[0].endswith(BIAS_SUFFIX)


def mlp_logit(x, weights: Sequence, activation: Callable = np.tanh, bias: bool | None = None):
    """Forward pass of the MLP, for NumPy arrays or PyTensor tensors.

    Parameters
    ----------
    x : array or tensor
        The inputs, ``(..., n, feature)``.
    weights : sequence of arrays or tensors
        The layers' weights in the order and shapes of :func:`layer_specs`, each with optional leading batch
        dims (draws, groups) that broadcast against ``x``'s leading dims.
    activation : callable, optional
        The hidden units' function, element-wise.
    bias : bool or None, optional
        Whether each layer's last input row is its bias; ``None`` reads it from the shapes (NumPy arrays only:
        a layer with one more input row than its input has units has a bias row).

    Returns
    -------
    array or tensor
        The outputs ``(..., n)``: a logit, a mean or a log rate, as the likelihood says.
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
