"""``serve --openai-port P``: an OpenAI-compatible HTTP API in front of the Triton ensemble.

What vLLM's and TensorRT-LLM's own servers (``vllm serve``, ``trtllm-serve``) give a client: ``GET /v1/models``,
``POST /v1/completions`` and ``POST /v1/chat/completions``, streamed (server-sent events, ``data: [DONE]`` last) or
not, with ``usage``. Each request becomes one request of the ensemble on Triton's HTTP generate endpoints
(``/v2/models/ENSEMBLE/generate`` or ``/generate_stream``): the ensemble tokenizes, the engine decodes (in-flight
batching with every other request), the ensemble detokenizes. A chat request's messages are first rendered by the
engine's own tokenizer (its chat template, the assistant's turn opened, ``chat_template_kwargs`` as vLLM takes them).

Defaults are the OpenAI API's: ``temperature`` 1 (send 0 for greedy: the engine is lossless at both), ``max_tokens``
16 for a completion and, for a chat completion, what the engine's ``max_seq_len`` leaves after the rendered prompt.
What the engine cannot do is refused by name with HTTP 400 in OpenAI's error shape (``n`` > 1, log-probabilities,
penalties, tools, stop sequences, ``top_p`` other than 1: the ensemble's own message), never ignored.
``finish_reason`` is ``length`` when the output reached ``max_tokens``, else ``stop`` (the end token).

Stdlib only (``http.server`` threads, ``http.client``): it runs in the ``serve`` process beside tritonserver's
supervision, stops listening first when ``serve`` stops, and lets the requests in flight end as Triton drains them.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ...errors import ConfigError

MAX_BODY = 16 << 20
"""A request body larger than this (bytes) is refused before it is read."""
TRITON_TIMEOUT_S = 3600.0
"""How long one request may wait on Triton (a long generation at a high concurrency can take minutes)."""

COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "stream_options", "n", "user",
          "stop", "presence_penalty", "frequency_penalty", "logprobs", "logit_bias"}
COMPLETION = COMMON | {"prompt", "echo", "best_of", "suffix"}
CHAT = COMMON | {"messages", "max_completion_tokens", "chat_template_kwargs", "top_logprobs"}
# fields a client may send at their neutral value only (what the engine does anyway)
NEUTRAL = {"n": (1,), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logprobs": (None, False),
           "top_logprobs": (None, 0), "logit_bias": (None, {}), "echo": (False,), "best_of": (1,), "suffix": (None,),
           "stop": (None, [])}
WHY_NOT = {"n": "one choice per request", "presence_penalty": "no penalties (the engine is lossless to the target)",
           "frequency_penalty": "no penalties (the engine is lossless to the target)",
           "logprobs": "no log-probabilities", "top_logprobs": "no log-probabilities", "logit_bias": "no logit bias",
           "echo": "no echo of the prompt", "best_of": "one candidate per request", "suffix": "no suffix",
           "stop": "no stop sequences (the model stops at its end token)"}
COMPLETION_DEFAULT_MAX_TOKENS = 16   # the OpenAI API's default for /v1/completions


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def _int(body: dict, key: str, lo: int, default=None):
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ApiError(400, f"{key} must be an integer >= {lo}, got {json.dumps(v)}", key)
    return v


def _number(body: dict, key: str, default):
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        raise ApiError(400, f"{key} must be a finite number >= 0, got {json.dumps(v)}", key)
    return float(v)


def _message_text(m, i: int) -> dict:
    """One chat message as the template takes it: ``{"role", "content"}`` with text content (a string, or a list of
    ``{"type": "text", "text"}`` parts, joined)."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ApiError(400, f"messages[{i}] must be an object with a string role", "messages")
    c = m.get("content")
    if isinstance(c, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in c):
            raise ApiError(400, f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) are "
                                f"supported", "messages")
        c = "".join(p["text"] for p in c)
    if not isinstance(c, str):
        raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", "messages")
    extra = sorted(set(m) - {"role", "content", "name"})
    if extra:
        raise ApiError(400, f"messages[{i}].{extra[0]}: not supported (text messages only)", "messages")
    return {**{k: v for k, v in m.items() if k == "name"}, "role": m["role"], "content": c}


