"""``serve --openai-port P``: an OpenAI-compatible HTTP API in front of the Triton ensemble.

What vLLM's and TensorRT-LLM's own servers (``vllm serve``, ``trtllm-serve``) give a client: ``GET /v1/models``,
``POST /v1/completions`` and ``POST /v1/chat/completions``, streamed (server-sent events, ``data: [DONE]`` last) or
not, with ``usage``. Each request becomes one request of the ensemble on Triton's HTTP generate endpoints
(``/v2/models/ENSEMBLE/generate`` or ``/generate_stream``): the ensemble tokenizes, the engine decodes (in-flight
batching with every other request), the ensemble detokenizes. A chat request's messages are first rendered by the
engine's own tokenizer (its chat template, the assistant's turn opened, ``chat_template_kwargs`` as vLLM takes them).

Defaults are the OpenAI API's: ``temperature`` 1 (send 0 for greedy: the engine is lossless at both), ``max_tokens``
16 for a completion and, for a chat completion, what the engine's ``max_seq_len`` leaves after the rendered prompt and
the step's draft slots (TensorRT-LLM's executor shortens a request past that, and so does the engine's model: such an
output ends with ``finish_reason`` ``length``). ``stop`` strings end the output where their tokens are generated (as
TensorRT-LLM matches stop words: on tokens) and are left out of the text, as the OpenAI API leaves them out.
What the engine cannot do is refused by name with HTTP 400 in OpenAI's error shape (``n`` > 1, log-probabilities,
penalties, tools, ``top_p`` other than 1), never ignored; fields that load tools send at their neutral values
(``repetition_penalty`` 1, ``ignore_eos``, ``tool_choice`` "none", ...) are taken.

Stdlib only (``http.server`` threads, ``http.client``): it runs in the ``serve`` process beside tritonserver's
supervision, stops listening first when ``serve`` stops, and lets the requests in flight end as Triton drains them.
"""

from __future__ import annotations

import http.client
import json
import math
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ...errors import ConfigError

MAX_BODY = 16 << 20
"""A request body larger than this (bytes) is refused before it is read."""
TRITON_TIMEOUT_S = 3600.0
"""How long one request may wait on Triton (a long generation at a high concurrency can take minutes)."""
CLIENT_TIMEOUT_S = 60.0
"""How long a client may take to send its request (a silent one holds no thread longer)."""
LISTEN_BACKLOG = 1024
"""Connections the kernel queues before the API accepts them (http.server's 5 refused a burst of load-tool clients)."""
INT32_MAX, UINT64_MAX = 2**31 - 1, 2**64 - 1
MAX_STOP = 16

# fields taken at any value, beside each endpoint's own (metadata the engine has no use for)
IGNORED = {"user", "metadata", "service_tier", "parallel_tool_calls", "store"}
COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "stream_options", "stop",
          "ignore_eos"} | IGNORED
COMPLETION = COMMON | {"prompt"}
CHAT = COMMON | {"messages", "max_completion_tokens", "chat_template_kwargs"}
# fields a client may send at their neutral value only (what the engine does anyway); None is every field's default
NEUTRAL = {"n": (1,), "best_of": (1,), "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,),
           "min_tokens": (0,), "min_p": (0,), "logprobs": (False,), "top_logprobs": (0,), "logit_bias": ({},),
           "echo": (False,), "suffix": ("",), "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,),
           "include_stop_str_in_output": (False,), "tools": ([],), "tool_choice": ("none",),
           "response_format": ({"type": "text"},), "add_generation_prompt": (True,), "continue_final_message": (False,)}
WHY_NOT = {"n": "one choice per request", "best_of": "one candidate per request",
           "presence_penalty": "no penalties: the engine is lossless to the target",
           "frequency_penalty": "no penalties: the engine is lossless to the target",
           "repetition_penalty": "no penalties: the engine is lossless to the target",
           "min_tokens": "no minimum length", "min_p": "the engine samples the whole distribution",
           "logprobs": "no log-probabilities", "top_logprobs": "no log-probabilities", "logit_bias": "no logit bias",
           "echo": "no echo of the prompt", "suffix": "no suffix",
           "skip_special_tokens": "the ensemble's postprocessing skips special tokens",
           "spaces_between_special_tokens": "the ensemble's postprocessing decodes as its tokenizer does",
           "include_stop_str_in_output": "stop strings are left out of the text", "tools": "no tools",
           "tool_choice": "no tools", "response_format": "plain text only",
           "add_generation_prompt": "the assistant's turn is always opened",
           "continue_final_message": "the assistant's turn is always a new one"}
