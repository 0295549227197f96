"""Time reading a table of many small groups: ``check_params`` and ``make_data`` bodies, and the fit stages' views.

For each group count it writes a CSV of that many groups of ``--rows`` rows each
(two features, a 0/1 label in both classes in every group, no split column: the
table is split by :func:`hbnn.data.tables.stratified_split`), then times in this process:

- ``check_params``: :func:`hbnn.pipeline.preflight.check_params` (reads and checks the table,
  then every stage's cost);
- ``make_data``: :func:`hbnn.pipeline.stages.make_data.make_data` (reads and checks it
  again and writes ``data/tasks.nc``);
- ``tasks``: :func:`hbnn.pipeline.stages.load_run_tasks` of that file, ``padded("train")`` (the
  hierarchical fit's layout) and ``split("test")`` with every group's ``rows``
  (the per-group fits' and the evaluation's use).

The cost limits are raised so that the fit stages' estimates of a 100,000-group
run do not refuse it: only loading is timed. Prints a table; nothing is written
outside a temporary directory.

Usage: ``python benchmarks/load_scale.py [--groups 1000 10000 100000] [--rows 4]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's hbnn, as the stage scripts use it


def write_table(path: Path, n_groups: int, rows: int, seed: int = 0) -> None:
    """``n_groups`` groups of ``rows`` rows: features ``a``, ``b``, label ``y`` alternating 0/1 within a group."""
    rng = np.random.default_rng(seed)
    n = n_groups * rows
    pd.DataFrame({
        "g": np.repeat([f"grp{i:06d}" for i in range(n_groups)], rows),
        "a": rng.normal(size=n).round(4),
        "b": rng.normal(size=n).round(4),
        "y": np.tile(np.arange(rows) % 2, n_groups),
    }).to_csv(path, index=False)


def params_for(table: Path) -> dict:
    return {"n_groups": 2, "seed": 1,
            "data": {"source": "table", "path": str(table), "features": ["a", "b"], "label": "y", "group": "g"},
            "model": {"hidden_layers": [2]},
            "sampler": {"chains": 2, "tune": 1, "draws": 200, "max_draws": 0},
            "hier_sampler": {"chains": 2, "tune": 1, "draws": 200, "max_draws": 0, "restarts": 0},
            "prior": {"draws_per_sample": 1},
            "limits": {"max_memory_gib": 1e9, "max_minutes": 1e9}}


def time_one(n_groups: int, rows: int, d: Path) -> dict[str, float]:
    from hbnn.config_read import load_params
    from hbnn.pipeline.preflight import check_params
    from hbnn.pipeline.stages import load_run_tasks
    from hbnn.pipeline.stages.make_data import make_data

    table = d / f"table_{n_groups}.csv"
    write_table(table, n_groups, rows)
    (d / "params.yaml").write_text(yaml.safe_dump(params_for(table)))
    params = load_params(d / "params.yaml")
    out = {}
    start = time.perf_counter()
    check_params(params)
    out["check_params"] = time.perf_counter() - start
    start = time.perf_counter()
    make_data(params, d / "tasks.nc")
    out["make_data"] = time.perf_counter() - start
    start = time.perf_counter()
    tasks = load_run_tasks(d / "tasks.nc", params)
    tasks.padded("train")
    test = tasks.split("test")
    for g in range(tasks.n_groups):
        test.rows(g)
    out["tasks"] = time.perf_counter() - start
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--rows", type=int, default=4, help="rows per group")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import xarray  # noqa: F401 - loaded first, so that no row's time holds the import

    from hbnn.pipeline.runner import skip_dask_array_lookup

    skip_dask_array_lookup()
    print(f"{'groups':>8} {'rows':>8} {'check_params s':>15} {'make_data s':>12} {'tasks s':>8}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.groups:
            t = time_one(n, args.rows, Path(tmp))
            print(f"{n:>8} {n * args.rows:>8} {t['check_params']:>15.2f} {t['make_data']:>12.2f} {t['tasks']:>8.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