class OpenAIFrontend:
    """The API on ``host:port``, forwarding to the ensemble ``ensemble`` of the tritonserver at ``triton`` (its HTTP
    ``host:port``). ``model``: the id clients name (``GET /v1/models``); ``tokenizer``: the engine's tokenizer
    (chat templates, prompt lengths) or None (chat completions refused); ``max_seq_len``: the engine's limit (a chat
    completion's default ``max_tokens``)."""

    def __init__(self, triton: str, *, ensemble: str, model: str, tokenizer=None, max_seq_len: int | None = None,
                 host: str = "127.0.0.1", port: int = 0):
        self.triton_host, _, tport = triton.rpartition(":")
        self.triton_port = int(tport)
        self.ensemble, self.model, self.tokenizer, self.max_seq_len = ensemble, model, tokenizer, max_seq_len
        self.created = int(time.time())
        front = self

        class Handler(_Handler):
            frontend = front

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{self.httpd.server_address[0]}:{self.port}"

    def start(self) -> "OpenAIFrontend":
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="openai-api", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening (a request in flight ends on its own thread as Triton answers it)."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self.httpd.server_close()

    # ---- requests -------------------------------------------------------------------------------------------------
    def triton_request(self, body: dict, *, chat: bool) -> tuple[dict, bool, bool]:
        """(the ensemble's JSON request, stream, include_usage) for an OpenAI request body."""
        allowed = CHAT if chat else COMPLETION
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise ApiError(400, f"{unknown[0]}: not a field this server takes (supported: {', '.join(sorted(allowed))})",
                           unknown[0])
        for key, neutral in NEUTRAL.items():
            if key in body and body[key] not in neutral:
                raise ApiError(400, f"{key} {json.dumps(body[key])}: not supported ({WHY_NOT[key]})", key)
        model = body.get("model")
        if model is not None and model != self.model:
            raise ApiError(404, f"the model {json.dumps(model)} does not exist; this server serves {self.model!r}",
                           "model", "not_found_error")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, f"stream must be true or false, got {json.dumps(stream)}", "stream")
        opts = body.get("stream_options")
        if opts is not None and (not isinstance(opts, dict) or set(opts) - {"include_usage"}
                                 or not isinstance(opts.get("include_usage", False), bool)):
            raise ApiError(400, "stream_options must be {\"include_usage\": true|false}", "stream_options")
        include_usage = bool((opts or {}).get("include_usage", False))
        if opts is not None and not stream:
            raise ApiError(400, "stream_options applies to stream: true", "stream_options")
        if chat:
            text = self.render(body)
            if "max_tokens" in body and "max_completion_tokens" in body:
                raise ApiError(400, "give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
            key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
            max_tokens = _int(body, key, 1)
            if max_tokens is None:
                max_tokens = self.room_after(text)
        else:
            text = body.get("prompt")
            if isinstance(text, list) and len(text) == 1:
                text = text[0]
            if not isinstance(text, str):
                raise ApiError(400, "prompt must be a string (or a list of one string; token ids are not taken here)",
                               "prompt")
            max_tokens = _int(body, "max_tokens", 1, COMPLETION_DEFAULT_MAX_TOKENS)
        req = {"text_input": text, "max_tokens": max_tokens, "temperature": _number(body, "temperature", 1.0),
               "stream": stream, "exclude_input_in_output": True, "return_num_input_tokens": True,
               "return_num_output_tokens": True}
        if body.get("top_p") is not None:
            req["top_p"] = _number(body, "top_p", 1.0)   # the ensemble takes 1 (or 0) and refuses others by name
        if body.get("top_k") is not None:
            req["top_k"] = _int(body, "top_k", 0)
        if body.get("seed") is not None:
            req["seed"] = _int(body, "seed", 0)
        return req, stream, include_usage

    def render(self, body: dict) -> str:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "messages must be a non-empty list", "messages")
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ApiError(400, "chat_template_kwargs must be an object", "chat_template_kwargs")
        if self.tokenizer is None:
            raise ApiError(400, "this server has no tokenizer for chat templates: use /v1/completions", "messages")
        from ...tokenizer import render_messages

        try:
            return render_messages(self.tokenizer, [_message_text(m, i) for i, m in enumerate(msgs)], kwargs,
                                   advice="use /v1/completions with the rendered text")
        except ConfigError as exc:
            raise ApiError(400, str(exc), "messages") from None

    def room_after(self, text: str) -> int:
        """A chat completion's default ``max_tokens``: what ``max_seq_len`` leaves after the prompt's tokens (16 where
        the engine's limit is unknown)."""
        if self.max_seq_len is None or self.tokenizer is None:
            return COMPLETION_DEFAULT_MAX_TOKENS
        n = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if n >= self.max_seq_len:
            raise ApiError(400, f"the rendered prompt is {n} tokens, at or over the engine's max_seq_len "
                                f"{self.max_seq_len}", "messages")
        return self.max_seq_len - n

    def post_triton(self, req: dict):
        """The open HTTP response of Triton's generate (or generate_stream) endpoint for ``req``; an error status
        becomes an :class:`ApiError` with Triton's message (400: the request's fault, named by the ensemble)."""
        conn = http.client.HTTPConnection(self.triton_host, self.triton_port, timeout=TRITON_TIMEOUT_S)
        path = f"/v2/models/{self.ensemble}/{'generate_stream' if req['stream'] else 'generate'}"
        try:
            conn.request("POST", path, json.dumps(req), {"Content-Type": "application/json"})
            r = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise ApiError(503, f"the Triton server does not answer ({exc})", kind="server_error") from None
        if r.status != 200:
            text = r.read().decode("utf-8", "replace")
            conn.close()
            try:
                message = json.loads(text).get("error", text)
            except ValueError:
                message = text
            status = 400 if r.status == 400 else 503 if r.status == 503 else 500
            raise ApiError(status, str(message), kind="invalid_request_error" if status == 400 else "server_error")
        return conn, r


