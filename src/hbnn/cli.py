"""The ``hbnn`` command line (also ``python -m hbnn``).

Kept apart from :mod:`hbnn.runner`, which every stage imports, so that editing
prediction code does not make DVC rerun (and resample) every stage.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from hbnn import logs
from hbnn.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    InputError,
    OneLineParser,
    OutputError,
    interrupts_reported,
    one_line,
)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``hbnn`` console script (also ``python -m hbnn``). Subcommand: ``predict``.

    Bad inputs print one ``error:`` line and return 2 before anything is scored.
    """
    parser = OneLineParser(prog="hbnn", description="Hierarchical Bayesian neural networks.")
    parser.add_argument("--version", action="version", version=f"hbnn {metadata.version('hbnn')}")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser(
        "predict",
        help="score new rows with a fitted trace",
        description="Score the rows of a CSV or Parquet file with a fitted trace (flat, hierarchical or informed). "
        "Known groups use their own posterior; unseen groups need a hierarchical trace and use new-group "
        "weights drawn from its group distribution. Writes the input columns plus mean, sd, lower_94, "
        "upper_94 and unseen_group as CSV.",
    )
    p.add_argument("--trace", type=Path, required=True, help="trace file, e.g. traces/hier.nc")
    p.add_argument("--input", type=Path, required=True, help="rows to score (.csv or .parquet)")
    p.add_argument("--output", type=Path, required=True, help="scored rows (.csv); - for standard output")
    p.add_argument("--seed", type=int, default=0, help="seed of the new-group weight draws (default 0)")
    args = parser.parse_args(argv)
    # Logs go to standard error, so `--output -` leaves standard output to the CSV.
    logs.configure()
    try:
        with interrupts_reported():
            from hbnn.predict import predict

            if not 0 <= args.seed < 2**32:
                raise InputError(f"--seed={args.seed} must lie in [0, 2**32 - 1]")
            predict(args.trace, args.input, args.output, args.seed)
    except SystemExit as stop:
        return stop.code
    except InputError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OutputError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    return 0
