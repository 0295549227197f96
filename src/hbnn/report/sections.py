"""The report's prose sections: what each figure and table shows and how to read it (the status and
diagnostics sections: :mod:`hbnn.report.status`; the transfer experiment's: :mod:`hbnn.report.transfer_section`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hbnn.config import ReportParams
from hbnn.data.tasks import Tasks
from hbnn.model import likelihoods
from hbnn.model.network import has_bias
from hbnn.pipeline.variants import BY_NAME
from hbnn.report.document import Figure, FigureLinks, Heading, Para, Section, Table
from hbnn.report.metric_plots import NAMED_GROUPS_MAX
from hbnn.report.numbers import (
    LABELS,
    MODELS,
    REFERENCE_DATA,
    REFERENCE_MODEL,
    REFERENCES,
    fmt,
    lookup,
    pct,
)
from hbnn.report.selection import SurfaceChoice, choice_blocks


def _intro(tasks: Tasks, specs, settings: dict[str, dict], prior_method: str = "mvnormal") -> list:
    """The report's description of the data and the three models (``prior_method``: ``prior.method``)."""
    hidden = [s.shape[-1] for s in specs[:-1]]
    activation = next(iter(settings.values()), {}).get("activation", "tanh")  # the traces agree (trace_network)
    if has_bias(specs):
        net = (f"{activation} MLP with hidden layers {hidden}, a bias per hidden and output unit (model.bias)"
               if hidden else "linear model with an intercept (no hidden layers; model.bias)")
    else:
        net = (f"{activation} MLP with hidden layers {hidden} (no biases)" if hidden
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
                f"Informed prior: an independent {unit} per group with "
                + ("the hierarchical model's new-group prior N(mu, sd^2) per weight at the posterior draw of the "
                   "highest log density (prior.method: plugin)." if prior_method == "plugin" else
                   "a multivariate-normal prior per layer fitted to new-group draws of the hierarchical posterior."))]
    return out


def _settings_section(settings: dict[str, dict], used_draws: dict[str, int], drawn: dict[str, int] | None = None
                      ) -> Section:
    """How each model was sampled (:func:`_run_description`) and how many draws its surfaces use, one row a model."""
    rows = []
    for v in MODELS:
        s = settings[v].get("sampler", {})
        rows.append([LABELS[v], _run_description(s, (drawn or {}).get(v), BY_NAME[v].has_group_distribution),
                     str(used_draws[v]) if used_draws[v] else "no surfaces"])
    return Section("Sampling settings",
                   "the sampler settings each model's trace records (sampler and hier_sampler in params.yaml), as "
                   "they ran: draws per chain kept, and how the fit went on where the draws missed the bar.",
                   [Table(["Model", "Sampling", "Surface draws"], rows, text_columns=(1,))])


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
    """The networks' settings the traces record, keyed as :data:`hbnn.report.numbers.REFERENCE_MODEL`.

    Parameters
    ----------
    settings : dict of str to dict
        Each model's trace settings.

    Returns
    -------
    dict of str to object
        Where the models disagree (they should not), the flat trace's values.
    """
    out: dict[str, Any] = {}
    for v in reversed(MODELS):  # the flat model's last, so that its values stand
        s = settings.get(v, {})
        for key in ("hidden_layers", "bias", "likelihood", "prior_sd"):
            if key in s and not (key == "prior_sd" and v != "flat"):  # only the flat net has an N(0, sd) prior
                out[f"model.{key}"] = list(s[key]) if key == "hidden_layers" else s[key]
    return out


def on_moons(data: dict[str, Any]) -> bool:
    """Whether the run's data are the moons, so that the report sets it beside the seed notebooks' numbers (with a
    caution where its data differ from theirs) and speaks of moons; not for a table.

    Parameters
    ----------
    data : dict of str to object
        :func:`hbnn.report.inputs.data_settings`.

    Returns
    -------
    bool
    """
    return data.get("data.source") != "table"


def _baseline_rows(baselines: dict | None) -> list[tuple[str, dict]]:
    """``(label, detail metrics)`` of each baseline model (:mod:`hbnn.pipeline.stages.baselines`), none without."""
    from hbnn.pipeline.stages.baselines import LABELS as BASELINE_LABELS
    from hbnn.pipeline.stages.baselines import MODELS as BASELINE_MODELS

    return [] if baselines is None else [(f"{BASELINE_LABELS[m]} (baseline)", baselines[m]) for m in BASELINE_MODELS]