COMPLETION_NEUTRAL = {"n", "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
                      "min_p", "logprobs", "logit_bias", "echo", "suffix", "skip_special_tokens",
                      "spaces_between_special_tokens", "include_stop_str_in_output"}
CHAT_NEUTRAL = set(NEUTRAL) - {"best_of", "echo", "suffix"}
COMPLETION_DEFAULT_MAX_TOKENS = 16   # the OpenAI API's default for /v1/completions


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def triton_error(message: str, status: int) -> ApiError:
    """Triton's error (HTTP ``status``, or an error event of a stream: 400) as the API's: a request the server, shutting
    down, ended or refused is 503 (a client may retry it elsewhere), the request's own fault 400, anything else 500."""
    if "shutting down" in message or status == 503:
        return ApiError(503, message)
    return ApiError(400 if status == 400 else 500, message)


def _same(v, neutral) -> bool:
    """``v`` is the neutral value: booleans only as themselves (a completion's ``logprobs`` 0 asks for the chosen
    token's log-probability, it is not ``false``), numbers by value (``1.0`` is ``1``), anything else by equality."""
    if isinstance(v, bool) or isinstance(neutral, bool):
        return v is neutral
    return v == neutral


def _int(body: dict, key: str, lo: int, hi: int, default=None):
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ApiError(400, f"{key} must be an integer in [{lo}, {hi}], got {json.dumps(v)}", key)
    return v


def _number(body: dict, key: str, default: float, *, lo: float = 0.0, lo_open: bool = False, hi=None):
    v = body.get(key)
    if v is None:
        return default
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > lo if lo_open
                                                                                          else v >= lo)
    if not ok or (hi is not None and v > hi):
        span = f"in ({lo:g}, {hi:g}]" if lo_open else f">= {lo:g}" if hi is None else f"in [{lo:g}, {hi:g}]"
        raise ApiError(400, f"{key} must be a finite number {span}, got {json.dumps(v)}", key)
    return float(v)


