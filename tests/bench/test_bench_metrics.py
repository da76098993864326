"""Per-run figures against hand computations: nearest-rank percentiles, acceptance by position, throughput,
target tokens per emitted token."""

from __future__ import annotations

import pytest

from dflash2_trt.bench.metrics import acceptance_stats, distribution, mean_from_histogram, percentile, run_metrics
from dflash2_trt.runtime import Request


def test_nearest_rank_percentiles():
    v = [float(i) for i in range(1, 11)]            # 1..10
    assert percentile(v, 50) == 5.0                  # ceil(0.5 * 10) - 1 = index 4
    assert percentile(v, 90) == 9.0
    assert percentile(v, 99) == 10.0                 # ceil(9.9) - 1 = 9
    assert percentile([7.0], 99) == 7.0
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0    # ceil(1.5) - 1 = 1
    with pytest.raises(ValueError):
        percentile([], 50)
    d = distribution([3, 1, 2, 4])
    # std: the population standard deviation (numpy's default, vLLM's std_*_ms): sqrt(mean of squared deviations)
    assert d == {"mean": 2.5, "std": 1.25 ** 0.5, "p50": 2.0, "p90": 4.0, "p99": 4.0, "min": 1.0, "max": 4.0}
    assert distribution([7.0])["std"] == 0.0
    assert distribution([]) is None


def test_acceptance_by_position_by_hand():
    # K = 3; steps emitting 1, 2, 4, 4, 3 tokens
    a = acceptance_stats([1, 2, 4, 4, 3], draft_len=3)
    assert a["mean"] == pytest.approx(14 / 5)
    assert a["steps"] == 5
    assert a["histogram"] == {"1": 1, "2": 1, "3": 1, "4": 2}
    # position 1 accepted when >= 2 tokens: 4 of 5; position 2 when >= 3: 3 of 5; position 3 when 4: 2 of 5
    assert a["per_position"] == pytest.approx([4 / 5, 3 / 5, 2 / 5])
    # conditional: among steps that reached the position (accepted all earlier): 4/5, 3/4, 2/3
    assert a["per_position_conditional"] == pytest.approx([4 / 5, 3 / 4, 2 / 3])
    assert mean_from_histogram(a["histogram"]) == pytest.approx(14 / 5)
    none = acceptance_stats([], draft_len=2)
    assert none["mean"] is None and none["per_position"] == [None, None] and none["histogram"] == {}


def _req(prompt_len, out, acc, start, first, finish):
    r = Request(list(range(1, prompt_len + 1)), max_new_tokens=len(out))
    r.output_ids, r.acceptance_lengths = list(out), list(acc)
    r.start_time, r.first_token_time, r.finish_time = start, first, finish
    return r


def test_run_metrics_by_hand():
    # K = 3. Request A: prompt 5, 1 (context) + 4 + 3 = 8 tokens; B: prompt 3, 1 + 2 = 3 tokens.
    a = _req(5, range(8), [4, 3], start=0.0, first=0.5, finish=2.0)
    b = _req(3, range(3), [2], start=1.0, first=1.2, finish=1.5)
    # steps: [A ctx], [A gen, B ctx], [A gen, B gen]
    log = [{"context": 1, "generation": 0, "tokens": 5}, {"context": 1, "generation": 1, "tokens": 4 + 3},
           {"context": 0, "generation": 2, "tokens": 8}]
    m = run_metrics([a, b], wall_s=2.0, step_log=log, draft_len=3)
    assert m["requests"] == 2 and m["output_tokens"] == 11 and m["input_tokens"] == 8
    assert m["requests_per_s"] == 1.0 and m["output_tokens_per_s"] == 5.5
    assert m["latency_s"]["p50"] == 0.5 and m["latency_s"]["p99"] == 2.0 and m["latency_s"]["mean"] == 1.25
    assert m["ttft_s"]["p50"] == pytest.approx(0.2) and m["ttft_s"]["max"] == 0.5
    assert m["itl_s"]["p50"] == pytest.approx(0.15) and m["itl_s"]["max"] == pytest.approx(1.5 / 7)
    assert m["engine_steps"] == 3 and m["target_tokens"] == 20 and m["chunked_steps"] == 0
    assert run_metrics([a, b], wall_s=2.0, step_log=[{**log[0], "cut": 1}, *log[1:]], draft_len=3)["chunked_steps"] == 1
    assert m["target_tokens_per_emitted_token"] == pytest.approx(20 / 11)
    # 3 generation slots x (K + 1) = 12 target tokens for the 11 - 2 tokens the generation steps emitted
    assert m["decode_target_tokens_per_emitted_token"] == pytest.approx(12 / 9)
    assert m["acceptance"]["mean"] == 3.0 and m["acceptance"]["steps"] == 3
    assert m["acceptance"]["emitted_mean"] == 3.0          # no step was cut: 9 tokens over 3 steps


def test_a_cut_last_step_counts_as_accepted_not_as_emitted():
    # K = 3. A request of 6 tokens: 1 (context), a step accepting 4, then a step accepting 4 of which only 1 is
    # kept (max_new_tokens). The acceptance length is the draft's (4.0, as TensorRT-LLM's executor counts it);
    # the generation steps emitted 5 tokens in 2 steps, and the target's decode work per emitted token follows that.
    r = _req(4, range(6), [4, 4], start=0.0, first=0.1, finish=0.3)
    log = [{"context": 1, "generation": 0, "tokens": 4}, {"context": 0, "generation": 1, "tokens": 4},
           {"context": 0, "generation": 1, "tokens": 4}]
    m = run_metrics([r], wall_s=0.3, step_log=log, draft_len=3)
    acc = m["acceptance"]
    assert acc["mean"] == 4.0 and acc["histogram"] == {"4": 2} and acc["per_position"] == [1.0, 1.0, 1.0]
    assert acc["emitted_mean"] == pytest.approx(5 / 2)
    assert m["decode_target_tokens_per_emitted_token"] == pytest.approx(8 / 5) == pytest.approx(4 / acc["emitted_mean"])
    from dflash2_trt.bench.report import render

    rep = {"backend": "cpu", "engine_dir": "e", "block_size": 4, "tp_size": 1, "dataset": {"requests": 1, "path": "d"},
           "settings": {"temperature": 0.0}, "baseline": None, "draft_len": 3,
           "runs": [{"concurrency": 1, "speculative": m, "autoregressive": None, "speedup": None}]}
    assert "accept = mean tokens accepted per generation step" in render(rep) and "prompts cut" not in render(rep)
    # a run in which prompts were cut says so under it (chunked context: their first token waited for the last chunk)
    rep["settings"]["max_num_tokens"] = 32
    rep["runs"][0]["speculative"] = {**m, "chunked_steps": 5}
    assert "     prompts cut in chunks (max_num_tokens 32): speculative in 5 steps" in render(rep).splitlines()
    none = run_metrics([_req(2, [7], [], start=0.0, first=0.1, finish=0.1)], wall_s=0.1,
                       step_log=[{"context": 1, "generation": 0, "tokens": 2}], draft_len=3)
    assert none["acceptance"]["mean"] is None and none["acceptance"]["emitted_mean"] is None
