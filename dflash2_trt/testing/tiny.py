"""Deterministic tiny checkpoints: random targets built with transformers and matching DFlash2
drafters in exactly the published HF format (``config.json`` + ``model.safetensors``).

Three families:

* ``qwen3``   -- dense Qwen3 (``Qwen3ForCausalLM``), 4 layers.
* ``qwen3_5`` -- the Qwen3.5 hybrid in its multimodal wrapper (``Qwen3_5ForConditionalGeneration``,
  a one-block vision tower included so that ``model.language_model.`` prefixes and ignored vision
  tensors are exercised), layers ``[linear, full, linear, full]``.
* ``muse_glimmer`` -- Muse Glimmer in its wrapper (``MuseGlimmerForConditionalGeneration``, a
  one-block vision tower), layers ``[sliding, sliding, sliding, full]`` as transformers' default
  pattern puts them (the full layer is NoPE, ``layer_rope_theta`` 0; window 16), gated attention
  with weight-less QK norm and ``qk_scale_factor``, post norms, the weight-less embedding norm, and
  the logit multiplier + softcap (``output_multiplier`` 0.5, cap 20); 8 query heads (2 KV heads
  of 16), so that every --tp-size up to 8 splits it. Its drafter uses block 16 (as the published
  Muse Glimmer drafter), the same multiplier and cap, and the target's KV layout (2 KV heads x 16).

The drafter's conv and selector weights are deliberately NOT the identity/zero a fresh DFlash2
module starts from (base kernel 1/0, zero projection, zero successor codebook): with those, a
wrong conv or selector implementation would still pass every test.

Everything is float32 so CPU tests can compare exactly. ``tiny_pair`` builds into a cache dir
(``$DFLASH2_TRT_CACHE`` or ``~/.cache/dflash2-trt``) on first use, atomically.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..assets.registry import FAMILIES, TinyPair   # noqa: F401  (the registry lives with the shipped assets)

TINY_VERSION = 1
# Not 2.0, the released checkpoint's 1/sqrt(hidden_size / 256) rule at hidden 64: with it the trained
# tiny target stayed unconfident (mean top-1 probability 0.59 on its own greedy text, 0.81 for the
# dense tiny target) and its drafter reached 1.7 tokens per pass; at 0.5 it trains like the others.
MUSE_OUTPUT_MULTIPLIER = 0.5
MUSE_SOFTCAP = 20.0
VOCAB = 256
HIDDEN = 64


def cache_root() -> Path:
    env = os.environ.get("DFLASH2_TRT_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dflash2-trt"


def default_heads(family: str) -> int:
    """Query heads of the tiny target and drafter: 4; 8 for Muse Glimmer, so that its pair splits
    over every --tp-size up to 8 (2 KV heads, duplicated at tp 4 and 8)."""
    return 8 if family == "muse_glimmer" else 4


def _text_config(family: str, *, heads: int = 4, linear_value_heads: int = 4) -> dict:
    common = dict(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=heads, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        max_position_embeddings=512, tie_word_embeddings=False, hidden_act="silu",
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    if family == "qwen3":
        return dict(common, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
    if family == "qwen3_5":
        return dict(
            common,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            linear_num_key_heads=2, linear_num_value_heads=linear_value_heads, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_conv_kernel_dim=4, attn_output_gate=True,
            rope_parameters={"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.25,
                             "mrope_section": [1, 1, 0], "mrope_interleaved": True},
        )
    if family == "muse_glimmer":
        text = dict(common, hidden_activation="silu",
                    layer_types=["sliding_attention"] * 3 + ["full_attention"], sliding_window=16,
                    layer_rope_theta=[10000.0, 10000.0, 10000.0, 0.0],
                    rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
                    qk_scale_factor=3.87, output_multiplier=MUSE_OUTPUT_MULTIPLIER,
                    final_logit_softcapping=MUSE_SOFTCAP, post_norm_eps=1e-8)
        text.pop("hidden_act")
        return text
    raise ValueError(f"unknown tiny family {family!r}; known: {', '.join(FAMILIES)}")


def build_tiny_target(family: str, out_dir: str | Path, *, seed: int = 0, heads: int | None = None,
                      linear_value_heads: int = 4, tie: bool = False, random_1d: bool = False,
                      text_overrides: dict | None = None) -> Path:
    """Build a random tiny target with transformers and ``save_pretrained`` it (float32).

    ``heads``/``linear_value_heads`` widen the attention (8 lets every --tp-size up to 8 split;
    ``heads`` defaults to 4, 8 for Muse Glimmer).
    ``random_1d`` also randomises RMSNorm scales, ``A_log`` and ``dt_bias``, which transformers
    initialises to constants: with constants, a swapped or mis-offset norm changes nothing and
    a layout test cannot catch it. ``text_overrides`` replaces fields of the text config (e.g. a
    Muse Glimmer layer pattern). The defaults reproduce the standard tiny target exactly.
    """
    import transformers

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    text = _text_config(family, heads=heads or default_heads(family), linear_value_heads=linear_value_heads)
    text["tie_word_embeddings"] = tie
    text.update(text_overrides or {})
    if family == "qwen3":
        config = transformers.Qwen3Config(**text)
        model = transformers.Qwen3ForCausalLM(config)
    elif family == "muse_glimmer":
        from transformers.models.muse_glimmer import configuration_muse_glimmer as mg
        from transformers.models.muse_glimmer import modeling_muse_glimmer as mm

        # out_hidden_size = vision hidden x merge_size**2 (the pixel shuffle); small projector.
        vision = dict(patch_size=4, pos_emb_height=4, pos_emb_width=4, num_attention_heads=2, num_hidden_layers=1,
                      hidden_size=32, intermediate_size=64)
        config = mg.MuseGlimmerConfig(text_config=text, vision_config=vision, out_hidden_size=128,
                                      projector_hidden_size=64, tie_word_embeddings=tie)
        model = mm.MuseGlimmerForConditionalGeneration(config)
    else:
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=HIDDEN,
                      patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                      in_channels=3)
        config = transformers.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=tie)
        model = transformers.Qwen3_5ForConditionalGeneration(config)
    # Larger-than-default init so that logits are peaked enough for argmax ties to be impossible
    # in practice (ties would make "identical to greedy" depend on float rounding).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" in name or "vision" in name:
                continue
            if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
                p.normal_(0.0, 1.0)
            elif p.dim() == 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
            elif not random_1d:
                # transformers' generic init fills every RMSNorm weight with ones, which for Muse
                # Glimmer's zero-centred layer norms (scale 1 + w) is a scale of 2: start at 1 instead
                if family == "muse_glimmer" and p.dim() == 1 and not name.endswith("language_model.norm.weight"):
                    p.zero_()
                continue
            elif name.endswith("A_log"):
                p.uniform_(-1.0, 1.0)
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 0.5)
            elif p.dim() == 1:
                # RMSNorm scales: zero-centred (1 + w) in qwen3_5 except the DeltaNet norm; in
                # muse_glimmer the layer norms are zero-centred, the final norm is a plain scale
                if family == "qwen3_5":
                    centre = 0.0 if "linear_attn.norm" not in name else 1.0
                elif family == "muse_glimmer":
                    centre = 1.0 if name.endswith("language_model.norm.weight") else 0.0
                else:
                    centre = 1.0
                p.copy_(centre + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
    model = model.to(torch.float32)
    model.config.dtype = "float32"
    if hasattr(model.config, "text_config"):
        model.config.text_config.dtype = "float32"
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def tiny_drafter_config(family: str, *, block_size: int | None = None, heads: int | None = None,
                        target_layer_ids: tuple[int, ...] = (0, 2)) -> dict:
    """The tiny drafter's config (block 8; block 16 and the logit multiplier + softcap for Muse
    Glimmer, as its published drafter has). Its KV layout (2 heads x 16) is the target's."""
    if block_size is None:
        block_size = 16 if family == "muse_glimmer" else 8
    heads = heads or default_heads(family)
    cfg = {
        "architectures": ["DFlash2DraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "is_causal": False,
        "dflash_config": {
            "block_size": block_size,
            "conv_group_size": 16,
            "conv_kernel_size": 2,
            "mask_token_id": VOCAB - 1,
            "selector_rank": 16,
            "selector_top_k": 8,
            "target_layer_ids": list(target_layer_ids),
        },
        "dtype": "float32",
        "eos_token_id": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 512,
        "max_window_layers": 2,
        "num_attention_heads": heads,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "num_target_layers": 4,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "sliding_window": 16,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": True,
        "vocab_size": VOCAB,
        "tiny_family": family,
    }
    if family == "muse_glimmer":
        cfg["dflash_config"].update(output_multiplier=MUSE_OUTPUT_MULTIPLIER, final_logit_softcapping=MUSE_SOFTCAP)
    return cfg


def build_tiny_drafter(family: str, out_dir: str | Path, *, seed: int = 1, block_size: int | None = None,
                       heads: int | None = None, target_layer_ids: tuple[int, ...] = (0, 2),
                       norm_std: float = 0.1) -> Path:
    """Random drafter in the published format, with non-identity conv and selector weights."""
    from safetensors.torch import save_file

    from ..checkpoint.inventory import expected_drafter_tensors
    from ..config import DFlash2Config

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_dict = tiny_drafter_config(family, block_size=block_size, heads=heads, target_layer_ids=target_layer_ids)
    cfg_dict.pop("tiny_family")
    cfg = DFlash2Config.from_hugging_face(cfg_dict)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, exp in sorted(expected_drafter_tensors(cfg).items()):
        shape = exp.shape
        if name.endswith("norm.weight"):
            t = 1.0 + norm_std * torch.randn(shape, generator=gen)
        elif name.endswith("base_kernel"):
            t = 0.3 * torch.randn(shape, generator=gen)
            t[:, 0] += 1.0  # near (not at) the identity start point
        elif name.endswith("kernel_projection.weight"):
            t = 0.05 * torch.randn(shape, generator=gen)
        elif "codebook" in name:
            t = 0.5 * torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) / shape[-1] ** 0.5
        tensors[name] = t.to(torch.float32).contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    return out_dir


def build_tiny_pair(family: str, out_dir: str | Path) -> TinyPair:
    out_dir = Path(out_dir)
    target = build_tiny_target(family, out_dir / "target")
    drafter = build_tiny_drafter(family, out_dir / "drafter")
    return TinyPair(family, target, drafter)


def tiny_pair(family: str = "qwen3", *, cache_dir: str | Path | None = None) -> TinyPair:
    """The tiny pair of ``family``, built on first use into the cache (atomically)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown tiny family {family!r}; known: {', '.join(FAMILIES)}")
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "tiny"
    final = root / f"{family}-v{TINY_VERSION}"
    if not (final / "drafter" / "model.safetensors").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{family}-", dir=root))
        try:
            build_tiny_pair(family, tmp)
            try:
                os.replace(tmp, final)
            except OSError:
                if not (final / "drafter" / "model.safetensors").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return TinyPair(family, final / "target", final / "drafter")
