"""The engine config as TensorRT-LLM's C++ runtime reads it (``gptJsonConfig.cpp``, recorded in
``dflash2_trt/engine/trtllm/facts/gptJsonConfig.yaml``, applied by ``dflash2_trt/engine/trtllm/runtime_rules.py``):
the layer count in EAGLE mode, the cyclic ``layer_types`` rule, and the RNN fields a recurrent variant must carry.

The expected numbers are computed here from the published Qwen3.8-27B configs (plain JSON), not from the code
under test."""

from __future__ import annotations

import json

import pytest

from dflash2_trt.engine import plan as planmod
from dflash2_trt.engine.pretrained import engine_pretrained_config
from dflash2_trt.engine.trtllm.command import engine_config_fixes, trtllm_engine_config
from dflash2_trt.engine.trtllm.runtime_rules import (PATCHED_ARCHITECTURES, build_layer_types, facts,
                                                     parse_engine_config, state_pool_bytes_per_slot)
from dflash2_trt.errors import ConfigError
from dflash2_trt.testing.fixtures import QWEN_DRAFTER, QWEN_TARGET


def _hf():
    t = json.loads((QWEN_TARGET / "config.json").read_text())["text_config"]
    d = json.loads((QWEN_DRAFTER / "config.json").read_text())
    return t, d


def _engine(tp=1):
    """The engine config as `dflash2-trt build` leaves it (trtllm-build's, with the build's fixes)."""
    p = planmod.prepare(QWEN_DRAFTER, QWEN_TARGET, target_key="qwen3.8-27b", overrides={"tp_size": tp})
    pre = engine_pretrained_config(p.checkpoint_config, p.cfg, p.d)
    eng = trtllm_engine_config(pre, p.cfg)
    engine_config_fixes(eng)
    return p, pre, eng


def test_trtllm_builds_config_would_stop_the_hybrid_runtime_and_the_build_fixes_it():
    """trtllm-build overrides paged_state to False for every architecture but Mamba / RecurrentGemma
    (BuildConfig.update_kv_cache_type), and the runtime's RnnStateManager refuses a model without paged state
    (facts state_manager_requires): as trtllm-build writes it, the hybrid engine would not start. The build sets
    it true (and says so); a dense engine is left as trtllm-build wrote it."""
    p, pre, _ = _engine(1)
    raw = trtllm_engine_config(pre, p.cfg)
    assert raw["build_config"]["plugin_config"]["paged_state"] is False
    with pytest.raises(ConfigError, match=r"build_config.plugin_config.paged_state: False: the runtime refuses the "
                                          r"engine at start-up \(RnnStateManager should be used with Paged State"):
        parse_engine_config(raw, patched_architectures=PATCHED_ARCHITECTURES)
    fixes = engine_config_fixes(raw)
    assert [(f["field"], f["from"], f["to"]) for f in fixes] == [("build_config.plugin_config.paged_state", False, True)]
    assert parse_engine_config(raw, patched_architectures=PATCHED_ARCHITECTURES)["variant"] == "kRecurrentGemma"
    assert engine_config_fixes(raw) == []                         # idempotent
    raw["build_config"]["plugin_config"]["mamba_conv1d_plugin"] = None
    with pytest.raises(ConfigError, match="MambaConv1dPlugin"):
        parse_engine_config(raw, patched_architectures=PATCHED_ARCHITECTURES)
    from dflash2_trt.assets import trained_pair

    tiny = trained_pair("qwen3")
    dense = planmod.prepare(tiny.drafter_dir, tiny.target_dir, target_key="tiny")
    dpre = engine_pretrained_config(dense.checkpoint_config, dense.cfg, dense.d)
    draw = trtllm_engine_config(dpre, dense.cfg)
    assert engine_config_fixes(draw) == [] and draw["build_config"]["plugin_config"]["paged_state"] is False
    parse_engine_config(draw, patched_architectures=PATCHED_ARCHITECTURES)   # not RNN-based: nothing to check


def test_facts_name_their_source():
    src = facts()["source"]
    assert src["repo"] == "NVIDIA/TensorRT-LLM" and src["path"] == "cpp/tensorrt_llm/runtime/gptJsonConfig.cpp"
    assert facts()["rnn"]["required_when_rnn"] == ["state_size", "conv_kernel", "rnn_hidden_size", "rnn_conv_dim_size"]


