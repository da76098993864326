"""Typed, validated config of a target model, per family.

=============  ============================================  ===============================================
family         HF architectures / model_type                 what is read (motivating checkpoint)
=============  ============================================  ===============================================
qwen3          Qwen3ForCausalLM / qwen3                      dense Qwen3; the simplest target, first to be
                                                             supported end to end
qwen3_5        Qwen3_5ForConditionalGeneration / qwen3_5     hybrid: Gated DeltaNet ``linear_attention`` +
               (text in ``text_config``), Qwen3_5ForCausalLM ``full_attention`` with output gate, partial
               / qwen3_5_text                                RoPE (Qwen/Qwen3.8-27B: 48 + 16 layers)
muse_glimmer   MuseGlimmerForConditionalGeneration /         sliding + full attention, per-layer RoPE theta
               muse_glimmer (text in ``text_config``)        (0 = NoPE), qk_scale_factor, post-norm eps,
                                                             logit multiplier and softcap
                                                             (meta-models/Muse-Glimmer-30B)
=============  ============================================  ===============================================

Muse Glimmer fields that a saved config may omit take transformers' ``MuseGlimmerTextConfig``
defaults (:data:`MUSE_GLIMMER_DEFAULTS`, pinned by tests/test_config.py against transformers), not
this project's generic ones: ``rms_norm_eps`` is 1e-5 there (1e-6 elsewhere), and a missing
``layer_rope_theta`` means NoPE on every 4th layer counted back from the last. A different default
would not crash anything; the converted checkpoint would just compute another model.

``weight_prefix`` is where the language model's tensors live in the HF checkpoint
(``model.`` for a causal LM, ``model.language_model.`` inside a multimodal wrapper);
``lm_head.weight`` is always at the top level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ..errors import ConfigError
from ._fields import (Fields, check_hf_fields, load_config_dict, parse_attention_dims, parse_layer_types, parse_rope,
                      reject_quantization)
from ..textfiles import json_loads

FAMILIES = ("qwen3", "qwen3_5", "muse_glimmer")

# architecture name -> (family, text config key or None, weight prefix of the language model)
_ARCHITECTURES = {
    "Qwen3ForCausalLM": ("qwen3", None, "model."),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", "text_config", "model.language_model."),
    "Qwen3_5ForCausalLM": ("qwen3_5", None, "model."),
    "MuseGlimmerForConditionalGeneration": ("muse_glimmer", "text_config", "model.language_model."),
}
_MODEL_TYPES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "muse_glimmer": "MuseGlimmerForConditionalGeneration",
}
# transformers' MuseGlimmerTextConfig defaults for the numerics fields a config may leave out.
MUSE_GLIMMER_DEFAULTS = {"rms_norm_eps": 1e-5, "qk_scale_factor": 3.87, "output_multiplier": 0.19611613513818404,
                         "final_logit_softcapping": 20.0, "post_norm_eps": 1e-8}
_LAYER_TYPES = {
    "qwen3": ("full_attention", "sliding_attention"),
    "qwen3_5": ("linear_attention", "full_attention"),
    "muse_glimmer": ("sliding_attention", "full_attention"),
}


def supported_architectures() -> tuple[str, ...]:
    return tuple(_ARCHITECTURES)


@dataclass(frozen=True)
class TargetConfig:
    family: str
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_type: str
    partial_rotary_factor: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    layer_types: tuple[str, ...]
    sliding_window: int | None
    dtype: str
    text_config_key: str | None
    weight_prefix: str
    eos_token_ids: tuple[int, ...] = ()
    # qwen3_5 (Gated DeltaNet + gated full attention)
    attn_output_gate: bool = False
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None
    # muse_glimmer
    layer_rope_theta: tuple[float, ...] | None = None
    qk_scale_factor: float | None = None
    output_multiplier: float | None = None
    final_logit_softcapping: float | None = None
    post_norm_eps: float | None = None
    source: str = "<dict>"
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def numerics(self) -> dict[str, Any]:
        keys = [
            "family", "architecture", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta",
            "rope_type", "partial_rotary_factor", "max_position_embeddings", "tie_word_embeddings",
            "sliding_window", "dtype", "weight_prefix",
        ]
        if self.family == "qwen3_5":
            keys += ["attn_output_gate", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                     "linear_value_head_dim", "linear_conv_kernel_dim"]
        if self.family == "muse_glimmer":
            keys += ["qk_scale_factor", "output_multiplier", "final_logit_softcapping", "post_norm_eps"]
        out = {k: getattr(self, k) for k in keys}
        counts: dict[str, int] = {}
        for t in self.layer_types:
            counts[t] = counts.get(t, 0) + 1
        out["layer_types"] = counts
        return out

    @classmethod
    def from_hugging_face(cls, path_or_dict: str | Path | Mapping[str, Any]) -> "TargetConfig":
        """The target's config.json (a model directory, the file, or a mapping). Its end-of-sequence ids come from
        generation_config.json beside it where that names them, as in Hugging Face's generate."""
        data, source = load_config_dict(path_or_dict)
        top = Fields(data, source)
        archs = data.get("architectures")
        arch = None
        if isinstance(archs, list) and archs:
            arch = archs[0]
        elif isinstance(data.get("model_type"), str):
            arch = _MODEL_TYPES.get(data["model_type"])
        if arch is None:
            raise top.error("architectures", "cannot tell the architecture: neither 'architectures' nor a known 'model_type'")
        if arch == "DFlash2DraftModel":
            raise top.error("architectures", "this is a DFlash2 drafter config, not a target")
        if arch not in _ARCHITECTURES:
            raise top.error(
                "architectures",
                f"unsupported target architecture {arch!r}; supported: {', '.join(_ARCHITECTURES)}",
            )
        family, text_key, prefix = _ARCHITECTURES[arch]
        if "model_type" in data:
            # transformers builds the model from model_type (AutoConfig's class, which also decides whether the
            # fields are read at the top level or from text_config), not from architectures: a checkpoint whose two
            # disagree would be verified against another model than this one
            model_type = data["model_type"]
            own = next(t for t, a in _MODEL_TYPES.items() if a == arch)
            if model_type != own:
                raise top.error("model_type", f"{model_type!r} does not match architectures[0] {arch!r} (model_type "
                                              f"{own!r}): transformers builds the model from model_type, not "
                                              f"architectures, so it would not load this checkpoint as {arch}")
        if text_key is not None:
            text = top.raw(text_key)
            if not isinstance(text, dict):
                raise top.error(text_key, f"expected an object holding the language model config, got {text!r}")
            f = Fields(text, source, prefix=f"{text_key}.")
        else:
            f = top

        reject_quantization(top)
        if f is not top:
            reject_quantization(f)
        hidden, layers, heads, kv_heads, head_dim, vocab = parse_attention_dims(f)
        check_hf_fields(f, vocab)
        if f is not top:
            check_hf_fields(top, vocab)
        theta, rope_type, partial = parse_rope(f)

        allowed = _LAYER_TYPES[family]
        layer_types = f.raw("layer_types", None)
        if layer_types is None:
            if family == "qwen3_5":
                interval = f.int("full_attention_interval", 4, min=1)
                layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
            elif family == "qwen3":
                use_sw = f.bool("use_sliding_window", False)
                first = f.int("max_window_layers", layers, min=0)
                layer_types = ["sliding_attention" if use_sw and i >= first else "full_attention" for i in range(layers)]
            else:
                raise f.error("layer_types", "required for this family")
        layer_types, sliding_window = parse_layer_types(f, layer_types, layers, allowed)

        tie = f.raw("tie_word_embeddings", None)
        if tie is None:
            tie = top.raw("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            raise f.error("tie_word_embeddings", f"expected true or false, got {tie!r}")
        act_key = "hidden_activation" if family == "muse_glimmer" and f.has("hidden_activation") else "hidden_act"
        f.str(act_key, "silu", choices=("silu",))
        if f.bool("attention_bias", False):
            raise f.error("attention_bias", "attention biases are not supported")
        eos = f.raw("eos_token_id", None)
        if eos is None:
            eos = top.raw("eos_token_id", None)
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
        eos_ids = _generation_eos(source, vocab) or eos_ids
        dtype = f.dtype() if (f.has("dtype") or f.has("torch_dtype")) else top.dtype()

        kw: dict[str, Any] = {}
        if family == "qwen3_5":
            kw["attn_output_gate"] = f.bool("attn_output_gate", True)
            kw["linear_num_key_heads"] = f.int("linear_num_key_heads", 16, min=1)
            kw["linear_num_value_heads"] = f.int("linear_num_value_heads", 32, min=1)
            kw["linear_key_head_dim"] = f.int("linear_key_head_dim", 128, min=1)
            kw["linear_value_head_dim"] = f.int("linear_value_head_dim", 128, min=1)
            kw["linear_conv_kernel_dim"] = f.int("linear_conv_kernel_dim", 4, min=1)
            if kw["linear_num_value_heads"] % kw["linear_num_key_heads"]:
                raise f.error("linear_num_value_heads",
                              f"{kw['linear_num_value_heads']} is not a multiple of linear_num_key_heads={kw['linear_num_key_heads']}")
            gate_type = f.raw("output_gate_type", "swish")
            if kw["attn_output_gate"] and gate_type not in ("swish", "sigmoid"):
                raise f.error("output_gate_type", f"unsupported gate {gate_type!r}")
        if family == "muse_glimmer":
            lrt = f.raw("layer_rope_theta", None)
            if lrt is None:   # transformers' default: NoPE on every 4th layer counted back from the last
                lrt = [0.0 if (layers - 1 - i) % 4 == 0 else theta for i in range(layers)]
            if not isinstance(lrt, list) or len(lrt) != layers or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                    for x in lrt):
                raise f.error("layer_rope_theta", f"expected {layers} non-negative numbers (0 = NoPE), got {lrt!r}")
            kw["layer_rope_theta"] = tuple(float(x) for x in lrt)
            for key in ("qk_scale_factor", "output_multiplier", "final_logit_softcapping", "post_norm_eps"):
                kw[key] = f.float(key, MUSE_GLIMMER_DEFAULTS[key], positive=True)

        return cls(
            family=family,
            architecture=arch,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=f.int("intermediate_size", min=1),
            vocab_size=vocab,
            rms_norm_eps=f.float("rms_norm_eps", MUSE_GLIMMER_DEFAULTS["rms_norm_eps"] if family == "muse_glimmer"
                                 else 1e-6, positive=True),
            rope_theta=theta,
            rope_type=rope_type,
            partial_rotary_factor=partial,
            max_position_embeddings=f.int("max_position_embeddings", 32768, min=1),
            tie_word_embeddings=tie,
            layer_types=layer_types,
            sliding_window=sliding_window,
            dtype=dtype,
            text_config_key=text_key,
            weight_prefix=prefix,
            eos_token_ids=eos_ids,
            source=source,
            raw=MappingProxyType(data),
            **kw,
        )


