"""The project runtime over a TensorRT engine built by trtllm-build: :class:`TrtEngineSession`.

TensorRT-LLM's C++ executor cannot drive every DFlash2 engine (the hybrid target is "recurrent" to it; per-layer
windows that differ make an engine "variable window", and a target's sliding layers on the context route read inputs it
does not bind: :mod:`.paths`, :mod:`.windows`). The engine itself does the draft, verify,
accept and state commit, so what a runtime has left to do is bookkeeping (the project's :class:`~dflash2_trt.runtime.
Runtime`: paged KV blocks, in-flight batching, the EAGLE feed) and binding. This module is the binding: it opens a
rank engine through TensorRT's Python API the way TensorRT-LLM's Python runtime does (``tensorrt_llm/runtime/
session.py``), owns the paged KV pool and the recurrent-state slots on the device, and executes one step per
``step(inputs)`` with the same interface the project runtime drives a CPU engine through (``K``, ``limits``,
``vocab_size``, ``num_blocks``, ``recurrent``, ``num_slots``, ``reset_slot``, ``step``, ``close``).

Per step (every fact: ``facts/tensorrt_session.yaml``):

- the feed (the runtime's per-step tensors plus the static ones a runtime fills once: windows, sink length, pool
  pointers and mapping, perf knobs, context progress, the state pointers) is bound by TensorRT-LLM's runtime rules
  (:func:`dflash2_trt.engine.binding.bind`, engine_io.yaml ``runtime_binding``: the CPU engine's rules) against the ENGINE's inputs as
  TensorRT reports them (name, dtype, profile 0);
- the block offsets come from the runtime in TensorRT-LLM's pool index (``block * layers * 2 + field``, the attention
  plugin's addressing of a ``[blocks, layers, 2, heads, tokens, head_size]`` pool: ``runtime/kv_cache.py``);
- each input is copied into a persistent, 256-byte aligned buffer: host memory (pinned on a GPU) for what the
  plugins dereference on the host (engine_io.yaml ``memory: host``, the state pointers), device memory for the rest;
  a zero-volume input gets a one-element dummy (TensorRT takes no null address);
- ``set_input_shape`` for every input (False is the runtime's invalid-shape error), ``infer_shapes`` (nothing may be
  missing), outputs allocated from ``get_tensor_shape``, ``set_tensor_address`` for everything, ``execute_async_v3``
  on the session's one stream, synchronised; the outputs come back as CPU tensors (``logits`` stays on the device).

Where TensorRT-LLM is installed its own pieces do their part: ``import tensorrt_llm`` loads its plugin library, its
``MemoryPoolsAllocator`` allocates the KV pool and builds the pointer table and layer mapping, and its ``Session``
opens the engine (runtime, deserialization, context). The per-step address binding and ``execute_async_v3`` are this
module's on both paths, because ``Session.run`` ignores ``set_tensor_address``'s result (facts ``session_py``).
Without TensorRT-LLM (CI; a GPU box without it) the opening runs here too, from the same recorded facts, over the
``trt`` namespace handed in: TensorRT itself or the CPU stand-in of its execution API
(``dflash2_trt/testing/tensorrt_standin.py``).

A tp engine: one session per rank, each in its own process under ``mpirun`` (:mod:`.ranks` drives them in lockstep),
on ``cuda:(rank % GPUs)``, binding ``rank{r}.engine`` with its own KV pool and state slots (its heads) and TensorRT-LLM's
custom all-reduce workspace (``CustomAllReduceHelper.allocate_workspace``, facts ``multi_rank``: the pointer table in
host memory, the IPC buffers kept alive by the session).

CUDA graphs (``cuda_graphs``; experimental, not yet run on a GPU): generation steps captured and replayed per key as
TensorRT-LLM's executor does with a TensorRT engine (:mod:`.session_graphs`).
"""

from __future__ import annotations

import functools
import json
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import plugins
from ...config.build import fit_pool_blocks, pool_blocks
from ...errors import ConfigError, MissingDependencyError
from ...trtllm.backend import cuda_free_bytes, load_network
from ...trtllm.cpu.functional import str_dtype_to_torch
from ...trtllm.engine_io import load_contract
from ...trtllm.register import import_tensorrt_llm
from ...trtllm.gdn_slot import engine_slot_layout
from ..binding import bind, layer_windows, static_inputs
from ..format import file_problems, load_engine_dir
from ..pretrained import BASELINE_DIR, TARGET_ONLY, engine_draft_len, is_target_only
from .runtime_rules import facts as _facts_file
from .xqa import apply_runtime_env

@functools.lru_cache(maxsize=1)
def facts() -> dict:
    """``facts/tensorrt_session.yaml``: TensorRT's execution API and TensorRT-LLM's Python runtime as recorded."""
    return _facts_file("tensorrt_session")


def alignment() -> int:
    return int(facts()["tensorrt_api"]["rules"]["address_alignment"]["bytes"])


@functools.lru_cache(maxsize=1)
def input_memory() -> dict:
    """Engine input name -> "host" | "device" (engine_io.yaml ``memory``); the state pointers are host inputs."""
    return {p.name: p.memory or "device" for p in load_contract()["inputs"]}


def _is_host(name: str) -> bool:
    return memory_of(name) == "host"


