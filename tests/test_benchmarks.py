"""The documented configurations (docs/many-groups.md) are the ones `make bench` measures."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import yaml
from dvc.utils.hydra import apply_overrides

from hbnn.config_read import load_params

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ is a package at the repository root
bench = importlib.import_module("benchmarks.run")


def test_the_documented_many_groups_command_sets_what_the_benchmark_measures(tmp_path):
    text = (ROOT / "docs" / "many-groups.md").read_text()
    match = re.search(r"^HBNN_DASK_SCHEDULER=(\S+) dvc exp run -n groups-1000 (.+?)(?<!\\)$", text,
                      flags=re.M | re.S)
    assert match, "docs/many-groups.md: no `HBNN_DASK_SCHEDULER=... dvc exp run -n groups-1000 ...` line"
    assert match.group(1) == bench.MANY_GROUPS_SCHEDULER
    words = shlex.split(match.group(2).replace("\\\n", " "))
    overrides = [w for i, w in enumerate(words) if i and words[i - 1] == "-S"]
    assert overrides and len(overrides) * 2 == len(words), words
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    apply_overrides(str(tmp_path / "params.yaml"), overrides)
    committed = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert yaml.safe_load((tmp_path / "params.yaml").read_text()) == bench._overridden(committed, bench.MANY_GROUPS)
    load_params(tmp_path / "params.yaml")  # valid as written: no key of the defaults it keeps conflicts with it


def test_bench_variants_keep_the_other_rows_and_recompute_the_ratios_to_pymc(tmp_path, monkeypatch):
    out = tmp_path / "benchmark.json"
    rates = ("ess_per_s", "ess_per_s_fn", "ess_per_s_group_sd")

    def row(backend, us, *values):
        return {**dict(zip(rates, values, strict=True)), "us_per_grad": us, "runs": [{"backend": backend}]}

    out.write_text(json.dumps({"backends": {"pymc": row("pymc", 400.0, 1.0, 1.0, 2.0),
                                            "numpyro": row("numpyro", 100.0, 3.0, 3.0, 4.0),
                                            "nutpie": row("nutpie", 40.0, 9.0, 9.0, 9.0),
                                            "default": row("nutpie", 40.0, 1.0, 1.0, 1.0)},
                               "repro_s": 5.0}))
    monkeypatch.setattr(bench, "backends",
                        lambda work, chosen: {name: row("nutpie", 24.0, 8.0, 8.0, 10.0) for name in chosen})
    bench.main(["--out", str(out), "--only", "backends", "--variants", "default", "--workdir", str(tmp_path / "w")])
    got = json.loads(out.read_text())
    assert set(got["backends"]) == {"pymc", "numpyro", "nutpie", "default"}
    assert got["backends"]["default"]["speedup_vs_pymc_fn"] == 8.0
    assert got["backends"]["default"]["speedup_vs_pymc_group_sd"] == 5.0
    assert got["backends"]["numpyro"]["speedup_vs_pymc_group_sd"] == 2.0
    # the gradient was timed again with the row run: the kept row of the same backend shows it, the others not
    assert [got["backends"][name]["us_per_grad"] for name in ("nutpie", "numpyro")] == [24.0, 100.0]
    assert got["repro_s"] == 5.0  # sections not run keep their values too


def test_bench_scaling_takes_its_18_group_point_from_the_nutpie_row_just_run(tmp_path, monkeypatch):
    runs = [{"backend": "nutpie", "peak_rss_mib": m} for m in (600.0, 610.0, 640.0)]
    rows = {"nutpie": {"wall_s": 7.0, "runs": runs}}
    seen = {}

    def scaling(work, backend_results=None):
        seen["rows"] = backend_results
        return {}

    out = tmp_path / "benchmark.json"
    out.write_text(json.dumps({"backends": {"pymc": {"ess_per_s": 1.0, "ess_per_s_fn": 1.0, "ess_per_s_group_sd": 1.0,
                                                     "runs": [{"backend": "pymc"}], "us_per_grad": 1.0}}}))
    monkeypatch.setattr(bench, "backends", lambda work, chosen: {"nutpie": dict(rows["nutpie"], us_per_grad=1.0,
                                                                                ess_per_s=1.0, ess_per_s_fn=1.0,
                                                                                ess_per_s_group_sd=1.0)})
    monkeypatch.setattr(bench, "scaling", scaling)
    bench.main(["--out", str(out), "--only", "backends", "scaling", "--variants", "nutpie",
                "--workdir", str(tmp_path / "w")])
    assert set(seen["rows"]) == {"nutpie"}  # the rows measured, not those kept from the previous file
    # and the point itself: the row's wall and its runs' median peak memory (a row holds no peak of its own)
    monkeypatch.undo()
    monkeypatch.setattr(bench, "_params", lambda *a, **k: tmp_path / "params.yaml")
    monkeypatch.setattr(bench, "_stage", lambda *a, **k: {"seconds": 1.0, "peak_rss_mib": 1.0})
    monkeypatch.setattr(bench, "_fit", lambda *a, **k: None)
    point = bench.scaling(tmp_path, nuts_groups=(18,), advi_groups=(), minibatch_groups=(), backend_results=rows)
    assert point["hier_nutpie"]["18"] == {"seconds": 7.0, "peak_rss_mib": 610.0}
