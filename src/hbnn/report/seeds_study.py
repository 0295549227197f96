"""The transfer experiment over data seeds (``benchmarks/transfer_seeds.py``), as the report reads it: which params
a study measured, and its file checked before anything is shown.
"""

from __future__ import annotations

from pathlib import Path

from hbnn.config import PRIOR_METHODS, Params
from hbnn.errors import InputError
from hbnn.pipeline.transfer import in_size_order
from hbnn.pipeline.variants import STAGE_PARAMS
from hbnn.report.document import Heading, Para, Table
from hbnn.report.inputs import ANY, COUNT, NUM_NAN, SIZE_LABEL, TEXT, Each, ListOf, conform, read_json

STAGES = ("make_data", "transfer_prior", "transfer_refit", "transfer")  # the stages a study runs per seed
# the keys a study varies, so they stay out of its params hash: each seed and each prior method is one run of it
VARIED = ("seed", "prior.method")
SEEDS_FILE = Path("benchmarks/transfer_seeds.json")  # where the committed study lies, from the workspace's root


def study_keys() -> list[str]:
    """The params the transfer stages read (:data:`hbnn.pipeline.variants.STAGE_PARAMS`), but :data:`VARIED`.

    ``prior`` is listed key by key, so that ``prior.method`` alone stays out.
    """
    keys: list[str] = []
    for stage in STAGES:
        for key in STAGE_PARAMS[stage]:
            expanded = [f"prior.{k}" for k in Params().to_dict()["prior"]] if key == "prior" else [key]
            keys += [k for k in expanded if k not in VARIED and k not in keys]
    # a key inside one already listed (model.bias inside model) adds nothing
    return sorted(k for k in keys if not any(k.startswith(f"{other}.") for other in keys))


def study_hash(params: Params) -> str:
    """The short hash (:meth:`hbnn.config.Params.section_hash`) of :func:`study_keys`: equal for two params files
    whose transfer stages differ only in ``seed`` and ``prior.method``."""
    return params.section_hash(*study_keys())


COMPARED = ("informed - flat", "informed - refit")  # the comparisons the report shows (refit - flat: the section's)
MISSES = {"flat": "flat", "informed": "informed", "hier_refit": "hierarchical refit",
          "hierarchical": "held-out hierarchical (groups or sds)"}  # a seed row's not_converged keys, as said
COMMAND = "python -m benchmarks.transfer_seeds --methods mvnormal plugin --out {path}"  # how a study is measured
_DIFF = {"mean": NUM_NAN, "se": NUM_NAN, "seeds": COUNT, "above_zero": COUNT, "below_zero": COUNT}
SHAPE = {  # what the report reads of a study file
    "params_hash": TEXT, "complete": ANY, "seeds_requested": ListOf(COUNT), "measured_utc": TEXT, "commit": TEXT,
    "methods": Each({"seeds": ListOf({"seed": COUNT, "not_converged": Each(COUNT)}),
                     "summary": Each(Each(_DIFF, "informed - flat|informed - refit|refit - flat", "a comparison"),
                                     SIZE_LABEL, "n<rows> or all")},
                    "|".join(PRIOR_METHODS), f"a prior method ({', '.join(PRIOR_METHODS)})"),
}


def read_study(path: Path) -> dict | None:
    """The study file at ``path``, checked for the shape the report reads; ``None`` where there is none.

    Raises
    ------
    hbnn.errors.InputError
        Naming the file where it exists but is unreadable or malformed (as for the other optional inputs).
    """
    if not path.exists():
        return None
    doc = read_json(path, "transfer seeds study")
    try:
        return conform(doc, SHAPE)
    except ValueError as err:
        raise InputError(f"transfer seeds study {path}: {err}; measure it again ({COMMAND.format(path=path)})"
                         ) from None


