"""Fail if a pooled accuracy in the workspace metrics drifts from the committed ones.

Usage: ``python scripts/check_metrics_drift.py [--rev HEAD] [--tolerance 0.01]``.
Compares every metric whose name contains ``accuracy`` in every metrics file
declared in ``dvc.yaml`` (via ``dvc metrics diff --json``) and prints them all.
Pooled accuracies (all groups' rows) fail beyond the tolerance, and so do
new or missing values. Per-group accuracies are printed and counted but do not
fail: with 50 test rows one flipped prediction moves them by 0.02, so a 0.01
bound on them would fail on any last-bit difference in floating point between
CPUs, which is not what the check is for.
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
    bad, group_drift = [], []
    print(f"{'metric':70s} {'committed':>10s} {'reproduced':>10s} {'diff':>8s}")
    for name, change in sorted(diffs.items()):
        old, new = change.get("old"), change.get("new")
        drift = None if old is None or new is None else abs(new - old)
        beyond = drift is None or drift > args.tolerance
        per_group = "per_group." in name
        flag = ("  (per group, informational)" if per_group else "  <-- DRIFT") if beyond else ""
        print(f"{name:70s} {old!s:>10s} {new!s:>10s} {drift if drift is not None else 'n/a'!s:>8s}{flag}")
        if beyond:
            (group_drift if per_group else bad).append(name)
    pooled = sum("per_group." not in n for n in diffs)
    print(f"{pooled} pooled accuracy metrics compared, {len(bad)} beyond tolerance {args.tolerance}; "
          f"{len(diffs) - pooled} per-group accuracies, {len(group_drift)} beyond it (not failing)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
