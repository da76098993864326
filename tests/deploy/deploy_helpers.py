"""Constants and server helpers shared by the deployment tests (imported by conftest and tests)."""

from __future__ import annotations

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
