"""The failures a stage reports as one line instead of a traceback (see :func:`hbnn.runner.run_stage`)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import NoReturn


class InputError(RuntimeError):
    """An input file is missing, unreadable or not what this stage expects."""


class OutputError(RuntimeError):
    """An output could not be written (disk full, no permission, ...); earlier outputs are unchanged."""


class NonFiniteError(FloatingPointError):
    """A result holds NaN or infinite values and must not be written."""


class SamplingError(RuntimeError):
    """Sampling ended early or produced non-finite draws; nothing may be written from it."""


# why a model's log density can be non-finite where sampling starts (hbnn.kernel's check, nutpie's refusal)
DENSITY_OVERFLOW = "the model's settings or data overflow it (model.prior_sd, model.noise_sd, the data's scale)"


def rows_text(idx, limit: int = 5) -> str:
    """Human row numbers (1 = first data row of the file) of some offending rows, for messages."""
    shown = ", ".join(str(int(i) + 1) for i in idx[:limit])
    return shown + (f" (and {len(idx) - limit} more)" if len(idx) > limit else "")


def plural(noun: str, n: int) -> str:
    """``noun`` for one, ``nouns`` for any other count."""
    return noun if n == 1 else f"{noun}s"


def rows_phrase(idx, limit: int = 5) -> str:
    """``row 4`` or ``rows 4, 9``: :func:`rows_text` after the noun it takes."""
    return f"{plural('row', len(idx))} {rows_text(idx, limit)}"


def counted(n: int, noun: str) -> str:
    """``1 missing value``, ``3 missing values``."""
    return f"{n} {plural(noun, n)}"


EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # as a shell reports a process ended by SIGINT


_received: list[int] = []  # signals received while interrupts_reported() is active
_reported: list[bool] = []  # whether a block has said so already (the blocks nest: stage script, run_stage)


def interrupt_received() -> bool:
    """Whether SIGINT or SIGTERM arrived, even if the ``KeyboardInterrupt`` it raised was swallowed.

    Python ignores exceptions raised inside ctypes and weakref callbacks (numba's
    compiler runs such callbacks), so a Ctrl-C landing there is lost as an
    exception; :meth:`hbnn.io.Outputs.commit` asks this before renaming anything.
    """
    return bool(_received)


def _raise_interrupt(signum, frame):
    _received.append(signum)
    raise KeyboardInterrupt


def one_line(err: BaseException) -> str:
    """An exception's message on one line (library messages may span several)."""
    return " ".join(str(err).split())


def exit_stage(code: int) -> NoReturn:
    """End a stage's process with ``code`` now, inside :func:`interrupts_reported`'s block.

    By then the stage has written and closed its outputs; what is left is the
    interpreter's teardown of its modules and objects, ~0.7 s of a 2-core
    machine per stage process, for nothing. The exit handlers still run
    (logging's flush, ``weakref.finalize``), and the standard streams are
    flushed. An interrupt that arrived meanwhile still ends the run with 130.
    Under a profiler, tracer or debugger (``python -m cProfile``, coverage) the
    process ends as usual, so they can write what they gathered.
    """
    if _received:
        raise KeyboardInterrupt
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def interrupts_reported() -> Iterator[None]:
    """Within the block, Ctrl-C or SIGTERM exits with ``interrupted: outputs unchanged`` and status 130.

    Stage scripts import their body inside it, so an interrupt while the
    libraries load ends the same way as one while sampling: no traceback. An
    interrupt whose exception a library swallowed still ends the run the same
    way (:func:`interrupt_received`), and so does any error raised after a
    signal arrived (an interrupt inside a C extension's import surfaces as one).
    """
    if signal.getsignal(signal.SIGINT) is not _raise_interrupt:  # outermost block: forget earlier runs' signals
        _received.clear()
        _reported.clear()
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _quiet_about_interrupts(previous_hook)
    try:
        yield
        if _received:
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        _report_interrupt()
    except Exception:
        # An interrupt inside a C extension's initialisation surfaces as another error (matplotlib's
        # ft2font: "ImportError: initialization failed"); after a signal, that error is the interrupt.
        if not _received:
            raise
        _report_interrupt()
    finally:
        sys.unraisablehook = previous_hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _report_interrupt() -> NoReturn:
    """Say ``interrupted: outputs unchanged`` once, however many blocks the interrupt passes, and exit 130."""
    if not _reported:
        print("interrupted: outputs unchanged", file=sys.stderr)
        _reported.append(True)
    sys.exit(EXIT_INTERRUPTED)


def _quiet_about_interrupts(hook):
    """``sys.unraisablehook`` that leaves out an interrupt Python swallowed in a callback (a weakref's, a
    ctypes one): it is counted (:func:`interrupt_received`) and reported once as the run ends, without the
    "Exception ignored in ..." traceback Python would print."""

    def quiet(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received:
            return
        hook(unraisable)

    return quiet


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one ``error:`` line (status 2) instead of usage text."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"error: {self.prog}: {message} (see {self.prog} --help)\n")