def memory_of(name: str) -> str:
    if name.startswith(("rnn_state_ptr_", "conv_state_ptr_")):
        return "host"
    if name == "greedy_sampling":
        return facts()["greedy_sampling"]["engine_input"]["memory"]
    return input_memory().get(name, "device")


# ------------------------------------------------------------------------------------------------- memory
class AlignedBuffer:
    """A persistent buffer of ``capacity`` bytes whose first byte is ``alignment()``-aligned (TensorRT's
    setTensorAddress rule), on ``device`` (host memory pinned when ``pin``). :meth:`view` hands out a prefix as a
    tensor of a given dtype and shape; the address stays the same from step to step."""

    def __init__(self, nbytes: int, device: torch.device, *, pin: bool = False):
        a = alignment()
        self.capacity = max(int(nbytes), 1)
        self._raw = torch.empty(self.capacity + a, dtype=torch.uint8, device=device, pin_memory=pin)
        self._off = (-self._raw.data_ptr()) % a
        self.device = device

    @property
    def address(self) -> int:
        return self._raw.data_ptr() + self._off

    def view(self, dtype: torch.dtype, shape) -> torch.Tensor:
        n = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        if n > self.capacity:
            raise ValueError(f"{n} bytes do not fit a buffer of {self.capacity}")
        return self._raw[self._off:self._off + n].view(dtype).view(tuple(shape))


# ------------------------------------------------------------------------------------------------- engine I/O
@dataclass(frozen=True)
class EngineTensor:
    """One I/O tensor of a deserialized engine, as TensorRT reports it; ``dtype`` / ``shape`` / ``profiles`` are what
    :func:`~dflash2_trt.engine.binding.bind` reads of a declaration."""
    name: str
    is_input: bool
    dtype: str                 # float32, int32, ... (torch names via str_dtype_to_torch)
    shape: tuple               # build-time, -1 = dynamic
    location: str              # "device" | "host" (TensorRT's TensorLocation)
    profile: tuple | None      # ((min, opt, max), ...) per dimension of profile 0 (inputs)

    @property
    def profiles(self) -> list:
        return [list(self.profile)]


_TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT32": "int32", "INT64": "int64",
               "INT8": "int8", "BOOL": "bool", "UINT8": "uint8"}


def engine_tensors(trt, engine) -> dict:
    """name -> :class:`EngineTensor` for every I/O tensor of ``engine`` (``num_io_tensors``, ``get_tensor_name``,
    ``get_tensor_mode``, ``get_tensor_dtype``, ``get_tensor_shape``, ``get_tensor_location``,
    ``get_tensor_profile_shape(name, 0)``)."""
    out = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        dt = engine.get_tensor_dtype(name)
        dtype = _TRT_DTYPES.get(getattr(dt, "name", str(dt)).split(".")[-1])
        if dtype is None:
            raise ConfigError(f"engine tensor {name!r} has TensorRT dtype {dt}, which this runtime does not bind")
        location = "host" if engine.get_tensor_location(name) == trt.TensorLocation.HOST else "device"
        profile = None
        if is_input:
            if location == "host":
                # a shape-tensor input: TensorRT-LLM's engines have none (facts trtllm_engine_inputs_location)
                raise ConfigError(f"engine input {name!r} is a host-located (shape) tensor; TensorRT-LLM engines have "
                                  f"none and this runtime binds none")
            lo, opt, hi = engine.get_tensor_profile_shape(name, 0)
            profile = tuple((int(a), int(b), int(c)) for a, b, c in zip(lo, opt, hi))
        out[name] = EngineTensor(name, is_input, dtype, tuple(int(d) for d in engine.get_tensor_shape(name)),
                                 location, profile)
    return out


# ------------------------------------------------------------------------------------------------- execution
class EngineOpenError(ConfigError):
    """TensorRT could not deserialize a rank engine or make its execution context; :func:`open_trt_session` adds
    what ``engine.json`` records of the TensorRT that built it beside the one loaded here."""


def tensorrt_mismatch(built_with, loaded) -> str | None:
    """A note when the TensorRT ``loaded`` here is not the release ``built_with`` (engine.json ``versions.tensorrt``):
    a TensorRT engine deserializes only on the release that built it (trtllm-build makes no version-compatible
    engines). Major.minor.patch compared; None where either is unknown or they agree."""
    def release(v):
        parts = re.findall(r"\d+", str(v))[:3]
        return tuple(int(x) for x in parts) if len(parts) == 3 else None

    a, b = release(built_with), release(loaded)
    if a is None or b is None or a == b:
        return None
    return (f"the engine was built with TensorRT {built_with} (engine.json versions.tensorrt) and TensorRT {loaded} "
            f"is loaded here: rebuild the engine on this machine, or install the TensorRT-LLM that brings {built_with}")


def current_gpu_sm() -> str | None:
    """The visible CUDA device's architecture as engine.json ``gpu.sm`` spells it (``sm_90a``); None without one."""
    if not torch.cuda.is_available():
        return None
    from .toolchain import sm_of

    major, minor = torch.cuda.get_device_capability()
    return sm_of(f"{major}.{minor}")


def gpu_mismatch(built_on, here) -> str | None:
    """A note when this GPU's architecture ``here`` is not the one the engine was built on (engine.json ``gpu.sm``):
    a TensorRT engine runs only on the architecture it was built for. None where either is unknown or they agree."""
    if not built_on or not here or built_on == here:
        return None
    return (f"the engine was built on {built_on} (engine.json gpu.sm) and this GPU is {here}: rebuild the engine on "
            f"this GPU")


