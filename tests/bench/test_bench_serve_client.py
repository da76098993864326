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

from dflash2_trt.errors import ConfigError
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
        if body["model"] != "scripted":   # vLLM's answer to a model it does not serve
            return self._json(404, {"error": {"message": f"The model `{body['model']}` does not exist."}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        eol = b"\r\n" if kind == "crlf" else b"\n"
        sep = b"data:" if kind == "crlf" else b"data: "
        # silent: every event's text decodes to nothing (special tokens), usage at the end only; zero: no output
        every = opts.get("continuous_usage_stats") and kind not in ("nousage", "endusage", "silent")
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
        if kind == "nochoice":   # only the usage chunk: no event with choices
            send({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "scripted", "choices": [],
                  "usage": {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}})
            return send(b"[DONE]")
        if kind == "zero":
            send(chunk("", 0, "stop"))
            send({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "scripted", "choices": [],
                  "usage": {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}})
            return send(b"[DONE]")
        if kind == "silent":
            for k in (1, 2, 2, 2):
                send(chunk("", k))
                time.sleep(GAP_S)
            send({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "scripted", "choices": [],
                  "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}})
            return send(b"[DONE]")
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
    # the server sleeps GAP_S between events; the client reads each when its thread runs, so one read late shortens
    # the next gap as much as it lengthens its own (seen: a 0.04997 s gap on a loaded machine): the mean holds
    assert lv["ttft_s"]["min"] >= FIRST_S and lv["event_gap_s"]["min"] >= GAP_S / 2
    assert lv["event_gap_s"]["mean"] >= 0.9 * GAP_S
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
                                       ("nochoice", "the stream carried no event with choices"),
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
                                         (["--base-url", "ftp://x"], "--base-url"),
                                         (["--goodput", "ttft"], "--goodput: 'ttft': each objective is KEY:MILLI"),
                                         (["--goodput", "itl:5"], "--goodput: 'itl:5': each objective is KEY:"),
                                         (["--goodput", "ttft:-1"], "'ttft:-1': the milliseconds must be a finite"),
                                         (["--goodput", "e2el:nan"], "'e2el:nan': the milliseconds must be a fini"),
                                         (["--goodput", "tpot:inf"], "'tpot:inf': the milliseconds must be a fini"),
                                         (["--goodput", "ttft:1", "--goodput", "tpot:2,ttft:3"],
                                          "--goodput: ttft is given twice (1 and 3 ms)")])
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


def _sent(i, times, end, tokens, error=None, first_choice=None):
    """A request as send() leaves it: its events, and its first event with choices (by default the first event)."""
    from dflash2_trt.bench.serve import Sent

    s = Sent(i, i, start=0.0, end=end, completion_tokens=tokens, prompt_tokens=5, error=error)
    s.events = [(t, n, "x") for t, n in times]
    s.first_choice = times[0][0] if first_choice is None else first_choice
    return s


def test_goodput_counts_the_requests_that_meet_every_objective():
    """vLLM's rule (vllm/benchmarks/serve.py, calculate_metrics): a completed request is good when each objective
    given is met (<=), TPOT being (latency - TTFT) / (tokens - 1) and 0 for a one-token output; failed requests are
    never good; goodput = good / wall."""
    from dflash2_trt.bench.serve import level_metrics, parse_goodput

    # ttft 0.1, tpot (0.3 - 0.1) / 2 = 0.1, e2el 0.3 | ttft 0.5, one token: tpot 0, e2el 0.6 | failed
    sent = [_sent(0, [(0.1, 1), (0.2, 2)], 0.3, 3), _sent(1, [(0.5, 1)], 0.6, 1),
            _sent(2, [(0.01, 1)], 0.02, 1, error="HTTP 500")]

    def good(*slo):
        lv = level_metrics(sent, 2.0, concurrency=1, dataset_lens=[None] * 3, rate_limited=False,
                           goodput=parse_goodput(slo))
        return lv["goodput"] and (lv["goodput"]["good"], lv["goodput"]["requests_per_s"])

    assert good() is None and parse_goodput("ttft:200,e2el:1") == {"ttft": 200.0, "e2el": 1.0}   # a string: one
    assert parse_goodput(["ttft:200 e2el:1", "tpot:5"]) == {"ttft": 200.0, "e2el": 1.0, "tpot": 5.0}   # vLLM's spaces
    assert parse_goodput("ttft: 200,\te2el :1") == {"ttft": 200.0, "e2el": 1.0}    # spaces about a colon: one
    with pytest.raises(ConfigError, match="--goodput: '': each objective is KEY:MILLISECONDS"):
        parse_goodput("ttft:200,,e2el:1")
    assert good("ttft:200") == (1, 0.5) and good("tpot:50") == (1, 0.5) and good("e2el:300") == (1, 0.5)
    assert good("ttft:600,tpot:100", "e2el:600") == (2, 1.0) and good("ttft:0") == (0, 0.0)
    assert good("tpot:99") == (1, 0.5)   # the one-token request's 0 meets any objective
    # a figure the server did not give: no count, and why
    sent[0].completion_tokens = None
    lv = level_metrics(sent, 2.0, concurrency=1, dataset_lens=[None] * 3, rate_limited=False,
                       goodput={"tpot": 1e6})
    assert lv["goodput"]["good"] is None and "task 0 came back without a token count" in lv["goodput"]["unknown"]
    assert good("ttft:600") == (2, 1.0)   # ttft needs no count


def test_goodput_times_ttft_as_the_report_does():
    """TTFT is ttft_s's, the first token-carrying event, even after an earlier event with choices (a chat's role
    event: vLLM's TTFT); only a request without a token-carrying event is timed from its first event with choices."""
    from dflash2_trt.bench.serve import level_metrics

    role_first = _sent(0, [(0.2, 1)], 0.3, 1, first_choice=0.01)     # role event at 10 ms, the token at 200 ms
    silent = _sent(1, [(0.05, 0)], 0.3, 3)                           # text that decoded to nothing, 3 tokens
    for s, good in ((role_first, 0), (silent, 1)):
        lv = level_metrics([s], 1.0, concurrency=1, dataset_lens=[None], rate_limited=False, goodput={"ttft": 100})
        assert lv["goodput"]["good"] == good, s
    lv = level_metrics([silent], 1.0, concurrency=1, dataset_lens=[None], rate_limited=False, goodput={"tpot": 124})
    assert lv["goodput"]["good"] == 0 and lv["ttft_s"] is None       # (0.3 - 0.05) / 2 = 125 ms


def test_goodput_on_the_command_line(server, tmp_path):
    code, text, doc = _load(server, tmp_path, ["ok", "ok"], "--goodput", "ttft:60000,tpot:60000", "--goodput",
                            "e2el:60000")
    assert code == 0, text
    assert doc["settings"]["goodput_ms"] == {"ttft": 60000.0, "tpot": 60000.0, "e2el": 60000.0}
    lv = doc["levels"][0]
    assert lv["goodput"]["good"] == 2 and lv["goodput"]["requests_per_s"] == pytest.approx(2 / lv["wall_s"])
    assert "good 2/2 (" in text and "good = completed requests with ttft <= 60000 ms" in text
    code, text, doc = _load(server, tmp_path, ["ok", "ok"], "--goodput", f"ttft:{FIRST_S * 1000 / 2}")
    assert code == 0 and doc["levels"][0]["goodput"]["good"] == 0 and "good 0/2 (" in text, text
    code, text, doc = _load(server, tmp_path, ["ok"])
    assert doc["levels"][0]["goodput"] is None and doc["settings"]["goodput_ms"] is None and " good " not in text


def test_goodput_of_requests_without_a_timed_token(server, tmp_path):
    """vLLM times TTFT from the first event with choices: a request whose text decoded to nothing (silent) or that
    gave no token (zero) is judged from that event, not left unknown (nor a traceback: the TPOT of a request with
    tokens but no timed event)."""
    for slo in ("e2el:60000", "ttft:60000,tpot:60000,e2el:60000"):
        code, text, doc = _load(server, tmp_path, ["silent", "zero"], "--goodput", slo)
        lv = doc and doc["levels"][0]
        assert code == 0 and lv["goodput"] == {"good": 2, "requests_per_s": 2 / lv["wall_s"], "unknown": None}, text
        assert lv["output_tokens"] == 7 and lv["ttft_s"] is None   # no event carried a token the client could time
    code, text, doc = _load(server, tmp_path, ["silent"], "--goodput", f"ttft:{FIRST_S * 1000 / 2}")
    assert code == 0 and doc["levels"][0]["goodput"]["good"] == 0, text   # its first event came after FIRST_S


def test_a_model_the_server_does_not_list_is_blamed_on_model(server, tmp_path):
    line = one_error_line(*_load(server, tmp_path, ["ok"], "--model", "nope")[:2])
    assert line.startswith("error: --model: ") and "`nope` does not exist" in line


class Counting(Handler):
    posts = 0

    def do_POST(self):
        type(self).posts += 1
        super().do_POST()


def test_the_served_row_is_said_before_the_baseline_pass(server, tmp_path):
    """With a baseline, a level's served row is said as soon as its pass ends, before the baseline is sent a request
    of the level: a stop during the baseline's pass keeps it on the screen (it was said with the baseline's row)."""
    from dflash2_trt.bench.serve import bench_serve, render_level

    srv = _serve(Counting)
    ds = tmp_path / "ds.jsonl"
    ds.write_text('{"prompt": "ok x", "output_tokens": 7}\n')
    said = []
    try:
        doc = bench_serve(base_url=server, dataset=ds, concurrency="1,2",
                          baseline_url=f"http://127.0.0.1:{srv.server_address[1]}",
                          on_level=lambda lv, part: said.append((lv["concurrency"], part, Counting.posts,
                                                                 render_level(lv, part))))
    finally:
        srv.shutdown()
        srv.server_close()
    # the baseline's posts when each part was said: its probe only, then one per level's request
    assert [x[:3] for x in said] == [(1, "served", 1), (1, "baseline", 2), (2, "served", 2), (2, "baseline", 3)]
    baseline_rows = said[1][3].splitlines()
    assert said[0][3].split()[1] == "served" and len(baseline_rows) == 2
    assert baseline_rows[0].split()[1] == "baseline" and baseline_rows[1].split()[0] == "speedup"
    assert render_level(doc["levels"][0]) == said[0][3] + "\n" + said[1][3]


def test_the_model_list_waits_the_timeout(tmp_path):
    """A server that takes the connection and never answers GET /v1/models: the command ends after --timeout with
    one line, not after a fixed wait."""
    import socket

    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(4)   # connections are taken by the kernel and never answered
    ds = tmp_path / "ds.jsonl"
    ds.write_text('{"prompt": "ok x"}\n')
    try:
        t0 = time.monotonic()
        line = one_error_line(*cli("bench", "serve", "--base-url", f"http://127.0.0.1:{lsn.getsockname()[1]}",
                                   "--dataset", str(ds), "--timeout", "1", "--no-progress"))
        took = time.monotonic() - t0
    finally:
        lsn.close()
    assert line.startswith("error: --base-url: no OpenAI-compatible server answers") and "timed out" in line, line
    assert took < 10, took
