"""The hidden units' activations, one module each, looked up by name (``model.activation``).

- ``tanh`` (the default): smooth and odd, so a hidden unit's sign flip leaves the network's function unchanged;
  the informed prior matches units across chains by permutations and sign flips.
- ``relu``: ``max(x, 0)``, piecewise linear and not odd: units are matched by permutations only.

A new activation is one new module beside these whose class is registered in :data:`ACTIVATIONS`
(:class:`~hbnn.model.activations.base.Activation` says what it provides).
"""

from __future__ import annotations

from hbnn.errors import InputError
from hbnn.model.activations.base import Activation
from hbnn.model.activations.relu import Relu
from hbnn.model.activations.tanh import Tanh

__all__ = ["ACTIVATIONS", "Activation", "Relu", "Tanh", "get"]

ACTIVATIONS: dict[str, Activation] = {act.name: act for act in (Tanh(), Relu())}


def get(name: str) -> Activation:
    """The activation called ``name``.

    Parameters
    ----------
    name : str
        ``model.activation``, or the ``activation`` setting of a trace.

    Returns
    -------
    Activation
        The registered activation.

    Raises
    ------
    InputError
        Where no activation has that name.
    """
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise InputError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}") from None
