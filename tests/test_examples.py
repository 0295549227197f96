"""The worked examples in ``examples/`` run, at their smoke-run settings (CI: ``make test-slow``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(1500)  # cold compile caches: every network and data shape is compiled once
def test_the_anes96_example_runs(tmp_path):
    script = ROOT / "examples" / "anes96_vote.py"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path)], capture_output=True,
                          text=True, cwd=ROOT, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for line in ("Test rows", "logistic regression + education", "az.compare", "GroupKFold"):
        assert line in out, out
    assert (tmp_path / "anes96_group.png").stat().st_size > 10_000
