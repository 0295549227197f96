"""The ``bernoulli`` likelihood: 0/1 labels, the network's output the logit of ``P(y = 1)``."""

from __future__ import annotations

import numpy as np

from hbnn.errors import InputError, rows_phrase
from hbnn.model.likelihoods.base import EPS, QUANTILES, Likelihood


class Bernoulli(Likelihood):
    """0/1 labels; the network output is the logit of ``P(y = 1)``."""

    name = "bernoulli"
    summary_arrays = 3
    classifier = True
    score = "accuracy"
    score_keys = ("accuracy", "log_loss", "brier", "n")
    label_dtype = np.int64
    surface_titles = ("posterior mean P(y=1)", "posterior sd of P(y=1)")
    description = "Bernoulli likelihood on the logit"
    quantity_words = "predicted test probabilities"
    quantity = "p"
    density_source = """\
from hbnn.density.numerics import _bernoulli_logit


def _likelihood_rows(out, y, dlogit, n, e, bits, extra):
    return _bernoulli_logit(out, y, dlogit, n, e, bits), 0.0
"""

    def check_labels(self, values, column, where):
        """Check that every label is 0 or 1; return them as int64.

        Parameters
        ----------
        values : numpy.ndarray
            Finite label values as read.
        column : str
            The label column, for messages.
        where : str
            The file (and rows) read, for messages.

        Returns
        -------
        numpy.ndarray
            The labels in :attr:`label_dtype`.

        Raises
        ------
        hbnn.errors.InputError
            Where a value is not a valid label for this likelihood.
        """
        bad = np.flatnonzero((values != 0) & (values != 1))
        if bad.size:
            shown = sorted({float(v) for v in values[bad]})[:5]
            raise InputError(f"{where}: label column {column!r} must hold 0 or 1 for model.likelihood=bernoulli; "
                             f"found {shown} in {rows_phrase(bad)}")
        return values.astype(np.int64)

    def check_group(self, name, y_train, where):
        """Check that a group's training labels hold both classes (a classifier needs both).

        Parameters
        ----------
        name : str
            The group, for messages.
        y_train : numpy.ndarray
            Its training labels.
        where : str
            The file read, for messages.

        Raises
        ------
        hbnn.errors.InputError
            Where the labels cannot be fitted.
        """
        classes = np.unique(y_train)
        if classes.size < 2:
            raise InputError(f"{where}: group {name!r} has only class {int(classes[0])} among its {y_train.size} "
                             "training rows; a classifier needs both 0 and 1 in every group. Drop the group or add "
                             "rows")

    def strata(self, y):
        """The label itself: a table's seeded split keeps each class's share in every group.

        Parameters
        ----------
        y : numpy.ndarray
            The table's labels.

        Returns
        -------
        numpy.ndarray
            An integer stratum per row.
        """
        return np.asarray(y)

    def add_observed(self, output, y, noise_sd, total_size=None):
        """``y * logit - softplus(logit)`` as an observed ``CustomDist``.

        Exact, with gradient ``y - sigmoid(logit)`` finite for every logit, and
        cheaper per gradient under numba (benchmarks/FINDINGS.md).
        ``pm.Bernoulli(logit_p=...)`` goes through ``log(sigmoid)`` and
        ``log1p(-sigmoid)``: once the sigmoid rounds to 1 its gradient is NaN,
        which NUTS reports as a divergence and ADVI cannot survive.

        Parameters
        ----------
        output : pytensor.tensor.TensorVariable
            The network's output per row.
        y : pytensor.tensor.TensorVariable
            The labels, as the model sees them.
        noise_sd : float
            The extra parameter's prior scale (``model.noise_sd``).
        total_size : optional
            With a minibatch, the rows the batch represents: the log-likelihood is scaled by
            ``total_size / batch``.
        """
        import pymc as pm
        import pytensor.tensor as pt

        def logp(value, logit):
            return value * logit - pt.softplus(logit)

        kwargs = {"dims": "obs"} if total_size is None else {"total_size": [total_size]}
        pm.CustomDist("y_obs", output, logp=logp, observed=y, **kwargs)

    def mean(self, output, y_mean=0.0, y_sd=1.0):
        """``P(y = 1)``: the sigmoid of the output (the label's scale plays no part).

        Parameters
        ----------
        output : numpy.ndarray
            Network outputs.
        y_mean, y_sd : float, optional
            The labels' training mean and sd, where labels are standardised.

        Returns
        -------
        numpy.ndarray
            The quantity, of ``output``'s shape.
        """
        from scipy.special import expit  # SciPy where the scores are computed: check_params needs none of it

        return expit(output)

    def log_density(self, draws, noise, y):
        """``y log p + (1 - y) log(1 - p)``, with ``p`` clipped to ``[EPS, 1 - EPS]`` as in the log loss.

        Parameters
        ----------
        draws : numpy.ndarray
            Draws of the function-space quantity in the label's units, ``(..., n)``.
        noise : numpy.ndarray or None
            Draws of the extra parameter in the label's units, ``(...)``; ``None`` without one.
        y : numpy.ndarray
            The labels in their own units, ``(n,)``.

        Returns
        -------
        numpy.ndarray
            ``(..., n)``.
        """
        p = np.clip(draws, EPS, 1 - EPS)
        return np.where(y == 1, np.log(p), np.log1p(-p))

    def pointwise(self, draws, noise, y):
        """``p_bar``, the posterior-mean ``P(y = 1)`` per row, and ``y``.

        Parameters
        ----------
        draws : numpy.ndarray
            Draws of the function-space quantity in the label's units, ``(chain, draw, n)``.
        noise : numpy.ndarray or None
            Draws of the extra parameter in the label's units, ``(chain, draw)``; ``None`` without one.
        y : numpy.ndarray
            The labels in their own units, ``(n,)``.

        Returns
        -------
        dict of str to numpy.ndarray
            Per-row values by name, each ``(n,)``.
        """
        return {"p_bar": draws.mean(axis=(0, 1)), "y": y}

    def scores(self, point):
        """Accuracy (``p_bar > 0.5``), log loss and Brier score over the rows.

        Parameters
        ----------
        point : dict of str to numpy.ndarray
            :meth:`pointwise`'s output, concatenated over groups for pooled scores.

        Returns
        -------
        dict of str to float
            The :attr:`score_keys`.
        """
        p_bar, y = point["p_bar"], point["y"]
        p = np.clip(p_bar, EPS, 1 - EPS)
        return {
            "accuracy": float(np.mean((p_bar > 0.5) == (y == 1))),
            "log_loss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))),
            "brier": float(np.mean((p_bar - y) ** 2)),
            "n": int(y.size),
        }

    def summarise(self, draws, noise):
        """Posterior mean, sd and central 94% interval of ``P(y = 1)``.

        Parameters
        ----------
        draws : numpy.ndarray
            Draws of the function-space quantity in the label's units, ``(sample, n)``.
        noise : numpy.ndarray or None
            Draws of the extra parameter in the label's units, ``(sample,)``; ``None`` without one.

        Returns
        -------
        dict of str to numpy.ndarray
            ``mean``, ``sd``, ``lower_94`` and ``upper_94`` per row.
        """
        lower, upper = np.quantile(draws, QUANTILES, axis=0)
        return {"mean": draws.mean(axis=0), "sd": draws.std(axis=0), "lower_94": lower, "upper_94": upper}
