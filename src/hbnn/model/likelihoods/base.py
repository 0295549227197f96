"""What every likelihood decides (:class:`Likelihood`), and what the predictive likelihoods share.

The scores shared by the likelihoods scored by their posterior predictive (:class:`Predictive`), and the
predictive interval they report (:data:`INTERVAL`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

EPS = 1e-12  # probabilities are clipped to [EPS, 1 - EPS] in log scores, where 0 or 1 would give an infinite loss


INTERVAL = 0.94  # central posterior (predictive) interval reported by metrics and predictions


QUANTILES = ((1 - INTERVAL) / 2, (1 + INTERVAL) / 2)  # the interval's ends, so every caller cuts the same tails


HALFNORMAL_CONST = math.log(2.0) - 0.5 * math.log(2.0 * math.pi)  # HalfNormal(1)'s log density at 0: a constant term


class Likelihood:
    """What a likelihood decides; subclasses set the class attributes and override the methods.

    Its part of the hand-written log density (:mod:`hbnn.density`), which nutpie samples instead of PyTensor's
    compile of the PyMC model, is :attr:`density_source` and :meth:`density_constant`; a likelihood without them
    is sampled with PyMC's density. Its *extra parameter* (:attr:`extra`) is the one positive parameter a likelihood
    may add to the model, with prior ``HalfNormal(model.noise_sd)``: gaussian's noise sd, negative_binomial's
    dispersion. The hand-written density samples it on the log scale as PyMC does (``<extra>_log__``, the last value
    variable) and adds its prior and log-Jacobian itself.
    """

    name: ClassVar[str]
    classifier: ClassVar[bool] = False  # scores of P(y = 1); the report draws calibration and accuracy
    score: ClassVar[str]  # the headline score: test.<score>
    score_keys: ClassVar[tuple[str, ...]]  # every score key of a split, headline first (and "n")
    label_dtype: ClassVar[type] = np.float64  # what check_labels returns: counts and classes are exact as integers
    standardise_labels: ClassVar[bool] = False  # labels are standardised with the training mean and sd
    extra: ClassVar[str | None] = None  # the extra parameter's name (``sigma``, ``alpha``); None: the output says all
    surface_titles: ClassVar[tuple[str, str]]  # the report's titles of mean and sd surfaces
    quantity: ClassVar[str]  # name of the function-space quantity in a trace's ``predictions`` group
    description: ClassVar[str]  # the report's one-phrase account of the likelihood
    quantity_words: ClassVar[str]  # the report's name for the function-space quantity at test rows, plural
    density_source: ClassVar[str | None] = None  # the row terms of the hand-written density (below); None: PyMC's
    # (draw, row) float64 arrays alive at once while hbnn predict summarises rows (:meth:`summarise`), which sizes
    # its chunks: the peak measured with tracemalloc, rounded up with one to spare (tests/test_likelihoods.py holds
    # each likelihood to it; benchmarks/FINDINGS.md, "Measurements behind code comments")
    summary_arrays: ClassVar[int]

    def check_labels(self, values: np.ndarray, column: str, where: str) -> np.ndarray:
        """Check a column's label values and return them in :attr:`label_dtype`.

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
        return values.astype(self.label_dtype)

    def check_group(self, name: str, y_train: np.ndarray, where: str) -> None:
        """Check that a group's training labels can be fitted (default: any can).

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

    def strata(self, y: np.ndarray) -> np.ndarray:
        """Strata of a seeded train/test split of a table (default: none).

        Parameters
        ----------
        y : numpy.ndarray
            The table's labels.

        Returns
        -------
        numpy.ndarray
            An integer stratum per row.
        """
        return np.zeros(y.size, dtype=np.int64)

    def add_observed(self, output, y, noise_sd: float, total_size=None) -> None:
        """Add ``y_obs`` (and any extra parameter, :meth:`add_extra`) to the current PyMC model.

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
        raise NotImplementedError

    def add_extra(self, noise_sd: float):
        """The extra parameter, ``HalfNormal(noise_sd)``, added to the current PyMC model (where :attr:`extra` is set).

        Parameters
        ----------
        noise_sd : float
            The prior's scale (``model.noise_sd``).

        Returns
        -------
        pytensor.tensor.TensorVariable
            The parameter, for the likelihood's term.
        """
        import pymc as pm

        return pm.HalfNormal(self.extra, noise_sd)

    def extra_in_label_units(self, values: np.ndarray, y_sd: float) -> np.ndarray:
        """Draws of the extra parameter in the label's units, as the scores and predictions take them.

        Parameters
        ----------
        values : numpy.ndarray
            The draws as sampled.
        y_sd : float
            The labels' training sd.

        Returns
        -------
        numpy.ndarray
            Default: as sampled; a parameter on the standardised label scale is multiplied by ``y_sd``.
        """
        return values

    def density_constant(self, y: np.ndarray, noise_sd: float) -> float:
        """The log-likelihood's terms that depend on neither the weights nor the extra parameter.

        The hand-written density adds them (and the extra parameter prior's constant) once.

        Parameters
        ----------
        y : numpy.ndarray
            The labels of every real row, as the model sees them.
        noise_sd : float
            The extra parameter's prior scale.

        Returns
        -------
        float
            The constant; with an extra parameter it includes ``HALFNORMAL_CONST - log(noise_sd)``.
        """
        return 0.0

    def mean(self, output: np.ndarray, y_mean: float = 0.0, y_sd: float = 1.0) -> np.ndarray:
        """The function-space quantity, in the label's units, from network outputs.

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
        raise NotImplementedError

    def mean_label(self, y: np.ndarray, y_mean: float = 0.0, y_sd: float = 1.0) -> np.ndarray:
        """Stored (model-scale) labels back in the label's units.

        Parameters
        ----------
        y : numpy.ndarray
            Labels as the model sees them.
        y_mean, y_sd : float, optional
            The labels' training mean and sd, where labels are standardised.

        Returns
        -------
        numpy.ndarray
            The labels in their own units.
        """
        return y_mean + y_sd * y if self.standardise_labels else y

    def log_density(self, draws: np.ndarray, noise: np.ndarray | None, y: np.ndarray) -> np.ndarray:
        """``log p(y_i | draw)`` per draw and row: the pointwise log-likelihood PSIS-LOO and ``lpd`` use.

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
        raise NotImplementedError

    def predictive_draws(self, draws: np.ndarray, noise: np.ndarray | None,
                         rng: np.random.Generator) -> np.ndarray | None:
        """One draw of a new label per posterior draw and row.

        Parameters
        ----------
        draws : numpy.ndarray
            Draws of the function-space quantity in the label's units, ``(..., n)``.
        noise : numpy.ndarray or None
            Draws of the extra parameter in the label's units, ``(...)``; ``None`` without one.
        rng : numpy.random.Generator
            The source of the draws.

        Returns
        -------
        numpy.ndarray or None
            Labels of ``draws``' shape; ``None`` where the quantity says it all.
        """
        return None

    def pointwise(self, draws: np.ndarray, noise: np.ndarray | None, y: np.ndarray) -> dict[str, np.ndarray]:
        """Per-row values the scores are means of.

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
        raise NotImplementedError

    def scores(self, point: dict[str, np.ndarray]) -> dict[str, float]:
        """Scores over the rows of :meth:`pointwise` output.

        Parameters
        ----------
        point : dict of str to numpy.ndarray
            :meth:`pointwise`'s output, concatenated over groups for pooled scores.

        Returns
        -------
        dict of str to float
            The :attr:`score_keys`.
        """
        raise NotImplementedError

    def summarise(self, draws: np.ndarray, noise: np.ndarray | None) -> dict[str, np.ndarray]:
        """``hbnn predict``'s summary of each row.

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
        raise NotImplementedError