class OwnExecution:
    """TensorRT-LLM's ``Session`` steps (facts ``session_py``) over a ``trt`` namespace: deserialize, one execution
    context with profile 0 selected on the session's stream; per step the addresses and ``execute_async_v3``."""

    def __init__(self, trt, engine_bytes: bytes, stream_handle: int):
        self.trt = trt
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise EngineOpenError("TensorRT could not deserialize the engine (TensorRT's log above says why: a "
                                  "different TensorRT version, or a plugin library not loaded)")
        self.context = self.engine.create_execution_context()
        if not self.context.set_optimization_profile_async(0, stream_handle):
            raise RuntimeError("TensorRT refused optimization profile 0")

    def run(self, addresses: dict, stream_handle: int) -> bool:
        for name, address in addresses.items():
            if not self.context.set_tensor_address(name, address):
                raise RuntimeError(f"TensorRT refused the address of {name!r} ({address:#x}: not an engine tensor, or "
                                   f"not {alignment()}-byte aligned)")
        return bool(self.context.execute_async_v3(stream_handle))


class TrtllmExecution(OwnExecution):   # pragma: no cover - needs TensorRT-LLM (GPU machines)
    """The engine opened by TensorRT-LLM's own ``tensorrt_llm.runtime.Session`` (``from_serialized_engine``: its
    runtime, deserialization and context); used where TensorRT-LLM imports. Each step binds as :class:`OwnExecution`
    does, with ``set_tensor_address``'s result checked: ``Session.run`` makes the same calls but ignores that result
    (facts ``session_py`` ``unchecked_set_tensor_address``), so an address TensorRT refuses would go unnoticed into
    ``execute_async_v3``. ``Session`` selects profile 0 on torch's current stream without reading the result; it is
    selected again here on the session's stream, checked (facts ``session_py`` ``open``)."""

    def __init__(self, trt, engine_bytes: bytes, stream_handle: int):
        from tensorrt_llm.runtime import Session

        self.trt = trt
        failed = EngineOpenError("TensorRT could not deserialize the engine or create its execution context "
                                 "(TensorRT's log above says why: a different TensorRT version, a plugin library not "
                                 "loaded, or no device memory left)")
        try:
            self.session = Session.from_serialized_engine(engine_bytes)
        except AttributeError as exc:
            # Session._init uses what deserialize_cuda_engine (and, in older revisions, create_execution_context)
            # returned without a None check: a failure surfaces as an AttributeError on None
            if "NoneType" not in str(exc):
                raise
            raise failed from None
        except AssertionError as exc:      # newer revisions assert the context is not None
            if "execution context" not in str(exc):
                raise
            raise failed from None
        self.engine, self.context = self.session.engine, self.session.context
        if self.context is None:           # Session makes none for an engine built with weight streaming
            raise ConfigError("TensorRT-LLM's Session made no execution context (an engine built with weight "
                              "streaming?); rebuild the engine with dflash2-trt build")
        if not self.context.set_optimization_profile_async(0, stream_handle):
            raise RuntimeError("TensorRT refused optimization profile 0")


# ------------------------------------------------------------------------------------------------- the session
def session_limits(config: dict) -> dict:
    """The engine's limits as the project runtime reads them: batch, input and token limits from ``build_config``,
    ``max_seq_len`` and ``tokens_per_block`` as the build set them (``pretrained_config.dflash2_engine``; trtllm-build's
    own ``max_seq_len`` adds the draft slots, and its ``tokens_per_block`` sits in ``plugin_config``)."""
    pre, build = config["pretrained_config"], dict(config["build_config"])
    eng = pre.get("dflash2_engine") or {}
    for k in ("max_seq_len", "tokens_per_block"):
        if eng.get(k) is not None:
            build[k] = eng[k]
        elif k == "tokens_per_block" and k not in build:
            build[k] = (build.get("plugin_config") or {}).get(k)
    K = engine_draft_len(pre)
    lim = {k: int(build[k]) for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
                                       "tokens_per_block")}
    if lim["max_num_tokens"] < lim["max_batch_size"] * (K + 1):       # trtllm-build's own rule
        raise ConfigError(f"max_num_tokens {lim['max_num_tokens']} < max_batch_size x (K+1) = "
                          f"{lim['max_batch_size'] * (K + 1)}", field="max_num_tokens")
    lim["num_kv_blocks"] = int(build.get("num_kv_blocks") or 0)
    return lim


