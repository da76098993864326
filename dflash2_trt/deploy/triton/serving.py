"""The project runtime behind Triton's ``tensorrt_llm`` tensors: what the python-backend model does.

``models/tensorrt_llm_python.py`` (the repository's ``tensorrt_llm/1/model.py``) is a thin Triton
wrapper around this module, which imports no Triton code so that it is tested directly:

- :func:`open_engine` opens the engine directory by engine.json's ``backend``: a CPU or cuda engine,
  or a TensorRT-LLM engine through TensorRT (:mod:`~dflash2_trt.engine.trtllm.session`); the rest is
  the same for both.

- :func:`parse_request` turns one request's input tensors (TensorRT-LLM backend names, see
  ``templates/tensorrt_llm.pbtxt``) into a :class:`Spec`, or raises a :class:`ConfigError` naming
  the input. Inputs the project runtime cannot honour (beams, logits, LoRA, top-k/top-p, ...) are
  refused when set to anything but their neutral value, never silently ignored; ``runtime_top_k`` 1 is
  greedy (the top one token is the argmax), whatever the temperature.
- :class:`ServingLoop` owns ONE :class:`~dflash2_trt.runtime.Runtime` in a background thread: every
  Triton request joins the in-flight batch at the next engine step it fits in (requests from
  different ``execute`` calls share steps), and each step's accepted tokens are handed to the
  request's sink (streamed as one response per step when decoupled).

Speculative-decoding statistics (outputs with ``return_perf_metrics``), defined as TensorRT-LLM's
executor defines them (``LlmRequest::updateNumTokensPerIteration`` and the result's
``RequestPerfMetrics.speculativeDecoding``):

- ``total_draft_tokens`` += min(drafts of the step, max draft path length) = K per generation step
  (the context step, which produces the first token, has no drafts and counts nothing);
- ``total_accepted_draft_tokens`` += tokens accepted by the step - 1 (the engine's accepted count,
  before a stop word or ``request_output_len`` cuts the last step short);
- ``acceptance_rate`` = accepted / drafts (0 when no generation step ran).

The mean acceptance length (tokens per generation step, ``dflash2-trt run``'s "mean acceptance")
is ``1 + total_accepted_draft_tokens * K / total_draft_tokens``.

What a response holds, as TensorRT-LLM's backend fills it (``tensorrtllm_backend.yaml`` ``responses``, with the
sources): ``output_ids`` / ``sequence_length`` leave out the end token a request stopped at (TensorRT-LLM's EAGLE
decoding mode stops on it explicitly and does not count it in the sequence), but keep a stop word;
``num_output_tokens`` counts the tokens of that response (streamed: the step's; not streamed: the whole output, and
the prompt too where ``exclude_input_in_output`` is false). The runtime's own ``output_ids`` keep the end token, as
the HF target's ``generate`` does (``run``, ``bench``, the verify gate compare them with it); only these responses
drop it.

Times (``arrival_time_ns``, ``first_scheduled_time_ns``, ``first_token_time_ns``,
``last_token_time_ns``) are ``time.monotonic_ns()`` (a steady clock, as TensorRT-LLM's).

Draining (``serve`` stopping on Ctrl-C / SIGTERM): tritonserver, stopped, rejects new requests and waits
``--exit-timeout-secs`` for those in flight, then unloads the models and closes its endpoints, cutting any
stream still running without a final or an error response. So ``serve`` first writes a drain file
(:func:`request_drain`: a deadline, inside that exit timeout) whose path the server's environment gives
the model (``DFLASH2_DRAIN_FILE``); the loop sees it within a step, refuses new requests, lets those in
flight run on, and at the deadline ends each one still running with an error response (final), while
the endpoints are still there to deliver it.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Protocol

import numpy as np

from ...errors import ConfigError

# Inputs of the tensorrt_llm model this backend honours.
HONOURED = ("input_ids", "input_lengths", "request_output_len", "end_id", "pad_id", "stop_words_list", "streaming",
            "exclude_input_in_output", "temperature", "seed", "return_perf_metrics", "return_num_input_tokens",
            "return_num_output_tokens")
# Inputs accepted only at a value that changes nothing for this engine (one beam, no logits, ...).
_NEUTRAL: dict[str, Callable[[float], bool]] = {
    "beam_width": lambda v: v == 1,
    "num_return_sequences": lambda v: v == 1,
    # 1 keeps only the most likely token: greedy whatever the temperature (parse_request makes the request greedy)
    "runtime_top_k": lambda v: v in (0, 1),
    "runtime_top_p": lambda v: v == 0.0 or v == 1.0,
    "repetition_penalty": lambda v: v == 1.0,
    "presence_penalty": lambda v: v == 0.0,
    "frequency_penalty": lambda v: v == 0.0,
    "min_tokens": lambda v: v <= 1,
    "return_log_probs": lambda v: not v,
    "return_context_logits": lambda v: not v,
    "return_generation_logits": lambda v: not v,
    "stop": lambda v: not v,
    # beam-search-only and nucleus-decay settings: no effect with one beam and no top-p
    "len_penalty": lambda v: True,
    "early_stopping": lambda v: True,
    "beam_search_diversity_rate": lambda v: True,
    "runtime_top_p_min": lambda v: True,
    "runtime_top_p_decay": lambda v: True,
    "runtime_top_p_reset_ids": lambda v: True,
}
NEUTRAL = tuple(_NEUTRAL)
DRAIN_ENV = "DFLASH2_DRAIN_FILE"   # the drain file's path, in the server's (and so the model's) environment
# Test hook (read in tensorrt_standin_hook only): a TensorRT-LLM engine on the CPU stand-in of TensorRT
STANDIN_ENV = "DFLASH2_TRT_TENSORRT_STANDIN"
PERF_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "arrival_time_ns",
                "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")


@dataclass
class Spec:
    """One request, parsed."""
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    stop_words: list[list[int]] = field(default_factory=list)
    streaming: bool = False
    exclude_input: bool = True
    perf: bool = False
    num_input: bool = False
    num_output: bool = False
    arrival_ns: int = 0


def _scalar(arr: np.ndarray, name: str):
    flat = np.asarray(arr).reshape(-1)
    if flat.size != 1:
        raise ConfigError(f"expected one value per request, got shape {list(np.asarray(arr).shape)}", field=name)
    return flat[0].item()


def parse_stop_words(arr: np.ndarray) -> list[list[int]]:
    """TensorRT-LLM's word list ``[1, 2, L]`` (or ``[2, L]``): row 0 the words' ids back to back,
    row 1 each word's cumulative end offset, -1 padded."""
    a = np.asarray(arr)
    if a.ndim == 3 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 2 or a.shape[0] != 2:
        raise ConfigError(f"must have shape [2, L] (ids, end offsets), got {list(np.asarray(arr).shape)}",
                          field="stop_words_list")
    ids, offsets = a[0].tolist(), [int(o) for o in a[1].tolist() if int(o) >= 0]
    words, start = [], 0
    for off in offsets:
        if not start < off <= len(ids):
            raise ConfigError(f"end offsets must increase within the {len(ids)} ids, got {offsets}",
                              field="stop_words_list")
        words.append([int(t) for t in ids[start:off]])
        start = off
    return words


