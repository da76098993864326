"""The stand-in engines' benchmark (cpu and cuda engine directories): requests kept in flight at each concurrency, with and without speculation.

At concurrency C the load generator submits the first C requests, then a new one whenever one
finishes (closed loop, as ``gptManagerBenchmark --concurrency C``), until the dataset's requests
are done; the runtime's batch is capped at C. Each concurrency runs twice over the same requests:

- ``speculative``: the engine directory's combined engine (``trtllm/network/``: draft, verify and
  accept in one step);
- ``autoregressive``: the target alone (``trtllm/network/target_only.py`` via
  :class:`~.autoregressive.TargetOnlyEngine`): the same CPU stand-in, the same runtime, the
  same batching and KV cache, one token per request per step.

Request i of the dataset uses seed ``seed + i`` (as ``run``); it stops at the target's EOS (as
``run`` and ``generate``) unless ``stop_on_eos`` is off, and at its ``output_tokens``. One short
request per engine warms up first (the plugins' CPU builds, first-call allocations), untimed.

At temperature 0 both modes must emit the same tokens (the speculation is lossless and the baseline
IS the target); the report says so per concurrency (``outputs_match``).

``cuda_graphs`` (cuda engines, ``bench run --cuda-graphs``): both modes replay their generation steps from CUDA
graphs (:class:`~dflash2_trt.engine.standin.graphs.GraphedSteps`, one runner per engine, its graphs kept across the
concurrencies as a server keeps them), so the speedup compares graphed with graphed; each RUN says how many steps
were replayed, captured and run eagerly (``cuda_graphs``). The warm-up request does not use the graphs.
"""

from __future__ import annotations

import sys
import time
from collections import deque

from ..chunking import chunked_context_default
from ..engine.common import check_requests, stop_ids
from ..engine.standin.engine import open_standin_engine
from ..cpu_threads import check_threads
from ..errors import ConfigError
from ..reference.generate import SEED_MAX
from ..runtime import Request, Runtime
from ..sampling import effective_temperature
from ..engine.graph_rules import counts_between
from ..engine.standin.graphs import GraphedSteps
from .autoregressive import open_target_only_engine
from .common import parse_concurrency, progress_bar
from .dataset import load_bench_requests, prompt_tokenizer_dir
from .metrics import run_metrics



def make_requests(specs, *, temperature: float, seed: int, stops):
    return [Request(list(s["input_ids"]), int(s["output_tokens"]), temperature=temperature, seed=seed + i,
                    stop_token_ids=tuple(stops), task_id=s["task_id"]) for i, s in enumerate(specs)]


def drive(runtime, requests, concurrency: int, *, on_finish=None) -> float:
    """Run ``requests`` through ``runtime`` keeping ``concurrency`` in flight; returns the wall time."""
    pending = deque(requests)
    t0 = time.perf_counter()

    def top_up():
        while pending and runtime.in_flight < concurrency:
            runtime.submit(pending.popleft())

    top_up()
    while runtime.has_work:
        finished = runtime.step()
        if on_finish is not None and finished:
            on_finish(len(finished))
        top_up()
    return time.perf_counter() - t0


def bench_cpu(engine_dir, dataset, *, concurrency, num_requests: int | None = None, temperature: float = 0.0,
              seed: int = 0, max_new_tokens: int = 64, stop_on_eos: bool = True, baseline: bool = True,
              warmup: bool = True, progress: bool = False, keep_outputs: bool = False, threads: int | None = 1,
              cuda_graphs: bool = False, simulate_graphs: bool = False) -> dict:
    """The report's measured part for a CPU engine directory (see :mod:`.report` for the document).

    ``threads``: torch intra-op threads while measuring (default 1: the stand-in runs many small ops, and on
    a small shared machine a second thread mostly adds synchronisation stalls; None keeps torch's setting)."""
    import torch

    threads = check_threads(threads, why="more threads than cores skew the measurement")
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _bench_cpu(engine_dir, dataset, concurrency=concurrency, num_requests=num_requests,
                          temperature=temperature, seed=seed, max_new_tokens=max_new_tokens, stop_on_eos=stop_on_eos,
                          baseline=baseline, warmup=warmup, progress=progress, keep_outputs=keep_outputs,
                          cuda_graphs=cuda_graphs, simulate_graphs=simulate_graphs)
    finally:
        torch.set_num_threads(old_threads)