def seeds_blocks(study: dict | None, params: Params, path: Path = SEEDS_FILE, layers: dict | None = None
                 ) -> list[Para | Heading | Table]:
    """The transfer section's part on the study over data seeds: a table per prior method (the run's own first) and
    which method transfers best at which size (:func:`best_reading`, with the run's prior against its group sds from
    ``layers``, ``metrics/detail/prior.json``'s) where the study measured these params (:func:`study_hash`) over
    every seed it names, else one line saying why it is not shown and how to measure it."""
    command = COMMAND.format(path=path)
    if study is None:
        return [Para(f"Over data seeds: no study ({path} does not exist); {command} measures it for these params.")]
    own = study_hash(params)
    if study["params_hash"] != own:
        return [Para(f"Over data seeds: the study in {path} was measured for other params (hash "
                     f"{study['params_hash']} of what the transfer stages read but seed and prior.method; these "
                     f"params': {own}), so it is not shown; {command} measures it for these params.")]
    done = min((len(m["seeds"]) for m in study["methods"].values()), default=0)
    if study["complete"] is not True or not study["methods"] or done < len(study["seeds_requested"]):
        return [Para(f"Over data seeds: the study in {path} holds {done} of its {len(study['seeds_requested'])} "
                     f"seeds (it did not finish), so it is not shown; {command} measures it again.")]
    methods = sorted(study["methods"], key=lambda m: m != params.prior.method)
    seeds = ", ".join(str(r["seed"]) for r in study["methods"][methods[0]]["seeds"])
    blocks: list[Para | Heading | Table] = [
        Heading("Over data seeds"),
        Para(f"The same experiment on {done} draws of the data (seeds {seeds}; {path}, measured "
             f"{study['measured_utc']} at commit {study['commit'][:12]}, for these params but seed and prior.method): "
             "per size, the paired difference in log predictive density per test row, its mean over seeds ± the "
             "standard error (the seeds' sd over the square root of their number) and how many seeds are above "
             "zero. " + (f"This run's prior.method ({params.prior.method}) comes first." if params.prior.method in
                         methods else f"This run's prior.method ({params.prior.method}) is not in the study."))]
    for method in methods:
        m = study["methods"][method]
        rows = [[label, *(_cell(s.get(c)) for c in COMPARED)] for label, s in in_size_order(m["summary"]).items()]
        blocks += [Heading(f"prior.method: {method}"),
                   Table(["Training rows", *(c.capitalize() for c in COMPARED)], rows),
                   Para(_misses(m["seeds"])), Para(seeds_reading(method, m["summary"]))]
    if len(methods) > 1:
        blocks.append(Para(best_reading({m: study["methods"][m]["summary"] for m in methods})
                           + _width_reading(params.prior.method, layers)))
    return blocks


def best_reading(summaries: dict[str, dict[str, dict]]) -> str:
    """Which prior method transfers best at which size over seeds: per size, the method of the highest mean informed -
    flat difference, and whether its lead over the next is beyond 2 standard errors (the two means' ses combined as
    if independent, which overstates the se of paired seeds: a lead called beyond 2 is beyond it)."""
    leads: dict[str, list[str]] = {}
    for label in in_size_order(dict.fromkeys(k for s in summaries.values() for k in s)):
        scored = sorted(((s[label]["informed - flat"], m) for m, s in summaries.items()
                         if "informed - flat" in s.get(label, {})), key=lambda t: -t[0]["mean"])
        if len(scored) < 2:
            continue
        (best, method), (next_best, _) = scored[0], scored[1]
        se = (best["se"] ** 2 + next_best["se"] ** 2) ** 0.5  # NaN with one seed: not beyond
        beyond = best["mean"] - next_best["mean"] > 2 * se
        leads.setdefault(f"{method} {'beyond' if beyond else 'within'}", []).append(label)
    if not leads:
        return "No size was measured with more than one prior method."
    how = {"beyond": "ahead of the next method beyond 2 standard errors",
           "within": "within 2 standard errors of the next"}
    parts = [f"{k.split()[0]} at {', '.join(v)} ({how[k.split()[1]]})" for k, v in leads.items()]
    return "Which prior method transfers best, by its mean gain over the flat prior: " + "; ".join(parts) + "."


