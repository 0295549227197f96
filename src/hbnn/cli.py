"""The ``hbnn`` command line (also ``python -m hbnn``).

Kept apart from :mod:`hbnn.pipeline.runner`, which every stage imports, so that editing
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
    unexpected,
)
from hbnn.homes import use_writable_homes


def main(argv: Sequence[str] | None = None) -> int:
    """The ``hbnn`` console script (also ``python -m hbnn``): ``predict``, ``summarise`` and ``headline``.

    Bad inputs print one ``error:`` line and return before anything is scored; no error prints a traceback.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after ``hbnn`` (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status: 0 on success, :data:`hbnn.errors.EXIT_BAD_INPUT` (2) for bad input,
        :data:`hbnn.errors.EXIT_FAILED` (1) where an output cannot be written or anything else fails, 130 on
        an interrupt.
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
        "upper_94 and unseen_group as CSV or Parquet (by --output's suffix).",
    )
    p.add_argument("--trace", type=Path, required=True, help="trace file, e.g. traces/hier.nc")
    p.add_argument("--input", type=Path, required=True, help="rows to score (.csv or .parquet)")
    p.add_argument("--output", type=Path, required=True,
                   help="scored rows: .csv, or .parquet/.pq for Parquet; - for standard output")
    p.add_argument("--seed", type=int, default=0, help="seed of the new-group weight draws (default 0)")
    s = commands.add_parser(
        "summarise",
        help="mean and sd of every metric across DVC experiments (replicates)",
        description="Read `dvc exp show --json` and print, per metric, the mean, sd, min and max over every commit "
        "and finished experiment it lists (the workspace, queued, running and failed experiments are left out), "
        "and the params in which they differ. Example: dvc exp show --json | hbnn summarise",
    )
    s.add_argument("input", nargs="?", type=Path, default=Path("-"),
                   help="the JSON of `dvc exp show --json` (default -: standard input)")
    s.add_argument("--metrics", nargs="+", default=None, metavar="GLOB",
                   help="metrics to summarise, as globs on file:key (default 'metrics/*'; e.g. "
                        "'metrics/transfer.json:*' or '*test.accuracy')")
    s.add_argument("--names", nargs="+", default=None, metavar="GLOB",
                   help="only the experiments (or commits) whose name matches, e.g. 'seed-*'")
    s.add_argument("--workspace", action="store_true", help="count the workspace as a replicate too")
    s.add_argument("--csv", action="store_true", help="CSV instead of a Markdown table")
    h = commands.add_parser(
        "headline",
        help="the headline numbers of DVC experiments, one row each, in a terminal's width",
        description="Read `dvc exp show --json` and print one row per commit and finished experiment (and the "
        "workspace): per model (flat, hier, informed) the test score, log loss (or lpd), LOO elpd and groups not "
        "converged (nc), and the params in which the rows differ. "
        "Example: dvc exp show --json | hbnn headline",
    )
    h.add_argument("input", nargs="?", type=Path, default=Path("-"),
                   help="the JSON of `dvc exp show --json` (default -: standard input)")
    h.add_argument("--names", nargs="+", default=None, metavar="GLOB",
                   help="only the experiments (or commits) whose name matches, e.g. 'seed-*'")
    h.add_argument("--csv", action="store_true", help="CSV instead of a text table")
    args = parser.parse_args(argv)
    if args.command in ("summarise", "headline"):
        return _summarise(args)
    use_writable_homes()  # before logs.configure, which says what it moved
    # Logs go to standard error, so `--output -` leaves standard output to the CSV.
    logs.configure()
    try:
        with interrupts_reported():
            from hbnn.pipeline.predict import predict

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
    except Exception as err:  # noqa: BLE001 - never a traceback: one line, and how to see the rest
        return unexpected(err)
    return 0


# `dvc exp show --json` of thousands of experiments is a few MiB; an input past this is not one (an endless
# /dev/zero, a trace piped in by mistake) and is refused before it fills the memory
MAX_INPUT_BYTES = 256 * 2**20


def _read_limited(path: Path, where: str) -> str:
    """The text of ``path`` (``-``: standard input), at most :data:`MAX_INPUT_BYTES`; :class:`InputError` past it."""
    if str(path) == "-":
        stream = getattr(sys.stdin, "buffer", None)  # a text stream without one (a test's, an embedding's) as text
        data = stream.read(MAX_INPUT_BYTES + 1) if stream else sys.stdin.read(MAX_INPUT_BYTES + 1).encode()
    else:
        with open(path, "rb") as fh:
            data = fh.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(f"{where} holds more than {MAX_INPUT_BYTES // 2**20} MiB; the output of `dvc exp show "
                         "--json` is far smaller: pipe that in")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{where} is not UTF-8 text ({err}); pipe `dvc exp show --json` into it") from err


def _summarise(args) -> int:
    """``hbnn summarise`` and ``hbnn headline``: one ``error:`` line and exit 2 on input that is not
    ``dvc exp show --json``."""
    import json

    from hbnn.pipeline import summarise

    try:
        with interrupts_reported():
            where = "standard input" if str(args.input) == "-" else str(args.input)
            try:
                text = _read_limited(args.input, where)
                data = json.loads(text)
            except OSError as err:
                raise InputError(f"cannot read {where}: {err.strerror or err}") from err
            except ValueError as err:
                raise InputError(f"{where} is not JSON ({err}); pipe `dvc exp show --json` into it") from err
            except RecursionError:  # json's decoder recurses once per level of nesting
                raise InputError(f"{where} is not the output of `dvc exp show --json`: it nests more than "
                                 f"{summarise.MAX_DEPTH} levels deep") from None
            headline = args.command == "headline"
            reps, skipped = summarise.replicates(data, workspace=headline or args.workspace)
            if args.names:
                reps = summarise.named(reps, args.names)
            if not reps:
                raise InputError(f"{where} lists no commit or experiment with metrics"
                                 + (f" named {args.names}" if args.names else ""))
            if headline:
                header, rows = summarise.headline(reps)
                sys.stdout.write((summarise.headline_csv if args.csv else summarise.aligned)(header, rows))
                if skipped:
                    print(f"left out (not finished or no metrics): {', '.join(skipped)}", file=sys.stderr)
                return 0
            rows = summarise.summarise(reps, args.metrics or summarise.DEFAULT_METRICS)
            if not rows:
                raise InputError(f"no metric matches {args.metrics or list(summarise.DEFAULT_METRICS)}")
            sys.stdout.write(summarise.csv(rows) if args.csv else summarise.markdown(rows, reps, skipped))
    except SystemExit as stop:
        return stop.code
    except InputError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as err:  # noqa: BLE001 - never a traceback: one line, and how to see the rest
        return unexpected(err)
    return 0
