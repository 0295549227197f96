"""The ``relu`` activation: ``max(x, 0)``, piecewise linear and not odd, so only permutations relabel its units."""

from __future__ import annotations

import numpy as np

from hbnn.model.activations.base import Activation


class Relu(Activation):
    """``max(x, 0)``, whose units are matched across chains by permutations only.

    Flipping a unit's sign changes the network's function (``relu(-x) != -relu(x)``), so the
    informed prior matches relu units across chains by permutations only. The compiled backward pass knows a
    unit only by its output ``h``, so its slope is 1 where ``h > 0`` and 0 elsewhere, at exactly ``x = 0`` too
    (a point of measure zero, where PyTensor's gradient says 1)."""

    name = "relu"
    sign_symmetric = False
    compiled_source = '''\
from hbnn.density.numerics import _F0, _F1


def _activation_inplace(a, n):
    for i in range(n):
        a[i] = max(a[i], _F0)


def _activation_inplace64(a, n, e, bits):
    for i in range(n):
        a[i] = max(a[i], 0.0)


def _activation_slope(h):
    return _F1 if h > _F0 else _F0
'''

    def numpy(self, x):
        """``max(x, 0)``, element-wise, in NumPy.

        Parameters
        ----------
        x : numpy.ndarray
            Pre-activations of any shape.

        Returns
        -------
        numpy.ndarray
            ``f(x)``, of ``x``'s shape.
        """
        return np.maximum(x, 0.0)

    def pytensor(self, x):
        """``max(x, 0)``, element-wise, for the PyMC models.

        Parameters
        ----------
        x : pytensor.tensor.TensorVariable
            Pre-activations.

        Returns
        -------
        pytensor.tensor.TensorVariable
            ``f(x)``.
        """
        import pytensor.tensor as pt

        return pt.maximum(x, 0.0)
