"""The context route (build setting ``sliding_path: context``): the target's sliding-window layers take every request's
new tokens of a step as a context chunk after its committed tokens, through a second set of request inputs the
runtime binds, because TensorRT-LLM's attention plugin applies a layer's window in a context part and not in a
speculative-decoding generation part (engine/trtllm/facts/attention_window.yaml context_route, read, not run). Here on
the CPU engine of the trained tiny Muse Glimmer (window 16, K 15: the window binds in every verify step): the route is
what the network's attention calls receive, the feed holds what the record says the plugin needs, and the engine's
tokens are the generation path's (both lossless by the build's verify gate)."""

from __future__ import annotations

import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.runtime import Request, Runtime
from dflash2_trt.trtllm.backend import load_network
from dflash2_trt.trtllm.cpu.tensor import raw
from dflash2_trt.trtllm.engine_io import load_contract


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from dflash2_trt.engine.build import build_engine
    from dflash2_trt.engine.standin.engine import open_standin_engine

    p = trained_pair("muse_glimmer")
    out = {}
    for path in ("context", "generation"):
        d = tmp_path_factory.mktemp("route") / path
        # sliding_path auto resolves to context here (the window binds); generation asked for explicitly
        # the build's verify gate on: each engine's greedy tokens on the gate's prompts are the HF target's own
        res = build_engine(p.drafter_dir, p.target_dir, d, target_key="tiny-muse", verify=True,
                           overrides={} if path == "context" else {"sliding_path": "generation"})
        assert res.manifest["verify"]["passed"] is True and res.manifest["verify"]["tokens"] > 0, res.manifest["verify"]
        out[path], _ = open_standin_engine(d)
        out[path].engine_dir = d
    yield out
    for e in out.values():
        e.close()


def _requests():
    g = torch.Generator().manual_seed(7)
    # prompts longer than the window and up to 40 new tokens: verify chunks whose keys pass the window
    # (one request ends early: the third joins while the first generates, a mixed step)
    return [Request(torch.randint(3, 200, (n,), generator=g).tolist(), new, task_id=i)
            for i, (n, new) in enumerate(((5, 40), (23, 12), (37, 40)))]


def test_the_route_engine_declares_the_second_set_and_the_other_does_not(engines):
    names = {"sliding_host_request_types", "sliding_context_lengths", "sliding_host_context_lengths",
             "sliding_host_past_key_value_lengths"}
    contract = load_contract()["inputs"]
    for path, eng in engines.items():
        on = path == "context"
        assert eng.sliding_context is on and eng.config["dflash2_engine"]["sliding_path"] == path
        want = {p.name for p in contract if p.applies(tp_size=1, sliding_context=on)}
        assert set(eng._declared) == want and (names <= want) is on
        for n in names & want:
            spec = next(p for p in contract if p.name == n)
            assert eng._declared[n].dtype == spec.dtype == "int32"


def test_sliding_layers_attend_as_context_chunks_and_the_rest_as_before(engines, monkeypatch):
    eng = engines["context"]
    net = load_network("cpu")
    cfg = net.api.PretrainedConfig.from_dict(eng.config)
    kinds = [k for k in net.hf_layer_types(cfg) if k != "linear_attention"]      # the target's KV layers
    K, W = eng.K, int(cfg.sliding_window)
    calls = []
    orig = net.F.gpt_attention

    def spy(*args, **kw):
        layer = kw["layer_idx"]
        if layer < len(kinds):                                                     # a target layer (not the drafter)
            v = {k: raw(kw[k]) for k in ("host_request_types", "host_past_key_value_lengths", "sequence_length",
                                         "context_lengths", "host_max_attention_window_sizes")}
            calls.append((kinds[layer], v["host_request_types"].tolist(), v["host_past_key_value_lengths"].tolist(),
                          v["sequence_length"].tolist(), v["context_lengths"].tolist(),
                          int(v["host_max_attention_window_sizes"][layer])))
        return orig(*args, **kw)

    monkeypatch.setattr(net.F, "gpt_attention", spy)
    rt = Runtime(eng, max_batch_size=2)
    reqs = _requests()
    rt.generate(reqs)
    kinds_seen = {(bool(s["context"]), bool(s["generation"])) for s in rt.step_log}
    assert kinds_seen == {(True, False), (False, True), (True, True)}               # context, generation, mixed
    sliding = [c for c in calls if c[0] == "sliding_attention"]
    full = [c for c in calls if c[0] == "full_attention"]
    assert sliding and full
    binds = 0
    for _, types, hp, seq, ctx, window in sliding:
        assert window == W < eng.limits["max_seq_len"]                             # a sliding layer to the plugin
        assert set(types) == {0} and hp == seq                                    # context chunks; past + new
        assert all(n >= 1 for n in ctx) and all(s - n >= 0 for s, n in zip(seq, ctx))
        binds += any(s > W for s in seq)
    assert binds                                        # calls whose keys pass the window: the mask had work to do
    # a generation request's chunk is its K + 1 verify tokens (its stock context_lengths, prompt + K, never are)
    assert any(K + 1 in ctx for (*_, ctx, _) in sliding)
    # the full-attention layers keep the step's own request types: generation requests verify there as before
    assert any(1 in types for _, types, *_ in full)
    assert all(r.done for r in reqs)


