"""``dflash2-trt run``: prompts through a CPU engine with the CPU runtime (in-flight batching)."""

from __future__ import annotations

import time

from ..errors import ConfigError
from ..reference.generate import SEED_MAX, parse_prompt_ids
from ..runtime import Request, Runtime
from ..sampling import effective_temperature
from ..tokenizer import encode_text
from .common import prompt_tokenizer, read_prompts_file, stop_ids
from .cpu import open_cpu_engine
from .format import engine_backend
from .trtllm_runner import run_engine_trtllm


def run_engine(engine_dir, *, prompt_ids=None, prompt=None, prompts_file=None, max_new_tokens: int = 64,
               temperature: float = 0.0, seed: int = 0, max_batch_size: int | None = None, verify: bool = False,
               progress=None) -> dict:
    given = sum(x is not None for x in (prompt_ids, prompt, prompts_file))
    if given != 1:
        raise ConfigError("give exactly one of --prompt-ids, --prompt, --prompts", field="--prompt-ids")
    if max_new_tokens < 1:
        raise ConfigError(f"must be >= 1, got {max_new_tokens}", field="--max-new-tokens")
    temperature = effective_temperature(temperature, "--temperature")   # below 1e-5: greedy
    if not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"must be in [0, {SEED_MAX}], got {seed}", field="--seed")
    if max_batch_size is not None and max_batch_size < 1:
        raise ConfigError(f"must be >= 1, got {max_batch_size}", field="--max-batch-size")
    if engine_backend(engine_dir) == "trtllm":   # TensorRT-LLM's C++ runner on a GPU machine (engine/trtllm_runner.py)
        return run_engine_trtllm(engine_dir, prompt_ids=prompt_ids, prompt=prompt, prompts_file=prompts_file,
                                 max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                 max_batch_size=max_batch_size, verify=verify)
    engine, man = open_cpu_engine(engine_dir, verify=verify)
    try:
        pre = engine.config
        tok = None
        items = []
        if prompts_file is not None:
            items = read_prompts_file(prompts_file)
        elif prompt_ids is not None:
            items = [{"task_id": 0, "input_ids": parse_prompt_ids(prompt_ids, engine.vocab_size), "prompt": None,
                      "output_tokens": None, "where": "--prompt-ids"}]
        else:
            items = [{"task_id": 0, "input_ids": None, "prompt": prompt, "output_tokens": None, "where": "--prompt"}]
        if any(it["prompt"] is not None for it in items):
            tok = prompt_tokenizer(man, engine_dir)
        reqs = []
        stops = stop_ids(man, engine.vocab_size)
        for i, it in enumerate(items):
            ids = it["input_ids"]
            if ids is None:
                ids = encode_text(tok, it["prompt"])
            reqs.append(Request(list(ids), it["output_tokens"] or max_new_tokens, temperature=temperature,
                                seed=seed + i, stop_token_ids=stops, task_id=it["task_id"]))
        rt = Runtime(engine, max_batch_size=max_batch_size)
        t0 = time.perf_counter()
        rt.generate(reqs, progress=progress)
        wall = time.perf_counter() - t0
        out = []
        for r in reqs:
            d = r.to_dict()
            if tok is not None:
                d["text"] = tok.decode(r.output_ids)
            out.append(d)
        n_tok = sum(len(r.output_ids) for r in reqs)
        acc = [a for r in reqs for a in r.acceptance_lengths]
        return {"engine_dir": str(engine_dir), "backend": "cpu", "block_size": engine.K + 1, "tp_size": engine.tp,
                "temperature": temperature, "max_batch_size": rt.max_batch_size, "requests": out,
                "totals": {"requests": len(reqs), "output_tokens": n_tok, "steps": rt.step_count,
                           "generation_steps": len(acc), "mean_acceptance": sum(acc) / len(acc) if acc else 0.0,
                           "wall_s": wall, "output_tokens_per_s": n_tok / wall if wall > 0 else None}}
    finally:
        engine.close()


def render(report: dict) -> str:
    lines = []
    for r in report["requests"]:
        lines.append(f"[{r['task_id']}] prompt {r['prompt_len']} tokens -> {len(r['output_ids'])} new "
                     f"({r['stop_reason']}), mean acceptance {r['mean_acceptance']:.2f} over {len(r['acceptance_lengths'])} steps")
        lines.append("  ids: " + ",".join(map(str, r["output_ids"])))
        if "text" in r:
            lines.append("  text: " + r["text"])
    t = report["totals"]
    lines.append(f"{t['requests']} request(s), {t['output_tokens']} tokens in {t['steps']} engine steps "
                 f"(max batch {report['max_batch_size']}), mean acceptance {t['mean_acceptance']:.2f}, "
                 f"{t['output_tokens_per_s'] or 0:.1f} tokens/s")
    return "\n".join(lines)