def _accuracy_section(metrics: dict[str, dict], data: dict[str, Any], model: dict[str, Any] | None = None,
                      baselines: dict | None = None) -> Section:
    """The accuracy table of the three BNNs and, with ``baselines`` (the baselines stage's detail metrics), the
    scikit-learn baselines scored on the same rows."""
    references = REFERENCES if on_moons(data) else {}
    header = ["Model", "Train %", "Test %", "Test log loss", "Test Brier",
              *[f"{r} (train / test %)" for r in references]]
    rows = []
    for v in MODELS:
        m = metrics[v]
        refs = [f"{r[v][0]:.2f} / {r[v][1]:.2f}" if r[v] else "not done" for r in references.values()]
        rows.append([LABELS[v], pct(lookup(m, "train", "accuracy")), pct(lookup(m, "test", "accuracy")),
                     fmt(lookup(m, "test", "log_loss")), fmt(lookup(m, "test", "brier")), *refs])
    for label, m in _baseline_rows(baselines):
        rows.append([label, pct(lookup(m, "train", "accuracy")), pct(lookup(m, "test", "accuracy")),
                     fmt(lookup(m, "test", "log_loss")), fmt(lookup(m, "test", "brier")), *["-"] * len(references)])
    return Section(
        "Accuracy",
        "accuracy thresholds the posterior-mean probability at 0.5, pooled over all groups' rows; log loss and Brier "
        "score (lower is better) use the same mean probability. Train accuracy is on the rows each model was fit "
        "to, test accuracy on held-out rows of the same groups."
        + (" The baselines are scikit-learn models fitted to the same training rows (stage baselines: a pooled "
           "logistic regression, one with group effects, one per group, and gradient boosting with the group as a "
           "feature), scored the same way on the same test rows." if baselines is not None else "")
        + (" The last columns are the numbers printed by the seed notebooks." if references else ""),
        [_reference_note(data, model), Table(header, rows),
         Figure("accuracy.png", "Train and test accuracy of this run (filled)"
                + (" and the reference runs (hollow)." if references else "."))],
    )


def _scores_section(metrics: dict[str, dict], baselines: dict | None = None) -> Section:
    """The counterpart of the accuracy section for likelihoods scored by RMSE, lpd and coverage (no reference
    numbers exist for them), with the baselines' rows where ``baselines`` (their detail metrics) is given."""
    header = ["Model", "Train RMSE", "Test RMSE", "Test lpd", "Test 94% coverage", "Train 94% coverage"]
    models = [(LABELS[v], metrics[v]) for v in MODELS] + _baseline_rows(baselines)
    rows = [[label, fmt(lookup(m, "train", "rmse"), ".4g"), fmt(lookup(m, "test", "rmse"), ".4g"),
             fmt(lookup(m, "test", "lpd")), pct(lookup(m, "test", "coverage_94")),
             pct(lookup(m, "train", "coverage_94"))] for label, m in models]
    return Section(
        "Scores",
        "RMSE (lower is better) of the posterior-mean prediction in the label's units, pooled over all groups' rows; "
        "lpd is the mean log predictive density of the test rows (higher is better; it rewards honest "
        "uncertainty); coverage is the percentage of rows inside their central 94% posterior predictive interval "
        "(noise included), which should be close to 94."
        + (" The baselines are scikit-learn models fitted to the same training rows (stage baselines), with a normal "
           "predictive (the training residuals' sd) for real labels and a Poisson one for counts."
           if baselines is not None else ""),
        [Table(header, rows)],
    )


def _worst_groups(values: dict[str, np.ndarray] | None, names: Sequence[str], what: str, highest: bool,
                  k: int = 5) -> list:
    """Where a per-group chart sorts its values (more than :data:`hbnn.report.metric_plots.NAMED_GROUPS_MAX`
    groups), a paragraph naming each model's ``k`` worst groups by ``what`` (the highest values where ``highest``),
    which the chart no longer labels; else nothing."""
    if values is None or len(names) <= NAMED_GROUPS_MAX:
        return []
    parts = []
    for v in MODELS:
        vals = np.asarray(values[v], dtype=float)
        order = [int(i) for i in np.argsort(-vals if highest else vals, kind="stable") if not np.isnan(vals[i])][:k]
        parts.append(f"{LABELS[v]}: " + ", ".join(f"{names[i]} ({vals[i]:.3g})" for i in order))
    return [Para(f"{'Highest' if highest else 'Lowest'} {what} ({k} groups a model): " + "; ".join(parts) + ".")]


