"""Child processes that end with the process that started them, and stopping one.

A long child (trtllm-build for hours, tritonserver for as long as it serves) runs in its own session, so Ctrl-C
at the terminal reaches only ``dflash2-trt``, which then stops the child itself. If ``dflash2-trt`` is killed
outright (SIGKILL, the out-of-memory killer), nothing of its own can run: on Linux the kernel's
``PR_SET_PDEATHSIG`` sends the child SIGTERM instead, so no build keeps a GPU busy for hours for nobody.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1   # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` for :class:`subprocess.Popen` that has the child get ``sig`` when the thread that started
    it ends (on Linux; ``None`` elsewhere). Start the child from the main thread: the kernel ties the signal to the
    thread, not the process. A parent already gone by the time the child sets it (its parent pid changed) ends the
    child at once the same way."""
    if not sys.platform.startswith("linux"):
        return None
    try:   # looked up here, not in the child: dlopen there could wait forever on a lock a thread held at fork
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec():  # pragma: no cover - runs in the child, between fork and exec
        if prctl(PR_SET_PDEATHSIG, int(sig)) == 0 and os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


def stop(proc: subprocess.Popen, ladder=((signal.SIGTERM, 5.0), (signal.SIGKILL, None)), *, group: bool = False) -> None:
    """End ``proc`` by escalating: each ``(signal, grace seconds)`` of ``ladder`` in turn until it has ended (a grace of
    ``None`` waits however long), sent to its process group when ``group`` (a child started in its own session: its
    own children too). With ``group``, the ladder goes on until the whole group has ended, not only ``proc`` (a shell
    wrapper's child that outlives it gets the same signals and graces), and what still remains after the last grace
    gets SIGKILL. Returns with ``proc`` ended, or still running after the last grace. A ``proc`` already reaped when
    called is left alone, its group too (its id may belong to another group by now)."""
    if proc.poll() is not None:
        return
    pgid = proc.pid

    def done() -> bool:
        return proc.poll() is not None and (not group or not _group_members(pgid))

    for sig, grace in ladder:
        if done():
            return
        try:
            if group:
                os.killpg(pgid, sig)
            else:
                proc.send_signal(sig)
        except OSError:         # gone already (or not ours to signal): wait for it all the same
            pass
        deadline = None if grace is None else time.monotonic() + grace
        while not done():
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        else:
            return
    if group and proc.poll() is not None and _group_members(pgid):
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)


def _group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (field 2 of /proc/PID/stat; zombies left out)."""
    return [p for p in proc_pids() if (st := proc_stat(p)) is not None and st[2] == str(pgid) and st[0] != "Z"]


# ---- /proc (Linux; elsewhere these find nothing) ----------------------------------------------------------------
def proc_pids() -> list[int]:
    """The pids of every process this one can see."""
    try:
        return [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return []


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name ([0] = state, [1] = parent pid, [2] = process group), or None
    when it is gone (the name, in parentheses, may hold spaces: the fields start after its last ')')."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents before children (on Linux; elsewhere ``[pid]``)."""
    kids: dict[int, list[int]] = {}
    for p in proc_pids():
        st = proc_stat(p)
        if st and len(st) > 1 and st[1].isdigit():
            kids.setdefault(int(st[1]), []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant it has now (found first, so none is lost to re-parenting): a compiler
    driver's own children (nvcc's cicc, ptxas) end with it, while they stay in the caller's process group (a Ctrl-C at
    the terminal, or a group kill from outside, reaches them directly)."""
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


def run_limited(argv: list[str], limit: float, log, *, own_group: bool, cwd=None, env: dict | None = None,
                ladder=((signal.SIGTERM, 5.0), (signal.SIGKILL, None)), preexec_fn=None,
                interrupted=((signal.SIGKILL, None),), tick: tuple[float, object] | None = None) -> int:
    """Run ``argv`` with stdout and stderr to the file ``log`` (unbuffered Python; ``env`` on top of this process's)
    for at most ``limit`` seconds, then stop it by ``ladder`` (:func:`stop`): 124. ``own_group``: in its own session,
    and stopped with its whole group (its children too); else in this process's group, where a stop aimed at this
    process reaches it too. Interrupted while waiting (Ctrl-C, or a signal handler that raises), it is stopped by
    ``interrupted`` (default: killed) before the exception goes on. ``tick`` ``(seconds, fn)``: ``fn()`` is called
    every that many seconds while it runs (e.g. to save what it has written so far). Else its exit status (128 + N
    for a signal, as a shell says)."""
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=own_group,
                                preexec_fn=preexec_fn, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        deadline = time.monotonic() + limit
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    rc = proc.wait(timeout=max(min(left, tick[0]) if tick else left, 0))
                    break
                except subprocess.TimeoutExpired:
                    if tick is None or time.monotonic() >= deadline:
                        raise
                    tick[1]()
        except subprocess.TimeoutExpired:
            stop(proc, ladder, group=own_group)
            return 124
        except BaseException:
            stop(proc, interrupted, group=own_group)
            raise
    return 128 - rc if rc < 0 else rc


_stop_raised = False   # this process's stop_signals_raise handler has raised its SystemExit


def _raise_stop(signum, frame):  # noqa: ARG001
    # a second SIGTERM / Ctrl-C (a supervisor that repeats itself, two Ctrl-Cs) must not cut the clean-up short: the
    # child's stop ladder would end before its SIGKILL and leave the child running. So it is ignored while the first
    # one unwinds (raised, and an exception on its way up: the except / finally blocks see it, or what replaced it,
    # as sys.exc_info()), but not after a first one whose exception Python lost (raised inside a destructor or
    # weakref callback): that would leave no way to stop
    global _stop_raised
    if _stop_raised and sys.exc_info()[1] is not None:
        return
    _stop_raised = True
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def stop_signals_raise():
    """Inside, SIGTERM and SIGINT raise ``SystemExit(128 + N)``, so that a stop from outside (a part's limit, Ctrl-C)
    reaches :func:`run_limited`'s wait, which then kills its child's group (a child in a session of its own is out of
    reach of a stop aimed at this process's group); a second signal while the first one's exception unwinds is
    ignored, so that the clean-up it started runs to its end; the handlers before are put back on the way out."""
    global _stop_raised
    _stop_raised = False
    before = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
