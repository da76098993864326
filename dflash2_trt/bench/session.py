"""``bench run`` on a TensorRT engine through the project runtime (the engines TensorRT-LLM's executor cannot run:
``engine/trtllm/paths.py``): the CPU benchmark's closed loop (:func:`.cpu.drive`: C requests in flight, a new one
when one finishes) over :class:`~dflash2_trt.engine.trtllm.session.TrtEngineSession` instead of a CPU engine. Every
step passes through the project runtime, so the report has what the CPU backend's has (acceptance histogram,
per-position acceptance, target tokens per emitted token). No autoregressive baseline on this path yet: a
target-only TensorRT engine is not built by ``build`` (``--baseline-engine-dir`` is trtllm-bench's / gptManager's)."""

from __future__ import annotations

import sys
import time

from ..engine.common import stop_ids
from ..engine.graph_rules import counts_between
from ..engine.trtllm.ranks import open_project_session
from ..errors import ConfigError
from ..reference.generate import SEED_MAX
from ..runtime import Runtime
from .common import parse_concurrency
from .cpu import drive, make_requests
from .dataset import load_bench_requests, prompt_tokenizer_dir
from .metrics import run_metrics


def bench_session(engine_dir, dataset, *, concurrency, num_requests: int | None = None, temperature: float = 0.0,
                  seed: int = 0, max_new_tokens: int = 64, stop_on_eos: bool = True, warmup: bool = True,
                  keep_outputs: bool = False, trt=None, cuda_graphs: bool = False,
                  simulate_graphs: bool = False) -> dict:
    """The report's measured part for a TensorRT engine on the project runtime (``trt``: the tensorrt module, or its
    CPU stand-in in tests). ``cuda_graphs``: generation steps replayed from CUDA graphs (``engine/trtllm/
    session_graphs.py``, the session's graphs kept from one concurrency to the next; each RUN's ``cuda_graphs`` counts
    its own steps; ``simulate_graphs``: on the stand-in, for tests)."""
    levels = parse_concurrency(concurrency)
    if not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"must be in [0, {SEED_MAX}], got {seed}", field="--seed")
    t_start = time.perf_counter()
    graphed = bool(cuda_graphs or simulate_graphs)
    sess, man = open_project_session(engine_dir, trt=trt, **({"cuda_graphs": cuda_graphs,
                                                               "simulate_graphs": simulate_graphs} if graphed else {}))
    try:
        limit = sess.limits["max_batch_size"]
        too_big = [c for c in levels if c > limit]
        if too_big:
            raise ConfigError(f"concurrency {too_big[0]} exceeds the engine's max_batch_size {limit}",
                              field="--concurrency")
        specs = load_bench_requests(dataset, vocab_size=sess.vocab_size, default_output_tokens=max_new_tokens,
                                    num_requests=num_requests, tokenizer_dir=prompt_tokenizer_dir(engine_dir, man))
        stops = stop_ids(man, sess.vocab_size) if stop_on_eos else ()
        checker = Runtime(sess)
        for r in make_requests(specs, temperature=temperature, seed=seed, stops=stops):
            checker.check(r)
        if warmup:
            w = make_requests(specs[:1], temperature=temperature, seed=seed, stops=stops)[0]
            w.max_new_tokens = min(w.max_new_tokens, 2)
            Runtime(sess, max_batch_size=1).generate([w])
        runs = []
        for c in levels:
            rt = Runtime(sess, max_batch_size=c)
            reqs = make_requests(specs, temperature=temperature, seed=seed, stops=stops)
            before = sess.graphs.report() if graphed else None
            wall = drive(rt, reqs, c)
            m = run_metrics(reqs, wall_s=wall, step_log=rt.step_log, draft_len=sess.K)
            if graphed:
                m["cuda_graphs"] = counts_between(before, sess.graphs.report())
            if keep_outputs:
                m["outputs"] = [{"task_id": r.task_id, "output_ids": list(r.output_ids), "stop_reason": r.stop_reason,
                                 "acceptance_lengths": list(r.acceptance_lengths)} for r in reqs]
            runs.append({"concurrency": c, "speculative": m, "autoregressive": None, "speedup": None,
                         "outputs_match": None})
            print(f"concurrency {c}: {m['output_tokens_per_s'] or 0:.1f} tokens/s", file=sys.stderr)
        in_lens = [len(s["input_ids"]) for s in specs]
        return {
            "backend": "trtllm", "runtime": "project", "engine_dir": str(engine_dir), "target": man.get("target"),
            "block_size": sess.K + 1, "draft_len": sess.K, "tp_size": sess.tp, "dataset_requests": specs,
            "settings": {"concurrency": levels, "num_requests": len(specs), "temperature": temperature, "seed": seed,
                         "stop_on_eos": bool(stop_on_eos), "stop_token_ids": list(stops),
                         "max_new_tokens": max_new_tokens, "warmup": bool(warmup), "torch_threads": None,
                         "cuda_graphs": graphed},
            "baseline": None, "mean_input_len": sum(in_lens) / len(in_lens), "runs": runs, "unavailable": [],
            "notes": ["the project runtime over TensorRT (engine/trtllm/paths.py: the executor cannot run this "
                      "engine); no autoregressive baseline on this path"],
            "measure_wall_s": time.perf_counter() - t_start,
        }
    finally:
        sess.close()
