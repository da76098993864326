"""Which XQA kernel TensorRT-LLM 1.2 gives each attention layer of a DFlash2 engine in its speculative-decoding steps
on Hopper, and what the build does about it (``facts/xqa_spec_decoding.yaml``, read in TensorRT-LLM's sources, not
run).

Those steps run only in XQA. With a bf16 / fp16 KV cache the runner sends a layer to the JIT kernel when 64 is a
multiple of its query heads per KV head, else to the precompiled kernels, which exist for head size 128 only. A
layer that lands on the precompiled side without a kernel (Qwen3.8-27B's full attention: head 256, 6 query heads per
KV head) would stop the first verify step; the JIT kernel takes it (head size up to 256, up to 32 per KV head), so
the build sets ``TRTLLM_ENABLE_XQA_JIT=1`` for trtllm-build and records it for the runtimes (``engine.json``
``runtime_env``; ``run`` sets it before TensorRT-LLM loads), with a warning: no such kernel is precompiled or, as
far as read, tested by TensorRT-LLM. A layer no kernel takes is a build refusal.
"""

from __future__ import annotations

import os
import sys

from .runtime_rules import facts

FACTS_FILE = "engine/trtllm/facts/xqa_spec_decoding.yaml"


def _local(n: int, tp: int) -> int:
    return max(1, n // tp)


def attention_calls(t, d, tp: int) -> list[dict]:
    """The distinct gpt_attention shapes of a rank: the target's attention layers and the drafter's (its KV heads
    spread over ``m`` pool layers where they are m times the target's per-token width: trtllm/network/kv_layout.py
    drafter_kv_split)."""
    t_kv, d_kv = _local(t.num_key_value_heads, tp), _local(d.num_key_value_heads, tp)
    m = max(1, (d_kv * d.head_dim) // (t_kv * t.head_dim))
    calls = [{"side": "target", "q_heads": t.num_attention_heads // tp, "kv_heads": t_kv, "head_size": t.head_dim},
             {"side": "drafter", "q_heads": d.num_attention_heads // tp // m, "kv_heads": d_kv // m,
              "head_size": d.head_dim}]
    for c in calls:
        c["group"] = c["q_heads"] // c["kv_heads"]
    return calls


def _jit_takes(c: dict, tpb: int, f: dict) -> bool:
    j = f["jit_hmma"]
    return (c["head_size"] % j["head_size_multiple_of"] == 0 and c["head_size"] <= j["max_head_size"]
            and c["group"] <= j["max_group"] and tpb in j["tokens_per_block"])


def xqa_plan(t, d, cfg) -> dict:
    """``{"calls": [... with "kernel": jit | precompiled | jit (forced) | none], "env": {...}, "warnings": [...],
    "blockers": [...]}`` for a Hopper build with a bf16 / fp16 KV cache."""
    f = facts("xqa_spec_decoding")
    tpb = int(cfg.tokens_per_block)
    calls = attention_calls(t, d, cfg.tp_size)
    env, warnings, blockers = {}, [], []
    pre = f["precompiled_spec_decoding"]
    for c in calls:
        if 64 % c["group"] == 0:
            c["kernel"] = "jit" if _jit_takes(c, tpb, f) else "none"
        elif c["head_size"] in pre["head_sizes"] and tpb in pre["tokens_per_block"]:
            c["kernel"] = "precompiled"
        elif _jit_takes(c, tpb, f):
            c["kernel"] = "jit (forced)"
        else:
            c["kernel"] = "none"
    shape = "{side}'s attention ({q_heads} query / {kv_heads} KV heads of {head_size} per rank)".format
    forced = [c for c in calls if c["kernel"] == "jit (forced)"]
    if forced:   # the variable sends EVERY layer to JIT: a layer only the precompiled kernels took has none then
        for c in calls:
            if c["kernel"] == "precompiled" and not _jit_takes(c, tpb, f):
                c["kernel"] = "none"
        env[f["runner"]["env"]] = "1"
        warnings.append(
            "; ".join(f"the {shape(**c)} has no precompiled XQA kernel for speculative-decoding steps, where "
                      f"TensorRT-LLM's runner sends {c['group']} query heads per KV head" for c in forced)
            + f": the build sets {f['runner']['env']}=1 for trtllm-build and the runtimes so that the JIT kernel takes "
              f"it (it passes every check; TensorRT-LLM neither precompiles nor, as far as read, tests it: the first "
              f"GPU run is its test; {FACTS_FILE} [read, not run])")
    for c in calls:
        if c["kernel"] == "none":
            blockers.append(f"the {shape(**c)} has no XQA kernel for speculative-decoding steps on TensorRT-LLM 1.2 "
                            f"(JIT: head size a multiple of 16 up to 256, at most 32 query heads per KV head, "
                            f"tokens_per_block 16-128; precompiled: head size 128, tokens_per_block 32-128; both only "
                            f"once TRTLLM_ENABLE_XQA_JIT sends every layer one way; {FACTS_FILE} [read, not run]): its "
                            f"first verify step would stop; use --backend cuda")
    return {"calls": calls, "env": env, "warnings": warnings, "blockers": blockers}


def apply_runtime_env(man: dict | None, warn=None) -> dict:
    """Set what the engine was built with (``engine.json`` ``runtime_env``) before TensorRT-LLM loads, unless the
    user set it: the XQA runner reads it at run time too. Returns what it set; a value of the user's that differs from
    the engine's is kept and told to ``warn`` (default: one ``warning:`` line on stderr)."""
    done = {}
    for k, v in ((man or {}).get("runtime_env") or {}).items():
        if k not in os.environ:
            os.environ[k] = str(v)
            done[k] = str(v)
        elif os.environ[k] != str(v):
            msg = (f"warning: {k}={os.environ[k]} in the environment, but the engine was built with {k}={v} "
                   f"(engine.json runtime_env; engine/trtllm/xqa.py): its attention may find no XQA kernel")
            if warn is None:
                print(msg, file=sys.stderr)
            else:
                warn(msg)
    return done
