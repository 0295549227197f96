"""The ``poisson`` likelihood: counts, the network's output the log of the rate."""

from __future__ import annotations

import numpy as np

from hbnn.errors import InputError, rows_phrase
from hbnn.model.likelihoods.base import QUANTILES, Predictive


class Poisson(Predictive):
    """Counts (0, 1, 2, ...: sales, visits, failures); the network output is the log of the rate.

    Labels are not standardised (a count's scale is its meaning). The predictive
    distribution of a row is the mixture over draws of ``Poisson(rate_s)``: its
    central 94% interval ``[lo, hi]`` holds the smallest counts whose mixture CDF
    reaches 0.03 and 0.97, and a row is covered when ``lo <= y <= hi``.
    """

    name = "poisson"
    label_dtype = np.int64
    summary_arrays = 8
    surface_titles = ("posterior mean rate", "posterior sd of the rate")
    description = "Poisson likelihood on the log rate"
    quantity_words = "predicted test rates"
    noise_words = "the Poisson counting noise"
    quantity = "rate"
    # in float64 from the float32 rows; log(y!) is in density_constant
    density_source = """\
def _likelihood_rows(out, y, dlogit, n, e, bits, extra):
    ll = 0.0
    for r in range(n):
        o = np.float64(out[r])
        rate = math.exp(o)
        ll += np.float64(y[r]) * o - rate
        dlogit[r] = y[r] - rate
    return ll, 0.0
"""

    MAX_COUNT = 2.0**53  # counts up to here are exact as floats (and as int64)

    def check_labels(self, values, column, where):
        """Check that every label is a whole count from 0 to :attr:`MAX_COUNT`; return them as int64.

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
        bad = np.flatnonzero((values < 0) | (values != np.round(values)) | (values > self.MAX_COUNT))
        if bad.size:
            shown = sorted({float(v) for v in values[bad]})[:5]
            raise InputError(f"{where}: label column {column!r} must hold counts (0, 1, 2, ... up to 2**53) for "
                             f"model.likelihood={self.name}; found {shown} in {rows_phrase(bad)}")
        return values.astype(np.int64)

    def add_observed(self, output, y, noise_sd, total_size=None):
        """``y * log_rate - exp(log_rate) - log(y!)`` as an observed ``CustomDist`` (no ``log(exp(.))`` round trip).

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

        def logp(value, log_rate):
            return value * log_rate - pt.exp(log_rate) - pt.gammaln(value + 1)

        kwargs = {"dims": "obs"} if total_size is None else {"total_size": [total_size]}
        pm.CustomDist("y_obs", output, logp=logp, observed=y, **kwargs)

    def density_constant(self, y, noise_sd):
        """``-log(y!)`` summed over the rows.

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
        from scipy.special import gammaln

        return -float(gammaln(y + 1.0).sum())

    def mean(self, output, y_mean=0.0, y_sd=1.0):
        """The rate: ``exp`` of the output.

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
        with np.errstate(over="ignore"):  # an overflowing rate is inf; callers refuse non-finite results
            return np.exp(output)

    def component_cdf(self, k: np.ndarray, rates: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        """``P(Y <= k[i])`` of each draw's predictive count.

        Parameters
        ----------
        k : numpy.ndarray
            Counts per row, ``(n,)``.
        rates : numpy.ndarray
            Each draw's rate (or mean count) per row, ``(sample, n)``.
        noise : numpy.ndarray or None
            The extra parameter per draw, ``(sample,)``; Poisson has none.

        Returns
        -------
        numpy.ndarray
            ``(sample, n)``; 0 where ``k < 0``.
        """
        from scipy.stats import poisson

        return poisson.cdf(k[None, :], rates)

    def upper_bracket(self, q: float, rates: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        """Counts at which the mixture CDF reaches ``q``: the largest rate's ``q`` quantile, plus one.

        Parameters
        ----------
        q : float
            The probability.
        rates : numpy.ndarray
            Each draw's rate (or mean count) per row, ``(sample, n)``.
        noise : numpy.ndarray or None
            The extra parameter per draw, ``(sample,)``; Poisson has none.

        Returns
        -------
        numpy.ndarray
            ``(n,)``, an upper bracket for :meth:`quantiles`.
        """
        from scipy.stats import poisson

        return poisson.ppf(q, rates.max(axis=0)) + 1

    def component_variance(self, rates: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        """Each draw's predictive variance of the count: the rate.

        Parameters
        ----------
        rates : numpy.ndarray
            Each draw's rate (or mean count) per row, ``(sample, n)``.
        noise : numpy.ndarray or None
            The extra parameter per draw, ``(sample,)``; Poisson has none.

        Returns
        -------
        numpy.ndarray
            ``(sample, n)``.
        """
        return rates

    def mixture_cdf(self, k: np.ndarray, rates: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
        """``mean_s P(Y_s <= k[i])`` over the draws' predictive counts.

        Parameters
        ----------
        k : numpy.ndarray
            Counts per row, ``(n,)``.
        rates : numpy.ndarray
            Each draw's rate (or mean count) per row, ``(sample, n)``.
        noise : numpy.ndarray or None
            The extra parameter per draw, ``(sample,)``; Poisson has none.

        Returns
        -------
        numpy.ndarray
            ``(n,)``; 0 where ``k < 0``.
        """
        return self.component_cdf(k, rates, noise).mean(axis=0)

    def quantiles(self, rates: np.ndarray, qs, noise: np.ndarray | None = None) -> np.ndarray:
        """Smallest counts whose mixture CDF reaches each ``q``, by bisection over counts.

        Parameters
        ----------
        rates : numpy.ndarray
            Each draw's rate (or mean count) per row, ``(sample, n)``.
        qs : sequence of float
            The probabilities.
        noise : numpy.ndarray or None, optional
            The extra parameter per draw, ``(sample,)``; Poisson has none.

        Returns
        -------
        numpy.ndarray
            ``(len(qs), n)``.
        """
        hi0 = self.upper_bracket(max(qs), rates, noise)
        out = []
        for q in qs:
            lo, hi = np.full(rates.shape[1], -1.0), hi0.copy()  # F(lo) < q <= F(hi)
            while np.any(hi - lo > 1):
                mid = np.floor((lo + hi) / 2)
                reached = self.mixture_cdf(mid, rates, noise) >= q
                hi, lo = np.where(reached, mid, hi), np.where(reached, lo, mid)
            out.append(hi)
        return np.array(out)

    def log_density(self, draws, noise, y):
        """``log Poisson(y | rate)`` per draw and row.

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
        from scipy.special import gammaln

        with np.errstate(divide="ignore"):  # a rate of exactly 0 gives log 0 = -inf, the right log density
            return y * np.log(draws) - draws - gammaln(y + 1.0)

    def predictive_draws(self, draws, noise, rng):
        """One ``Poisson(rate)`` count per draw and row.

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
        return rng.poisson(draws)

    def pointwise(self, draws, noise, y):
        """``sq_err``, ``lpd`` and ``covered`` per row (:class:`hbnn.model.likelihoods.base.Predictive`).

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
        from scipy.special import logsumexp

        rates = draws.reshape(-1, draws.shape[-1])
        noise = None if noise is None else np.asarray(noise).reshape(-1)
        logpmf = self.log_density(rates, noise, y)
        lo, hi = self.quantiles(rates, QUANTILES, noise)
        return {
            "sq_err": (y - rates.mean(axis=0)) ** 2,
            "lpd": logsumexp(logpmf, axis=0) - np.log(rates.shape[0]),
            "covered": (lo <= y) & (y <= hi),
        }

    def summarise(self, draws, noise):
        """Of the posterior predictive count: mean ``E[rate]``, sd ``sqrt(Var[rate] + E[count variance])``
        (Poisson's: ``E[rate]``), central 94% interval (whole counts).

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
        lower, upper = self.quantiles(draws, QUANTILES, noise)
        sd = np.sqrt(draws.var(axis=0) + self.component_variance(draws, noise).mean(axis=0))
        return {"mean": draws.mean(axis=0), "sd": sd, "lower_94": lower, "upper_94": upper}
