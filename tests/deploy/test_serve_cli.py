"""`dflash2-trt serve`: one command starts the bundled tritonserver on 127.0.0.1 for an engine,
serves text, and Ctrl-C stops it with nothing left running; an occupied port, a missing engine
and a server that fails to start are clear errors (the last one with its log's errors)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time
import urllib.request

import pytest

from deploy_helpers import MAX_NEW, Serve
from deploy_helpers import free_base_port as _free_base_port
from deploy_helpers import procs_with as _procs_with

pytestmark = pytest.mark.triton
pytest.importorskip("pytriton")


def _error_of(s: Serve) -> str:
    assert s.finish() == 1, s.lines
    assert s.lines and s.lines[0].startswith("error: "), s.lines
    assert not any("Traceback" in ln for ln in s.lines), s.lines
    return "\n".join(s.lines)


def test_serve_an_engine_and_stop_it_with_ctrl_c(engine, tokenizer, prompts, greedy):
    from dflash2_trt.deploy.triton.server import free_port

    port, api = _free_base_port(), free_port()
    s = Serve("--engine-dir", str(engine), "--port", str(port), "--openai-port", str(api), "--served-model-name", "tn")
    try:
        assert s.wait_for("serving", 120), s.lines
        line = next(ln for ln in s.lines if "serving" in ln)
        assert f"HTTP http://127.0.0.1:{port}" in line and f"gRPC 127.0.0.1:{port + 1}" in line
        assert "ensemble" in line and "tensorrt_llm" in line
        assert f"OpenAI API http://127.0.0.1:{api}/v1 (model 'tn')" in line
        assert _procs_with(f"--http-port {port}"), "no tritonserver with the requested port"
        body = json.dumps({"text_input": tokenizer.decode(prompts[0]), "max_tokens": MAX_NEW}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/ensemble/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.loads(r.read())["text_output"] == tokenizer.decode(greedy[0])
        # the OpenAI API: the same text, the engine's max_seq_len bounding a chat completion's default length
        body = json.dumps({"model": "tn", "messages": [{"role": "user", "content": tokenizer.decode(prompts[0])}],
                           "max_tokens": MAX_NEW, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{api}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.loads(r.read())["choices"][0]["message"]["content"] == tokenizer.decode(greedy[0])
        s.p.send_signal(signal.SIGINT)
        assert s.finish() == 0, s.lines
        assert "stopped" in s.lines[-1]
        deadline = time.time() + 10
        while _procs_with(f"--http-port {port}") and time.time() < deadline:
            time.sleep(0.1)
        assert not _procs_with(f"--http-port {port}"), "tritonserver (or a stub) left running"
        for p in (port, api):
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", p))   # nothing listens there any more (TIME_WAIT connections may stay)
                sock.listen()
    finally:
        s.kill()


def _stream(port, text, max_tokens, events, i):
    """One HTTP generate_stream request on the ensemble; its events (an exception ends the list)."""
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"text_input": text, "max_tokens": max_tokens, "end_id": -1, "stream": True,
                       "return_num_output_tokens": True})
    try:
        c.request("POST", "/v2/models/ensemble/generate_stream", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        events[i] = []
        for line in r:
            if line.startswith(b"data: "):
                events[i].append(json.loads(line[len(b"data: "):]))
    except Exception as exc:  # noqa: BLE001 - what the client saw (IncompleteRead when cut)
        events.setdefault(i, []).append(exc)
    finally:
        c.close()


def test_sigterm_drains_the_streams_in_flight(engine, tokenizer, prompts):
    """SIGTERM with long streams in flight: used to cut every stream mid-way with no final or error event
    (tritonserver's exit timeout). Now no new request is taken, and each stream ends with an event: its last
    tokens, or (still running after --drain-timeout) an error saying why."""
    port = _free_base_port()
    s = Serve("--engine-dir", str(engine), "--port", str(port), "--drain-timeout", "1")
    events: dict = {}
    try:
        assert s.wait_for("serving", 120), s.lines
        text = tokenizer.decode(prompts[0][:3])
        threads = [threading.Thread(target=_stream, args=(port, text, 480, events, i)) for i in range(4)]
        for t in threads:
            t.start()
        deadline = time.time() + 60
        while not all(events.get(i) for i in range(4)) and time.time() < deadline:
            time.sleep(0.02)
        assert all(events.get(i) for i in range(4)), events
        s.p.send_signal(signal.SIGTERM)
        assert s.wait_for("stopping tritonserver", 10), s.lines
        late: dict = {}
        _stream(port, text, 4, late, 0)        # no new request: refused with an error, or no connection at all
        assert not any("text_output" in e for e in late[0] if isinstance(e, dict)), late
        for t in threads:
            t.join(30)
        assert s.finish(60) == 0, s.lines
        assert "stopped" in s.lines[-1], s.lines
    finally:
        s.kill()
    for i in range(4):
        last = events[i][-1]
        assert isinstance(last, dict), events[i][-3:]          # the stream ended, not cut
        assert last.get("error", "").endswith("the server is shutting down: the request was ended before it "
                                              "finished (the 1 s drain timeout passed)"), last
        assert all("text_output" in e for e in events[i][:-1])


def test_occupied_port_is_one_clear_error(engine):
    port = _free_base_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port + 1))
        held.listen()
        s = Serve("--engine-dir", str(engine), "--port", str(port))
        try:
            text = _error_of(s)
        finally:
            s.kill()
    assert f"--port (its grpc port): 127.0.0.1:{port + 1} is not available" in text   # derived from --port
    assert not _procs_with(f"--http-port {port}")


@pytest.mark.parametrize("args,needle", [
    (["--engine-dir", "/nonexistent/engine"], "engine directory not found"),
    ([], "exactly one of --engine-dir or --repository"),
    (["--repository", "/nonexistent/repo"], "not a model repository"),
    (["--engine-dir", "/nonexistent/engine", "--served-model-name", "m"], "--served-model-name: names the model of "
                                                                          "the OpenAI API: give --openai-port too"),
    (["--engine-dir", "/nonexistent/engine", "--ids-only", "--openai-port", "9"], "--openai-port: the OpenAI API "
                                                                                 "serves text through the ensemble"),
    (["--engine-dir", "/nonexistent/engine", "--openai-port", "PORT"], "the 4 ports must differ"),
])
def test_bad_arguments(args, needle):
    port = _free_base_port()
    s = Serve(*[str(port) if a == "PORT" else a for a in args], "--port", str(port))
    try:
        assert needle in _error_of(s)
    finally:
        s.kill()


def test_a_server_that_fails_to_start_shows_its_log(engine, tmp_path):
    """A repository whose engine has gone: tritonserver exits; the error carries the model's message."""
    from dflash2_trt.deploy.triton.repository import deploy_triton

    eng = tmp_path / "engine"
    shutil.copytree(engine, eng)
    deploy_triton(eng, tmp_path / "repo", ids_only=True)
    (eng / "checkpoint" / "rank0.safetensors").unlink()
    port = _free_base_port()
    s = Serve("--repository", str(tmp_path / "repo"), "--port", str(port))
    try:
        text = _error_of(s)
    finally:
        s.kill()
    assert "tritonserver exited with status" in text and "before it was ready" in text
    assert "cannot open the engine" in text and "rank0.safetensors is missing" in text
    assert not _procs_with(f"--http-port {port}")


def test_the_stub_resolves_its_libraries_only_with_the_server_environment(tmp_path):
    """A copied stub (as start() places it) loses its $ORIGIN-relative path to the bundled
    libraries: missing_libraries names them without server_env, and none with it."""
    from dflash2_trt.deploy.triton.server import find_tritonserver, missing_libraries, server_env

    inst = find_tritonserver()
    stub = tmp_path / "triton_python_backend_stub"
    shutil.copy2(inst.stub, stub)
    bare = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    assert any("libcudart" in m for m in missing_libraries(stub, bare))
    assert missing_libraries(stub, server_env(inst)) == []
