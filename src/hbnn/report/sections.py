"""The report's prose sections: what each figure and table shows and how to read it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hbnn.config import ReportParams
from hbnn.data.tasks import Tasks
from hbnn.diagnostics import criterion
from hbnn.diagnostics.criterion import ADVI_MIN_DROP
from hbnn.errors import counted
from hbnn.model import likelihoods
from hbnn.model.network import has_bias
from hbnn.pipeline.transfer import ALL, groups_by_size, in_size_order, pools_differ
from hbnn.pipeline.variants import BY_NAME
from hbnn.report.document import Figure, FigureLinks, Heading, Para, Section, Table
from hbnn.report.numbers import (
    ESS_OK,
    LABELS,
    MODELS,
    REFERENCE_DATA,
    REFERENCE_MODEL,
    REFERENCES,
    RHAT_OK,
    fmt,
    lookup,
    pct,
)


def _intro(tasks: Tasks, specs, settings: dict[str, dict], used_draws: dict[str, int],
           drawn: dict[str, int] | None = None) -> list:
    hidden = [s.shape[-1] for s in specs[:-1]]
    if has_bias(specs):
        net = (f"tanh MLP with hidden layers {hidden}, a bias per hidden and output unit (model.bias)" if hidden
               else "linear model with an intercept (no hidden layers; model.bias)")
    else:
        net = (f"tanh MLP with hidden layers {hidden} (no biases)" if hidden
               else "linear model (no hidden layers, no bias)")
    lik = likelihoods.get(tasks.likelihood)
    net += f", {lik.description}"
    if lik.standardise_labels:
        net += (f" (labels standardised with training mean {tasks.y_mean:.4g} and sd {tasks.y_sd:.4g}; scores are "
                "in the label's units)")
    sizes = np.bincount(tasks.split("train").group, minlength=tasks.n_groups)
    source = tasks.ds.attrs.get("table")
    data = f"table {source}, " if source else ""
    rows = f"{sizes.min()}" if sizes.min() == sizes.max() else f"{sizes.min()} to {sizes.max()}"
    unit = "net" if hidden else "linear model"
    out = [Para(f"{data}{tasks.n_groups} groups ({rows} training rows per group), "
                f"features {', '.join(tasks.features)}, {net}. "
                f"Flat: an independent {unit} per group with iid Normal(0, model.prior_sd) weights. "
                "Hierarchical: one model over all groups, w[g] = mu + sd * z[g] per layer (non-centred). "
                f"Informed prior: an independent {unit} per group with a multivariate-normal prior per layer fitted "
                "to new-group draws of the hierarchical posterior.")]
    runs = []
    for v in MODELS:
        s = settings[v].get("sampler", {})
        runs.append(f"{LABELS[v]}: {_run_description(s, (drawn or {}).get(v), BY_NAME[v].has_group_distribution)}; "
                    + (f"surfaces use {used_draws[v]} draws" if used_draws[v] else "no surfaces"))
    out.append(Para("Sampling: " + "; ".join(runs) + "."))
    return out


def _run_description(s: dict[str, Any], drawn: int | None = None, joint: bool = True) -> str:
    """A fit's inference settings as the intro states them (ADVI has no tuning: it has optimisation steps);
    ``drawn``: the draws per chain the trace holds, which ``max_draws`` lets a joint fit exceed (``joint``;
    per-group fits refit a group that misses the bar and thin it to ``draws``)."""
    if s.get("backend") == "advi":
        a = s.get("advi", {})
        batch = f", minibatches of {a['minibatch_size']} rows" if a.get("minibatch_size") else ""
        return (f"mean-field ADVI, {a.get('iterations', '?')} Adam steps (learning rate {a.get('learning_rate', '?')}"
                f"{batch}), then {s.get('chains', '?')} x {s.get('draws', '?')} draws from the approximation")
    blocks = ""
    if s.get("max_draws", 0) > s.get("draws", 0) and not joint:
        blocks = (f"; a group whose draws missed the convergence bar is fitted again with up to {s['max_draws']} "
                  f"draws per chain and thinned to {s['draws']}")
    if s.get("refit_target_accept", 0) > s.get("target_accept", 1) and not joint:
        blocks += (f"; a group whose transitions diverged past the bar is fitted again at target_accept "
                   f"{s['refit_target_accept']}")
    if joint and s.get("max_draws", 0) > s.get("draws", 0):
        from hbnn.sampling.runlength import LOOK_MAX_GROWTH

        how = (f"drawn in blocks of {s['draws']}" if s.get("backend") != "nutpie" else
               f"checked after {s['draws']} draws, then where the smallest ESS extrapolated to the bar (at most "
               f"{LOOK_MAX_GROWTH:.0%} of the draws so far further),")
        blocks = f"; {how} until every group met the convergence bar or {s['max_draws']} were drawn"
        if s.get("backend") == "nutpie" and s.get("restarts", 0) > 0:
            blocks += (f"; chains found at a check to have gone wrong (divergences, or stuck "
                       f"where the log density is lower) start again from the best chain's draws, at most "
                       f"{s['restarts']} times; the status section lists any that did")
    return (f"{s.get('chains', '?')} chains x {drawn or s.get('draws', '?')} draws "
            f"({s.get('tune', '?')} tuning, backend {s.get('backend', '?')}{blocks})")


def _reference_note(data: dict[str, Any], model: dict[str, Any] | None = None) -> Para:
    """Whether the seed notebooks' numbers compare with this run: the same data (``data``: :func:`data_settings`)
    and the same networks (``model``: :func:`model_settings`; keys not recorded are not compared)."""
    def text(value: Any) -> str:  # as params.yaml writes it
        return str(value).lower() if isinstance(value, bool) else str(value)

    defaults = ", ".join(f"{k} {v}" for k, v in REFERENCE_DATA.items())
    if not on_moons(data):
        return Para(f"The seed notebooks' reference numbers are not shown: they were obtained on the moons data "
                    f"({defaults}), and this run uses the table {data.get('data.path')}.")
    model = model or {}
    reference = ", ".join(f"{k} {text(v)}" for k, v in REFERENCE_MODEL.items())
    networks = ", ".join(f"{k} {text(v)}" for k, v in REFERENCE_MODEL.items() if k in model)
    unrecorded = [k for k in REFERENCE_MODEL if k not in model]  # traces written before the setting was recorded
    if unrecorded:
        networks += ("; " if networks else "") + f"not recorded in the traces, so not compared: {', '.join(unrecorded)}"
    diff = [f"{k} = {data[k]} (reference {ref})" for k, ref in REFERENCE_DATA.items() if data[k] != ref]
    diff += [f"{k} = {text(model[k])} (reference {text(ref)})" for k, ref in REFERENCE_MODEL.items()
             if k in model and model[k] != ref]
    if diff:
        return Para("The reference numbers below are NOT comparable with this run: they were obtained on the default "
                    f"data ({defaults}) with the default networks ({reference}) but this run differs in: "
                    f"{'; '.join(diff)}.", warn=True)
    return Para(f"The data parameters are the defaults ({defaults}) and so are the networks ({networks}), so this "
                "run is comparable with the reference numbers, up to sampler randomness and the reference runs' own "
                "sampler settings.")


def model_settings(settings: dict[str, dict]) -> dict[str, Any]:
    """The networks' settings the traces record (``settings``: each model's trace settings), keyed as
    :data:`REFERENCE_MODEL`; where the models disagree (they should not), the flat trace's."""
    out: dict[str, Any] = {}
    for v in reversed(MODELS):  # the flat model's last, so that its values stand
        s = settings.get(v, {})
        for key in ("hidden_layers", "bias", "likelihood", "prior_sd"):
            if key in s and not (key == "prior_sd" and v != "flat"):  # only the flat net has an N(0, sd) prior
                out[f"model.{key}"] = list(s[key]) if key == "hidden_layers" else s[key]
    return out


