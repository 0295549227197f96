"""The DVC stage runner shared by the scripts in ``stages/`` (the ``hbnn`` command line is in ``cli``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from hbnn import logs
from hbnn.config import ConfigError, Params
from hbnn.config_read import load_params, unchanged_check
from hbnn.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    ChangedMeanwhile,
    InputError,
    OneLineParser,
    OutputError,
    SamplingError,
    checked_before_commit,
    interrupts_reported,
    one_line,
    unexpected,
)
from hbnn.pipeline.same_run import same_params_as_this_run


def run_stage(
    description: str,
    paths: Sequence[str],
    body: Callable[..., object],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse ``--params`` and the stage's path options, then run ``body(params, **paths)``.

    Bad parameters or inputs print one ``error:`` line and return 2 before any sampling starts; a fit that fails
    numerically, a sampler that stops early or an output that cannot be written print one ``error:`` line and return 1;
    an interrupt (Ctrl-C, SIGTERM) prints ``interrupted: outputs unchanged`` and returns 130
    (:func:`interrupts_reported`). Outputs are only written, together and atomically, by a body that succeeds, so every
    failure leaves the earlier outputs as they were.

    Parameters
    ----------
    description : str
        The command line's help text.
    paths : sequence of str
        The body's path arguments; each is a required option ``--<name>`` (underscores as dashes).
    body : callable
        The stage body, called as ``body(params, **paths)``.
    argv : sequence of str, optional
        The arguments (``None``: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status: 0, 1, 2 or 130.
    """
    parser = OneLineParser(description=description)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="parameter file")
    for name in paths:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=Path, required=True)
    args = parser.parse_args(argv)
    logs.configure()
    skip_dask_array_lookup()
    try:
        with interrupts_reported():
            params: Params = load_params(args.params)
            same_params_as_this_run(params)  # the same values as this dvc run's earlier stages read
            with checked_before_commit(unchanged_check(args.params, params)):
                body(params, **{name: getattr(args, name) for name in paths})
    except SystemExit as stop:
        return stop.code
    except (ConfigError, InputError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # A fit that failed numerically (ADVI's loss became NaN, non-finite draws), stopped early, an output that could
    # not be written (disk full), or params.yaml changed while the stage ran.
    except (FloatingPointError, SamplingError, OutputError, ChangedMeanwhile) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as err:  # noqa: BLE001 - never a traceback: one line, and how to see the rest
        return unexpected(err)
    return 0



def skip_dask_array_lookup() -> None:
    """Tell xarray that no value is a Dask array, so that it imports neither ``dask.array`` nor ``dask`` to check.

    xarray asks of every variable it builds whether it is a Dask array (``array_type("dask")``, in
    ``as_compatible_data``), and imports ``dask.array`` to answer the first time, a cost to every stage process,
    which reads its inputs and builds its outputs with NumPy values only (no stage opens data in chunks; the
    cluster path runs its fits in Dask's workers, not on Dask arrays). Where ``dask.array`` is already imported,
    or this xarray keeps its duck-array modules another way, nothing changes and xarray checks as before.

    It also asks of every variable it decodes from a file whether it is a Dask collection
    (``xarray.namedarray.utils.is_dask_collection``) and imports ``dask`` to answer (a smaller cost). Nothing is
    a Dask collection while ``dask`` has not been imported, so until then the answer is ``False`` without the
    import; once it is imported (the cluster path), xarray's own test answers.

    A process that has not imported xarray by now (``check_params`` on moons) is left alone: importing it here would
    cost more than it saves (the figures: benchmarks/FINDINGS.md).
    """
    if "xarray" not in sys.modules:
        return
    try:
        from xarray.namedarray import utils

        original = utils.is_dask_collection
    except (ImportError, AttributeError):
        pass
    else:
        if not getattr(original, "hbnn_skips_import", False):
            def is_dask_collection(x: object) -> bool:
                return "dask" in sys.modules and original(x)

            is_dask_collection.hbnn_skips_import = True
            utils.is_dask_collection = is_dask_collection
    if "dask.array" in sys.modules:
        return
    try:
        from packaging.version import Version
        from xarray.namedarray import pycompat

        cache = pycompat._cached_duck_array_modules  # noqa: SLF001 - what array_type("dask") reads first
        none = object.__new__(pycompat.DuckArrayModule)
        none.module, none.version, none.type, none.available = None, Version("0.0.0"), (), False
    except (ImportError, AttributeError):
        return
    if isinstance(cache, dict):
        cache.setdefault("dask", none)
