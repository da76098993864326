"""The autoregressive baseline: the target alone (trtllm/network/target_only.py) on the CPU stand-in, driven by the
stock runtime with K = 0, is exactly the target's own decoding; it loads only the target's tensors."""

from __future__ import annotations

import json

import pytest
import torch


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.build import build_engine

    pair = trained_pair("qwen3")
    out = tmp_path_factory.mktemp("ar") / "eng"
    build_engine(pair.drafter_dir, pair.target_dir, out, target_key="tiny")
    return out


def test_target_only_greedy_equals_the_target(engine_dir):
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.bench.autoregressive import open_target_only_engine
    from dflash2_trt.reference.loop import load_pair, target_generate
    from dflash2_trt.runtime import Request, Runtime

    pair = trained_pair("qwen3")
    prompts = json.loads((pair.drafter_dir.parent / "prompts.json").read_text())["prompts"][:5]
    e = open_target_only_engine(engine_dir)
    try:
        assert e.K == 0 and all(type(m).__name__ == "TargetOnlyForCausalLM" for m in e.models)
        rt = Runtime(e, max_batch_size=3)                           # in-flight: 5 requests through 3 slots
        reqs = [Request(list(p), 20, stop_token_ids=(2,), task_id=i) for i, p in enumerate(prompts)]
        rt.generate(reqs)
        assert all(len(r.acceptance_lengths) == len(r.output_ids) - 1 for r in reqs)   # one token per step
        assert {a for r in reqs for a in r.acceptance_lengths} <= {1}
        target, _ = load_pair(pair.target_dir, pair.drafter_dir)
        for r in reqs:
            assert r.output_ids == target_generate(target, r.prompt_ids, 20, stop_token_ids=(2,)), r.task_id
        # sampling: tokens come from the target's law (valid ids), reproducible by seed
        runs = []
        for _ in range(2):
            s = [Request(list(prompts[0]), 12, temperature=0.9, seed=7)]
            Runtime(e, max_batch_size=1).generate(s)
            runs.append(s[0].output_ids)
        assert runs[0] == runs[1] and all(0 <= t < 256 for t in runs[0])
    finally:
        e.close()


def test_target_only_loads_the_target_tensors_strictly(engine_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    from dflash2_trt.trtllm.backend import load_network
    from dflash2_trt.errors import CheckpointError

    net = load_network("cpu")
    cfg = json.loads((engine_dir / "config.json").read_text())["pretrained_config"]
    weights = load_file(str(engine_dir / "checkpoint" / "rank0.safetensors"))
    assert any(k.startswith("dflash2.") for k in weights)          # the drafter's are there, and dropped
    model = net.TargetOnlyForCausalLM.from_checkpoint(engine_dir / "checkpoint", 0,
                                                      net.api.PretrainedConfig.from_dict(cfg))
    assert {n for n, _ in model.named_parameters()} == {k for k in weights if not k.startswith("dflash2.")}
    ck = tmp_path / "ck"
    ck.mkdir()
    broken = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    broken["transformer.extra.weight"] = torch.zeros(1)
    save_file(broken, str(ck / "rank0.safetensors"))
    with pytest.raises(CheckpointError, match="not provided"):
        net.TargetOnlyForCausalLM.from_checkpoint(ck, 0, net.api.PretrainedConfig.from_dict(cfg))


def test_target_only_hybrid_target_equals_its_decoding(tmp_path):
    """The Qwen3.5 hybrid target alone: its Gated DeltaNet layers read and advance the runtime's state slots."""
    from dflash2_trt.trtllm.cpu import plugin_libs

    if not hasattr(plugin_libs, "gdn_lib"):   # the hybrid engine's Gated DeltaNet CPU build is not in this tree
        pytest.skip("no CPU build of the DFlash2GatedDeltaNet plugin (trtllm/cpu/plugin_libs.gdn_lib) in this tree")
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.bench.autoregressive import open_target_only_engine
    from dflash2_trt.engine.build import build_engine
    from dflash2_trt.reference.loop import load_pair, target_generate
    from dflash2_trt.runtime import Request, Runtime

    pair = trained_pair("qwen3_5")
    build_engine(pair.drafter_dir, pair.target_dir, tmp_path / "eng", target_key="tiny-hybrid")
    prompts = json.loads((pair.drafter_dir.parent / "prompts.json").read_text())["prompts"][:3]
    e = open_target_only_engine(tmp_path / "eng")
    try:
        reqs = [Request(list(p), 12, stop_token_ids=(2,), task_id=i) for i, p in enumerate(prompts)]
        Runtime(e, max_batch_size=2).generate(reqs)
    finally:
        e.close()
    target, _ = load_pair(pair.target_dir, pair.drafter_dir)
    for r in reqs:
        assert r.output_ids == target_generate(target, r.prompt_ids, 12, stop_token_ids=(2,)), r.task_id


def test_target_only_hybrid_reused_slot_starts_from_zero_state(tmp_path_factory, monkeypatch):
    """The runtime never zeroes a state slot (as TensorRT-LLM's), so the target-only network, like the combined one,
    starts a prompt's first chunk from zeros itself (``zero_state``): the context logits of a prompt on the slot an
    earlier request left do not depend on what that request was (the reference: the same prompt after itself on the
    slot). Without it the earlier state leaked into the baseline (found by ``bench run``: the hybrid's autoregressive
    tokens at concurrency 1, after the warm-up request, differed from the target's). Control: with zero_state
    dropped, the logits differ."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.bench.autoregressive import open_target_only_engine
    from dflash2_trt.runtime import Request, Runtime
    from dflash2_trt.testing.engines import EngineCache, shipped_prompts
    from dflash2_trt.trtllm.plugin_layers import CpuPlugins

    pair = trained_pair("qwen3_5")
    d = EngineCache(pair, "tiny-hybrid", tmp_path_factory, verify=False)(4)
    prompts = shipped_prompts(pair, 2)

    def context_logits(first, second):
        e = open_target_only_engine(d)
        seen, orig = [], e.step

        def spy(feed):
            out = orig(feed)
            if set(feed["host_request_types"].tolist()) == {0}:
                seen.append(out["logits"].clone())
            return out

        e.step = spy
        try:
            Runtime(e, max_batch_size=1).generate([Request(list(first), 5), Request(list(second), 2)])
        finally:
            e.close()
        return seen[-1]

    after_itself = context_logits(prompts[1], prompts[1])
    assert torch.equal(context_logits(prompts[0], prompts[1]), after_itself)
    orig = CpuPlugins.gated_delta_net
    monkeypatch.setattr(CpuPlugins, "gated_delta_net",
                        lambda self, *a, zero_state=None, **kw: orig(self, *a, zero_state=None, **kw))
    assert not torch.equal(context_logits(prompts[0], prompts[1]), after_itself)
