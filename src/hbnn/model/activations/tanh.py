"""The ``tanh`` activation: smooth, bounded and odd, so a unit's sign flip is a symmetry of the network."""

from __future__ import annotations

import numpy as np

from hbnn.model.activations.base import Activation


class Tanh(Activation):
    """``tanh``, compiled without library calls so that the loops over rows vectorise.

    Its compiled versions are :mod:`hbnn.density.numerics`' float32 rational function (within 3.5e-7)
    and float64 ``exp``-based one (within 2.3e-16), both free of library calls so that the loops over rows
    vectorise."""

    name = "tanh"
    sign_symmetric = True
    compiled_source = '''\
from hbnn.density.numerics import _F1, _tanh64_inplace, _tanh_inplace


def _activation_inplace(a, n):
    _tanh_inplace(a, n)


def _activation_inplace64(a, n, e, bits):
    _tanh64_inplace(a, n, e, bits)


def _activation_slope(h):
    return _F1 - h * h
'''

    def numpy(self, x):
        """``tanh(x)``, element-wise, in NumPy.

        Parameters
        ----------
        x : numpy.ndarray
            Pre-activations of any shape.

        Returns
        -------
        numpy.ndarray
            ``f(x)``, of ``x``'s shape.
        """
        return np.tanh(x)

    def pytensor(self, x):
        """``tanh(x)``, element-wise, for the PyMC models.

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

        return pt.tanh(x)
