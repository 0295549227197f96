"""The failures a stage reports as one line instead of a traceback (see :func:`hbnn.runner.run_stage`)."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator


class InputError(RuntimeError):
    """An input file is missing, unreadable or not what this stage expects."""


class OutputError(RuntimeError):
    """An output could not be written (disk full, no permission, ...); earlier outputs are unchanged."""


class NonFiniteError(FloatingPointError):
    """A result holds NaN or infinite values and must not be written."""


class SamplingError(RuntimeError):
    """Sampling ended early or produced non-finite draws; nothing may be written from it."""


def rows_text(idx, limit: int = 5) -> str:
    """Human row numbers (1 = first data row of the file) of some offending rows, for messages."""
    shown = ", ".join(str(int(i) + 1) for i in idx[:limit])
    return shown + (f" (and {len(idx) - limit} more)" if len(idx) > limit else "")


EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # as a shell reports a process ended by SIGINT


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_reported() -> Iterator[None]:
    """Within the block, Ctrl-C or SIGTERM exits with ``interrupted: outputs unchanged`` and status 130.

    Stage scripts import their body inside it, so an interrupt while the
    libraries load ends the same way as one while sampling: no traceback.
    """
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    except KeyboardInterrupt:
        print("interrupted: outputs unchanged", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
