"""The ``negative_binomial`` likelihood: overdispersed counts, the network's output the log of the mean."""

from __future__ import annotations

import math

import numpy as np

from hbnn.model.likelihoods.base import HALFNORMAL_CONST
from hbnn.model.likelihoods.poisson import Poisson


class NegativeBinomial(Poisson):
    """Counts whose variance exceeds their mean: ``y ~ NegativeBinomial(mu, alpha)``, ``log mu`` the network output.

    One dispersion ``alpha ~ HalfNormal(model.noise_sd)``, so that ``Var[y] = mu + mu**2 / alpha``.

    Small ``alpha`` is strong overdispersion; as ``alpha`` grows the model becomes :class:`Poisson`'s, whose labels,
    scores (RMSE, lpd, 94% coverage of whole counts) and predictions it shares. ``model.noise_sd`` is the scale of
    ``alpha``'s prior: the default 1 favours clearly overdispersed counts, a larger one lets nearly-Poisson counts
    in. ``alpha`` is one per group in the per-group fits and one shared by all groups in the hierarchical model.
    """

    name = "negative_binomial"
    extra = "alpha"
    description = "negative binomial likelihood on the log mean, with dispersion alpha"
    quantity_words = "predicted test means"
    noise_words = "the negative binomial counting noise"
    surface_titles = ("posterior mean of the expected count", "posterior sd of the expected count")
    summary_arrays = 10
    # in float64 from the float32 rows; log(y!) and alpha's prior normaliser are in density_constant.
    # psi(y + alpha) - psi(alpha) is a sum of y terms for small counts (exact, no cancellation), else two digammas.
    density_source = """\
def _nb_digamma(x):
    r = 0.0
    while x < 10.0:
        r -= 1.0 / x
        x += 1.0
    f = 1.0 / (x * x)
    return r + math.log(x) - 0.5 / x - f * (1.0 / 12.0 - f * (1.0 / 120.0 - f * (1.0 / 252.0 - f * (
        1.0 / 240.0 - f * (1.0 / 132.0)))))


def _likelihood_rows(out, y, dlogit, n, e, bits, extra):
    alpha = extra
    log_alpha = math.log(alpha)
    base = alpha * log_alpha - math.lgamma(alpha)
    psi_alpha = _nb_digamma(alpha)
    ll = 0.0
    g_extra = 0.0
    for r in range(n):
        o = np.float64(out[r])
        k = np.float64(y[r])
        hi = max(o, log_alpha)
        log_total = hi + math.log1p(math.exp(min(o, log_alpha) - hi))
        share = math.exp(o - log_total)
        ll += math.lgamma(k + alpha) + base + k * o - (alpha + k) * log_total
        dlogit[r] = k - (alpha + k) * share
        if k < 64.0:
            dpsi = 0.0
            for j in range(int(k)):
                dpsi += 1.0 / (alpha + j)
        else:
            dpsi = _nb_digamma(k + alpha) - psi_alpha
        g_extra += alpha * (dpsi + log_alpha + 1.0 - log_total) - (alpha + k) * (1.0 - share)
    return ll, g_extra
"""

    def add_observed(self, output, y, noise_sd, total_size=None):
        """``log NB(y | exp(log_mu), alpha)`` as an observed ``CustomDist``, from the log mean directly:
        ``lgamma(y + a) - lgamma(a) - lgamma(y + 1) + a log a + y log_mu - (a + y) log(a + exp(log_mu))``.

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

        alpha = self.add_extra(noise_sd)

        def logp(value, log_mu, alpha):
            log_alpha = pt.log(alpha)
            return (pt.gammaln(value + alpha) - pt.gammaln(alpha) - pt.gammaln(value + 1) + alpha * log_alpha
                    + value * log_mu - (alpha + value) * pt.logaddexp(log_alpha, log_mu))

        kwargs = {"dims": "obs"} if total_size is None else {"total_size": [total_size]}
        pm.CustomDist("y_obs", output, alpha, logp=logp, observed=y, **kwargs)

    def density_constant(self, y, noise_sd):
        """``alpha``'s prior normaliser and ``-log(y!)`` summed over the rows.

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

        return HALFNORMAL_CONST - math.log(noise_sd) - float(gammaln(y + 1.0).sum())

    @staticmethod
    def _alpha(noise, like):
        """``alpha`` per draw (``noise``: ``(sample,)`` or ``(chain, draw)``) broadcast against the rows of ``like``
        (``(sample, n)`` or ``(chain, draw, n)``)."""
        alpha = np.asarray(noise, dtype=float)
        return alpha.reshape(alpha.shape + (1,) * (like.ndim - alpha.ndim))

    def component_cdf(self, k, rates, noise):
        """``P(Y <= k[i])`` of each draw's negative binomial count.

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
        from scipy.stats import nbinom

        alpha = self._alpha(noise, rates)
        return nbinom.cdf(k[None, :], alpha, alpha / (alpha + rates))

    def upper_bracket(self, q, rates, noise):
        """The largest component's ``q`` quantile, plus one: every component, so the mixture, reaches ``q`` there.

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
        from scipy.stats import nbinom

        alpha = self._alpha(noise, rates)
        return nbinom.ppf(q, alpha, alpha / (alpha + rates)).max(axis=0) + 1

    def component_variance(self, rates, noise):
        """``mu + mu**2 / alpha`` per draw and row.

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
        return rates + rates**2 / self._alpha(noise, rates)

    def log_density(self, draws, noise, y):
        """``log NB(y | mu, alpha)`` per draw and row (mean ``mu``, dispersion ``alpha``).

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

        alpha = self._alpha(noise, draws)
        log_alpha = np.log(alpha)
        with np.errstate(divide="ignore"):  # a mean of exactly 0 gives log 0 = -inf where y > 0, the right density
            log_mu = np.log(draws)
        return (gammaln(y + alpha) - gammaln(alpha) - gammaln(y + 1.0) + alpha * log_alpha + y * log_mu
                - (alpha + y) * np.logaddexp(log_alpha, log_mu))

    def predictive_draws(self, draws, noise, rng):
        """One ``NB(mu, alpha)`` count per draw and row.

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
        alpha = self._alpha(noise, draws)
        return rng.negative_binomial(np.broadcast_to(alpha, draws.shape), alpha / (alpha + draws))