def test_the_route_gives_the_generation_paths_tokens(engines):
    outs = {}
    for path, eng in engines.items():
        reqs = _requests()
        Runtime(eng, max_batch_size=2).generate(reqs)
        outs[path] = [r.output_ids for r in reqs]
    assert outs["context"] == outs["generation"]


def test_the_standin_refuses_a_second_set_whose_key_range_misses_the_new_tokens(engines, monkeypatch):
    """The plugin takes a context part's key range (and whether the window applies) from the max of
    host_past_key_value_lengths as given: the stock value is past + new. A feed with the past alone is refused, in a
    context step and in a generation step."""
    eng = engines["context"]
    orig, refused = eng.step, []

    def spy(inputs):
        kind = bool((inputs["host_request_types"] == 1).any())
        if kind not in refused:
            bad = dict(inputs, sliding_host_past_key_value_lengths=inputs["sliding_host_past_key_value_lengths"]
                       - inputs["sliding_host_context_lengths"])
            with pytest.raises(ValueError, match="host_past_key_value_lengths gives them"):
                orig(bad)
            refused.append(kind)
        return orig(inputs)

    monkeypatch.setattr(eng, "step", spy)
    reqs = _requests()[:1]
    Runtime(eng, max_batch_size=1).generate(reqs)
    assert sorted(refused) == [False, True] and reqs[0].done


def test_the_baseline_takes_the_route_too(engines, monkeypatch):
    """The target-only network (``build --baseline``, ``bench run``'s autoregressive baseline) of a routed engine: its
    one-token generation steps are context chunks of one in the sliding layers too (a routed layer never takes a
    generation call, whose kernel would read its linearly written cache cyclically: facts mmha_wraps), and it decodes
    what the combined engine does (both the target's greedy decoding: the combined engine by the build's gate)."""
    from dflash2_trt.bench.autoregressive import open_target_only_engine

    eng = engines["context"]
    base = open_target_only_engine(eng.engine_dir)
    try:
        assert base.K == 0 and base.sliding_context
        net = load_network("cpu")
        cfg = net.api.PretrainedConfig.from_dict(base.config)
        kinds = [k for k in net.hf_layer_types(cfg) if k != "linear_attention"]
        types_seen, orig = [], net.F.gpt_attention

        def spy(*args, **kw):
            if kw["layer_idx"] < len(kinds) and kinds[kw["layer_idx"]] == "sliding_attention":
                types_seen.append((raw(kw["host_request_types"]).tolist(), raw(kw["context_lengths"]).tolist()))
            return orig(*args, **kw)

        monkeypatch.setattr(net.F, "gpt_attention", spy)
        reqs = _requests()
        Runtime(base, max_batch_size=2).generate(reqs)
        monkeypatch.undo()
        assert types_seen and all(set(t) == {0} for t, _ in types_seen)
        assert any(set(c) == {1} for _, c in types_seen)                      # generation steps: one token each
        want = _requests()
        Runtime(eng, max_batch_size=2).generate(want)
        assert [r.output_ids for r in reqs] == [r.output_ids for r in want]
    finally:
        base.close()


