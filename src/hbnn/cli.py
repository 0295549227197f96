"""The DVC stage runner shared by the scripts in ``stages/`` (the ``hbnn`` console script is in ``console``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from hbnn.config import ConfigError, Params, load_params
from hbnn.io import InputError


def run_stage(
    description: str,
    paths: Sequence[str],
    body: Callable[..., object],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse ``--params`` and the stage's path options, then run ``body(params, **paths)``.

    Bad parameters or inputs print one ``error:`` line and return 2 before any
    sampling starts; outputs are only written (atomically) by a successful body.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="parameter file")
    for name in paths:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        params: Params = load_params(args.params)
        body(params, **{name: getattr(args, name) for name in paths})
    except (ConfigError, InputError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except FloatingPointError as err:  # a fit that failed numerically (e.g. ADVI's loss became NaN)
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0

