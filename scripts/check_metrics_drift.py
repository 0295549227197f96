"""Fail if any accuracy in the workspace metrics drifts from the committed ones.

Usage: ``python scripts/check_metrics_drift.py [--rev HEAD] [--tolerance 0.01]``.
Compares every metric whose name contains ``accuracy`` in every metrics file
declared in ``dvc.yaml`` (via ``dvc metrics diff --json``; new or missing values
count as drift) and prints a table of what it compared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def accuracy_diffs(rev: str) -> dict[str, dict]:
    out = subprocess.run(
        ["dvc", "metrics", "diff", rev, "--json", "--all"], check=True, capture_output=True, text=True
    ).stdout
    diffs = json.loads(out or "{}")
    return {
        f"{path}:{key}": change
        for path, metrics in diffs.items()
        for key, change in metrics.items()
        if "accuracy" in key
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--tolerance", type=float, default=0.01)
    args = parser.parse_args(argv)
    diffs = accuracy_diffs(args.rev)
    if not diffs:
        print("error: no accuracy metrics found to compare", file=sys.stderr)
        return 1
    bad = []
    print(f"{'metric':70s} {'committed':>10s} {'reproduced':>10s} {'diff':>8s}")
    for name, change in sorted(diffs.items()):
        old, new = change.get("old"), change.get("new")
        drift = None if old is None or new is None else abs(new - old)
        flag = "" if drift is not None and drift <= args.tolerance else "  <-- DRIFT"
        print(f"{name:70s} {old!s:>10s} {new!s:>10s} {drift if drift is not None else 'n/a'!s:>8s}{flag}")
        if flag:
            bad.append(name)
    print(f"{len(diffs)} accuracy metrics compared, {len(bad)} beyond tolerance {args.tolerance}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