def test_a_routed_tensorrt_engine_names_the_project_runtime_everywhere(engines, tmp_path):
    """A TensorRT-LLM engine directory of a routed engine (its rank engine the CPU stand-in of TensorRT running the
    tiny-muse CPU engine): the executor is refused in one line by `run --runtime executor` and by `deploy triton
    --backend tensorrtllm` (no TensorRT-LLM runtime binds the sliding_* inputs), RUN.md says its executor sections do not
    run it, and the project runtime over the session gives the CPU engine's tokens."""
    from dflash2_trt.deploy.triton.repository import deploy_triton
    from dflash2_trt.engine.trtllm.paths import choose_runtime
    from dflash2_trt.engine.trtllm.session import open_trt_session
    from dflash2_trt.errors import ConfigError
    from dflash2_trt.testing import tensorrt_standin as trt
    from dflash2_trt.testing.engines import standin_trt_engine_dir

    eng = engines["context"]
    d = standin_trt_engine_dir(eng.engine_dir, tmp_path / "trt")
    import json

    man = json.loads((d / "engine.json").read_text())
    pre = json.loads((d / "config.json").read_text())["pretrained_config"]
    assert man["runtime_path"]["path"] == "project" and "context route" in man["runtime_path"]["why"][0]
    with pytest.raises(ConfigError, match="--runtime"):
        choose_runtime("executor", pre, man)
    # a manifest without the decision: still the project runtime
    assert choose_runtime(None, {"dflash2_engine": {"sliding_path": "context"}}, {})["path"] == "project"
    with pytest.raises(ConfigError, match="--backend.*sliding_\\* inputs"):
        deploy_triton(d, tmp_path / "repo", backend="tensorrtllm")
    assert not (tmp_path / "repo").exists()
    assert "do NOT run this engine on stock TensorRT-LLM; nor on any other" in (d / "RUN.md").read_text()
    sess, _ = open_trt_session(d, trt=trt)
    try:
        assert sess.sliding_context
        got = _requests()
        Runtime(sess, max_batch_size=2).generate(got)
    finally:
        sess.close()
    want = _requests()
    Runtime(eng, max_batch_size=2).generate(want)
    assert [r.output_ids for r in got] == [r.output_ids for r in want]


def test_bench_run_says_a_routed_baseline_is_not_a_stock_target_engine(engines, tmp_path):
    """`bench run` on a routed TensorRT engine directory with its baseline: the speedup is against a baseline whose
    sliding layers take one-token context chunks (not a stock target engine's generation kernels), and the report says
    so, in the baseline's description (the text table) and in its notes (the JSON); the tokens still match."""
    import json

    from dflash2_trt.bench.report import render
    from dflash2_trt.bench.run import bench_run
    from dflash2_trt.testing import tensorrt_standin as trt
    from dflash2_trt.testing.engines import standin_trt_engine_dir

    d = standin_trt_engine_dir(engines["context"].engine_dir, tmp_path / "trt", baseline=True)
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"task_id": i, "input_ids": r.prompt_ids, "output_tokens": 12}) + "\n"
                          for i, r in enumerate(_requests())))
    rep = bench_run(d, ds, concurrency="2", trt=trt, progress=False, stop_on_eos=False)
    assert rep["baseline"]["sliding_path"] == "context"
    assert any("context chunk of one" in n and "speedup is against this baseline" in n for n in rep["notes"])
    assert "context chunk of one" in render(rep)
    assert rep["runs"][0]["outputs_match"] is True


def test_every_rank_of_a_tp2_engine_takes_the_route(engines, tmp_path):
    """tp 2 (muse-glimmer-30b's build config): each rank network declares the second set and the engine decodes what
    the tp 1 routed engine does (the stand-in's simulated collectives)."""
    from dflash2_trt.engine.build import build_engine
    from dflash2_trt.engine.standin.engine import open_standin_engine

    p = trained_pair("muse_glimmer")
    d = tmp_path / "tp2"
    build_engine(p.drafter_dir, p.target_dir, d, target_key="tiny-muse", overrides={"tp_size": 2}, verify=False)
    eng, _ = open_standin_engine(d)
    try:
        assert eng.tp == 2 and eng.sliding_context
        names = {"sliding_host_request_types", "sliding_context_lengths", "sliding_host_context_lengths",
                 "sliding_host_past_key_value_lengths"}
        from dflash2_trt.trtllm.cpu.modeling_utils import declared_inputs

        for model in eng.models:
            decl = {x.name for x in declared_inputs(model.prepare_inputs(max_batch_size=4, max_num_tokens=1024,
                                                                         max_seq_len=512, tokens_per_block=32))}
            assert names <= decl
        got = _requests()
        Runtime(eng, max_batch_size=2).generate(got)
    finally:
        eng.close()
    want = _requests()
    Runtime(engines["context"], max_batch_size=2).generate(want)
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
