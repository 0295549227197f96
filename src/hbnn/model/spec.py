"""What a model is, as the layers below the stages take it (:class:`ModelSpec`).

A stage turns its params into one :class:`ModelSpec` (:meth:`ModelSpec.of`) and hands that down: the builders'
arguments, the hand-written density's, the layers of the network (:attr:`ModelSpec.layers`, computed once), the
activation that scoring and the prior's unit matching need. Code that fits a model from Python builds the same spec
from keyword arguments.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from hbnn.model.network import LayerSpec, layer_specs


@dataclass(frozen=True)
class ModelSpec:
    """A BNN: its inputs, network and likelihood.

    Parameters
    ----------
    features : tuple of str
        The feature columns, in the order the network reads them.
    hidden_layers : tuple of int
        Units per hidden layer; empty for a linear model.
    likelihood : str, default "bernoulli"
        A registered likelihood (:mod:`hbnn.model.likelihoods`).
    activation : str, default "tanh"
        A registered activation of the hidden units (:mod:`hbnn.model.activations`).
    bias : bool, default False
        A bias per hidden and output unit.
    noise_sd : float, default 1.0
        Scale of the ``HalfNormal`` prior of the likelihood's extra parameter, where it has one.
    prior_sd : float, default 1.0
        Scale of the flat network's ``Normal(0, prior_sd)`` weight prior.
    noise : str, default "shared"
        The hierarchical gaussian model's noise sd: ``shared`` by the groups, or one per ``group``.
    """

    features: tuple[str, ...]
    hidden_layers: tuple[int, ...]
    likelihood: str = "bernoulli"
    activation: str = "tanh"
    bias: bool = False
    noise_sd: float = 1.0
    prior_sd: float = 1.0
    noise: str = "shared"

    def __post_init__(self):
        object.__setattr__(self, "features", tuple(str(f) for f in self.features))
        object.__setattr__(self, "hidden_layers", tuple(int(h) for h in self.hidden_layers))

    @classmethod
    def of(cls, model, features: Sequence[str]) -> ModelSpec:
        """The spec of params' ``model`` section (:class:`hbnn.config.ModelParams`) on ``features``.

        Parameters
        ----------
        model : hbnn.config.ModelParams
            The checked ``model`` params.
        features : sequence of str
            The data's feature columns.

        Returns
        -------
        ModelSpec
        """
        return cls(tuple(features), tuple(model.hidden_layers), model.likelihood, model.activation, model.bias,
                   model.noise_sd, model.prior_sd, model.noise)

    @property
    def n_features(self) -> int:
        """The number of input features."""
        return len(self.features)

    @functools.cached_property
    def layers(self) -> tuple[LayerSpec, ...]:
        """The network's weight matrices (:func:`hbnn.model.network.layer_specs`), computed once per spec."""
        return tuple(layer_specs(self.n_features, self.hidden_layers, self.bias))
