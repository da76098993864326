"""The project runtime's TensorRT-LLM branch (engine/trtllm/session.py: ``TrtllmExecution`` through
``tensorrt_llm.runtime.Session``, the KV pool from ``MemoryPoolsAllocator``), run with TensorRT-LLM 1.2's real Python
runtime files over the CPU stand-in of TensorRT (scripts/trtllm_conformance_lib/runtime_sources.py, which lists its
stand-ins). Everywhere else that branch needs TensorRT-LLM installed, which no machine of this project had.

- the tiny pairs (dense, hybrid, Muse) through the real Session and the real allocator's pool give the CPU engine's
  tokens and acceptance, as the project's own path does; the pool is poisoned with NaN where the allocator takes it
  (the allocator does not zero it, and reused device memory may hold anything): the session zeroes it, and the same
  pool left as NaN stops the run (negative control);
- the real allocator's pool shape, dtype, pointer table and layer mapping equal the project's own;
- TensorRT-LLM's Python KV cache manager and the project's BlockManager, holding the same blocks, give the same
  ``kv_cache_block_offsets`` table (after sequences grew, one finished and a new one took its freed blocks);
- a tp 2 rank takes its all-reduce workspace through the real Mapping and workspace size (the IPC allocation
  itself recorded, not run), and the recorded table size is the real allocate_workspace's;
- bytes TensorRT cannot deserialize, opened through the real Session, are the project's one-line error.

Needs the sources in $DFLASH2_TRTLLM_SRC (the conformance harness's files plus runtime/session.py,
runtime/kv_cache_manager.py and runtime/memory_pools/*.py; never part of this repository) and TensorRT-RTX (the
harness's ``tensorrt``); skips otherwise. Runs in a child process: the modules it installs are global."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dflash2_trt.assets import trained_pair
from dflash2_trt.testing.engines import EngineCache, shipped_prompts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_sources import child_json, have  # noqa: E402

RUNTIME = ("runtime/session.py", "runtime/kv_cache_manager.py", "runtime/memory_pools/memory_pools_allocator.py",
           "runtime/memory_pools/pools_kv_cache_manager.py", "runtime/memory_pools/pool.py")
pytestmark = pytest.mark.skipif(not have("functional.py", *RUNTIME),
                                reason="TensorRT-LLM's Python sources are not in $DFLASH2_TRTLLM_SRC")
PAIRS = {"tiny": "qwen3", "tiny-hybrid": "qwen3_5", "tiny-muse": "muse_glimmer"}

_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from trtllm_conformance_lib.runtime_sources import report
print(json.dumps(report(sys.argv[1], json.loads(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5])))
"""


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    caches = {key: EngineCache(trained_pair(fam), key, tmp_path_factory, verify=False) for key, fam in PAIRS.items()}
    engines = {key: str(cache(4)) for key, cache in caches.items()}
    prompts = {key: shipped_prompts(trained_pair(fam), 5) for key, fam in PAIRS.items()}
    tp2 = str(caches["tiny-hybrid"](4, tp=2))
    return child_json(_CHILD, json.dumps(engines), json.dumps(prompts), tp2, timeout=600)


@pytest.mark.parametrize("key", sorted(PAIRS))
def test_tensorrt_llms_session_and_pool_give_the_cpu_engines_tokens(real, key):
    run = real["runs"][key]
    want, own, got = run["cpu_engine"], run["own"], run["trtllm"]
    assert got["execution"] == "TrtllmExecution"
    assert got["session_class"] == "tensorrt_llm.runtime.session.Session"
    assert got["allocator"] == "tensorrt_llm.runtime.memory_pools.memory_pools_allocator"
    assert got["tokens"] == own["tokens"] == want["tokens"]
    assert got["acceptance"] == own["acceptance"] == want["acceptance"]
    assert got["executions"] == got["steps"] and got["mixed"] > 0
    # the allocator's memory was NaN when it took it; the session zeroed it before the first step
    opened = run["pool_at_open"]
    assert opened["poisoned_allocations"] == [opened["shape"]]
    assert opened["nonzero"] == 0 and opened["nan"] == 0
    assert run["nan_pool_error"] and "NaN" in run["nan_pool_error"]


@pytest.mark.parametrize("key", sorted(PAIRS))
def test_the_pool_is_the_one_tensorrt_llms_allocator_makes(real, key):
    lay = real["layouts"][key]
    assert lay["pools"] == [1, 1]
    real_shape, own_shape = lay["shape"]
    assert real_shape == own_shape and own_shape[1] == lay["session"]["layers"]
    assert lay["dtype"][0] == lay["dtype"][1]
    ptr = lay["pointer_table"]
    assert ptr["real_shape"] == ptr["own_shape"] == [1, 2]
    assert ptr["real_dtype"] == ptr["own_dtype"] == "torch.int64"
    assert ptr["real_is_pool_address"] and ptr["own_is_pool_address"]
    assert ptr["second_column"] == [[0], [0]]
    assert lay["mapping_equal"] and lay["mapping_dtype"] == ["torch.int32", "torch.int32"]
    assert lay["metadata"] == [[lay["session"]["kv_heads"], lay["session"]["layers"]]]


def test_block_offsets_are_tensorrt_llms_kv_cache_managers(real):
    off = real["block_offsets"]
    assert off["equal"], off
    assert off["real_shape"] == off["own_shape"] == [1, 3, 2, 5]
    assert off["real_dtype"] == off["own_dtype"] == "torch.int32"
    ids = [b for blocks in off["blocks"].values() for b in blocks]
    assert ids != sorted(ids) and len(set(ids)) == len(ids)      # freed blocks reused: not in allocation order
    assert off["formula"] == [0, 1, 3 * 6 * 2, 3 * 6 * 2 + 1]   # block * layers * 2 + field, 6 layers


def test_a_tp_rank_takes_tensorrt_llms_workspace_with_the_real_mapping(real):
    """Rank 1 of a tp 2 engine through the branch taken where TensorRT-LLM imports: the real Mapping built from the
    session's arguments, the real max_workspace_size_auto's size handed to allocate_workspace (a recorder: CUDA IPC
    cannot run here), the table it returns bound, int64 on the host, and its buffers kept alive; the recorded
    7 * tp + 3 entries are what the real allocate_workspace's return statement serializes."""
    mr = real["multi_rank"]
    assert mr["signature"] == ["mapping", "size"]
    assert mr["calls"] == [{"world_size": 2, "rank": 1, "tp_size": 2, "tp_rank": 1, "gpus_per_node": 2,
                            "local_rank": 1, "size": 16_000_000}]
    assert mr["size_auto"] == {"1": 16_000_000, "2": 16_000_000, "4": 8_000_000, "8": 8_000_000}
    assert mr["table_from_source"] == {"serialized": 7, "counter": 3}      # 7 * tp + 3 (facts multi_rank)
    assert mr["bound"] == {"values": list(range(7 * 2 + 3)), "dtype": "torch.int64", "device": "cpu"}
    assert mr["kept"] == ["buffers"] and mr["tp"] == 2


def test_an_engine_tensorrt_cannot_open_through_the_real_session(real):
    fail = real["open_failure"]
    assert fail["error"] == "EngineOpenError", fail
    assert "could not deserialize" in fail["message"]


def test_the_report_names_its_stand_ins(real):
    text = " ".join(real["stand_ins"])
    for what in ("tensorrt inside session.py", "torch.cuda.current_stream", "package inits", "NaN-filled",
                 "allocate_workspace"):
        assert what in text
