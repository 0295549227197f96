"""Write the public example tables of ``examples/tables/`` from statsmodels' bundled data, and optionally run them.

Each table is a grouped table that ships with statsmodels (pinned in ``requirements.lock``, no download), written
deterministically as ``examples/tables/<name>/<name>.csv`` beside the recipe's ``params.yaml``:

- ``anes96``: the 1996 American National Election Study, 944 voters in 7 education levels (13 to 248 voters
  each); label ``vote`` (1: Dole, 0: Clinton), bernoulli.
- ``grunfeld``: Grunfeld's investment data, 11 firms x 20 years (1935-1954); label ``invest`` (gross investment),
  features the firm's value and capital stock, gaussian.
- ``randhie``: the RAND Health Insurance Experiment, outpatient visits ``mdvis`` (a count) of 1,500 people drawn
  (fixed seed) from the 20,190 rows, grouped by self-rated health (4 levels, 17 to 1,000 people), negative binomial.

``--run`` then runs the pipeline's stages on the recipe (check_params, make_data, fit_flat, fit_hier,
derive_prior, fit_informed, baselines, report; the transfer experiment is left out), each with
``--params examples/tables/<name>/params.yaml``, writing data, traces, metrics and the report under
``examples/tables/<name>/run/`` (ignored by git): the workspace's own outputs and ``params.yaml`` are not touched.
It ends with a table of every model's test scores and convergence (:func:`scores`), as docs/tables.md shows it;
``--scores`` prints that table again from a finished run.

Usage::

    python scripts/make_example_tables.py anes96 [grunfeld randhie ...]   # write the CSVs
    python scripts/make_example_tables.py grunfeld --run                  # write the CSV and run the recipe
    python scripts/make_example_tables.py grunfeld --scores               # the scores of the last run
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "examples" / "tables"
EDUCATION = {1: "1-8 grades", 2: "some high school", 3: "high school", 4: "some college", 5: "college",
             6: "master's", 7: "PhD"}
RANDHIE_ROWS = 1500  # people drawn from randhie's 20,190: enough for the smallest health group to have a few
RANDHIE_SEED = 0     # the draw's seed, so the table is the same on every machine


def anes96() -> pd.DataFrame:
    """Voters: six numeric features, the education level as group, the vote (1: Dole) as label."""
    from statsmodels.datasets import anes96 as data

    df = data.load_pandas().data
    out = df[["selfLR", "PID", "age", "income", "TVnews", "logpopul"]].copy()
    out.insert(0, "education", df["educ"].astype(int).map(EDUCATION))
    out["logpopul"] = out["logpopul"].round(6)
    out["vote"] = df["vote"].astype(int)
    return out


def grunfeld() -> pd.DataFrame:
    """Firm-years: the firm as group, its value and capital stock as features, gross investment as label."""
    from statsmodels.datasets import grunfeld as data

    df = data.load_pandas().data
    out = df[["firm", "value", "capital", "invest"]].copy()
    out.insert(1, "year", df["year"].astype(int))
    return out


def randhie() -> pd.DataFrame:
    """People: self-rated health as group, the insurance and health features, outpatient visits as label."""
    from statsmodels.datasets import randhie as data

    df = data.load_pandas().data
    df = df.iloc[np.sort(np.random.default_rng(RANDHIE_SEED).choice(len(df), RANDHIE_ROWS, replace=False))]
    health = np.select([df["hlthp"] == 1, df["hlthf"] == 1, df["hlthg"] == 1], ["poor", "fair", "good"],
                       "excellent")
    out = df[["lncoins", "idp", "lpi", "fmde", "physlm", "disea"]].round(6)
    out.insert(0, "health", health)
    out["mdvis"] = df["mdvis"].astype(int)
    return out.reset_index(drop=True)


MAKERS = {"anes96": anes96, "grunfeld": grunfeld, "randhie": randhie}
# (script, the stage's path options) in run order; paths are relative to the recipe's run/ folder
STAGES = [
    ("check_params", {}),
    ("make_data", {"out": "data/tasks.nc"}),
    ("fit_flat", {"tasks-path": "data/tasks.nc", "trace-out": "traces/flat.nc", "metrics-out": "metrics/flat.json",
                  "timing-out": "timings/flat.json"}),
    ("fit_hier", {"tasks-path": "data/tasks.nc", "trace-out": "traces/hier.nc", "metrics-out": "metrics/hier.json",
                  "timing-out": "timings/hier.json"}),
    ("derive_prior", {"hier-trace": "traces/hier.nc", "prior-out": "priors/informed.nc",
                      "metrics-out": "metrics/prior.json"}),
    ("fit_informed", {"tasks-path": "data/tasks.nc", "prior-path": "priors/informed.nc",
                      "trace-out": "traces/informed.nc", "metrics-out": "metrics/informed.json",
                      "timing-out": "timings/informed.json"}),
    ("baselines", {"tasks-path": "data/tasks.nc", "metrics-out": "metrics/baselines.json"}),
    ("report", {"tasks-path": "data/tasks.nc", "flat-trace": "traces/flat.nc", "hier-trace": "traces/hier.nc",
                "informed-trace": "traces/informed.nc", "prior-path": "priors/informed.nc", "metrics-dir": "metrics",
                "out-dir": "reports"}),
]


def write(name: str) -> Path:
    """Write ``examples/tables/<name>/<name>.csv``; returns its path."""
    path = TABLES / name / f"{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    MAKERS[name]().to_csv(path, index=False)
    return path


def run(name: str) -> int:
    """Run the recipe's stages in order from the repository root; the first that fails stops the run (its status)."""
    begin = time.perf_counter()
    params = TABLES / name / "params.yaml"
    out = TABLES / name / "run"
    for stage, paths in STAGES:
        cmd = [sys.executable, str(ROOT / "stages" / f"{stage}.py"), "--params", str(params.relative_to(ROOT))]
        for option, rel in paths.items():
            cmd += [f"--{option}", str((out / rel).relative_to(ROOT))]
        start = time.perf_counter()
        code = subprocess.call(cmd, cwd=ROOT)
        print(f"{name}: {stage} {'done' if code == 0 else f'failed ({code})'} in {time.perf_counter() - start:.0f} s",
              flush=True)
        if code:
            return code
    print(f"{name}: all stages done in {time.perf_counter() - begin:.0f} s; open "
          f"{(out / 'reports' / 'report.html').relative_to(ROOT)}")
    return 0


