"""Convergence over data seeds (benchmarks/data_seeds.py): each model's row read from a stage's outputs, and the
seeds x models table with the seeds that miss the bar; a tiny run of two seeds through the stages (slow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is a package at the repository root

from benchmarks import data_seeds  # noqa: E402


def _outputs(work: Path, stem: str, sampling: dict, seconds: float, draws: int | None = None) -> None:
    """What a fit stage leaves for ``stem``: its detail metrics, its timing and (hierarchical) its trace."""
    (work / "metrics" / "detail").mkdir(parents=True, exist_ok=True)
    (work / "timings").mkdir(exist_ok=True)
    (work / "metrics" / "detail" / f"{stem}.json").write_text(json.dumps({"sampling": sampling}))
    (work / "timings" / f"{stem}.json").write_text(json.dumps({"sampling": {"seconds": seconds}}))
    if draws is not None:
        (work / "traces").mkdir(exist_ok=True)
        xr.Dataset({"mu": (("chain", "draw"), np.zeros((2, draws)))}).to_netcdf(work / "traces" / f"{stem}.nc",
                                                                              group="posterior")


def _sampling(max_rhat: float, min_ess: float, missed: int, **extra) -> dict:
    return {"max_rhat_fn": max_rhat, "min_ess_bulk_fn": min_ess, "groups_not_converged": missed, "divergences": 0,
            **extra}


def test_a_model_row_reads_the_bar_draws_and_seconds(tmp_path):
    thinned = {"g05": {"draws_per_chain": 4000}, "g07": {"draws_per_chain": 2000}}
    _outputs(tmp_path, "informed", _sampling(1.008, 528.0, 0, thinned_groups=thinned), 14.44)
    _outputs(tmp_path, "hier", _sampling(1.013, 263.0, 5, sds_not_converged=1, restarts=1), 92.2, draws=700)
    _outputs(tmp_path, "flat", _sampling(1.005, 1006.0, 0), 4.0)
    informed = data_seeds.model_row(tmp_path, "informed", 22.2, 1000)
    assert informed["draws_per_chain"] == 4000 and informed["refitted_groups"] == 2 and informed["missed"] == 0
    assert informed["sampling_s"] == 14.4 and informed["stage_s"] == 22.2
    hier = data_seeds.model_row(tmp_path, "hier", 101.2, 1000)
    assert hier["draws_per_chain"] == 700  # the trace's, not the per-group draws
    assert hier["missed"] == 6 and hier["restarts"] == 1  # groups and group sds short of the bar
    assert data_seeds.model_row(tmp_path, "flat", 7.0, 1000)["draws_per_chain"] == 1000


def test_the_table_gives_every_seed_and_model_and_names_the_seeds_that_miss():
    def row(seed, missed, seconds):
        return {"seed": seed, "models": {"hier": {"max_rhat": 1.0, "min_ess_bulk": 400.0, "missed": missed,
                                                  "divergences": 0, "draws_per_chain": 500, "refitted_groups": 0,
                                                  "restarts": 0, "sampling_s": seconds, "stage_s": seconds + 5}}}

    text = data_seeds.table([row(1, 0, 10.0), row(2, 3, 90.0), row(31, 0, 30.0)])
    assert text.count("| hier |") == 3
    assert "hier: median sampling 30.0 s over 3 seeds; seeds missing the bar: 2" in text


@pytest.mark.slow
def test_two_seeds_run_through_the_stages_at_tiny_settings(tmp_path):
    from conftest import TINY

    settings = {k: v for k, v in TINY.items() if k not in ("seed", "transfer", "report")}
    out = tmp_path / "seeds.json"
    assert data_seeds.main(["--seeds", "31", "1", "--set", json.dumps(settings), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["complete"] is True and [r["seed"] for r in result["seeds"]] == [31, 1]
    assert all(set(r["models"]) == {"flat", "hier", "informed"} for r in result["seeds"])
    assert result["seeds"][0]["models"]["hier"]["draws_per_chain"] == TINY["hier_sampler"]["draws"]
