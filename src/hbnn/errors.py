"""The failures a stage reports as one line instead of a traceback (see :func:`hbnn.pipeline.runner.run_stage`)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

from hbnn.homes import use_writable_homes


class InputError(ValueError):
    """Bad input, named in one line: a file that is missing, unreadable or not what a stage expects, a table's bad
    column or value, a bad setting of the Python API (:mod:`hbnn.api`). A ``ValueError``, as scikit-learn and NumPy
    raise for bad values."""


class OutputError(RuntimeError):
    """An output could not be written (disk full, no permission, ...); earlier outputs are unchanged."""


class NonFiniteError(FloatingPointError):
    """A result holds NaN or infinite values and must not be written."""


class SamplingError(RuntimeError):
    """Sampling ended early or produced non-finite draws; nothing may be written from it."""


class ChangedMeanwhile(RuntimeError):
    """An input the stage read (``params.yaml``) changed while it ran: its outputs would not match what DVC
    records for them, so none are written."""


# why a model's log density can be non-finite where sampling starts (hbnn.density.kernel's check, nutpie's refusal)
DENSITY_OVERFLOW = "the model's settings or data overflow it (model.prior_sd, model.noise_sd, the data's scale)"


def rows_text(idx, limit: int = 5) -> str:
    """Human row numbers (1 = first data row of the file) of some offending rows, for messages.

    Parameters
    ----------
    idx : sequence of int
        0-based row positions.
    limit : int, optional
        How many to show; the rest are counted.

    Returns
    -------
    str
    """
    shown = ", ".join(str(int(i) + 1) for i in idx[:limit])
    return shown + (f" (and {len(idx) - limit} more)" if len(idx) > limit else "")


def plural(noun: str, n: int) -> str:
    """``noun`` for one, ``nouns`` for any other count.

    Parameters
    ----------
    noun : str
    n : int

    Returns
    -------
    str
    """
    return noun if n == 1 else f"{noun}s"


def rows_phrase(idx, limit: int = 5) -> str:
    """``row 4`` or ``rows 4, 9``: :func:`rows_text` after the noun it takes.

    Parameters
    ----------
    idx : sequence of int
        0-based row positions.
    limit : int, optional
        How many to show.

    Returns
    -------
    str
    """
    return f"{plural('row', len(idx))} {rows_text(idx, limit)}"


def counted(n: int, noun: str) -> str:
    """``1 missing value``, ``3 missing values``.

    Parameters
    ----------
    n : int
    noun : str

    Returns
    -------
    str
    """
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
    exception; :meth:`hbnn.files.outputs.Outputs.commit` asks this before renaming anything.
    """
    return bool(_received)


_COMMIT_CHECKS: list[Callable[[], None]] = []


@contextlib.contextmanager
def checked_before_commit(check: Callable[[], None]) -> Iterator[None]:
    """Within the block, :meth:`hbnn.files.outputs.Outputs.commit` first calls ``check`` (:func:`run_commit_checks`).

    The stage runner uses it to check that ``params.yaml`` did not change while the stage ran.

    Parameters
    ----------
    check : callable
        Takes no arguments; raises to refuse the outputs.

    Yields
    ------
    None
    """
    _COMMIT_CHECKS.append(check)
    try:
        yield
    finally:
        _COMMIT_CHECKS.remove(check)


def run_commit_checks() -> None:
    """Call every check :func:`checked_before_commit` holds; the first to refuse raises."""
    for check in list(_COMMIT_CHECKS):
        check()


_committing = threading.Lock()  # held while a stage's outputs are renamed into place (commit_section)
_state = {"deferred": False, "committed": False, "active": False, "exit_now": False}
# After Ctrl-C or SIGTERM, how long the main thread has to stop by itself: Python runs signal handlers only between
# bytecodes, so one long call into compiled code (a compile, an allocation of GiBs) would otherwise hold the
# interrupt back until it returns.
GRACE_SECONDS = 10.0


def _raise_interrupt(signum, frame):
    _received.append(signum)
    if _state["deferred"]:  # outputs are being renamed into place: commit_section raises once they all are
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def commit_section() -> Iterator[None]:
    """The block that renames a stage's outputs into place: an interrupt waits until it ends (then raises, and the
    run reports its outputs written), so a stage's outputs are replaced all or none. SIGINT and SIGTERM are also
    blocked in this thread, and the interrupt watchdog (:func:`interrupts_reported`) waits for the block."""
    with _committing:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        _state["deferred"] = True
        try:
            yield
            _state["committed"] = True
        finally:
            _state["deferred"] = False
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    if _received:
        raise KeyboardInterrupt


def one_line(err: BaseException) -> str:
    """An exception's message on one line (library messages may span several).

    Parameters
    ----------
    err : BaseException

    Returns
    -------
    str
    """
    return " ".join(str(err).split())


def unexpected(err: Exception) -> int:
    """Report an error no check of hbnn's foresaw as one ``error:`` line.

    The line gives its type and message (a defect in hbnn or a library, worth reporting); with ``HBNN_TRACEBACK=1``
    the traceback follows.

    Parameters
    ----------
    err : Exception

    Returns
    -------
    int
        :data:`EXIT_FAILED`.
    """
    import traceback

    print(f"error: unexpected {type(err).__name__}: {one_line(err)} (set HBNN_TRACEBACK=1 to see where; outputs "
          "unchanged)", file=sys.stderr)
    if os.environ.get("HBNN_TRACEBACK"):
        traceback.print_exception(err, file=sys.stderr)
    return EXIT_FAILED


