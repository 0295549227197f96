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
  the predictive mixture of Poissons (counting noise included).

A new likelihood is one new class registered in :data:`LIKELIHOODS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from hbnn.errors import InputError, rows_phrase

EPS = 1e-12
INTERVAL = 0.94  # central posterior (predictive) interval reported by metrics and predictions
QUANTILES = ((1 - INTERVAL) / 2, (1 + INTERVAL) / 2)


class Likelihood:
    """What a likelihood decides; subclasses set the class attributes and override the methods."""

    name: ClassVar[str]
    classifier: ClassVar[bool] = False  # scores of P(y = 1); the report draws calibration and accuracy
    score: ClassVar[str]  # the headline score: test.<score>
    score_keys: ClassVar[tuple[str, ...]]  # every score key of a split, headline first (and "n")
    label_dtype: ClassVar[type] = np.float64
    standardise_labels: ClassVar[bool] = False  # labels are standardised with the training mean and sd
    has_noise: ClassVar[bool] = False  # a noise sd ``sigma`` is a model parameter
    surface_titles: ClassVar[tuple[str, str]]  # the report's titles of mean and sd surfaces
    quantity: ClassVar[str]  # name of the function-space quantity in a trace's ``predictions`` group
    description: ClassVar[str]  # the report's one-phrase account of the likelihood
    quantity_words: ClassVar[str]  # the report's name for the function-space quantity at test rows, plural

    def check_labels(self, values: np.ndarray, column: str, where: str) -> np.ndarray:
        """Finite label values as read; return them in ``label_dtype`` or raise :class:`InputError`."""
        return values.astype(self.label_dtype)

    def check_group(self, name: str, y_train: np.ndarray, where: str) -> None:
        """Raise :class:`InputError` if a group's training labels cannot be fitted (default: any can)."""

    def strata(self, y: np.ndarray) -> np.ndarray:
        """Strata of a seeded train/test split of a table (default: none)."""
        return np.zeros(y.size, dtype=np.int64)

    def add_observed(self, output, y, noise_sd: float, total_size=None) -> None:
        """Add ``y_obs`` (and any noise parameter) to the current PyMC model, given the network ``output``.

        With a minibatch, ``total_size`` rows are represented by the batch and the
        log-likelihood is scaled by ``total_size / batch``.
        """
        raise NotImplementedError

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


class Bernoulli(Likelihood):
    """0/1 labels; the network output is the logit of ``P(y = 1)``."""

    name = "bernoulli"
    classifier = True
    score = "accuracy"
    score_keys = ("accuracy", "log_loss", "brier", "n")
    label_dtype = np.int64
    surface_titles = ("posterior mean P(y=1)", "posterior sd of P(y=1)")
    description = "Bernoulli likelihood on the logit"
    quantity_words = "predicted test probabilities"
    quantity = "p"

    def check_labels(self, values, column, where):
        bad = np.flatnonzero((values != 0) & (values != 1))
        if bad.size:
            shown = sorted({float(v) for v in values[bad]})[:5]
            raise InputError(f"{where}: label column {column!r} must hold 0 or 1 for model.likelihood=bernoulli; "
                             f"found {shown} in {rows_phrase(bad)}")
        return values.astype(np.int64)

    def check_group(self, name, y_train, where):
        classes = np.unique(y_train)
        if classes.size < 2:
            raise InputError(f"{where}: group {name!r} has only class {int(classes[0])} among its {y_train.size} "
                             "training rows; a classifier needs both 0 and 1 in every group. Drop the group or add "
                             "rows")

    def strata(self, y):
        return np.asarray(y)

    def add_observed(self, output, y, noise_sd, total_size=None):
        """``y * logit - softplus(logit)`` as an observed ``CustomDist``.

        Exact, with gradient ``y - sigmoid(logit)`` finite for every logit, and
        about 10% cheaper per gradient under numba (benchmarks/FINDINGS.md).
        ``pm.Bernoulli(logit_p=...)`` goes through ``log(sigmoid)`` and
        ``log1p(-sigmoid)``: once the sigmoid rounds to 1 its gradient is NaN,
        which NUTS reports as a divergence and ADVI cannot survive.
        """
        import pymc as pm
        import pytensor.tensor as pt

        def logp(value, logit):
            return value * logit - pt.softplus(logit)

        kwargs = {"dims": "obs"} if total_size is None else {"total_size": [total_size]}
        pm.CustomDist("y_obs", output, logp=logp, observed=y, **kwargs)

    def mean(self, output, y_mean=0.0, y_sd=1.0):
        from scipy.special import expit  # SciPy where the scores are computed: check_params needs none of it

        return expit(output)

    def log_density(self, draws, noise, y):
        """``y log p + (1 - y) log(1 - p)``, with ``p`` clipped to ``[EPS, 1 - EPS]`` as in the log loss."""
        p = np.clip(draws, EPS, 1 - EPS)
        return np.where(y == 1, np.log(p), np.log1p(-p))

    def pointwise(self, draws, noise, y):
        return {"p_bar": draws.mean(axis=(0, 1)), "y": y}

    def scores(self, point):
        p_bar, y = point["p_bar"], point["y"]
        p = np.clip(p_bar, EPS, 1 - EPS)
        return {
            "accuracy": float(np.mean((p_bar > 0.5) == (y == 1))),
            "log_loss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))),
            "brier": float(np.mean((p_bar - y) ** 2)),
            "n": int(y.size),
        }

    def summarise(self, draws, noise):
        """Posterior mean, sd and central 94% interval of ``P(y = 1)``."""
        lower, upper = np.quantile(draws, QUANTILES, axis=0)
        return {"mean": draws.mean(axis=0), "sd": draws.std(axis=0), "lower_94": lower, "upper_94": upper}


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


class Gaussian(Predictive):
    """Real-valued labels; the network output is the mean, with one noise sd ``sigma ~ HalfNormal(noise_sd)``."""

    name = "gaussian"
    standardise_labels = True
    has_noise = True
    surface_titles = ("posterior mean prediction", "posterior sd of the mean prediction")
    description = "gaussian likelihood with noise sd sigma"
    quantity_words = "predicted test means"
    noise_words = "the noise sd"
    quantity = "mu"

    def add_observed(self, output, y, noise_sd, total_size=None):
        import pymc as pm

        sigma = pm.HalfNormal("sigma", noise_sd)
        kwargs = {"dims": "obs"} if total_size is None else {"total_size": [total_size]}
        pm.Normal("y_obs", mu=output, sigma=sigma, observed=y, **kwargs)

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


class Poisson(Predictive):
    """Counts (0, 1, 2, ...: sales, visits, failures); the network output is the log of the rate.

    Labels are not standardised (a count's scale is its meaning). The predictive
    distribution of a row is the mixture over draws of ``Poisson(rate_s)``: its
    central 94% interval ``[lo, hi]`` holds the smallest counts whose mixture CDF
    reaches 0.03 and 0.97, and a row is covered when ``lo <= y <= hi``.
    """

    name = "poisson"
    label_dtype = np.int64
    surface_titles = ("posterior mean rate", "posterior sd of the rate")
    description = "Poisson likelihood on the log rate"
    quantity_words = "predicted test rates"
    noise_words = "the Poisson counting noise"
    quantity = "rate"

    MAX_COUNT = 2.0**53  # counts up to here are exact as floats (and as int64)

    def check_labels(self, values, column, where):
        bad = np.flatnonzero((values < 0) | (values != np.round(values)) | (values > self.MAX_COUNT))
        if bad.size:
            shown = sorted({float(v) for v in values[bad]})[:5]
            raise InputError(f"{where}: label column {column!r} must hold counts (0, 1, 2, ... up to 2**53) for "
                             f"model.likelihood=poisson; found {shown} in {rows_phrase(bad)}")
        return values.astype(np.int64)

    def add_observed(self, output, y, noise_sd, total_size=None):
        """``y * log_rate - exp(log_rate) - log(y!)`` as an observed ``CustomDist`` (no ``log(exp(.))`` round trip)."""
        import pymc as pm
        import pytensor.tensor as pt

        def logp(value, log_rate):
            return value * log_rate - pt.exp(log_rate) - pt.gammaln(value + 1)

        kwargs = {"dims": "obs"} if total_size is None else {"total_size": [total_size]}
        pm.CustomDist("y_obs", output, logp=logp, observed=y, **kwargs)

    def mean(self, output, y_mean=0.0, y_sd=1.0):
        with np.errstate(over="ignore"):  # an overflowing rate is inf; callers refuse non-finite results
            return np.exp(output)

    @staticmethod
    def mixture_cdf(k: np.ndarray, rates: np.ndarray) -> np.ndarray:
        """``mean_s P(Poisson(rates[s, i]) <= k[i])`` for ``rates (sample, n)``; 0 where ``k < 0``."""
        from scipy.stats import poisson

        return poisson.cdf(k[None, :], rates).mean(axis=0)

    def quantiles(self, rates: np.ndarray, qs) -> np.ndarray:
        """Smallest counts ``(len(qs), n)`` whose mixture CDF reaches each ``q``, by bisection over counts."""
        from scipy.stats import poisson

        hi0 = poisson.ppf(max(qs), rates.max(axis=0)) + 1  # an upper bracket: the largest rate's quantile
        out = []
        for q in qs:
            lo, hi = np.full(rates.shape[1], -1.0), hi0.copy()  # F(lo) < q <= F(hi)
            while np.any(hi - lo > 1):
                mid = np.floor((lo + hi) / 2)
                reached = self.mixture_cdf(mid, rates) >= q
                hi, lo = np.where(reached, mid, hi), np.where(reached, lo, mid)
            out.append(hi)
        return np.array(out)

    def log_density(self, draws, noise, y):
        from scipy.special import gammaln

        with np.errstate(divide="ignore"):  # a rate of exactly 0 gives log 0 = -inf, the right log density
            return y * np.log(draws) - draws - gammaln(y + 1.0)

    def predictive_draws(self, draws, noise, rng):
        return rng.poisson(draws)

    def pointwise(self, draws, noise, y):
        from scipy.special import logsumexp

        rates = draws.reshape(-1, draws.shape[-1])
        logpmf = self.log_density(rates, None, y)
        lo, hi = self.quantiles(rates, QUANTILES)
        return {
            "sq_err": (y - rates.mean(axis=0)) ** 2,
            "lpd": logsumexp(logpmf, axis=0) - np.log(rates.shape[0]),
            "covered": (lo <= y) & (y <= hi),
        }

    def summarise(self, draws, noise):
        """Of the posterior predictive count: mean ``E[rate]``, sd ``sqrt(Var[rate] + E[rate])``, central 94%
        interval (whole counts)."""
        lower, upper = self.quantiles(draws, QUANTILES)
        sd = np.sqrt(draws.var(axis=0) + draws.mean(axis=0))
        return {"mean": draws.mean(axis=0), "sd": sd, "lower_94": lower, "upper_94": upper}


LIKELIHOODS: dict[str, Likelihood] = {lik.name: lik for lik in (Bernoulli(), Gaussian(), Poisson())}


def get(name: str) -> Likelihood:
    """The likelihood called ``name`` (``model.likelihood``, or the ``likelihood`` attr of a file)."""
    try:
        return LIKELIHOODS[name]
    except KeyError:
        raise InputError(f"unknown likelihood {name!r}; known: {sorted(LIKELIHOODS)}") from None
