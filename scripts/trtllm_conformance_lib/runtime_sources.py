"""TensorRT-LLM 1.2's Python runtime pieces that the project runtime uses where TensorRT-LLM imports
(``dflash2_trt/engine/trtllm/session.py``: ``TrtllmExecution`` opens the engine through
``tensorrt_llm.runtime.Session``, ``_allocate_kv_pool`` takes ``MemoryPoolsAllocator``'s pool), run from the real
sources on the CPU, with the project's TensorRT stand-in as the engine. Those branches run nowhere else here: no
machine this project used had TensorRT-LLM.

Real files (DIR/tensorrt_llm/..., revisions in ``scripts/trtllm_conformance.py``'s docstring): runtime/session.py,
runtime/kv_cache_manager.py, runtime/memory_pools/{memory_pools_allocator,pools_kv_cache_manager,pool}.py, over
the conformance harness's install (the real _utils.py and logger.py that session.py imports).

Stand-ins, each named in the report's ``stand_ins``:
- inside session.py, ``tensorrt`` is ``dflash2_trt.testing.tensorrt_standin`` (the CPU stand-in of TensorRT's
  execution API, held to ``engine/trtllm/facts/tensorrt_session.yaml``), so that Session deserializes the stand-in
  engine; everywhere else the harness's ``tensorrt`` (TensorRT-RTX) stays;
- ``torch.cuda.current_stream`` (Session's ``_scoped_stream``) is a CPU stream: handle 0, ``synchronize`` a no-op;
- the ``tensorrt_llm.runtime`` and ``tensorrt_llm.runtime.memory_pools`` package inits are shells (the real runtime
  ``__init__`` imports generation.py, the model runners and the C++ bindings); ``tensorrt_llm.runtime.Session`` is
  the real class;
- in ``session_runs``, ``torch.empty`` inside memory_pools_allocator.py returns NaN-filled memory: what reused
  device memory may hold, since the allocator does not zero its pool;
- in ``multi_rank``, ``CustomAllReduceHelper.allocate_workspace`` (CUDA IPC buffers between GPUs) records its
  arguments and returns a table of the recorded size.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path

from . import harness

RUNTIME_FILES = ("runtime/session.py", "runtime/kv_cache_manager.py", "runtime/memory_pools/memory_pools_allocator.py",
                 "runtime/memory_pools/pools_kv_cache_manager.py", "runtime/memory_pools/pool.py")
STAND_INS = [
    "tensorrt inside session.py: dflash2_trt.testing.tensorrt_standin (the record-held CPU stand-in)",
    "torch.cuda.current_stream: a CPU stream (handle 0, synchronize a no-op) for Session._scoped_stream",
    "tensorrt_llm.runtime / .memory_pools package inits: shells exporting the real Session",
    "CustomAllReduceHelper.allocate_workspace (multi_rank only): a recorder of its mapping and size (CUDA IPC)",
]
POISON = "torch.empty in memory_pools_allocator.py: NaN-filled memory (what reused device memory may hold)"


class _CpuStream:
    cuda_stream = 0

    def synchronize(self):
        pass


def install(src: Path) -> dict:
    """The harness's install, then the runtime files; returns the real modules by short name."""
    src = Path(src)
    root = src / "tensorrt_llm"
    missing = [f for f in RUNTIME_FILES if not (root / f).is_file()]
    if missing:
        raise harness.HarnessError(f"{src}: missing TensorRT-LLM sources {missing} (expected DIR/tensorrt_llm/...)")
    harness.install(src)
    import torch

    from dflash2_trt.testing import tensorrt_standin

    runtime = harness._pkg("tensorrt_llm.runtime", root / "runtime")
    harness._pkg("tensorrt_llm.runtime.memory_pools", root / "runtime" / "memory_pools")
    outer = sys.modules["tensorrt"]
    sys.modules["tensorrt"] = tensorrt_standin
    try:
        session = importlib.import_module("tensorrt_llm.runtime.session")
    finally:
        sys.modules["tensorrt"] = outer
    runtime.Session = session.Session
    torch.cuda.current_stream = lambda device=None: _CpuStream()
    mods = {"session": session}
    for name in ("kv_cache_manager", "memory_pools.memory_pools_allocator", "memory_pools.pools_kv_cache_manager"):
        mods[name.rsplit(".", 1)[-1]] = importlib.import_module(f"tensorrt_llm.runtime.{name}")
    return mods