def _sorted_words(n_groups: int) -> str:
    """How a per-group chart of ``n_groups`` shows them (past NAMED_GROUPS_MAX: sorted within each model)."""
    return ", sorted within each model (one point a group)" if n_groups > NAMED_GROUPS_MAX else ""


def _per_group_rmse_section(n_groups: int, values: dict[str, np.ndarray] | None = None,
                            names: Sequence[str] = ()) -> Section:
    """Per-group test RMSE; ``values`` (``{model: (group,)}`` of ``names``) names the worst groups of a sorted chart."""
    return Section(
        "Per-group test RMSE",
        ("each model's groups sorted by test RMSE, one point a group: the right ends are each model's worst groups, "
         "named below; partial pooling helps most where a group's own data are few, so look for a flat curve above "
         "the others there." if n_groups > NAMED_GROUPS_MAX else
         "one group of bars per task; partial pooling helps most where a group's own data are few, so look for "
         "groups where the flat bar is highest.")
        + " The numbers are in metrics/detail/*.json (per_group.<g>.test.rmse).",
        [Figure("per_group_rmse.png", f"Test RMSE of every group ({n_groups}) for the three models"
                f"{_sorted_words(n_groups)}."), *_worst_groups(values, names, "test RMSE", True)],
    )


def _no_surface_section(tasks: Tasks) -> Section:
    return Section("Decision surfaces", "surfaces need two features.",
                   [Para(f"This run has a single feature ({tasks.features[0]}), so no surfaces are drawn.")])


def _per_group_section(n_groups: int, values: dict[str, np.ndarray] | None = None,
                       names: Sequence[str] = ()) -> Section:
    """Per-group test accuracy; ``values`` (``{model: (group,)}`` of ``names``) names the worst groups of a sorted
    chart."""
    return Section(
        "Per-group test accuracy",
        ("each model's groups sorted by test accuracy, one point a group: the left ends are each model's worst "
         "groups, named below; partial pooling helps most where a group's own data are few or ambiguous, so look "
         "for a flat curve below the others there." if n_groups > NAMED_GROUPS_MAX else
         "one group of bars per task (the axis starts at 0.5, chance level, or lower if needed); partial pooling "
         "helps most where a group's own data are few or ambiguous, "
         "so look for groups where the flat bar is lowest.")
        + " The numbers are in plots/per_group_accuracy.csv.",
        [Figure("per_group_accuracy.png", f"Test accuracy of every group ({n_groups}) for the three models"
                f"{_sorted_words(n_groups)}."), *_worst_groups(values, names, "test accuracy", False)],
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
                                 tasks: Tasks, chosen: SurfaceChoice | None = None,
                                 names: Sequence[str] = ()) -> list[Section]:
    """The prediction and uncertainty surfaces' sections; ``chosen``: the groups drawn (of ``names``), said first."""
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
        said = choice_blocks(chosen, names, rp.panels_per_page) if chosen is not None and not out else []
        out.append(Section(title, how + held,
                           said + _page_blocks(surface_files, used, stem, what, rp.embedded_pages)))
    return out


def _surface_sections(surface_files: dict[str, list[str]], rp: ReportParams, used: dict[str, int],
                      tasks: Tasks | None = None, moons: bool = True, chosen: SurfaceChoice | None = None,
                      names: Sequence[str] = ()) -> list[Section]:
    """The decision surfaces' and uncertainty's sections; ``chosen``: the groups drawn (of ``names``), said first."""
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
            (choice_blocks(chosen, names, rp.panels_per_page) if chosen is not None else [])
            + _page_blocks(surface_files, used, "surface", "posterior mean P(y=1)", rp.embedded_pages),
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
    chosen = lookup(prior_metrics, "draws", "chosen")
    plugin = lookup(prior_metrics, "method") == "plugin" and chosen
    if plugin:  # one draw's labelling: nothing to align, and a diagonal covariance
        note = (f"prior.method: plugin: the prior is N(mu, sd^2 I) at chain {chosen['chain']}, draw "
                f"{chosen['draw']} (log density {chosen['log_density']:.2f}); its covariance is diagonal, so the "
                "left panel shows no correlations.")
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
        + ("(one posterior draw's sd^2 I). " if plugin else
           "(fitted to aligned new-group draws of the hierarchical posterior). ") + "Right: the posterior draws of the "
        f"hierarchical group mean mu_{layer}, {chain}. Strong off-diagonal cells are "
        "structure the informed prior passes on to new groups.",
        [Figure(name, f"Correlations of w_{layer}: informed prior vs hierarchical mu_{layer} (chain {ref_chain})."),
         Para(note)],
    )


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