class TrtEngineSession:
    """One rank engine of a TensorRT-LLM engine directory, driven by the project runtime (module docstring).

    ``engine_bytes``: the serialized rank engine; ``config``: the engine's ``config.json`` (``pretrained_config`` +
    ``build_config``); ``trt``: the ``tensorrt`` module or its stand-in; ``device``: where device memory lives (CUDA;
    with the stand-in, the CPU may play the device); ``num_blocks`` / ``num_slots``: the KV pool's blocks and the
    recurrent-state slots (default: every request at max_seq_len, and on a GPU at most ``kv_cache_fraction`` (the
    build's ``kv_cache_free_gpu_mem_fraction``, 0.9) of the memory free once the engine is loaded, as TensorRT-LLM
    sizes its pool; slots = max_batch_size);
    ``greedy_sampling``: the value bound to a ``greedy_sampling`` input when the engine declares one (0: the request's
    temperature decides, which is what the project runtime's per-request temperatures mean; see README); ``rank``:
    which rank engine of a tp engine this is (its process's MPI rank); ``launched``: this process is one of the tp
    processes an MPI launcher started (:mod:`.ranks` says so; a rank alone would wait forever in its first
    all-reduce, so a tp engine is refused without it); ``local_rank`` / ``gpus_per_node``: the rank among this node's
    processes and their number (the GPU it takes, the workspace's mapping); ``cuda_graphs``: generation steps
    replayed from CUDA graphs (:mod:`.session_graphs`; ``simulate_graphs``: its bookkeeping with replays executed, for
    the stand-in); ``agree_blocks``: a tp engine's ranks agree on the KV pool's block count before it is allocated
    (:mod:`.ranks` passes the MPI minimum over the ranks)."""

    def __init__(self, engine_bytes: bytes, config: dict, *, trt, device=None, num_blocks: int | None = None,
                 num_slots: int | None = None, greedy_sampling: int = 0, use_trtllm: bool | None = None,
                 kv_cache_fraction: float | None = None, rank: int = 0, launched: bool = False,
                 local_rank: int | None = None, gpus_per_node: int | None = None, cuda_graphs: bool = False,
                 simulate_graphs: bool = False, agree_blocks=None):
        self.trt = trt
        self.config = dict(config["pretrained_config"])
        pre = self.config
        self.tp = int(pre["mapping"]["tp_size"])
        self.rank = int(rank)
        if not 0 <= self.rank < self.tp:
            raise ConfigError(f"rank {self.rank} of a tp {self.tp} engine", field="pretrained_config.mapping.tp_size")
        if self.tp > 1 and not launched:
            raise ConfigError(f"a tp {self.tp} engine runs as {self.tp} processes, one per rank: mpirun -n {self.tp} "
                              f"dflash2-trt run ... (docs/trt-session.md §4); one rank alone would wait forever in its "
                              f"first all-reduce", field="pretrained_config.mapping.tp_size")
        self.limits = session_limits(config)
        d = pre["dflash2"]
        self.K = engine_draft_len(pre)     # 0 for the baseline engine (build --baseline): the target alone
        self.vocab_size = int(pre["vocab_size"])
        self.mask_token_id = int(d["mask_token_id"])
        # rank r on its node's GPU (local rank % GPUs), made the current device before the engine, the workspace or
        # any buffer is made, as TensorRT-LLM's runtime does (facts multi_rank.device)
        local = self.rank if local_rank is None else int(local_rank)
        self.gpus_per_node = gpus_per_node
        dev = torch.device(device) if device is not None else None
        if (dev is None or (dev.type == "cuda" and dev.index is None)) and torch.cuda.is_available():
            # "cuda" names no GPU: this rank's (torch's set_device refuses a device without an index)
            dev = torch.device("cuda", local % torch.cuda.device_count())
        self.device = dev if dev is not None else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._pin = self.device.type == "cuda"
        net = load_network("cpu")          # config arithmetic only (KV layers, windows, layer kinds)
        cfg = net.api.PretrainedConfig.from_dict(pre)
        self.num_layers = net.total_kv_layers(cfg)
        kinds = net.hf_layer_types(cfg)
        tpb, lim = int(self.limits["tokens_per_block"]), self.limits
        self.kv_dtype = str_dtype_to_torch(pre["dtype"])
        kvh = int(pre["num_key_value_heads"])
        self.kv_heads = net.local_heads(kvh, self.tp)
        self.head_size = int(pre["head_size"])
        self.tokens_per_block = tpb
        self._windows = layer_windows(net, pre, int(lim["max_seq_len"]))
        # chunked context (the project runtime's, facts/context_chunking.yaml): needs paged context FMHA in the engine
        # (trtllm-build's default, and what `dflash2-trt build` passes); the chunk unit depends on the largest window
        self.max_attention_window = int(self._windows.max())
        self.paged_context_fmha = bool((config.get("build_config", {}).get("plugin_config") or {})
                                       .get("use_paged_context_fmha", True))
        # the context route: the runtime feeds the second set of request inputs (engine_io.yaml sliding_*)
        self.sliding_context = net.sliding_context(cfg)
        # in TensorRT-LLM's order: the recurrent-state slots, then the engine and its context (TensorRT takes its
        # activation memory), then the KV pool from what is left
        # recurrent (Gated DeltaNet) layers: one rnn and one conv buffer per layer, a row per slot, zeroed
        self.gdn_layers = [i for i, t in enumerate(kinds) if t == "linear_attention"]
        self.recurrent = bool(self.gdn_layers)
        self.num_slots = int(num_slots or lim["max_batch_size"])
        self.rnn_states: dict[int, torch.Tensor] = {}
        self.conv_states: dict[int, torch.Tensor] = {}
        if self.recurrent:
            # TensorRT-LLM's RnnStateManager row [rnn_hidden_size / rnn_head_size, state_size, rnn_head_size] fp32:
            # the plugin's slot, the state and the deferred commit's records (trtllm/gdn_slot.py; a config whose
            # state_size is not the plugin's is refused there)
            la, lay = pre["linear_attention"], engine_slot_layout(pre)
            conv_dim = 2 * lay.num_k_heads * lay.head_k_dim + lay.num_v_heads * lay.head_v_dim
            for layer in self.gdn_layers:
                self.rnn_states[layer] = self._device_zeros((self.num_slots, *lay.row_shape), torch.float32)
                self.conv_states[layer] = self._device_zeros(
                    (self.num_slots, la["conv_kernel_size"] - 1, conv_dim), self.kv_dtype)
        self.greedy_sampling = int(greedy_sampling)
        # the engine and one execution context, profile 0, on the session's stream
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if use_trtllm is None:
            use_trtllm = importlib.util.find_spec("tensorrt_llm") is not None and self.device.type == "cuda"
        cls = TrtllmExecution if use_trtllm else OwnExecution
        self.execution = cls(trt, engine_bytes, self.stream_handle)
        self.tensors = engine_tensors(trt, self.execution.engine)
        self.inputs = {n: t for n, t in self.tensors.items() if t.is_input}
        self.outputs = {n: t for n, t in self.tensors.items() if not t.is_input}
        self._workspace_buffers, self.all_reduce_workspace = self._allocate_all_reduce_workspace(use_trtllm)
        self.num_blocks = self._pool_blocks(num_blocks, kv_cache_fraction)
        if agree_blocks is not None:
            # a tp engine's ranks: rank 0's block tables index every rank's pool, so all take the smallest (facts
            # multi_rank.kv_pool_size: TensorRT-LLM's KV cache manager takes the minimum over the ranks the same way)
            self.num_blocks = int(agree_blocks(self.num_blocks))
        self.pools, self.pool_pointers, self.pool_mapping = self._allocate_kv_pool(use_trtllm)
        self._static = self.static_inputs()
        self._buffers: dict[str, AlignedBuffer] = {}
        self._dummy = AlignedBuffer(16, self.device)
        self.bound: dict[str, torch.Tensor] = {}          # the last step's bound tensors (tests read them)
        self.addresses: dict[str, int] = {}
        self.graphs = None
        if cuda_graphs or simulate_graphs:
            from .session_graphs import SessionGraphs

            self.graphs = SessionGraphs(self, simulate=simulate_graphs)
        if self.stream is not None:      # the zeroing above ran on the stream current here (each step waits too)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    # ---- memory the session owns --------------------------------------------------------------------------
    def block_bytes(self) -> int:
        """Bytes of one pool block: every layer's K and V of ``tokens_per_block`` tokens."""
        return (self.num_layers * 2 * self.kv_heads * self.tokens_per_block * self.head_size
                * torch.empty((), dtype=self.kv_dtype).element_size())

    def _pool_blocks(self, num_blocks, fraction) -> int:
        """The pool's blocks (class docstring), and how they were sized in ``pool_sizing`` (``run``'s ``kv_pool``, as
        a cuda engine's)."""
        lim = self.limits
        every = pool_blocks(lim["max_seq_len"], self.tokens_per_block, lim["max_batch_size"])
        self.pool_sizing = {"every_request_blocks": every}
        if num_blocks or lim.get("num_kv_blocks"):
            self.pool_sizing.update(num_kv_blocks=int(num_blocks or lim["num_kv_blocks"]), rule="num_kv_blocks")
        elif self.device.type != "cuda":
            self.pool_sizing.update(num_kv_blocks=every, rule="every request at max_seq_len")
        else:
            free = cuda_free_bytes(self.device)   # a closed session's buffers given back first
            fraction = 0.9 if fraction is None else float(fraction)
            fits = fit_pool_blocks(every, free, self.block_bytes(), fraction)
            if fits < 1:
                raise ConfigError(f"no room for the KV pool: {free} bytes free after the engine, {self.block_bytes()} "
                                  f"per block", field="kv_cache_free_gpu_mem_fraction")
            self.pool_sizing.update(num_kv_blocks=fits, rule="free GPU memory", free_bytes=int(free),
                                    fraction=fraction, block_bytes=self.block_bytes())
        return self.pool_sizing["num_kv_blocks"]

    @property
    def stream_handle(self) -> int:
        return self.stream.cuda_stream if self.stream is not None else 0

    def _device_zeros(self, shape, dtype) -> torch.Tensor:
        buf = AlignedBuffer(int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size(), self.device)
        t = buf.view(dtype, shape)
        t.zero_()
        t._dflash2_buffer = buf          # keep the allocation alive with the view
        return t

    def _allocate_kv_pool(self, use_trtllm):
        """One pool (every layer has the same KV heads), laid out and described as TensorRT-LLM's
        ``MemoryPoolsAllocator`` does it (facts ``kv_pool``): ``[blocks, layers, 2, heads, tokens, head_size]``, the
        pointer table ``[[pool address, 0]]`` int64, the mapping ``[[0, layer]]`` int32. TensorRT-LLM's own allocator
        where it imports (and the device is a GPU), else the same layout here. Zeroed on both paths, where
        TensorRT-LLM's runtime leaves its pool as ``torch.empty`` made it (facts ``kv_pool.allocation``): a context
        request's draft rows read drafter K/V positions that its step's commit writes only afterwards (rows the step
        discards), and memory that held NaN bit patterns would put NaN there."""
        heads = [self.kv_heads] * self.num_layers
        if use_trtllm is None:
            use_trtllm = importlib.util.find_spec("tensorrt_llm") is not None and self.device.type == "cuda"
        if use_trtllm:   # pragma: no cover - needs TensorRT-LLM (GPU machines)
            from tensorrt_llm.runtime.memory_pools.memory_pools_allocator import MemoryPoolsAllocator

            alloc = MemoryPoolsAllocator(num_blocks=self.num_blocks, tokens_per_block=self.tokens_per_block,
                                         head_size=self.head_size)
            alloc.allocate(self.kv_dtype, heads, device=self.device)
            pools = list(alloc._pool_pointers)   # its pool tensors; no public accessor (facts kv_pool.allocator_pools)
            for pool in pools:
                pool.zero_()
            self._trtllm_pools = alloc
            return pools, alloc.get_kv_cache_pool_pointers(), alloc.pool_mapping
        shape = (self.num_blocks, self.num_layers, 2, self.kv_heads, self.tokens_per_block, self.head_size)
        pool = self._device_zeros(shape, self.kv_dtype)
        pointers = torch.tensor([[pool.data_ptr(), 0]], dtype=torch.int64)
        mapping = torch.tensor([[0, layer] for layer in range(self.num_layers)], dtype=torch.int32)
        return [pool], pointers, mapping

    def _allocate_all_reduce_workspace(self, use_trtllm):
        """A tp engine's ``all_reduce_workspace`` (facts ``multi_rank``): TensorRT-LLM's own
        ``CustomAllReduceHelper.allocate_workspace`` where it imports (IPC buffers between the ranks' GPUs, every rank
        calling it together; the pointer table a CPU tensor the AllReduce plugins read on the host), else a zeroed
        table of the same size (the stand-in's collectives do not read it). ``(buffers to keep alive, table)``;
        ``(None, None)`` for an engine without the input (tp 1). On a GPU without TensorRT-LLM there is no workspace
        to give (zeros would be null pointers to the plugins): refused."""
        spec = self.inputs.get("all_reduce_workspace")
        if spec is None:
            if self.tp > 1:
                raise ConfigError(f"a tp {self.tp} engine without an all_reduce_workspace input: its all-reduces would "
                                  f"have no workspace (rebuild it with this version)", field="all_reduce_workspace")
            return None, None
        entries = 7 * self.tp + 3          # facts multi_rank.table_entries
        lo, _, hi = spec.profile[0]
        if not lo <= entries <= hi:
            raise ConfigError(f"the engine's all_reduce_workspace takes {lo}..{hi} entries, TensorRT-LLM's table for tp "
                              f"{self.tp} has {entries}", field="all_reduce_workspace")
        if use_trtllm:   # pragma: no cover - needs TensorRT-LLM and several GPUs
            from tensorrt_llm.mapping import Mapping
            from tensorrt_llm.plugin.plugin import CustomAllReduceHelper

            mapping = Mapping(world_size=self.tp, rank=self.rank,
                              gpus_per_node=self.gpus_per_node or torch.cuda.device_count(), tp_size=self.tp)
            buffers, table = CustomAllReduceHelper.allocate_workspace(
                mapping, CustomAllReduceHelper.max_workspace_size_auto(self.tp))
            return buffers, table.to("cpu", torch.int64)
        if self.device.type == "cuda":
            raise MissingDependencyError(f"a tp {self.tp} engine's all-reduces need TensorRT-LLM's workspace "
                                         f"(CustomAllReduceHelper): tensorrt_llm is not importable here")
        return None, torch.zeros(entries, dtype=torch.int64)     # the CPU stand-in: its collectives read none

    def reset_slot(self, slot: int) -> None:
        """Zero a recurrent-state slot on every layer (a request's context starts from the zero state)."""
        for t in (*self.rnn_states.values(), *self.conv_states.values()):
            t[slot].zero_()

    def static_inputs(self) -> dict:
        """What a runtime fills once (TensorRT-LLM: setStaticInputTensors): windows, sink length, the pool's pointer
        table and layer mapping, perf knobs and context progress (engine_io.yaml ``static_input_values``), the state pointers
        (int64 [1] CPU tensors holding device addresses, facts ``recurrent_state``) and ``greedy_sampling`` when the
        engine declares it."""
        out = static_inputs(
            windows=self._windows, pool_pointers=self.pool_pointers, pool_mapping=self.pool_mapping,
            state_pointers={**{f"rnn_state_ptr_{layer}": torch.tensor([t.data_ptr()], dtype=torch.int64)
                               for layer, t in self.rnn_states.items()},
                            **{f"conv_state_ptr_{layer}": torch.tensor([t.data_ptr()], dtype=torch.int64)
                               for layer, t in self.conv_states.items()}},
            all_reduce_workspace=self.all_reduce_workspace)
        if "greedy_sampling" in self.inputs:
            out["greedy_sampling"] = torch.tensor([self.greedy_sampling], dtype=torch.int32)
        return out

    # ---- one step -------------------------------------------------------------------------------------------
    def _buffer(self, name: str, nbytes: int, device: torch.device, pin: bool) -> AlignedBuffer:
        buf = self._buffers.get(name)
        if buf is None or buf.capacity < nbytes:
            # inputs: sized once for the profile's maximum; outputs: grown to the largest step seen
            if name in self.inputs:
                prof = self.inputs[name].profile
                most = int(torch.Size([hi for _, _, hi in prof]).numel()) if prof else 0
                nbytes = max(nbytes, most * torch.empty((), dtype=str_dtype_to_torch(self.inputs[name].dtype))
                             .element_size())
            buf = self._buffers[name] = AlignedBuffer(nbytes, device, pin=pin)
        return buf

    def _place(self, name: str, t: torch.Tensor) -> tuple[torch.Tensor, int]:
        """``t`` copied into the input's persistent buffer in host or device memory; (the view, its address)."""
        host = memory_of(name) == "host"
        device = torch.device("cpu") if host else self.device
        nbytes = t.numel() * t.element_size()
        if nbytes == 0:                 # TensorRT takes no null address: a one-element dummy (tllmRuntime.cpp)
            return t.to(device), self._dummy.address
        buf = self._buffer(name, nbytes, device, pin=host and self._pin)
        view = buf.view(t.dtype, t.shape)
        view.copy_(t, non_blocking=host is False and self._pin)
        return view, buf.address

    def step(self, inputs: dict) -> dict:
        """One engine step on the runtime's feed (engine_io.yaml names); the outputs by name."""
        if self.execution is None:
            raise RuntimeError("the engine session is closed")
        feed = bind(self.inputs, {**self._static, **inputs})           # TensorRT-LLM's binding rules
        key = self.graphs.key(feed, _is_host) if self.graphs is not None else None
        ctx = self.execution.context
        bound, addresses = {}, {}
        if self.stream is not None:
            # work enqueued on the caller's stream comes first (the KV pool's and the state slots' zeroing at open,
            # reset_slot, the caller's own writes to the feed): torch's streams do not wait for the default stream
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        stream = torch.cuda.stream(self.stream) if self.stream is not None else _null()
        with stream:
            for name, t in feed.items():
                bound[name], addresses[name] = self._place(name, t.contiguous())
            for name, t in bound.items():
                if not ctx.set_input_shape(name, tuple(t.shape)):
                    lo, _, hi = zip(*self.inputs[name].profile)
                    raise RuntimeError(f"Tensor '{name}' has invalid shape {tuple(t.shape)}, expected in range min "
                                       f"{lo}, max {hi}")
            missing = list(ctx.infer_shapes())
            if missing:
                raise RuntimeError(f"Input shape not specified: {missing[0]}")
            outs = {}
            for name, spec in self.outputs.items():
                shape = tuple(int(s) for s in ctx.get_tensor_shape(name))
                dtype = str_dtype_to_torch(spec.dtype)
                nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
                buf = self._buffer(name, nbytes, self.device, pin=False)
                outs[name] = buf.view(dtype, shape)
                addresses[name] = buf.address
            entry = self.graphs.lookup(key, addresses) if self.graphs is not None else None
            if entry is not None:
                self.graphs.replay(entry, bound, self._run)
            else:
                if not self._run(addresses):
                    raise RuntimeError("TensorRT's execute_async_v3 failed (TensorRT's log says why)")
                if self.graphs is not None:
                    self.graphs.capture(key, bound, addresses, _is_host, self._run)
            if self.stream is not None:
                self.stream.synchronize()
        self.bound, self.addresses = bound, addresses
        return {name: (t if name == "logits" else t.to("cpu", copy=True)) for name, t in outs.items()}

    def _run(self, addresses: dict) -> bool:
        return self.execution.run(addresses, self.stream_handle)

    def close(self) -> None:
        """Release everything the session holds on the device: the engine and its execution context (the weights),
        the KV pool (TensorRT-LLM's allocator's too), the state slots, the workspace, the bound buffers and the
        graphs; on a GPU the memory goes back to the driver (``empty_cache``), so that another engine can be opened
        in the same process (``bench run``: the baseline after the speculative engine). The limits, K and the sizes
        stay readable; stepping a closed session is an error."""
        self.graphs = None
        self._buffers.clear()
        self._workspace_buffers = None
        self.all_reduce_workspace = None
        self.rnn_states.clear()
        self.conv_states.clear()
        self.pools = None
        self._trtllm_pools = None
        self.execution = None
        self._static = None
        self._dummy = None
        self.bound, self.addresses = {}, {}
        if getattr(self, "device", None) is not None and self.device.type == "cuda":   # pragma: no cover - GPU
            import gc

            gc.collect()                 # an engine kept alive by a reference cycle would keep its weights
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------------------------------------- opening
def load_plugin_libraries(engine_dir) -> None:   # pragma: no cover - needs TensorRT-LLM (GPU machines)
    """TensorRT-LLM's plugin library (``import tensorrt_llm`` loads it, facts ``plugin_loading``) and the engine
    directory's ``libdflash2_plugins.so``: the engine's layers are both libraries' plugins."""
    skip = facts()["plugin_loading"]["skip_env"]
    if os.environ.get(skip, "0") == "1":
        raise MissingDependencyError(f"{skip}=1 stops `import tensorrt_llm` from loading TensorRT-LLM's plugin library, "
                                     f"which the engine's attention layers need: unset it")
    if importlib.util.find_spec("tensorrt_llm") is None:
        raise MissingDependencyError("the engine's attention layers are TensorRT-LLM's plugins: pip install "
                                     "tensorrt-llm==1.2.* (NVIDIA's index) on the GPU machine, in an environment of "
                                     "its own, and run this from there (docs/trt-session.md §11)")
    import_tensorrt_llm()   # loads libnvinfer_plugin_tensorrt_llm.so (_common._init); its banner to stderr

    plugins.load_library(Path(engine_dir) / plugins.LIBRARY_NAME)