@contextlib.contextmanager
def poisoned_empty(allocator_module):
    """``torch.empty`` as the allocator module sees it returns NaN-filled tensors (floating dtypes)."""
    import torch

    real = torch.empty
    calls = []

    def empty(*shape, **kw):
        t = real(*shape, **kw)
        calls.append(list(t.shape))
        return t.fill_(float("nan")) if t.is_floating_point() else t

    allocator_module.torch = type(sys)("torch_poisoned")
    allocator_module.torch.__dict__.update(vars(torch))
    allocator_module.torch.empty = empty
    try:
        yield calls
    finally:
        allocator_module.torch = torch


def _open(engine_dir: Path, **kw):
    from dflash2_trt.testing.engines import standin_session

    return standin_session(engine_dir, **kw)


def _generate(engine, prompts: list, new: int = 12, max_batch: int = 3) -> dict:
    from dflash2_trt.runtime import Request, Runtime

    reqs = [Request(list(p), new, seed=i, stop_token_ids=(2,), task_id=i) for i, p in enumerate(prompts)]
    rt = Runtime(engine, max_batch_size=max_batch)
    rt.generate(reqs)
    return {"tokens": [r.output_ids for r in reqs], "acceptance": [r.acceptance_lengths for r in reqs],
            "steps": rt.step_count, "mixed": sum(1 for s in rt.step_log if s["context"] and s["generation"])}