def _generation_eos(config_source: str, vocab: int) -> tuple[int, ...] | None:
    """``eos_token_id`` of the generation_config.json beside a config.json, or None (no such file, or it names none).

    Hugging Face's ``from_pretrained`` loads that file as the model's generation config when it exists, and
    ``generate`` stops at its ids, not at config.json's (transformers generation/utils.py, ``GenerationConfig
    .from_pretrained`` before the config.json fallback); vLLM and TensorRT-LLM's LLM API read it too. Published
    checkpoints list more ids there (Qwen3's: ``<|im_end|>`` and ``<|endoftext|>``). Where the file names none (no
    field, null or ``[]``), HF's generate would stop at no id at all; this project keeps config.json's instead (an
    engine that never stops at its end-of-sequence token is not what such a checkpoint means)."""
    import json

    if config_source == "<dict>":
        return None
    path = Path(config_source).parent / "generation_config.json"
    if not path.is_file():
        return None
    try:
        data = json_loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", source=path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"invalid JSON: {exc}", source=path) from None
    if not isinstance(data, dict):
        raise ConfigError("top level must be an object", source=path)
    eos = data.get("eos_token_id")
    if eos is None or eos == []:
        return None
    ids = eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise Fields(data, str(path)).error("eos_token_id", f"expected a token id or a list of them, got {eos!r}")
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise Fields(data, str(path)).error("eos_token_id", f"token id(s) {bad} outside the vocabulary [0, {vocab})")
    return tuple(ids)
