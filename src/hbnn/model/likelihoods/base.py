"""What every likelihood decides (:class:`Likelihood`), the scores shared by the likelihoods scored by their
posterior predictive (:class:`Predictive`), and the predictive interval they report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

EPS = 1e-12  # probabilities are clipped to [EPS, 1 - EPS] in log scores, where 0 or 1 would give an infinite loss


INTERVAL = 0.94  # central posterior (predictive) interval reported by metrics and predictions


QUANTILES = ((1 - INTERVAL) / 2, (1 + INTERVAL) / 2)


HALFNORMAL_CONST = math.log(2.0) - 0.5 * math.log(2.0 * math.pi)  # log density of HalfNormal(1) at 0


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
    label_dtype: ClassVar[type] = np.float64
    standardise_labels: ClassVar[bool] = False  # labels are standardised with the training mean and sd
    extra: ClassVar[str | None] = None  # the extra parameter's name (``sigma``, ``alpha``); None: the output says all
    surface_titles: ClassVar[tuple[str, str]]  # the report's titles of mean and sd surfaces
    quantity: ClassVar[str]  # name of the function-space quantity in a trace's ``predictions`` group
    description: ClassVar[str]  # the report's one-phrase account of the likelihood
    quantity_words: ClassVar[str]  # the report's name for the function-space quantity at test rows, plural
    density_source: ClassVar[str | None] = None  # the row terms of the hand-written density (below); None: PyMC's
    # (draw, row) float64 arrays alive at once while hbnn predict summarises rows (:meth:`summarise`), which sizes
    # its chunks: the peak measured with tracemalloc, rounded up with one to spare (benchmarks/FINDINGS.md)
    summary_arrays: ClassVar[int]

    def check_labels(self, values: np.ndarray, column: str, where: str) -> np.ndarray:
        """Finite label values as read; return them in ``label_dtype`` or raise :class:`InputError`."""
        return values.astype(self.label_dtype)

    def check_group(self, name: str, y_train: np.ndarray, where: str) -> None:
        """Raise :class:`InputError` if a group's training labels cannot be fitted (default: any can)."""

    def strata(self, y: np.ndarray) -> np.ndarray:
        """Strata of a seeded train/test split of a table (default: none)."""
        return np.zeros(y.size, dtype=np.int64)

    def add_observed(self, output, y, noise_sd: float, total_size=None) -> None:
        """Add ``y_obs`` (and any extra parameter, :meth:`add_extra`) to the current PyMC model, given the network
        ``output``.

        With a minibatch, ``total_size`` rows are represented by the batch and the
        log-likelihood is scaled by ``total_size / batch``.
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
        """Draws of the extra parameter in the label's units, as the scores and predictions take them (default: as
        sampled; a parameter on the standardised label scale is multiplied by the labels' training sd ``y_sd``)."""
        return values

    def density_constant(self, y: np.ndarray, noise_sd: float) -> float:
        """The terms of the log-likelihood (and of the extra parameter's prior) that depend on neither the weights
        nor the extra parameter: the hand-written density adds them once.

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
        """The function-space quantity, in the label's units, from network outputs."""
        raise NotImplementedError

    def mean_label(self, y: np.ndarray, y_mean: float = 0.0, y_sd: float = 1.0) -> np.ndarray:
        """Stored (model-scale) labels back in the label's units."""
        return y_mean + y_sd * y if self.standardise_labels else y

    def log_density(self, draws: np.ndarray, noise: np.ndarray | None, y: np.ndarray) -> np.ndarray:
        """``log p(y_i | draw)`` per draw and row, ``(..., n)`` for ``draws (..., n)`` and ``noise (...)``.

        In the label's units: the pointwise log-likelihood that PSIS-LOO and the ``lpd`` score use.
        """
        raise NotImplementedError

    def predictive_draws(self, draws: np.ndarray, noise: np.ndarray | None,
                         rng: np.random.Generator) -> np.ndarray | None:
        """One draw of a new label per posterior draw and row (``None`` where the quantity says it all)."""
        return None

    def pointwise(self, draws: np.ndarray, noise: np.ndarray | None, y: np.ndarray) -> dict[str, np.ndarray]:
        """Per-row values the scores are means of; ``draws (chain, draw, n)``, ``noise (chain, draw)``."""
        raise NotImplementedError

    def scores(self, point: dict[str, np.ndarray]) -> dict[str, float]:
        """Scores over the rows of :meth:`pointwise` output (concatenated over groups for pooled scores)."""
        raise NotImplementedError

    def summarise(self, draws: np.ndarray, noise: np.ndarray | None) -> dict[str, np.ndarray]:
        """``hbnn predict``'s ``mean``, ``sd``, ``lower_94``, ``upper_94`` per row from ``draws (sample, n)``."""
        raise NotImplementedError


def mixture_cdf(y: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Posterior-predictive CDF at ``y (n,)``: ``mean_s Phi((y - mu[s]) / sigma[s])``.

    ``mu`` is ``(sample, n)`` and ``sigma`` ``(sample,)``: an equal-weight mixture of normals.
    """
    from scipy.special import ndtr

    return ndtr((y[None, :] - mu) / sigma[:, None]).mean(axis=0)


def mixture_quantiles(mu: np.ndarray, sigma: np.ndarray, qs: Sequence[float], iters: int = 80) -> np.ndarray:
    """Quantiles ``(len(qs), n)`` of the normal mixture of :func:`mixture_cdf`, by bisection.

    The bracket ``[min mu - 10 max sigma, max mu + 10 max sigma]`` holds every
    quantile in ``(1e-20, 1 - 1e-20)``; 80 halvings shrink it far below float
    resolution of the values involved.
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
        return {
            "rmse": float(np.sqrt(np.mean(point["sq_err"]))),
            "lpd": float(np.mean(point["lpd"])),
            "coverage_94": float(np.mean(point["covered"])),
            "n": int(point["sq_err"].size),
        }
