"""``run --cuda-graphs`` (engine/standin/graphs.py): generation steps replayed from graphs captured per bucket.

A CUDA graph cannot run here, so the runner's bookkeeping runs with ``simulate``: each replay computes, eagerly, what
a replay computes (the host inputs frozen at the capture, the device inputs copied into the captured buffers, the
attention sized as a device sizes it with the bucket's key range). Through it, every family's requests (greedy and
sampled, in-flight batching with context, mixed and generation steps) give the plain CPU engine's tokens; a runner
that froze a device input is caught; and the flag is refused where it cannot apply."""

from __future__ import annotations

import json

import pytest
from dflash2_trt.assets import trained_pair
from dflash2_trt.engine.standin import graphs
from dflash2_trt.engine.standin.engine import open_standin_engine
from dflash2_trt.engine.standin.graphs import GraphedSteps
from dflash2_trt.errors import ConfigError
from dflash2_trt.runtime import Request, Runtime
from dflash2_trt.testing.cli import cli, one_error_line
from dflash2_trt.testing.engines import EngineCache, run_prompts, shipped_prompts

FAMILIES = [("qwen3", "tiny"), ("qwen3_5", "tiny-hybrid"), ("muse_glimmer", "tiny-muse")]


def _graphed(d, prompts, temperature, granule=64, **kw):
    eng, man = open_standin_engine(d)
    try:
        g = GraphedSteps(eng, simulate=True, granule=granule, **kw)
        reqs = [Request(list(p), 24, temperature=temperature, seed=i, task_id=i,
                        stop_token_ids=tuple(man["eos_token_ids"])) for i, p in enumerate(prompts)]
        Runtime(g, max_batch_size=3).generate(reqs)
        return reqs, g
    finally:
        eng.close()


@pytest.mark.parametrize("family,key", FAMILIES)
def test_replayed_generation_steps_give_the_engines_tokens(family, key, tmp_path_factory):
    pair = trained_pair(family)
    d = EngineCache(pair, key, tmp_path_factory, verify=False)(4)
    prompts = shipped_prompts(pair, 6)
    for temperature in (0.0, 0.8):
        want, _ = run_prompts(d, prompts, new=24, max_batch=3, temperature=temperature)
        got, g = _graphed(d, prompts, temperature)
        assert [r.output_ids for r in got] == [r.output_ids for r in want], temperature
        assert [r.acceptance_lengths for r in got] == [r.acceptance_lengths for r in want]
        st = g.stats
        assert st["captured"] >= 1 and st["replayed"] >= 5 and st["eager"] >= 3 and not g.failures(), st


def test_replays_across_rounding_boundaries(tmp_path_factory):
    """A granule of 8 tokens (the executor's is 256) against a spec-decoding width of 8: a bucket's later steps come
    within the width of its rounding boundary, where only the step's new tokens in the key range (rounded committed
    length + width) keep every key in view. Each later step of a bucket, computed with the bucket's first step's host
    inputs and the bucket's key range, gives exactly its own outputs, logits included (the tokens alone would not
    show a few keys lost at the last draft positions); and the graphed run keeps the engine's tokens."""
    from dflash2_trt.engine.standin.capture import replay_with_host_inputs_of

    pair = trained_pair("qwen3")
    d = EngineCache(pair, "tiny", tmp_path_factory, verify=False)(8)
    prompts = shipped_prompts(pair, 6)
    eng, _ = open_standin_engine(d)
    g = GraphedSteps(eng, simulate=True, granule=8)
    first, checked = {}, []
    orig = eng.step

    def spy(feed):
        b = g.bucket(feed)
        if b is not None:
            if b in first:
                checked.append(replay_with_host_inputs_of(eng, first[b], feed, key_range=b[2])["differs"])
            else:
                first[b] = dict(feed)
        return orig(feed)

    eng.step = spy
    try:
        Runtime(eng, max_batch_size=3).generate([Request(list(p), 24, task_id=i) for i, p in enumerate(prompts)])
    finally:
        eng.step = orig
        eng.close()
    assert len(checked) >= 3 and all(diff == [] for diff in checked), checked
    want, _ = run_prompts(d, prompts, new=24, max_batch=3)
    got, g = _graphed(d, prompts, 0.0, granule=8)
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert g.stats["captured"] >= 3 and g.stats["replayed"] >= 3, g.stats


