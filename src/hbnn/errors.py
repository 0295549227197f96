"""The failures a stage reports as one line instead of a traceback (see :func:`hbnn.runner.run_stage`)."""

from __future__ import annotations


class InputError(RuntimeError):
    """An input file is missing, unreadable or not what this stage expects."""


class OutputError(RuntimeError):
    """An output could not be written (disk full, no permission, ...); earlier outputs are unchanged."""


class NonFiniteError(FloatingPointError):
    """A result holds NaN or infinite values and must not be written."""


class SamplingError(RuntimeError):
    """Sampling ended early or produced non-finite draws; nothing may be written from it."""
