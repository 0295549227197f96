"""The report's status and diagnostics sections: whether the inference can be trusted, per model and group,
with the numbers that back it and what to change where it cannot.
"""

from __future__ import annotations

from collections.abc import Sequence

from hbnn.diagnostics import criterion
from hbnn.diagnostics.advice import model_advice
from hbnn.diagnostics.criterion import ADVI_MIN_DROP
from hbnn.errors import counted
from hbnn.model import likelihoods
from hbnn.pipeline.variants import BY_NAME
from hbnn.report.document import Figure, Heading, Para, Section, Table
from hbnn.report.metric_plots import NAMED_GROUPS_MAX
from hbnn.report.numbers import (
    ESS_OK,
    LABELS,
    MODELS,
    RHAT_OK,
    ess_text,
    fmt,
    lookup,
)


def _fitted_with_advi(sampling: dict) -> bool:
    """Whether a model's ``sampling`` metrics are an ADVI fit's (they count its loss curves still falling): its draws
    are independent draws of one approximation, so it has no divergences and its R-hat is not judged."""
    return "advi_still_falling" in sampling


def _rhat_cell(value, advi: bool) -> str:
    return fmt(value) + (" (not judged)" if advi else "")


def _loss_text(trend: dict) -> str:
    return (f"loss still falling: {trend['drop']:.1%} over the last quarter of the iterations, "
            f"{trend['z']:.1f} standard errors")


MISSING_NAMED = 6  # groups named in a model's row of the status table; all of them are in the table below it
MISSING_ROWS = 30  # rows of the table of groups missing the bar; the rest are in metrics/detail/<model>.json


def _missing_row(model: str, metrics: dict, g: str) -> list[str]:
    """A group that misses the bar, with its numbers: model, group, function-space R-hat, bulk ESS, divergences
    (``n/a`` for ADVI) and, for ADVI, its loss trend."""
    d = lookup(metrics, "per_group", g) or {}
    ess = d.get("ess_bulk_fn")
    advi = "advi_loss" in d
    trend = d["advi_loss"] if advi else None
    return [LABELS[model], g, _rhat_cell(d.get("rhat_fn"), advi), ess_text(ess),
            "n/a" if advi else str(d.get("divergences", 0) or 0),
            _loss_text(trend) if trend and trend["still_falling"] else ("settled" if advi else "")]


def _joint_loss_trend(metrics: dict, missing: Sequence[str]) -> dict | None:
    """The loss trend that makes every group of ``missing`` miss the bar where they are one joint ADVI fit whose one
    loss is still falling (said once, not per group); ``None`` otherwise."""
    if len(missing) < 2 or lookup(metrics, "sampling", "advi_still_falling") != 1:
        return None
    trends = [lookup(metrics, "per_group", g, "advi_loss") for g in missing]
    if all(t is not None and t == trends[0] and t["still_falling"] for t in trends):
        return trends[0]
    return None


def _missing_cell(metrics: dict, missing: Sequence[str]) -> str:
    """The groups that miss the bar, at most :data:`MISSING_NAMED` named (their numbers are in the table below
    the status table); a joint ADVI fit whose one loss is still falling is said once, not per group."""
    if not missing:
        return "none"
    trend = _joint_loss_trend(metrics, missing)
    if trend is not None:
        return f"all {len(missing)} (one joint fit, its {_loss_text(trend)})"
    shown = ", ".join(missing[:MISSING_NAMED])
    return shown + (f" and {len(missing) - MISSING_NAMED} more" if len(missing) > MISSING_NAMED else "")