def refuse_parameters(parameters) -> None:
    """A request's parameters (``request.parameters()``: a JSON object as text, or a mapping) must be none.

    The models read no request parameters, and Triton hands them what a client sends beside the inputs: a field of
    ``/generate``'s JSON body that names no input of the model (``{"repetition_penalty": 5.0}``), the ``parameters``
    of an infer request, or a header a ``--*-header-forward-pattern`` matches; an ensemble forwards its request's
    parameters to every composing model. Refused, naming them, rather than ignored (as unknown inputs are). Triton
    keeps its own (``priority``, ``timeout``, ``sequence_*``, ``binary_data_output`` of an infer request;
    ``triton_*``) and passes none of them on: they are not seen here. ``models/preprocessing.py`` and
    ``models/postprocessing.py`` carry a copy (they import nothing of this package)."""
    if isinstance(parameters, (str, bytes)):
        try:
            parameters = json.loads(parameters or "{}")
        except ValueError:
            parameters = {"?": parameters}
    names = sorted(parameters or {})
    if names:
        raise ConfigError(f"request parameter{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names)}: "
                          f"not an input of this model, and it reads no request parameters, so refused rather than "
                          f"ignored (Triton's /generate endpoint passes a JSON field that names no model input on as "
                          f"a request parameter); send only the model's inputs")


