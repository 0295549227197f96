"""The three models as scikit-learn estimators: :class:`HierarchicalBNN`, :class:`FlatBNN` and :class:`InformedBNN`.

Their keywords are ``params.yaml``'s settings with the same names and defaults (the hierarchical model's sampler
settings are ``hier_sampler``'s, the others' ``sampler``'s); the fit stages run these same estimators, built from
``params.yaml`` (:meth:`hbnn.api.base.BNNEstimator.from_params`), so the same settings give the same draws either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import xarray as xr

import hbnn.api.settings as settings
from hbnn.api.base import BNNEstimator
from hbnn.errors import InputError
from hbnn.model.spec import ModelSpec

_HIER = settings.keywords("hier_sampler", model_extra=("noise",), sampler_extra=("restarts",))
# noise: the flat fit reads params.yaml's whole model section (its trace is stamped with it), though each group's
# fit has its own noise sd whatever model.noise says
_FLAT = settings.keywords("sampler", model_extra=("prior_sd", "noise"), sampler_extra=("refit_target_accept",))
_INFORMED = settings.keywords("sampler", sampler_extra=("refit_target_accept",))
_H, _F = settings.defaults(_HIER), settings.defaults(_FLAT)
_RTA = _F["refit_target_accept"]  # the per-group fits' refit_target_accept default, for the docstrings

_SHARED_DOC = """
    group : str, default "group"
        The name of ``X``'s group column.
    split : str, default ""
        The name of an optional column of ``"train"``/``"test"``: test rows are held out of the fit, and each group is
        scored and judged on them. ``""``: every row trains and each group is judged on its training inputs.
    hidden_layers : sequence of int, default (5, 5)
        Units per hidden layer; ``()`` for a linear model.
    activation : {"tanh", "relu"}, default "tanh"
        The hidden units' activation.
    likelihood : {"bernoulli", "gaussian", "poisson", "negative_binomial"}, default "bernoulli"
        How labels arise from the network's output.
    bias : bool, default False
        A bias per hidden and output unit.
    noise_sd : float, default 1.0
        Scale of the ``HalfNormal`` prior of the likelihood's extra parameter (gaussian's noise sd on the
        standardised label scale, negative_binomial's dispersion).
    standardize : bool, default True
        Standardise the features (and gaussian labels) with the training rows' mean and sd.
    backend : {"nutpie", "pymc", "numpyro", "blackjax", "advi"}
        The sampler; ``numpyro`` and ``blackjax`` need the JAX extra.
    chains, tune, draws : int
        NUTS chains, tuning iterations and kept draws per chain.
    target_accept : float
        NUTS' target acceptance rate.
    seed : int
        The sampler's seed; every random choice of the fit flows from it.
    cores : int
        Chains sampled in parallel.
    mass_matrix : {"diag", "low_rank", "diag_stan"}
        nutpie's mass-matrix adaptation.
    max_draws : int
        Draws per chain a fit may go on to while it misses the convergence bar (0: exactly ``draws``).
    advi_iterations, advi_learning_rate, advi_minibatch_size, advi_init_jitter, advi_starts
        ``backend="advi"`` only: the optimisation's settings (``advi_starts``: fits from that many starting points,
        keeping the highest ELBO).
    pointwise : bool, default True
        Keep the ``log_likelihood`` and ``predictions`` groups in the trace (for ``az.loo`` and ``az.compare``).
    max_minutes, max_memory_gib : float, default 180, 0
        Refuse, before sampling, a fit estimated past these (0 GiB: 80% of this machine's memory).
"""

_ATTRIBUTES_DOC = """
    Attributes
    ----------
    idata_ : arviz.InferenceData
        The trace, laid out as the pipeline's ``traces/*.nc``.
    trace_ : hbnn.files.trace.Trace
        The same groups, without importing ArviZ.
    metrics_ : dict or None
        The pipeline's detail metrics of the fit (None for a loaded trace); without ``split``, no test scores.
    timing_ : dict or None
        Seconds spent compiling and sampling.
    groups_ : list of str
        The groups fitted.
    feature_names_in_ : numpy.ndarray
        The feature columns, in the order the network reads them.
"""


class HierarchicalBNN(BNNEstimator):
    __doc__ = f"""A non-centred hierarchical BNN over all groups: each group's weights are drawn around a shared mean
    with a shared sd per layer, so groups with few rows borrow strength from the others.

    Parameters
    ----------{_SHARED_DOC}    noise : str, default "{_H["noise"]}"
        ``likelihood="gaussian"`` only: one noise sd ``shared`` by all groups, or one per ``group``, pooled through a
        learned log-normal.
    restarts : int, default {_H["restarts"]}
        Times the chains may start again from the best chain's draws where they diverge or sit stuck.
{_ATTRIBUTES_DOC}
    Examples
    --------
    >>> model = HierarchicalBNN(group="site", tune=300, draws=500).fit(X, y)  # doctest: +SKIP
    >>> model.diagnostics()  # doctest: +SKIP
    """

    _stage = "fit_hier"
    _names = _HIER

    def __init__(self, group: str = "group", *, split: str = _H["split"], hidden_layers=tuple(_H["hidden_layers"]),
                 activation: str = _H["activation"], likelihood: str = _H["likelihood"], bias: bool = _H["bias"],
                 noise_sd: float = _H["noise_sd"], noise: str = _H["noise"], standardize: bool = _H["standardize"],
                 backend: str = _H["backend"],
                 chains: int = _H["chains"], tune: int = _H["tune"], draws: int = _H["draws"],
                 target_accept: float = _H["target_accept"], seed: int = _H["seed"], cores: int = _H["cores"],
                 mass_matrix: str = _H["mass_matrix"], max_draws: int = _H["max_draws"],
                 restarts: int = _H["restarts"], advi_iterations: int = _H["advi_iterations"],
                 advi_learning_rate: float = _H["advi_learning_rate"],
                 advi_minibatch_size: int = _H["advi_minibatch_size"], advi_init_jitter: float = _H["advi_init_jitter"],
                 advi_starts: int = _H["advi_starts"],
                 pointwise: bool = _H["pointwise"], max_minutes: float = _H["max_minutes"],
                 max_memory_gib: float = _H["max_memory_gib"], **unknown):
        if unknown:
            raise settings.unknown(type(self), unknown)
        self.group, self.split, self.hidden_layers, self.activation = group, split, hidden_layers, activation
        self.likelihood, self.bias, self.noise_sd, self.standardize = likelihood, bias, noise_sd, standardize
        self.noise = noise
        self.backend, self.chains, self.tune, self.draws = backend, chains, tune, draws
        self.target_accept, self.seed, self.cores, self.mass_matrix = target_accept, seed, cores, mass_matrix
        self.max_draws, self.restarts = max_draws, restarts
        self.advi_iterations, self.advi_learning_rate = advi_iterations, advi_learning_rate
        self.advi_minibatch_size, self.advi_init_jitter, self.advi_starts = (advi_minibatch_size, advi_init_jitter,
                                                                              advi_starts)
        self.pointwise, self.max_minutes, self.max_memory_gib = pointwise, max_minutes, max_memory_gib

    def informed_prior(self, draws_per_sample: int = 10, align: str = "chains", reference_chain: int = 0,
                       jitter: float = 1e-6, seed: int = 2, method: str = "mvnormal") -> xr.Dataset:
        """The informed prior for new groups, as the ``derive_prior`` stage derives it: one MvNormal per layer,
        fitted to new-group weight draws of this posterior (chains aligned for the hidden units' symmetries), or
        (``method="plugin"``) ``N(mu, sd^2 I)`` per layer at the posterior draw of the highest log density.

        Parameters
        ----------
        draws_per_sample, align, reference_chain, jitter, seed, method
            ``params.yaml``'s ``prior`` settings, with their defaults.

        Returns
        -------
        xarray.Dataset
            The prior (``priors/informed.nc``'s layout), for :class:`InformedBNN`'s ``prior``.

        Raises
        ------
        hbnn.errors.InputError
            If not fitted, or a setting cannot be used.
        """
        from hbnn.api.persist import derive_prior

        self._check_fitted()
        return derive_prior(self.trace_.posterior, dict(draws_per_sample=draws_per_sample, align=align,
                                                        reference_chain=reference_chain, jitter=jitter, seed=seed,
                                                        method=method),
                            getattr(self.trace_, "sample_stats", None))


class FlatBNN(BNNEstimator):
    __doc__ = f"""One BNN per group with ``Normal(0, prior_sd)`` weights: each group learns from its own rows only.

    Parameters
    ----------{_SHARED_DOC}    prior_sd : float, default {_F["prior_sd"]}
        The weights' prior sd.
    noise : str, default "{_F["noise"]}"
        ``model.noise``, as params.yaml holds it; each group's fit has its own noise sd either way.
    refit_target_accept : float, default {_RTA}
        A group whose fit diverges past the bar is fitted again at this target_accept (0: off).
{_ATTRIBUTES_DOC}"""

    _stage = "fit_flat"
    _names = _FLAT

    def __init__(self, group: str = "group", *, split: str = _F["split"], hidden_layers=tuple(_F["hidden_layers"]),
                 activation: str = _F["activation"], likelihood: str = _F["likelihood"], bias: bool = _F["bias"],
                 noise_sd: float = _F["noise_sd"], prior_sd: float = _F["prior_sd"], noise: str = _F["noise"],
                 standardize: bool = _F["standardize"], backend: str = _F["backend"], chains: int = _F["chains"],
                 tune: int = _F["tune"], draws: int = _F["draws"], target_accept: float = _F["target_accept"],
                 seed: int = _F["seed"], cores: int = _F["cores"], mass_matrix: str = _F["mass_matrix"],
                 max_draws: int = _F["max_draws"], refit_target_accept: float = _F["refit_target_accept"],
                 advi_iterations: int = _F["advi_iterations"], advi_learning_rate: float = _F["advi_learning_rate"],
                 advi_minibatch_size: int = _F["advi_minibatch_size"], advi_init_jitter: float = _F["advi_init_jitter"],
                 advi_starts: int = _F["advi_starts"],
                 pointwise: bool = _F["pointwise"], max_minutes: float = _F["max_minutes"],
                 max_memory_gib: float = _F["max_memory_gib"], **unknown):
        if unknown:
            raise settings.unknown(type(self), unknown)
        self.group, self.split, self.hidden_layers, self.activation = group, split, hidden_layers, activation
        self.likelihood, self.bias, self.noise_sd, self.prior_sd = likelihood, bias, noise_sd, prior_sd
        self.noise = noise
        self.standardize, self.backend, self.chains, self.tune, self.draws = standardize, backend, chains, tune, draws
        self.target_accept, self.seed, self.cores, self.mass_matrix = target_accept, seed, cores, mass_matrix
        self.max_draws, self.refit_target_accept = max_draws, refit_target_accept
        self.advi_iterations, self.advi_learning_rate = advi_iterations, advi_learning_rate
        self.advi_minibatch_size, self.advi_init_jitter, self.advi_starts = (advi_minibatch_size, advi_init_jitter,
                                                                              advi_starts)
        self.pointwise, self.max_minutes, self.max_memory_gib = pointwise, max_minutes, max_memory_gib


class InformedBNN(BNNEstimator):
    __doc__ = f"""One BNN per group with the informed prior: each layer's weights ``MvNormal`` as the hierarchical
    posterior predicts a new group's.

    Parameters
    ----------
    prior : HierarchicalBNN, xarray.Dataset, str or pathlib.Path
        A fitted :class:`HierarchicalBNN` (its :meth:`HierarchicalBNN.informed_prior` with the default settings), a
        prior it derived, or a prior file (``priors/informed.nc``). To cross-validate, pass the derived prior:
        ``clone`` makes an unfitted copy of an estimator.{_SHARED_DOC}    refit_target_accept : float, default {_RTA}
        A group whose fit diverges past the bar is fitted again at this target_accept (0: off).
{_ATTRIBUTES_DOC}"""

    _stage = "fit_informed"
    _names = _INFORMED

    def __init__(self, prior: Any = None, group: str = "group", *, split: str = _F["split"],
                 hidden_layers=tuple(_F["hidden_layers"]), activation: str = _F["activation"],
                 likelihood: str = _F["likelihood"], bias: bool = _F["bias"], noise_sd: float = _F["noise_sd"],
                 standardize: bool = _F["standardize"], backend: str = _F["backend"], chains: int = _F["chains"],
                 tune: int = _F["tune"], draws: int = _F["draws"], target_accept: float = _F["target_accept"],
                 seed: int = _F["seed"], cores: int = _F["cores"], mass_matrix: str = _F["mass_matrix"],
                 max_draws: int = _F["max_draws"], refit_target_accept: float = _F["refit_target_accept"],
                 advi_iterations: int = _F["advi_iterations"], advi_learning_rate: float = _F["advi_learning_rate"],
                 advi_minibatch_size: int = _F["advi_minibatch_size"], advi_init_jitter: float = _F["advi_init_jitter"],
                 advi_starts: int = _F["advi_starts"],
                 pointwise: bool = _F["pointwise"], max_minutes: float = _F["max_minutes"],
                 max_memory_gib: float = _F["max_memory_gib"], **unknown):
        if unknown:
            raise settings.unknown(type(self), unknown)
        self.prior = prior
        self.group, self.split, self.hidden_layers, self.activation = group, split, hidden_layers, activation
        self.likelihood, self.bias, self.noise_sd, self.standardize = likelihood, bias, noise_sd, standardize
        self.backend, self.chains, self.tune, self.draws = backend, chains, tune, draws
        self.target_accept, self.seed, self.cores, self.mass_matrix = target_accept, seed, cores, mass_matrix
        self.max_draws, self.refit_target_accept = max_draws, refit_target_accept
        self.advi_iterations, self.advi_learning_rate = advi_iterations, advi_learning_rate
        self.advi_minibatch_size, self.advi_init_jitter, self.advi_starts = (advi_minibatch_size, advi_init_jitter,
                                                                              advi_starts)
        self.pointwise, self.max_minutes, self.max_memory_gib = pointwise, max_minutes, max_memory_gib

    def _prior(self, spec: ModelSpec) -> tuple[dict, dict]:
        from hbnn.model.prior import load_prior, prior_layers

        layers = spec.layers
        prior = self.prior
        if isinstance(prior, HierarchicalBNN):
            if not hasattr(prior, "trace_"):
                raise InputError("prior: the HierarchicalBNN is not fitted; fit it first (to cross-validate, pass its "
                                 "informed_prior(), which clone copies as it is)")
            return prior_layers(prior.informed_prior(), layers, "the prior"), {"prior_file": ""}
        if isinstance(prior, xr.Dataset):
            return prior_layers(prior, layers, "the prior"), {"prior_file": ""}
        if isinstance(prior, (str, Path)):
            return load_prior(Path(prior), layers), {"prior_file": str(prior)}
        if prior is None:
            raise InputError("prior: this InformedBNN has none (a model loaded from a trace keeps only a prior file's "
                             "path); pass a fitted HierarchicalBNN, its informed_prior(), or the path of a prior file")
        raise InputError("prior: pass a fitted HierarchicalBNN, its informed_prior(), or the path of a prior file "
                         f"(priors/informed.nc); got {type(prior).__name__}")
