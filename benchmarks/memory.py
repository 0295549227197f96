"""Peak memory of ``fit_hier`` against the budget's estimate, on tables with one large group.

``python -m benchmarks.memory [--out benchmarks/memory_peaks.json]`` writes, for each size below, a table of many
small groups and one large one, runs ``make_data`` and then ``fit_hier`` (tiny draws; the hand-written density is
checked against PyMC's model, as a first fit of a model is) as their own processes in a scratch directory, and
records each process's peak resident memory (``ru_maxrss`` from ``wait4``) beside the estimate
:func:`hbnn.pipeline.budget.fit_estimate` gives for the same sizes. The hierarchical model lays every group out as wide
as the largest (:meth:`hbnn.data.tasks.Tasks.padded`), so its memory grows with groups x largest group's rows, which is
what the first tables stress; the last ones, of thousands of tiny groups, stress the sampled coordinates, whose NUTS
states each chain holds. ``tests/test_budget.py`` holds the estimates to the recorded peaks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
# (small groups, rows of each small group, rows of the one large group): the padded layout holds
# (small + 1) x large rows; the last two, of thousands of 4-row groups, stress the sampled coordinates instead (each
# chain's trajectory holds states of every coordinate)
SIZES = ((200, 4, 5_000), (400, 4, 20_000), (2_999, 4, 4), (5_999, 4, 4))
SAMPLER = {"backend": "nutpie", "chains": 2, "tune": 10, "draws": 10, "max_draws": 0, "restarts": 0,
           "target_accept": 0.9, "mass_matrix": "diag"}


def table(small: int, rows: int, large: int, seed: int = 0) -> pd.DataFrame:
    """``small`` groups of ``rows`` rows and one group of ``large`` rows: two features, a 0/1 label, a split."""
    rng = np.random.default_rng(seed)
    sizes = [rows] * small + [large]
    group = np.repeat([f"s{i:05d}" for i in range(small)] + ["large"], sizes)
    within = np.concatenate([np.arange(k) for k in sizes])
    y = (within // 2) % 2  # rows 0, 2 (training) and 1, 3 (test) of every group hold both labels
    x = rng.normal(size=(group.size, 2)) + y[:, None]
    split = np.where(within % 2 == 0, "train", "test")
    return pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1], "y": y, "g": group, "split": split})


def params(path: Path) -> dict:
    return {"n_groups": 2, "seed": 1,
            "data": {"source": "table", "path": str(path), "features": ["x1", "x2"], "label": "y", "group": "g",
                     "split": "split"},
            "hier_sampler": SAMPLER, "sampler": {"tune": 10, "draws": 10, "max_draws": 0}}


def run(script: str, args: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """Run ``stages/<script>`` in ``cwd``: its peak resident memory in GiB and its seconds."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(ROOT / "stages" / script), *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{script} failed:\n{err[-2000:]}")
    return usage.ru_maxrss / 2**20, time.monotonic() - start  # Linux: KiB


def measure(small: int, rows: int, large: int) -> dict:
    """Peak memory and seconds of make_data and fit_hier on one table, and the budget's estimate."""
    from hbnn.config_read import parse_params
    from hbnn.pipeline.budget import fit_estimate

    with tempfile.TemporaryDirectory(prefix="hbnn-memory-") as tmp:
        work = Path(tmp)
        table(small, rows, large).to_csv(work / "table.csv", index=False)
        raw = params(work / "table.csv")
        (work / "params.yaml").write_text(yaml.safe_dump(raw))
        env = {**os.environ, "HBNN_DENSITY_CHECKS": str(work / "checks")}  # every run checks its density
        data_gib, _ = run("make_data.py", ["--out", "data/tasks.nc"], work, env)
        fit_gib, fit_s = run("fit_hier.py", ["--tasks-path", "data/tasks.nc", "--trace-out", "traces/hier.nc",
                                             "--metrics-out", "metrics/hier.json", "--timing-out",
                                             "timings/hier.json"], work, env)
    n_train = small * ((rows + 1) // 2) + (large + 1) // 2
    n_test = small * rows + large - n_train
    estimate = fit_estimate("fit_hier", parse_params(raw), small + 1, n_train, n_test, 2,
                            max_group_rows=(large + 1) // 2)
    return {"groups": small + 1, "rows_small": rows, "rows_large": large, "train_rows": n_train,
            "padded_rows": (small + 1) * ((large + 1) // 2), "make_data_peak_gib": round(data_gib, 3),
            "fit_hier_peak_gib": round(fit_gib, 3), "fit_hier_seconds": round(fit_s, 1),
            "fit_hier_estimate_gib": round(estimate.memory_gib, 3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "memory_peaks.json")
    args = parser.parse_args(argv)
    rows = [measure(*size) for size in SIZES]
    print(f"{'groups':>7} {'largest':>8} {'padded rows':>12} {'peak GiB':>9} {'estimate GiB':>13} {'seconds':>8}")
    for r in rows:
        print(f"{r['groups']:>7} {r['rows_large']:>8} {r['padded_rows']:>12} {r['fit_hier_peak_gib']:>9.3f} "
              f"{r['fit_hier_estimate_gib']:>13.3f} {r['fit_hier_seconds']:>8.1f}")
    args.out.write_text(json.dumps({"sampler": SAMPLER, "runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