def _missing_table(metrics: dict[str, dict], missing: dict[str, list[str]]) -> list:
    """The groups that miss the bar, one row each with their numbers (at most :data:`MISSING_ROWS`)."""
    rows = [_missing_row(v, metrics[v], g) for v in MODELS for g in missing.get(v, [])]
    if not rows:
        return []
    header = ["Model", "Group", "R-hat (fn)", "Bulk ESS (fn)", "Divergences", "ADVI loss"]
    if not any(r[5] for r in rows):  # no ADVI fit among them: no column for it
        header, rows = header[:5], [r[:5] for r in rows]
    blocks: list = [Heading("Groups missing the bar"), Table(header, rows[:MISSING_ROWS], text_columns=(1,))]
    if len(rows) > MISSING_ROWS:
        blocks.append(Para(f"... and {len(rows) - MISSING_ROWS} more: every group's numbers are in "
                           "metrics/detail/<model>.json (per_group)."))
    return blocks


def _status_section(metrics: dict[str, dict], names: Sequence[str], sd_vars: Sequence[str],
                    transfer: dict | None = None, settings: dict | None = None,
                    drawn: dict[str, int] | None = None, sd_draws: dict | None = None) -> Section:
    """First section: does every model meet the convergence bar, which groups miss it and by how much,
    and where PSIS-LOO is unreliable; the same for the transfer experiment's fits (``transfer``: its detail
    metrics). Drawn red when anything fails; the remedy names the settings of the fits that miss (``settings``: each
    model's trace settings, ``drawn``: the draws per chain its trace holds), and the model advice
    (:func:`hbnn.diagnostics.advice.model_advice`) reads the hierarchical group sds' draws (``sd_draws``)."""
    header = ["Model", "Converged", "Groups meeting the bar", "Max R-hat (fn)", "Min bulk ESS (fn)", "Divergences",
              "Groups missing it", "LOO rows with high Pareto k"]
    rows, missing_any, short, diverging = [], False, [], []  # NUTS fits missing by R-hat/ESS, by divergences
    missing_by: dict[str, list[str]] = {}
    for v in MODELS:
        s = lookup(metrics[v], "sampling") or {}
        missing = [g for g in names if not lookup(metrics[v], "per_group", g, "converged")]
        missing_any |= bool(missing)
        # a joint ADVI fit's groups are said once in its row, not per group
        missing_by[v] = [] if _joint_loss_trend(metrics[v], missing) is not None else missing
        if not _fitted_with_advi(s):
            for g in missing:  # R-hat and ESS met but the group misses: its (or its joint fit's) divergences
                met = criterion.meets_bar(lookup(metrics[v], "per_group", g, "rhat_fn"),
                                           lookup(metrics[v], "per_group", g, "ess_bulk_fn"))
                (diverging if met else short).append(v)
        bad_k = lookup(metrics[v], "loo", "n_bad_k")
        advi = _fitted_with_advi(s)
        rows.append([LABELS[v] + (" (ADVI)" if advi else ""), "NO" if missing else "yes",
                     f"{len(names) - len(missing)}/{len(names)}", _rhat_cell(s.get("max_rhat_fn"), advi),
                     ess_text(s.get("min_ess_bulk_fn")), "n/a" if advi else fmt(s.get("divergences"), "d"),
                     _missing_cell(metrics[v], missing),
                     "n/a" if bad_k is None else f"{bad_k} of {lookup(metrics[v], 'train', 'n')}"])
    advi_models = [LABELS[v] for v in MODELS if _fitted_with_advi(lookup(metrics[v], "sampling") or {})]
    sds = lookup(metrics["hierarchical"], "sampling", "group_sd") or {}
    hier_advi = LABELS["hierarchical"] in advi_models  # independent draws: R-hat is not judged
    sd_bad = _sds_missing(sds, sd_vars, hier_advi)
    transfer_text, transfer_failing = _transfer_status(transfer) if transfer is not None else ("", False)
    failing = missing_any or bool(sd_bad) or transfer_failing
    if sd_bad and not hier_advi:
        short.append("hierarchical")
    if not advi_models:
        remedy = _nuts_remedy(short, diverging, settings or {}, drawn or {})
    elif len(advi_models) == len(MODELS):
        remedy = ("run more ADVI iterations (advi.iterations) where the loss was still falling, or draw more from "
                  "the approximation (draws) where only the ESS misses,")
    else:
        remedy = ("sample longer or with more chains (NUTS), or, for ADVI, run more iterations (advi.iterations) "
                  "where the loss was still falling or draw more (draws) where only the ESS misses,")
    verdict = ("NOT CONVERGED: the numbers in this report for the groups or fits listed are not backed by their "
               f"diagnostics; {remedy} before relying on them." if failing else
               "CONVERGED: every model meets the bar in every group" + (", and so does every fit of the transfer "
                                                                       "experiment." if transfer else "."))
    sd_text = (f"Hierarchical group sds missing it: {'; '.join(sd_bad)}." if sd_bad else
               ("The hierarchical group sds meet it too." if sds else ""))
    flags = [f"{LABELS[v]}, group {g}: {d.get('reason', '')}" for v in MODELS
             for g, d in sorted((lookup(metrics[v], "sampling", "flagged_groups") or {}).items())]
    flag_text = ("Flagged as non-mixing (the chains sampled distinct functions, each chain well; more draws of "
                 "the same chains will not merge them): " + "; ".join(flags) + "." if flags else
                 "No group is flagged as non-mixing (chains settled in distinct functions).")
    blocks = [Para(verdict, warn=failing), Table(header, rows, text_columns=(6,)), *_missing_table(metrics, missing_by)]
    advice = [model_advice(lookup(metrics[v], "per_group") or {}, (settings or {}).get(v, {}), LABELS[v],
                           sd_draws=sd_draws if v == "hierarchical" else None,
                           sds_missing=lookup(metrics[v], "sampling", "sds_not_converged") or 0)
              for v in MODELS if not _fitted_with_advi(lookup(metrics[v], "sampling") or {})]
    blocks += [Para(a, warn=True) for a in advice if a]
    if advi_models:
        blocks.append(Para(
            f"Fitted with ADVI: {', '.join(advi_models)}. Their draws are independent draws from a mean-field "
            "approximation, so R-hat (shown, not judged) and divergences do not apply; the bar for them is a loss "
            "that has stopped falling (the mean of the last quarter of the iterations against the quarter "
            f"before: a fall of more than {ADVI_MIN_DROP:.1%} that is beyond chance over all the fit's loss curves "
            f"counts as still falling; raise advi.iterations) and bulk ESS >= {ESS_OK}. Meeting it says the "
            "optimisation has settled, not that the approximation is close to the posterior: mean-field ADVI "
            "usually understates uncertainty, so check its intervals against a NUTS fit on a few groups before "
            "relying on them."))
    blocks += [Para(sd_text, warn=bool(sd_bad))] if sd_text else []
    blocks.append(Para(flag_text, warn=bool(flags)))
    thinned = [f"{LABELS[v]}, group {g}: {t['draws_per_chain']} draws per chain thinned by {t['thinned_by']} "
               f"(at {t['missed']['draws_per_chain']}: function-space R-hat {fmt(t['missed'].get('max_rhat'))}, "
               f"bulk ESS {ess_text(t['missed'].get('min_ess_bulk'))})" for v in MODELS
               for g, t in sorted((lookup(metrics[v], "sampling", "thinned_groups") or {}).items())]
    if thinned:
        blocks.append(Para("Drawn longer and thinned (sampler.max_draws: a group whose draws missed the bar was "
                           "fitted again from its seed with more draws per chain, every k-th kept, so that it "
                           "holds as many as the others): " + "; ".join(thinned) + "."))
    raised = [f"{LABELS[v]}, group {g}: {t['missed']['divergences']} divergences in {t['missed']['transitions']} "
              f"transitions, then {t['divergences']} in {t['transitions']} at target_accept {t['target_accept']}"
              for v in MODELS
              for g, t in sorted((lookup(metrics[v], "sampling", "target_accept_raised") or {}).items())]
    if raised:
        blocks.append(Para("Fitted again at a higher target_accept (sampler.refit_target_accept: a group whose "
                           "transitions diverged more often than the bar allows was fitted again from its seed "
                           "with smaller steps): " + "; ".join(raised) + "."))
    restarted = [f"{LABELS[v]}, after {r['draws_per_chain']} draws per chain: {r['reason']}; started again from "
                 f"chain {r['restarted_from_chain']}'s draws (the attempt left behind: {r['leapfrog_steps']:,} "
                 "gradient evaluations to that look)"
                 for v in MODELS for r in lookup(metrics[v], "sampling", "restarted") or []]
    if restarted:
        blocks.append(Para("Chains started again (hier_sampler.restarts: at a look, chains that diverged more "
                           "than the bar's share explains by chance (or past it at all where everything else met "
                           "the bar), or disagreed while one sat where the log "
                           "density is clearly lower, were left behind and the fit started again, warmup included, "
                           "from the best chain's draws; the results use the new chains only. A lower log density "
                           "is evidence of a worse region, not proof: a wider real mode would be left behind too): "
                           + "; ".join(restarted) + "."))
    elif any(lookup(metrics[v], "sampling", "restarts") == 0 for v in MODELS):
        blocks.append(Para("No chains were started again: the hierarchical fit's chains passed its checks "
                           "(hier_sampler.restarts)."))
    if transfer_text:
        blocks.append(Para(transfer_text, warn=transfer_failing))
    return Section(
        "Status: can the inference be trusted?",
        f"the bar (Stan and ArviZ practice): function-space R-hat <= {RHAT_OK} and bulk ESS >= {ESS_OK} on every "
        "group's predicted test points, divergences <= 0.1% of draws, and the same R-hat and ESS for the "
        "hierarchical group sds. High Pareto k rows make that model's LOO estimate (Model comparison) unreliable; "
        "they do not affect its other numbers.",
        blocks, anchor="status", failing=failing,
    )


