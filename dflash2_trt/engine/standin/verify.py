"""The verify gate on a cpu or cuda engine: the fixed prompts through the engine directory as ``run`` opens it (the
project's runtime) and through the target's own greedy decoding on the engine's device
(:mod:`dflash2_trt.engine.verify`)."""

from __future__ import annotations

import time

from ...runtime import Request, Runtime
from ..verify import NEW_TOKENS, check_against_target, check_pool, fixed_prompts, shape_prompts
from .engine import open_standin_engine


def verify_standin_engine(engine_dir, *, target_dir, target_key=None, new: int = NEW_TOKENS) -> dict:
    """Open the engine directory as ``run`` does, decode the fixed prompts, compare with the target."""
    t0 = time.perf_counter()
    engine, man = open_standin_engine(engine_dir)
    try:
        eos = tuple(int(e) for e in man.get("eos_token_ids") or ())
        lim = engine.limits
        prompts = fixed_prompts(target_key, engine.vocab_size, avoid=(*eos, engine.mask_token_id))
        prompts, new = shape_prompts(prompts, lim["max_input_len"], lim["max_seq_len"], new, slots=engine.K + 1)
        reqs = [Request(list(p), new, stop_token_ids=eos) for p in prompts]
        rt = Runtime(engine)
        check_pool(prompts, new, engine.K, rt.blocks.tokens_per_block, rt.blocks.num_blocks)
        rt.generate(reqs)
        outs = [r.output_ids for r in reqs]
        acc = [a for r in reqs for a in r.acceptance_lengths]
    finally:
        engine.close()
    # the engine is let go before the target loads: on a GPU its weights and the pool (up to the build's fraction of
    # the free memory) would otherwise sit beside the target's
    dtype, device, backend = engine.config["dtype"], engine.device, engine.backend
    del engine, rt
    if device.type == "cuda":
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
    ties = check_against_target(target_dir, prompts, outs, new, eos, dtype=dtype, device=device)
    return {"passed": True, "backend": backend, "prompts": len(prompts), "new_tokens": new,
            "tokens": sum(map(len, outs)), "ties": ties,
            "mean_acceptance": round(sum(acc) / len(acc), 3) if acc else 0.0,
            "seconds": round(time.perf_counter() - t0, 3)}
