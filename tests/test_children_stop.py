"""Stopping a child started in its own session takes its whole process group: a grandchild that outlives the child
(a shell wrapper's) is ended too, so nothing keeps running after a Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dflash2_trt.children import proc_stat, stop
from dflash2_trt.testing.stops import sigterm_twice


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


def test_the_group_keeps_each_step_s_grace(tmp_path):
    """A grandchild that cleans up on SIGINT for 3 s gets its 3 s (the step's grace is 8), though its parent ended at
    once: the group is signalled and waited for as a whole."""
    import sys

    grand = tmp_path / "grand.py"
    done = tmp_path / "cleaned"
    grand.write_text(
        "import signal, sys, time\n"
        f"def h(s, f):\n    time.sleep(3)\n    open({str(done)!r}, 'w').write('yes')\n    sys.exit(0)\n"
        "signal.signal(signal.SIGINT, h)\n"
        f"open({str(tmp_path / 'ready')!r}, 'w').write('1')\n"
        "time.sleep(600)\n")
    proc = subprocess.Popen(["sh", "-c", f"{sys.executable} {grand} & wait"], start_new_session=True)
    for _ in range(400):
        if (tmp_path / "ready").is_file():
            break
        time.sleep(0.02)
    t0 = time.monotonic()
    stop(proc, ((signal.SIGINT, 8.0), (signal.SIGKILL, None)), group=True)
    took = time.monotonic() - t0
    assert done.read_text() == "yes", "the grandchild was killed before its cleanup"
    assert 2.5 < took < 8.0, took



_STOP_SIGNALS_CHILD = textwrap.dedent("""
    import sys
    from dflash2_trt.children import stop_signals_raise
    from dflash2_trt.testing.stops import work_then_clean_up

    with stop_signals_raise():
        work_then_clean_up(sys.argv[1])
""")


@pytest.mark.parametrize("how", ["kept", "replaced", "lost"])
def test_stop_signals_raise_second_signal(how):
    """A second SIGTERM is ignored while the first one's clean-up runs (also where its exception was replaced by
    another on the way); after a first one whose exception Python lost, it stops the process (before, every later
    SIGTERM and Ctrl-C was ignored)."""
    rc, out, err = sigterm_twice([sys.executable, "-c", _STOP_SIGNALS_CHILD, how], how == "lost")
    assert out.split() == ["working", "cleaning", "cleaned"], (rc, out, err)
    assert rc == (1 if how == "replaced" else 128 + signal.SIGTERM), (rc, out, err)   # replaced: its traceback