def _fitted_with_advi(sampling: dict) -> bool:
    """Whether a model's ``sampling`` metrics are an ADVI fit's (they count its loss curves still falling): its draws
    are independent draws of one approximation, so it has no divergences and its R-hat is not judged."""
    return "advi_still_falling" in sampling


def _rhat_cell(value, advi: bool) -> str:
    return fmt(value) + (" (not judged)" if advi else "")


def on_moons(data: dict[str, Any]) -> bool:
    """Whether the run's data are the moons, so that the report sets it beside the seed notebooks' numbers (with a
    caution where its data differ from theirs) and speaks of moons; not for a table."""
    return data.get("data.source") != "table"


def _accuracy_section(metrics: dict[str, dict], data: dict[str, Any], model: dict[str, Any] | None = None) -> Section:
    references = REFERENCES if on_moons(data) else {}
    header = ["Model", "Train %", "Test %", "Test log loss", "Test Brier",
              *[f"{r} (train / test %)" for r in references]]
    rows = []
    for v in MODELS:
        m = metrics[v]
        refs = [f"{r[v][0]:.2f} / {r[v][1]:.2f}" if r[v] else "not done" for r in references.values()]
        rows.append([LABELS[v], pct(lookup(m, "train", "accuracy")), pct(lookup(m, "test", "accuracy")),
                     fmt(lookup(m, "test", "log_loss")), fmt(lookup(m, "test", "brier")), *refs])
    return Section(
        "Accuracy",
        "accuracy thresholds the posterior-mean probability at 0.5, pooled over all groups' rows; log loss and Brier "
        "score (lower is better) use the same mean probability. Train accuracy is on the rows each model was fit "
        "to, test accuracy on held-out rows of the same groups."
        + (" The last columns are the numbers printed by the seed notebooks." if references else ""),
        [_reference_note(data, model), Table(header, rows),
         Figure("accuracy.png", "Train and test accuracy of this run (filled)"
                + (" and the reference runs (hollow)." if references else "."))],
    )