def exit_stage(code: int) -> NoReturn:
    """End a stage's process with ``code`` now, inside :func:`interrupts_reported`'s block.

    By then the stage has written and closed its outputs; what is left is the interpreter's teardown of its modules and
    objects, a cost every stage process would pay for nothing (benchmarks/FINDINGS.md). The exit handlers still run
    (logging's flush, ``weakref.finalize``), and the standard streams are flushed. An interrupt that arrived meanwhile
    still ends the run with 130. Under a profiler, tracer or debugger (``python -m cProfile``, coverage) the process
    ends as usual, so they can write what they gathered.

    Parameters
    ----------
    code : int
        The exit status.

    Raises
    ------
    KeyboardInterrupt
        If an interrupt arrived meanwhile (the block reports it).
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
def interrupts_reported(exit_now: bool = False) -> Iterator[None]:
    """Within the block, Ctrl-C or SIGTERM exits with ``interrupted: outputs unchanged`` and status 130.

    Stage scripts import their body inside it, so an interrupt while the libraries load ends the same way as one while
    sampling: no traceback. The outermost block first moves the library folders under an unusable home directory
    (:func:`hbnn.homes.use_writable_homes`), before any library loads. An interrupt whose exception a library swallowed
    still ends the run the same way (:func:`interrupt_received`), and so does any error raised after a signal arrived
    (an interrupt inside a C extension's import surfaces as one).

    Parameters
    ----------
    exit_now : bool, optional
        For a stage script's process: it then ends at once, giving exit handlers at most :data:`GRACE_SECONDS`,
        instead of Python's teardown, which waits for every thread a library left running (a Dask cluster's can keep a
        stage alive for minutes after the message).

    Yields
    ------
    None
    """
    outermost = signal.getsignal(signal.SIGINT) is not _raise_interrupt
    if outermost:  # a stage's or a command's first step: its libraries load inside the block
        use_writable_homes()
        _state["exit_now"] = exit_now
        _received.clear()  # forget earlier runs' signals
        _reported.clear()
        _state.update(committed=False, active=True)
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _quiet_about_interrupts(previous_hook)
    watchdog = _start_watchdog() if outermost else None
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
        if outermost:
            _state["active"] = False
        if watchdog is not None:
            _stop_watchdog(*watchdog)
        sys.unraisablehook = previous_hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_REPORTING = threading.Lock()  # the main thread and the watchdog say it once between them


def _interrupt_message() -> str:
    if _state["committed"]:  # the interrupt came after the outputs were renamed into place
        return "interrupted after the outputs were written; DVC did not record them: run dvc repro again"
    return "interrupted: outputs unchanged"


def _report_interrupt() -> NoReturn:
    """Say ``interrupted: outputs unchanged`` once, however many blocks the interrupt passes, and exit 130 (at once,
    for a block opened with ``exit_now``)."""
    with _REPORTING:
        if not _reported:
            print(_interrupt_message(), file=sys.stderr)
            _reported.append(True)
    if _state.get("exit_now"):
        _exit_within(GRACE_SECONDS, EXIT_INTERRUPTED)
    sys.exit(EXIT_INTERRUPTED)


def _exit_within(seconds: float, code: int) -> NoReturn:
    """End the process with ``code`` after its exit handlers, or after ``seconds`` if they take longer."""
    done = threading.Event()

    def handlers() -> None:
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()
        done.set()

    threading.Thread(target=handlers, name="hbnn-exit-handlers", daemon=True).start()
    done.wait(seconds)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _start_watchdog() -> tuple[int, int, int, threading.Thread, threading.Event] | None:
    """A thread that ends the process :data:`GRACE_SECONDS` after Ctrl-C or SIGTERM if the main thread has not by
    then: the signal's number reaches it through ``signal.set_wakeup_fd``, written by Python's C-level handler the
    moment the signal arrives, whatever the main thread is doing. It never ends the process while outputs are being
    renamed into place (:func:`commit_section`): temporaries left behind are removed when those outputs are next
    written (:mod:`hbnn.files.io`). ``None`` where a wakeup descriptor cannot be set (not the main thread)."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        before = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:
        os.close(read)
        os.close(write)
        return None
    ended = threading.Event()  # set when the block ends: its watchdog then never ends a later block's process
    thread = threading.Thread(target=_watch, args=(read, ended), name="hbnn-interrupt-watchdog", daemon=True)
    thread.start()
    return read, write, before, thread, ended


def _watch(read: int, ended: threading.Event) -> None:
    while True:
        try:
            got = os.read(read, 64)
        except OSError:
            return
        if not got:  # the block ended (_stop_watchdog closed the pipe)
            return
        if not {signal.SIGINT, signal.SIGTERM} & set(got):
            continue
        if ended.wait(GRACE_SECONDS):  # the main thread stopped by itself meanwhile
            return
        with _committing:
            if not _state["active"] or ended.is_set():  # ... just now, or a later block is running
                return
            with _REPORTING:
                if not _reported:
                    print(_interrupt_message(), file=sys.stderr, flush=True)
                    _reported.append(True)
            os._exit(EXIT_INTERRUPTED)


def _stop_watchdog(read: int, write: int, before: int, thread: threading.Thread, ended: threading.Event) -> None:
    ended.set()
    signal.set_wakeup_fd(before)
    os.close(write)  # the watchdog reads the end of the pipe and returns
    if not _received:
        thread.join(timeout=1.0)
    with contextlib.suppress(OSError):
        os.close(read)


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
        """Exit with status 2 and one ``error:`` line instead of usage text.

        Parameters
        ----------
        message : str
            argparse's message.
        """
        self.exit(EXIT_BAD_INPUT, f"error: {self.prog}: {message} (see {self.prog} --help)\n")
