"""Real signals against `dflash2-trt serve` (issue 21 items 3 and 4): SIGKILL while the models load, SIGKILL of
serve and its watchdog together, SIGTERM during start, a readiness timeout. Afterwards no process of the
server's group runs, none of the python backend's /dev/shm regions its processes used exists, and the
temporary directories are gone (at the latest after the next `serve`, which names what it cleaned).

The server's processes and regions are observed from here, independently of the code under test: the
process group of the tritonserver listening on the test's port, read from /proc while it runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_serve_cli import Serve, _free_base_port, _procs_with

pytestmark = pytest.mark.triton
pytest.importorskip("pytriton")

SHM = Path("/dev/shm")


def _stat(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cmd(pid):
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def _members(pgid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(d)
            if st and st[0] != "Z" and st[2] == str(pgid):
                out.append(int(d))
    return out


class Watch:
    """What the server on ``port`` runs and uses: its group, the /dev/shm files its processes map or name, and the
    work directories they name."""

    def __init__(self, port):
        self.port, self.pgid, self.regions, self.dirs, self.stubs = port, None, set(), set(), set()

    def poll(self):
        if self.pgid is None:
            pids = _procs_with(f"--http-port {self.port}")
            if not pids:
                return
            self.pgid = pids[0]
        for pid in _members(self.pgid):
            try:   # the regions the server itself maps (made before their stub starts)
                maps = Path(f"/proc/{pid}/maps").read_text()
            except OSError:
                maps = ""
            for line in maps.splitlines():   # whatever the server names them: any /dev/shm file it maps
                if " /dev/shm/" in line:
                    self.regions.add(line.split(" /dev/shm/", 1)[1].split()[0])
            for a in _cmd(pid):              # a stub gets its region's name as an argument
                if a and "/" not in a and (SHM / a).exists():
                    self.regions.add(a)
                for part in a.split("/")[:3]:
                    if part.startswith(("dflash2-triton-", "dflash2-serve-")):
                        self.dirs.add(Path("/tmp") / part)
                if a.endswith("triton_python_backend_stub"):
                    self.stubs.add(pid)

    def until(self, pred, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.poll()
            if pred():
                return True
            time.sleep(0.05)
        return False

    def left(self):
        return {"processes": _members(self.pgid) if self.pgid else [],
                "regions": sorted(r for r in self.regions if (SHM / r).exists()),
                "dirs": sorted(str(d) for d in self.dirs if d.exists())}


def _settled(w, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline and any(w.left().values()):
        time.sleep(0.2)
    return w.left()


def test_sigkill_while_the_models_load_leaves_nothing(engine):
    port = _free_base_port()
    s = Serve("--engine-dir", str(engine), "--port", str(port))
    w = Watch(port)
    try:
        assert w.until(lambda: w.stubs and w.regions), s.lines        # loading: stubs and their regions exist
        os.kill(s.p.pid, signal.SIGKILL)                                 # serve alone, as `kill -9 PID` does
        assert s.finish() == -signal.SIGKILL
        assert _settled(w) == {"processes": [], "regions": [], "dirs": []}
    finally:
        s.kill()


def test_the_next_serve_cleans_what_a_killed_one_and_its_watchdog_left(engine):
    port = _free_base_port()
    s = Serve("--engine-dir", str(engine), "--port", str(port))
    w = Watch(port)
    try:
        assert w.until(lambda: w.stubs and w.regions), s.lines
        dogs = [p for p in _procs_with("dflash2_trt.deploy.triton.hygiene") if any(str(d) in " ".join(_cmd(p))
                                                                                   for d in w.dirs)]
        assert dogs, "no watchdog for this server"
        for pid in dogs + [s.p.pid]:
            os.kill(pid, signal.SIGKILL)                                 # both at once: nobody cleans up
        s.finish()
        time.sleep(3)
        left = w.left()
        assert left["dirs"], left                                       # the killed run's debris is there
    finally:
        s.kill()
    port2 = _free_base_port()
    s2 = Serve("--engine-dir", str(engine), "--port", str(port2), "--ready-timeout", "1")
    try:
        s2.finish(120)
    finally:
        s2.kill()
    notes = [ln for ln in s2.lines if ln.startswith("note: cleaned up after a tritonserver run that was killed")]
    for d in left["dirs"]:
        assert any(d in ln for ln in notes), (d, s2.lines)
    assert w.left() == {"processes": [], "regions": [], "dirs": []}


@pytest.fixture(scope="module")
def slow_repository(engine, tmp_path_factory):
    """A repository whose tensorrt_llm model takes a minute to import: the server reaches its python models (stubs
    and their regions) but cannot be ready within the test's --ready-timeout, however fast the machine (an idle one
    loads the tiny models in under 3 s)."""
    repo = tmp_path_factory.mktemp("slow") / "repo"
    subprocess.run([sys.executable, "-m", "dflash2_trt.cli", "deploy", "triton", "--engine-dir", str(engine),
                    "--output", str(repo), "--decoupled"], check=True, capture_output=True)
    model = repo / "tensorrt_llm" / "1" / "model.py"
    model.write_text(model.read_text() + "\nimport time as _slow_import\n_slow_import.sleep(60)\n")
    return repo


def test_a_readiness_timeout_leaves_no_shared_memory(slow_repository):
    port = _free_base_port()
    s = Serve("--repository", str(slow_repository), "--port", str(port), "--ready-timeout", "3")
    w = Watch(port)
    try:
        w.until(lambda: s.p.poll() is not None, timeout=120)
        assert s.finish() == 1 and any("not ready within" in ln for ln in s.lines), s.lines
        assert w.regions, "the server never got as far as its python models"
        assert _settled(w, timeout=5) == {"processes": [], "regions": [], "dirs": []}
    finally:
        s.kill()


def test_waiting_for_readiness_says_how_each_model_is_doing(slow_repository):
    """While tritonserver loads (minutes for a TensorRT engine of a published target), a line every progress_every
    seconds with the elapsed time and each model's state from Triton's repository index: here the slow tensorrt_llm
    model is still loading when the others are ready."""
    from dflash2_trt.deploy.triton.server import ServerError, TritonServer

    lines: list[str] = []
    srv = TritonServer(slow_repository, ready_timeout=8, progress=lines.append, progress_every=0.5)
    try:
        with pytest.raises(ServerError, match="not ready within 8 s"):
            srv.start()
    finally:
        srv.close()
    assert lines and all(ln.startswith("waiting for tritonserver (") and " s of 8): " in ln for ln in lines), lines
    assert any("tensorrt_llm LOADING" in ln and "preprocessing READY" in ln for ln in lines), lines


@pytest.mark.parametrize("death,how", [("os._exit(7)", "exited with status 7"),
                                       ("os.kill(os.getpid(), signal.SIGKILL)", "was killed by SIGKILL")])
def test_a_stub_that_dies_while_its_model_imports_is_named_at_once(engine, tmp_path, death, how):
    """A python model whose stub dies at import (a crash in a library, an out-of-memory kill) leaves tritonserver
    waiting with the model LOADING and nothing in its log (reproduced with nvidia-pytriton 0.7.0's server): the wait
    names the dead stub, its model and how it died, within seconds instead of the readiness timeout."""
    import time

    from dflash2_trt.deploy.triton.server import ServerError, TritonServer

    repo = tmp_path / "repo"
    subprocess.run([sys.executable, "-m", "dflash2_trt.cli", "deploy", "triton", "--engine-dir", str(engine),
                    "--output", str(repo)], check=True, capture_output=True)
    model = repo / "tensorrt_llm" / "1" / "model.py"
    model.write_text(f"import os, signal, sys\nsys.stderr.write('model.py dies now\\n')\n{death}\n"
                     + model.read_text())
    srv = TritonServer(repo, ready_timeout=100)
    t0 = time.monotonic()
    try:
        with pytest.raises(ServerError) as ei:
            srv.start()
    finally:
        srv.close()
    msg = str(ei.value)
    assert time.monotonic() - t0 < 60, msg
    assert msg.startswith("the python-backend stub of model 'tensorrt_llm' (pid ") or \
        msg.startswith("the python-backend stub of a python model (pid "), msg
    assert f") {how}" in msg and "while loading it, before it could report an error" in msg, msg
    assert "would wait out the 100 s" in msg and "model.py dies now" in msg, msg


def test_a_stub_that_ends_normally_while_models_load_is_not_a_dead_one(tmp_path):
    """Stubs end normally while models load (the python backend's argument-less permission check under sh, exit 1;
    the config auto-complete stub, exit 0), each a zombie for a moment before it is reaped: a reviewer's loaded
    machine failed 1 start in 20 on them. Only a stub under tritonserver that stays a zombie for STUB_ZOMBIE_S is
    dead, each process known by its pid and start time (a pid can be reused)."""
    from dflash2_trt.deploy.triton import server as srv_mod

    P = srv_mod.TreeProcess
    stub = srv_mod.STUB_NAME
    srv = srv_mod.TritonServer.__new__(srv_mod.TritonServer)
    srv._stubs, srv._zombies = {}, {}
    alive = P(10, "500", "S", stub[:15], "tritonserver", [stub, "/r/tensorrt_llm/1/model.py", "shm"], 0)
    assert srv.dead_stub([alive], now=0.0) is None and srv._stubs == {(10, "500"): "tensorrt_llm"}
    dead = P(10, "500", "Z", stub[:15], "tritonserver", [], 4 << 8)
    check = P(11, "501", "Z", stub[:15], "sh", [], 1 << 8)            # the permission check, under sh
    assert srv.dead_stub([dead, check], now=1.0) is None                # a zombie seen once: maybe being reaped
    assert srv.dead_stub([check], now=5.0) is None                      # reaped: gone
    reused = P(10, "900", "Z", stub[:15], "tritonserver", [], 0)        # another process on the same pid
    assert srv.dead_stub([reused], now=6.0) is None
    assert srv.dead_stub([dead], now=2.1) == ("the python-backend stub of model 'tensorrt_llm' (pid 10) exited with "
                                              "status 4 while loading it, before it could report an error")
    other = P(12, "502", "Z", "python", "tritonserver", [], 0)          # not a stub
    assert srv.dead_stub([other], now=0.0) is None and srv.dead_stub([other], now=9.0) is None
    assert srv_mod.wait_status_words(9) == "was killed by SIGKILL (the out-of-memory killer?)"
    assert srv_mod.wait_status_words(11 | 0x80) == "was killed by SIGSEGV (core dumped)"
    assert srv_mod.wait_status_words(None) == "ended"


def test_the_default_readiness_wait_follows_the_engine(tmp_path):
    from dflash2_trt.deploy.triton.server import READY_TIMEOUT, default_ready_timeout

    assert default_ready_timeout(tmp_path) == READY_TIMEOUT["default"] == 120.0          # no record
    for backend, want in (("trtllm", 900.0), ("cuda", 900.0), ("cpu", 120.0)):
        (tmp_path / "dflash2_repository.json").write_text(json.dumps({"engine_backend": backend}))
        assert default_ready_timeout(tmp_path) == want


def test_serve_waits_the_engines_default_and_says_so_on_stderr(tmp_path, monkeypatch, capsys):
    """`serve` without --ready-timeout hands the server the engine's default and a progress callback writing to
    stderr (the server itself is replaced here: what is checked is the wiring)."""
    from dflash2_trt.deploy.triton import server

    seen = {}

    class Fake:
        def __init__(self, repository, **kw):
            seen.update(kw)

        def start(self):
            seen["progress"]("waiting for tritonserver (15 s of 900): tensorrt_llm LOADING")
            raise server.ServerError("stop here")

        def close(self):
            pass

    repo = tmp_path / "repo"
    (repo / "tensorrt_llm").mkdir(parents=True)
    (repo / "dflash2_repository.json").write_text(json.dumps({"engine_backend": "trtllm"}))
    monkeypatch.setattr(server, "TritonServer", Fake)
    with pytest.raises(server.ServerError, match="stop here"):
        server.serve(repository=repo, port=_free_base_port(), echo=lambda m: None)
    assert seen["ready_timeout"] == 900.0
    assert "waiting for tritonserver (15 s of 900): tensorrt_llm LOADING" in capsys.readouterr().err


def test_the_model_states_come_from_tritonservers_own_lines(tmp_path):
    """Loading, loaded and failed models from model_lifecycle.cc's lines; a model's own log line that says "failed to
    load" (a tokenizer file) and an unload are not taken for a model's state."""
    from dflash2_trt.deploy.triton.server import TritonServer

    log = tmp_path / "tritonserver.log"
    srv = TritonServer(tmp_path, log_path=log)
    try:
        assert srv.model_states() == "no log yet"
        log.write_text('I1205 model_lifecycle.cc:472] "loading: preprocessing:1"\n'
                       'I1205 model_lifecycle.cc:472] "loading: tensorrt_llm:1"\n'
                       'I1205 model_lifecycle.cc:472] "loading: my model+2:1"\n'
                       'W1205 model.py:38] "tokenizer: failed to load \'tokenizer.json\', using the slow one"\n'
                       'I1205 model_lifecycle.cc:839] "successfully loaded \'preprocessing\'"\n'
                       'E1205 model_lifecycle.cc:654] "failed to load \'my model+2\' version 1: Internal: boom"\n'
                       'I1205 model_lifecycle.cc:624] "successfully unloaded \'preprocessing\' version 1"\n')
        assert srv.model_states() == "preprocessing READY, tensorrt_llm LOADING, my model+2 FAILED"
        log.write_text("I1205 server.cc:1] starting\n")
        assert srv.model_states() == "the server is starting"
    finally:
        srv.close()


def test_sigterm_during_start_is_143_and_leaves_nothing(engine):
    port = _free_base_port()
    s = Serve("--engine-dir", str(engine), "--port", str(port))
    w = Watch(port)
    try:
        assert w.until(lambda: w.stubs and w.regions), s.lines
        s.p.send_signal(signal.SIGTERM)
        assert s.finish() == 143, s.lines
        assert [ln for ln in s.lines if ln.startswith(("terminated", "error", "Traceback"))] == \
            ["terminated (SIGTERM): stopped; any output in progress was removed"], s.lines
        assert _settled(w, timeout=5) == {"processes": [], "regions": [], "dirs": []}
    finally:
        s.kill()


def test_the_sweep_removes_by_the_dead_runs_prefix_only(tmp_path, monkeypatch):
    """A region the server made in its last moment is found by its name, never mapped or recorded; one with
    another run's prefix (a live run's, or no prefix of ours) is left alone."""
    import tempfile

    from dflash2_trt.deploy.triton import hygiene

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / "dflash2-triton-dead1234"
    dead.mkdir()
    (dead / "owner").write_text("999999999 1\n")                     # no such process
    alive = hygiene.make_work_dir("dflash2-triton-")                   # this process owns it
    ours = SHM / (hygiene.region_prefix(dead) + "0123-abcd")
    theirs = SHM / (hygiene.region_prefix(alive) + "0123-abcd")
    other = SHM / "triton_python_backend_shm_region_not-ours-test"
    try:
        for f in (ours, theirs, other):
            f.write_bytes(b"\0" * 4096)
        notes = []
        done = hygiene.sweep_leftovers(echo=notes.append)
        assert done["regions"] == [ours.name] and done["dirs"] == [str(dead)], done
        assert not ours.exists() and theirs.exists() and other.exists() and alive.exists()
        assert len(notes) == 1 and ours.name in notes[0] and str(dead) in notes[0], notes
    finally:
        for f in (ours, theirs, other):
            f.unlink(missing_ok=True)


def test_readiness_counts_only_from_this_server(tmp_path):
    """Two `serve` started at once on one port: the second's tritonserver fails to bind, but the first one's health
    check answered it, and it said it was serving (a new user's report). Readiness now needs the server's metadata
    name to be this server's --id."""
    import http.server
    import json as _json
    import subprocess
    import threading

    from dflash2_trt.deploy.triton.server import ServerError, TritonServer

    answer = {"name": "triton"}

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = _json.dumps(answer).encode() if self.path == "/v2" else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    srv = TritonServer(tmp_path, http_port=other.server_address[1], ready_timeout=1.5)
    srv.proc = subprocess.Popen(["sleep", "30"])       # "our" tritonserver, still starting
    try:
        with pytest.raises(ServerError, match="was not ready within"):
            srv.wait_ready()                           # the other server's 200s do not count
        answer["name"] = srv.server_id
        srv.wait_ready()                               # this server's own answer does
        assert "--id" in srv.command(type("I", (), {"binary": "tritonserver"})(), tmp_path)
    finally:
        srv.proc.kill()
        srv.proc.wait()
        other.shutdown()
        import shutil

        shutil.rmtree(srv._work, ignore_errors=True)