def _scores_section(metrics: dict[str, dict]) -> Section:
    """The counterpart of the accuracy section for likelihoods scored by RMSE, lpd and coverage (no reference
    numbers exist for them)."""
    header = ["Model", "Train RMSE", "Test RMSE", "Test lpd", "Test 94% coverage", "Train 94% coverage"]
    rows = [[LABELS[v], fmt(lookup(metrics[v], "train", "rmse"), ".4g"), fmt(lookup(metrics[v], "test", "rmse"), ".4g"),
             fmt(lookup(metrics[v], "test", "lpd")), pct(lookup(metrics[v], "test", "coverage_94")),
             pct(lookup(metrics[v], "train", "coverage_94"))] for v in MODELS]
    return Section(
        "Scores",
        "RMSE (lower is better) of the posterior-mean prediction in the label's units, pooled over all groups' rows; "
        "lpd is the mean log predictive density of the test rows (higher is better; it rewards honest "
        "uncertainty); coverage is the percentage of rows inside their central 94% posterior predictive interval "
        "(noise included), which should be close to 94.",
        [Table(header, rows)],
    )


def _per_group_rmse_section(n_groups: int) -> Section:
    return Section(
        "Per-group test RMSE",
        "one group of bars per task; partial pooling helps most where a group's own data are few, so look for "
        "groups where the flat bar is highest. The numbers are in metrics/detail/*.json (per_group.<g>.test.rmse).",
        [Figure("per_group_rmse.png", f"Test RMSE of every group ({n_groups}) for the three models.")],
    )


def _no_surface_section(tasks: Tasks) -> Section:
    return Section("Decision surfaces", "surfaces need two features.",
                   [Para(f"This run has a single feature ({tasks.features[0]}), so no surfaces are drawn.")])


def _per_group_section(n_groups: int) -> Section:
    return Section(
        "Per-group test accuracy",
        "one group of bars per task (the axis starts at 0.5, chance level, or lower if needed); partial pooling "
        "helps most where a group's own data are few or ambiguous, "
        "so look for groups where the flat bar is lowest. The numbers are in plots/per_group_accuracy.csv.",
        [Figure("per_group_accuracy.png", f"Test accuracy of every group ({n_groups}) for the three models.")],
    )


def _calibration_section() -> Section:
    return Section(
        "Calibration on the test rows",
        "each point is one bin of predicted probability (10 equal-width bins over all groups' test rows): "
        "x is the mean predicted P(y=1) in the bin, y the fraction of rows that are 1. Points on the diagonal "
        "mean the stated uncertainty is honest; below it, over-confident in class 1. The bin values are in "
        "plots/calibration.csv (x = bin centre there).",
        [Figure("calibration.png", "Reliability diagram of the posterior-predictive mean probabilities.")],
    )


def _loss_section(losses: dict[str, tuple[np.ndarray, np.ndarray]]) -> Section:
    fitted = ", ".join(LABELS[v] for v in losses)
    return Section(
        "ADVI loss",
        f"{fitted} fitted with ADVI (sampler.backend: advi). The loss is the negative ELBO, averaged over blocks "
        "of iterations; for the per-group models it is summed over groups (the ELBO of independent fits adds "
        "up). A curve still falling at the end means more iterations (sampler.advi.iterations) would help. "
        "The values are in plots/advi_loss.csv.",
        [Figure("advi_loss.png", "ADVI loss per iteration block.")],
    )


def _page_blocks(surface_files: dict[str, list[str]], used: dict[str, int], stem: str, what: str,
                 embedded: int = 0) -> list:
    """A heading per model followed by its ``<stem>_*`` figure pages: the first ``embedded`` (0: all) shown,
    the others linked as the files beside the report."""
    out = []
    for v in MODELS:
        names = [n for n in surface_files[v] if n.startswith(f"{stem}_")]
        shown = len(names) if embedded <= 0 else min(embedded, len(names))
        out.append(Heading(LABELS[v]))
        out += [Figure(n, f"{LABELS[v]}: {what}, page {i}/{len(names)} ({used[v]} draws).")
                for i, n in enumerate(names[:shown], start=1)]
        if shown < len(names):
            out.append(FigureLinks(
                f"Pages {shown + 1} to {len(names)} are files beside this report (report.embedded_pages: "
                f"{embedded}), page", names[shown:], [str(i) for i in range(shown + 1, len(names) + 1)]))
    return out


def _regression_surface_sections(surface_files: dict[str, list[str]], rp: ReportParams, used: dict[str, int],
                                 tasks: Tasks) -> list[Section]:
    held = (f" Features {', '.join(tasks.features[2:])} are held at their training mean."
            if tasks.n_features > 2 else "")
    grid = f"a {rp.grid_size} x {rp.grid_size} grid over [-{rp.grid_limit:g}, {rp.grid_limit:g}]^2"
    lik = likelihoods.get(tasks.likelihood)
    mean_title, sd_title = lik.surface_titles
    out = []
    for stem, title, what, how in (
        ("surface", "Prediction surfaces", mean_title,
         f"each panel is one group: colour is the posterior mean of the predicted label on {grid} of the first two "
         "(standardised) features, markers the group's training rows coloured on the same scale."),
        ("uncertainty", "Uncertainty of the mean prediction", sd_title,
         f"posterior standard deviation of the predicted mean (without {lik.noise_words}) on the same grid: bright "
         "regions are where the posterior draws disagree."),
    ):
        out.append(Section(title, how + held, _page_blocks(surface_files, used, stem, what, rp.embedded_pages)))
    return out


