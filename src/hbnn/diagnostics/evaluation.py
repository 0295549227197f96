"""The fit stages' metrics: scores, convergence diagnostics, PSIS-LOO, headline keys, reliability and timing.

Per group and pooled scores, convergence diagnostics and PSIS-LOO, the headline keys ``metrics/<stage>.json``
keeps, and the per-group reliability and timing figures. The scores themselves are the likelihood's
(:mod:`hbnn.model.likelihoods`), of the function-space draws :mod:`hbnn.diagnostics.predictions` computes; the
convergence criterion, the bar, is defined in :mod:`hbnn.diagnostics.criterion`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hbnn.data.tasks import Tasks
from hbnn.diagnostics import convergence, psis
from hbnn.diagnostics.criterion import (
    advi_loss_trend,
    distinct_chains,
    function_space_diagnostics,
    group_converged,
    sd_converged,
)
from hbnn.diagnostics.predictions import split_scores
from hbnn.model import likelihoods


def psis_loo(log_lik: np.ndarray) -> psis.Loo:
    """PSIS-LOO (:func:`hbnn.diagnostics.psis.loo`, ArviZ's ``az.loo`` pointwise) from the training rows.

    The relative efficiency is that of the likelihood values themselves
    (``loo``'s ``relative_eff``, averaged over rows), not of the weights: weight
    space is symmetric under hidden-unit permutations and its ESS says nothing
    here. For per-group fits each row's terms use only its own group's draws, so
    the pooled sum is the LOO of the product of the groups' posteriors.
    :meth:`hbnn.diagnostics.psis.Loo.to_arviz` gives what ``az.compare`` takes.

    Parameters
    ----------
    log_lik : numpy.ndarray
        The training rows' pointwise log-likelihood ``(chain, draw, n)``.

    Returns
    -------
    hbnn.diagnostics.psis.Loo
        The estimate.
    """
    S = log_lik.shape[0] * log_lik.shape[1]
    # np.errstate, not warnings.catch_warnings: this runs in a thread beside the stage's own (score_fit), and
    # catch_warnings swaps the process's warning filters, which a thread can restore over another's
    with np.errstate(all="ignore"):  # a row of constant likelihood values: its ESS, NaN, is dropped below
        ess = convergence.ess_mean(np.exp(log_lik - log_lik.max(axis=(0, 1))))  # az.ess(method="mean"), per row
    reff = float(np.clip(np.nanmean(ess) / S, 1.0 / S, 1.0)) if np.isfinite(ess).any() else 1.0
    with np.errstate(divide="ignore", invalid="ignore"):  # a row of constant ratios: k is infinite, not smoothed
        return psis.loo(log_lik, reff)


def bad_k_threshold(n_draws: int) -> float:
    """Pareto k above which a row's PSIS estimate is unreliable (Vehtari et al. 2024; ArviZ's ``good_k``).

    Parameters
    ----------
    n_draws : int
        The draws ``S`` behind the estimate.

    Returns
    -------
    float
        ``min(1 - 1/log10(S), 0.7)``: 0.7 from ~2,200 draws on, lower for fewer.
    """
    return min(1 - 1 / np.log10(n_draws), 0.7)


def high_k(res) -> np.ndarray:
    """Whether each row's Pareto k is above :func:`bad_k_threshold`.

    Parameters
    ----------
    res : hbnn.diagnostics.psis.Loo
        A :func:`psis_loo` result.

    Returns
    -------
    numpy.ndarray
        A bool per row.
    """
    return np.asarray(res.pareto_k) > bad_k_threshold(res.n_samples)


def elpd_difference(a, b) -> tuple[float, float]:
    """The difference of two :func:`psis_loo` results' elpd, and its standard error.

    Parameters
    ----------
    a, b : hbnn.diagnostics.psis.Loo
        Estimates over the same rows.

    Returns
    -------
    tuple of float
        ``elpd_loo(a) - elpd_loo(b)`` and ``sqrt(n var(loo_i(a) - loo_i(b)))`` (paired over the same rows, as
        ``az.compare``'s ``dse``).
    """
    d = np.asarray(a.loo_i) - np.asarray(b.loo_i)
    return float(d.sum()), float(np.sqrt(d.size * d.var()))


def loo_metrics(res, group: np.ndarray, names: Sequence[str]) -> tuple[dict, dict[str, dict]]:
    """Pooled and per-group numbers of a :func:`psis_loo` result.

    Parameters
    ----------
    res : hbnn.diagnostics.psis.Loo
        The estimate.
    group : numpy.ndarray
        Each row's group code.
    names : sequence of str
        The groups' names, by code.

    Returns
    -------
    tuple of dict
        Pooled: ``elpd``, ``se``, ``p_loo``, ``n_bad_k`` (rows whose Pareto k is above :func:`bad_k_threshold`)
        and ``max_k``; per group with rows: ``elpd`` (the sum of its rows' ``elpd_loo_i``), ``n_bad_k`` and
        ``max_k``.
    """
    k = np.asarray(res.pareto_k)
    loo_i = np.asarray(res.loo_i)
    bad = high_k(res)
    pooled = {"elpd": float(res.elpd_loo), "se": float(res.se), "p_loo": float(res.p_loo),
              "n_bad_k": int(bad.sum()), "max_k": float(k.max())}
    per_group = {}
    for g, name in enumerate(names):
        rows = group == g
        if rows.any():
            per_group[name] = {"elpd": float(loo_i[rows].sum()), "n_bad_k": int(bad[rows].sum()),
                               "max_k": float(k[rows].max())}
    return pooled, per_group


def fit_metrics(
    tasks: Tasks,
    predictions: dict[str, dict[str, list]],
    divergences: int,
    extra_diagnostics: dict[str, dict[str, float]] | None = None,
    group_divergences: Sequence[int] | None = None,
    loo: tuple[dict, dict[str, dict]] | None = None,
    advi_loss: np.ndarray | None = None,
    test_diagnostics: dict[str, dict[str, float]] | None = None,
    thinned: dict[str, dict] | None = None,
) -> dict:
    """Metrics dict for a fit stage (the scores are the likelihood's).

    Pooled scores use every row of a split; ``per_group`` is keyed by group name. Sampling diagnostics are in
    function space on test points (per group). ``sampling.groups_not_converged`` counts the groups that miss
    the bar of :func:`hbnn.diagnostics.criterion.group_converged`; each group's ``converged`` says which. Of
    those, ``sampling.flagged_groups`` names the ones whose chains settled in distinct functions
    (:func:`hbnn.diagnostics.criterion.distinct_chains`), with the numbers: a non-mixing posterior, not merely
    a short run. Everything here is a function of the posterior draws, so the same params give the same bytes;
    wall-clock times go to :func:`timing_metrics` instead.

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
        The data.
    predictions : dict
        :func:`hbnn.diagnostics.predictions.evaluate_groups`' output, with a ``test`` split.
    divergences : int
        The fit's divergences (all of them; a joint fit's concern every group).
    extra_diagnostics : dict, optional
        R-hat and ESS of further quantities (e.g. the group sds), folded into the extremes.
    group_divergences : sequence of int, optional
        Per-group fits only: each group's divergences, stored per group.
    loo : tuple of dict, optional
        :func:`loo_metrics`' output (pooled, per group).
    advi_loss : numpy.ndarray, optional
        ADVI fits: the loss per iteration, ``(groups, iterations)`` for per-group fits or ``(iterations,)`` for
        one joint fit; groups are then judged by the ADVI bar, each group's ``advi_loss`` says how its loss
        ended and ``sampling.advi_still_falling`` counts the curves still falling.
    test_diagnostics : dict, optional
        :func:`hbnn.diagnostics.criterion.function_space_diagnostics` of groups' test draws computed before
        (per-group fits judge each group as it is fitted), used instead of computing them again.
    thinned : dict, optional
        Groups drawn longer and thinned by ``thinned_by`` (``sampler.max_draws``), whose divergences (their
        whole run's, in ``group_divergences``) are judged against ``thinned_by`` times as many transitions.

    Returns
    -------
    dict
        The metrics: ``train``, ``test``, ``per_group``, ``sampling`` and, with ``loo``, ``loo``.
    """
    lik = likelihoods.get(tasks.likelihood)
    metrics: dict = {"per_group": {name: {} for name in tasks.group_names}}
    fs_rhat, fs_ess = [], []
    for split, pred in predictions.items():
        metrics[split], per_group = split_scores(lik, pred)
        draws = pred["draws"]
        for g, name in enumerate(tasks.group_names):
            if per_group[g] is not None:
                metrics["per_group"][name][split] = per_group[g]
            if split == "test" and pred["y"][g].size:
                diag = (test_diagnostics or {}).get(name) or function_space_diagnostics(draws[g])
                metrics["per_group"][name]["rhat_fn"] = diag["max_rhat"]
                metrics["per_group"][name]["ess_bulk_fn"] = diag["min_ess_bulk"]
                fs_rhat.append(diag["max_rhat"])
                fs_ess.append(diag["min_ess_bulk"])
    n_draws = int(predictions["test"]["draws"][0].shape[0] * predictions["test"]["draws"][0].shape[1])
    not_converged, flagged = 0, {}
    test = predictions["test"]
    trend = None if advi_loss is None else advi_loss_trend(advi_loss)
    for g, name in enumerate(tasks.group_names):
        group = metrics["per_group"][name]
        # Per-group fits: the group's own divergences. One joint fit: its divergences concern every group.
        div = int(divergences) if group_divergences is None else int(group_divergences[g])
        longer = (thinned or {}).get(name)
        if group_divergences is not None:
            group["divergences"] = div
        advi = None if trend is None else trend[g if len(trend) > 1 else 0]
        if advi is not None:
            group["advi_loss"] = advi
        group["converged"] = group_converged(group.get("rhat_fn"), group.get("ess_bulk_fn"), div,
                                             n_draws * (longer["thinned_by"] if longer else 1), advi)
        not_converged += not group["converged"]
        # ADVI's chains are one approximation's independent draws: distinct chains cannot happen
        evidence = (None if group["converged"] or not test["y"][g].size or advi is not None
                    else distinct_chains(test["draws"][g]))
        if evidence is not None:
            means = ", ".join(f"{m:.3f}" for m in evidence["chain_means"].values())
            flagged[name] = {
                **evidence,
                "reason": (f"chains settled in distinct functions: at test point {evidence['test_point']} the chain "
                           f"means are {means}, {evidence['separation_sigma']:.1f} standard errors apart, each chain "
                           f"with >= {min(evidence['chain_ess_bulk'].values()):.0f} effective draws; "
                           f"R-hat {evidence['rhat']:.3f}"),
            }
    extra = extra_diagnostics or {}
    rhats = fs_rhat + [d["rhat"] for d in extra.values()]
    esses = fs_ess + [d["ess_bulk"] for d in extra.values()]
    metrics["sampling"] = {
        "divergences": int(divergences),
        "max_rhat": max(rhats) if rhats else None,
        "min_ess_bulk": min(esses) if esses else None,
        "max_rhat_fn": max(fs_rhat) if fs_rhat else None,
        "min_ess_bulk_fn": min(fs_ess) if fs_ess else None,
        "groups_not_converged": not_converged,
        "flagged_groups": flagged,
    }
    if trend is not None:
        metrics["sampling"]["advi_still_falling"] = sum(t["still_falling"] for t in trend)
    if extra:
        metrics["sampling"]["group_sd"] = extra
        # the group sds are reported quantities too: a count beside the groups', so that a miss shows in the metrics
        metrics["sampling"]["sds_not_converged"] = sum(not sd_converged(d, trend is not None) for d in extra.values())
    if loo is not None:
        add_loo(metrics, loo)
    return metrics


def group_diagnostics(metrics: dict) -> dict[str, dict]:
    """Each group's convergence numbers from :func:`fit_metrics`' metrics: what a trace keeps in its
    ``sample_stats`` attr ``hbnn_diagnostics`` and the Python API's ``diagnostics()`` shows.

    Parameters
    ----------
    metrics : dict
        :func:`fit_metrics`' output.

    Returns
    -------
    dict
        Per group: ``rhat`` and ``ess_bulk`` (function space, on the points the group is judged on; ``None`` where
        it has none), ``divergences`` (its own fit's, or the joint fit's), and ``converged``
        (:func:`hbnn.diagnostics.criterion.group_converged`).
    """
    total = metrics["sampling"]["divergences"]
    return {name: {"rhat": g.get("rhat_fn"), "ess_bulk": g.get("ess_bulk_fn"),
                   "divergences": int(g.get("divergences", total)), "converged": bool(g["converged"])}
            for name, g in metrics["per_group"].items()}


def add_loo(metrics: dict, loo: tuple[dict, dict[str, dict]]) -> None:
    """Put :func:`loo_metrics`' output into :func:`fit_metrics`' metrics, in place.

    Parameters
    ----------
    metrics : dict
        :func:`fit_metrics`' output.
    loo : tuple of dict
        :func:`loo_metrics`' output (pooled, per group).
    """
    metrics["loo"] = loo[0]
    for name, values in loo[1].items():
        metrics["per_group"][name]["loo"] = values


HEADLINE_SAMPLING = ("divergences", "max_rhat", "min_ess_bulk", "groups_not_converged")  # whether a fit converged


# ADVI fits; hierarchical fits (their group sds; chains that may restart)
HEADLINE_SAMPLING_IF_PRESENT = ("advi_still_falling", "sds_not_converged", "restarts")


HEADLINE_LOO = ("elpd", "se", "p_loo", "n_bad_k")  # the estimate, its precision and whether to trust it


def headline(metrics: dict, score: str) -> dict:
    """The keys of :func:`fit_metrics` that ``metrics/<model>.json`` holds (the headline keys).

    ``dvc exp show`` makes one column per key, so the declared metrics file holds the headline score of the
    training rows, every score of the test rows, the LOO estimate and the convergence summary, with each flagged
    group's reason; the complete dict (per group, every diagnostic) goes to ``metrics/detail/``.

    Parameters
    ----------
    metrics : dict
        :func:`fit_metrics`' output.
    score : str
        The likelihood's headline score.

    Returns
    -------
    dict
        The headline keys.
    """
    train, test = metrics["train"], metrics["test"]
    out = {
        "train": {score: train[score]},
        "test": {k: v for k, v in test.items() if k != "n"},
        "sampling": {k: metrics["sampling"][k] for k in (*HEADLINE_SAMPLING, *HEADLINE_SAMPLING_IF_PRESENT)
                     if k in metrics["sampling"]}
        | {"flagged_groups": {g: f["reason"] for g, f in metrics["sampling"]["flagged_groups"].items()}},
    }
    if "loo" in metrics:
        out["loo"] = {k: metrics["loo"][k] for k in HEADLINE_LOO}
    return out


def reliability(p_bar: np.ndarray, y: np.ndarray, n_bins: int = 10) -> dict[str, np.ndarray]:
    """Reliability (calibration) table of mean probabilities in equal-width bins.

    Parameters
    ----------
    p_bar : numpy.ndarray
        Each row's posterior mean probability; ``p = 1`` falls in the last bin.
    y : numpy.ndarray
        Each row's 0/1 label.
    n_bins : int, optional
        The number of bins.

    Returns
    -------
    dict of str to numpy.ndarray
        ``bin_mid``, ``mean_predicted`` and ``observed`` (fraction of ``y = 1``), NaN for empty bins, and
        ``count`` per bin.
    """
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.clip(np.digitize(p_bar, edges[1:-1]), 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_pred = np.bincount(idx, weights=p_bar, minlength=n_bins) / count
        observed = np.bincount(idx, weights=y.astype(float), minlength=n_bins) / count
    return {"bin_mid": (edges[:-1] + edges[1:]) / 2, "mean_predicted": mean_pred, "observed": observed,
            "count": count}


def timing_metrics(backend: str, seconds: float, compile_seconds: float | None, grad_evals: int | None,
                   parallel_chains: int = 1, advi_iterations: int | None = None) -> dict:
    """Wall-clock cost of a fit: seconds, compile seconds and gradient evaluations.

    Parameters
    ----------
    backend : str
        The sampler backend.
    seconds : float
        Wall time of the sampling.
    compile_seconds : float or None
        Wall time of the compile.
    grad_evals : int or None
        Leapfrog steps, tuning included, over all chains and groups (``None`` where the backend does not
        report tuning steps).
    parallel_chains : int, optional
        Chains that step at the same time on their own cores.
    advi_iterations : int, optional
        ADVI fits: the iterations run.

    Returns
    -------
    dict
        ``backend`` and ``sampling`` (the numbers above and ``us_per_grad``, the wall time of one gradient
        evaluation within a chain, sampler overhead included: ``seconds * parallel_chains / grad_evals``).
    """
    us = 1e6 * seconds * parallel_chains / grad_evals if grad_evals else None
    out: dict = {"seconds": seconds, "compile_seconds": compile_seconds, "grad_evals": grad_evals,
                 "us_per_grad": us}
    if advi_iterations is not None:
        out["advi_iterations"] = advi_iterations
    return {"backend": backend, "sampling": out}