def _sds_missing(sds: dict, sd_vars: Sequence[str], advi: bool) -> list[str]:
    """The hierarchical group sds of ``sds`` (the metrics' ``sampling.group_sd``) that miss the bar, with their
    numbers, in ``sd_vars``' order."""
    return [f"{var} (R-hat {fmt(sds[var].get('rhat'))}, ESS {ess_text(sds[var].get('ess_bulk'))})"
            for var in sd_vars if var in sds and not criterion.sd_converged(sds[var], advi)]


def _sampler_section(model: str) -> str:
    """The params section of ``model``'s sampler: the joint fit's ``hier_sampler``, the per-group fits' ``sampler``."""
    return "hier_sampler" if BY_NAME[model].has_group_distribution else "sampler"


def _nuts_remedy(short: Sequence[str], diverging: Sequence[str], settings: dict, drawn: dict[str, int]) -> str:
    """What to change for the NUTS fits of ``short`` (a group or group sd short of R-hat or ESS: longer runs) and of
    ``diverging`` (R-hat and ESS met, divergences not: more draws do not remove them), by the params that say it
    (``settings``: each model's trace settings; ``drawn``: the draws per chain its trace holds). A joint fit drawn
    on until the bar is met that is short of it stopped at its ``max_draws``, which is said."""
    from hbnn.sampling.runlength import at_draw_limit, look_unit

    order = list(MODELS)
    longer, stopped, accept = [], [], []
    for v in sorted(set(short), key=order.index):
        section = _sampler_section(v)
        s = settings.get(v, {}).get("sampler", {})
        limit, draws = s.get("max_draws", 0), s.get("draws", 0)
        key = f"{section}.max_draws" if limit > draws else f"{section}.draws"
        if key not in longer:
            longer.append(key)
        if (BY_NAME[v].has_group_distribution and limit > draws and v in drawn
                and at_draw_limit(drawn[v], draws, limit, look_unit(s.get("backend", ""), draws))):
            stopped.append(f"the {LABELS[v]} fit stopped at {drawn[v]} draws per chain ({section}.max_draws={limit})")
    for v in sorted(set(diverging), key=order.index):
        s = settings.get(v, {}).get("sampler", {})
        # a per-group fit already fitted again at refit_target_accept where it diverged: that is the key to raise
        refit = s.get("refit_target_accept", 0) > s.get("target_accept", 1) and not BY_NAME[v].has_group_distribution
        key = f"{_sampler_section(v)}.{'refit_target_accept' if refit else 'target_accept'}"
        if key not in accept:
            accept.append(key)
    advice = [f"sample longer (raise {' and '.join(longer)}) or with more chains"] if longer else []
    if accept:
        advice.append(f"where only divergences miss the bar, raise {' and '.join(accept)} (more draws do not remove "
                      "them)")
    return ("; ".join(stopped) + ": " if stopped else "") + ("; ".join(advice) or "sample longer or with more chains")


