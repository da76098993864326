"""A CPU stand-in of TensorRT 10's execution API, held to ``engine/trtllm/facts/tensorrt_session.yaml``.

NOT TensorRT. It has the names the project runtime's TensorRT path calls (``Runtime``, ``Logger``, ``ICudaEngine``,
``IExecutionContext``, the ``DataType`` / ``TensorIOMode`` / ``TensorLocation`` enums with TensorRT's values) and
enforces the recorded rules at the call TensorRT enforces them (``rules`` in the record: a shape outside profile 0,
a name that is no engine tensor, an address that is not 256-byte aligned, a missing input shape, a null input or
output address, ...). Like TensorRT it reports a failure by returning False (or None) and logging the reason; the
log is :attr:`Logger.messages`.

An "engine" is the bytes of :func:`standin_engine`: the I/O tensors of a DFlash2 engine exactly as the network
declares them (``prepare_inputs``: names, dtypes, profile 0) and marks them (engine_io.yaml outputs, with their
shapes as functions of the input shapes), all DEVICE-located (TensorRT-LLM engines have no shape tensors), and what
``execute_async_v3`` does:

- ``cpu-engine``: the CPU network of a CPU engine directory (:class:`~dflash2_trt.engine.standin.engine.StandinEngine`) runs
  the step on what the bound addresses hold: every input is read from its address as the engine's dtype and shape;
  the KV pool is read through ``host_kv_cache_pool_pointers`` and the block offsets in TensorRT-LLM's layout and
  indexing (facts ``kv_pool``: a block offset that is not ``block * layers * 2 + field`` is refused), the recurrent
  state through ``rnn_state_ptr_<L>`` / ``conv_state_ptr_<L>`` and ``slot_mapping``; the CPU network's stand-in
  pools get a copy of exactly the blocks and slots the step references, and what it writes goes back to the
  addresses; the outputs are written to the output addresses (their shape checked against the inferred one). So a
  session's feed that the network would read differently from the CPU runtime's shows as different tokens.
- ``scripted``: no network (the published pairs at their real widths, nothing allocated at full size): the step's
  outputs are well-formed placeholders (1..K+1 accepted tokens, the chain, K placeholder drafts) so the runtime can
  drive every step kind.

Memory: an address is read as host memory unless it lies in a CUDA allocation of torch's caching allocator (then
through ``__cuda_array_interface__``), so on a GPU machine the same stand-in reads real device pointers.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import json
from pathlib import Path

import torch

from ..engine.pretrained import engine_draft_len, is_target_only
from ..engine.trtllm.session import facts, memory_of
from ..trtllm.cpu.functional import str_dtype_to_torch
from ..trtllm.engine_io import load_contract

MAGIC = b"DFLASH2-TENSORRT-STANDIN 1\n"

_API = facts()["tensorrt_api"]
DataType = enum.IntEnum("DataType", _API["DataType"])
TensorIOMode = enum.IntEnum("TensorIOMode", _API["TensorIOMode"])
TensorLocation = enum.IntEnum("TensorLocation", _API["TensorLocation"])
RULES = _API["rules"]

_DTYPE_NAMES = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BF16", "int32": "INT32", "int64": "INT64",
                "int8": "INT8", "bool": "BOOL", "uint8": "UINT8"}


class Logger:
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)
    messages: list[str] = []       # every stand-in object logs here (TensorRT's logger is process-wide too)

    def __init__(self, min_severity: int = 2):
        self.min_severity = min_severity

    @classmethod
    def error(cls, rule: str, text: str) -> None:
        cls.messages.append(f"[{rule}] {text}")


# ------------------------------------------------------------------------------------------ the engine's bytes
def _declared(pre: dict, build: dict, tokens_per_block: int):
    from ..trtllm.backend import load_network
    from ..trtllm.cpu import modeling_utils

    net = load_network("cpu")
    cfg = net.api.PretrainedConfig.from_dict(pre)
    K = engine_draft_len(pre)
    recurrent = "linear_attention" in net.hf_layer_types(cfg)
    decl = net.declare_inputs(cfg, K, recurrent, int(build["max_batch_size"]), int(build["max_num_tokens"]),
                              int(build["max_seq_len"]), tokens_per_block=int(tokens_per_block))
    inputs = modeling_utils.declared_inputs(decl)
    modeling_utils.check_profiles(inputs)
    return inputs


def _output_dims(shape: list, K: int, vocab: int) -> list:
    """engine_io.yaml output shape symbols -> an int or [input name, axis] (how TensorRT infers it)."""
    table = {"bs": ["sequence_length", 0], "NLOG": ["last_token_ids", 0], "K+1": K + 1, "K": K, "V": vocab}
    return [table[str(s)] for s in shape]


def standin_engine(config: dict, *, executor: dict, tokens_per_block: int | None = None) -> bytes:
    """The bytes of a stand-in engine for an engine ``config`` (``{"pretrained_config", "build_config"}``; as
    trtllm-build would build it: ``prepare_inputs`` called with the build's limits). ``executor``:
    ``{"kind": "cpu-engine", "engine_dir": ...}`` or ``{"kind": "scripted"}``."""
    pre, build = config["pretrained_config"], config["build_config"]
    tpb = tokens_per_block or (pre.get("dflash2_engine") or {}).get("tokens_per_block") or build.get(
        "tokens_per_block") or build["plugin_config"]["tokens_per_block"]
    K = engine_draft_len(pre)
    io = []
    for d in _declared(pre, build, tpb):
        prof = d.profiles[0]
        io.append({"name": d.name, "mode": "INPUT", "dtype": _DTYPE_NAMES[d.dtype], "shape": list(d.shape),
                   "location": "DEVICE", "profile": [[r[k] for r in prof] for k in range(3)]})
    for o in load_contract()["outputs"]:
        io.append({"name": o.name, "mode": "OUTPUT", "dtype": _DTYPE_NAMES[o.dtype], "location": "DEVICE",
                   "dims": _output_dims(o.shape, K, int(pre["vocab_size"]))})
    doc = {"io": io, "executor": dict(executor), "pretrained_config": pre}
    return MAGIC + json.dumps(doc).encode()


# ------------------------------------------------------------------------------------------ memory
class _CudaArray:
    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {"data": (address, False), "shape": (nbytes,), "typestr": "|u1",
                                         "version": 3}


def _cuda_segments() -> list[tuple[int, int]]:
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    return [(s["address"], s["address"] + s["total_size"]) for s in torch.cuda.memory_snapshot()]


def is_device_address(address: int, segments) -> bool:
    return any(a <= address < b for a, b in segments)


def memory_at(address: int, dtype: torch.dtype, shape, segments) -> torch.Tensor:
    """The tensor of ``dtype`` and ``shape`` at ``address`` (host or CUDA memory), sharing the memory."""
    shape = tuple(int(s) for s in shape)
    nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if is_device_address(address, segments):
        raw = torch.as_tensor(_CudaArray(address, nbytes), device="cuda")
    else:
        raw = torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=torch.uint8)
    return raw.view(dtype).view(shape)


# ------------------------------------------------------------------------------------------ the API
class Runtime:
    def __init__(self, logger: Logger):
        self.logger = logger

    def deserialize_cuda_engine(self, data) -> "ICudaEngine | None":
        data = bytes(data)
        if not data.startswith(MAGIC):
            Logger.error("deserialize", "the bytes are not a stand-in engine")
            return None
        return ICudaEngine(json.loads(data[len(MAGIC):]))


class ICudaEngine:
    num_optimization_profiles = 1

    def __init__(self, doc: dict):
        self.doc = doc
        self._io = {t["name"]: t for t in doc["io"]}
        self._names = [t["name"] for t in doc["io"]]
        self._executor = None

    @property
    def num_io_tensors(self) -> int:
        return len(self._names)

    def get_tensor_name(self, index: int) -> str:
        return self._names[index]

    def get_tensor_mode(self, name: str):
        t = self._io.get(name)
        return TensorIOMode.NONE if t is None else TensorIOMode[t["mode"]]

    def get_tensor_dtype(self, name: str):
        return DataType[self._io[name]["dtype"]]

    def get_tensor_location(self, name: str):
        return TensorLocation[self._io[name]["location"]]

    def get_tensor_shape(self, name: str) -> tuple:
        t = self._io[name]
        if t["mode"] == "INPUT":
            return tuple(t["shape"])
        return tuple(d if isinstance(d, int) else -1 for d in t["dims"])

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list:
        if profile_index != 0 or self._io[name]["mode"] != "INPUT":
            raise RuntimeError(f"no profile {profile_index} shape for {name!r}")
        return [tuple(s) for s in self._io[name]["profile"]]

    def create_execution_context(self) -> "IExecutionContext":
        return IExecutionContext(self)

    def executor(self):
        if self._executor is None:
            kind = self.doc["executor"]["kind"]
            self._executor = CpuEngineExecutor(self.doc) if kind == "cpu-engine" else ScriptedExecutor(self.doc)
        return self._executor


class IExecutionContext:
    def __init__(self, engine: ICudaEngine):
        self.engine = engine
        self._shapes: dict[str, tuple] = {}
        self._addresses: dict[str, int] = {}
        self.executions = 0

    def _is_io(self, name: str, rule="name_is_io_tensor") -> bool:
        if name not in self.engine._io:
            Logger.error(rule, f"{name!r} is not an input or output tensor of the engine")
            return False
        return True

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        return profile_index == 0

    def set_input_shape(self, name: str, shape) -> bool:
        if not self._is_io(name) or self.engine._io[name]["mode"] != "INPUT":
            return False
        t = self.engine._io[name]
        shape = tuple(int(s) for s in shape)
        lo, _, hi = t["profile"]
        if len(shape) != len(t["shape"]) or any(
                not a <= s <= b or (fixed != -1 and s != fixed) for s, a, b, fixed in zip(shape, lo, hi, t["shape"])):
            Logger.error("shape_in_profile", f"{name}: shape {shape} outside profile 0 [{tuple(lo)}, {tuple(hi)}]")
            return False
        self._shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> tuple:
        t = self.engine._io[name]
        if t["mode"] == "INPUT":
            return self._shapes.get(name, tuple(t["shape"]))
        out = []
        for d in t["dims"]:
            if isinstance(d, int):
                out.append(d)
            else:
                src = self._shapes.get(d[0])
                out.append(src[d[1]] if src is not None else -1)
        return tuple(out)

    def infer_shapes(self) -> list[str]:
        return [n for n, t in self.engine._io.items()
                if t["mode"] == "INPUT" and -1 in t["shape"] and n not in self._shapes]

    @property
    def all_binding_shapes_specified(self) -> bool:
        return not self.infer_shapes()

    def set_tensor_address(self, name: str, address: int) -> bool:
        if not self._is_io(name):
            return False
        a = alignment_bytes()
        if int(address) % a:
            Logger.error("address_alignment", f"{name}: address {int(address):#x} is not {a}-byte aligned")
            return False
        self._addresses[name] = int(address)
        return True

    def get_tensor_address(self, name: str) -> int:
        return self._addresses.get(name, 0)

    def execute_async_v3(self, stream_handle: int) -> bool:
        missing = self.infer_shapes()
        if missing:
            Logger.error("every_input_shape_set", f"input shapes not set: {missing}")
            return False
        unset = [n for n in self.engine._names if not self._addresses.get(n)]
        if unset:
            rule = "no_null_for_empty" if all(n in self._shapes and 0 in self._shapes[n] for n in unset) \
                else "every_io_address_set"
            Logger.error(rule, f"no address (null) for {unset}")
            return False
        segments = _cuda_segments()
        on_gpu = bool(stream_handle)          # a CUDA stream: the session's device memory is the GPU's
        bad = []
        for n, t in self.engine._io.items():
            host = memory_of(n) == "host" and t["mode"] == "INPUT"
            if host == is_device_address(self._addresses[n], segments) and (host or on_gpu):
                bad.append(n)
        if bad:
            Logger.error("host_read_inputs_in_host_memory", f"bound in the wrong memory (host inputs must be host "
                                                            f"memory, the rest device memory): {bad}")
            return False
        self.executions += 1
        if on_gpu:
            torch.cuda.synchronize()           # what the session enqueued on its stream lands before the "kernels" read
        ok = self.engine.executor().execute(self, segments)
        if ok and stream_handle and torch.cuda.is_available():
            torch.cuda.synchronize()
        return ok

    # the step's tensors, read from the bound addresses
    def read_inputs(self, segments) -> dict:
        out = {}
        for n, t in self.engine._io.items():
            if t["mode"] == "INPUT":
                dt = str_dtype_to_torch(_TORCH[t["dtype"]])
                out[n] = memory_at(self._addresses[n], dt, self._shapes.get(n, t["shape"]), segments).to(
                    "cpu", copy=True)
        return out

    def write_outputs(self, outputs: dict, segments) -> bool:
        declared = {n: t for n, t in self.engine._io.items() if t["mode"] == "OUTPUT"}
        for n, t in declared.items():
            if n not in outputs:
                continue
            shape, dt = self.get_tensor_shape(n), str_dtype_to_torch(_TORCH[t["dtype"]])
            v = outputs[n]
            if tuple(v.shape) != shape or v.dtype != dt:
                Logger.error("output_shape_inferred", f"{n}: the network made {tuple(v.shape)} {v.dtype}, the engine "
                                                      f"declares {shape} {dt}")
                return False
        missing = [n for n in declared if n not in outputs]
        if missing:        # a real engine writes every output it declares; the runtime would read garbage
            Logger.error("engine_outputs", f"{missing}: the engine declares them, the network made none")
            return False
        for n in declared:
            memory_at(self._addresses[n], outputs[n].dtype, tuple(outputs[n].shape), segments).copy_(outputs[n])
        return True


_TORCH = {v: k for k, v in _DTYPE_NAMES.items()}


@functools.lru_cache(maxsize=1)
def alignment_bytes() -> int:
    return int(RULES["address_alignment"]["bytes"])


# ------------------------------------------------------------------------------------------ what a step does
class ScriptedExecutor:
    """No network: well-formed outputs (a context request emits one token, a generation request 1..K+1, a
    deterministic function of its inputs), the chain as next_draft_paths, mask-token placeholders."""

    def __init__(self, doc: dict):
        pre = doc["pretrained_config"]
        self.K = engine_draft_len(pre)
        self.V = int(pre["vocab_size"])
        self.mask = int(pre["dflash2"]["mask_token_id"])

    def execute(self, ctx: IExecutionContext, segments) -> bool:
        f = ctx.read_inputs(segments)
        K, V = self.K, self.V
        seq, draft = f["sequence_length"].long(), f["draft_lens"]
        bs = seq.shape[0]
        n = torch.where(draft > 0, 1 + (seq * 7 + 3) % (K + 1), torch.ones_like(seq)).to(torch.int32)
        acc = ((seq[:, None] * 31 + torch.arange(K + 1)[None, :] * 17) % (V - 1) + 1).to(torch.int32)
        acc = torch.where(torch.arange(K + 1)[None, :] < n[:, None], acc, torch.zeros_like(acc))
        paths = torch.full((bs, K + 1, K + 1), -1, dtype=torch.int32)
        paths[:, 0, :] = torch.arange(K + 1, dtype=torch.int32)
        outs = {"accepted_tokens": acc, "num_accepted_tokens": n, "accepted_paths": torch.zeros(bs, dtype=torch.int32),
                "next_draft_tokens": torch.full((bs, K), self.mask, dtype=torch.int32),
                "next_draft_lens": torch.full((bs,), K, dtype=torch.int32), "next_draft_paths": paths,
                "logits": torch.zeros(ctx.get_tensor_shape("logits"), dtype=torch.float32)}
        return ctx.write_outputs(outs, segments)


class CpuEngineExecutor:
    """The CPU network of a CPU engine directory, on the step's bound memory (module docstring)."""

    def __init__(self, doc: dict):
        from ..engine.standin.engine import open_standin_engine

        ex = doc["executor"]
        tp = int(doc["pretrained_config"]["mapping"]["tp_size"])
        world = None
        if tp > 1:
            # one rank engine per process under mpirun: this process steps its rank of the CPU network, the
            # collectives (TensorRT-LLM's AllReduce plugins in a real engine) carried between the processes by MPI
            from mpi4py import MPI

            from ..trtllm.cpu.comm import ProcessWorld

            # a communicator of their own, as the engine's NCCL / IPC collectives are apart from the runtime's MPI
            world = ProcessWorld(MPI.COMM_WORLD.Dup(), tp)
            if world.local_rank != int(ex.get("rank", 0)):
                raise ValueError(f"rank{ex.get('rank', 0)}.engine deserialized by MPI rank {world.local_rank}")
        # a baseline engine (build --baseline) is the CPU engine directory's target alone, as bench builds it there
        cls = {}
        if is_target_only(doc["pretrained_config"]):
            from ..bench.autoregressive import TargetOnlyEngine

            cls = {"engine_cls": TargetOnlyEngine}
        self.engine, _ = open_standin_engine(Path(ex["engine_dir"]), world=world, **cls)
        pre = self.engine.config
        self.layers = self.engine.num_layers
        kvh = self.engine.net.local_heads(int(pre["num_key_value_heads"]), tp)
        self.kv = (kvh, int(self.engine.limits["tokens_per_block"]), int(pre["head_size"]))
        self.dtype = str_dtype_to_torch(pre["dtype"])

    def execute(self, ctx: IExecutionContext, segments) -> bool:
        from ..trtllm.cpu.attention import KVCachePool
        from ..trtllm.cpu.state import StatePool

        f = ctx.read_inputs(segments)
        L = self.layers
        heads, tpb, hd = self.kv
        # the KV pool in TensorRT-LLM's layout and indexing (facts kv_pool), as the CPU network's pool
        mapping = f["host_kv_cache_pool_mapping"]
        if not torch.equal(mapping, torch.tensor([[0, i] for i in range(L)], dtype=torch.int32)):
            Logger.error("kv_pool", f"host_kv_cache_pool_mapping is not one pool of {L} layers: {mapping.tolist()}")
            return False
        offs = f["kv_cache_block_offsets"].long()
        if not torch.equal(offs, f["host_kv_cache_block_offsets"].long()):
            Logger.error("kv_pool", "kv_cache_block_offsets and host_kv_cache_block_offsets differ")
            return False
        if bool(((offs % (2 * L)) > 1).any()):
            Logger.error("kv_pool", f"a block offset is not block * {L} * 2 + field (TensorRT-LLM's KV index): "
                                    f"{sorted(set((offs % (2 * L)).flatten().tolist()))}")
            return False
        nb = int((offs // (2 * L)).max()) + 1
        pool_mem = memory_at(int(f["host_kv_cache_pool_pointers"][0, 0]), self.dtype, (nb, L, 2, heads, tpb, hd),
                             segments)
        pool = KVCachePool(nb, L, heads, tpb, hd, self.dtype)
        pool.foreign = True      # the runtime's memory: TensorRT-LLM's is never zeroed (facts kv_pool.allocation)
        feed = dict(f)
        states = []
        try:
            pool.data.copy_(pool_mem.cpu())          # the CPU network's pool has TensorRT-LLM's layout and index
            feed["host_kv_cache_pool_pointers"] = torch.tensor([[pool.handle, 0]], dtype=torch.int64)
            if self.engine.recurrent:
                ns = int(f["slot_mapping"].max()) + 1
                for layer in self.engine.gdn_layers:
                    proto = self.engine.states[self.engine.local_ranks[0]][layer]
                    rnn_shape = (ns, *proto.rnn.shape[1:])
                    conv_shape = (ns, *proto.conv.shape[1:])
                    rnn = memory_at(int(f[f"rnn_state_ptr_{layer}"][0]), torch.float32, rnn_shape, segments)
                    conv = memory_at(int(f[f"conv_state_ptr_{layer}"][0]), proto.conv.dtype, conv_shape, segments)
                    sp = StatePool.like(proto, ns)
                    sp.rnn.copy_(rnn.cpu())
                    sp.conv.copy_(conv.cpu())
                    states.append((sp, rnn, conv))
                    feed[f"rnn_state_ptr_{layer}"] = feed[f"conv_state_ptr_{layer}"] = sp.handle_tensor()
            outs = self.engine.step(feed)
            pool_mem.copy_(pool.data.to(pool_mem.device))
            for sp, rnn, conv in states:
                rnn.copy_(sp.rnn.to(rnn.device))
                conv.copy_(sp.conv.to(conv.device))
        finally:
            pool.release()
            for sp, _, _ in states:
                sp.release()
        return ctx.write_outputs(outs, segments)