def open_trt_session(engine_dir, *, trt=None, rank: int = 0, verify: bool = False, load_plugins: bool = True,
                     baseline: bool = False, **kw) -> tuple[TrtEngineSession, dict]:
    """(session, manifest) of a TensorRT-LLM engine directory's rank engine: plugin libraries loaded, ``tensorrt``
    imported (or ``trt`` used: the CPU stand-in in tests), ``rank{rank}.engine`` deserialized. ``baseline``: the
    directory's baseline engine instead (``baseline/``, built by ``build --baseline``: :func:`baseline_config`)."""
    cfg, man = load_engine_dir(engine_dir, verify=verify)
    engine_dir = Path(engine_dir)
    where = engine_dir
    if baseline:
        cfg = baseline_config(engine_dir, cfg, man, verify=verify)
        where = engine_dir / BASELINE_DIR
    if trt is None:   # pragma: no cover - GPU machines
        apply_runtime_env(man)   # before TensorRT-LLM loads: what the engine was built with (xqa.py)
        if load_plugins:
            load_plugin_libraries(engine_dir)
        try:
            import tensorrt as trt
        except ImportError as exc:
            raise MissingDependencyError(f"TensorRT's Python package is not importable ({exc}): it comes with "
                                         f"tensorrt-llm 1.2.x") from None
    path = where / f"rank{rank}.engine"
    if not path.is_file():
        raise ConfigError(f"no {path.name} in the engine directory", source=where)
    kw.setdefault("kv_cache_fraction", (man.get("limits") or {}).get("kv_cache_free_gpu_mem_fraction"))
    try:
        return TrtEngineSession(path.read_bytes(), cfg, trt=trt, rank=rank, **kw), man
    except EngineOpenError as exc:
        notes = [n for n in (tensorrt_mismatch((man.get("versions") or {}).get("tensorrt"),
                                               getattr(trt, "__version__", None)),
                             gpu_mismatch((man.get("gpu") or {}).get("sm"), current_gpu_sm())) if n]
        raise EngineOpenError("; ".join([str(exc), *notes]), source=path) from None