def _events(r):
    """The JSON events of a Triton server-sent-events response (an ``error`` event raises)."""
    for line in r:
        if not line.startswith(b"data: "):
            continue
        ev = json.loads(line[len(b"data: "):])
        if "error" in ev:
            raise ApiError(400 if "preprocessing:" in str(ev["error"]) else 500, str(ev["error"]),
                           kind="server_error")
        yield ev


def _count(ev, key: str) -> int:
    v = ev.get(key, 0)
    return int(v[0] if isinstance(v, list) else v)


class _Handler(BaseHTTPRequestHandler):
    frontend: OpenAIFrontend
    protocol_version = "HTTP/1.0"   # a stream ends when the connection closes (no chunked encoding needed)
    server_version = "dflash2-trt-openai"

    def log_message(self, fmt, *args):   # tritonserver keeps the request log; nothing on serve's terminal per request
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        f = self.frontend
        path = self.path.split("?", 1)[0]
        if path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": f.model, "object": "model", "created": f.created,
                                                         "owned_by": "dflash2-trt"}]})
        elif path in ("/health", "/v1/health"):
            self._json(200, {"status": "ok"})
        else:
            self._json(404, ApiError(404, f"no route {path} (GET /v1/models, POST /v1/completions, POST "
                                          f"/v1/chat/completions)", kind="not_found_error").body())

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._json(404, ApiError(404, f"no route {path} (POST /v1/completions, /v1/chat/completions)",
                                     kind="not_found_error").body())
            return
        chat = path == "/v1/chat/completions"
        try:
            length = int(self.headers.get("Content-Length") or -1)
            if not 0 <= length <= MAX_BODY:
                raise ApiError(400 if length < 0 else 413, "a JSON body with a Content-Length up to 16 MiB is needed")
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError as exc:
                raise ApiError(400, f"the body is not JSON ({exc})") from None
            if not isinstance(body, dict):
                raise ApiError(400, "the body must be a JSON object")
            req, stream, include_usage = self.frontend.triton_request(body, chat=chat)
            conn, r = self.frontend.post_triton(req)
        except ApiError as exc:
            self._json(exc.status, exc.body())
            return
        try:
            if stream:
                self._stream(r, chat, req["max_tokens"], include_usage)
            else:
                self._once(r, chat, req["max_tokens"])
        finally:
            conn.close()

    def _head(self, chat: bool, stream: bool) -> dict:
        kind = ("chat.completion" + (".chunk" if stream else "")) if chat else "text_completion"
        return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "object": kind,
                "created": int(time.time()), "model": self.frontend.model}

    def _once(self, r, chat: bool, max_tokens: int) -> None:
        ev = json.loads(r.read())
        text, n_in, n_out = ev.get("text_output", ""), _count(ev, "num_input_tokens"), _count(ev, "num_output_tokens")
        text = text[0] if isinstance(text, list) else text
        finish = "length" if n_out >= max_tokens else "stop"
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                   "finish_reason": finish} if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
        self._json(200, {**self._head(chat, False), "choices": [choice],
                         "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}})

    def _send_event(self, body) -> None:
        self.wfile.write(b"data: " + (body if isinstance(body, bytes) else json.dumps(body).encode()) + b"\n\n")
        self.wfile.flush()

    def _stream(self, r, chat: bool, max_tokens: int, include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        head = self._head(chat, True)
        n_in = n_out = 0

        def chunk(piece: str | None, finish: str | None) -> dict:
            if chat:
                delta = {} if piece is None else {"content": piece}
                return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            return {**head, "choices": [{"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}]}

        try:
            if chat:
                self._send_event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                       "logprobs": None, "finish_reason": None}]})
            for ev in _events(r):
                n_in = _count(ev, "num_input_tokens") or n_in
                n_out += _count(ev, "num_output_tokens")
                piece = ev.get("text_output", "")
                piece = piece[0] if isinstance(piece, list) else piece
                if piece:
                    self._send_event(chunk(piece, None))
            self._send_event(chunk(None, "length" if n_out >= max_tokens else "stop"))
            if include_usage:
                self._send_event({**head, "choices": [], "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                                                                   "total_tokens": n_in + n_out}})
        except ApiError as exc:   # Triton's error event mid-stream: said as the stream's last event
            self._send_event(exc.body())
        except OSError:           # the client went away: nothing more to say to it
            return
        try:
            self._send_event(b"[DONE]")
        except OSError:
            pass
