"""The ``gaussian`` likelihood: real-valued labels with one noise sd ``sigma``."""

from __future__ import annotations

import math

import numpy as np

from hbnn.model.likelihoods.base import HALFNORMAL_CONST, QUANTILES, Predictive, mixture_cdf, mixture_quantiles


class Gaussian(Predictive):
    """Real-valued labels; the network output is the mean, with one noise sd ``sigma ~ HalfNormal(noise_sd)``."""

    name = "gaussian"
    summary_arrays = 4
    standardise_labels = True
    extra = "sigma"
    surface_titles = ("posterior mean prediction", "posterior sd of the mean prediction")
    description = "gaussian likelihood with noise sd sigma"
    quantity_words = "predicted test means"
    noise_words = "the noise sd"
    quantity = "mu"
    # in float64 from the float32 rows
    density_source = """\
def _likelihood_rows(out, y, dlogit, n, e, bits, extra):
    ll = 0.0
    g_extra = 0.0
    log_sigma = math.log(extra)
    for r in range(n):
        u = (np.float64(y[r]) - np.float64(out[r])) / extra
        ll += -0.5 * u * u - log_sigma
        dlogit[r] = u / extra
        g_extra += u * u - 1.0
    return ll, g_extra
"""

    def add_observed(self, output, y, noise_sd, total_size=None, sigma=None):
        """As :meth:`Likelihood.add_observed`; ``sigma``, where given, is each row's noise sd
        (:meth:`add_group_sigma`) instead of one ``HalfNormal(noise_sd)`` for all rows."""
        import pymc as pm

        if sigma is None:
            sigma = self.add_extra(noise_sd)
        kwargs = {"dims": "obs"} if total_size is None else {"total_size": [total_size]}
        pm.Normal("y_obs", mu=output, sigma=sigma, observed=y, **kwargs)

    def add_group_sigma(self, noise_sd, row_group):
        """One noise sd per group, pooled: ``log sigma[g] = log_sigma_mu + log_sigma_sd * z_sigma[g]`` (non-centred),
        ``log_sigma_mu ~ Normal(log(noise_sd), 1)``, ``log_sigma_sd ~ HalfNormal(1)``, ``z_sigma[g] ~ Normal(0, 1)``,
        added to the current PyMC model (which has a ``group`` coordinate); ``sigma`` is kept per group.

        Parameters
        ----------
        noise_sd : float
            The prior median of the groups' typical noise sd, on the standardised label scale (``model.noise_sd``).
        row_group : array-like of int or pytensor.tensor.TensorVariable
            Each modelled row's group index.

        Returns
        -------
        pytensor.tensor.TensorVariable
            Each row's noise sd, for :meth:`add_observed`'s ``sigma``.
        """
        import pymc as pm
        import pytensor.tensor as pt

        mu = pm.Normal(f"log_{self.extra}_mu", math.log(noise_sd), 1.0)
        sd = pm.HalfNormal(f"log_{self.extra}_sd", 1.0)
        z = pm.Normal(f"z_{self.extra}", 0.0, 1.0, dims="group")
        sigma = pm.Deterministic(self.extra, pt.exp(mu + sd * z), dims="group")
        return sigma[row_group]

    def extra_in_label_units(self, values, y_sd):
        """``sigma`` is on the standardised label scale: times the labels' training sd."""
        return y_sd * values

    def density_constant(self, y, noise_sd):
        """``sigma``'s prior normaliser and ``-log(2 pi) / 2`` per row."""
        return HALFNORMAL_CONST - math.log(noise_sd) - 0.5 * math.log(2.0 * math.pi) * int(y.size)

    def mean(self, output, y_mean=0.0, y_sd=1.0):
        return y_mean + y_sd * output

    def pointwise(self, draws, noise, y):
        """Per-row squared error, log predictive density and 94%-interval coverage.

        A row is covered when its predictive CDF value lies in ``[0.03, 0.97]``,
        which is the same as lying inside the central 94% predictive interval.
        """
        from scipy.special import logsumexp

        m = draws.reshape(-1, draws.shape[-1])
        s = noise.reshape(-1)
        logpdf = self.log_density(m, s, y)
        cdf = mixture_cdf(y, m, s)
        return {
            "sq_err": (y - m.mean(axis=0)) ** 2,
            "lpd": logsumexp(logpdf, axis=0) - np.log(m.shape[0]),
            "covered": (cdf >= QUANTILES[0]) & (cdf <= QUANTILES[1]),
        }

    def log_density(self, draws, noise, y):
        from scipy.stats import norm  # here, not at the top: config (every stage's first import) reads this module

        return norm.logpdf(y, loc=draws, scale=np.asarray(noise)[..., None])

    def predictive_draws(self, draws, noise, rng):
        return rng.normal(draws, np.asarray(noise)[..., None])

    def summarise(self, draws, noise):
        """Of the posterior predictive ``N(draws, sigma)`` mixture: mean, ``sqrt(Var[mu] + E[sigma^2])``,
        exact central 94% interval."""
        lower, upper = mixture_quantiles(draws, noise, QUANTILES)
        sd = np.sqrt(draws.var(axis=0) + np.mean(noise**2))
        return {"mean": draws.mean(axis=0), "sd": sd, "lower_94": lower, "upper_94": upper}