def _surface_sections(surface_files: dict[str, list[str]], rp: ReportParams, used: dict[str, int],
                      tasks: Tasks | None = None, moons: bool = True) -> list[Section]:
    grid = f"a {rp.grid_size} x {rp.grid_size} grid over [-{rp.grid_limit:g}, {rp.grid_limit:g}]^2"
    if tasks is not None and tasks.n_features > 2:
        grid += (f" of the first two (standardised) features, with {', '.join(tasks.features[2:])} held at their "
                 "training mean")
    return [
        Section(
            "Decision surfaces",
            f"each panel is one group: colour is the posterior-mean probability of class 1 on {grid}, the black "
            "line the 0.5 boundary, markers the group's training rows (white circles ringed in black: class 0; black "
            f"triangles ringed in white: class 1). A good surface separates the {'two moons' if moons else 'classes'} "
            "with a smooth boundary; "
            "the hierarchical and informed models should give groups with awkward data boundaries shaped like "
            "their neighbours'.",
            _page_blocks(surface_files, used, "surface", "posterior mean P(y=1)", rp.embedded_pages),
        ),
        Section(
            "Predictive uncertainty",
            "posterior standard deviation of the class-1 probability on the same grid (shared scale 0 to 0.5): bright "
            "regions are where the posterior draws disagree; the dashed white line is the 0.5 boundary of the "
            "posterior mean, markers as above. Expect high uncertainty along the boundary and away from the data, "
            "less of it where pooling constrains a group.",
            _page_blocks(surface_files, used, "uncertainty", "posterior sd of P(y=1)", rp.embedded_pages),
        ),
    ]


def _group_sd_section(sd_vars: Sequence[str], specs, prior_metrics: dict) -> Section:
    rows = []
    for s, var in zip(specs, sd_vars, strict=True):
        g = lookup(prior_metrics, "layers", s.name, "group_sd") or {}
        rows.append([var, fmt(g.get("mean")), fmt(g.get("sd")), fmt(g.get("q05")), fmt(g.get("q95"))])
    return Section(
        "Posterior of the group standard deviations",
        f"{', '.join(sd_vars)}: how far the groups' weights of each layer spread around the shared mean. "
        "Near 0: groups share that layer; large: groups differ. The chains' curves should overlap; if they do not, "
        "the chains disagree and R-hat below will be high.",
        [Figure("group_sd.png", "Hierarchical model: posterior density of each layer's group sd, one line per chain."),
         Para("Summary used by the informed prior (metrics/prior.json, pooled over the chains it used):"),
         Table(["Variable", "Mean", "SD", "5%", "95%"], rows)],
    )


def _correlation_section(layer: str, name: str, ref_chain: int, prior_metrics: dict, hidden: bool = True,
                         bias: bool = False) -> Section:
    """``hidden``: whether the first layer feeds hidden units (false for a linear model, whose only layer is the
    output's and has no units to relabel); ``bias``: whether the layer has a bias row."""
    align = lookup(prior_metrics, "alignment") or {}
    moved = [c for c, a in align.items() if lookup(a, "relabelled")]
    note = (f"derive_prior relabelled hidden units of {', '.join(moved)} to match the reference chain."
            if moved else "derive_prior did not need to relabel any chain.")
    if hidden:
        cells = "feature->hidden unit"
        chain = (f"chain {ref_chain} only, because different chains may label the hidden units differently "
                 "(permutations and sign flips leave the network unchanged)")
    else:
        cells = f"feature{' (or bias)' if bias else ''}->output (a linear model: its only layer)"
        chain = f"chain {ref_chain}"
    return Section(
        f"Correlation of the first-layer weights (w_{layer})",
        f"each cell is the correlation of two weights {cells}. Left: the informed prior's covariance "
        "(fitted to aligned new-group draws of the hierarchical posterior). Right: the posterior draws of the "
        f"hierarchical group mean mu_{layer}, {chain}. Strong off-diagonal cells are "
        "structure the informed prior passes on to new groups.",
        [Figure(name, f"Correlations of w_{layer}: informed prior vs hierarchical mu_{layer} (chain {ref_chain})."),
         Para(note)],
    )


def _loss_text(trend: dict) -> str:
    return (f"loss still falling: {trend['drop']:.1%} over the last quarter of the iterations, "
            f"{trend['z']:.1f} standard errors")


