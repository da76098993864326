"""Tiny checkpoints WIDE enough for every --tp-size up to 8, built in the tests.

The project's standard tiny pair (dflash2_trt.testing.tiny) has 4 query / 2 KV heads, which
cannot be split over 8 ranks (and is used below to check that clear error). These variants keep
hidden 64 / vocab 256 but have 8 query heads (2 KV heads, so tp 4 and 8 duplicate KV heads) and,
for Qwen3.5, 8 value / 2 key Gated DeltaNet heads (key heads duplicated at tp 4 and 8). Unlike
the standard tiny target, EVERY tensor is random here — RMSNorm scales, A_log, dt_bias included —
so that a swapped or mis-offset norm changes the logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dflash2_trt.testing.tiny import HIDDEN, VOCAB, tiny_drafter_config


def _text_config(family: str) -> dict:
    common = dict(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        max_position_embeddings=512, tie_word_embeddings=False, hidden_act="silu",
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    if family == "qwen3":
        return dict(common, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
    return dict(
        common,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=8, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, attn_output_gate=True,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.25,
                         "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    )


def build_wide_target(family: str, out_dir: Path, *, seed: int = 0, tie: bool = False) -> Path:
    import transformers

    torch.manual_seed(seed)
    text = _text_config(family)
    text["tie_word_embeddings"] = tie
    if family == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**text))
    else:
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=HIDDEN,
                      patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                      in_channels=3)
        config = transformers.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=tie)
        model = transformers.Qwen3_5ForConditionalGeneration(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" in name:
                continue
            if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
                p.normal_(0.0, 1.0)
            elif name.endswith("A_log"):
                p.uniform_(-1.0, 1.0)
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 0.5)
            elif p.dim() == 1:  # RMSNorm scales: zero-centred for qwen3_5 (1 + w), plain for qwen3 and the DeltaNet norm
                centre = 0.0 if (family == "qwen3_5" and "linear_attn.norm" not in name) else 1.0
                p.copy_(centre + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
    model = model.to(torch.float32)
    model.config.dtype = "float32"
    if hasattr(model.config, "text_config"):
        model.config.text_config.dtype = "float32"
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def wide_drafter_config(family: str) -> dict:
    cfg = tiny_drafter_config(family)
    cfg.pop("tiny_family")
    cfg.update(num_attention_heads=8, num_key_value_heads=2, head_dim=16)
    cfg["dflash_config"] = dict(cfg["dflash_config"], target_layer_ids=[0, 2, 3])
    return cfg


def build_wide_drafter(family: str, out_dir: Path, *, seed: int = 1) -> Path:
    from safetensors.torch import save_file

    from dflash2_trt.checkpoint import expected_drafter_tensors
    from dflash2_trt.config import DFlash2Config

    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_dict = wide_drafter_config(family)
    cfg = DFlash2Config.from_hugging_face(cfg_dict)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, exp in sorted(expected_drafter_tensors(cfg).items()):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.2 * torch.randn(exp.shape, generator=gen)
        elif name.endswith("base_kernel"):
            t = 0.3 * torch.randn(exp.shape, generator=gen)
            t[:, 0] += 1.0
        elif name.endswith("kernel_projection.weight"):
            t = 0.05 * torch.randn(exp.shape, generator=gen)
        elif "codebook" in name:
            t = 0.5 * torch.randn(exp.shape, generator=gen)
        else:
            t = torch.randn(exp.shape, generator=gen) / exp.shape[-1] ** 0.5
        tensors[name] = t.contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    return out_dir


def build_wide_pair(family: str, root: Path, *, tie: bool = False) -> tuple[Path, Path]:
    """(drafter_dir, target_dir)."""
    return build_wide_drafter(family, root / "drafter"), build_wide_target(family, root / "target", tie=tie)
