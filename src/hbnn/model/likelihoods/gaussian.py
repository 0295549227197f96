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
        """``y ~ Normal(output, sigma)`` on the standardised label scale, observed.

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
        sigma : pytensor.tensor.TensorVariable, optional
            Each row's noise sd (:meth:`add_group_sigma`), instead of one ``HalfNormal(noise_sd)`` for all rows.
        """
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
        """``sigma`` is on the standardised label scale: times the labels' training sd.

        Parameters
        ----------
        values : numpy.ndarray
            Draws of ``sigma``.
        y_sd : float
            The labels' training sd.

        Returns
        -------
        numpy.ndarray
            ``sigma`` in the label's units.
        """
        return y_sd * values

    def density_constant(self, y, noise_sd):
        """``sigma``'s prior normaliser and ``-log(2 pi) / 2`` per row.

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
        return HALFNORMAL_CONST - math.log(noise_sd) - 0.5 * math.log(2.0 * math.pi) * int(y.size)

    def mean(self, output, y_mean=0.0, y_sd=1.0):
        """The mean label: the output back in the label's units, ``y_mean + y_sd * output``.

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
        return y_mean + y_sd * output

    def pointwise(self, draws, noise, y):
        """Per-row squared error, log predictive density and 94%-interval coverage.

        A row is covered when its predictive CDF value lies in ``[0.03, 0.97]``,
        which is the same as lying inside the central 94% predictive interval.

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
        """``log Normal(y | mu, sigma)`` per draw and row.

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
        from scipy.stats import norm  # here, not at the top: config (every stage's first import) reads this module

        return norm.logpdf(y, loc=draws, scale=np.asarray(noise)[..., None])

    def predictive_draws(self, draws, noise, rng):
        """One ``Normal(mu, sigma)`` label per draw and row.

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
        return rng.normal(draws, np.asarray(noise)[..., None])

    def summarise(self, draws, noise):
        """Of the posterior predictive ``N(draws, sigma)`` mixture: mean, ``sqrt(Var[mu] + E[sigma^2])``,
        exact central 94% interval.

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
        lower, upper = mixture_quantiles(draws, noise, QUANTILES)
        sd = np.sqrt(draws.var(axis=0) + np.mean(noise**2))
        return {"mean": draws.mean(axis=0), "sd": sd, "lower_94": lower, "upper_94": upper}
