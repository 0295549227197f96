"""The ``check_params`` stage: every key, the data and every stage's cost checked before any stage samples.

:func:`check_params` reads a table as ``make_data`` would, then holds each stage's estimate
(:mod:`hbnn.pipeline.budget`) against ``limits`` and the transfer stages' refusals against the data's groups, so that
a run that cannot finish stops before its first fit.
"""

from __future__ import annotations

import functools
import logging

from hbnn.config import ESS_MIN, ConfigError, Params
from hbnn.pipeline.budget import data_estimate, enforce, fit_estimate, n_weights, prior_estimate, report_estimate

log = logging.getLogger(__name__)


def check_params(params: Params) -> None:
    """Body of the ``check_params`` stage, which depends on the whole ``params.yaml``.

    Loading validated every key (a typo in a key no stage reads would pass silently). A table is read and checked as
    ``make_data`` checks it; with the data's sizes, every stage's cost and the transfer stages' refusals are checked
    before any stage samples. A table edited later is checked again by ``make_data`` and ``transfer_prior``.

    Parameters
    ----------
    params : hbnn.config.Params

    Raises
    ------
    hbnn.config.ConfigError
        A cost over the limits, too few groups, too few draws for the informed prior, or a plug-in prior from an
        ADVI fit.
    hbnn.errors.InputError
        A data table ``make_data`` would refuse, or a sampler package outside the supported releases.
    """
    _check_sampler_packages(params)
    _warn_too_few_draws(params)
    if params.data.source == "table":
        names, train, test, n_features = _table_sizes(params)
    else:
        enforce(data_estimate(params), params)
        # as hbnn.pipeline.transfer.require_groups says it for a table's groups, naming the key here
        if params.n_groups < 2:
            raise ConfigError(f"invalid parameter n_groups={params.n_groups}: the transfer stages need at least 2 "
                              "groups (one to fit, one to hold out)")
        d = params.data
        n_train = round(d.n_samples * d.train_fraction)
        names = [f"g{g}" for g in range(params.n_groups)]  # only their count and order matter here
        train = [n_train] * params.n_groups
        test = [d.n_samples - n_train] * params.n_groups
        n_features = 2  # moons: x1, x2
    _check_stages(params, names, train, test, n_features)


def _check_sampler_packages(params: Params) -> None:
    """Refuse, before any stage starts, a nutpie or NumPyro outside the releases hbnn's adapters to their internals
    support (:mod:`hbnn.sampling.nutpie_adapter`, :mod:`hbnn.sampling.numpyro_adapter`), where a fit uses them; the
    fits check again as they start."""
    backends = {params.sampler.backend, params.hier_sampler.backend}
    if "nutpie" in backends:
        from hbnn.sampling.nutpie_adapter import check_version

        check_version()
    if "numpyro" in backends:
        from hbnn.sampling.numpyro_adapter import check_version

        check_version()


