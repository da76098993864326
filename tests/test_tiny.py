"""Tiny checkpoints: deterministic, load in transformers, pass the strict inventories, and carry
non-identity conv/selector weights (so every DFlash2 module changes the numbers)."""

from __future__ import annotations

import torch
import transformers

from dflash2_trt.checkpoint import SafetensorsCheckpoint, check_target_checkpoint
from dflash2_trt.config import DFlash2Config, TargetConfig, check_pair
from dflash2_trt.testing.tiny import build_tiny_drafter, build_tiny_target


def _load_target(d):
    cfg = TargetConfig.from_hugging_face(d)
    if cfg.architecture == "Qwen3_5ForConditionalGeneration":
        return transformers.Qwen3_5ForConditionalGeneration.from_pretrained(d)
    return transformers.AutoModelForCausalLM.from_pretrained(d)


def test_tiny_target_loads_and_runs(tiny):
    cfg = TargetConfig.from_hugging_face(tiny.target_dir)
    assert cfg.family == tiny.family
    if tiny.family == "qwen3_5":
        assert set(cfg.layer_types) == {"linear_attention", "full_attention"}
    rep = check_target_checkpoint(tiny.target_dir, cfg)
    assert rep.ok, rep.problems()
    model = _load_target(tiny.target_dir).eval()
    with torch.no_grad():
        out = model(torch.tensor([[3, 4, 5, 6, 7]]), output_hidden_states=True)
    assert out.logits.shape == (1, 5, 256) and len(out.hidden_states) == 5
    assert torch.isfinite(out.logits).all()


def test_tiny_pair_fits(tiny):
    d = DFlash2Config.from_hugging_face(tiny.drafter_dir)
    t = TargetConfig.from_hugging_face(tiny.target_dir)
    fc = SafetensorsCheckpoint(tiny.drafter_dir).info("fc.weight").shape
    check_pair(d, t, fc_weight_shape=fc)


def test_tiny_drafter_weights_are_not_identity(tiny):
    ck = SafetensorsCheckpoint(tiny.drafter_dir)
    cfg = DFlash2Config.from_hugging_face(tiny.drafter_dir)
    for i in range(cfg.num_hidden_layers):
        for conv in ("attention_conv", "mlp_conv"):
            base = ck.get(f"layers.{i}.{conv}.base_kernel")
            ident = torch.zeros_like(base)
            ident[:, 0] = 1
            assert (base - ident).abs().max() > 0.1
            assert base[:, 1].abs().max() > 0.1  # the reach-back tap is live
            assert ck.get(f"layers.{i}.{conv}.kernel_projection.weight").abs().max() > 0.01
    assert ck.get("candidate_selector.successor_codebook").abs().max() > 0.1
    assert ck.get("candidate_selector.predecessor_codebook").abs().max() > 0.1


def test_tiny_builds_are_deterministic(tmp_path, tiny):
    d = build_tiny_drafter(tiny.family, tmp_path / "d")
    assert (d / "model.safetensors").read_bytes() == (tiny.drafter_dir / "model.safetensors").read_bytes()
    t = build_tiny_target(tiny.family, tmp_path / "t")
    a = SafetensorsCheckpoint(t)
    b = SafetensorsCheckpoint(tiny.target_dir)
    assert sorted(a.keys()) == sorted(b.keys())
    for k in a.keys():
        assert torch.equal(a.get(k), b.get(k)), k
