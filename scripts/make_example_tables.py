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

Usage::

    python scripts/make_example_tables.py anes96 [grunfeld randhie ...]   # write the CSVs
    python scripts/make_example_tables.py grunfeld --run                  # write the CSV and run the recipe
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
    print(f"{name}: open {(out / 'reports' / 'report.html').relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", choices=sorted(MAKERS), metavar="name",
                        help=f"tables to write: {', '.join(sorted(MAKERS))}")
    parser.add_argument("--run", action="store_true", help="also run each recipe's stages (under its run/ folder)")
    args = parser.parse_args(argv)
    for name in args.names:
        print(f"{name}: wrote {write(name).relative_to(ROOT)}")
        if args.run and (code := run(name)):
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