def test_layer_types_repeat_cyclically_as_the_runtime_reads_them():
    """buildLayerTypes: a group repeated over the layer count; names not the runtime's count as attention. A 64-entry
    hybrid list over 64 + 5 layers gives the drafter layers target layers 0-4's types (the old engine config)."""
    t, d = _hf()
    old = ["recurrent" if x == "linear_attention" else "attention" for x in t["layer_types"]]
    got = build_layer_types(64 + d["num_hidden_layers"], old)
    assert (got.count("attention"), got.count("recurrent")) == (17, 52)
    assert build_layer_types(5, []) == ["attention"] * 5
    assert build_layer_types(4, ["full_attention", "linear_attention"]) == ["attention"] * 4
    assert build_layer_types(3, ["recurrent", "no_op"]) == ["recurrent", "no_op", "recurrent"]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_hybrid_engine_config_parses_to_21_attention_48_recurrent_with_per_rank_rnn_fields(tp):
    t, d = _hf()
    p, pre, eng = _engine(tp)
    n_att = t["layer_types"].count("full_attention") + d["num_hidden_layers"]
    n_rec = t["layer_types"].count("linear_attention")
    assert (n_att, n_rec) == (21, 48)
    assert len(pre["layer_types"]) == t["num_hidden_layers"] + d["num_hidden_layers"] == 69
    r = parse_engine_config(eng, patched_architectures=PATCHED_ARCHITECTURES)
    assert (r["layers"], r["attention_layers"], r["recurrent_layers"]) == (69, 21, 48)
    # KV-pool layers are numbered in order: 0-15 target attention layers, 16-20 the drafter's
    att = [i for i, x in enumerate(r["layer_types"]) if x == "attention"]
    assert att[-5:] == list(range(64, 69))
    assert r["variant"] == "kRecurrentGemma"
    nk, nv, dk, dv = (t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"],
                      t["linear_value_head_dim"])
    # state_size: the key dim + the 11 rows of the deferred commit's records at block 8 (trtllm/gdn_slot.py)
    assert r["rnn"] == {"state_size": dk + 11, "conv_kernel": t["linear_conv_kernel_dim"],
                        "rnn_hidden_size": nv // tp * dv, "rnn_conv_dim_size": 2 * (nk // tp) * dk + (nv // tp) * dv,
                        "rnn_head_size": dv}
    # the runtime's slot = what the dry run sizes (recurrent state per request)
    slot = state_pool_bytes_per_slot(r["rnn"], 2)
    size = planmod.sizing(p, planmod.H200_GIB)
    assert 48 * (slot["state"] + slot["conv"]) == size["recurrent_state_bytes_per_request"]


def test_stock_runtime_sees_no_recurrent_variant_and_a_missing_rnn_field_is_named():
    _, pre, eng = _engine()
    stock = parse_engine_config(eng)
    assert stock["variant"] == "kGpt" and stock["rnn"] is None
    bad = json.loads(json.dumps(eng))
    del bad["pretrained_config"]["rnn_conv_dim_size"]
    with pytest.raises(ConfigError, match="rnn_conv_dim_size"):
        parse_engine_config(bad, patched_architectures=PATCHED_ARCHITECTURES)
    bad = json.loads(json.dumps(eng))
    del bad["pretrained_config"]["eagle_net_config"]
    with pytest.raises(ConfigError, match="eagle_net_config"):
        parse_engine_config(bad)
    bad = json.loads(json.dumps(eng))
    del bad["build_config"]["plugin_config"]["use_paged_context_fmha"]
    with pytest.raises(ConfigError, match="use_paged_context_fmha"):
        parse_engine_config(bad)


def test_patch_script_default_architecture_is_the_one_the_engine_writes():
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "patch_trtllm", Path(__file__).resolve().parents[2] / "scripts" / "patch_trtllm_recurrent_spec.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)
    spec.loader.exec_module(sys.modules[spec.name])
    mod = sys.modules[spec.name]
    _, pre, _ = _engine()
    assert mod.DEFAULT_ARCHITECTURES == PATCHED_ARCHITECTURES == (pre["architecture"],)


def test_dry_run_carries_the_engine_config_and_prints_the_runtime_counts():
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    args = ["build", "--target", "qwen3.8-27b", "--dry-run", "--drafter", str(QWEN_DRAFTER), "--target-dir",
            str(QWEN_TARGET)]
    r = CliRunner().invoke(main, args + ["--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    _, pre, _ = _engine()
    assert plan["engine_config"] == pre
    assert (plan["runtime"]["attention_layers"], plan["runtime"]["recurrent_layers"]) == (21, 48)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "69 layers (64 target + 5 EAGLE-net): 21 attention (KV pool) / 48 recurrent (state)" in r.output


def test_the_dry_run_names_the_config_fix_before_anyone_rents_a_gpu():
    from click.testing import CliRunner

    from dflash2_trt.cli import main
    from dflash2_trt.engine.trtllm.runtime_rules import runtime_reading

    p, pre, _ = _engine(1)
    rt = runtime_reading(pre, p.cfg)
    assert "error" not in rt and [f["field"] for f in rt["config_fixes"]] == ["build_config.plugin_config.paged_state"]
    for target, fixed in (("tiny-hybrid", True), ("tiny", False)):
        r = CliRunner().invoke(main, ["build", "--target", target, "--backend", "trtllm", "--dry-run"])
        assert r.exit_code == 0, r.output
        assert ("the build will set build_config.plugin_config.paged_state False -> True" in r.output) is fixed, target
