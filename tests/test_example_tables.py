"""The public example tables (examples/tables/, docs/tables.md): each committed CSV is what
scripts/make_example_tables.py writes from statsmodels, and each recipe's params file reads its table."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import pytest

from hbnn.config_read import load_params
from hbnn.data.spec import DataSpec
from hbnn.data.tasks import Tasks, make_tasks

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "examples" / "tables"
RECIPES = {"anes96": (7, "bernoulli"), "grunfeld": (11, "gaussian"), "randhie": (4, "negative_binomial")}


def _script():
    spec = importlib.util.spec_from_file_location("make_example_tables", ROOT / "scripts" / "make_example_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_committed_table_is_what_the_script_writes(name):
    pytest.importorskip("statsmodels")
    buffer = io.StringIO()
    _script().MAKERS[name]().to_csv(buffer, index=False)
    assert buffer.getvalue() == (TABLES / name / f"{name}.csv").read_text()


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_reads_its_table(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # data.path is relative to the repository root, where the stages run
    params = load_params(TABLES / name / "params.yaml")
    assert params.data.source == "table"
    assert params.data.path == f"examples/tables/{name}/{name}.csv"
    tasks = Tasks(make_tasks(DataSpec.of(params)))
    n_groups, likelihood = RECIPES[name]
    assert tasks.n_groups == n_groups
    assert params.model.likelihood == likelihood
    assert tasks.split("test").X.shape[0] > 0


def test_scores_without_a_run_is_one_error_line(capsys, monkeypatch, tmp_path):
    script = _script()
    monkeypatch.setattr(script, "TABLES", tmp_path)
    monkeypatch.setattr(script, "ROOT", tmp_path)
    assert script.main(["grunfeld", "--scores"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: grunfeld has no finished run") and err.count("\n") == 1
