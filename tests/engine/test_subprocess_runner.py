"""SubprocessRunner (trtllm-build, CMake, the verify gate's engine side): its output line by line to the log and the
progress, and a stop whose exception Python lost still stops the child. The child runs in a session of its own, so
the terminal's Ctrl-C does not reach it: before, a lost Ctrl-C let trtllm-build run to its end (hours on a GPU)."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from dflash2_trt.engine.trtllm.process import SubprocessRunner
from dflash2_trt.errors import clear_stop_requests, stop_requested
from dflash2_trt.testing.processes import process_alive
from dflash2_trt.testing.stops import stop_recorded_after

CHATTY = ("import sys, time\n"
          "sys.stdout.write('a\\r\\nb\\rc\\n\\nd'); sys.stdout.flush(); time.sleep(0.6)\n"
          "sys.stdout.buffer.write('e\\u00e9 '.encode() + b'\\xff\\n'); sys.stdout.flush()\n"
          "sys.stderr.write('err'); sys.exit(3)")


def test_output_lines_reach_the_log_and_the_progress(tmp_path):
    log, seen = tmp_path / "step.log", []
    assert SubprocessRunner()([sys.executable, "-c", CHATTY], log=log, echo=seen.append) == 3
    # \r\n, a lone \r (a progress bar) and \n each end a line, as in text mode; a line split over two writes is one
    # (bytes that are not UTF-8 are replaced, not an error)
    assert seen == ["a", "b", "c", "", "de\u00e9 \ufffd", "err"]
    assert log.read_text(encoding="utf-8") == "a\nb\nc\n\nde\u00e9 \ufffd\nerr\n"


def test_a_recorded_stop_stops_a_silent_child(tmp_path):
    log = tmp_path / "step.log"
    argv = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(120)"]
    t0 = time.monotonic()
    with stop_recorded_after(1.0), pytest.raises(KeyboardInterrupt):   # a Ctrl-C whose exception was lost
        SubprocessRunner()(argv, log=log)
    assert time.monotonic() - t0 < 30
    child = int(log.read_text().split()[0])
    assert not process_alive(child)


def test_a_stop_recorded_before_the_step_starts_nothing(tmp_path):
    marker = tmp_path / "ran"
    stop_requested(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt):
            SubprocessRunner()([sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    finally:
        clear_stop_requests()
    assert not marker.exists()


def test_a_pipe_past_descriptor_1024_and_a_long_line(tmp_path):
    """select.select refuses a descriptor >= 1024 (a busy process gets one); and a 40 MiB line without a break must
    not be split again at every read (it took 20 s so)."""
    import os
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"the soft limit on open files is {soft}")
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        seen = []
        assert SubprocessRunner()([sys.executable, "-c", "print('hi')"], echo=seen.append) == 0 and seen == ["hi"]
        seen.clear()
        t0 = time.monotonic()
        SubprocessRunner()([sys.executable, "-c", "import sys; sys.stdout.write('x' * (40 << 20) + '\\n')"],
                           echo=seen.append)
        assert [len(s) for s in seen] == [40 << 20] and time.monotonic() - t0 < 10
    finally:
        for fd in fds:
            os.close(fd)