def _warn_too_few_draws(params: Params) -> None:
    """Warn where a fit keeps fewer draws than the convergence bar's bulk ESS (:data:`hbnn.config.ESS_MIN`): a draw
    counts about once at best, so such a fit can hardly back its numbers and the report will call its groups not
    converged. Allowed (a quick look at a pipeline is a fair use), but said before any sampling."""
    h = params.hier_sampler  # drawn on until the bar is met; a per-group fit drawn longer is thinned back to draws
    for key, s, kept in (("sampler", params.sampler, params.sampler.draws), ("hier_sampler", h, h.draw_limit)):
        if s.chains * kept < ESS_MIN:
            what = f"{key}.max_draws" if kept > s.draws else f"{key}.draws"
            log.warning("%s.chains x %s = %d x %d = %d draws per fit, fewer than the bulk ESS of %d the convergence "
                        "bar asks of every reported quantity (a draw counts about once at best): expect the report to "
                        "call its groups not converged; raise %s to at least %d for numbers it can back",
                        key, what, s.chains, kept, s.chains * kept, ESS_MIN, what, -(-ESS_MIN // s.chains))


def _table_sizes(params: Params) -> tuple[list[str], list[int], list[int], int]:
    """A table's group names, training and test rows per group and features, read and checked as ``make_data``
    reads and checks it (:func:`hbnn.data.tasks.make_tasks`)."""
    import numpy as np

    from hbnn.data.spec import DataSpec
    from hbnn.data.tasks import Tasks, make_tasks  # here: loads xarray and pandas (moons need not)
    from hbnn.pipeline.runner import skip_dask_array_lookup
    from hbnn.pipeline.transfer import data_name, require_groups

    skip_dask_array_lookup()  # xarray is loaded only now, after the stage's own call (hbnn.pipeline.runner.run_stage)

    tasks = Tasks(make_tasks(DataSpec.of(params)))
    require_groups(tasks.n_groups, data_name(params))
    count = functools.partial(np.bincount, minlength=tasks.n_groups)
    train, test = (count(tasks.split(part).group).tolist() for part in ("train", "test"))
    return list(tasks.group_names), train, test, tasks.n_features


def _check_stages(params: Params, names: list[str], train: list[int], test: list[int], n_features: int) -> None:
    """Every stage's cost and the transfer stages' refusals, for groups ``names`` with ``train`` and ``test`` rows
    each."""
    from hbnn.pipeline.transfer import check_refits, holdout, refit_rows, refit_sizes

    n = len(names)
    h, s = params.hier_sampler, params.sampler
    _check_prior_draws(params, n_features)
    for stage in ("fit_flat", "fit_hier", "fit_informed"):
        enforce(fit_estimate(stage, params, n, sum(train), sum(test), n_features, max(train)), params)
    enforce(prior_estimate("derive_prior", params, h.chains * h.draw_limit, n, n_features), params)
    enforce(report_estimate(params, n, n_features, max(h.chains * h.draw_limit, s.chains * s.draws), sum(train)),
            params)
    # the transfer stages (hbnn.pipeline.transfer): the groups they hold out, as transfer_prior chooses them
    position = {name: g for g, name in enumerate(names)}
    held = [position[name] for name in holdout(names, params.transfer)]
    out = set(held)
    kept = [g for g in range(n) if g not in out]
    enforce(fit_estimate("transfer_hier", params, len(kept), sum(train[g] for g in kept), sum(test[g] for g in kept),
                         n_features, max((train[g] for g in kept), default=0)), params)
    enforce(prior_estimate("transfer_prior", params, h.chains * h.draw_limit, len(kept), n_features), params)
    check_refits([train[g] for g in held], params.transfer)
    refits = [(g, rows) for g in held for _, rows in refit_sizes(train[g], params.transfer)]
    t = params.transfer  # transfer_refit: the training groups with the held-out groups' rows at each size
    for size in [*refit_rows(t), *([None] if t.refit_all_rows and t.all_rows else [])]:  # None: every training row
        new = [(g, train[g] if size is None else size) for g in held if size is None or train[g] > size]
        enforce(fit_estimate("transfer_refit", params, len(kept) + len(new), sum(train[g] for g in kept)
                             + sum(r for _, r in new), sum(test[g] for g in [*kept, *(g for g, _ in new)]),
                             n_features, max([train[g] for g in kept] + [r for _, r in new], default=0)), params)
    for stage in ("transfer_flat", "transfer_informed"):
        enforce(fit_estimate(stage, params, len(refits), sum(rows for _, rows in refits),
                             sum(test[g] for g, _ in refits), n_features, max((r for _, r in refits), default=0)),
                params)


def _check_prior_draws(params: Params, n_features: int) -> None:
    """Refuse an informed prior whose widest layer's covariance would be fitted from no more draws than the layer
    has weights: the fitted covariance is then singular, and the informed nets are pinned to ``prior.jitter`` in
    the directions the draws miss (nothing else would say so). The draws are at least ``hier_sampler.draws`` per
    chain (one chain with ``prior.align: reference_chain``) times ``prior.draws_per_sample``. ``prior.method:
    plugin`` fits no covariance (one draw's ``sd^2 I``) but picks the draw by the hierarchical fit's log density per
    draw, which an ADVI fit does not record: refused here, before the fit, rather than after it."""
    h, p = params.hier_sampler, params.prior
    if p.method == "plugin":
        if h.backend == "advi":
            raise ConfigError("invalid parameter prior.method='plugin': it takes the hierarchical fit's draw of the "
                              "highest log density, which hier_sampler.backend='advi' does not record; use a NUTS "
                              "backend or prior.method: mvnormal")
        return
    chains = h.chains if p.align == "chains" else 1
    draws = chains * h.draws * p.draws_per_sample
    widest = max(n_weights(n_features, params.model.hidden_layers, params.model.bias))
    if draws <= widest:
        used = "hier_sampler.chains x " if chains > 1 else ""
        raise ConfigError(f"invalid parameter prior.draws_per_sample={p.draws_per_sample}: the informed prior's "
                          f"widest layer has {widest} weights, and its covariance would be fitted from {draws} draws "
                          f"({used}hier_sampler.draws x prior.draws_per_sample), which leaves it singular; raise "
                          f"prior.draws_per_sample or hier_sampler.draws so that there are more than {widest}")
