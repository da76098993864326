"""Child processes that end with the process that started them.

A long child (trtllm-build for hours, tritonserver for as long as it serves) runs in its own session, so Ctrl-C
at the terminal reaches only ``dflash2-trt``, which then stops the child itself. If ``dflash2-trt`` is killed
outright (SIGKILL, the out-of-memory killer), nothing of its own can run: on Linux the kernel's
``PR_SET_PDEATHSIG`` sends the child SIGTERM instead, so no build keeps a GPU busy for hours for nobody.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

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
