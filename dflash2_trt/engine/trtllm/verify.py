"""The verify gate on a TensorRT-LLM engine: the fixed prompts through the engine's runtime (TensorRT-LLM's C++
runner, :mod:`.runner`, or the project runtime over TensorRT, :mod:`.session_run`, as :mod:`.paths` decides; GPU
machines) and through the target's own greedy decoding (:mod:`dflash2_trt.engine.verify`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..verify import NEW_TOKENS, check_against_target, fixed_prompts, shape_prompts
from .paths import PROJECT, choose_runtime
from .runner import generate
from .session_run import generate as generate_project


def verify_trtllm_engine(engine_dir, *, target_dir, target_key=None, plugin_lib=None,
                         new: int = NEW_TOKENS) -> dict:   # pragma: no cover - TensorRT-LLM on a GPU
    """The same check with TensorRT-LLM's C++ runner (ModelRunnerCpp) on the built rank engine."""
    t0 = time.perf_counter()
    cfg = json.loads((Path(engine_dir) / "config.json").read_text())
    man = json.loads((Path(engine_dir) / "engine.json").read_text())
    pre, build = cfg["pretrained_config"], cfg["build_config"]
    eos = tuple(int(e) for e in man.get("eos_token_ids") or ())
    prompts = fixed_prompts(target_key, int(pre["vocab_size"]), avoid=(*eos, int(pre["dflash2"]["mask_token_id"])))
    K = int(pre["dflash2"]["block_size"]) - 1
    prompts, new = shape_prompts(prompts, int(build["max_input_len"]), int(build["max_seq_len"]) - 2 * K, new)
    path = choose_runtime(None, pre, man)["path"]
    if path == PROJECT:
        outs = generate_project(engine_dir, prompts, new, eos=eos)
    else:
        outs = generate(engine_dir, prompts, new, eos=eos, plugin_lib=plugin_lib)
    ties = check_against_target(target_dir, prompts, outs, new, eos, dtype=pre["dtype"])
    return {"passed": True, "backend": "trtllm", "runtime": path, "prompts": len(prompts), "new_tokens": new,
            "tokens": sum(map(len, outs)), "ties": ties, "seconds": round(time.perf_counter() - t0, 3)}
