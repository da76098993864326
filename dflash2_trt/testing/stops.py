"""Stops that Python loses, for the tests of what must still stop after one.

A signal handler's exception raised while a destructor or a weakref callback runs is printed as "Exception ignored
in ..." and dropped; the command goes on. importlib's own weakref callback (``_get_module_lock``'s) takes the global
import lock first, so such a lost Ctrl-C can also leave that lock held, and any other thread's next import then
waits forever (seen in CI: a convert hung after SIGINT). The project records every stop
(:func:`dflash2_trt.errors.stop_requested`) and looks at the record wherever it waits; these helpers make the loss
happen on purpose, in this process or in a child's script (``from dflash2_trt.testing.stops import lose_a_signal``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from typing import Iterator


def lose_a_signal(signum: int, *, hold_import_lock: bool = False) -> None:
    """Send this process ``signum`` from inside a weakref callback, where its handler runs and its exception is
    ignored. ``hold_import_lock``: the callback first takes the global import lock and never gives it back, as
    importlib's callback does when the signal lands just after its ``acquire_lock``."""
    import _imp

    def callback(ref):
        if hold_import_lock:
            _imp.acquire_lock()
        os.kill(os.getpid(), signum)
        for _ in range(10 ** 6):   # the handler runs here, at the loop's first check for pending signals
            pass

    class Gone:
        pass

    gone = Gone()
    ref = weakref.ref(gone, callback)
    del gone   # the callback runs now, while ref is alive
    del ref


@contextlib.contextmanager
def stop_recorded_after(seconds: float, signum: int = signal.SIGINT) -> Iterator[None]:
    """Record a stop ``seconds`` from now, from another thread, as a handler whose exception was lost leaves it; the
    record is cleared on the way out (it would stop the next command of the same process)."""
    from ..errors import clear_stop_requests, stop_requested

    timer = threading.Timer(seconds, stop_requested, args=(signum,))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        clear_stop_requests()


def work_then_clean_up(how: str) -> None:
    """A child's command for the second-signal tests: "working" (after losing a SIGTERM first, for ``how`` "lost"),
    60 s of work that never looks at the stop's record, and a clean-up of 1 s between "cleaning" and "cleaned"; for
    "replaced" the stop's exception is replaced on its way up by another (as torch does to one raised in a callback),
    and the clean-up runs while that one unwinds."""
    import time

    try:
        if how == "lost":
            lose_a_signal(signal.SIGTERM)
        try:
            # inside the try: the parent signals once it reads the line, and under load the signal has been seen to
            # arrive before the sleep (the stop's exception then passed this except: "replaced" exited 143)
            print("working", flush=True)
            time.sleep(60)
        except BaseException as exc:
            if how == "replaced":
                raise RuntimeError("an extension's own error") from exc
            raise
    finally:
        print("cleaning", flush=True)
        for _ in range(100):
            time.sleep(0.01)
        print("cleaned", flush=True)


def sigterm_twice(argv: list[str], lose_first: bool, timeout: float = 30) -> tuple[int, str, str]:
    """Run ``argv`` (a child running :func:`work_then_clean_up`) and SIGTERM it once it works: when its first SIGTERM
    was not lost, a second one as soon as its clean-up starts. Its exit status, stdout and stderr."""
    import subprocess

    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline().strip()
        if first != "working":
            return p.wait(timeout), first + p.stdout.read(), p.stderr.read()
        p.send_signal(signal.SIGTERM)
        if not lose_first:
            line = p.stdout.readline()
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=timeout)
            return p.returncode, "working\n" + line + out, err
        out, err = p.communicate(timeout=timeout)
        return p.returncode, "working\n" + out, err
    finally:
        p.kill()
        p.wait()


class StopDuringFirstRun:
    """A stand-in for ``subprocess.run`` (a benchmark's runner) whose first run records a Ctrl-C, as a handler whose
    exception was lost leaves it, and succeeds with ``stdout``; ``calls`` are the commands it was given. As a context
    manager it clears the record on the way out."""

    def __init__(self, stdout: str):
        self.stdout, self.calls = stdout, []

    def __call__(self, cmd, **kw):
        import subprocess

        from ..errors import stop_requested

        self.calls.append(cmd)
        stop_requested(signal.SIGINT)
        return subprocess.CompletedProcess(cmd, 0, stdout=self.stdout, stderr="")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        from ..errors import clear_stop_requests

        clear_stop_requests()
        return False
