"""``bench serve``'s client against the wire shapes of servers that cannot run here (vLLM, SGLang, trtllm-serve,
OpenAI's own API): a scripted HTTP server on 127.0.0.1 answers each request in the shape its prompt's first word
names. The shapes are the OpenAI streaming format as vLLM's ``completion_stream_generator`` writes it (one
``text_completion`` chunk per step, ``usage`` on every chunk with ``continuous_usage_stats``, a last chunk of empty
``choices`` with ``usage``, ``data: [DONE]``) and its variants: CRLF lines, ``data:`` without a space, ``:`` comments
and ``event:`` lines, no usage at all, usage at the end only, error events in both shapes, an event that is not an
object, a stream cut off, a server that refuses ``continuous_usage_stats``. This project's own server is tested for
real (tritonserver) in tests/deploy/test_bench_serve.py; here the client's parsing and clock are pinned."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dflash2_trt.testing.cli import cli, one_error_line

FIRST_S, GAP_S = 0.15, 0.05


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    FAIL: frozenset = frozenset()   # prompt kinds this server answers with HTTP 500

    def log_message(self, *a):
        pass

    def do_GET(self):
        self._json(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    def _json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        kind = body["prompt"].split()[0]
        opts = body.get("stream_options") or {}
        if kind == "strict" and "continuous_usage_stats" in opts:
            return self._json(400, {"error": {"message": "Unrecognized request argument supplied: "
                                                         "stream_options.continuous_usage_stats"}})
        if kind == "http500" or kind in self.FAIL:
            return self._json(500, {"error": {"message": "the engine fell over"}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        eol = b"\r\n" if kind == "crlf" else b"\n"
        sep = b"data:" if kind == "crlf" else b"data: "
        every = opts.get("continuous_usage_stats") and kind not in ("nousage", "endusage")
        n = 0

        def send(ev):
            raw = ev if isinstance(ev, bytes) else json.dumps(ev).encode()
            if kind == "crlf":
                self.wfile.write(b": keep-alive" + eol + b"event: message" + eol)
            self.wfile.write(sep + raw + eol + eol)
            self.wfile.flush()

        def chunk(text, k, finish=None):
            nonlocal n
            n += k
            c = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "scripted",
                 "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
            if every:
                c["usage"] = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
            return c

        time.sleep(FIRST_S)
        send(chunk("a", 1))
        for i in range(3):
            time.sleep(GAP_S)
            if i == 1 and kind in ("error", "objerror", "notobj", "cut"):
                if kind == "cut":
                    return   # the connection closes without data: [DONE]
                send({"error": {"message": "boom", "type": "internal_error", "code": 500}} if kind == "error" else
                     {"object": "error", "message": "bad", "code": 400} if kind == "objerror" else b"[]")
                return   # the client has stopped reading: nothing more is written
            send(chunk(" b c", 2))
        send(chunk("", 0, "length"))
        if opts.get("include_usage") and kind != "nousage":
            send({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "scripted", "choices": [],
                  "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}})
        send(b"[DONE]")


def _serve(handler):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    srv.handle_error = lambda request, address: None   # a client that stopped reading is no traceback on stderr
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def server():
    srv = _serve(Handler)
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def flaky_server():
    srv = _serve(type("Flaky", (Handler,), {"FAIL": frozenset({"flaky"})}))
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _load(server, tmp_path, kinds, *extra):
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"prompt": f"{k} x", "output_tokens": 7}) + "\n" for k in kinds))
    out = tmp_path / "r.json"
    code, text = cli("bench", "serve", "--base-url", server, "--dataset", str(ds), "--concurrency", "2",
                     "--json", str(out), "--save-outputs", "--no-progress", *extra)
    return code, text, (json.loads(out.read_text()) if out.exists() else None)


def test_the_clock_and_the_tokens(server, tmp_path):
    code, text, doc = _load(server, tmp_path, ["ok", "crlf", "ok"])
    assert code == 0, text
    lv = doc["levels"][0]
    assert lv["completed"] == 3 and [o["text"] for o in lv["outputs"]] == ["a b c b c b c"] * 3
    assert lv["output_tokens"] == 21 and lv["input_tokens"] == 15
    assert lv["tokens_per_event"] == {"mean": 2.0, "events": 9, "histogram": {"2": 9}}
    assert lv["ttft_s"]["min"] >= FIRST_S and lv["event_gap_s"]["min"] >= GAP_S
    # (latency - ttft) / (7 - 1) spans the three gaps and the finish: at least 3 gaps over 6 tokens
    assert lv["itl_s"]["min"] >= 3 * GAP_S / 6 and lv["latency_s"]["min"] >= FIRST_S + 3 * GAP_S
    assert lv["ttft_s"]["max"] < lv["latency_s"]["min"]


def test_usage_at_the_end_only_and_none_at_all(server, tmp_path):
    code, text, doc = _load(server, tmp_path, ["endusage", "endusage"])
    assert code == 0, text
    lv = doc["levels"][0]
    assert lv["output_tokens"] == 14 and lv["tokens_per_event"] is None and lv["itl_s"] is not None
    assert doc["usage_at_end"] and not doc["usage_per_event"] and "tok/event is not known" in text
    code, text, doc = _load(server, tmp_path, ["nousage", "nousage"])
    assert code == 0, text
    lv = doc["levels"][0]
    assert (lv["output_tokens"], lv["output_tokens_per_s"], lv["input_tokens"], lv["itl_s"]) == (None,) * 4
    assert lv["ttft_s"]["min"] >= FIRST_S and lv["completed"] == 2 and "the server sends no usage" in text


@pytest.mark.parametrize("kind, why", [("error", "error event: boom"), ("objerror", "error event: bad"),
                                       ("notobj", "an event that is not a JSON object: []"),
                                       ("cut", "the stream ended without data: [DONE] (cut off)"),
                                       ("http500", "HTTP 500: the engine fell over")])
def test_a_failed_stream_is_a_failed_request(server, tmp_path, kind, why):
    code, text, doc = _load(server, tmp_path, ["ok", kind, "ok"])
    err = [ln for ln in text.splitlines() if ln.startswith("error: ")]
    assert code == 1 and len(err) == 1 and "1 of 3 requests failed at concurrency 2" in err[0] and why in err[0], text
    lv = doc["levels"][0]
    assert (lv["completed"], lv["failed"]) == (2, 1) and lv["errors"] == [{"task_id": 1, "error": why}]
    assert lv["output_tokens"] == 14 and "Traceback" not in text


def test_a_server_that_refuses_usage_per_event(server, tmp_path):
    line = one_error_line(*_load(server, tmp_path, ["strict"])[:2])
    assert "--base-url" in line and "continuous_usage_stats" in line and "--no-usage-per-event" in line
    code, text, doc = _load(server, tmp_path, ["strict", "strict"], "--no-usage-per-event")
    assert code == 0, text
    assert doc["settings"]["usage_per_event_asked"] is False and doc["levels"][0]["output_tokens"] == 14


@pytest.mark.parametrize("args, field", [(["--timeout", "inf"], "--timeout"), (["--timeout", "0"], "--timeout"),
                                         (["--request-rate", "1e-300"], "--request-rate"),
                                         (["--request-rate", "nan"], "--request-rate"),
                                         (["--burstiness", "0"], "--burstiness"),
                                         (["--base-url", "http://[::1"], "--base-url"),
                                         (["--base-url", "ftp://x"], "--base-url")])
def test_bad_numbers_and_addresses(server, tmp_path, args, field):
    ds = tmp_path / "ds.jsonl"
    ds.write_text('{"prompt": "ok x"}\n{"prompt": "ok y"}\n')
    line = one_error_line(*cli("bench", "serve", "--base-url", server, "--dataset", str(ds), "--no-progress", *args))
    assert field in line


def test_a_baseline_with_failures_has_no_speedup(server, flaky_server, tmp_path):
    """A level where the baseline failed a request: the failure is the command's error line, the outputs are compared
    over the requests both completed, and no speedup is claimed (the two did different work)."""
    code, text, doc = _load(server, tmp_path, ["ok", "flaky", "ok"], "--baseline-url", flaky_server)
    err = [ln for ln in text.splitlines() if ln.startswith("error: ")]
    assert code == 1 and len(err) == 1 and "1 of 3 requests failed on the baseline at concurrency 2" in err[0], text
    lv = doc["levels"][0]
    assert lv["failed"] == 0 and lv["baseline"]["failed"] == 1 and lv["speedup"] is None
    assert lv["outputs_identical"] == {"identical": 2, "compared": 2} and "speedup - " in text
    code, text, doc = _load(server, tmp_path, ["ok", "ok"], "--baseline-url", flaky_server.replace("127.0.0.1",
                                                                                                     "localhost"))
    assert code == 0 and doc["levels"][0]["speedup"] > 0, text
    line = one_error_line(*_load(server, tmp_path, ["ok"], "--baseline-url",
                                 server.replace("127.0.0.1", "localhost") + "/v1/")[:2])
    assert "--baseline-url" in line and "the served endpoint itself" in line
