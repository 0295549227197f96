"""The likelihoods, one class each, looked up by name (``model.likelihood``).

Everything that depends on what a label is lives here, in one place per
likelihood: which labels are valid, the PyMC term, the function-space quantity
the network predicts (a probability, a mean, a rate) and its predictive
distribution, the scores, the columns ``hbnn predict`` writes, the headline
score's name and the words the report uses. Data loading, models, evaluation,
prediction and the report ask the likelihood and never test its name.

Scores are computed from posterior draws of the function-space quantity
(``(chain, draw, n)`` per group) and, where the likelihood has one, the noise
sd (``(chain, draw)``), both in the label's units:

- ``bernoulli``: from the posterior-predictive mean probability ``p_bar`` of
  each row: accuracy (``p_bar > 0.5``), log loss and Brier score;
- ``gaussian``: RMSE of the posterior-mean prediction, the mean log pointwise
  predictive density ``lpd`` (``log mean_s N(y | mu_s, sigma_s)``) and
  ``coverage_94``, the share of rows inside the central 94% interval of the
  posterior predictive (noise included);
- ``poisson`` (counts, log link): the same three of the posterior-mean rate and
  the predictive mixture of Poissons (counting noise included);
- ``negative_binomial`` (overdispersed counts, log link, dispersion ``alpha``):
  the same three of the posterior-mean count and the predictive mixture of
  negative binomials.

A new likelihood is one new module beside these whose class is registered in :data:`LIKELIHOODS`.
"""

from __future__ import annotations

from hbnn.errors import InputError
from hbnn.model.likelihoods.base import EPS, INTERVAL, QUANTILES, Likelihood, Predictive, mixture_cdf, mixture_quantiles
from hbnn.model.likelihoods.bernoulli import Bernoulli
from hbnn.model.likelihoods.gaussian import Gaussian
from hbnn.model.likelihoods.negative_binomial import NegativeBinomial
from hbnn.model.likelihoods.poisson import Poisson

__all__ = ["EPS", "INTERVAL", "LIKELIHOODS", "QUANTILES", "Bernoulli", "Gaussian", "Likelihood", "NegativeBinomial",
           "Poisson", "Predictive", "get", "mixture_cdf", "mixture_quantiles"]

LIKELIHOODS: dict[str, Likelihood] = {lik.name: lik for lik in (Bernoulli(), Gaussian(), Poisson(), NegativeBinomial())}


def get(name: str) -> Likelihood:
    """The likelihood called ``name``.

    Parameters
    ----------
    name : str
        ``model.likelihood``, or the ``likelihood`` attr of a file.

    Returns
    -------
    Likelihood
        The registered likelihood.

    Raises
    ------
    hbnn.errors.InputError
        Where no likelihood has that name.
    """
    try:
        return LIKELIHOODS[name]
    except KeyError:
        raise InputError(f"unknown likelihood {name!r}; known: {sorted(LIKELIHOODS)}") from None
