#!/usr/bin/env python3
"""CPU engine throughput vs the PyTorch reference loop, side by side, on the same prompts.

    python scripts/bench_engine.py [--prompts 12] [--max-new-tokens 64] [--reps 2] [--threads 1] [--json OUT]

Builds a CPU engine of the tiny pair (into a temp dir), then times, on the same shipped prompts:

- ``reference``: ``reference.loop.speculative_generate`` one prompt after another (batch 1, HF target);
- ``engine b=1`` / ``engine b=4``: the CPU runtime with in-flight batching at max batch 1 and 4;
- ``engine b=4, drafter_window=full``: the drafter attending to the whole context (what a TensorRT-LLM build
  needs where the drafter's window can bind: docs/gpu.md "Sliding windows on TensorRT-LLM"): acceptance only, to
  measure what the window is worth.

Prints output tokens/s, the ratio to the reference, mean acceptance and whether every output equals the
reference's (it must: greedy). Timings on a shared 2-core machine vary; the best of ``--reps`` is kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 = what CI machines give a job)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    from transformers.utils import logging

    logging.set_verbosity_error()

    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.build import build_engine
    from dflash2_trt.engine.standin.engine import open_standin_engine
    from dflash2_trt.reference.loop import load_pair, speculative_generate
    from dflash2_trt.runtime import Request, Runtime

    pair = trained_pair("qwen3")
    prompts = [list(p) for p in json.loads((pair.drafter_dir.parent / "prompts.json").read_text())["prompts"]]
    prompts = prompts[:a.prompts]
    N = a.max_new_tokens
    target, drafter = load_pair(pair.target_dir, pair.drafter_dir)

    def ref():
        return [speculative_generate(target, drafter, p, max_new_tokens=N, stop_token_ids=(2,)) for p in prompts]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        for win in ("model", "full"):
            out = Path(tmp) / win
            build_engine(pair.drafter_dir, pair.target_dir, out, target_key="tiny",
                         overrides={"drafter_window": win, "max_batch_size": 4})
            engines[win] = out

        def eng(batch, win="model"):
            e, man = open_standin_engine(engines[win])
            try:
                rt = Runtime(e, max_batch_size=batch)
                reqs = [Request(p, N, stop_token_ids=(2,), task_id=i) for i, p in enumerate(prompts)]
                rt.generate(reqs)
                return reqs
            finally:
                e.close()

        eng(1)  # warm-up: builds/loads the plugins' CPU libraries
        base = None
        for name, fn in (("reference (batch 1, sequential)", ref), ("engine max batch 1", lambda: eng(1)),
                         ("engine max batch 4", lambda: eng(4)),
                         ("engine max batch 4, drafter_window=full", lambda: eng(4, "full"))):
            best, res = float("inf"), None
            for _ in range(a.reps):
                t0 = time.perf_counter()
                res = fn()
                best = min(best, time.perf_counter() - t0)
            toks = sum(len(r.output_ids) for r in res)
            acc = [x for r in res for x in r.acceptance_lengths]
            outs = [r.output_ids for r in res]
            if base is None:
                base = (toks / best, outs)
            rows.append({"run": name, "seconds": best, "tokens": toks, "tokens_per_s": toks / best,
                         "vs_reference": (toks / best) / base[0], "mean_acceptance": sum(acc) / len(acc),
                         "same_output_as_reference": outs == base[1]})
    w = max(len(r["run"]) for r in rows)
    print(f"{len(prompts)} prompts x {N} new tokens, greedy, torch threads {a.threads}, best of {a.reps}")
    print(f"{'run'.ljust(w)}  tokens/s   vs ref   mean acc   same output")
    for r in rows:
        print(f"{r['run'].ljust(w)}  {r['tokens_per_s']:8.1f}   {r['vs_reference']:5.2f}x   {r['mean_acceptance']:8.2f}"
              f"   {r['same_output_as_reference']}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
