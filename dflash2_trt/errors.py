"""Error types. Every user-facing failure is a :class:`DFlash2Error` whose message names the
file and the field or tensor at fault; the CLI prints it and exits non-zero without a traceback.
"""

from __future__ import annotations

import signal
from pathlib import Path


class DFlash2Error(Exception):
    """Base class for errors reported to the user (CLI exit code 1, no traceback)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so every ``except KeyboardInterrupt`` /
    ``BaseException`` clean-up (temporary output directories, child processes) runs the same way; the
    CLI then exits 143 (128 + SIGTERM) with one line."""


_stop_pending: list[int] = []


def stop_requested(signum: int) -> KeyboardInterrupt:
    """Record that SIGTERM / SIGINT arrived and return the exception a handler raises for it.

    An exception raised by a signal handler is lost when the signal lands while Python runs a destructor or a
    weakref callback ("Exception ignored in ..."): the run would go on and succeed. The record survives that:
    :func:`raise_if_stop_requested` (before an output is renamed into place, and when a command returns)
    raises it again."""
    if signum not in _stop_pending:
        _stop_pending.append(signum)
    return Terminated(f"signal {signum}") if signum == signal.SIGTERM else KeyboardInterrupt()


committed_outputs: list = []
"""Outputs renamed into place in this process, in order (checkpoint/writer.py appends its directories, bench/io.py
its files; the CLI clears the list per command and names them when a stop ends a command after one was complete, so
that its "removed" line is not wrong about them)."""


def raise_stop(signum: int, frame=None) -> None:
    """A SIGTERM / SIGINT handler: record the stop and raise its exception (:func:`stop_requested`)."""
    raise stop_requested(signum)


def raise_if_stop_requested() -> None:
    if _stop_pending:
        raise stop_requested(_stop_pending[0])


def pending_stop() -> int | None:
    """The first recorded stop signal of this command, or None."""
    return _stop_pending[0] if _stop_pending else None


def clear_stop_requests() -> None:
    _stop_pending.clear()


def _where(source: str | Path | None, field: str | None) -> str:
    parts = []
    if source is not None:
        parts.append(str(source))
    if field is not None:
        parts.append(field)
    return ": ".join(parts)


class ConfigError(DFlash2Error):
    """A config value is missing, unknown, out of range or contradicts another value."""

    def __init__(self, message: str, *, source: str | Path | None = None, field: str | None = None):
        self.source = source
        self.field = field
        self.reason = message     # without the source and field: for a caller that says it again elsewhere
        where = _where(source, field)
        super().__init__(f"{where}: {message}" if where else message)


class CheckpointError(DFlash2Error):
    """A checkpoint file is missing, truncated, corrupt, or holds an unexpected/bad tensor."""

    def __init__(self, message: str, *, file: str | Path | None = None, tensor: str | None = None):
        self.file = file
        self.tensor = tensor
        where = _where(file, f"tensor '{tensor}'" if tensor else None)
        super().__init__(f"{where}: {message}" if where else message)


class PairingError(DFlash2Error):
    """A drafter and a target do not fit together (vocab, widths, layer ids, dtype)."""


class NumericsError(DFlash2Error):
    """A model produced NaN/Inf at run time (logits, hidden states) from weights that passed the checks."""


class MissingDependencyError(DFlash2Error):
    """An optional dependency (TensorRT, TensorRT-LLM, CUDA) is not installed."""
