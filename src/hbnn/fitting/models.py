"""The three models as the fits sample them: the hierarchical model over all groups
(:func:`sample_hierarchical`), and the per-group flat and informed models as PyMC builders and hand-written densities
(:func:`flat_model`, :func:`informed_model`), which :func:`hbnn.fitting.per_group.fit_per_group` fits group by group.
"""

from __future__ import annotations

from hbnn.config import Params, SamplerParams
from hbnn.data.tasks import Tasks
from hbnn.density.densities import FlatDensity, HierarchicalDensity, InformedDensity
from hbnn.diagnostics import criterion
from hbnn.fitting import common as fitting
from hbnn.fitting import per_group
from hbnn.model.spec import ModelSpec
from hbnn.pipeline.variants import STAGE_KEYS, derive_seed
from hbnn.sampling.sampler import Sampler


def sample_hierarchical(stage: str, params: Params, spec: ModelSpec, tasks: Tasks) -> fitting.Sampled:
    """Check the cost, build and sample the hierarchical model ``spec`` of ``tasks``.

    The group sds' R-hat and ESS are its extra diagnostics. With ``max_draws`` the fit draws on, in blocks, until every
    group's test points and every group sd meet the convergence criterion (:mod:`hbnn.diagnostics.criterion`) or
    ``max_draws`` is reached.

    Parameters
    ----------
    stage : str
        A hierarchical fit of :data:`hbnn.pipeline.variants.FITS` (its sampler settings and seed stream).
    params : hbnn.config.Params
        The run's settings.
    spec : hbnn.model.spec.ModelSpec
        The model.
    tasks : hbnn.data.tasks.Tasks
        The data; every group's training rows are fitted at once.

    Returns
    -------
    hbnn.fitting.common.Sampled
        The posterior, sample stats, cost and the group sds' diagnostics.

    Raises
    ------
    hbnn.config.ConfigError
        If the fit's estimated cost is past ``params.limits``.
    """
    settings = params.sampler_for(stage)
    estimate = fitting.enforce_budget(stage, params, tasks)
    batch = fitting.minibatch(settings)
    density = None  # a hand-written log density of the full-batch model, for the backends that take one
    padded = tasks.padded("train")

    def full_batch():  # PyMC's model: built where a backend samples it, or to check the hand-written density
        from hbnn.model.builders import build_hierarchical_model

        return build_hierarchical_model(
            padded.X, padded.y, padded.valid, tasks.group_names, spec.features, spec.hidden_layers,
            likelihood=spec.likelihood, noise_sd=spec.noise_sd, bias=spec.bias, activation=spec.activation,
            noise=spec.noise,
        )
    model = full_batch
    if batch:
        train = tasks.split("train")

        def model():
            from hbnn.model.builders import build_hierarchical_minibatch_model

            return build_hierarchical_minibatch_model(
                train.X, train.group, train.y, tasks.group_names, spec.features, spec.hidden_layers, batch,
                likelihood=spec.likelihood, noise_sd=spec.noise_sd, bias=spec.bias, activation=spec.activation,
                noise=spec.noise,
            )
    if fitting.hand_written(spec, settings, stage, spec.noise):
        density = HierarchicalDensity(padded.X, padded.y, padded.counts, spec.hidden_layers, spec.bias,
                                      spec.likelihood, spec.noise_sd, features=spec.features,
                                      groups=tuple(tasks.group_names), activation=spec.activation)
    sampler = Sampler(model, settings, density, full_batch if batch else None)
    sd_vars = [f"sd_{s.name}" for s in spec.layers]
    fit = sampler.sample(derive_seed(settings.seed, STAGE_KEYS[stage]),
                         expected_seconds=60 * (estimate.first_minutes or estimate.minutes),
                         until=criterion.ShortfallCheck(tasks, spec.layers, spec.activation, sd_vars))
    posterior = fit.posterior.posterior
    return fitting.Sampled(posterior, fit.posterior.sample_stats,
                           fitting.Cost(fit.seconds, sampler.compile_seconds, fit.grad_evals),
                           criterion.scalar_diagnostics(posterior, sd_vars))