def _missing_text(metrics: dict, g: str) -> str:
    """A group that misses the bar, with its numbers: ``g02 (R-hat 1.021, ESS 97, 3 divergences)``, or for
    ADVI ``g02 (loss still falling: 2.0% over the last quarter of the iterations, 8.1 standard errors, ESS 671)``."""
    d = lookup(metrics, "per_group", g) or {}
    ess = d.get("ess_bulk_fn")
    ess_text = f"ESS {'n/a' if ess is None else math.floor(ess)}"
    if "advi_loss" in d:
        falling = [_loss_text(d["advi_loss"])] if d["advi_loss"]["still_falling"] else []
        return f"{g} ({', '.join([*falling, ess_text])})"
    parts = [f"R-hat {fmt(d.get('rhat_fn'))}", ess_text]
    if d.get("divergences"):
        parts.append(f"{d['divergences']} divergences")
    return f"{g} ({', '.join(parts)})"


def _missing_cell(metrics: dict, missing: Sequence[str]) -> str:
    """The groups that miss the bar, at most 12 named; a joint ADVI fit whose one loss is still falling is
    said once, not per group."""
    if not missing:
        return "none"
    trends = [lookup(metrics, "per_group", g, "advi_loss") for g in missing]
    joint = lookup(metrics, "sampling", "advi_still_falling") == 1 and len(missing) > 1
    if joint and all(t is not None and t == trends[0] and t["still_falling"] for t in trends):
        return f"all {len(missing)} (one joint fit, its {_loss_text(trends[0])})"
    shown = "; ".join(_missing_text(metrics, g) for g in missing[:12])
    return shown + (f" and {len(missing) - 12} more" if len(missing) > 12 else "")