def _bench_cpu(engine_dir, dataset, *, concurrency, num_requests, temperature, seed, max_new_tokens, stop_on_eos,
               baseline, warmup, progress, keep_outputs, cuda_graphs, simulate_graphs) -> dict:
    import torch

    levels = parse_concurrency(concurrency)
    temperature = effective_temperature(temperature, "--temperature")   # below 1e-5: greedy
    if not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"must be in [0, {SEED_MAX}], got {seed}", field="--seed")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"must be >= 1, got {max_new_tokens}", field="--max-new-tokens")
    t_start = time.perf_counter()
    engine, man = open_standin_engine(engine_dir)
    ar_engine = None
    try:
        K = engine.K
        limit = engine.limits["max_batch_size"]
        too_big = [c for c in levels if c > limit]
        if too_big:
            need = max(levels) * (K + 1)         # the build's own rule: a full batch's generation tokens fit a step
            more = (f" --max-num-tokens {need}" if engine.limits["max_num_tokens"] < need else "")
            raise ConfigError(f"concurrency {too_big[0]} exceeds the engine's max_batch_size {limit}; rebuild it with "
                              f"`dflash2-trt build ... --max-batch-size {max(levels)}{more}`", field="--concurrency")
        specs = load_bench_requests(dataset, vocab_size=engine.vocab_size, default_output_tokens=max_new_tokens,
                                    num_requests=num_requests, tokenizer_dir=prompt_tokenizer_dir(engine_dir, man))
        stops = stop_ids(man, engine.vocab_size) if stop_on_eos else ()
        checker = Runtime(engine)
        check_requests(checker, specs, make_requests(specs, temperature=temperature, seed=seed, stops=stops))
        if baseline:
            # the target alone on the combined engine's weights, KV pool and state slots (shared, not copied: the two
            # runs of a level take turns, so each has the whole pool, as a cuda engine's alone takes the build's
            # fraction of the free GPU memory; bench steps shares the weights the same way)
            ar_engine = open_target_only_engine(engine_dir, weights=engine.parameters(), pools_of=engine)
        engines = [("speculative", engine)] + ([("autoregressive", ar_engine)] if baseline else [])
        graphed = {}
        if cuda_graphs or simulate_graphs:      # refused here (one line) for a cpu engine, before anything runs
            graphed = {mode: GraphedSteps(e, simulate=simulate_graphs) for mode, e in engines}
        if warmup:
            for _, e in engines:
                w = make_requests(specs[:1], temperature=temperature, seed=seed, stops=stops)[0]
                w.max_new_tokens = min(w.max_new_tokens, 2)
                Runtime(e, max_batch_size=1).generate([w])
        runs = []
        for c in levels:
            row = {"concurrency": c}
            outputs = {}
            for mode, e in engines:
                g = graphed.get(mode)
                before = g.report() if g is not None else None
                rt = Runtime(g if g is not None else e, max_batch_size=c)
                reqs = make_requests(specs, temperature=temperature, seed=seed, stops=stops)
                with progress_bar(progress, len(reqs), f"concurrency {c} {mode}") as bar:
                    wall = drive(rt, reqs, c, on_finish=bar.update)
                row[mode] = run_metrics(reqs, wall_s=wall, step_log=rt.step_log, draft_len=e.K)
                if progress:   # a line per run, as the TensorRT session's bench says: a log shows it moving too
                    print(f"concurrency {c} {mode}: {row[mode]['output_tokens_per_s'] or 0:.1f} tokens/s",
                          file=sys.stderr, flush=True)
                if g is not None:
                    row[mode]["cuda_graphs"] = counts_between(before, g.report())
                outputs[mode] = reqs
                if keep_outputs:
                    row[mode]["outputs"] = [{"task_id": r.task_id, "output_ids": list(r.output_ids),
                                              "stop_reason": r.stop_reason,
                                              "acceptance_lengths": list(r.acceptance_lengths)} for r in reqs]
            if baseline:
                spec, ar = row["speculative"], row["autoregressive"]
                row["speedup"] = (spec["output_tokens_per_s"] / ar["output_tokens_per_s"]
                                  if spec["output_tokens_per_s"] and ar["output_tokens_per_s"] else None)
                row["outputs_match"] = (all(a.output_ids == b.output_ids for a, b in
                                            zip(outputs["speculative"], outputs["autoregressive"]))
                                        if temperature == 0 else None)
            else:
                row["autoregressive"], row["speedup"], row["outputs_match"] = None, None, None
            runs.append(row)
        in_lens = [len(s["input_ids"]) for s in specs]
        return {
            "backend": engine.backend, "engine_dir": str(engine_dir), "target": man.get("target"),
            "block_size": K + 1, "draft_len": K, "tp_size": engine.tp,
            "dataset_requests": specs,
            "settings": {"concurrency": levels, "num_requests": len(specs), "temperature": temperature, "seed": seed,
                         "stop_on_eos": bool(stop_on_eos), "stop_token_ids": list(stops),
                         "max_new_tokens": max_new_tokens, "warmup": bool(warmup),
                         "torch_threads": torch.get_num_threads(), "cuda_graphs": bool(graphed),
                         "max_num_tokens": int(engine.limits["max_num_tokens"]),
                         "chunked_context": chunked_context_default()},
            "baseline": ({"kind": "target-only",
                          "description": f"the target alone (dflash2_trt/trtllm/network/target_only.py) on the same "
                                         f"{engine.backend} stand-in and runtime, one token per request per step, "
                                         f"in-flight batched at the same concurrency"} if baseline else None),
            "mean_input_len": sum(in_lens) / len(in_lens),
            "runs": runs, "unavailable": [], "measure_wall_s": time.perf_counter() - t_start,
        }
    finally:
        engine.close()
        if ar_engine is not None:
            ar_engine.close()
