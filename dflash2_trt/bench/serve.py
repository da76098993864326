"""``bench serve``: a load against a running OpenAI-compatible server, timed on the client.

What ``vllm bench serve`` measures, for this project's ``serve --openai-port`` and for any other server that speaks
the OpenAI API (vLLM's, trtllm-serve's, SGLang's), so one client, one dataset and one set of definitions compare
them. Every request is a streamed ``/v1/completions`` (``--chat``: ``/v1/chat/completions`` with the prompt as the
user's message), ``stream_options`` ``{"include_usage": true, "continuous_usage_stats": true}``: the server counts
the tokens (each event's ``usage.completion_tokens``), the client only reads the clock.

At each concurrency C (a level), C client threads send the dataset's requests in order, each thread one at a time
(closed loop, as ``bench run`` and ``vllm bench serve --max-concurrency``). With ``request_rate`` R the requests are
also due at seeded Poisson times (``burstiness`` b: gamma gaps of shape b and mean 1/R, vLLM's rule; b = 1 is
Poisson): a request is sent when it is due and a thread is free. Request i carries ``seed`` + i.

Definitions (every figure of a LEVEL; times in seconds, distributions ``{mean, std, p50, p90, p99, min, max}``
with :func:`.metrics.distribution`'s nearest-rank percentiles and population standard deviation):

- ``requests`` sent at the level by ``threads`` = min(C, requests) client threads; ``completed`` and ``failed``
  (``errors``: ``{task_id, error}`` of the first 10 failed).
- ``input_tokens`` / ``output_tokens``: the server's counts (``usage``) summed over the completed requests; null
  where some request came back without them, or none completed (``requests_without_usage``: the completed requests
  without an output token count).
- ``wall_s``: the first request sent to the last one finished; ``requests_per_s``, ``output_tokens_per_s`` and
  ``total_tokens_per_s`` (prompt + output) are over it, from the completed requests.
- ``ttft_s``: the request sent to the first event that carries an output token; ``latency_s``: sent to the stream's
  end (``data: [DONE]``); ``itl_s``: (latency - TTFT) / (output tokens - 1), requests of more than one token (what
  ``bench run`` and trtllm-bench call the inter-token latency, vLLM's TPOT).
- ``event_gap_s``: the time between two successive events that carry tokens, over every request (vLLM's ITL: with
  speculative decoding one event can carry several tokens).
- ``tokens_per_event``: output tokens per such event, leaving out each request's first (its prompt's step):
  ``{mean, events, histogram {tokens: events}}``. Where
  the server sends one event per engine step (``serve --openai-port`` does), its ``mean`` is the emitted acceptance
  length, the tokens each verify step gave the client (``bench run``'s ``acceptance.emitted_mean``); null where the
  server sends no per-event usage. An event whose text decodes to nothing is not sent by ``serve``, so the next
  carries both steps' tokens.
- ``queue_s`` (a ``request_rate`` only): how long a due request waited for a free thread.
- ``prompt_tokens_differ``: requests whose server-counted prompt tokens differ from the dataset's ``input_ids``
  (lines of ids are sent as the text the tokenizer decodes them to: the server tokenizes it again).
- ``goodput`` (with service-level objectives, ``--goodput ttft:MS,tpot:MS,e2el:MS``, vLLM's keys and rule in
  ``vllm/benchmarks/serve.py``): ``good``, the completed requests that meet every objective given (TTFT, TPOT =
  this module's per-request ITL, 0 for a one-token output, and latency each at most its milliseconds), and
  ``requests_per_s`` = good / ``wall_s``. TTFT is ``ttft_s``'s (the first token-carrying event); a request without
  one (no output; text that decoded to nothing, without per-event usage) is timed from its first event with
  choices, vLLM's TTFT for every request (which a chat's role-only event starts). Where a completed request came
  back without a token count, a ``tpot`` objective leaves ``good`` and ``requests_per_s`` null and ``unknown`` says
  which (vLLM counts its text's tokens instead). The level's ``goodput`` is null without objectives. A stream
  without any event with choices is a failed request, as in vLLM.

- ``outputs`` (``keep_outputs``, ``--save-outputs``): every request's ``{task_id, text, completion_tokens,
  finish_reason, error}``.

The report around the levels: ``endpoint``, ``model`` and ``served_models`` (what ``GET /v1/models`` listed), the
same for the ``baseline`` server, ``dataset``, ``settings`` (the options), and ``usage_per_event`` /
``usage_at_end``: whether the untimed first request came back with a token count on every event / at its end.

A request that fails (an HTTP error, an error event, a cut stream, a timeout) is counted in ``failed`` with its
reason; the figures are over the completed ones, and the command exits 1 after writing its report.

With a baseline server (``baseline_url``: e.g. ``serve --target-only``, the same engine's target alone), each level is
run on it too, right after the served one, with the same requests: its LEVEL is the level's ``baseline``, ``speedup``
= output tokens/s served / baseline (null where either side failed a request, the two then did different work,
or where either side's output tokens/s is unknown), and at
temperature 0 ``outputs_identical`` = ``{"identical", "compared"}`` (requests completed on both, and those whose texts
are equal).
"""