def _status_section(metrics: dict[str, dict], names: Sequence[str], sd_vars: Sequence[str],
                    transfer: dict | None = None, settings: dict | None = None,
                    drawn: dict[str, int] | None = None) -> Section:
    """First section: does every model meet the convergence bar, which groups miss it and by how much,
    and where PSIS-LOO is unreliable; the same for the transfer experiment's fits (``transfer``: its detail
    metrics). Drawn red when anything fails; the remedy names the settings of the fits that miss (``settings``: each
    model's trace settings, ``drawn``: the draws per chain its trace holds)."""
    header = ["Model", "Converged", "Groups meeting the bar", "Max R-hat (fn)", "Min bulk ESS (fn)", "Divergences",
              "Groups missing it", "LOO rows with high Pareto k"]
    rows, missing_any, short, diverging = [], False, [], []  # NUTS fits missing by R-hat/ESS, by divergences
    for v in MODELS:
        s = lookup(metrics[v], "sampling") or {}
        missing = [g for g in names if not lookup(metrics[v], "per_group", g, "converged")]
        missing_any |= bool(missing)
        if not _fitted_with_advi(s):
            for g in missing:  # R-hat and ESS met but the group misses: its (or its joint fit's) divergences
                met = criterion.meets_bar(lookup(metrics[v], "per_group", g, "rhat_fn"),
                                           lookup(metrics[v], "per_group", g, "ess_bulk_fn"))
                (diverging if met else short).append(v)
        bad_k = lookup(metrics[v], "loo", "n_bad_k")
        advi = _fitted_with_advi(s)
        rows.append([LABELS[v] + (" (ADVI)" if advi else ""), "NO" if missing else "yes",
                     f"{len(names) - len(missing)}/{len(names)}", _rhat_cell(s.get("max_rhat_fn"), advi),
                     fmt(s.get("min_ess_bulk_fn"), ".0f"), "n/a" if advi else fmt(s.get("divergences"), "d"),
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
    blocks = [Para(verdict, warn=failing), Table(header, rows)]
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
               f"bulk ESS {fmt(t['missed'].get('min_ess_bulk'), '.0f')})" for v in MODELS
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
    return [f"{var} (R-hat {fmt(sds[var].get('rhat'))}, ESS {fmt(sds[var].get('ess_bulk'), '.0f')})"
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
    counts = {m: (tm["sampling"][m]["fits_not_converged"], tm["sampling"][m]["fits"]) for m in ("flat", "informed")}
    refits_ok = not any(bad for bad, _ in counts.values())
    if hier_ok:
        hier_text = "meets the bar"
    elif h.get("advi_still_falling"):  # ADVI: one joint fit, its loss curve the reason
        hier_text = (f"MISSES it (ADVI: its loss was still falling, so every group misses: "
                     f"{counted(h['groups_not_converged'], 'group')}; raise hier_sampler.advi.iterations; min ESS "
                     f"{fmt(h['min_ess_bulk'], '.0f')})")
    else:
        sd_text = f"; group sds missing it: {', '.join(sd_bad)}" if sd_bad else ""
        hier_text = (f"MISSES it ({counted(h['groups_not_converged'], 'group')} missing it{sd_text}; max R-hat "
                     f"{fmt(h['max_rhat'])}, min ESS {fmt(h['min_ess_bulk'], '.0f')}, group sds included)")
    if h.get("restarts"):
        hier_text += (f" after {h['restarts']} restart(s) of its chains ("
                      + "; ".join(r["reason"] for r in h.get("restarted", [])) + ")")
    refit_text = ", ".join(f"{n - bad}/{n} {m}" for m, (bad, n) in counts.items())
    text = (f"Transfer experiment (Transfer to new groups): the hierarchical fit of the "
            f"{counted(len(tm['training_groups']), 'training group')} {hier_text}; refits of the held-out groups "
            f"meeting it: {refit_text}.")
    return text, not (hier_ok and refits_ok)


def _comparison_section(table, bad_k: dict[str, tuple[int, int, float]], scores: str = "Accuracy") -> Section:
    """``az.compare``'s table of the three models (PSIS-LOO), its plot and what it means here.

    ``table`` is ``None`` when the traces hold no ``log_likelihood`` (``trace.pointwise: false``);
    ``bad_k[model] = (rows with high Pareto k, rows, threshold)``; ``scores`` names the section
    with the test-row scores.
    """
    how = ("elpd_loo estimates the log predictive density of a training row left out of its own fit (PSIS-LOO, "
           "summed over rows; higher is better); p_loo is the effective number of parameters; elpd_diff and dse are "
           "the difference from the best model and its standard error, paired over rows. A difference within ~2 dse "
           "is not a difference. Weight is ArviZ's stacking weight: the share each model gets in the mix of the "
           "three that predicts left-out rows best. For these models: the flat nets see only their group's rows, the"
           " hierarchical model also the other groups' through the shared means and sds, so its lead measures what "
           "partial pooling buys for a row of a known group. The informed model's prior was derived from the "
           "hierarchical posterior of the same training rows, so its LOO uses each row twice and is optimistic; "
           f"compare it on the test rows ({scores}) instead.")
    if table is None:
        return Section("Model comparison (PSIS-LOO)", how, [Para(
            "The traces hold no log_likelihood group (trace.pointwise: false), so there is no comparison table; "
            "each model's LOO numbers are in metrics/<model>.json (loo.*).")])
    header = ["Model", "Rank", "elpd_loo", "SE", "p_loo", "elpd_diff", "dse", "Weight", "High Pareto k rows"]
    rows = [[str(name), str(int(r["rank"])), fmt(r["elpd_loo"], ".1f"), fmt(r["se"], ".1f"), fmt(r["p_loo"], ".1f"),
             fmt(r["elpd_diff"], ".1f"), fmt(r["dse"], ".1f"), fmt(r["weight"], ".2f"),
             "{} of {} (k > {:.3f})".format(*bad_k[name])] for name, r in table.iterrows()]
    worst = {name: b for name, b in bad_k.items() if b[0]}
    if worst:
        k_text = ("Rows with Pareto k above the threshold (" + ", ".join(f"{n}: {b[0]}" for n, b in worst.items())
                  + ") make PSIS-LOO unreliable for those models: the left-out row changes the posterior too much "
                  "for importance sampling. The remedy is K-fold cross-validation, by row (refit without each fold "
                  "of rows) or by group (leave a group out: the question of a new group); this pipeline does not "
                  "run it.")
    else:
        k_text = "Every row's Pareto k is below the threshold: PSIS-LOO is reliable for all three models."
    return Section(
        "Model comparison (PSIS-LOO)", how,
        [Table(header, rows), Para(k_text, warn=bool(worst)),
         Figure("compare.png", "az.plot_compare: open circles and bars are each model's elpd_loo and its SE; grey "
                               "triangles and bars the difference from the best model (dashed line) and its dse.")],
    )


def _diagnostics_section(metrics: dict[str, dict], names: Sequence[str], sd_vars: Sequence[str],
                         figures: Sequence[str], bfmi: Sequence[float] | None, lik: likelihoods.Likelihood,
                         hidden: bool = True) -> Section:
    """Sampler diagnostics per model and of the group sds; ``hidden``: the networks have hidden units (a linear
    model's weights have none of their symmetries)."""
    header = ["Model", "Sampling s", "Compile s", "Divergences", "Max R-hat (fn)", "Min bulk ESS (fn)",
              "Max R-hat (all)", "Min bulk ESS (all)"]
    rows, flagged = [], []
    for v in MODELS:
        s = lookup(metrics[v], "sampling") or {}
        advi = _fitted_with_advi(s)  # as the status table shows it
        rows.append([LABELS[v] + (" (ADVI)" if advi else ""), fmt(s.get("seconds"), ".1f"),
                     fmt(s.get("compile_seconds"), ".1f"), "n/a" if advi else fmt(s.get("divergences"), "d"),
                     _rhat_cell(s.get("max_rhat_fn"), advi), fmt(s.get("min_ess_bulk_fn"), ".0f"),
                     _rhat_cell(s.get("max_rhat"), advi), fmt(s.get("min_ess_bulk"), ".0f")])
        if advi:
            continue
        rhat = [lookup(metrics[v], "per_group", g, "rhat_fn") for g in names]
        flagged.append(f"{LABELS[v]} {sum(r is not None and r > RHAT_OK for r in rhat)}/{len(names)}")
    sds = lookup(metrics["hierarchical"], "sampling", "group_sd") or {}
    sd_rows = [[var, fmt(sds[var].get("rhat")), fmt(sds[var].get("ess_bulk"), ".0f"),
                fmt(sds[var].get("ess_tail"), ".0f")] for var in sd_vars if var in sds]
    blocks = [Table(header, rows),
              Para(f"Groups with function-space R-hat above {RHAT_OK}: {', '.join(flagged)}." if flagged else
                   "Every model was fitted with ADVI, whose R-hat is not judged."),
              Figure("rhat_fn.png", f"Per-group function-space R-hat (max over test points); dashed line at "
                                    f"{RHAT_OK}."),
              Figure("ess_fn.png", f"Per-group function-space bulk ESS (min over test points, log scale); dashed "
                                   f"line at {ESS_OK}."),
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
        f"the {lik.quantity_words} of each group, {why} Compile s is n/a for PyMC's and the JAX "
        "samplers, which compile inside every sampling call (counted in Sampling s). Divergences should be 0 "
        "(the bar allows 0.1% of "
        "the draws). ArviZ gives the same R-hat and ESS from the traces (az.rhat(trace.predictions) over a "
        "group's rows). az.loo(trace) (traces written with trace.pointwise: true) takes its relative efficiency "
        f"from the weights' ESS{weights} where this report takes it from the likelihood values' own ESS: its elpd "
        "differs slightly (on the default data by 0.002-0.06, against standard errors of ~16) and its high Pareto "
        "k counts by a few rows.",
        blocks,
    )


FEW_GROUPS = 4  # a hierarchy fitted on fewer groups than this learns little about how groups differ
SHOWN_GROUPS = 10  # groups named per size where the sizes pool different groups


def _transfer_section(tm: dict | None, lik: likelihoods.Likelihood) -> Section:
    """The transfer experiment (``metrics/detail/transfer.json``): held-out groups refit on few rows of their own.

    ``lik``: the likelihood, whose headline score (accuracy, rmse) it shows; a classifier's row subsets are stratified
    by label (:func:`hbnn.pipeline.transfer.nested_order`).
    """
    score = lik.score
    title = "Transfer to new groups"
    how = ("The informed prior exists to help a group the hierarchy has not seen. Here that is measured, not assumed:"
           " the stage transfer_prior holds some groups out, fits the hierarchical model on the others and derives "
           "the informed prior from that fit alone; the stage transfer then fits each held-out group on nested "
           f"subsets of its own training rows (2, 4, ... rows{', stratified by label,' if lik.classifier else ''} "
           "and all of them), once with the "
           "flat N(0, sd) prior and once with the informed prior, and scores both on the group's own test rows. The "
           "dashed line is the hierarchical population's prediction for an unseen group (no rows of its own, as "
           "hbnn predict scores one). The right panel is the informed-minus-flat difference in log predictive "
           "density per test row, paired over the same rows, with +-2 standard errors: where the bars cross zero "
           "the prior no longer matters. Log loss is the mean negative log predictive density of the test labels "
           "(lower is better).")
    if tm is None:
        return Section(title, how, [Para("metrics/detail/transfer.json does not exist: run the transfer stages "
                                         "(dvc repro transfer).", warn=True)], anchor="transfer")
    sizes = in_size_order(tm["sizes"])
    pop = tm["population"]
    header = ["Training rows", "Groups", f"Flat {score}", f"Informed {score}", "Flat log loss",
              "Informed log loss", "Informed - flat log density (se)", "Fits not converged (flat / informed)"]
    rows = [["0 (population)", str(len(tm["heldout_groups"])), fmt(pop["test"][score], ".4f"),
             "", fmt(-pop["test"]["lpd_mean"], ".4f"), "", "", ""]]
    for label, r in sizes.items():
        d = r["difference"]
        rows.append([f"{label} ({r['rows_mean']:g})", str(r["groups"]), fmt(r["flat"]["test"][score], ".4f"),
                     fmt(r["informed"]["test"][score], ".4f"), fmt(-r["flat"]["test"]["lpd_mean"], ".4f"),
                     fmt(-r["informed"]["test"]["lpd_mean"], ".4f"), f"{d['mean']:+.3f} ({d['se']:.3f})",
                     f"{r['flat']['fits_not_converged']} / {r['informed']['fits_not_converged']}"])
    reading = _transfer_reading(sizes, tm["stops_mattering"])
    groups = (f"Held out: {', '.join(tm['heldout_groups'])} ({counted(len(tm['heldout_groups']), 'group')}); the "
              f"hierarchy and the prior were fitted on the other {len(tm['training_groups'])}.")
    fitted = len(tm["training_groups"])
    if fitted == 1:  # 2 groups: one held out, one left
        groups += (" With one group to fit, the hierarchy cannot tell how much groups differ (its group sds rest on "
                   "their prior), so this prior says little about new groups: the experiment needs more groups.")
    elif fitted < FEW_GROUPS:
        total = fitted + len(tm["heldout_groups"])  # at most total - 1 can be fitted (one is held out)
        fewer = (" (or fewer held out: transfer.min_holdout, transfer.holdout_fraction)" if total - 1 >= FEW_GROUPS
                 else "")
        groups += (f" With {fitted} groups to fit, the hierarchy can tell little about how much groups differ (its "
                   "group sds rest mostly on their prior), so this prior says little about new groups: the experiment "
                   f"needs more groups{fewer}.")
    blocks: list = [Para(reading), Para(groups), Figure("transfer.png", "Left and middle: test scores pooled over "
                    "the held-out groups' test rows (log loss with +-2 se); right: informed minus flat log "
                    "predictive density per test row, +-2 se (paired). x: training rows per group (all: every "
                    "training row, their mean count below)."),
                    Table(header, rows)]
    status, failing = _transfer_status(tm)
    if failing:  # the status box's line, with where the numbers are
        blocks.append(Para(f"{status} Each fit's numbers are in metrics/detail/transfer.json "
                           "(fits.<model>.<group>/<size>).", warn=True))
    if tm["skipped"]:
        blocks.append(Para("Skipped (a size must be smaller than the group's training rows): "
                           + ", ".join(tm["skipped"]) + "."))
    uneven = _uneven_groups(groups_by_size(tm["fits"]["flat"]))  # its keys: <group>/<size>
    if uneven:
        blocks.insert(0, Para(uneven, warn=True))
    if _transfer_hier_misses(tm["sampling"]["hierarchical"]) is not None:
        blocks.insert(0, Para("The hierarchical fit this prior comes from misses the convergence bar (below), so the "
                              "informed prior, its scores and the informed-minus-flat differences rest on a posterior "
                              "not yet sampled well enough: read them as provisional.", warn=True))
    return Section(title, how, blocks, anchor="transfer")


def _uneven_groups(by_size: dict[str, list[str]]) -> str:
    """A caution where the sizes pool different held-out groups ("" where every size has the same ones)."""
    if not pools_differ(by_size):
        return ""
    def names(groups: list[str]) -> str:
        return ", ".join(groups[:SHOWN_GROUPS]) + (f" and {len(groups) - SHOWN_GROUPS} more"
                                                   if len(groups) > SHOWN_GROUPS else "")

    listed = "; ".join(f"{size}: {names(groups)}" for size, groups in by_size.items())
    at_all = f", and at {ALL}" if ALL in by_size else ""
    return ("The sizes are scored on different held-out groups (a group is fitted only at sizes below its training "
            f"rows{at_all}): {listed}. Part of any change of score from one size to another is then a change of "
            "groups, not of rows; the informed-minus-flat difference at each size is paired on the same rows and "
            "stays comparable.")


def _transfer_reading(sizes: dict[str, dict], stop: str | None) -> str:
    """What the informed-minus-flat differences say, size by size (2 standard errors), and where they stop."""
    if not sizes:
        return "No size was fitted."
    labels = list(sizes)

    def text(label: str) -> str:
        d = sizes[label]["difference"]
        return f"{label} ({d['mean']:+.3f}, se {d['se']:.3f})"

    kinds = {"better": [], "worse": [], "within 2 standard errors": []}
    for label, r in sizes.items():
        d = r["difference"]
        kind = "better" if d["mean"] > 2 * d["se"] else "worse" if d["mean"] < -2 * d["se"] else \
            "within 2 standard errors"
        kinds[kind].append(label)
    first = labels[0]
    first_kind = next(k for k, v in kinds.items() if first in v)
    verb = {"better": "predicts them better than", "worse": "predicts them worse than",
            "within 2 standard errors": "is within 2 standard errors of"}[first_kind]
    out = [f"With {sizes[first]['rows_mean']:g} rows of their own ({first}), the informed prior {verb} the flat "
           f"prior: {text(first)} in log predictive density per test row."]
    out.append("By size, informed vs flat: " + "; ".join(f"{k} at {', '.join(text(lab) for lab in v)}"
                                                         for k, v in kinds.items() if v) + ".")
    if stop is None and labels[-1] in kinds["within 2 standard errors"]:  # its se is NaN: one test row
        out.append(f"At the largest size ({labels[-1]}) the difference has no standard error to judge it by (too few "
                   "test rows), so whether the prior still matters there is not known.")
    elif stop is None:  # beyond 2 standard errors at the largest size
        rows = " with every training row these groups have" if labels[-1] == ALL else ""
        if kinds["within 2 standard errors"]:
            out.append(f"The difference is beyond 2 standard errors at the largest size ({labels[-1]}), though not "
                       f"at every smaller one: the prior matters{rows}.")
        else:
            out.append(f"The difference is beyond 2 standard errors at every size, the largest ({labels[-1]}) "
                       f"included: the prior matters{rows}.")
    elif stop == first:
        out.append("No size shows a difference beyond 2 standard errors: on these held-out groups the informed prior "
                   "makes no measurable difference.")
    elif stop == labels[-1]:  # the size before it is beyond 2 standard errors (smaller ones may be within)
        out.append(f"At the largest size ({stop}) the difference is within 2 standard errors; at {labels[-2]} it is "
                   "not.")
    else:
        out.append(f"From {stop} on the difference stays within 2 standard errors at every larger size: that is where "
                   "the informed prior stops mattering.")
    return " ".join(out)