def _stops(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    v = [v] if isinstance(v, str) else v
    if not isinstance(v, list) or len(v) > MAX_STOP or not all(isinstance(s, str) and s for s in v):
        raise ApiError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    return list(dict.fromkeys(v))


def _message_text(m, i: int) -> dict:
    """One chat message as the template takes it: ``{"role", "content"}`` with text content (a string, or a list of
    ``{"type": "text", "text"}`` parts, joined by newlines as vLLM joins them)."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ApiError(400, f"messages[{i}] must be an object with a string role", "messages")
    c = m.get("content")
    if isinstance(c, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in c):
            raise ApiError(400, f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) are "
                                f"supported", "messages")
        c = "\n".join(p["text"] for p in c)
    if not isinstance(c, str):
        raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", "messages")
    extra = sorted(set(m) - {"role", "content", "name"})
    if extra:
        raise ApiError(400, f"messages[{i}].{extra[0]}: not supported (text messages only)", "messages")
    return {**{k: v for k, v in m.items() if k == "name"}, "role": m["role"], "content": c}


class Plan:
    """One API request as the ensemble gets it and as its answer is shaped. ``stops``: the texts the output may end
    with where a stop string's tokens ended it, in the order they are tried: the strings themselves, then their
    tokens' decoded texts (what the engine matched, where the two differ)."""

    def __init__(self, triton: dict, *, chat: bool, stops: list[str], include_usage: bool, continuous_usage: bool):
        self.triton, self.chat, self.stops = triton, chat, stops
        self.include_usage, self.continuous_usage = include_usage, continuous_usage

    @property
    def stream(self) -> bool:
        return self.triton["stream"]


class OpenAIFrontend:
    """The API on ``host:port``, forwarding to the ensemble ``ensemble`` of the tritonserver at ``triton`` (its HTTP
    ``host:port``). ``model``: the id clients name (``GET /v1/models``); ``tokenizer``: the engine's tokenizer
    (chat templates, prompt lengths) or None (chat completions refused); ``max_seq_len`` and ``block_size``: the
    engine's (a chat completion's default ``max_tokens``, and when an output was shortened to fit)."""

    def __init__(self, triton: str, *, ensemble: str, model: str, tokenizer=None, max_seq_len: int | None = None,
                 block_size: int | None = None, host: str = "127.0.0.1", port: int = 0):
        self.triton_host, _, tport = triton.rpartition(":")
        self.triton_port = int(tport)
        self.ensemble, self.model, self.tokenizer = ensemble, model, tokenizer
        self.max_seq_len, self.block_size = max_seq_len, block_size
        self.created = int(time.time())
        front = self

        class Handler(_Handler):
            frontend = front

        self.httpd = _Server((host, port), Handler)
        self.port = self.httpd.server_address[1]
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def url(self) -> str:
        return f"{self.httpd.server_address[0]}:{self.port}"

    def start(self) -> "OpenAIFrontend":
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="openai-api", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening (a request in flight ends on its own thread as Triton answers it); once."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
        self.httpd.server_close()

    # ---- requests -------------------------------------------------------------------------------------------------
    def plan(self, body: dict, *, chat: bool) -> Plan:
        """The ensemble's JSON request and the answer's shape for an OpenAI request body."""
        own, neutral = (CHAT, CHAT_NEUTRAL) if chat else (COMPLETION, COMPLETION_NEUTRAL)
        body = {k: v for k, v in body.items() if v is not None}   # null: the field's default, whatever the field
        unknown = sorted(set(body) - own - neutral)
        if unknown:
            raise ApiError(400, f"{unknown[0]}: not a field this server takes (it takes: "
                                f"{', '.join(sorted(own | neutral))})", unknown[0])
        for key in sorted(neutral & set(body)):
            v = body[key]
            if v is not None and not any(_same(v, n) for n in NEUTRAL[key]):
                raise ApiError(400, f"{key} {json.dumps(v)}: not supported ({WHY_NOT[key]})", key)
        model = body.get("model")
        if model is not None and model != self.model:
            raise ApiError(404, f"the model {json.dumps(model)} does not exist; this server serves {self.model!r}",
                           "model", "not_found_error")
        stream = body.get("stream")
        stream = False if stream is None else stream
        if not isinstance(stream, bool):
            raise ApiError(400, f"stream must be true or false, got {json.dumps(stream)}", "stream")
        opts = body.get("stream_options")
        keys = {"include_usage", "continuous_usage_stats"}
        if opts is not None and (not isinstance(opts, dict) or set(opts) - keys
                                 or not all(isinstance(opts[k], bool) for k in opts)):
            raise ApiError(400, "stream_options must be {\"include_usage\": bool, \"continuous_usage_stats\": bool}",
                           "stream_options")
        if opts is not None and not stream:
            raise ApiError(400, "stream_options applies to stream: true", "stream_options")
        ignore_eos = body.get("ignore_eos")
        if ignore_eos is not None and not isinstance(ignore_eos, bool):
            raise ApiError(400, f"ignore_eos must be true or false, got {json.dumps(ignore_eos)}", "ignore_eos")
        if chat:
            text = self.render(body)
            # vLLM's rule: max_completion_tokens (the current name) wins over max_tokens (the deprecated one)
            key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
            max_tokens = _int(body, key, 1, INT32_MAX)
            if max_tokens is None:
                max_tokens = self.room_after(text)
        else:
            text = body.get("prompt")
            if isinstance(text, list) and len(text) == 1:
                text = text[0]
            if not isinstance(text, str):
                raise ApiError(400, "prompt must be a string (or a list of one string; token ids are not taken here)",
                               "prompt")
            max_tokens = _int(body, "max_tokens", 1, INT32_MAX, COMPLETION_DEFAULT_MAX_TOKENS)
        req = {"text_input": text, "max_tokens": max_tokens, "temperature": _number(body, "temperature", 1.0),
               "stream": stream, "exclude_input_in_output": True, "return_num_input_tokens": True,
               "return_num_output_tokens": True}
        if body.get("top_p") is not None:   # the ensemble samples the whole distribution: top_p 1 only
            req["top_p"] = _number(body, "top_p", 1.0, lo_open=True, hi=1.0)
        if body.get("top_k") is not None:   # -1 (vLLM) and 0: the whole distribution; 1: greedy; others refused there
            top_k = _int(body, "top_k", -1, INT32_MAX)
            req["top_k"] = 0 if top_k == -1 else top_k
        if body.get("seed") is not None:
            req["seed"] = _int(body, "seed", 0, UINT64_MAX)
        stops = _stops(body)
        if stops:
            req["stop_words"] = stops
            stops = self.stop_texts(stops)
        if ignore_eos:
            req["end_id"] = -1   # no end token: the request runs to its length (or a stop string)
        return Plan(req, chat=chat, stops=stops, include_usage=bool((opts or {}).get("include_usage")),
                    continuous_usage=bool((opts or {}).get("continuous_usage_stats")))

    def stop_texts(self, stops: list[str]) -> list[str]:
        """What an output a stop string ended can end with, in the order :func:`strip_stop` tries them: the strings
        (longest first; the OpenAI API leaves exactly the string out), then the texts their tokens decode to (the
        engine matches the tokens: ``"guzo\\n"`` ends an output with ``" guzo"``)."""
        decoded = set()
        if self.tokenizer is not None:
            for s in stops:
                try:
                    decoded.add(self.tokenizer.decode(self.tokenizer(s, add_special_tokens=False)["input_ids"]))
                except Exception:  # noqa: BLE001 - a string the tokenizer cannot take: the ensemble refuses it by name
                    pass
        return (sorted(stops, key=len, reverse=True)
                + sorted((t for t in decoded - set(stops) if t), key=len, reverse=True))

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
        """A chat completion's default ``max_tokens``: what ``max_seq_len`` leaves after the prompt's tokens and the
        step's draft slots (16 where the engine's limit is unknown)."""
        if self.max_seq_len is None or self.tokenizer is None:
            return COMPLETION_DEFAULT_MAX_TOKENS
        from ...tokenizer import encode_text

        try:
            n = len(encode_text(self.tokenizer, text, field="messages"))
        except ConfigError as exc:   # a word the tokenizer cannot take: named, as the ensemble would name it
            raise ApiError(400, str(exc), "messages") from None
        room = self.max_seq_len - n - (self.block_size or 0)
        if room < 1:
            raise ApiError(400, f"the rendered prompt is {n} tokens: with the engine step's {self.block_size or 0} "
                                f"draft slots it leaves no room under the engine's max_seq_len {self.max_seq_len}",
                           "messages")
        return room

    def cap(self, max_tokens: int, n_in: int) -> int:
        """The output length a request of ``max_tokens`` new tokens after ``n_in`` prompt tokens can reach (the engine
        shortens one past what ``max_seq_len`` leaves beside the prompt and the draft slots, as TensorRT-LLM's
        executor does)."""
        if self.max_seq_len is None or not n_in:
            return max_tokens
        room = self.max_seq_len - n_in - (self.block_size or 0)
        return min(max_tokens, room) if room >= 1 else max_tokens

    def triton_ready(self) -> bool:
        conn = http.client.HTTPConnection(self.triton_host, self.triton_port, timeout=5)
        try:
            conn.request("GET", "/v2/health/ready")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def post_triton(self, req: dict):
        """The open HTTP response of Triton's generate (or generate_stream) endpoint for ``req``; an error status
        becomes an :class:`ApiError` with Triton's message."""
        conn = http.client.HTTPConnection(self.triton_host, self.triton_port, timeout=TRITON_TIMEOUT_S)
        path = f"/v2/models/{self.ensemble}/{'generate_stream' if req['stream'] else 'generate'}"
        try:
            conn.request("POST", path, json.dumps(req), {"Content-Type": "application/json"})
            r = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise ApiError(503, f"the Triton server does not answer ({exc})") from None
        if r.status != 200:
            text = r.read().decode("utf-8", "replace").strip()
            conn.close()
            if text.startswith("data: "):   # generate_stream frames its error as an event
                text = text[len("data: "):]
            try:
                message = json.loads(text).get("error", text)
            except (ValueError, AttributeError):
                message = text
            raise triton_error(str(message), r.status)
        return conn, r


class _Server(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):   # a client that went away or went silent
            return
        print(f"openai api: {type(exc).__name__}: {exc} (a request from {client_address[0]}:{client_address[1]})",
              file=sys.stderr, flush=True)


CUT = "the Triton server ended the response before it was complete"


def _events(r):
    """The JSON events of a Triton server-sent-events response (an ``error`` event raises). A stream Triton cut off
    (its chunked body ended without its last chunk, or its connection failed) raises 503: ``http.client`` ends such a
    body as if it were complete."""
    try:
        for line in r:
            if not line.startswith(b"data: "):
                continue
            ev = json.loads(line[len(b"data: "):])
            if "error" in ev:
                raise triton_error(str(ev["error"]), 400 if "preprocessing:" in str(ev["error"]) else 500)
            yield ev
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ApiError(503, f"{CUT} ({type(exc).__name__}: {exc})") from None
    if getattr(r, "chunked", False) and getattr(r, "chunk_left", None) is not None:
        raise ApiError(503, CUT)


def _read_whole(r) -> dict:
    """A non-streamed Triton response's JSON (a cut or failed one: 503)."""
    try:
        return json.loads(r.read())
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ApiError(503, f"{CUT} ({type(exc).__name__}: {exc})") from None


def _count(ev, key: str) -> int:
    v = ev.get(key, 0)
    return int(v[0] if isinstance(v, list) else v)


def _piece(ev) -> str:
    v = ev.get("text_output", "")
    return v[0] if isinstance(v, list) else v


def strip_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` without the first of ``stops`` it ends with (:meth:`OpenAIFrontend.stop_texts`' order), and whether it
    ended with one."""
    hit = next((s for s in stops if text.endswith(s)), None)
    return (text, False) if hit is None else (text[:-len(hit)], True)


class _Handler(BaseHTTPRequestHandler):
    frontend: OpenAIFrontend
    protocol_version = "HTTP/1.0"   # a stream ends when the connection closes (no chunked encoding needed)
    server_version = "dflash2-trt-openai"
    timeout = CLIENT_TIMEOUT_S

    def log_message(self, fmt, *args):   # tritonserver keeps the request log; nothing on serve's terminal per request
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:   # the client went away: nothing to tell it
            pass

    def _not_here(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        known = path in ("/v1/models", "/health", "/v1/health", "/v1/completions", "/v1/chat/completions")
        if method == "HEAD":   # a HEAD response has no body
            try:
                self.send_response(405 if known else 404)
                self.end_headers()
            except OSError:
                pass
            return
        if known:
            self._json(405, ApiError(405, f"{method} {path}: not allowed (GET /v1/models, GET /health, POST "
                                          f"/v1/completions, POST /v1/chat/completions)").body())
        else:
            self._json(404, ApiError(404, f"no route {path} (GET /v1/models, GET /health, POST /v1/completions, "
                                          f"POST /v1/chat/completions)", kind="not_found_error").body())

    def do_HEAD(self):
        self._not_here("HEAD")

    def do_PUT(self):
        self._not_here("PUT")

    def do_DELETE(self):
        self._not_here("DELETE")

    def do_PATCH(self):
        self._not_here("PATCH")

    def do_OPTIONS(self):
        self._not_here("OPTIONS")

    def do_GET(self):
        f = self.frontend
        path = self.path.split("?", 1)[0]
        if path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": f.model, "object": "model", "created": f.created,
                                                         "owned_by": "dflash2-trt"}]})
        elif path in ("/health", "/v1/health"):
            ready = f.triton_ready()
            self._json(200 if ready else 503, {"status": "ok"} if ready else
                       ApiError(503, "the Triton server is not ready").body())
        else:
            self._not_here("GET")

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._not_here("POST")
            return
        try:
            self._post(path == "/v1/chat/completions")
        except ApiError as exc:
            self._json(exc.status, exc.body())
        except (ConnectionError, TimeoutError):   # the client went away or went silent
            pass
        except Exception as exc:  # noqa: BLE001 - said to the client and on serve's terminal, never a dropped socket
            print(f"openai api: {self.command} {path}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            self._json(500, ApiError(500, f"internal error: {type(exc).__name__}: {exc}").body())

    def _post(self, chat: bool) -> None:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise ApiError(400, "a JSON body with a numeric Content-Length is needed") from None
        if not 0 <= length <= MAX_BODY:
            raise ApiError(413 if length > MAX_BODY else 400, f"Content-Length {length}: a body of at most 16 MiB")
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError as exc:
            raise ApiError(400, f"the body is not JSON ({exc})") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        plan = self.frontend.plan(body, chat=chat)
        conn, r = self.frontend.post_triton(plan.triton)
        try:
            if plan.stream:
                self._stream(r, plan)
            else:
                self._once(r, plan)
        finally:
            conn.close()

    def _head(self, chat: bool, stream: bool) -> dict:
        kind = ("chat.completion" + (".chunk" if stream else "")) if chat else "text_completion"
        return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "object": kind,
                "created": int(time.time()), "model": self.frontend.model}

    def _finish(self, plan: Plan, stopped: bool, n_in: int, n_out: int) -> str:
        if stopped:
            return "stop"
        return "length" if n_out >= self.frontend.cap(plan.triton["max_tokens"], n_in) else "stop"

    @staticmethod
    def _usage(n_in: int, n_out: int) -> dict:
        return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}

    def _once(self, r, plan: Plan) -> None:
        ev = _read_whole(r)
        n_in, n_out = _count(ev, "num_input_tokens"), _count(ev, "num_output_tokens")
        text, stopped = strip_stop(_piece(ev), plan.stops)
        finish = self._finish(plan, stopped, n_in, n_out)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                   "finish_reason": finish} if plan.chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
        self._json(200, {**self._head(plan.chat, False), "choices": [choice], "usage": self._usage(n_in, n_out)})

    def _send_event(self, body) -> None:
        self.wfile.write(b"data: " + (body if isinstance(body, bytes) else json.dumps(body).encode()) + b"\n\n")
        self.wfile.flush()

    def _stream(self, r, plan: Plan) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        head, chat = self._head(plan.chat, True), plan.chat
        n_in = n_out = 0
        # the text a stop string could still end: held back until the stream ends (the stop string is left out)
        hold = max(map(len, plan.stops), default=0)
        pending = ""

        def chunk(piece: str | None, finish: str | None) -> dict:
            c = ({**head, "choices": [{"index": 0, "delta": {} if piece is None else {"content": piece},
                                       "logprobs": None, "finish_reason": finish}]} if chat else
                 {**head, "choices": [{"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}]})
            if plan.continuous_usage:
                c["usage"] = self._usage(n_in, n_out)
            return c

        try:
            if chat:
                self._send_event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                       "logprobs": None, "finish_reason": None}]})
            for ev in _events(r):
                n_in = _count(ev, "num_input_tokens") or n_in
                n_out += _count(ev, "num_output_tokens")
                pending += _piece(ev)
                cut = len(pending) - hold
                if cut > 0:
                    self._send_event(chunk(pending[:cut], None))
                    pending = pending[cut:]
            pending, stopped = strip_stop(pending, plan.stops)
            if pending:
                self._send_event(chunk(pending, None))
            self._send_event(chunk(None, self._finish(plan, stopped, n_in, n_out)))
            if plan.include_usage:
                self._send_event({**head, "choices": [], "usage": self._usage(n_in, n_out)})
        except ApiError as exc:   # Triton's error event mid-stream: said as the stream's last event
            self._send_event(exc.body())
        self._send_event(b"[DONE]")