def flat_model(spec: ModelSpec, settings: SamplerParams, stage: str):
    """The flat BNN of ``spec`` on one group's rows, as a PyMC model builder and a hand-written density builder.

    Parameters
    ----------
    spec : hbnn.model.spec.ModelSpec
        The model (``prior_sd`` is the flat prior's sd).
    settings : hbnn.config.SamplerParams
        The sampler that will fit it (its minibatch and whether it takes a hand-written density).
    stage : str
        The fit, for the log line that says the hand-written density is not used.

    Returns
    -------
    tuple
        ``(build, density)``: ``build(X, y)`` returns the PyMC model (:func:`hbnn.model.builders.build_flat_model`,
        imported only when built); ``density(X, y)`` its hand-written log density, or ``None`` where the model has none
        (:func:`hbnn.fitting.common.hand_written`).
    """
    batch = fitting.minibatch(settings)

    def build(X, y):
        from hbnn.model.builders import build_flat_model

        return build_flat_model(X, y, spec.features, spec.hidden_layers, spec.prior_sd, minibatch_size=batch,
                                likelihood=spec.likelihood, noise_sd=spec.noise_sd, bias=spec.bias,
                                activation=spec.activation)

    def density(X, y):
        return FlatDensity.on_rows(X, y, spec.hidden_layers, spec.bias, spec.likelihood, spec.noise_sd,
                                   prior_sd=spec.prior_sd, features=spec.features, activation=spec.activation)

    return build, density if fitting.hand_written(spec, settings, stage) else None


def informed_model(spec: ModelSpec, settings: SamplerParams, layer_prior: dict, stage: str):
    """The BNN of ``spec`` with the informed prior on one group's rows, as a PyMC model builder and a density builder.

    Parameters
    ----------
    spec : hbnn.model.spec.ModelSpec
        The model.
    settings : hbnn.config.SamplerParams
        The sampler that will fit it.
    layer_prior : dict
        Per layer, the informed prior's ``(mean, cov)`` (:func:`hbnn.model.prior.load_prior`).
    stage : str
        The fit, for the log line that says the hand-written density is not used.

    Returns
    -------
    tuple
        ``(build, density)``: ``build(X, y)`` returns the PyMC model (:func:`hbnn.model.builders.build_informed_model`,
        imported only when built); ``density(X, y)`` its hand-written log density, or ``None`` where the model has none
        (:func:`hbnn.fitting.common.hand_written`).
    """
    batch = fitting.minibatch(settings)

    def build(X, y):
        from hbnn.model.builders import build_informed_model

        return build_informed_model(X, y, spec.features, spec.hidden_layers, layer_prior, minibatch_size=batch,
                                    likelihood=spec.likelihood, noise_sd=spec.noise_sd, bias=spec.bias,
                                    activation=spec.activation)

    def density(X, y):
        return InformedDensity.on_rows(X, y, spec.hidden_layers, spec.bias, spec.likelihood, spec.noise_sd,
                                       prior=layer_prior, features=spec.features, activation=spec.activation)

    return build, density if fitting.hand_written(spec, settings, stage) else None


def fit(stage: str, params: Params, spec: ModelSpec, tasks: Tasks, layer_prior: dict | None = None,
        settings_extra: dict | None = None) -> fitting.Fit:
    """Fit one of the three models to ``tasks`` and score it: the fit stages' and the Python API's one code path.

    Parameters
    ----------
    stage : str
        ``fit_flat``, ``fit_hier`` or ``fit_informed``: which model, and its seed stream
        (:data:`hbnn.pipeline.variants.STAGE_KEYS`).
    params : hbnn.config.Params
        The checked settings: ``model``, the stage's sampler (:meth:`hbnn.config.Params.sampler_for`), ``trace``
        and ``limits``.
    spec : hbnn.model.spec.ModelSpec
        The model, built once from ``params`` (:func:`hbnn.fitting.common.model_spec`).
    tasks : hbnn.data.tasks.Tasks
        The data; each group is scored and judged on its test rows.
    layer_prior : dict, optional
        ``fit_informed`` only: per layer, the informed prior's ``(mean, cov)`` (:func:`hbnn.model.prior.load_prior`).
    settings_extra : dict, optional
        More settings for the trace's ``hbnn_settings`` attr (the informed prior's file).

    Returns
    -------
    hbnn.fitting.common.Fit
        The trace, metrics and timing; nothing is written.

    Raises
    ------
    hbnn.config.ConfigError
        Where the fit's estimated memory or time is past ``params.limits`` (before anything is compiled).
    """
    if stage == "fit_hier":
        return fitting.score(stage, params, spec, tasks, sample_hierarchical(stage, params, spec, tasks),
                             settings_extra)
    settings = params.sampler_for(stage)
    fitting.enforce_budget(stage, params, tasks)
    if stage == "fit_flat":
        models = flat_model(spec, settings, stage)
        settings_extra = {"prior_sd": spec.prior_sd, **(settings_extra or {})}
    else:
        models = informed_model(spec, settings, layer_prior, stage)
    sampled = per_group.fit_per_group(stage, settings, spec, tasks, *models)
    return fitting.score(stage, params, spec, tasks, sampled, settings_extra)
