"""Constants and server helpers shared by the deployment tests (imported by conftest and tests): a
tritonserver in-process (start_server), `dflash2-trt serve` as a subprocess (Serve)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from dflash2_trt.testing.cli import cli, one_error_line  # noqa: F401 - the deploy tests import them from here

MAX_NEW = 16
EOS = (2,)
SERVERS: list = []   # every server started by these tests (stopped at session end whatever happens)


def start_server(repo, **kw):
    from dflash2_trt.deploy.triton.server import TritonServer

    srv = TritonServer(repo, ready_timeout=120, **kw)
    SERVERS.append(srv)
    srv.start()
    return srv


def stop_and_check(srv) -> None:
    """Stop ``srv`` and assert that no process of its group (server or python-backend stub) is left."""
    from dflash2_trt.deploy.triton.server import group_alive

    srv.close()
    assert not srv.alive()
    assert not group_alive(srv.proc.pid), f"processes of tritonserver group {srv.proc.pid} left running"


def free_base_port() -> int:
    """A port P with P, P+1 and P+2 free on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + 2 > 65535:
            continue
        try:
            socks = []
            for q in (p, p + 1, p + 2):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no three consecutive free ports")


def procs_with(needle: str) -> list[int]:
    """Live processes whose command line contains ``needle`` (the test's unique port)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if needle in cmd and state != "Z" and int(d.name) != os.getpid():
                out.append(int(d.name))
    return out


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def _group(pgid: int) -> list[int]:
    """Live members of process group ``pgid``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                st = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if st[2] == str(pgid) and st[0] != "Z":
                out.append(int(d.name))
    return out


class Serve:
    """`python -m dflash2_trt.cli serve ...` in its own process group, killed whatever happens (``env``: added to
    this process's environment)."""

    def __init__(self, *args, env: dict | None = None):
        self.p = subprocess.Popen([sys.executable, "-m", "dflash2_trt.cli", "serve", *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                  env=None if env is None else {**os.environ, **env})
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(needle in ln for ln in self.lines):
                return True
            if self.p.poll() is not None:
                self._t.join(5)
                return any(needle in ln for ln in self.lines)
            time.sleep(0.1)
        return False

    def finish(self, timeout: float = 60) -> int:
        try:
            code = self.p.wait(timeout)
        except subprocess.TimeoutExpired:   # say what it printed and what is still running, not only that it hung
            left = [f"{pid}: {_cmdline(pid)[:160]}" for pid in _group(self.p.pid)]
            raise AssertionError(f"serve did not exit within {timeout} s; its last lines: {self.lines[-25:]}; its "
                                 f"process group: {left}") from None
        self._t.join(5)
        return code

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
