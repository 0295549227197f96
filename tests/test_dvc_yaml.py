"""dvc.yaml is the contract: every stage must declare the code it runs and params that exist."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from hbnn.pipeline import STAGE_PARAMS

ROOT = Path(__file__).resolve().parents[1]
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def _hbnn_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "hbnn":
            out |= {f"hbnn.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hbnn."):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("hbnn.")}
    return out


def import_closure(script: Path) -> set[str]:
    """Repo-relative paths of every ``hbnn`` module a script imports, directly or not."""
    seen: set[str] = set()
    todo = _hbnn_imports(script)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = ROOT / "src" / (module.replace(".", "/") + ".py")
        if path.exists():
            todo |= _hbnn_imports(path)
    return {f"src/{m.replace('.', '/')}.py" for m in seen if (ROOT / "src" / (m.replace(".", "/") + ".py")).exists()}


@pytest.mark.parametrize("stage", sorted(DVC["stages"]))
def test_stage_declares_all_code_it_runs(stage):
    spec = DVC["stages"][stage]
    script = ROOT / "stages" / f"{stage}.py"
    assert f"stages/{stage}.py" in spec["cmd"]
    deps = {d if isinstance(d, str) else next(iter(d)) for d in spec["deps"]}
    needed = import_closure(script) | {f"stages/{stage}.py"}
    assert needed <= deps, f"{stage} runs but does not declare {sorted(needed - deps)}"


@pytest.mark.parametrize("stage", sorted(DVC["stages"]))
def test_stage_params_exist(stage):
    for key in DVC["stages"][stage].get("params", []):
        if isinstance(key, dict):  # `- params.yaml:` (the whole file)
            assert key == {"params.yaml": None}
            continue
        node = PARAMS
        for part in key.split("."):
            assert part in node, f"{stage} lists params key {key!r} that params.yaml lacks"
            node = node[part]


def test_every_params_key_is_validated_by_a_stage():
    """A key no stage lists would never be read; check_params lists the whole file instead."""
    assert {"params.yaml": None} in DVC["stages"]["check_params"]["params"]
    assert "cli.py" in str(DVC["stages"]["check_params"]["deps"])
    for module in import_closure(ROOT / "stages" / "check_params.py"):  # cheap: no sampler imported
        source = (ROOT / module).read_text()
        assert "import pymc" not in source and "import nutpie" not in source, module


def test_n_groups_and_seed_reach_make_data():
    assert {"n_groups", "seed"} <= set(DVC["stages"]["make_data"]["params"])


@pytest.mark.parametrize("stage", sorted(STAGE_PARAMS))
def test_provenance_hash_covers_exactly_the_declared_params(stage):
    assert list(STAGE_PARAMS[stage]) == DVC["stages"][stage]["params"]