def _transfer_hier_misses(h: dict) -> list[str] | None:
    """``None`` where the transfer experiment's hierarchical fit (``h``: its ``sampling``) meets the bar, else the
    group sds that miss it (with their numbers; empty where only groups do)."""
    advi = _fitted_with_advi(h)
    rhat_ok = advi or (h["max_rhat"] is not None and h["max_rhat"] <= RHAT_OK)  # ADVI: not judged
    sds = h.get("group_sd") or {}
    sd_bad = _sds_missing(sds, sorted(sds), advi)
    ok = not h["groups_not_converged"] and rhat_ok and (h["min_ess_bulk"] or 0) >= ESS_OK and not sd_bad
    return None if ok else sd_bad


def _transfer_status(tm: dict) -> tuple[str, bool]:
    """One line on the transfer experiment's fits against the bar, and whether any misses it."""
    h = tm["sampling"]["hierarchical"]
    sd_bad = _transfer_hier_misses(h)
    hier_ok = sd_bad is None
    counts = {m: (tm["sampling"][m]["fits_not_converged"], tm["sampling"][m]["fits"])
              for m in ("flat", "informed", "hier_refit") if m in tm["sampling"]}  # hier_refit: one fit per size
    refits_ok = not any(bad for bad, _ in counts.values())
    if hier_ok:
        hier_text = "meets the bar"
    elif h.get("advi_still_falling"):  # ADVI: one joint fit, its loss curve the reason
        hier_text = (f"MISSES it (ADVI: its loss was still falling, so every group misses: "
                     f"{counted(h['groups_not_converged'], 'group')}; raise hier_sampler.advi.iterations; min ESS "
                     f"{ess_text(h['min_ess_bulk'])})")
    else:
        sd_text = f"; group sds missing it: {', '.join(sd_bad)}" if sd_bad else ""
        hier_text = (f"MISSES it ({counted(h['groups_not_converged'], 'group')} missing it{sd_text}; max R-hat "
                     f"{fmt(h['max_rhat'])}, min ESS {ess_text(h['min_ess_bulk'])}, group sds included)")
    if h.get("restarts"):
        hier_text += (f" after {h['restarts']} restart(s) of its chains ("
                      + "; ".join(r["reason"] for r in h.get("restarted", [])) + ")")
    refit_text = ", ".join(f"{n - bad}/{n} {'hierarchical' if m == 'hier_refit' else m}"
                           for m, (bad, n) in counts.items())
    text = (f"Transfer experiment (Transfer to new groups): the hierarchical fit of the "
            f"{counted(len(tm['training_groups']), 'training group')} {hier_text}; refits of the held-out groups "
            f"meeting it: {refit_text}.")
    return text, not (hier_ok and refits_ok)


