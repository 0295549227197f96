"""The transfer experiment over data seeds: does the informed prior help new groups, and how far is it from the
hierarchical refit, beyond the noise of one draw of the data?

For each data seed the transfer stages (``make_data``, ``transfer_prior``, ``transfer_refit``, ``transfer``) run as
DVC runs them, in a directory of their own, with the committed ``params.yaml`` (or ``--params``) and only ``seed``
changed. Per size, each seed gives the paired differences in log predictive density per test row that
``metrics/detail/transfer.json`` records: informed minus flat, informed minus the hierarchical refit, and the refit
minus flat. Over seeds: the mean, its standard error (the seeds' sd over the square root of their number)
and how many seeds agree in sign. Every fit's convergence is counted, so a number resting on a fit that misses the
bar says so.

``--methods`` runs each prior method over the same seeds: the first runs every stage, each other one only
``transfer_prior`` and ``transfer`` again in the same directory, reusing the data and the hierarchical refits (which
do not read ``prior.method``), so its refit column holds the same refits. The JSON file holds, beside the stamp
(:func:`benchmarks.run.run_stamp`), the hash of the params measured but ``seed`` and ``prior.method``
(:func:`hbnn.report.seeds_study.study_hash`): the report shows the study only for params of the same hash, and
``complete`` is false while seeds are still to run.

Usage::

    python -m benchmarks.transfer_seeds                    # seeds 31 (the default data) and 1-5
    python -m benchmarks.transfer_seeds --methods mvnormal plugin --out benchmarks/transfer_seeds.json  # the report's
    python -m benchmarks.transfer_seeds --seeds 31 1 --out /tmp/t.json
    python -m benchmarks.transfer_seeds --params examples/tables/anes96/params.yaml --seeds 0 1 2

A table's rows do not depend on ``seed`` except through its split (``data.train_fraction`` without a split column),
so over a table the seeds vary the split and the samplers' streams only where the params say so.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.run import ROOT, _pipeline_stages, _stage, run_stamp
from benchmarks.sizes import overridden
from hbnn.config import PRIOR_METHODS
from hbnn.config_read import load_params
from hbnn.pipeline.transfer import in_size_order
from hbnn.report.seeds_study import STAGES, VARIED, study_hash

SEEDS = (31, 1, 2, 3, 4, 5)  # the default data's seed, then five more
# the comparisons per size, as metrics/detail/transfer.json's keys hold them
COMPARISONS = {"informed - flat": "difference", "informed - refit": "informed_vs_refit",
               "refit - flat": "refit_vs_flat"}
# a further prior method needs only these again: make_data and transfer_refit do not read prior.method
PRIOR_STAGES = ("transfer_prior", "transfer")


def _write_params(work: Path, base: dict, seed: int, method: str) -> Path:
    """``work/params.yaml``: ``base`` with ``seed`` and ``prior.method`` set (a table's relative path made absolute)."""
    params = work / "params.yaml"
    raw = overridden(base, {"seed": seed, "prior": {"method": method}})
    table = Path(raw.get("data", {}).get("path", ""))
    if raw.get("data", {}).get("source") == "table" and not table.is_absolute():  # the workspace's, not work's
        raw["data"]["path"] = str(ROOT / table)
    params.write_text(yaml.safe_dump(raw))
    return params


def run_seed(work: Path, base: dict, seed: int, method: str, stages=STAGES) -> dict:
    """Run ``stages`` (of :data:`STAGES`, in order) for data seed ``seed`` and prior ``method``; return the detail
    metrics and each stage's seconds. Stages left out must have run in ``work`` before (with another method)."""
    work.mkdir(parents=True, exist_ok=True)
    params = _write_params(work, base, seed, method)
    args = dict(_pipeline_stages())
    seconds = {}
    for stage in stages:
        if stage not in args:  # pragma: no cover - kept in step with dvc.yaml
            raise RuntimeError(f"benchmarks.run._pipeline_stages lacks {stage}")
        seconds[stage] = round(_stage(stage, params, *args[stage])["seconds"], 1)
    detail = json.loads((work / "metrics" / "detail" / "transfer.json").read_text())
    return {"seed": seed, "seconds": seconds, "detail": detail}


def per_seed_row(result: dict) -> dict:
    """One seed's differences per size and its convergence counts."""
    detail = result["detail"]
    sizes = {}
    for label, row in detail["sizes"].items():
        sizes[label] = {name: row[key]["mean"] for name, key in COMPARISONS.items() if key in row}
    sampling = detail["sampling"]
    missed = {name: sampling[name]["fits_not_converged"] for name in ("flat", "informed", "hier_refit")
              if name in sampling}
    missed["hierarchical"] = sampling["hierarchical"]["groups_not_converged"] + sampling["hierarchical"].get(
        "sds_not_converged", 0)
    return {"seed": result["seed"], "seconds": result["seconds"], "sizes": sizes, "not_converged": missed}


def summary(rows: list[dict]) -> dict:
    """Per size and comparison: mean over seeds, its standard error, and the seeds above and below zero."""
    out: dict = {}
    labels = list(in_size_order(dict.fromkeys(label for r in rows for label in r["sizes"])))
    for label in labels:
        for name in COMPARISONS:
            values = [r["sizes"][label][name] for r in rows if name in r["sizes"].get(label, {})]
            if not values:
                continue
            mean = sum(values) / len(values)
            sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else math.nan
            out.setdefault(label, {})[name] = {"mean": mean, "se": sd / math.sqrt(len(values)), "seeds": len(values),
                                               "above_zero": sum(v > 0 for v in values),
                                               "below_zero": sum(v < 0 for v in values)}
    return out


def table(result: dict) -> str:
    """One method's summary (``{"seeds": rows, "summary": ...}``) as Markdown: one row per size, each comparison's
    mean +- se and the seeds above zero, then the fits that miss the bar over all seeds."""
    names = tuple(COMPARISONS)
    lines = ["| rows | " + " | ".join(f"{n} (mean +- se; seeds > 0)" for n in names) + " |",
             "|---|" + "---:|" * len(names)]
    for label, row in in_size_order(result["summary"]).items():
        cells = [f"{row[n]['mean']:+.3f} +- {_se(row[n]['se'])}; {row[n]['above_zero']}/{row[n]['seeds']}"
                 if n in row else "" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    kinds = result["seeds"][0]["not_converged"]
    missed = {k: sum(r["not_converged"].get(k, 0) for r in result["seeds"]) for k in kinds}
    lines.append("")
    lines.append("fits not meeting the bar, over all seeds: " + ", ".join(f"{k} {v}" for k, v in missed.items()))
    return "\n".join(lines)


def _se(se: float | None) -> str:
    return "n/a" if se is None or math.isnan(se) else f"{se:.3f}"


def params_hash(base: dict) -> str:
    """:func:`hbnn.report.seeds_study.study_hash` of the params ``base`` holds (checked as the stages check them)."""
    with tempfile.TemporaryDirectory(prefix="transfer_seeds_params_") as tmp:
        path = Path(tmp) / "params.yaml"
        path.write_text(yaml.safe_dump(base))
        return study_hash(load_params(path))


def study(stamp: dict, args, measured: str, rows: dict[str, list[dict]], wall_s: float) -> dict:
    """The study as its JSON file holds it: the stamp, the params measured (``measured``: their :func:`params_hash`,
    but :data:`VARIED`), per prior method each seed's row and the summary; ``complete`` once every requested seed has
    run."""
    path = args.params.resolve()
    return {**stamp, "params": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
            "overrides": yaml.safe_load(args.set) or {},
            "params_hash": measured, "varied": list(VARIED), "seeds_requested": args.seeds,
            "complete": all(len(r) == len(args.seeds) for r in rows.values()), "wall_s": round(wall_s, 1),
            "methods": {m: {"seeds": r, "summary": summary(r)} for m, r in rows.items()}}


def strict(value):
    """``value`` with every non-finite float (the se of one seed) as ``None``: JSON, not Python's NaN extension."""
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_json(path: Path, result: dict) -> None:
    """``result`` as strict JSON at ``path`` (keys sorted: the report puts the sizes in order)."""
    path.write_text(json.dumps(strict(result), indent=2, sort_keys=True, allow_nan=False) + "\n")


def main(argv=None) -> int:
    """Command line: run the seeds for each method, print the tables, write ``--out`` (JSON) after every seed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="the params to vary the seed of")
    parser.add_argument("--set", default="{}", help="YAML overrides on top of --params, e.g. '{transfer: {tune: 20}}'")
    parser.add_argument("--methods", nargs="+", choices=PRIOR_METHODS,
                        help="prior methods, each over every seed (default: the params' prior.method); the first "
                             "runs every stage, the others transfer_prior and transfer again on its data and refits")
    parser.add_argument("--out", type=Path, help="write the per-seed rows and the summaries here (JSON)")
    args = parser.parse_args(argv)
    base = overridden(yaml.safe_load(args.params.read_text()), yaml.safe_load(args.set) or {})
    methods = list(dict.fromkeys(args.methods or [base.get("prior", {}).get("method", PRIOR_METHODS[0])]))
    stamp, start = run_stamp(), time.perf_counter()
    measured = params_hash(base)  # once; bad params end here, before any stage runs
    rows: dict[str, list[dict]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory(prefix="transfer_seeds_") as tmp:
        for seed in args.seeds:
            for i, method in enumerate(methods):
                row = per_seed_row(run_seed(Path(tmp) / f"seed{seed}", base, seed, method,
                                            STAGES if i == 0 else PRIOR_STAGES))
                print(f"seed {seed} {method}: {json.dumps(row['sizes'])} not converged {row['not_converged']} "
                      f"({sum(row['seconds'].values()):.0f}s)", file=sys.stderr, flush=True)
                rows[method].append(row)
            if args.out:  # what has run so far, marked incomplete until the last seed
                write_json(args.out, study(stamp, args, measured, rows, time.perf_counter() - start))
    result = study(stamp, args, measured, rows, time.perf_counter() - start)
    for method in methods:
        print(f"prior.method: {method}\n\n{table(result['methods'][method])}\n")
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