def has_baseline(man: dict) -> bool:
    """Whether an engine directory's manifest records a baseline engine (``build --baseline``)."""
    return isinstance(man.get("baseline"), dict)


def baseline_config(engine_dir, cfg: dict, man: dict, *, verify: bool = False,
                    without: str = "or run `bench run --no-baseline`") -> dict:
    """The baseline engine's config.json (trtllm-build's, in ``baseline/``), checked: its files as engine.json's
    ``baseline.files`` records them (size; sha256 for config.json, every file with ``verify``), and against the
    combined engine's ``cfg``: the target alone (``dflash2_engine.network`` target_only), the same tp, vocabulary, dtype,
    layers and the limits the runtime relies on. A directory without one says how to build it; one whose files are
    gone or changed says to rebuild it or, ``without``, how to do without it."""
    engine_dir = Path(engine_dir)
    man_path = engine_dir / "engine.json"
    if not has_baseline(man):
        raise ConfigError(f"has no baseline engine: rebuild with `dflash2-trt build --backend trtllm --baseline ...` "
                          f"(the target alone, in {BASELINE_DIR}/)", source=engine_dir, field="baseline")
    files = man["baseline"].get("files")
    if not isinstance(files, dict) or f"{BASELINE_DIR}/config.json" not in files:
        raise ConfigError(f"no file list (built by an earlier development version): rebuild with --baseline, {without}",
                          source=man_path, field="baseline.files")
    for _, why in file_problems(engine_dir, files, verify=verify, hashed=(f"{BASELINE_DIR}/config.json",)):
        raise ConfigError(f"{why}: the baseline engine is incomplete or modified; rebuild with --baseline, {without}",
                          source=man_path, field="baseline.files")
    path = engine_dir / BASELINE_DIR / "config.json"
    try:
        base = json.loads(path.read_text())
        pre, main = base["pretrained_config"], cfg["pretrained_config"]
        build, main_build = base["build_config"], cfg["build_config"]
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", source=path) from None
    except ValueError as exc:
        raise ConfigError(f"invalid JSON ({exc})", source=path) from None
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"missing or malformed field {exc}", source=path) from None
    if not is_target_only(pre):
        raise ConfigError(f"is not a baseline engine (expected {TARGET_ONLY!r})", source=path,
                          field="pretrained_config.dflash2_engine.network")
    checks = [(f"pretrained_config.{f}", pre, main, f) for f in (
        "vocab_size", "dtype", "num_hidden_layers", "mapping.tp_size", "dflash2_engine.max_seq_len",
        "dflash2_engine.tokens_per_block")]
    checks += [(f"build_config.{f}", build, main_build, f) for f in ("max_batch_size", "max_input_len",
                                                                      "max_num_tokens")]
    for name, a, b, field in checks:
        for k in field.split("."):
            a, b = (a if isinstance(a, dict) else {}).get(k), (b if isinstance(b, dict) else {}).get(k)
        if a != b:
            raise ConfigError(f"is {a!r}, the combined engine's is {b!r} (the baseline was built for another engine)",
                              source=path, field=name)
    return base
