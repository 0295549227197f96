"""scripts/machine_signature.py: the line .ci/run compares with the machine that made the committed outputs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_line_names_the_cpu_and_hashes_what_decides_the_bits():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "machine_signature.py")], check=True,
                         capture_output=True, text=True).stdout
    assert re.fullmatch(r"\S+ [0-9a-f]{12}\n", out), out
    again = subprocess.run([sys.executable, str(ROOT / "scripts" / "machine_signature.py")], check=True,
                           capture_output=True, text=True).stdout
    assert again == out


def test_the_committed_outputs_record_the_machine_they_were_made_on():
    assert re.fullmatch(r"\S+ [0-9a-f]{12}\n", (ROOT / ".ci" / "outputs-machine").read_text())
