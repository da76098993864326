"""A trtllm-build (any child of :class:`~dflash2_trt.engine.trtllm.process.SubprocessRunner`) ends when dflash2-trt
is killed outright: SIGKILL leaves dflash2-trt no chance to stop it, so the kernel does (PR_SET_PDEATHSIG). Before,
a killed build left its trtllm-build running, holding the GPU for hours and writing into a directory nobody would
read."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dflash2_trt.testing.processes import process_alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

PARENT = textwrap.dedent("""
    import sys
    from dflash2_trt.engine.trtllm.process import SubprocessRunner
    SubprocessRunner()([sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(120)"],
                       log=sys.argv[1])
""")


def test_a_sigkilled_build_takes_its_child_along(tmp_path):
    log = tmp_path / "build.log"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(log)], start_new_session=True)
    child = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (log.exists() and log.read_text().strip()):
            time.sleep(0.05)
        child = int(log.read_text().split()[0])
        assert process_alive(child)
        parent.kill()                                   # SIGKILL: nothing of dflash2-trt runs after it
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while process_alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_alive(child), "the child outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        if child is not None and process_alive(child):         # a failed check leaves no sleeper behind
            os.kill(child, signal.SIGKILL)
