"""Per-run figures from finished requests: throughput, latency percentiles, TTFT, acceptance.

Definitions (every figure of a report's ``speculative`` / ``autoregressive`` block):

- ``wall_s``: first submission to last completion of the run.
- ``requests_per_s`` = requests / wall; ``output_tokens_per_s`` = emitted tokens / wall.
- ``latency_s``: submission to completion, per request; ``ttft_s``: submission to the step that
  emitted the request's first token; ``itl_s``: (latency - TTFT) / (output tokens - 1), requests
  with more than one token (trtllm-bench's inter-token latency).
- Percentiles are nearest-rank: the value at sorted index ``ceil(p/100 * n) - 1``, as
  ``gptManagerBenchmark``'s ``calcPercentile`` computes them; ``mean``, ``std`` (population), ``min``, ``max`` besides.
- ``acceptance``: over every generation step of every request (the context step that emits a
  request's first token is not a draft-verify step): ``mean`` = the acceptance length, tokens the
  engine accepted per step (its ``num_accepted_tokens``: accepted drafts + 1; the runtime's
  ``acceptance_lengths``, pooled: ``run``'s ``totals.mean_acceptance``), ``histogram`` {tokens
  accepted: steps}, ``per_position[i]`` = share of steps whose draft position i+1 was accepted
  (length >= i + 2), ``per_position_conditional[i]`` = the same among steps that accepted every
  earlier position (``null`` where no step reached it). A request's last step may accept more
  than it emits (the rest is past ``output_tokens`` or its stop token and is cut), so
  ``emitted_mean`` = tokens the generation steps emitted / those steps is the figure throughput
  follows (and trtllm-bench's kind: its acceptance length counts output tokens), never above
  ``mean``; the two agree on long outputs. ``decode_target_tokens_per_emitted_token`` = (K + 1) /
  ``emitted_mean``.
- ``target_tokens``: tokens the target processed over the run, summed over engine steps (prompts,
  plus K + 1 per generation request per step); ``target_tokens_per_emitted_token`` =
  target_tokens / emitted tokens; ``decode_target_tokens_per_emitted_token`` leaves the prompts
  out: (K + 1) x generation steps / tokens emitted by generation steps.
- ``chunked_steps``: engine steps in which a prompt was cut (chunked context: the prompt did not fit what the
  step had left of ``max_num_tokens``; its first token comes from the step of its last chunk, so it waited longer).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Sequence


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence (``gptManagerBenchmark``'s rule)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    i = max(0, math.ceil(p / 100.0 * len(sorted_values)) - 1)
    return float(sorted_values[min(i, len(sorted_values) - 1)])


def distribution(values: Iterable[float]) -> dict | None:
    """``{"mean", "std", "p50", "p90", "p99", "min", "max"}`` of ``values``; None when there are none. ``std`` is the
    population standard deviation (numpy's default, vLLM's ``std_*_ms``)."""
    v = sorted(float(x) for x in values)
    if not v:
        return None
    mean = math.fsum(v) / len(v)
    return {"mean": mean, "std": math.sqrt(math.fsum((x - mean) ** 2 for x in v) / len(v)),
            "p50": percentile(v, 50), "p90": percentile(v, 90), "p99": percentile(v, 99), "min": v[0], "max": v[-1]}


def acceptance_stats(lengths: Iterable[int], draft_len: int) -> dict:
    """Acceptance figures of a pool of generation steps (tokens accepted per step, each in [1, K+1])."""
    lengths = [int(n) for n in lengths]
    hist = Counter(lengths)
    steps = len(lengths)
    per_pos, cond = [], []
    for i in range(1, draft_len + 1):             # draft position i accepted <=> length >= i + 1
        acc = sum(c for n, c in hist.items() if n >= i + 1)
        reached = sum(c for n, c in hist.items() if n >= i)
        per_pos.append(acc / steps if steps else None)
        cond.append(acc / reached if reached else None)
    return {"mean": sum(lengths) / steps if steps else None, "steps": steps,
            "histogram": {str(k): hist[k] for k in sorted(hist)},
            "per_position": per_pos, "per_position_conditional": cond}


def mean_from_histogram(histogram: dict) -> float:
    """Mean tokens accepted per step (the acceptance length) of an ``acceptance.histogram`` ({"n": steps})."""
    steps = sum(int(c) for c in histogram.values())
    if steps == 0:
        raise ValueError("empty acceptance histogram")
    return sum(int(n) * int(c) for n, c in histogram.items()) / steps


def run_metrics(requests, *, wall_s: float, step_log: Sequence[dict], draft_len: int) -> dict:
    """The figures of one run (see the module docstring) from finished runtime ``Request`` objects."""
    n = len(requests)
    out_tok = sum(len(r.output_ids) for r in requests)
    in_tok = sum(len(r.prompt_ids) for r in requests)
    lat = [r.finish_time - r.start_time for r in requests]
    ttft = [r.first_token_time - r.start_time for r in requests]
    itl = [(r.finish_time - r.first_token_time) / (len(r.output_ids) - 1) for r in requests if len(r.output_ids) > 1]
    target_tokens = sum(int(s["tokens"]) for s in step_log)
    gen_slots = sum(int(s["generation"]) for s in step_log) * (draft_len + 1)
    gen_emitted = out_tok - n                    # each request's first token comes from its context step
    acc = acceptance_stats([a for r in requests for a in r.acceptance_lengths], draft_len)
    acc["emitted_mean"] = gen_emitted / acc["steps"] if acc["steps"] else None
    return {
        "requests": n, "input_tokens": in_tok, "output_tokens": out_tok, "wall_s": wall_s,
        "requests_per_s": n / wall_s if wall_s > 0 else None,
        "output_tokens_per_s": out_tok / wall_s if wall_s > 0 else None,
        "latency_s": distribution(lat), "ttft_s": distribution(ttft), "itl_s": distribution(itl),
        "engine_steps": len(step_log), "target_tokens": target_tokens,
        # steps in which a prompt was cut (chunked context: it did not fit what the step had left)
        "chunked_steps": sum(1 for s in step_log if s.get("cut")),
        "target_tokens_per_emitted_token": target_tokens / out_tok if out_tok else None,
        "decode_target_tokens_per_emitted_token": gen_slots / gen_emitted if gen_emitted > 0 else None,
        "acceptance": acc,
    }