def scores(name: str) -> str:
    """The test scores of a finished run of recipe ``name``: per BNN and baseline the headline scores, the paired
    difference in per-row log predictive density from the best baseline in its standard errors (as the report's
    first line computes it), and for the BNNs whether every group (and group sd) meets the convergence bar."""
    import json

    sys.path.insert(0, str(ROOT / "src"))
    from hbnn.config_read import load_params
    from hbnn.diagnostics.predictions import evaluate_groups, group_extra, group_weights
    from hbnn.files.io import close_trace, load_trace
    from hbnn.model import likelihoods
    from hbnn.model.network import layer_specs
    from hbnn.pipeline.stages import baselines, load_run_tasks
    from hbnn.pipeline.transfer import paired_difference, row_lpd
    from hbnn.pipeline.variants import VARIANTS
    from hbnn.report.inputs import load_vars

    params = load_params(TABLES / name / "params.yaml")
    out = TABLES / name / "run"
    tasks = load_run_tasks(out / "data" / "tasks.nc", params)
    lik = likelihoods.get(tasks.likelihood)
    specs = layer_specs(tasks.n_features, params.model.hidden_layers, params.model.bias)
    preds = baselines.all_predictions(tasks, params)
    rows = {m: row_lpd(baselines.scoring_likelihood(tasks.likelihood), preds[m]["test"]) for m in baselines.MODELS}
    metrics = {m: json.loads((out / "metrics" / "baselines.json").read_text())[m] for m in baselines.MODELS}
    names = tasks.group_names
    for v in VARIANTS:  # hierarchical, flat, informed: each trace's posterior, scored as the report scores it
        idata = load_trace(out / "traces" / f"{v.stem}.nc", v.name, groups=(), params=params, only=("posterior",),
                           stage=v.stage)
        try:
            post = load_vars(idata, [s.var for s in specs] + ([lik.extra] if lik.extra else []))
        finally:
            close_trace(idata)
        test = evaluate_groups(tasks, lambda g, post=post: group_weights(post, specs, names[g]),
                               params.model.activation, ("test",),
                               noise_of=lambda g, post=post: group_extra(post, lik.extra, names[g]))["test"]
        rows[v.stem] = row_lpd(lik, test)
        metrics[v.stem] = json.loads((out / "metrics" / f"{v.stem}.json").read_text())
    best = max(baselines.MODELS, key=lambda m: rows[m].mean())
    lines = [f"{name}: test scores; 'se' is the paired per-row lpd difference from the best baseline ({best}) in "
             "its standard errors"]
    for m in sorted(rows, key=lambda m: -rows[m].mean()):
        d = paired_difference(rows[m], rows[best])
        shown = "  ".join(f"{k} {v:.4f}" for k, v in sorted(metrics[m]["test"].items()))
        line = f"  {m:18s} {shown}  {d['mean'] / d['se'] if d['se'] > 0 else 0.0:+.2f} se"
        if "sampling" in metrics[m]:
            s = metrics[m]["sampling"]
            missing = s["groups_not_converged"] + s.get("sds_not_converged", 0)
            line += (f"  {'converged' if missing == 0 else f'{missing} NOT converged'} (max R-hat "
                     f"{s['max_rhat']:.3f}, min ESS {s['min_ess_bulk']:.0f}, {s['divergences']} divergences)")
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", choices=sorted(MAKERS), metavar="name",
                        help=f"tables to write: {', '.join(sorted(MAKERS))}")
    parser.add_argument("--run", action="store_true", help="also run each recipe's stages (under its run/ folder)")
    parser.add_argument("--scores", action="store_true", help="only print the scores of each recipe's last run")
    args = parser.parse_args(argv)
    for name in args.names:
        if not args.scores:
            print(f"{name}: wrote {write(name).relative_to(ROOT)}")
            if args.run and (code := run(name)):
                return code
        if args.run or args.scores:
            if not (TABLES / name / "run" / "metrics" / "baselines.json").exists():
                print(f"error: {name} has no finished run under {(TABLES / name / 'run').relative_to(ROOT)}: run it "
                      "with --run", file=sys.stderr)
                return 2
            print(scores(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
