"""Convergence over data seeds: does every model meet the bar in every group when only the data change?

For each data seed the stages up to the informed fit (``make_data``, ``fit_flat``, ``fit_hier``, ``derive_prior``,
``fit_informed``) run as DVC runs them, in a directory of their own, with the committed ``params.yaml`` (or
``--params``, with ``--set`` on top) and only ``seed`` changed. Per seed and model the table gives what DESIGN.md's
bar reads (the largest function-space R-hat and the smallest bulk ESS over groups), the groups that miss it, the
divergences, the draws per chain kept (the hierarchical fit's run-length control, the per-group fits' largest refit)
and the sampling and stage seconds. ``--stages`` runs fewer stages (``make_data fit_hier``: the hierarchical fit
alone), which is how a change to ``hier_sampler`` is compared over seeds.

Usage::

    python -m benchmarks.data_seeds                       # seeds 1-8 and 31 (the default data), every model
    python -m benchmarks.data_seeds --out benchmarks/data_seeds.json
    python -m benchmarks.data_seeds --seeds 2 8 --stages make_data fit_hier --set '{hier_sampler: {max_draws: 8000}}'
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.run import ROOT, _pipeline_stages, _stage, _trace_draws, run_stamp
from benchmarks.sizes import overridden
from benchmarks.transfer_seeds import _write_params, write_json

SEEDS = (1, 2, 3, 4, 5, 6, 7, 8, 31)  # 31 is the default data's
STAGES = ("make_data", "fit_flat", "fit_hier", "derive_prior", "fit_informed")
MODELS = {"flat": "fit_flat", "hier": "fit_hier", "informed": "fit_informed"}  # metrics stem: the stage writing it


def model_row(work: Path, stem: str, stage_seconds: float, draws: int) -> dict:
    """One fitted model's convergence in ``work``: from its detail metrics, timing and trace (``draws``: a per-group
    fit's draws per chain, where no group was fitted again)."""
    detail = json.loads((work / "metrics" / "detail" / f"{stem}.json").read_text())
    timing = json.loads((work / "timings" / f"{stem}.json").read_text())
    sampling = detail["sampling"]
    thinned = sampling.get("thinned_groups", {})
    draws = (_trace_draws(work / "traces" / f"{stem}.nc") if stem == "hier" else
             max([g["draws_per_chain"] for g in thinned.values()], default=draws))
    missed = sampling["groups_not_converged"] + sampling.get("sds_not_converged", 0)
    return {"max_rhat": sampling["max_rhat_fn"], "min_ess_bulk": sampling["min_ess_bulk_fn"], "missed": missed,
            "divergences": sampling["divergences"], "draws_per_chain": draws, "refitted_groups": len(thinned),
            "restarts": sampling.get("restarts", 0), "sampling_s": round(timing["sampling"]["seconds"], 1),
            "stage_s": stage_seconds}


def run_seed(work: Path, base: dict, seed: int, stages=STAGES) -> dict:
    """Run ``stages`` for data seed ``seed`` in ``work``; return each fitted model's :func:`model_row`."""
    work.mkdir(parents=True, exist_ok=True)
    params = _write_params(work, base, seed, base.get("prior", {}).get("method", "mvnormal"))
    args = dict(_pipeline_stages())
    seconds = {stage: round(_stage(stage, params, *args[stage])["seconds"], 1) for stage in stages}
    draws = base["sampler"]["draws"]
    return {"seed": seed, "models": {stem: model_row(work, stem, seconds[stage], draws)
                                     for stem, stage in MODELS.items() if stage in stages}}


def table(rows: list[dict]) -> str:
    """The seeds x models table as Markdown, then per model the median sampling seconds and the seeds that miss."""
    lines = ["| seed | model | max R-hat | min ESS | groups missing | divergences | draws per chain | sampling s |"
             " stage s |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        for stem, m in row["models"].items():
            draws = f"{m['draws_per_chain']}" + (f" ({m['refitted_groups']} refitted)" if m["refitted_groups"] else "")
            lines.append(f"| {row['seed']} | {stem} | {m['max_rhat']:.4f} | {m['min_ess_bulk']:.0f} | {m['missed']} | "
                         f"{m['divergences']} | {draws} | {m['sampling_s']:.1f} | {m['stage_s']:.1f} |")
    lines.append("")
    for stem in dict.fromkeys(s for r in rows for s in r["models"]):
        ms = [(r["seed"], r["models"][stem]) for r in rows if stem in r["models"]]
        short = [str(seed) for seed, m in ms if m["missed"]]
        lines.append(f"{stem}: median sampling {statistics.median(m['sampling_s'] for _, m in ms):.1f} s over "
                     f"{len(ms)} seeds; seeds missing the bar: {', '.join(short) or 'none'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Command line: run the seeds, print the table, write ``--out`` (JSON) after every seed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="the params to vary the seed of")
    parser.add_argument("--set", default="{}", help="YAML overrides on top of --params, e.g. '{hier_sampler: {tune: "
                                                    "600}}'")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES),
                        help="stages to run, in pipeline order (make_data first; derive_prior before fit_informed)")
    parser.add_argument("--workdir", type=Path, help="keep each seed's outputs under here (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="write the rows here (JSON)")
    args = parser.parse_args(argv)
    base = overridden(yaml.safe_load(args.params.read_text()), yaml.safe_load(args.set) or {})
    stages = [s for s in STAGES if s in args.stages]
    if stages[0] != "make_data" and args.workdir is None:  # a stage reads what the stages before it wrote
        parser.error(f"--stages from {stages[0]} needs --workdir with each seed's outputs of the stages before it")
    stamp, start, rows = run_stamp(), time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="data_seeds_") as tmp:
        root = args.workdir or Path(tmp)
        for seed in args.seeds:
            rows.append(run_seed(root / f"seed{seed}", base, seed, stages))
            print(f"seed {seed}: {json.dumps(rows[-1]['models'])}", file=sys.stderr, flush=True)
            if args.out:
                write_json(args.out, {**stamp, "overrides": yaml.safe_load(args.set) or {}, "stages": stages,
                                      "seeds_requested": args.seeds, "complete": len(rows) == len(args.seeds),
                                      "wall_s": round(time.perf_counter() - start, 1), "seeds": rows})
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