def _diagnostics_section(metrics: dict[str, dict], names: Sequence[str], sd_vars: Sequence[str],
                         figures: Sequence[str], bfmi: Sequence[float] | None, lik: likelihoods.Likelihood,
                         hidden: bool = True) -> Section:
    """Sampler diagnostics per model and of the group sds; ``hidden``: the networks have hidden units (a linear
    model's weights have none of their symmetries)."""
    header = ["Model", "Divergences", "Max R-hat (fn)", "Min bulk ESS (fn)", "Max R-hat (all)", "Min bulk ESS (all)"]
    rows, flagged = [], []
    for v in MODELS:
        s = lookup(metrics[v], "sampling") or {}
        advi = _fitted_with_advi(s)  # as the status table shows it
        rows.append([LABELS[v] + (" (ADVI)" if advi else ""), "n/a" if advi else fmt(s.get("divergences"), "d"),
                     _rhat_cell(s.get("max_rhat_fn"), advi), ess_text(s.get("min_ess_bulk_fn")),
                     _rhat_cell(s.get("max_rhat"), advi), ess_text(s.get("min_ess_bulk"))])
        if advi:
            continue
        rhat = [lookup(metrics[v], "per_group", g, "rhat_fn") for g in names]
        flagged.append(f"{LABELS[v]} {sum(r is not None and r > RHAT_OK for r in rhat)}/{len(names)}")
    sds = lookup(metrics["hierarchical"], "sampling", "group_sd") or {}
    sd_rows = [[var, fmt(sds[var].get("rhat")), ess_text(sds[var].get("ess_bulk")),
                ess_text(sds[var].get("ess_tail"))] for var in sd_vars if var in sds]
    sort = ", every group sorted within each model" if len(names) > NAMED_GROUPS_MAX else ""
    blocks = [Table(header, rows),
              Para(f"Groups with function-space R-hat above {RHAT_OK}: {', '.join(flagged)}." if flagged else
                   "Every model was fitted with ADVI, whose R-hat is not judged."),
              Figure("rhat_fn.png", f"Per-group function-space R-hat (max over test points){sort}; dashed line at "
                                    f"{RHAT_OK}."),
              Figure("ess_fn.png", f"Per-group function-space bulk ESS (min over test points, log scale){sort}; "
                                   f"dashed line at {ESS_OK}."),
              Heading("Hierarchical group sds (layer order)"),
              Table(["Variable", "R-hat", "Bulk ESS", "Tail ESS"], sd_rows)]
    captions = {
        "rank_group_sd.png": "Rank plots of the group sds (az.plot_rank): each chain's ranks should be uniform; "
                             "bars piling at one end mean that chain sits higher or lower than the others.",
        "trace_group_sd.png": "Trace of the group sds per chain (az.plot_trace); divergent draws are marked as "
                              "ticks at the bottom, where they happened.",
        "energy.png": "Energy plot (az.plot_energy): the marginal energy and the energy transition distributions "
                      "should overlap; BFMI below 0.3 means the sampler explores the tails poorly.",
    }
    blocks += [Figure(n, c) for n, c in captions.items() if n in figures]
    if bfmi is not None:
        blocks.append(Para("BFMI per chain (hierarchical): " + ", ".join(fmt(b, ".2f") for b in bfmi)
                           + (" (below 0.3: poor exploration)." if min(bfmi) < 0.3 else " (all above 0.3)."),
                           warn=min(bfmi) < 0.3))
    why = ("because weight space has exact symmetries (hidden-unit permutations and sign flips) that make "
           "weight-space R-hat meaningless. 'all' adds the hierarchical group sds, which are scalars free of those "
           "symmetries." if hidden else
           "the quantities every score is computed from (a linear model's weights have no symmetries, but the bar "
           "is the same for every network). 'all' adds the hierarchical group sds.")
    weights = ", which those symmetries make meaningless," if hidden else ""
    return Section(
        "Sampler diagnostics",
        "R-hat (want <= 1.01) and effective sample size (ESS, want >= 400) are computed in function space, on "
        f"the {lik.quantity_words} of each group, {why} Divergences should be 0 (the bar allows 0.1% of the "
        "draws). The fit stages write each fit's wall-clock seconds to timings/*.json, not here, so that the same "
        "fits give the same report. ArviZ gives the same R-hat and ESS from the traces (az.rhat(trace.predictions) "
        "over a group's rows). az.loo(trace) (traces written with trace.pointwise: true) takes its relative efficiency "
        f"from the weights' ESS{weights} where this report takes it from the likelihood values' own ESS: its elpd "
        "differs slightly (on the default data by 0.002-0.06, against standard errors of ~16) and its high Pareto "
        "k counts by a few rows.",
        blocks,
    )