def session_runs(mods: dict, engine_dir: Path, prompts: list) -> dict:
    """The same requests through the session three ways: the CPU engine itself, the project's own path over the
    stand-in (OwnExecution, its own pool), and the path taken where TensorRT-LLM imports (TrtllmExecution through
    the real Session, the real MemoryPoolsAllocator's pool, poisoned with NaN before the session zeroes it)."""
    import torch

    from dflash2_trt.engine.standin.engine import open_standin_engine

    cpu, _ = open_standin_engine(engine_dir)
    try:
        out = {"cpu_engine": _generate(cpu, prompts)}
    finally:
        cpu.close()
    own = _open(engine_dir, use_trtllm=False)
    try:
        out["own"] = _generate(own, prompts)
    finally:
        own.close()
    with poisoned_empty(mods["memory_pools_allocator"]) as poisoned:
        sess = _open(engine_dir, use_trtllm=True)
    try:
        pool = sess.pools[0]
        out["pool_at_open"] = {"poisoned_allocations": poisoned, "shape": list(pool.shape),
                               "nonzero": int(torch.count_nonzero(pool)), "nan": int(torch.isnan(pool).sum())}
        out["trtllm"] = _generate(sess, prompts)
        ex = sess.execution
        out["trtllm"]["execution"] = type(ex).__name__
        out["trtllm"]["session_class"] = f"{type(ex.session).__module__}.{type(ex.session).__qualname__}"
        out["trtllm"]["executions"] = ex.context.executions
        out["trtllm"]["allocator"] = type(sess._trtllm_pools).__module__
    finally:
        sess.close()
    # the negative control: the same pool left as NaN (what the session's zeroing prevents) stops the run
    sess = _open(engine_dir, use_trtllm=True)
    try:
        sess.pools[0].fill_(float("nan"))
        _generate(sess, prompts)
        out["nan_pool_error"] = None
    except Exception as exc:                    # noqa: BLE001 - reported: the test expects the stand-in's refusal
        out["nan_pool_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        sess.close()
    return out


def pool_layout(mods: dict, engine_dir: Path) -> dict:
    """The real allocator's pool, pointer table and mapping beside the project's own (same session config)."""
    import torch

    own = _open(engine_dir, use_trtllm=False)
    try:
        alloc = mods["memory_pools_allocator"].MemoryPoolsAllocator(
            num_blocks=own.num_blocks, tokens_per_block=own.tokens_per_block, head_size=own.head_size)
        alloc.allocate(own.kv_dtype, [own.kv_heads] * own.num_layers, device="cpu")
        real_pools = list(alloc._pool_pointers)
        ptrs = alloc.get_kv_cache_pool_pointers()
        return {
            "pools": [len(real_pools), len(own.pools)],
            "shape": [list(real_pools[0].shape), list(own.pools[0].shape)],
            "dtype": [str(real_pools[0].dtype), str(own.pools[0].dtype)],
            "pointer_table": {"real_shape": list(ptrs.shape), "own_shape": list(own.pool_pointers.shape),
                              "real_dtype": str(ptrs.dtype), "own_dtype": str(own.pool_pointers.dtype),
                              "real_is_pool_address": int(ptrs[0, 0]) == real_pools[0].data_ptr(),
                              "own_is_pool_address": int(own.pool_pointers[0, 0]) == own.pools[0].data_ptr(),
                              "second_column": [ptrs[:, 1].tolist(), own.pool_pointers[:, 1].tolist()]},
            "mapping_equal": bool(torch.equal(alloc.pool_mapping, own.pool_mapping)),
            "mapping_dtype": [str(alloc.pool_mapping.dtype), str(own.pool_mapping.dtype)],
            "metadata": [[p.num_kv_heads, p.num_layers] for p in alloc.pools_metadata],
            "session": {"layers": own.num_layers, "kv_heads": own.kv_heads},
        }
    finally:
        own.close()


def block_offsets(mods: dict, num_layers: int, tokens_per_block: int = 16, num_blocks: int = 10,
                  max_blocks: int = 5) -> dict:
    """TensorRT-LLM's Python KV cache manager (PoolsKVCacheManager over KVCacheManager, as generation.py drives it:
    add_sequence, step, ``get_block_offsets(1).squeeze(2)``) and the project's BlockManager holding the same blocks
    per request: the two offset tables the engine would be given. Sequences grow, one finishes, a new one takes its
    freed blocks, so the block ids are not in order."""
    import torch

    from dflash2_trt.runtime.kv_cache import BlockManager
    from tensorrt_llm.runtime.memory_pools.pool import Pool

    kvm, pkm = mods["kv_cache_manager"], mods["pools_kv_cache_manager"]
    mgr = pkm.PoolsKVCacheManager([Pool(num_kv_heads=2, num_layers=num_layers)], max_blocks, num_blocks,
                                  tokens_per_block, 8, max_blocks * tokens_per_block, 1, 0)
    seqs = [kvm.GenerationSequence(seq_idx=i, batch_idx=i) for i in range(3)]
    for s, n in zip(seqs, (17, 5, 33)):
        mgr.add_sequence(s, n)
    for _ in range(16):
        mgr.step([False, False, False])
    mgr.step([False, True, False])                     # sequence 1 finishes, its blocks go back
    late = kvm.GenerationSequence(seq_idx=3, batch_idx=2)
    mgr.add_sequence(late, 20)
    real = mgr.get_block_offsets(1).squeeze(2)          # [pools, batch, 2, max_blocks]
    blocks = mgr.get_single_kv_cache_manager().blocks_manager
    owned = {s.get_batch_idx(): [b.idx for b in blocks.allocated_blocks[s][0]] for s in blocks.allocated_blocks}
    bm = BlockManager(num_blocks, tokens_per_block, num_layers)
    bm.owned = {b: list(ids) for b, ids in owned.items()}
    own = bm.offsets(sorted(owned), max_blocks)
    return {"equal": bool(torch.equal(real, own)), "real_shape": list(real.shape), "own_shape": list(own.shape),
            "real_dtype": str(real.dtype), "own_dtype": str(own.dtype), "blocks": owned,
            "formula": [blocks.get_k_or_v_block_offset(b, f) for b in (0, 3) for f in (0, 1)]}


def multi_rank(mods: dict, engine_dir: Path, rank: int = 1) -> dict:
    """A tp engine's rank through the branch taken where TensorRT-LLM imports (session.py
    ``_allocate_all_reduce_workspace``): the real ``Mapping`` and ``CustomAllReduceHelper.max_workspace_size_auto``;
    ``allocate_workspace`` itself (CUDA IPC buffers between the ranks' GPUs) is a recorder returning a table of the
    recorded size. Also the table's entry count read off the real ``allocate_workspace``'s return statement (its
    ``serialize()`` calls, each tp pointers, then the counter's pointers), against the recorded ``7 * tp + 3``."""
    import ast
    import inspect
    import textwrap

    import torch

    from tensorrt_llm.plugin.plugin import CustomAllReduceHelper

    real_alloc = CustomAllReduceHelper.allocate_workspace
    tree = ast.parse(textwrap.dedent(inspect.getsource(real_alloc)))
    ret = [n for n in ast.walk(tree) if isinstance(n, ast.Return)][-1]
    serialized = sum(1 for n in ast.walk(ret) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and n.func.attr == "serialize")
    counter = sum(1 for n in ast.walk(ret) if isinstance(n, ast.List) for e in n.elts
                  if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "data_ptr")
    calls = []

    def recorder(mapping, size):
        calls.append({"world_size": mapping.world_size, "rank": mapping.rank, "tp_size": mapping.tp_size,
                      "tp_rank": mapping.tp_rank, "gpus_per_node": mapping.gpus_per_node,
                      "local_rank": mapping.local_rank, "size": size})
        return ["buffers"], torch.arange(7 * mapping.tp_size + 3, dtype=torch.int32)

    CustomAllReduceHelper.allocate_workspace = staticmethod(recorder)
    try:
        sess = _open(engine_dir, use_trtllm=True, rank=rank, launched=True, gpus_per_node=2)
    finally:
        CustomAllReduceHelper.allocate_workspace = real_alloc
    try:
        bound = sess.static_inputs().get("all_reduce_workspace")
        return {"calls": calls, "signature": list(inspect.signature(real_alloc).parameters),
                "table_from_source": {"serialized": serialized, "counter": counter},
                "bound": None if bound is None else {"values": bound.tolist(), "dtype": str(bound.dtype),
                                                      "device": str(bound.device)},
                "kept": sess._workspace_buffers, "tp": sess.tp,
                "size_auto": {tp: CustomAllReduceHelper.max_workspace_size_auto(tp) for tp in (1, 2, 4, 8)}}
    finally:
        sess.close()


def open_failure(mods: dict) -> dict:
    """Bytes TensorRT cannot deserialize, through TrtllmExecution and the real Session: the project's error."""
    from dflash2_trt.engine.trtllm.session import TrtllmExecution
    from dflash2_trt.testing import tensorrt_standin

    try:
        TrtllmExecution(tensorrt_standin, b"not an engine", 0)
    except Exception as exc:                    # noqa: BLE001 - reported: the test expects EngineOpenError
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


def report(src: Path, engines: dict, prompts: dict, tp2_engine: Path | None = None) -> dict:
    """Everything above for the given engines ({key: engine_dir}), prompts ({key: [[ids]]}) and a tp 2 engine
    (rank 1 opened)."""
    mods = install(src)
    out = {"stand_ins": STAND_INS + [POISON], "runs": {}, "layouts": {}}
    for key, engine_dir in engines.items():
        out["runs"][key] = session_runs(mods, Path(engine_dir), prompts[key])
        out["layouts"][key] = pool_layout(mods, Path(engine_dir))
    out["block_offsets"] = block_offsets(mods, num_layers=6)
    out["open_failure"] = open_failure(mods)
    if tp2_engine is not None:
        out["multi_rank"] = multi_rank(mods, Path(tp2_engine))
    return out