def parse_request(inputs: Mapping[str, np.ndarray], *, vocab_size: int, eos_token_ids=(), exclude_default: bool = True,
                  decoupled: bool = False, arrival_ns: int | None = None) -> Spec:
    """One request's input tensors (name -> array, only those the client gave) -> :class:`Spec`."""
    for name, arr in inputs.items():
        if name in HONOURED:
            continue
        if name in _NEUTRAL:
            v = _scalar(arr, name)
            if not _NEUTRAL[name](v):
                raise ConfigError(f"{v!r} is not supported by the python-backend model (one beam, no logits, no "
                                  f"top-k above 1, no top-p; the tensorrtllm backend serves it on a GPU)", field=name)
            continue
        raise ConfigError("not supported by the python-backend tensorrt_llm model (the tensorrtllm backend serves it "
                          "on a GPU)", field=name)
    if "input_ids" not in inputs:
        raise ConfigError("required (the prompt's token ids)", field="input_ids")
    ids = np.asarray(inputs["input_ids"])
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1:
        raise ConfigError(f"expected [1, L] token ids per request, got shape {list(np.asarray(inputs['input_ids']).shape)}",
                          field="input_ids")
    prompt = [int(t) for t in ids.tolist()]
    if "input_lengths" in inputs:
        n = int(_scalar(inputs["input_lengths"], "input_lengths"))
        if not 1 <= n <= len(prompt):
            raise ConfigError(f"{n} is not in [1, {len(prompt)}] (the ids given)", field="input_lengths")
        prompt = prompt[:n]
    if not prompt:
        raise ConfigError("empty prompt", field="input_ids")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ConfigError(f"token ids {bad[:5]} outside the vocabulary [0, {vocab_size})", field="input_ids")
    if "request_output_len" not in inputs:
        raise ConfigError("required (new tokens to generate)", field="request_output_len")
    out_len = int(_scalar(inputs["request_output_len"], "request_output_len"))
    if out_len < 1:
        raise ConfigError(f"must be >= 1, got {out_len}", field="request_output_len")
    from ...sampling import GREEDY_REQUEST_TEMPERATURE, TRTLLM_DEFAULT_TEMPERATURE, check_request_temperature

    # as TensorRT-LLM's backend takes it (engine_io.yaml request_temperature): unset, TensorRT-LLM fills the
    # engine's temperature with 1.0 (this engine samples at it); 0 is refused by its EAGLE decoding layer; the engine
    # decodes anything below 1e-5 greedily. The ensemble's preprocessing turns a client's 0 (or no temperature) into
    # a greedy one.
    temperature = (check_request_temperature(_scalar(inputs["temperature"], "temperature"), field="temperature")
                   if "temperature" in inputs else TRTLLM_DEFAULT_TEMPERATURE)
    if "runtime_top_k" in inputs and _scalar(inputs["runtime_top_k"], "runtime_top_k") == 1:
        # sampling from the top 1 token is taking the argmax: the engine's greedy path gives exactly that. (Behind
        # TensorRT-LLM's own tensorrtllm backend a direct request's runtime_top_k is dropped: this engine has no top-k
        # input; the ensemble's preprocessing makes top_k 1 greedy there too, docs/cli.md)
        temperature = GREEDY_REQUEST_TEMPERATURE
    seed = int(_scalar(inputs["seed"], "seed")) if "seed" in inputs else 0
    if not 0 <= seed < 2**64:
        raise ConfigError(f"must be in [0, 2**64), got {seed}", field="seed")
    if "end_id" in inputs:
        end = int(_scalar(inputs["end_id"], "end_id"))
        stops = (end,) if end >= 0 else ()
    else:
        stops = tuple(int(e) for e in eos_token_ids)
    words = parse_stop_words(inputs["stop_words_list"]) if "stop_words_list" in inputs else []
    streaming = bool(_scalar(inputs["streaming"], "streaming")) if "streaming" in inputs else False
    if streaming and not decoupled:
        raise ConfigError("streaming needs a decoupled model: deploy the repository with --decoupled", field="streaming")
    flag = lambda name, default=False: bool(_scalar(inputs[name], name)) if name in inputs else default  # noqa: E731
    return Spec(prompt, out_len, temperature, seed, stops, words, streaming,
                flag("exclude_input_in_output", exclude_default), flag("return_perf_metrics"),
                flag("return_num_input_tokens"), flag("return_num_output_tokens"),
                time.monotonic_ns() if arrival_ns is None else arrival_ns)


def ended_at_end_token(r) -> bool:
    """Whether request ``r`` has ended at one of its end tokens (its last output token, which a response leaves out,
    as TensorRT-LLM's does: the module docstring)."""
    return r.done and r.stop_reason == "stop_token"


class NotServing(ConfigError):
    """:meth:`ServingLoop.submit` refusing a request because the model takes none now (shutting down, its loop
    ended): the server's state, not the request's fault (the python model answers UNAVAILABLE)."""


