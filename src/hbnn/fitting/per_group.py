"""The per-group fits (flat and informed): every group's model fitted from its own seed, and the groups that miss
the convergence bar fitted again, longer (thinned back to the stage's draws) or at a higher target_accept."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np
import xarray as xr

from hbnn.config import DIVERGENT_SHARE_MAX, ESS_MIN, SamplerParams
from hbnn.data.tasks import Tasks
from hbnn.diagnostics import criterion
from hbnn.diagnostics.predictions import group_weights, quantity_draws
from hbnn.fitting.common import Cost, Sampled
from hbnn.logs import watch
from hbnn.model.spec import ModelSpec
from hbnn.pipeline.variants import STAGE_KEYS, derive_seed
from hbnn.sampling import cluster
from hbnn.sampling.runlength import ESS_SPARE

log = logging.getLogger(__name__)


class GroupProgress:
    """Where a loop over groups stands, for its heartbeat: groups and draws done, divergences, time left.

    Parameters
    ----------
    n_groups : int
        The groups the loop fits.
    draws_per_group : int
        Draws each group's fit keeps (all chains).
    """

    def __init__(self, n_groups: int, draws_per_group: int):
        self.n_groups, self.draws_per_group = n_groups, draws_per_group
        self.groups = self.divergences = 0
        self.seconds = 0.0

    def done(self, seconds: float, divergences: int) -> None:
        """Count one group as done.

        Parameters
        ----------
        seconds : float
            Its sampling time.
        divergences : int
            Its divergent transitions.
        """
        self.groups += 1
        self.seconds += seconds
        self.divergences += divergences

    def _counts(self) -> str:
        return (f"{self.groups}/{self.n_groups} groups, {self.groups * self.draws_per_group}/"
                f"{self.n_groups * self.draws_per_group} draws, {self.divergences} divergences so far")

    def status(self, elapsed: float) -> str:
        """``7/18 groups, 14000/36000 draws, 0 divergences so far, ~19s left`` (time left from the groups done).

        Parameters
        ----------
        elapsed : float
            Seconds since the loop started.

        Returns
        -------
        str
        """
        left = f", ~{elapsed / self.groups * (self.n_groups - self.groups):.0f}s left" if self.groups else ""
        return self._counts() + left

    def summary(self) -> str:
        """The counts and the seconds spent sampling, once the loop is done."""
        return self._counts() + f", {self.seconds:.1f}s sampling"


def fit_per_group(stage: str, settings: SamplerParams, spec: ModelSpec, tasks: Tasks, build, density=None
                  ) -> Sampled:
    """Fit ``build(X, y)``, a PyMC model of ``spec``, to every group's training rows, compiled once per process.

    The fits run where ``HBNN_DASK_SCHEDULER`` says (:mod:`hbnn.sampling.cluster`): in this process by default, or in
    shards on a Dask cluster, with the same draws.

    Parameters
    ----------
    stage : str
        The fit (its seed stream, :data:`hbnn.pipeline.variants.STAGE_KEYS`, and log lines).
    settings : hbnn.config.SamplerParams
        The sampler.
    spec : hbnn.model.spec.ModelSpec
        The model.
    tasks : hbnn.data.tasks.Tasks
        The data; each group's training rows are one fit.
    build : callable
        ``build(X, y)``: the PyMC model on one group's rows.
    density : callable, optional
        ``density(X, y)``: the model's hand-written log density on those rows (:mod:`hbnn.density.kernel`), which
        nutpie samples instead of PyTensor's (the same density, checked before sampling).

    Returns
    -------
    hbnn.fitting.common.Sampled
        The posterior and sample stats stacked along a ``group`` dim, and the cost summed over groups.
    """
    train = tasks.split("train")
    first = train.rows(0)
    x, y = train.X[first], train.y[first]
    model = cluster.Model(build, settings, x, y, None if density is None else density(x, y))
    jobs = []
    for g, name in enumerate(tasks.group_names):
        rows = train.rows(g)
        jobs.append(cluster.GroupJob(g, name, derive_seed(settings.seed, STAGE_KEYS[stage], g), train.X[rows],
                                     train.y[rows]))
    progress = GroupProgress(tasks.n_groups, settings.chains * settings.draws)

    def done(result: cluster.GroupResult) -> None:
        progress.done(result.seconds, result.divergences)
        log.debug("%s: group %s (%d/%d, %d rows) sampled in %.1fs, %d divergences", stage, result.name,
                  progress.groups, tasks.n_groups, jobs[result.index].y.size, result.seconds, result.divergences)

    with watch(log, stage, status=progress.status):
        fitted = cluster.fit_groups(stage, model, jobs, done)
        results, thinned, raised, diagnostics = fitted.results, {}, {}, None
        compile_seconds = fitted.compile_seconds
        # ADVI's draws are one approximation's independent draws, judged by its loss: a refit from the same seed
        # would give the same approximation
        if settings.backend != "advi" and (settings.max_draws > settings.draws or settings.refit_applies):
            results, thinned, raised, diagnostics, refits = _lengthen(stage, tasks, spec, model, jobs, results,
                                                                      progress)
            compile_seconds = None if compile_seconds is None or None in refits else compile_seconds + sum(refits)
    log.info("%s: %s", stage, progress.summary())

    def stack(parts):
        ds = xr.concat(parts, dim="group", combine_attrs="drop_conflicts")
        order = ["chain", "draw", "group"]
        return ds.transpose(*order, ...)

    posts = [r.posterior.expand_dims(group=[r.name]) for r in results]
    stats = [r.sample_stats.expand_dims(group=[r.name]) for r in results]
    grads = [r.grad_evals for r in results]
    grad_evals = None if any(g is None for g in grads) else sum(grads)
    return Sampled(stack(posts), stack(stats), Cost(progress.seconds, compile_seconds, grad_evals),
                   thinned=thinned or None, raised=raised or None, test_diagnostics=diagnostics)


def _group_test_diagnostics(tasks: Tasks, g: int, posterior: xr.Dataset, spec: ModelSpec) -> dict[str, float] | None:
    """Function-space max R-hat and min bulk ESS of group ``g``'s test points at one per-group fit's draws of
    ``spec`` (the numbers the metrics judge it by); ``None`` for a group without test rows."""
    test = tasks.split("test")
    rows = test.rows(g)
    if not rows.size:
        return None
    draws = quantity_draws(tasks, group_weights(posterior, spec.layers, None), test.X[rows], spec.activation)
    return criterion.function_space_diagnostics(draws)


def _lengthen(stage: str, tasks: Tasks, spec: ModelSpec, model: cluster.Model, jobs: Sequence[cluster.GroupJob],
              results: Sequence[cluster.GroupResult], progress: GroupProgress
              ) -> tuple[list[cluster.GroupResult], dict[str, dict], dict[str, dict], dict[str, dict[str, float]],
                         list]:
    """Every group whose fit misses the convergence bar is fitted again from its own seed:

    - with ``sampler.max_draws``, where its ``draws`` miss function-space R-hat <= 1.01 or bulk ESS >= 400 on its
      test points: with ``k`` times the draws per chain and each chain thinned to every ``k``-th draw, ``k``
      growing (where the ESS extrapolates, at least by one) until the thinned draws meet the bar or ``k * draws``
      would pass ``max_draws``;
    - with ``sampler.refit_target_accept`` above ``target_accept``, where more of its transitions diverge than the
      bar allows: once, at that target_accept (and longer where R-hat or ESS miss too).

    A stage's per-group traces share one ``draw`` dim, so a group cannot simply keep more draws; thinned,
    it keeps ``draws`` draws of a longer chain (nutpie's longer run from the same seed starts with the same
    draws). Its divergences are those of the whole run (a kept draw is marked divergent where any draw it stands
    for diverged) and ``n_steps`` the steps they took; its seconds and gradients count every run. Returns the
    results; per group drawn longer what it missed, ``thinned_by``, the draws per chain drawn and the whole
    run's divergences (:func:`hbnn.diagnostics.evaluation.fit_metrics` judges them against its ``k * draws``
    transitions); per group fitted again at a higher target_accept, that target_accept, its divergences before and after
    and the draws per chain; every group's diagnostics at the draws it keeps (the metrics' own, so they are not computed
    twice); and the refits' compile seconds."""
    s = model.settings
    out = list(results)
    thinned: dict[str, dict] = {}
    raised: dict[str, dict] = {}
    diagnostics: dict[str, dict[str, float]] = {}
    # what made each fix necessary, at the fit that first needed it: R-hat/ESS for a longer fit, divergences for a
    # higher target_accept
    short_at: dict[int, dict] = {}
    diverged_at: dict[int, dict] = {}
    pending = {}  # group -> (draws factor k, target_accept, diagnostics, divergences) of its fit so far
    for r in out:
        d = _group_test_diagnostics(tasks, r.index, r.posterior, spec)
        if d is not None:
            diagnostics[r.name] = d
        pending[r.index] = (1, s.target_accept, d, r.divergences)
    compiles: list = []
    while pending:
        by_fit: dict[tuple[int, float], list[int]] = {}
        for g, (k, ta, d, div) in pending.items():
            transitions = s.chains * k * s.draws
            short = d is not None and not criterion.meets_bar(d["max_rhat"], d["min_ess_bulk"])
            diverging = not criterion.divergences_within_bar(div, transitions)
            if not short and not diverging:
                continue
            k_next = k
            if short:
                ess = d["min_ess_bulk"]
                grow = k + 1
                if np.isfinite(ess) and 0 < ess < ESS_MIN:
                    grow = max(grow, int(np.ceil(k * ESS_MIN * ESS_SPARE / ess)))
                k_next = max(k, min(grow, s.max_refit_factor))
            ta_next = s.refit_target_accept if diverging and s.refit_target_accept > ta else ta
            what = ", ".join(([f"function-space R-hat {d['max_rhat']:.3f}, bulk ESS {d['min_ess_bulk']:.0f}"]
                              if short else []) +
                             ([f"{div} divergences, past the bar's {DIVERGENT_SHARE_MAX:.1%} of "
                               f"{transitions} transitions"] if diverging else []))
            if k_next == k and ta_next == ta:
                if short and s.max_draws > s.draws:
                    log.warning("%s: group %s misses the bar at %d draws per chain (%s), and max_draws=%d "
                                "(sampler.max_draws) allows no longer fit; its diagnostics say so", stage, jobs[g].name,
                                k * s.draws, what, s.max_draws)
                if diverging and s.refit_applies:
                    log.warning("%s: group %s still diverges at refit_target_accept=%s (sampler.refit_target_accept; "
                                "%d divergences in %d transitions); its diagnostics say so", stage, jobs[g].name, ta,
                                div, transitions)
                continue
            if k_next > k:
                short_at.setdefault(g, {"draws_per_chain": k * s.draws, **{key: float(v) for key, v in d.items()}})
            if ta_next != ta:
                diverged_at.setdefault(g, {"draws_per_chain": k * s.draws, "divergences": int(div),
                                           "transitions": transitions})
            how = []
            if k_next > k:
                how.append(f"with {k_next * s.draws} draws per chain, thinned by {k_next}")
            if ta_next != ta:
                how.append(f"at target_accept {ta_next} (sampler.refit_target_accept)")
            log.info("%s: group %s misses the bar at %d draws per chain (%s); fitting it again %s", stage,
                     jobs[g].name, k * s.draws, what, " and ".join(how))
            by_fit.setdefault((k_next, ta_next), []).append(g)
        pending_next = {}
        for (k, ta), groups in sorted(by_fit.items()):
            again = dataclasses.replace(model, settings=dataclasses.replace(s, draws=k * s.draws, max_draws=0,
                                                                             target_accept=ta))
            refit = cluster.fit_groups(f"{stage}-x{k}" + (f"-ta{ta}" if ta != s.target_accept else ""), again,
                                       [jobs[g] for g in groups])
            compiles.append(refit.compile_seconds)
            for r in refit.results:
                progress.seconds += r.seconds
                thin = _thinned(r, k, s.draws, out[r.index])
                out[r.index] = thin
                d = _group_test_diagnostics(tasks, r.index, thin.posterior, spec)
                if d is not None:
                    diagnostics[r.name] = d
                # k and target_accept only grow, so a group's records are replaced, never dropped
                if k > 1:
                    thinned[r.name] = {"thinned_by": k, "draws_per_chain": k * s.draws, "divergences": r.divergences,
                                       "missed": short_at[r.index]}
                if ta != s.target_accept:
                    raised[r.name] = {"target_accept": ta, "draws_per_chain": k * s.draws,
                                      "divergences": r.divergences, "transitions": s.chains * k * s.draws,
                                      "missed": diverged_at[r.index]}
                pending_next[r.index] = (k, ta, d, r.divergences)
        pending = pending_next
    return out, dict(sorted(thinned.items())), dict(sorted(raised.items())), diagnostics, compiles


def _thinned(r: cluster.GroupResult, k: int, draws: int, before: cluster.GroupResult) -> cluster.GroupResult:
    """A longer run's result with each chain thinned to every ``k``-th draw (``draws`` of them), divergences and
    steps kept whole; seconds and gradients add those of the runs before it."""
    keep = slice(k - 1, None, k)
    post = r.posterior.isel(draw=keep).assign_coords(draw=np.arange(draws))
    stats = r.sample_stats.isel(draw=keep).assign_coords(draw=np.arange(draws))
    for name, reduce in (("diverging", np.any), ("n_steps", np.sum)):
        if name in r.sample_stats:
            da = r.sample_stats[name].transpose("chain", "draw", ...)
            blocks = da.values.reshape(da.shape[0], draws, k, *da.shape[2:])
            stats[name] = (da.dims, reduce(blocks, axis=2).astype(da.dtype))
    grads = None if r.grad_evals is None or before.grad_evals is None else r.grad_evals + before.grad_evals
    return dataclasses.replace(r, posterior=post, sample_stats=stats, seconds=r.seconds + before.seconds,
                               grad_evals=grads, divergences=r.divergences)
