"""The README's documented configurations are the ones `make bench` measures."""

from __future__ import annotations

import importlib
import re
import shlex
import shutil
import sys
from pathlib import Path

import yaml
from dvc.utils.hydra import apply_overrides

from hbnn.config import load_params

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ is a package at the repository root
bench = importlib.import_module("benchmarks.run")


def test_the_readme_many_groups_command_sets_what_the_benchmark_measures(tmp_path):
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^HBNN_DASK_SCHEDULER=(\S+) dvc exp run -n groups-1000 (.+?)(?<!\\)$", text,
                      flags=re.M | re.S)
    assert match, "README: no `HBNN_DASK_SCHEDULER=... dvc exp run -n groups-1000 ...` line"
    assert match.group(1) == bench.MANY_GROUPS_SCHEDULER
    words = shlex.split(match.group(2).replace("\\\n", " "))
    overrides = [w for i, w in enumerate(words) if i and words[i - 1] == "-S"]
    assert overrides and len(overrides) * 2 == len(words), words
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    apply_overrides(str(tmp_path / "params.yaml"), overrides)
    committed = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert yaml.safe_load((tmp_path / "params.yaml").read_text()) == bench._overridden(committed, bench.MANY_GROUPS)
    load_params(tmp_path / "params.yaml")  # valid as written: no key of the defaults it keeps conflicts with it