def response_tokens(tokens, end_ids) -> list[int]:
    """What a response carries of a request's output ``tokens`` (the runtime's, or the HF target's ``generate``,
    which end with the end token they stopped at): the same without that end token. For a request without stop words
    (the load tool's): where a stop word is also an end id, the loop keeps it, as TensorRT-LLM does (its stop words are
    checked first, and the end-id check skips a request they finished), which this function cannot tell."""
    tokens = list(tokens)
    return tokens[:-1] if tokens and tokens[-1] in tuple(end_ids) else tokens


def refuse_target_only_trtllm(engine_dir, cfg: dict | None = None, man: dict | None = None) -> None:
    """A TensorRT engine directory serves its target alone from its ``baseline/`` engine (``build --baseline``), at tp
    1 (a tp engine's follower ranks open the combined engine): anything else is one line, before any engine opens.
    ``cfg`` / ``man``: the directory's config.json and engine.json where the caller has read them."""
    from ...engine.format import load_engine_dir
    from ...engine.trtllm.session import baseline_config, has_baseline

    if cfg is None or man is None:
        cfg, man = load_engine_dir(engine_dir)
    if not has_baseline(man):
        raise ConfigError("has no baseline engine to serve the target alone from: build it with `dflash2-trt build "
                          "--backend trtllm --baseline ...` (the target alone, in ENGINE_DIR/baseline/)",
                          source=engine_dir, field="--target-only")
    tp = int(((cfg or {}).get("pretrained_config") or {}).get("mapping", {}).get("tp_size", 1))
    if tp != 1:
        raise ConfigError(f"serving the target alone is for tp 1 engines; this one is tp {tp} (bench run measures a tp "
                          f"engine's baseline)", source=engine_dir, field="--target-only")
    # its files as engine.json records them, its config the target alone of this engine: before anything loads
    baseline_config(engine_dir, cfg, man, without="or serve the combined engine without --target-only")


def draft_stats(acceptance_lengths, K: int) -> dict:
    """TensorRT-LLM's speculative-decoding request statistics (see the module docstring)."""
    steps = len(acceptance_lengths)
    accepted = sum(int(n) - 1 for n in acceptance_lengths)
    drafts = K * steps
    return {"total_accepted_draft_tokens": accepted, "total_draft_tokens": drafts,
            "acceptance_rate": accepted / drafts if drafts else 0.0}