def _network_order(layer: str) -> tuple[int, int, str]:
    """Sort key putting layers in the network's order: ``in``, then ``h1_h2``, ``h2_h3``, ... by number, then ``out``
    (``prior.json`` stores them alphabetically)."""
    if layer == "in":
        return (0, 0, layer)
    if layer == "out":
        return (2, 0, layer)
    head = layer.split("_")[0].lstrip("h")
    return (1, int(head) if head.isdigit() else 0, layer)


def _width_reading(method: str, layers: dict | None) -> str:
    """Why a method can fall behind: this run's informed prior's marginal sds per layer against the posterior's
    group sds (``metrics/detail/prior.json``), where both are recorded."""
    pairs = [(name, d["prior_sd_mean"], d["group_sd"]["mean"]) for name, d in (layers or {}).items()
             if isinstance(d, dict) and "prior_sd_mean" in d and "mean" in d.get("group_sd", {})]
    if not pairs:
        return ""
    pairs.sort(key=lambda pair: _network_order(pair[0]))
    widths = ", ".join(f"{name} {prior:.3g} against {group:.3g}" for name, prior, group in pairs)
    return (f" This run's informed prior (prior.method: {method}) has mean marginal sds per layer of {widths} (the "
            "hierarchical posterior's group sds): a prior much wider than the group sds lets a new group's few rows "
            "move its weights as far as the flat prior would. mvnormal fits new-group draws taken over every "
            "posterior draw, so it also spreads over how far the population mean moves between draws; plugin keeps "
            "one draw's mean and group sds (docs/transfer.md).")


def _cell(d: dict | None) -> str:
    """``mean ± se (k of n seeds > 0)``; ``not run`` where the comparison is not in the study."""
    if d is None:
        return "not run"
    return f"{d['mean']:+.3f} ± {d['se']:.3f} ({d['above_zero']} of {d['seeds']} seeds > 0)"


def _misses(rows: list[dict]) -> str:
    """The fits that miss the convergence bar, summed over the seeds, per kind of fit."""
    kinds = [k for k in MISSES if any(k in r["not_converged"] for r in rows)]
    counts = ", ".join(f"{MISSES[k]} {sum(r['not_converged'].get(k, 0) for r in rows)}" for k in kinds)
    return f"Fits missing the convergence bar over all {len(rows)} seeds: {counts or 'none counted'}."


def seeds_reading(method: str, summary: dict[str, dict]) -> str:
    """One sentence of what a method's differences say over seeds: where the informed prior beats the flat prior
    and the refit, falls behind them, or is within 2 standard errors of them (the mean against twice its se)."""
    flat = _kinds(summary, "informed - flat", "the flat prior")
    refit = _kinds(summary, "informed - refit", "")
    if not flat:
        return f"With prior.method {method} the study holds no size."
    return (f"With prior.method {method}, over seeds the informed prior {flat}"
            + (f"; against the hierarchical refit it {refit}" if refit else "") + ".")


def _kinds(summary: dict[str, dict], name: str, against: str) -> str:
    """The sizes at which comparison ``name`` is above, below or within 2 standard errors of zero, as words
    (``against``: what it is compared with, "" where the sentence has said it)."""
    other = f" {against}" if against else ""
    kinds: dict[str, list[str]] = {f"beats{other} beyond 2 standard errors": [],
                                   f"falls behind{other} beyond 2 standard errors": [],
                                   f"is within 2 standard errors{' of' + other if other else ''}": []}
    for label, s in in_size_order(summary).items():
        d = s.get(name)
        if d is None:
            continue
        above, below = d["mean"] > 2 * d["se"], d["mean"] < -2 * d["se"]  # NaN se (one seed): within
        kinds[list(kinds)[0 if above else 1 if below else 2]].append(label)
    return "; ".join(f"{k} at {', '.join(v)}" for k, v in kinds.items() if v)
