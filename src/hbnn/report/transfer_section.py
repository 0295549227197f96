"""The report's transfer section: the informed prior against the flat one on groups the hierarchy never saw,
size by size, and how to read it.
"""

from __future__ import annotations

from collections.abc import Sequence

from hbnn.errors import counted
from hbnn.model import likelihoods
from hbnn.pipeline.transfer import ALL, groups_by_size, in_size_order, pools_differ
from hbnn.report.document import Figure, Heading, Para, Section, Table
from hbnn.report.numbers import (
    fmt,
)
from hbnn.report.status import _transfer_hier_misses, _transfer_status

REFIT = "hier_refit"  # the hierarchical refit's key in each size (hbnn.pipeline.stages.transfer)
FEW_GROUPS = 4  # a hierarchy fitted on fewer groups than this learns little about how groups differ


SHOWN_GROUPS = 10  # groups named per size where the sizes pool different groups
Block = Para | Heading | Table


def _transfer_section(tm: dict | None, lik: likelihoods.Likelihood, seeds: Sequence[Block] = ()) -> Section:
    """The transfer experiment (``metrics/detail/transfer.json``): held-out groups refit on few rows of their own.

    ``lik``: the likelihood, whose headline score (accuracy, rmse) it shows; a classifier's row subsets are stratified
    by label (:func:`hbnn.pipeline.transfer.nested_order`). ``seeds``: the blocks on the experiment over data seeds
    (:func:`hbnn.report.seeds_study.seeds_blocks`), shown last.
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
           "hbnn predict scores one). The hierarchical refit (stage transfer_refit) is the hierarchical model fitted "
           "again on the other groups plus the held-out groups' same rows: the partial pooling a user would run with "
           "the new rows, which the informed prior, fitted one group at a time, should approach. The right panel is "
           "the informed prior's difference in log predictive density per test row from the flat prior and from the "
           "refit, paired over the same rows, with +-2 standard errors: where the flat bars cross zero the prior no "
           "longer matters. Log loss is the mean negative log predictive density of the test labels "
           "(lower is better).")
    if tm is None:
        return Section(title, how, [Para("metrics/detail/transfer.json does not exist: run the transfer stages "
                                         "(dvc repro transfer).", warn=True), *seeds], anchor="transfer")
    sizes = in_size_order(tm["sizes"])
    pop = tm["population"]
    header = ["Training rows", "Groups", f"Flat {score}", f"Informed {score}", "Flat log loss",
              "Informed log loss", "Informed - flat log density (se)", "Fits not converged (flat / informed)"]
    rows = [["0 (population)", str(len(tm["heldout_groups"])), fmt(pop["test"][score], ".4f"),
             "", fmt(-pop["test"]["lpd_mean"], ".4f"), "", "", ""]]
    refit = any(REFIT in r for r in sizes.values())
    if refit:
        header = _with_refit(header, f"Hierarchical refit {score}", "Hierarchical refit log loss",
                             "Informed - refit log density (se)")
        header[-1] = "Fits not converged (flat / informed / refit)"
        rows[0] = _with_refit(rows[0], "", "", "")
    for label, r in sizes.items():
        d = r["difference"]
        row = [f"{label} ({r['rows_mean']:g})", str(r["groups"]), fmt(r["flat"]["test"][score], ".4f"),
               fmt(r["informed"]["test"][score], ".4f"), fmt(-r["flat"]["test"]["lpd_mean"], ".4f"),
               fmt(-r["informed"]["test"]["lpd_mean"], ".4f"), f"{d['mean']:+.3f} ({d['se']:.3f})",
               f"{r['flat']['fits_not_converged']} / {r['informed']['fits_not_converged']}"]
        if refit:
            h, dr = r.get(REFIT), r.get("informed_vs_refit")
            row = _with_refit(row, fmt(h["test"][score], ".4f") if h else "not run",
                              fmt(-h["test"]["lpd_mean"], ".4f") if h else "not run",
                              f"{dr['mean']:+.3f} ({dr['se']:.3f})" if dr else "not run")
            row[-1] += f" / {h['fits_not_converged']}" if h else " / not run"
        rows.append(row)
    reading = _transfer_reading(sizes, tm["stops_mattering"]) + _refit_reading(sizes)
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
                    "the held-out groups' test rows (log loss with +-2 se); right: the informed prior's log "
                    "predictive density per test row minus the flat prior's (and the hierarchical refit's, where it "
                    "ran), +-2 se (paired). x: training rows per group (all: every "
                    "training row, their mean count below)."),
                    Table(header, rows)]
    status, failing = _transfer_status(tm)
    if failing:  # the status box's line, with where the numbers are
        blocks.append(Para(f"{status} Each fit's numbers are in metrics/detail/transfer.json "
                           "(fits.<model>.<group>/<size>), the hierarchical refits' in "
                           "metrics/detail/transfer_refit.json (sizes.<size>.sampling).", warn=True))
    missed = (tm["sampling"].get(REFIT) or {}).get("fits_not_converged", 0)
    if missed:
        blocks.insert(0, Para(f"{missed} of the hierarchical refits miss the convergence bar (below), so the refit "
                              "line and the informed-minus-refit differences rest on posteriors not yet sampled well "
                              "enough: read them as provisional.", warn=True))
    if not refit:
        blocks.append(Para("The hierarchical refit did not run (transfer.refit_sizes and transfer.refit_all_rows "
                           "select no size), so there is no line of partial pooling to hold the informed prior "
                           "against; set transfer.refit_sizes (for example [2, 4, 8]) to draw it."))
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
    return Section(title, how, [*blocks, *seeds], anchor="transfer")


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


def _refit_reading(sizes: dict[str, dict]) -> str:
    """What the informed-minus-refit differences say, size by size (2 standard errors); "" where no refit ran."""
    ran = {label: r["informed_vs_refit"] for label, r in sizes.items() if "informed_vs_refit" in r}
    if not ran:
        return ""
    kinds: dict[str, list[str]] = {"worse": [], "within 2 standard errors of it": [], "better": []}
    for label, d in ran.items():
        kinds["worse" if d["mean"] < -2 * d["se"] else "better" if d["mean"] > 2 * d["se"] else
              "within 2 standard errors of it"].append(f"{label} ({d['mean']:+.3f}, se {d['se']:.3f})")
    out = (" Against the hierarchical refit (the same rows pooled with every group), the informed prior is "
           + "; ".join(f"{k} at {', '.join(v)}" for k, v in kinds.items() if v) + ".")
    gains = {label: r["refit_vs_flat"] for label, r in sizes.items() if "refit_vs_flat" in r}
    better = [label for label, d in gains.items() if d["mean"] > 2 * d["se"]]
    if better and kinds["worse"]:  # partial pooling helps where the informed prior falls short of it
        out += (f" The refit itself beats the flat prior beyond 2 standard errors at {', '.join(better)} (by "
                + ", ".join(f"{gains[b]['mean']:+.3f}" for b in better) + "): what the other groups know does help "
                "these groups, and the informed prior carries only part of it.")
    return out


def _with_refit(row: list[str], score: str, log_loss: str, difference: str) -> list[str]:
    """A row of the transfer table with the refit's columns: its score after the informed one, its log loss after
    the informed one, its difference before the convergence column."""
    return [*row[:4], score, *row[4:6], log_loss, *row[6:-1], difference, row[-1]]
