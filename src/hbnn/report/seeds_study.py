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


def seeds_blocks(study: dict | None, params: Params, path: Path = SEEDS_FILE) -> list[Para | Heading | Table]:
    """The transfer section's part on the study over data seeds: a table per prior method (the run's own first)
    where the study measured these params (:func:`study_hash`) over every seed it names, else one line saying why it
    is not shown and how to measure it."""
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
    return blocks


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
