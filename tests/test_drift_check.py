"""scripts/check_metrics_drift.py, CI's cross-run check: what fails it and what it only prints."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_metrics_drift.py"
_spec = importlib.util.spec_from_file_location("check_metrics_drift", SCRIPT)
drift = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(drift)


def _run(monkeypatch, capsys, diffs: dict) -> tuple[int, str]:
    monkeypatch.setattr(drift, "accuracy_diffs", lambda rev, word="accuracy": diffs if word == "accuracy" else {})
    code = drift.main([])
    return code, capsys.readouterr().out


@pytest.mark.parametrize(("name", "old", "new", "fails"), [
    ("metrics/hier.json:test.accuracy", 0.898889, 0.897778, False),  # one of 900 rows
    ("metrics/hier.json:test.accuracy", 0.898889, 0.887778, True),  # 10 rows: past 0.01
    ("metrics/transfer.json:informed.n4.test.accuracy", 0.72, 0.745, False),  # within the transfer 0.03
    ("metrics/transfer.json:informed.n4.test.accuracy", 0.72, 0.76, True),
    ("metrics/transfer.json:population.n0.test.accuracy", 0.496667, 0.536667, False),  # measured across machines
    ("metrics/flat.json:test.accuracy", 0.83, None, True),  # a metric gone missing fails
])
def test_drift_fails_only_beyond_its_tolerance(monkeypatch, capsys, name, old, new, fails):
    code, out = _run(monkeypatch, capsys, {name: {"old": old, "new": new}})
    assert code == int(fails)
    assert name in out
    assert ("<-- DRIFT" in out) == fails


def test_population_accuracy_is_printed_as_informational(monkeypatch, capsys):
    code, out = _run(monkeypatch, capsys, {
        "metrics/transfer.json:population.n0.test.accuracy": {"old": 0.2, "new": 0.8},
        "metrics/hier.json:test.accuracy": {"old": 0.9, "new": 0.9},
    })
    assert code == 0
    assert "(informational)" in out
    assert "1 pooled metrics compared, 0 beyond" in out
