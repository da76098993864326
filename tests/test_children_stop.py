"""Stopping a child started in its own session takes its whole process group: a grandchild that outlives the child
(a shell wrapper's) is ended too, so nothing keeps running after a Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from dflash2_trt.children import proc_stat, stop


def _alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] != "Z"


def test_stop_leaves_nothing_of_the_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    # the wrapper starts a grandchild that ignores SIGINT and SIGTERM, then exits on the signal itself
    script = (f"trap '' INT TERM; sleep 600 & echo $! > {pidfile}; trap - INT TERM; wait")
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    for _ in range(200):
        if pidfile.is_file() and pidfile.read_text().strip():
            break
        time.sleep(0.02)
    grandchild = int(pidfile.read_text())
    try:
        assert _alive(grandchild)
        t0 = time.monotonic()
        stop(proc, ((signal.SIGINT, 5.0), (signal.SIGKILL, None)), group=True)
        assert proc.poll() is not None
        for _ in range(100):
            if not _alive(grandchild):
                break
            time.sleep(0.05)
        assert not _alive(grandchild), "the grandchild outlived stop()"
        assert time.monotonic() - t0 < 15
    finally:   # a failing run leaves no sleep behind either
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_stop_of_a_child_already_gone_returns_at_once():
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    t0 = time.monotonic()
    stop(proc, group=True)
    assert time.monotonic() - t0 < 1.0
    assert os.getpgid(os.getpid()) != proc.pid
