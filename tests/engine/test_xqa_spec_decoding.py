"""Which XQA kernel TensorRT-LLM 1.2 gives each attention layer in a TensorRT engine's speculative-decoding steps
(engine/trtllm/xqa.py), held to the record read in its sources (facts/xqa_spec_decoding.yaml): Qwen3.8-27B's
full attention (head 256, 6 query heads per KV head) has no precompiled kernel, so the build sets
TRTLLM_ENABLE_XQA_JIT=1 for trtllm-build and records it for the runtimes; a layer no kernel takes is refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dflash2_trt.engine.plan import prepare
from dflash2_trt.engine.trtllm.runtime_rules import facts
from dflash2_trt.engine.trtllm.xqa import apply_runtime_env, xqa_plan
from dflash2_trt.testing.fixtures import MUSE_DRAFTER, MUSE_TARGET, QWEN_DRAFTER, QWEN_TARGET

ENV = "TRTLLM_ENABLE_XQA_JIT"


def _kernels(x):
    return [(c["side"], c["q_heads"], c["kv_heads"], c["head_size"], c["kernel"]) for c in x["calls"]]


def test_the_record_names_its_sources():
    f = facts("xqa_spec_decoding")
    for section in ("runner", "jit_hmma", "precompiled_spec_decoding"):
        src = f[section]["source"]
        assert f["sources"][src]["repo"] == "NVIDIA/TensorRT-LLM" and f["sources"][src]["revision"], section
    assert f["runner"]["env"] == ENV and f["precompiled_spec_decoding"]["head_sizes"] == [128]


def test_the_published_pairs_kernels():
    q = prepare(QWEN_DRAFTER, QWEN_TARGET, target_key="qwen3.8-27b")
    x = xqa_plan(q.t, q.d, q.cfg)
    # 6 query heads per KV head: not a divisor of 64, so the runner sends it to the precompiled kernels, which have
    # head 128 only; the JIT kernel takes head 256 and 6, so the build forces JIT
    assert _kernels(x) == [("target", 24, 4, 256, "jit (forced)"), ("drafter", 32, 8, 128, "jit")]
    assert x["env"] == {ENV: "1"} and x["blockers"] == [] and "24 query / 4 KV heads of 256" in x["warnings"][0]
    q2 = prepare(QWEN_DRAFTER, QWEN_TARGET, target_key="qwen3.8-27b", overrides={"tp_size": 2})
    assert _kernels(xqa_plan(q2.t, q2.d, q2.cfg))[0] == ("target", 12, 2, 256, "jit (forced)")
    # Muse Glimmer (its build config's tp 2): 16 query heads per KV head, and the drafter's 8 KV heads over 4 pool
    # layers: 4 query / 1 KV head per call; both JIT by the runner's own rule, nothing forced
    m = prepare(MUSE_DRAFTER, MUSE_TARGET, target_key="muse-glimmer-30b")
    xm = xqa_plan(m.t, m.d, m.cfg)
    assert _kernels(xm) == [("target", 16, 1, 128, "jit"), ("drafter", 4, 1, 128, "jit")]
    assert xm["env"] == {} and xm["warnings"] == [] and xm["blockers"] == []


def test_a_layer_no_kernel_takes_is_refused():
    t = SimpleNamespace(num_attention_heads=24, num_key_value_heads=4, head_dim=512)      # head > 256: no JIT
    d = SimpleNamespace(num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    x = xqa_plan(t, d, SimpleNamespace(tokens_per_block=32, tp_size=1))
    assert _kernels(x)[0][-1] == "none" and len(x["blockers"]) == 1 and "--backend cuda" in x["blockers"][0]
    # forcing JIT for one layer sends every layer there: a layer only the precompiled kernels took (head 128, 48 query
    # heads per KV head: more than JIT's 32) then has none
    wide = SimpleNamespace(num_attention_heads=48, num_key_value_heads=1, head_dim=128)
    xw = xqa_plan(SimpleNamespace(num_attention_heads=24, num_key_value_heads=4, head_dim=256), wide,
                  SimpleNamespace(tokens_per_block=32, tp_size=1))
    assert [c["kernel"] for c in xw["calls"]] == ["jit (forced)", "none"] and len(xw["blockers"]) == 1
    alone = xqa_plan(wide, wide, SimpleNamespace(tokens_per_block=32, tp_size=1))
    assert [c["kernel"] for c in alone["calls"]] == ["precompiled", "precompiled"] and not alone["blockers"]
    assert xqa_plan(wide, wide, SimpleNamespace(tokens_per_block=16, tp_size=1))["blockers"]   # no 16 precompiled
    # 8 tokens per block: the JIT kernel takes none (16-128), and group 4 goes to JIT by the runner's rule
    x8 = xqa_plan(d, d, SimpleNamespace(tokens_per_block=8, tp_size=1))
    assert [c["kernel"] for c in x8["calls"]] == ["none", "none"]


def test_the_plan_shows_the_variable_on_the_trtllm_build_command():
    from dflash2_trt.engine.plan import dry_run_plan
    from dflash2_trt.engine.trtllm.toolchain import Toolchain

    plan = dry_run_plan(QWEN_DRAFTER, QWEN_TARGET, target_key="qwen3.8-27b", backend="trtllm", toolchain=Toolchain())
    assert plan["trtllm_build"]["env"][ENV] == "1" and f"{ENV}=1 " in plan["trtllm_build"]["line"]
    assert any("no precompiled XQA kernel" in w for w in plan["warnings"])
    tiny = dry_run_plan(MUSE_DRAFTER, MUSE_TARGET, target_key="muse-glimmer-30b", backend="trtllm",
                        toolchain=Toolchain(), overrides={"max_seq_len": 2018, "max_input_len": 2001})
    assert ENV not in tiny["trtllm_build"]["env"]


def test_the_runtimes_set_what_the_engine_was_built_with(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert apply_runtime_env({"runtime_env": {ENV: "1"}}) == {ENV: "1"}
    import os

    assert os.environ[ENV] == "1"
    monkeypatch.setenv(ENV, "0")                      # the user's own setting wins, with a warning
    said = []
    assert apply_runtime_env({"runtime_env": {ENV: "1"}}, warn=said.append) == {} and os.environ[ENV] == "0"
    assert len(said) == 1 and f"{ENV}=0 in the environment, but the engine was built with {ENV}=1" in said[0]
    monkeypatch.setenv(ENV, "1")
    assert apply_runtime_env({"runtime_env": {ENV: "1"}}, warn=said.append) == {} and len(said) == 1
    assert apply_runtime_env({}) == {} and apply_runtime_env(None) == {}


def test_every_speculative_decoding_call_of_a_step_is_causal_and_the_draft_block_stays_bidirectional(
        tmp_path_factory, monkeypatch):
    """XQA, the only kernel of a call with several tokens per generation request, takes mask_type causal only (the
    record's mask_type_required): the network passes causal to every such call, the drafter's included; its
    bidirectional block (tiny-muse's drafter: is_causal false) is the packed mask's, whose rows then have bits above the
    diagonal. Recorded on the CPU engine's own steps (the stand-in's gpt_attention, wrapped)."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.testing.engines import EngineCache, run_prompts, shipped_prompts
    from dflash2_trt.trtllm.cpu import attention, functional

    assert facts("xqa_spec_decoding")["mask_type_required"] == "causal"
    pair = trained_pair("muse_glimmer")
    engine_dir = EngineCache(pair, "tiny-muse", tmp_path_factory, verify=False)(16)
    calls, kept, orig = [], [], functional.gpt_attention

    def spy(**kw):
        use = kw.get("spec_decoding_use")
        types = kw["host_request_types"]
        gen = use is not None and int(attention.raw(use).reshape(-1)[0]) == 1 and bool(
            (attention.raw(types).reshape(-1) == 1).any())
        packed = attention.raw(kw["spec_decoding_packed_mask"]) if gen else None
        calls.append((gen, kw["mask_type"], None if packed is None else int(packed[0, 0])))
        if gen and not kept:
            kept.append(dict(kw))
        return orig(**kw)

    monkeypatch.setattr(functional, "gpt_attention", spy)
    run_prompts(engine_dir, shipped_prompts(pair, 2), new=6, max_batch=2)
    spec = [c for c in calls if c[0]]
    assert spec and all(m == attention.AttentionMaskType.causal for _, m, _ in spec), \
        sorted({str(m) for _, m, _ in spec})
    # some speculative-decoding call's first packed row sees all 16 tokens of its block (the drafter's, bidirectional);
    # the target's verify rows see only their prefix (row 0: bit 0)
    assert {p for _, _, p in spec} >= {0xFFFF, 1}
    # the stand-in is held to the same record: that call with a bidirectional mask type stops in one line, as the
    # plugin would (no XQA kernel takes it)
    with pytest.raises(ValueError, match="takes mask_type causal only"):
        orig(**{**kept[0], "mask_type": attention.AttentionMaskType.bidirectional})