from __future__ import annotations

import http.client
import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..errors import ConfigError, DFlash2Error, raise_if_stop_requested
from .common import SERVE_FORMAT, parse_concurrency, progress_bar
from .metrics import distribution

SERVE_SCHEMA = 1
MAX_SCHEDULE_S = 86400.0
"""The longest a ``--request-rate`` schedule may take (a rate of 1e-300 would make the second request due never)."""
PROBE_TOKENS = 4
"""The untimed first request's output length: it checks the endpoint, the model and the prompt before a level."""


class ServeBenchError(DFlash2Error):
    """Requests of the load failed (the report, written first, counts them)."""


@dataclass(eq=False)   # identity: a level's requests are looked up among thousands (a field-wise == is O(N) each)
class Sent:
    """One request's life on the client: the clock readings and what the server said."""
    index: int
    task_id: object
    due: float = 0.0
    start: float | None = None
    events: list = field(default_factory=list)   # (time, tokens the event carried or None, text)
    first_choice: float | None = None             # the first event with choices (vLLM's TTFT), tokens or not
    end: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(t for _, _, t in self.events)


class Endpoint:
    """Where the load goes: ``base_url`` (``http[s]://host:port``, with or without a trailing ``/v1``)."""

    def __init__(self, base_url: str, *, chat: bool, api_key: str | None = None, timeout: float = 600.0,
                 field: str = "--base-url", usage_per_event: bool = True):
        try:
            parts = urlsplit(base_url.strip())
        except ValueError as exc:   # "http://[::1": an unclosed IPv6 bracket
            raise ConfigError(f"{base_url!r} is not a URL ({exc})", field=field) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"expected http://HOST:PORT (the server's address), got {base_url!r}", field=field)
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"the port of {base_url!r} is not a number in [0, 65535]", field=field) from None
        if parts.query or parts.fragment:
            raise ConfigError(f"{base_url!r}: give the server's address only, without ?query or #fragment",
                              field=field)
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/v1"):
            prefix = prefix[:-3]
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, port
        self.prefix, self.chat, self.timeout, self.usage_per_event = prefix, chat, timeout, usage_per_event
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.path = f"{prefix}/v1/chat/completions" if chat else f"{prefix}/v1/completions"

    @property
    def url(self) -> str:
        return self.origin + self.path

    @property
    def origin(self) -> str:
        port = f":{self.port}" if self.port is not None else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}{port}"

    def same_as(self, other: "Endpoint") -> bool:
        """Whether ``other`` is this endpoint under another name (``localhost`` and ``127.0.0.1``, ...): the same
        path on a port of an address both names resolve to. Names that do not resolve compare as written."""
        if (self.scheme, self.port, self.path) != (other.scheme, other.port, other.path):
            return False
        import socket

        def addrs(host):
            try:
                return {a[4][0] for a in socket.getaddrinfo(host, self.port, proto=socket.IPPROTO_TCP)}
            except (OSError, UnicodeError):
                return {host}

        return bool(addrs(self.host) & addrs(other.host))

    def connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def models(self, *, field: str = "--base-url") -> list[str]:
        """The ids ``GET /v1/models`` lists (the server must answer it: every OpenAI-compatible server does)."""
        where = f"{self.origin}{self.prefix}/v1/models"
        c = self.connect()
        try:
            c.request("GET", f"{self.prefix}/v1/models", headers=self.headers)
            r = c.getresponse()
            body = r.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ConfigError(f"no OpenAI-compatible server answers at {where} ({type(exc).__name__}: {exc}); start "
                              f"one (dflash2-trt serve --engine-dir DIR --openai-port PORT) or pass its address",
                              field=field) from None
        finally:
            c.close()
        if r.status != 200:
            raise ConfigError(f"GET {where} answered HTTP {r.status}: {_error_text(body)}", field=field)
        try:
            ids = [m["id"] for m in json.loads(body)["data"]]
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"GET {where} did not answer a model list ({{\"data\": [{{\"id\": ...}}]}})",
                              field=field) from None
        return [str(i) for i in ids]

    def body(self, *, model: str, prompt: str, max_tokens: int, temperature: float, seed: int,
             ignore_eos: bool) -> dict:
        # continuous_usage_stats: vLLM's, SGLang's, trtllm-serve's and this project's; not OpenAI's own schema
        # (--no-usage-per-event leaves it out)
        opts = {"include_usage": True, "continuous_usage_stats": True} if self.usage_per_event else \
            {"include_usage": True}
        b = {"model": model, "stream": True, "temperature": temperature, "seed": seed, "stream_options": opts}
        if self.chat:
            b["messages"] = [{"role": "user", "content": prompt}]
            b["max_completion_tokens"] = max_tokens
        else:
            b["prompt"] = prompt
            b["max_tokens"] = max_tokens
        if ignore_eos:   # vLLM's and this project's field; sent only when asked (OpenAI's own API does not take it)
            b["ignore_eos"] = True
        return b

    def send(self, s: Sent, body: dict) -> Sent:
        """Send one streamed request and read its events into ``s`` (an error goes into ``s.error``)."""
        data = json.dumps(body).encode()
        c = self.connect()
        try:
            s.start = time.perf_counter()
            c.request("POST", self.path, data, self.headers)
            r = c.getresponse()
            if r.status != 200:
                s.error = f"HTTP {r.status}: {_error_text(r.read())}"
                return s
            seen = 0
            for line in r:
                if not line.startswith(b"data:"):
                    continue
                now = time.perf_counter()
                payload = line[len(b"data:"):].strip()
                if payload == b"[DONE]":
                    s.end = now
                    break
                ev = json.loads(payload)
                if not isinstance(ev, dict):
                    s.error = f"an event that is not a JSON object: {payload[:120].decode('utf-8', 'replace')}"
                    return s
                if "error" in ev or ev.get("object") == "error":   # OpenAI's / vLLM's shape, and a bare one
                    s.error = f"error event: {_error_text(payload)}"
                    return s
                seen = self._event(s, ev, now, seen)
            if s.end is None:
                s.error = "the stream ended without data: [DONE] (cut off)"
            elif s.first_choice is None:   # vLLM fails it too: "Never received a valid chunk to calculate TTFT"
                s.end, s.error = None, "the stream carried no event with choices"
        except (OSError, http.client.HTTPException) as exc:
            s.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except ValueError as exc:
            s.error = f"an event that is not JSON ({exc})"
        except (TypeError, KeyError, AttributeError) as exc:   # fields of other types than the API's
            s.error = f"an event this client cannot read ({type(exc).__name__}: {exc})"
        finally:
            c.close()
        return s

    def _event(self, s: Sent, ev: dict, now: float, seen: int) -> int:
        """Record one streamed event in ``s``; returns the output tokens counted so far (``usage.completion_tokens``)."""
        usage = ev.get("usage") or None
        choices = ev.get("choices") or []
        if not isinstance(choices, list) or (usage is not None and not isinstance(usage, dict)):
            raise TypeError("choices must be a list and usage an object")
        if choices and s.first_choice is None:
            s.first_choice = now
        text = ""
        for ch in choices:
            piece = (ch.get("delta") or {}).get("content") if self.chat else ch.get("text")
            text += piece if isinstance(piece, str) else ""
            s.finish_reason = ch.get("finish_reason") or s.finish_reason
        tokens = None
        if usage is not None:
            if isinstance(usage.get("prompt_tokens"), int):
                s.prompt_tokens = usage["prompt_tokens"]
            total = usage.get("completion_tokens") or 0
            if not isinstance(total, int) or isinstance(total, bool):
                raise TypeError(f"usage.completion_tokens must be an integer, got {total!r}")
            tokens, seen = total - seen, total
            s.completion_tokens = total
        if choices and (tokens or (tokens is None and text)):
            s.events.append((now, tokens, text))
        elif text:   # text without new tokens (held back by the server): kept for the output, not timed
            s.events.append((now, 0, text))
        return seen


