"""Running CMake and trtllm-build: :class:`SubprocessRunner` (the machine seam the tests replace: ``runner(argv,
env=..., log=..., cwd=..., echo=...) -> exit status``), :class:`EngineBuildError` for a failed or odd step
(:class:`BaselineBuildError`: the ``--baseline`` build's, after the combined engine is in place), and
:func:`exit_description` / :func:`log_tail` for how a step ended and the end of its log in an error message."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
from pathlib import Path

from ...children import die_with_parent, stop
from ...errors import DFlash2Error, raise_if_stop_requested

LOG_TAIL = 3000


class EngineBuildError(DFlash2Error):
    """trtllm-build (or CMake) failed, or wrote something unexpected."""


class BaselineBuildError(EngineBuildError):
    """``build --baseline``: the baseline's trtllm-build failed after the combined engine was built and committed.
    ``result`` is the combined engine's :class:`~dflash2_trt.engine.format.BuildResult` (in place, usable, with no
    ``baseline/``); the command still fails."""

    def __init__(self, message: str, result):
        super().__init__(message)
        self.result = result


class SubprocessRunner:
    """Run a command, its output (stdout and stderr) appended line by line to ``log`` and, when given, to
    ``echo`` (progress). Ctrl-C / SIGTERM: the child is interrupted, waited for (then killed), and the
    interrupt re-raised, so the caller's cleanup runs with no child still writing. If this process is killed
    outright (SIGKILL), the child gets SIGTERM from the kernel (:func:`~dflash2_trt.children.die_with_parent`)."""

    #: how often the output wait looks at the stop's record (trtllm-build can print nothing for minutes)
    POLL_S = 0.5

    def __call__(self, argv, *, env=None, log=None, cwd=None, echo=None) -> int:
        raise_if_stop_requested()
        full_env = {**os.environ, **(env or {})}
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
                                    bufsize=0, start_new_session=True, preexec_fn=die_with_parent())
        except OSError as exc:
            raise EngineBuildError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        fh = open(log, "a", encoding="utf-8") if log is not None else None

        def emit(line: bytes) -> None:
            text = line.rstrip(b"\r\n").decode("utf-8", errors="replace")
            if fh is not None:
                fh.write(text + "\n")
                fh.flush()
            if echo is not None:
                echo(text)

        try:
            # The child is in a session of its own (the terminal's Ctrl-C does not reach it), so a stop whose
            # exception Python lost is looked for here, between reads, or trtllm-build would run to its end.
            # (selectors, not select.select: that refuses a descriptor >= 1024, which a busy process can get)
            fd, pending = proc.stdout.fileno(), bytearray()
            with selectors.DefaultSelector() as sel:
                sel.register(fd, selectors.EVENT_READ)
                while True:
                    raise_if_stop_requested()
                    if not sel.select(self.POLL_S):
                        continue
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break
                    pending += chunk
                    if b"\n" not in chunk and b"\r" not in chunk:
                        continue   # no line ends yet: a long line is split once, not at every read
                    # lines end in \n, \r\n or \r (progress bars); the last waits for more unless it ends in \n
                    lines = bytes(pending).splitlines(keepends=True)
                    pending = bytearray(lines.pop() if not lines[-1].endswith(b"\n") else b"")
                    for line in lines:
                        emit(line)
            if pending:
                emit(bytes(pending))
            return proc.wait()
        except BaseException:
            stop(proc, ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 10)), group=True)
            raise
        finally:
            if fh is not None:
                fh.close()


def exit_description(rc: int) -> str:
    """How a step ended, for an error line: ``exit 3``, or for a child killed by a signal (a negative status from
    :class:`subprocess.Popen`) the signal by name, with the usual sender of SIGKILL to a long build."""
    if rc >= 0:
        return f"exit {rc}"
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = f"signal {-rc}"
    why = ("; the kernel's out-of-memory killer sends it when host memory runs out: see `dmesg`"
           if -rc == signal.SIGKILL else "")
    return f"killed by {name}{why}"


def log_tail(path) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""
    return text if len(text) <= LOG_TAIL else "..." + text[-LOG_TAIL:]
