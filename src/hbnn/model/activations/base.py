"""What every activation of the hidden units decides (:class:`Activation`).

An activation is the function, once for each place the network is computed: NumPy (:meth:`Activation.numpy`),
PyTensor for the PyMC models (:meth:`Activation.pytensor`), and numba for the compiled passes
(:attr:`Activation.compiled_source`): the hand-written log density (:mod:`hbnn.density`) and the forward pass that
scores posterior draws (:mod:`hbnn.model.forward`). It also says whether flipping a unit's sign is a symmetry of
the network, which the informed prior's unit matching asks (:mod:`hbnn.model.prior`).

The compiled source is Python text that numba compiles inside the generated modules (each top-level function
with ``fastmath``, ``error_model="numpy"`` and ``inline="always"``; the modules provide ``math``, ``np`` and
``numba``, and the text imports anything else itself). It defines

- ``_activation_inplace(a, n)``: ``a[:n] = f(a[:n])`` for a float32 array, every constant a float32 (a Python
  float would turn the loop into float64);
- ``_activation_inplace64(a, n, e, bits)``: the same in float64, with ``e`` (float64) and ``bits`` (int64) of at
  least ``n`` values of scratch;
- ``_activation_slope(h)``: ``f'`` at the point whose activation is ``h``, from ``h`` alone (float32), which is what
  backpropagation keeps (tanh: ``1 - h**2``; relu: 1 where ``h > 0``).

An activation without it (``None``) is still a model: PyMC's density is sampled and NumPy scores the draws.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np


class Activation:
    """What an activation decides; subclasses set the class attributes and the two functions.

    The class attributes: :attr:`name` (what ``model.activation`` says), :attr:`sign_symmetric` (whether a unit's
    sign flip is a symmetry of the network) and :attr:`compiled_source` (the numba text of the module docstring).
    """

    name: ClassVar[str]
    sign_symmetric: ClassVar[bool]  # f(-x) = -f(x): a unit's weights in and out may flip sign together
    compiled_source: ClassVar[str | None] = None  # the numba text (module docstring); None: PyMC's and NumPy's

    def numpy(self, x: np.ndarray) -> np.ndarray:
        """The activation of ``x``, element-wise, in NumPy.

        Parameters
        ----------
        x : numpy.ndarray
            Pre-activations of any shape.

        Returns
        -------
        numpy.ndarray
            ``f(x)``, of ``x``'s shape.
        """
        raise NotImplementedError

    def pytensor(self, x):
        """The activation of the PyTensor tensor ``x``, element-wise, for the PyMC models.

        Parameters
        ----------
        x : pytensor.tensor.TensorVariable
            Pre-activations.

        Returns
        -------
        pytensor.tensor.TensorVariable
            ``f(x)``.
        """
        raise NotImplementedError
