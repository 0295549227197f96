"""Logging for the stages and the ``hbnn`` command: hbnn's own lines at INFO, libraries' at WARNING.

``HBNN_LOG=debug`` adds detail (each fit's seed, the compile cache's decisions);
``HBNN_LOG=warning`` keeps only warnings and errors. Lines go to standard error.
:func:`heartbeat` keeps a long, otherwise silent step (a sampler that reports
nothing until it returns) from looking hung in a piped log; on a terminal
(:func:`interactive`) the samplers' own progress bars do that instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def configure() -> None:
    """Third-party libraries at WARNING; ``hbnn`` at ``HBNN_LOG`` (default ``info``; unknown values too)."""
    logging.basicConfig(level=logging.WARNING, format=FORMAT)
    # pip-installed PyTensor has no BLAS for its C backend (ADVI's compiled step uses it); for networks this small
    # it makes no measurable difference, and a user cannot act on it short of reinstalling with conda.
    warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS installation", category=UserWarning)
    # ArviZ's notice of its coming refactor, once a day at import: about ArviZ's API, nothing a run's user acts on.
    warnings.filterwarnings("ignore", message=r"\s*ArviZ is undergoing a major refactor", category=FutureWarning)
    level = LEVELS.get(os.environ.get("HBNN_LOG", "info").strip().lower(), logging.INFO)
    logging.getLogger("hbnn").setLevel(level)
    from hbnn.homes import moved

    if moved():
        logging.getLogger("hbnn.homes").warning("%s cannot be written; this run keeps them in a temporary folder, so "
                                                "compiled code is not reused between runs", "; ".join(moved()))


def interactive() -> bool:
    """Standard error is a terminal: the samplers draw their own progress bars there, and no heartbeat
    lines are logged; in a log (``dvc repro`` piped, CI, queued experiments) it is the other way round."""
    return sys.stderr.isatty()


def watch(logger: logging.Logger, what: str, status: Callable[[float], str] | None = None):
    """:func:`heartbeat` in a log, nothing on a terminal (:func:`interactive`), where the samplers' bars show.

    Parameters
    ----------
    logger : logging.Logger
    what : str
        What is running, the lines' prefix.
    status : callable, optional
        Given the seconds elapsed, what is known of the progress.

    Returns
    -------
    contextlib.AbstractContextManager
    """
    return contextlib.nullcontext() if interactive() else heartbeat(logger, what, status=status)


@contextmanager
def heartbeat(logger: logging.Logger, what: str, every: float = 10.0,
              status: Callable[[float], str | None] | None = None) -> Iterator[None]:
    """Log ``<what>: still running, <s>s elapsed[; <status(s)>]`` every ``every`` seconds until the block ends.

    A daemon thread does the logging, so it also speaks while the main thread waits in compiled code; a block shorter
    than ``every`` logs nothing.

    Parameters
    ----------
    logger : logging.Logger
    what : str
        What is running, the lines' prefix.
    every : float, optional
        Seconds between lines.
    status : callable, optional
        Given the seconds elapsed, what is known of the progress (``None``: nothing to add).

    Yields
    ------
    None
    """
    stop = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not stop.wait(every):
            elapsed = time.monotonic() - start
            text = status(elapsed) if status is not None else None
            extra = f"; {text}" if text else ""
            logger.info("%s: still running, %.0fs elapsed%s", what, elapsed, extra)

    thread = threading.Thread(target=beat, name="hbnn-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