def test_a_runner_that_froze_a_device_input_is_caught(tmp_path_factory, monkeypatch):
    """The negative control: were the drafted tokens (a device input) frozen at the capture like a host input, the
    replays would verify stale drafts and the tokens would change."""
    pair = trained_pair("qwen3")
    d = EngineCache(pair, "tiny", tmp_path_factory, verify=False)(4)
    prompts = shipped_prompts(pair, 6)
    want, _ = run_prompts(d, prompts, new=24, max_batch=3)
    real = graphs.input_memory
    monkeypatch.setattr(graphs, "input_memory", lambda k: "host" if k == "input_ids" else real(k))
    monkeypatch.setattr(graphs, "UNBUCKETED_HOST_INPUTS", graphs.UNBUCKETED_HOST_INPUTS + ("input_ids",))   # not bucketed
    got, g = _graphed(d, prompts, 0.0)
    assert g.stats["replayed"] >= 5
    assert [r.output_ids for r in got] != [r.output_ids for r in want]


def test_buckets_and_key_ranges(tmp_path_factory):
    """Only generation steps are bucketed, and a graph's key range is what TensorRT-LLM's executor sizes its graphs
    with (``api_1_2.yaml`` executor_cuda_graphs; here with a 64-token granule, the executor's 256 being the default)."""
    pair = trained_pair("qwen3_5")
    d = EngineCache(pair, "tiny-hybrid", tmp_path_factory, verify=False)(4)
    eng, _ = open_standin_engine(d)
    feeds = []
    orig = eng.step
    eng.step = lambda feed: (feeds.append(dict(feed)), orig(feed))[1]
    try:
        Runtime(eng, max_batch_size=3).generate([Request(list(p), 12, task_id=i)
                                                 for i, p in enumerate(shipped_prompts(pair, 4))])
        g = GraphedSteps(eng, simulate=True, granule=64)
        kinds = [set(f["host_request_types"].tolist()) for f in feeds]
        assert all((g.bucket(f) is None) == (k != {1}) for f, k in zip(feeds, kinds))   # only generation steps
        gen = [f for f, k in zip(feeds, kinds) if k == {1}]
        for f in gen:
            keys = g.key_range(f)
            past, width = int(f["host_past_key_value_lengths"].max()), int(f["spec_decoding_position_offsets"].shape[1])
            # the executor's capture-time length (the longest committed length rounded up) plus the new tokens
            rounded = -(-past // 64) * 64
            assert keys == min(min(g.max_keys - 1, rounded) + width, max(g.max_keys, past + width))
            assert keys >= past + width
        # two steps of one batch shape and key range share a bucket although their lengths differ
        same = [(a, b) for a, b in zip(gen, gen[1:]) if g.bucket(a) == g.bucket(b)]
        assert same and any(not (a["host_past_key_value_lengths"] == b["host_past_key_value_lengths"]).all()
                            for a, b in same)
    finally:
        eng.step = orig
        eng.close()


def test_cuda_graphs_are_refused_where_they_cannot_apply(tmp_path_factory):
    pair = trained_pair("qwen3")
    d = EngineCache(pair, "tiny", tmp_path_factory, verify=False)(4)
    eng, _ = open_standin_engine(d)
    try:
        with pytest.raises(ConfigError, match="cuda engine on a GPU; this one runs on cpu"):
            GraphedSteps(eng)
    finally:
        eng.close()
    line = one_error_line(*cli("run", "--engine-dir", str(d), "--prompt-ids", "5,6,7", "--cuda-graphs"))
    assert "--cuda-graphs" in line and "this is a cpu engine" in line, line
    ds = tmp_path_factory.mktemp("ds") / "ds.jsonl"
    ds.write_text('{"task_id": 0, "input_ids": [5, 6, 7], "output_tokens": 4}\n')
    line = one_error_line(*cli("bench", "run", "--engine-dir", str(d), "--dataset", str(ds), "--cuda-graphs"))
    assert "--cuda-graphs" in line and "this is a cpu engine" in line, line


def test_the_report_says_what_the_graphs_did(tmp_path_factory):
    from dflash2_trt.engine.run import render
    from dflash2_trt.engine.standin.run import run_standin_engine

    pair = trained_pair("qwen3")
    d = EngineCache(pair, "tiny", tmp_path_factory, verify=False)(4)
    rep = run_standin_engine(d, prompt_ids="5,6,7,8", max_new_tokens=24, simulate_graphs=True)
    g = rep["cuda_graphs"]
    assert g["simulated"] is True and g["replayed"] >= 1 and g["captured"] == 1 and g["failed"] == []
    assert "CUDA graphs:" in render(rep) and json.loads(json.dumps(rep))["cuda_graphs"] == g


def test_a_failed_capture_turns_graphs_off_and_keeps_the_tokens(tmp_path_factory, monkeypatch):
    """A capture CUDA refuses (here: made to fail as torch reports it, the first error chained beneath capture_end's)
    runs its step eagerly, reports the first error, and no further capture is tried: the tokens are the engine's."""
    pair = trained_pair("qwen3_5")
    d = EngineCache(pair, "tiny-hybrid", tmp_path_factory, verify=False)(4)
    prompts = shipped_prompts(pair, 6)
    want, _ = run_prompts(d, prompts, new=24, max_batch=3)
    tries = []

    def refused(self, feed, keys):
        tries.append(keys)
        try:
            raise RuntimeError("operation not permitted when stream is capturing")
        except RuntimeError:
            raise RuntimeError("operation failed due to a previous error during capture")   # noqa: B904

    monkeypatch.setattr(GraphedSteps, "_capture", refused)
    got, g = _graphed(d, prompts, 0.0)
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert len(tries) == 1 and g.stats["replayed"] == 0 and g.stats["captured"] == 0
    assert g.failures() == ["RuntimeError: operation not permitted when stream is capturing"]
    assert g.disabled == g.failures()[0]


def test_bench_run_graphs_both_modes(tmp_path_factory):
    """``bench run --cuda-graphs``: the speculative engine and the target-only baseline both replay their generation
    steps (simulated here), keep their tokens (greedy: equal to each other and to the eager bench's), and each run
    reports its own counts."""
    from dflash2_trt.bench.dataset import prepare_dataset, resolve_target
    from dflash2_trt.bench.report import render
    from dflash2_trt.bench.run import bench_run

    pair = trained_pair("qwen3_5")
    d = EngineCache(pair, "tiny-hybrid", tmp_path_factory, verify=False)(4)
    ds = tmp_path_factory.mktemp("ds") / "ds.jsonl"
    tgt = resolve_target(engine_dir=d)
    prepare_dataset(source="builtin", builtin="tiny-hybrid", output=ds, num_requests=5, output_tokens=20,
                    vocab_size=tgt["vocab_size"], tokenizer_dir=tgt["tokenizer_dir"], stop_ids=tgt["stop_ids"])
    kw = dict(concurrency="1,3", keep_outputs=True, progress=False)
    eager = bench_run(d, ds, **kw)
    rep = bench_run(d, ds, simulate_graphs=True, **kw)
    assert eager["settings"]["cuda_graphs"] is False and rep["settings"]["cuda_graphs"] is True
    for run, plain in zip(rep["runs"], eager["runs"]):
        # lossless against the target-only baseline at T = 0, with and without graphs (the hybrid baseline once
        # leaked a reused slot's state: tests/bench/test_bench_autoregressive.py)
        assert run["outputs_match"] is True and plain["outputs_match"] is True
        for mode in ("speculative", "autoregressive"):
            g = run[mode]["cuda_graphs"]
            assert g["simulated"] is True and g["failed"] == [] and g["replayed"] >= 3, (run["concurrency"], mode, g)
            assert g["replayed"] + g["captured"] + g["eager"] == run[mode]["engine_steps"]
            assert "cuda_graphs" not in plain[mode]
            assert run[mode]["outputs"] == plain[mode]["outputs"]
    text = render(rep)
    assert "CUDA graphs: speculative" in text and "; autoregressive" in text and "simulated" in text


def test_the_graph_rules_are_the_executors():
    """GraphedSteps' defaults are TensorRT-LLM's executor's recorded rules."""
    import yaml
    from importlib import resources

    facts = yaml.safe_load(resources.files("dflash2_trt.trtllm.cpu").joinpath("api_1_2.yaml").read_text("utf-8"))
    rules = facts["executor_cuda_graphs"]
    assert graphs.KV_LENGTH_ROUND_SIZE == rules["kv_length_round_size"] == 256
    assert rules["only_steps_without_context_requests"] is True
    assert {s: facts["sources"][s]["path"] for s in rules["source"]} == {
        "inflight_batching": "cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp",
        "runtime_buffers": "cpp/tensorrt_llm/batch_manager/runtimeBuffers.cpp"}