def _error_text(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, else the body's first 200 characters."""
    try:
        doc = json.loads(body)
        err = doc.get("error", doc) if isinstance(doc, dict) else doc
        msg = err.get("message") if isinstance(err, dict) else err
        if msg:
            return str(msg)[:500]
    except (ValueError, AttributeError):
        pass
    return body[:200].decode("utf-8", "replace").strip() or "(no body)"


def arrival_offsets(n: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """When each request is due, in seconds from the level's start: all at 0 for an infinite rate, else gamma gaps of
    shape ``burstiness`` and mean 1 / ``request_rate`` (the first due at 0; an infinite burstiness: every gap
    1 / ``request_rate``)."""
    if request_rate == float("inf"):
        return [0.0] * n
    if burstiness == float("inf"):
        return [i / request_rate for i in range(n)]
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (request_rate * burstiness))
    return out


def run_level(endpoint: Endpoint, items: list[dict], concurrency: int, *, model: str, temperature: float, seed: int,
              ignore_eos: bool, request_rate: float, burstiness: float, progress=None) -> tuple[list[Sent], float]:
    """Send every item (``{"task_id", "prompt", "max_tokens"}``) with ``concurrency`` threads; ``(sent, wall)``."""
    offsets = arrival_offsets(len(items), request_rate, burstiness, seed)
    sent = [Sent(i, it["task_id"], due=offsets[i]) for i, it in enumerate(items)]
    order = iter(range(len(items)))
    lock = threading.Lock()
    stop = threading.Event()
    t0 = time.perf_counter()

    def worker():
        while not stop.is_set():
            with lock:
                i = next(order, None)
            if i is None:
                return
            s, it = sent[i], items[i]
            s.due += t0
            while not stop.is_set() and time.perf_counter() < s.due:
                time.sleep(min(0.05, max(0.0, s.due - time.perf_counter())))
            if stop.is_set():
                return
            try:
                endpoint.send(s, endpoint.body(model=model, prompt=it["prompt"], max_tokens=it["max_tokens"],
                                               temperature=temperature, seed=seed + i, ignore_eos=ignore_eos))
            except Exception as exc:  # noqa: BLE001 - the request is failed and said, the thread goes on
                s.error = f"client error ({type(exc).__name__}: {exc})"
            if progress is not None:
                progress.update(1)

    threads = [threading.Thread(target=worker, name=f"bench-serve-{k}", daemon=True)
               for k in range(min(concurrency, len(items)))]
    for th in threads:
        th.start()
    try:
        for th in threads:
            while th.is_alive():   # in steps: a stop (Ctrl-C, SIGTERM) is raised here, not after the level
                raise_if_stop_requested()
                th.join(0.1)
    finally:
        stop.set()
    done = [s for s in sent if s.start is not None]
    wall = max((s.end or s.start) for s in done) - min(s.start for s in done) if done else 0.0
    return sent, wall


GOODPUT_KEYS = ("ttft", "tpot", "e2el")
"""The service-level objectives ``--goodput`` takes: vLLM's names (``vllm bench serve --goodput``), in milliseconds."""


def parse_goodput(values) -> dict[str, float] | None:
    """``--goodput`` values (each ``KEY:MS``, or several joined by commas or, as vLLM's ``--goodput ttft:200 tpot:50``
    reads quoted, by spaces) as ``{key: milliseconds}``; None for none."""
    slo: dict[str, float] = {}
    for value in [values] if isinstance(values, str) else values or ():
        value = re.sub(r"\s*:\s*", ":", str(value))     # "ttft: 200" is one objective
        for pair in (p for chunk in value.split(",") for p in (chunk.split() or [chunk])):
            key, sep, ms = pair.strip().partition(":")
            if not sep or key not in GOODPUT_KEYS:
                raise ConfigError(f"{pair.strip()!r}: each objective is KEY:MILLISECONDS with KEY one of "
                                  f"{', '.join(GOODPUT_KEYS)} (e.g. ttft:200,tpot:50)", field="--goodput")
            try:
                v = float(ms)
            except ValueError:
                v = float("nan")
            if not (v >= 0 and v != float("inf")):
                raise ConfigError(f"{pair.strip()!r}: the milliseconds must be a finite number >= 0",
                                  field="--goodput")
            v += 0.0   # -0 is 0
            if key in slo:
                raise ConfigError(f"{key} is given twice ({slo[key]:g} and {v:g} ms)", field="--goodput")
            slo[key] = v
    return slo or None


def _goodput(ok: list[Sent], first: dict, wall: float, slo: dict[str, float] | None) -> dict | None:
    """The level's ``goodput`` (module docstring), None without objectives or where a figure is unknown."""
    if not slo:
        return None
    good = 0
    for s in ok:
        # the report's TTFT; a request without a token-carrying event, from its first event with choices (vLLM's
        # TTFT; a completed request has one: send() fails a stream without)
        t, n = first[id(s)] if first[id(s)] is not None else s.first_choice, s.completion_tokens
        if "tpot" in slo and n is None:
            return {"good": None, "requests_per_s": None,
                    "unknown": f"task {s.task_id} came back without a token count (tpot)"}
        got = {"e2el": s.end - s.start}
        if "ttft" in slo:
            got["ttft"] = t - s.start
        if "tpot" in slo:
            got["tpot"] = (s.end - t) / (n - 1) if n > 1 else 0.0
        good += all(got[k] <= ms / 1e3 for k, ms in slo.items())
    return {"good": good, "requests_per_s": good / wall if wall > 0 else None, "unknown": None}


def level_metrics(sent: list[Sent], wall: float, *, concurrency: int, dataset_lens: list[int | None],
                  rate_limited: bool, goodput: dict[str, float] | None = None) -> dict:
    """A LEVEL (the module docstring defines every figure) from its requests; ``goodput``: the objectives in ms."""
    ok = [s for s in sent if s.error is None and s.end is not None]
    done = {id(s) for s in ok}
    failed = [s for s in sent if id(s) not in done]
    timed = [s for s in ok if s.completion_tokens is not None]
    counted_all = len(timed) == len(ok) > 0   # token figures only where the server counted every request's tokens
    first = {id(s): next((t for t, n, _ in s.events if n is None or n > 0), None) for s in ok}
    out_tok = sum(s.completion_tokens for s in timed)
    in_tok = sum(s.prompt_tokens for s in ok) if ok and all(s.prompt_tokens is not None for s in ok) else None
    ttft = [first[id(s)] - s.start for s in ok if first[id(s)] is not None]
    lat = [s.end - s.start for s in ok]
    itl = [(s.end - first[id(s)]) / (s.completion_tokens - 1) for s in timed
           if s.completion_tokens > 1 and first[id(s)] is not None]
    gaps, per_event = [], []
    counted = True
    for s in ok:
        carrying = [(t, n) for t, n, _ in s.events if n is None or n > 0]
        gaps += [b[0] - a[0] for a, b in zip(carrying, carrying[1:])]
        if any(n is None for _, n in carrying):
            counted = False
        per_event += [n for _, n in carrying[1:] if n is not None]
    tokens_per_event = None
    if counted and per_event:
        hist: dict[str, int] = {}
        for n in per_event:
            hist[str(n)] = hist.get(str(n), 0) + 1
        tokens_per_event = {"mean": sum(per_event) / len(per_event), "events": len(per_event),
                            "histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0])))}
    differ = sum(1 for s, n in zip(sent, dataset_lens) if id(s) in done and n is not None
                 and s.prompt_tokens is not None and s.prompt_tokens != n)
    per_s = (lambda x: x / wall) if wall > 0 else (lambda x: None)
    return {
        "concurrency": concurrency, "threads": min(concurrency, len(sent)), "requests": len(sent),
        "completed": len(ok), "failed": len(failed),
        "errors": [{"task_id": s.task_id, "error": s.error or "never sent"} for s in failed[:10]],
        "wall_s": wall, "input_tokens": in_tok, "output_tokens": out_tok if counted_all else None,
        "requests_per_s": per_s(len(ok)), "output_tokens_per_s": per_s(out_tok) if counted_all else None,
        "total_tokens_per_s": per_s(out_tok + in_tok) if counted_all and in_tok is not None else None,
        "ttft_s": distribution(ttft), "latency_s": distribution(lat), "itl_s": distribution(itl),
        "event_gap_s": distribution(gaps), "tokens_per_event": tokens_per_event,
        "queue_s": distribution((s.start - s.due) for s in ok) if rate_limited else None,
        "prompt_tokens_differ": differ,
        "requests_without_usage": len(ok) - len(timed),
        "goodput": _goodput(ok, first, wall, goodput),
    }


def load_items(dataset, *, num_requests: int | None, max_new_tokens: int, tokenizer_dir=None) -> list[dict]:
    """The dataset's lines as ``{"task_id", "prompt", "max_tokens", "input_len", "where"}``: text sent as it is, ids
    decoded by the tokenizer (``--tokenizer`` / ``--engine-dir``; special tokens kept, so a rendered chat prompt
    stays one)."""
    from .dataset import dataset_lines

    lines = dataset_lines(dataset, num_requests)
    tok = None
    out = []
    for ln in lines:
        text, n = ln["prompt"], None
        if ln["input_ids"] is not None:
            if tok is None:
                if tokenizer_dir is None:
                    raise ConfigError("a line gives input_ids, which the OpenAI API takes as text: pass the tokenizer "
                                      "that decodes them (--tokenizer DIR, or --engine-dir DIR for the engine's own)",
                                      source=ln["where"])
                from ..tokenizer import find_tokenizer

                tok = find_tokenizer(tokenizer_dir, strict=True)
                if tok is None:
                    raise ConfigError(f"{tokenizer_dir} has no tokenizer files", field="--tokenizer")
            n = len(ln["input_ids"])
            text = tok.decode(ln["input_ids"], skip_special_tokens=False)
        if not text:
            raise ConfigError("the prompt is empty", source=ln["where"])
        out.append({"task_id": ln["task_id"], "prompt": text, "max_tokens": ln["output_tokens"] or max_new_tokens,
                    "input_len": n, "where": ln["where"]})
    return out


def _open(ep: Endpoint, model: str | None, item: dict, *, temperature: float, seed: int, ignore_eos: bool,
          url_field: str, model_field: str) -> tuple[str, list[str], Sent]:
    """``(model, served models, the probe)`` of one server: its model list, then one untimed request (the first
    line's, at most :data:`PROBE_TOKENS` tokens): a request that fails here fails every request of the load, so it is
    the command's error, said once before any level."""
    served = ep.models(field=url_field)
    if model is None:
        if len(served) != 1:
            raise ConfigError(f"the server at {ep.url} lists {len(served)} models ({', '.join(served) or 'none'}): "
                              f"name one", field=model_field)
        model = served[0]
    probe = ep.send(Sent(-1, item["task_id"]),
                    ep.body(model=model, prompt=item["prompt"], max_tokens=min(PROBE_TOKENS, item["max_tokens"]),
                            temperature=temperature, seed=seed, ignore_eos=ignore_eos))
    if probe.error is not None:
        hint = ("; a server that does not take stream_options.continuous_usage_stats (OpenAI's own): "
                "--no-usage-per-event" if "continuous_usage" in probe.error and ep.usage_per_event else "")
        # a model the server does not list is the likelier fault than the address, which answered the model list
        at_fault = model_field if model not in served else url_field
        raise ConfigError(f"the first request ({item['where']}) failed at {ep.url}: {probe.error}{hint}",
                          field=at_fault)
    return model, served, probe


def compare_outputs(a: list[Sent], b: list[Sent]) -> dict:
    """``{"identical", "compared"}``: requests completed on both servers, and those whose texts are equal."""
    both = [(x, y) for x, y in zip(a, b) if x.error is None and y.error is None and x.end and y.end]
    return {"identical": sum(1 for x, y in both if x.text == y.text), "compared": len(both)}


def bench_serve(*, base_url: str, dataset, concurrency="1,4,16", model: str | None = None, chat: bool = False,
                num_requests: int | None = None, temperature: float = 0.0, seed: int = 0, max_new_tokens: int = 64,
                ignore_eos: bool = False, request_rate: float = float("inf"), burstiness: float = 1.0,
                tokenizer_dir=None, api_key: str | None = None, timeout: float = 600.0, keep_outputs: bool = False,
                baseline_url: str | None = None, baseline_model: str | None = None, usage_per_event: bool = True,
                goodput=None, progress: bool = False, on_start=None, on_level=None) -> dict:
    """The ``bench serve`` report (:func:`render` prints it); ``on_start(doc)`` is called once the first request has
    come back (the report without levels), ``on_level(level, part)`` as each level ends (``part`` None), or with a
    baseline twice: after the served pass ("served") and after the baseline's ("baseline"); ``render_level`` takes
    the same ``part``. ``baseline_url``: a second server
    (the target alone: ``serve --target-only``, or any other) loaded the same way after each level, its LEVEL under
    ``baseline``, with ``speedup`` (output tokens/s, served / baseline) and, at temperature 0, ``outputs_identical``.
    ``goodput``: ``--goodput``'s values (:func:`parse_goodput`), the objectives each level's ``goodput`` counts."""
    levels = parse_concurrency(concurrency)
    slo = parse_goodput(goodput)
    if not (temperature >= 0 and temperature != float("inf")):
        raise ConfigError(f"must be a finite number >= 0, got {temperature}", field="--temperature")
    if not request_rate > 0:
        raise ConfigError(f"must be > 0 (inf: every request due at once), got {request_rate}", field="--request-rate")
    if not burstiness > 0:
        raise ConfigError(f"must be > 0 (inf: every gap 1 / rate), got {burstiness}", field="--burstiness")
    if not 0 < timeout <= threading.TIMEOUT_MAX:
        raise ConfigError(f"must be a number of seconds in (0, {threading.TIMEOUT_MAX:.0f}], got {timeout}",
                          field="--timeout")
    if baseline_model is not None and baseline_url is None:
        raise ConfigError("names the baseline server's model: give --baseline-url too", field="--baseline-model")
    items = load_items(dataset, num_requests=num_requests, max_new_tokens=max_new_tokens, tokenizer_dir=tokenizer_dir)
    if request_rate != float("inf") and (len(items) - 1) / request_rate > MAX_SCHEDULE_S:
        raise ConfigError(f"{request_rate:g} requests/s: the {len(items)} requests would be due over "
                          f"{(len(items) - 1) / request_rate:.3g} s (at most {MAX_SCHEDULE_S:.0f} s: one day)",
                          field="--request-rate")
    kw = {"chat": chat, "api_key": api_key, "timeout": timeout, "usage_per_event": usage_per_event}
    ep = Endpoint(base_url, **kw)
    bep = None if baseline_url is None else Endpoint(baseline_url, field="--baseline-url", **kw)
    if bep is not None and bep.same_as(ep):
        raise ConfigError(f"is the served endpoint itself ({ep.url}): give the baseline server's address",
                          field="--baseline-url")
    common = {"temperature": temperature, "seed": seed, "ignore_eos": ignore_eos}
    model, served, probe = _open(ep, model, items[0], url_field="--base-url", model_field="--model", **common)
    if bep is not None:
        baseline_model, baseline_served, _ = _open(bep, baseline_model, items[0], url_field="--baseline-url",
                                                   model_field="--baseline-model", **common)
    doc = {
        "format": SERVE_FORMAT, "schema_version": SERVE_SCHEMA, "endpoint": ep.url, "model": model,
        "served_models": served,
        "baseline": None if bep is None else {"endpoint": bep.url, "model": baseline_model,
                                              "served_models": baseline_served},
        "dataset": {"path": str(dataset), "requests": len(items),
                    "sent_as": "text" if all(it["input_len"] is None for it in items) else "text (ids decoded)"},
        "settings": {"concurrency": levels, "chat": chat, "temperature": temperature, "seed": seed,
                     "usage_per_event_asked": usage_per_event,
                     "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos,
                     "request_rate": None if request_rate == float("inf") else request_rate,
                     "burstiness": burstiness, "timeout_s": timeout, "goodput_ms": slo},
        "usage_per_event": probe.events != [] and all(n is not None for _, n, _ in probe.events),
        "usage_at_end": probe.completion_tokens is not None,
        "levels": [],
    }
    if on_start is not None:
        on_start(doc)
    lens = [it["input_len"] for it in items]
    rate_limited = request_rate != float("inf")

    def one(endpoint, name, c, what):
        raise_if_stop_requested()
        bar = None
        if progress:
            bar = progress_bar(True, len(items), f"{what}concurrency {c}")
        try:
            sent, wall = run_level(endpoint, items, c, model=name, request_rate=request_rate, burstiness=burstiness,
                                   progress=bar, **common)
        finally:
            if bar is not None:
                bar.close()
        lv = level_metrics(sent, wall, concurrency=c, dataset_lens=lens, rate_limited=rate_limited, goodput=slo)
        if keep_outputs:
            lv["outputs"] = [{"task_id": s.task_id, "text": s.text, "completion_tokens": s.completion_tokens,
                              "finish_reason": s.finish_reason, "error": s.error} for s in sent]
        return sent, lv

    for c in levels:
        sent, lv = one(ep, model, c, "")
        if on_level is not None and bep is not None:
            on_level(lv, "served")   # said before the baseline's pass: a stop there keeps this row on the screen
        if bep is not None:
            bsent, blv = one(bep, baseline_model, c, "baseline ")
            lv["baseline"] = blv
            a, b = lv["output_tokens_per_s"], blv["output_tokens_per_s"]
            # only over the same work: a side whose requests failed did less of it (or, failing fast, more per second)
            lv["speedup"] = a / b if a and b and not lv["failed"] and not blv["failed"] else None
            lv["outputs_identical"] = compare_outputs(sent, bsent) if temperature == 0 else None
        doc["levels"].append(lv)
        if on_level is not None:
            on_level(lv, "baseline" if bep is not None else None)
    return doc


def failures(doc: dict) -> str | None:
    """One line naming the failed requests of a report (the served endpoint's, then the baseline's), or None when
    every request completed."""
    bad = []
    for lv in doc["levels"]:
        for what, x in (("", lv), ("on the baseline ", lv.get("baseline"))):
            if x is not None and x["failed"]:
                bad.append((what, x))
    if not bad:
        return None
    what, x = bad[0]
    first = x["errors"][0] if x["errors"] else {"task_id": "?", "error": "?"}
    others = len({y["concurrency"] for _, y in bad} - {x["concurrency"]})
    more = f" (and at {others} more concurrenc{'y' if others == 1 else 'ies'})" if others else ""
    return (f"{x['failed']} of {x['requests']} requests failed {what}at concurrency {x['concurrency']}{more}; the "
            f"first, task {first['task_id']}: {first['error']}")


def _ms(d: dict | None, key: str) -> str:
    return "-" if d is None else f"{d[key] * 1e3:.1f}"


HEADER = (f"{'conc':>4} {'server':>8} {'done':>9} {'req/s':>8} {'tok/s':>9} {'ttft p50':>9} {'p99':>8} {'itl p50':>8} "
          f"{'p99':>7} {'lat p50':>9} {'p99':>9} {'tok/event':>9}")


def _row(lv: dict, server: str) -> str:
    rate = "-" if lv["output_tokens_per_s"] is None else f"{lv['output_tokens_per_s']:.1f}"
    tpe = "-" if lv["tokens_per_event"] is None else f"{lv['tokens_per_event']['mean']:.2f}"
    done = f"{lv['completed']}/{lv['requests']}"
    row = (f"{lv['concurrency']:>4} {server:>8} {done:>9} {lv['requests_per_s'] or 0:>8.2f} "
           f"{rate:>9} {_ms(lv['ttft_s'], 'p50'):>9} {_ms(lv['ttft_s'], 'p99'):>8} {_ms(lv['itl_s'], 'p50'):>8} "
           f"{_ms(lv['itl_s'], 'p99'):>7} {_ms(lv['latency_s'], 'p50'):>9} {_ms(lv['latency_s'], 'p99'):>9} "
           f"{tpe:>9}")
    g = lv.get("goodput")
    if g is not None:
        rate = "-" if g["requests_per_s"] is None else f"{g['requests_per_s']:.2f}"
        row += " good -" if g["good"] is None else f" good {g['good']}/{lv['completed']} ({rate}/s)"
    return row + (f"   {lv['failed']} FAILED" if lv["failed"] else "")


def render_level(lv: dict, part: str | None = None) -> str:
    """A level's row (throughput, TTFT / ITL / latency p50 and p99 in ms, tokens per event); with a baseline, its row
    and the speedup line. ``part``: "served" for the served row alone, "baseline" for the rest (as ``on_level`` says
    them while the level runs), None for all."""
    if lv.get("baseline") is None:
        return _row(lv, "served")
    same = lv["outputs_identical"]
    same = "" if same is None else f", outputs identical {same['identical']}/{same['compared']}"
    speedup = "-" if lv["speedup"] is None else f"{lv['speedup']:.2f}x"
    rows = [_row(lv, "served"), _row(lv["baseline"], "baseline"),
            f"{'':>4} speedup {speedup} (output tokens/s, served / baseline){same}"]
    return "\n".join(rows[:1] if part == "served" else rows[1:] if part == "baseline" else rows)


def render_head(doc: dict) -> str:
    s = doc["settings"]
    rate = "every request due at once" if s["request_rate"] is None else \
        f"{s['request_rate']} req/s (burstiness {s['burstiness']})"
    head = [f"bench serve: {doc['endpoint']} (model {doc['model']}), {doc['dataset']['requests']} requests from "
            f"{doc['dataset']['path']} ({doc['dataset']['sent_as']}), temperature {s['temperature']}, {rate}"]
    if doc.get("baseline") is not None:
        head.append(f"baseline: {doc['baseline']['endpoint']} (model {doc['baseline']['model']}), loaded the same way "
                    f"after each level")
    if not doc["usage_at_end"]:
        head.append("the server sends no usage: output tokens, tok/s, itl and tok/event are not known")
    elif not doc["usage_per_event"]:
        head.append("the server sends no per-event usage: tok/event is not known (tokens counted at the end only)")
    head.append("times in ms; tok/s = output tokens per second; itl = (latency - ttft) / (tokens - 1), vLLM's tpot "
                "(vLLM's itl, the gaps between events, is event_gap_s in the JSON); tok/event = output tokens per "
                "streamed event after the first (per engine step on dflash2-trt serve)")
    if s.get("goodput_ms"):
        slo = ", ".join(f"{k} <= {v:g} ms" for k, v in s["goodput_ms"].items())
        head.append(f"good = completed requests with {slo} (tpot: vLLM's name for itl), and those per second")
    return "\n".join(head + [HEADER, "-" * len(HEADER)])


def render(doc: dict) -> str:
    return "\n".join([render_head(doc)] + [render_level(lv) for lv in doc["levels"]])
