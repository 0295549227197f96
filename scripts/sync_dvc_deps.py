"""Rewrite each stage's code deps in dvc.yaml to exactly the modules its script imports (tests check this)."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_dvc_yaml import import_closure  # noqa: E402

if __name__ == "__main__":
    path = ROOT / "dvc.yaml"
    lines = path.read_text().splitlines(keepends=True)
    out, stage, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        header = re.match(r"^  (\w+):\s*$", line)
        if header and (ROOT / "stages" / f"{header.group(1)}.py").exists():
            stage = header.group(1)
        out.append(line)
        i += 1
        if stage and line.strip() == "deps:":
            while i < len(lines) and re.match(r"^      - (stages|src)/", lines[i]):
                i += 1
            code = sorted(import_closure(ROOT / "stages" / f"{stage}.py"))
            out += [f"      - stages/{stage}.py\n"] + [f"      - {m}\n" for m in code]
            stage = None
    path.write_text("".join(out))
    print(f"wrote {path}")