def mixture_cdf(y: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Posterior-predictive CDF of an equal-weight mixture of normals: ``mean_s Phi((y - mu[s]) / sigma[s])``.

    Parameters
    ----------
    y : numpy.ndarray
        Where to evaluate it, ``(n,)``.
    mu : numpy.ndarray
        The components' means, ``(sample, n)``.
    sigma : numpy.ndarray
        The components' sds, ``(sample,)``.

    Returns
    -------
    numpy.ndarray
        The CDF per row, ``(n,)``.
    """
    from scipy.special import ndtr

    return ndtr((y[None, :] - mu) / sigma[:, None]).mean(axis=0)


def mixture_quantiles(mu: np.ndarray, sigma: np.ndarray, qs: Sequence[float], iters: int = 80) -> np.ndarray:
    """Quantiles of the normal mixture of :func:`mixture_cdf`, by bisection.

    The bracket ``[min mu - 10 max sigma, max mu + 10 max sigma]`` holds every quantile in
    ``(1e-20, 1 - 1e-20)``; 80 halvings shrink it far below float resolution of the values involved.

    Parameters
    ----------
    mu : numpy.ndarray
        The components' means, ``(sample, n)``.
    sigma : numpy.ndarray
        The components' sds, ``(sample,)``.
    qs : sequence of float
        The probabilities.
    iters : int, optional
        Halvings of the bracket.

    Returns
    -------
    numpy.ndarray
        ``(len(qs), n)``.
    """
    lo0 = mu.min(axis=0) - 10 * sigma.max()
    hi0 = mu.max(axis=0) + 10 * sigma.max()
    out = []
    for q in qs:
        lo, hi = lo0.copy(), hi0.copy()
        for _ in range(iters):
            mid = (lo + hi) / 2
            below = mixture_cdf(mid, mu, sigma) < q
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        out.append((lo + hi) / 2)
    return np.array(out)


class Predictive(Likelihood):
    """A likelihood scored by its posterior predictive (regression, counts): RMSE, lpd and 94% coverage.

    Subclasses' :meth:`pointwise` give per row ``sq_err`` (of the posterior-mean
    prediction), ``lpd`` (log mean predictive density over draws) and
    ``covered`` (inside the central 94% predictive interval).
    """

    score = "rmse"
    score_keys = ("rmse", "lpd", "coverage_94", "n")
    noise_words: ClassVar[str]  # the report's name for the predictive noise the surfaces leave out

    def scores(self, point):
        """RMSE of the posterior-mean prediction, mean lpd and 94% coverage over the rows of :meth:`pointwise` output.

        Parameters
        ----------
        point : dict of str to numpy.ndarray
            ``sq_err``, ``lpd`` and ``covered`` per row, concatenated over groups for pooled scores.

        Returns
        -------
        dict of str to float
            ``rmse``, ``lpd``, ``coverage_94`` and ``n``.
        """
        return {
            "rmse": float(np.sqrt(np.mean(point["sq_err"]))),
            "lpd": float(np.mean(point["lpd"])),
            "coverage_94": float(np.mean(point["covered"])),
            "n": int(point["sq_err"].size),
        }