def request_drain(path, timeout: float) -> None:
    """Ask the model(s) reading ``path`` to drain: no new requests, those in flight ended within ``timeout`` s."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"deadline": time.time() + timeout, "timeout": timeout}, f)
    os.replace(tmp, path)   # whole or absent, never half-written


def read_drain(path) -> tuple[float, float] | None:
    """``(deadline, timeout)`` of a drain asked through ``path``; None while there is none. A file that cannot
    be read as one is a drain with no time left (the server is stopping either way)."""
    try:
        with open(path) as f:
            doc = json.load(f)
        return float(doc["deadline"]), float(doc["timeout"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return time.time(), 0.0


def model_runtime(engine_backend: str) -> tuple[str, str]:
    """``(runtime, description)`` of the python-backend model on an engine of ``engine_backend``: always the
    project's :class:`~dflash2_trt.runtime.Runtime`, over the CPU / cuda engine or over TensorRT
    (``engine/trtllm/session.py``); ``dflash2_repository.json`` records both."""
    if engine_backend == "trtllm":
        from ...engine.trtllm.paths import DESCRIPTION, PROJECT

        return PROJECT, DESCRIPTION[PROJECT]
    return "project", f"the project runtime over the {engine_backend} engine (engine/standin/engine.py)"


def _engine_backend(engine_dir: Path) -> str:
    man_path = engine_dir / "engine.json"
    try:
        backend = json.loads(man_path.read_text(encoding="utf-8")).get("backend")   # the stub may run in a C locale
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"not a readable engine.json ({type(exc).__name__}: {exc})", source=man_path) from None
    if backend not in ("cpu", "cuda", "trtllm"):
        raise ConfigError(f"{backend!r}: expected 'cpu', 'cuda' or 'trtllm'", source=man_path, field="backend")
    return backend


def tensorrt_standin_hook(engine_dir: Path):
    """The CPU stand-in of TensorRT's execution API (``dflash2_trt/testing/tensorrt_standin.py``) when the test hook
    ``DFLASH2_TRT_TENSORRT_STANDIN=1`` is in the environment, else None (TensorRT itself).

    Why a hook: tritonserver runs the model in its python-backend stub, another process, so a test cannot hand the
    stand-in module in as the ``run`` tests do. It cannot take effect by accident: only the value ``1`` is taken
    (any other value is an error), and only for a rank engine the stand-in wrote (its magic bytes); set on a real
    TensorRT engine it is an error, never a silent CPU run. With it no plugin library is loaded."""
    value = os.environ.get(STANDIN_ENV)
    if value is None:
        return None
    if value != "1":
        raise ConfigError(f"{value!r}: a test hook that takes 1 only (run a TensorRT-LLM engine on the CPU stand-in of "
                          f"TensorRT); unset it to use TensorRT", field=STANDIN_ENV)
    try:
        from ...testing import tensorrt_standin
    except ImportError as exc:
        raise ConfigError(f"1 (a test hook) needs dflash2_trt/testing, which this install lacks ({exc}); unset it",
                          field=STANDIN_ENV) from None

    rank = engine_dir / "rank0.engine"
    if rank.is_file():
        with open(rank, "rb") as f:
            head = f.read(len(tensorrt_standin.MAGIC))
        if head != tensorrt_standin.MAGIC:
            raise ConfigError(f"{STANDIN_ENV}=1 (a test hook) is set, but this is a real TensorRT engine, not one of "
                              f"the CPU stand-in's: unset it", source=rank)
    return tensorrt_standin


def open_engine(engine_dir, *, kv_cache_fraction: float | None = None, cuda_graphs: bool = False,
                simulate_graphs: bool = False, target_only: bool = False):
    """``(engine, manifest, description)`` for the python-backend model, chosen by engine.json's ``backend``: a cpu or
    cuda engine through the project's stand-in engine, a TensorRT-LLM engine through
    :func:`~dflash2_trt.engine.trtllm.session.open_trt_session` (TensorRT, TensorRT-LLM's plugin library and the
    engine's libdflash2_plugins.so: a GPU machine), a GPU engine's KV pool (cuda or TensorRT) at most
    ``kv_cache_fraction`` of the free GPU memory (None: the build's). Both give the Runtime the same interface, so
    everything after this is one code path. The description says what runs the engine (the model logs it).
    ``cuda_graphs`` (the model's ``cuda_graph_mode`` parameter): generation steps replayed from CUDA graphs, a cuda
    engine's by :class:`~dflash2_trt.engine.standin.graphs.GraphedSteps`, a TensorRT session's by its own
    (``engine/trtllm/session_graphs.py``); ``simulate_graphs``: their bookkeeping on the CPU, for tests.
    ``target_only`` (the model's ``target_only`` parameter, ``serve --target-only``): the autoregressive baseline
    instead of the combined engine, as ``bench run`` runs it: a cpu or cuda engine directory's target alone
    (:class:`~dflash2_trt.bench.autoregressive.TargetOnlyEngine`), a TensorRT engine directory's ``baseline/``
    (``build --baseline``; tp 1); ``K`` 0, one token per request per step."""
    from ...engine.graph_rules import refuse_graphs

    engine_dir = Path(engine_dir)
    backend = _engine_backend(engine_dir)
    _, description = model_runtime(backend)
    graphs = bool(cuda_graphs or simulate_graphs)
    if cuda_graphs:
        refuse_graphs(backend, field="cuda_graph_mode")
    with_graphs = " (generation steps replayed from CUDA graphs)" if graphs else ""
    if backend != "trtllm":
        if kv_cache_fraction is not None and backend != "cuda":
            raise ConfigError(f"applies to GPU engines (a cuda engine's or the TensorRT session's KV pool); this is a "
                              f"{backend} engine", field="kv_cache_free_gpu_mem_fraction")
        from ...engine.standin.engine import open_standin_engine

        kw = {} if kv_cache_fraction is None else {"kv_cache_fraction": float(kv_cache_fraction)}
        if target_only:   # bench run's baseline engine, served
            from ...bench.autoregressive import TargetOnlyEngine

            kw["engine_cls"] = TargetOnlyEngine
            description += "; the target alone (the autoregressive baseline, K 0)"
        engine, man = open_standin_engine(engine_dir, **kw)
        if graphs:
            from ...engine.standin.graphs import GraphedSteps

            try:
                engine = GraphedSteps(engine, simulate=simulate_graphs)
            except ConfigError:
                engine.close()
                raise
        return engine, man, description + with_graphs
    from ...engine.trtllm.ranks import FollowerExit, open_project_session

    trt = tensorrt_standin_hook(engine_dir)
    kw = {} if kv_cache_fraction is None else {"kv_cache_fraction": float(kv_cache_fraction)}
    if target_only:
        refuse_target_only_trtllm(engine_dir)
        kw["baseline"] = True
    if graphs:
        kw.update(cuda_graphs=cuda_graphs, simulate_graphs=simulate_graphs)
    try:
        # tp 1: the engine's session; a tp engine under mpirun (the repository's launch.sh, `serve`): rank 0's
        # RankedSession, the other ranks following it (deploy/triton/follower.py)
        engine, man = open_project_session(engine_dir, trt=trt, **kw)   # trt given: no plugin library is loaded
    except FollowerExit:
        # a tritonserver on a rank > 0 (TensorRT-LLM's launcher starts one per rank): it followed rank 0 until rank 0
        # closed the engine, and serves nothing
        raise ConfigError("this tritonserver is a tp rank > 0: it followed rank 0's steps until rank 0 closed the "
                          "engine, and serves nothing (the repository's launch.sh runs the other ranks as "
                          "`python -m dflash2_trt.deploy.triton.follower`)", source=engine_dir) from None
    if trt is not None:
        description = (f"the project runtime over the CPU STAND-IN of TensorRT's execution API "
                       f"(dflash2_trt/testing/tensorrt_standin.py), NOT TensorRT: test hook {STANDIN_ENV}=1, no "
                       f"plugin library loaded")
    if getattr(engine, "tp", 1) > 1:
        description += f"; tp {engine.tp}: rank 0 in this process, ranks 1-{engine.tp - 1} following it under MPI"
    if target_only:
        description += "; its baseline/ engine (the target alone, K 0)"
    return engine, man, description + with_graphs


def graph_report(engine) -> dict | None:
    """The CUDA-graph counts and failure of an engine :func:`open_engine` opened with graphs, else None."""
    graphs = getattr(engine, "graphs", None)          # a TensorRT session's
    if graphs is not None:
        return graphs.report()
    from ...engine.standin.graphs import GraphedSteps

    return engine.report() if isinstance(engine, GraphedSteps) else None


class Sink(Protocol):
    """Where one request's responses go (a Triton response sender, or a collector)."""

    def send(self, tensors: dict[str, np.ndarray], final: bool) -> None: ...

    def error(self, message: str) -> None: ...

    def cancelled(self) -> bool: ...


@dataclass
class _Live:
    spec: Spec
    sink: Sink
    request: object
    scheduled_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    last_chunk: list[int] = field(default_factory=list)


class ServingLoop:
    """One project runtime in a background thread, fed by :meth:`submit` from any thread."""

    def __init__(self, engine, *, max_batch_size: int | None = None, poll_cancel: bool = True,
                 drain_file: str | os.PathLike | None = None, chunked_context: bool | None = None,
                 max_num_tokens: int | None = None, chunked_context_switch: str | None = None,
                 log: Callable[[str], None] | None = None):
        from ...runtime import Runtime

        self.engine = engine
        self.log = log    # notes for the server's log (a request_output_len shortened to fit)
        self.K = engine.K
        # the runtime's (chunked_context: the python model's enable_chunked_context parameter; max_num_tokens: a
        # budget below the engine's, not exposed as a parameter)
        self._runtime_args = {"max_batch_size": max_batch_size, "chunked_context": chunked_context,
                              "max_num_tokens": max_num_tokens, "chunked_context_switch": chunked_context_switch}
        self._Runtime = Runtime
        self.runtime = Runtime(engine, **self._runtime_args)
        self.poll_cancel = poll_cancel
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[int, _Live] = {}
        self._closed = threading.Event()
        self.steps = 0
        self.errors: list[str] = []
        self.drain_file = drain_file
        self._drain: tuple[float, float] | None = None
        self._drain_checked = 0.0
        self._ended = False                  # the loop thread has stopped taking requests (under _submit_lock)
        self._end_reason = "no error"
        self._submit_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="dflash2-serving", daemon=True)
        self._thread.start()

    # ---- any thread ------------------------------------------------------------------------------
    def submit(self, spec: Spec, sink: Sink, task_id=None) -> None:
        """Queue a request; a request the engine cannot take raises :class:`ConfigError` here."""
        from ...runtime import Request

        if self._closed.is_set():
            raise NotServing("the model is shutting down")
        if self.draining(now=True):
            raise NotServing("the server is shutting down: it takes no new requests")
        # as TensorRT-LLM's executor validates a request (tensorrtllm_backend.yaml `requests`): request_output_len
        # past what max_seq_len leaves beside the prompt and the draft slots is shortened to it, with a log line (once
        # the runtime has taken the request as shortened: a prompt it refuses is refused, not noted)
        asked = spec.max_new_tokens
        room = self.runtime.token_capacity - len(spec.prompt_ids) - (self.K + 1)
        req = Request(list(spec.prompt_ids), room if 1 <= room < asked else asked, temperature=spec.temperature,
                      seed=spec.seed, stop_token_ids=tuple(spec.stop_token_ids), task_id=task_id)
        self.runtime.check(req)   # reads the engine's limits only: safe beside the loop thread
        if req.max_new_tokens < asked and self.log is not None:
            who = f"request {task_id}" if task_id not in (None, "") else "a request"
            cap = self.runtime.token_capacity
            limit = (f"max_seq_len {cap}" if cap == self.runtime.max_seq_len else
                     f"the {cap} tokens the KV pool holds (max_seq_len {self.runtime.max_seq_len})")
            self.log(f"tensorrt_llm: {who}: prompt ({len(spec.prompt_ids)}) + request_output_len ({asked}) + draft "
                     f"slots ({self.K + 1}) exceed {limit}: request_output_len is changed to {req.max_new_tokens}")
        with self._submit_lock:   # never queued after the loop's last look at the queue: it would wait forever
            if self._ended:
                raise NotServing("the model is shutting down" if self._closed.is_set() else
                                 f"the model's serving loop has ended ({self._end_reason}); restart the server")
            self._q.put((req, spec, sink))

    def draining(self, now: bool = False) -> bool:
        """True once a drain was asked (the loop looks at the drain file at most every 50 ms; ``now``: look)."""
        if self._drain is None and self.drain_file is not None:
            t = time.monotonic()
            if now or t - self._drain_checked >= 0.05:
                self._drain_checked = t
                self._drain = read_drain(self.drain_file)
        return self._drain is not None

    def close(self, timeout: float = 30.0) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._q.put(None)
        self._thread.join(timeout)

    # ---- the loop thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                try:
                    if not self._iteration():
                        return
                except Exception as exc:  # noqa: BLE001 - fail the batch, keep serving
                    # the step, or the bookkeeping around it (a cancel, a response): before, an error outside the
                    # step ended this thread, and every later request waited forever
                    if isinstance(exc, _StepFailed):
                        message = f"engine step failed: {type(exc.error).__name__}: {exc.error}"
                    else:
                        message = f"serving loop error: {type(exc).__name__}: {exc}"
                    self._fail_all(message)
                    self.runtime = self._Runtime(self.engine, **self._runtime_args)
        except BaseException as exc:   # the thread ends (a fresh runtime could not be made): said to later requests
            self._end_reason = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            with self._submit_lock:
                self._ended = True
            self._fail_all("the model is shutting down")

    def _iteration(self) -> bool:
        """Take in what was submitted, reap cancelled requests, run one step; False once closed."""
        item = self._q.get() if not self.runtime.has_work else self._get_nowait()
        while item is not _EMPTY:
            if item is None:
                return False
            req, spec, sink = item
            try:
                self.runtime.submit(req)
            except Exception as exc:  # noqa: BLE001 - this request fails, the others go on
                _safe(sink.error, f"the request could not be scheduled: {type(exc).__name__}: {exc}")
            else:
                self._live[id(req)] = _Live(spec, sink, req)
            item = self._get_nowait()
        if self.poll_cancel:
            self._reap_cancelled()
        if self.draining() and time.time() >= self._drain[0]:
            self._end_in_flight(f"the server is shutting down: the request was ended before it finished "
                                f"(the {self._drain[1]:g} s drain timeout passed)")
        if not self.runtime.has_work:
            return True
        t_step = time.monotonic_ns()
        try:
            finished = self.runtime.step(on_tokens=self._on_tokens)
        except Exception as exc:
            raise _StepFailed(exc) from exc
        self.steps += 1
        for live in self._live.values():
            # first scheduled: the step that took its prompt's first chunk (a prompt cut in chunks emits nothing
            # before its last, so on_tokens is too late for it)
            if live.scheduled_ns is None and getattr(live.request, "context_pos", 0) > 0:
                live.scheduled_ns = t_step
        for r in finished:
            self._finish(r)
        return True

    def _get_nowait(self):
        try:
            return self._q.get_nowait()
        except queue.Empty:
            return _EMPTY

    def _reap_cancelled(self) -> None:
        for key, live in list(self._live.items()):
            try:
                gone = live.sink.cancelled()
            except Exception:  # noqa: BLE001 - a sender that cannot answer is gone
                gone = True
            if gone:
                self.runtime.cancel(live.request)
                del self._live[key]
                _safe(live.sink.error, "request cancelled")

    def _end_in_flight(self, message: str) -> None:
        for live in self._live.values():
            self.runtime.cancel(live.request)
            _safe(live.sink.error, message)
        self._live.clear()

    def _on_tokens(self, r, new: list[int]) -> None:
        live = self._live[id(r)]
        now = time.monotonic_ns()
        if live.first_token_ns is None:    # (scheduled_ns: stamped after the step, from its first chunk)
            live.first_token_ns = now
        live.last_token_ns = now
        new = self._cut_at_stop_word(live.spec.stop_words, r, new)
        if ended_at_end_token(r) and new:
            new = new[:-1]      # the step's last token is the end token (the runtime stops at it): not sent
        if r.done:
            live.last_chunk = new
        elif live.spec.streaming and new:
            _safe(live.sink.send, self._tensors(live, r, new), False)

    @staticmethod
    def _cut_at_stop_word(words: list[list[int]], r, new: list[int]) -> list[int]:
        """Truncate the request at the first stop word completed by this step's tokens (kept in the
        output, as a stop token is); the runtime then frees it as finished this step."""
        if not words:
            return new
        before = len(r.output_ids) - len(new)
        for j in range(len(new)):
            end = before + j + 1
            if any(end >= len(w) and r.output_ids[end - len(w):end] == w for w in words):
                del r.output_ids[end:]
                r.stop_reason = "stop_words"
                return new[:j + 1]
        return new

    def _finish(self, r) -> None:
        live = self._live.get(id(r))
        if live is None:
            return
        if live.spec.streaming:
            tokens = live.last_chunk
        else:
            out = list(r.output_ids[:-1] if ended_at_end_token(r) else r.output_ids)
            tokens = out if live.spec.exclude_input else list(r.prompt_ids) + out
        tensors = self._tensors(live, r, tokens)   # before it leaves _live: if this raises, _fail_all answers it
        del self._live[id(r)]
        _safe(live.sink.send, tensors, True)

    def _tensors(self, live: _Live, r, tokens: list[int]) -> dict[str, np.ndarray]:
        i32 = lambda v: np.array([[v]], dtype=np.int32)  # noqa: E731
        out = {"output_ids": np.array([[tokens]], dtype=np.int32).reshape(1, 1, len(tokens)),
               "sequence_length": i32(len(tokens))}
        spec = live.spec
        if spec.perf:
            st = draft_stats(r.acceptance_lengths, self.K)
            blocks = self.runtime.reserved_blocks(r)
            i64 = lambda v: np.array([[v or 0]], dtype=np.int64)  # noqa: E731
            out.update({"acceptance_rate": np.array([[st["acceptance_rate"]]], dtype=np.float32),
                        "total_accepted_draft_tokens": i32(st["total_accepted_draft_tokens"]),
                        "total_draft_tokens": i32(st["total_draft_tokens"]),
                        # TensorRT-LLM's RequestPerfMetrics.kvCacheMetrics: this runtime reserves a request's
                        # lifetime of blocks at admission, all new (no block reuse)
                        "kv_cache_alloc_new_blocks": i32(blocks),
                        "kv_cache_reused_blocks": i32(0),
                        "kv_cache_alloc_total_blocks": i32(blocks),
                        "arrival_time_ns": i64(spec.arrival_ns), "first_scheduled_time_ns": i64(live.scheduled_ns),
                        "first_token_time_ns": i64(live.first_token_ns), "last_token_time_ns": i64(live.last_token_ns)})
        if spec.num_input:
            out["num_input_tokens"] = i32(len(r.prompt_ids))
        if spec.num_output:
            out["num_output_tokens"] = i32(len(tokens))    # this response's (TensorRT-LLM's fillTritonResponse)
        return out

    def _fail_all(self, message: str) -> None:
        self.errors.append(message)
        closing = False
        while True:
            item = self._get_nowait()
            if item is _EMPTY:
                break
            if item is None:
                closing = True   # close()'s: put back below, or the loop would wait for it forever
            else:
                _safe(item[2].error, message)
        if closing:
            self._q.put(None)
        for live in self._live.values():
            _safe(live.sink.error, message)
        self._live.clear()


_EMPTY = object()


class _StepFailed(Exception):
    """The runtime's step raised ``error`` (the batch fails; the loop goes on with a fresh runtime)."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def _safe(fn, *args) -> None:
    """Deliver to a sink; a client that went away must not stop the loop serving the others."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001
        pass
