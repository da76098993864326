"""``config.json`` of the combined (target + DFlash2 drafter) TensorRT-LLM checkpoint. Versioned.

The checkpoint directory written by ``dflash2-trt convert`` holds ``config.json``,
``rank{N}.safetensors`` for N in [0, tp_size) and ``manifest.json``. ``config.json`` carries the
target's TensorRT-LLM fields at the top level (as a TensorRT-LLM Qwen checkpoint does), the
speculative field ``max_draft_len``, the drafter's hyper-parameters under ``dflash2`` and this
project's bookkeeping under ``dflash2_trt``. Tensor names per family: :mod:`.qwen3`,
:mod:`.qwen3_5`, :mod:`.muse_glimmer`, :mod:`.dflash2`.

Schema version 1 — top level (target), every family:

=============================  ====================================================================================
field                          meaning
=============================  ====================================================================================
architecture                   ``DFlash2Qwen3ForCausalLM``, ``DFlash2Qwen3_5ForCausalLM`` or
                               ``DFlash2MuseGlimmerForCausalLM`` — the project's model class (loaded by
                               ``trtllm-build --model_cls_file``)
qwen_type                      the target family: ``qwen3``, ``qwen3_5`` or ``muse_glimmer`` (the name is
                               TensorRT-LLM's Qwen field; it selects the network's target class)
hf_architecture                the target's HF architecture (e.g. ``Qwen3_5ForConditionalGeneration``)
dtype                          dtype of every tensor except those listed in ``dflash2_trt.keep_float32``
vocab_size                     target vocabulary (lm_head rows before the vocab split)
hidden_size                    target hidden size
num_hidden_layers              target decoder layers
num_attention_heads            query heads of the (full-)attention layers
num_key_value_heads            KV heads (before any duplication for TP)
head_size                      per-head dim of the attention layers
intermediate_size              MLP width (before the TP split)
norm_epsilon                   every RMSNorm of the target
layernorm_weight_offset        0.0 (Qwen3) or 1.0 (Qwen3.5: RMSNorm scale is ``1 + weight``; applies to
                               input/post layernorms, q/k layernorms and ln_f, NOT to the Gated DeltaNet norm;
                               Muse Glimmer: 1.0 on the four layer norms, ln_f see ``ln_f_weight_offset``)
hidden_act                     ``silu`` (SwiGLU: ``proj(silu(fc(x)) * gate(x))``)
position_embedding_type        ``rope_gpt_neox`` (rotate-half RoPE)
rotary_base                    RoPE theta (Muse Glimmer: of the layers that rotate, ``layer_rotary_base``)
rotary_scaling                 null (only unscaled RoPE is supported)
rotary_pct                     fraction of head_size that is rotated (0.25 for Qwen3.5), the first dims
rotary_dim                     ``int(head_size * rotary_pct)``
max_position_embeddings        from the target config
qk_layernorm                   true: per-head RMSNorm of q and k before RoPE (weights ``q_layernorm`` /
                               ``k_layernorm`` unless ``qk_layernorm_weight`` is false)
tie_word_embeddings            whether the source tied lm_head to the embedding (lm_head.weight is written anyway)
use_parallel_embedding         true: ``transformer.vocab_embedding`` is split over ranks on the vocab
embedding_sharding_dim         0 (each rank holds ``vocab_size / tp`` rows; lookups are masked and all-reduced)
layer_types                    per layer: ``full_attention``, ``sliding_attention`` (Qwen3 with sliding window)
                               or ``linear_attention`` (Qwen3.5 Gated DeltaNet)
sliding_window                 keys kept by ``sliding_attention`` layers; null when there are none
attn_output_gate               Qwen3.5, Muse Glimmer: attention output ``*= sigmoid(output_gate(x))`` before
                               ``dense`` (x: the layer's normed input)
linear_attention               Qwen3.5 Gated DeltaNet: ``num_key_heads``, ``num_value_heads``, ``key_head_dim``,
                               ``value_head_dim``, ``conv_kernel_size``; null for Qwen3
mapping                        ``world_size``, ``tp_size``, ``pp_size`` (1)
quantization                   ``quant_algo``/``kv_cache_quant_algo``: null (no quantization)
max_draft_len                  drafter ``block_size - 1``
=============================  ====================================================================================

Top level, ``qwen_type: muse_glimmer`` only (required there, unknown fields elsewhere;
:mod:`.muse_glimmer` says where each comes from in transformers):

=============================  ====================================================================================
field                          meaning
=============================  ====================================================================================
q_scaling                      TensorRT-LLM's ``Attention(q_scaling=)``: softmax scale ``1 / (q_scaling *
                               sqrt(head_size))``; ``1 / qk_scale_factor`` (transformers multiplies the normed q
                               by ``qk_scale_factor`` AND scales by ``1/sqrt(head_dim)``)
qk_layernorm_weight            false: the q/k RMSNorm has no weights (no ``q_layernorm``/``k_layernorm`` tensors)
layer_rotary_base              per layer: 0.0 = NoPE (no rotary at all), else ``rotary_base``
inter_layernorms               true (TensorRT-LLM's Gemma-2 layer): ``x += post_layernorm(attention(
                               input_layernorm(x)))``, then ``x += post_feedforward_layernorm(mlp(
                               pre_feedforward_layernorm(x)))``
post_norm_epsilon              eps of ``post_layernorm`` and ``post_feedforward_layernorm`` (the others use
                               ``norm_epsilon``)
ln_f_weight_offset             0.0: ``ln_f`` is a plain RMSNorm scale (the layer norms are ``1 + weight``)
embedding_norm                 true: the target's embedding lookup is followed by a weight-less RMSNorm
                               (eps ``norm_epsilon``); the drafter's block embedding is the raw lookup
output_multiplier              target logits: ``final_logit_softcapping * tanh(lm_head(x) * output_multiplier /
final_logit_softcapping        final_logit_softcapping)``
=============================  ====================================================================================

These keys came with the muse_glimmer family and exist only in its checkpoints, so the version
stayed 1: every checkpoint an earlier converter wrote still reads, and an earlier reader refuses a
muse_glimmer checkpoint by name (unknown fields, unsupported ``qwen_type``).

``dflash2`` (drafter; its tensors are under ``tensor_prefix``): every field of
:meth:`DFlash2Config.numerics` (block_size, mask_token_id, target_layer_ids, num_target_layers,
conv_kernel_size, conv_group_size, selector_rank, selector_top_k, output_multiplier,
final_logit_softcapping, input_embedding_scale, is_causal, layer_types, sliding_window,
rope_theta, rope_type, rms_norm_eps, hidden_size, num_hidden_layers, num_attention_heads,
num_key_value_heads, head_dim, intermediate_size, vocab_size, dtype) plus ``tensor_prefix``
(``dflash2.``), ``target_hidden_size``, ``fc_gather_output`` (true: ``fc`` is split on dim 0
and its output gathered before ``hidden_norm``) and ``embedding``/``lm_head`` (the target tensor
names the drafter reads).

``dflash2_trt``: ``schema_version`` (this module's :data:`SCHEMA_VERSION`), ``format``,
``converter_version``, ``keep_float32`` (tensor leaf names kept float32 when stored float32).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..config import DFlash2Config, TargetConfig
from ..errors import ConfigError
from ..textfiles import json_loads

SCHEMA_VERSION = 1
FORMAT = "dflash2-trt combined TensorRT-LLM checkpoint"
ARCHITECTURES = {"qwen3": "DFlash2Qwen3ForCausalLM", "qwen3_5": "DFlash2Qwen3_5ForCausalLM",
                 "muse_glimmer": "DFlash2MuseGlimmerForCausalLM"}
KEEP_FLOAT32 = ("A_log", "dt_bias")

_TOP_KEYS = (
    "architecture", "qwen_type", "hf_architecture", "dtype", "vocab_size", "hidden_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_size", "intermediate_size", "norm_epsilon",
    "layernorm_weight_offset", "hidden_act", "position_embedding_type", "rotary_base", "rotary_scaling",
    "rotary_pct", "rotary_dim", "max_position_embeddings", "qk_layernorm", "tie_word_embeddings",
    "use_parallel_embedding", "embedding_sharding_dim", "layer_types", "sliding_window", "attn_output_gate", "linear_attention", "mapping", "quantization",
    "max_draft_len", "dflash2", "dflash2_trt",
)
# Required for that family, unknown for the others.
FAMILY_KEYS = {
    "muse_glimmer": ("q_scaling", "qk_layernorm_weight", "layer_rotary_base", "inter_layernorms", "post_norm_epsilon",
                     "ln_f_weight_offset", "embedding_norm", "output_multiplier", "final_logit_softcapping"),
}


def build_config(target: TargetConfig, drafter: DFlash2Config, *, tp_size: int, dtype: str,
                 converter_version: str) -> dict[str, Any]:
    """The config.json dict (schema :data:`SCHEMA_VERSION`) of a combined checkpoint."""
    linear = None
    if target.family == "qwen3_5":
        linear = {
            "num_key_heads": target.linear_num_key_heads, "num_value_heads": target.linear_num_value_heads,
            "key_head_dim": target.linear_key_head_dim, "value_head_dim": target.linear_value_head_dim,
            "conv_kernel_size": target.linear_conv_kernel_dim,
        }
    family_fields: dict[str, Any] = {}
    if target.family == "muse_glimmer":
        from . import muse_glimmer

        family_fields = {
            "q_scaling": muse_glimmer.q_scaling(target),
            "qk_layernorm_weight": False,
            "layer_rotary_base": muse_glimmer.layer_rotary_base(target),
            "inter_layernorms": True,
            "post_norm_epsilon": target.post_norm_eps,
            "ln_f_weight_offset": 0.0,
            "embedding_norm": True,
            "output_multiplier": target.output_multiplier,
            "final_logit_softcapping": target.final_logit_softcapping,
        }
    draft = drafter.numerics()
    draft["dtype"] = dtype
    draft.update({
        "tensor_prefix": "dflash2.",
        "target_hidden_size": target.hidden_size,
        "fc_gather_output": True,
        "embedding": "transformer.vocab_embedding.weight",
        "lm_head": "lm_head.weight",
    })
    return {
        "architecture": ARCHITECTURES[target.family],
        "qwen_type": target.family,
        "hf_architecture": target.architecture,
        "dtype": dtype,
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "num_hidden_layers": target.num_hidden_layers,
        "num_attention_heads": target.num_attention_heads,
        "num_key_value_heads": target.num_key_value_heads,
        "head_size": target.head_dim,
        "intermediate_size": target.intermediate_size,
        "norm_epsilon": target.rms_norm_eps,
        "layernorm_weight_offset": 1.0 if target.family in ("qwen3_5", "muse_glimmer") else 0.0,
        "hidden_act": "silu",
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": target.rope_theta,
        "rotary_scaling": None,
        "rotary_pct": target.partial_rotary_factor,
        "rotary_dim": target.rotary_dim,
        "max_position_embeddings": target.max_position_embeddings,
        "qk_layernorm": True,
        "tie_word_embeddings": target.tie_word_embeddings,
        "use_parallel_embedding": True,
        "embedding_sharding_dim": 0,
        "layer_types": list(target.layer_types),
        "sliding_window": target.sliding_window,
        "attn_output_gate": bool(target.attn_output_gate) or target.family == "muse_glimmer",
        "linear_attention": linear,
        "mapping": {"world_size": tp_size, "tp_size": tp_size, "pp_size": 1},
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        "max_draft_len": drafter.max_draft_len,
        **family_fields,
        "dflash2": draft,
        "dflash2_trt": {
            "schema_version": SCHEMA_VERSION,
            "format": FORMAT,
            "converter_version": converter_version,
            "keep_float32": list(KEEP_FLOAT32) if target.family == "qwen3_5" else [],
        },
    }


def required_keys(family) -> tuple[str, ...]:
    """The top-level keys a combined checkpoint's config.json has for ``family`` (its ``qwen_type``)."""
    return _TOP_KEYS + FAMILY_KEYS.get(family, ())


@dataclass(frozen=True)
class CheckpointConfig:
    """A validated ``config.json`` of a combined checkpoint (read side)."""

    data: Mapping[str, Any]
    source: str

    @property
    def tp_size(self) -> int:
        return int(self.data["mapping"]["tp_size"])

    @property
    def family(self) -> str:
        return self.data["qwen_type"]

    @property
    def dflash2(self) -> Mapping[str, Any]:
        return self.data["dflash2"]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @classmethod
    def load(cls, path: str | Path) -> "CheckpointConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json_loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror or exc}", source=path) from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON: {exc.msg} at line {exc.lineno}", source=path) from None
        if not isinstance(data, dict):
            raise ConfigError("top level must be an object", source=path)
        meta = data.get("dflash2_trt")
        if not isinstance(meta, dict) or "schema_version" not in meta:
            raise ConfigError("not a dflash2-trt combined checkpoint (no dflash2_trt.schema_version)", source=path,
                              field="dflash2_trt")
        if meta["schema_version"] != SCHEMA_VERSION:
            raise ConfigError(f"schema version {meta['schema_version']!r}; this dflash2-trt reads version "
                              f"{SCHEMA_VERSION}. Re-run `dflash2-trt convert`.", source=path,
                              field="dflash2_trt.schema_version")
        missing = [k for k in _TOP_KEYS if k not in data]
        if missing:
            raise ConfigError(f"required field(s) missing: {missing}", source=path, field=missing[0])
        family = data["qwen_type"]
        if not isinstance(family, str) or family not in ARCHITECTURES:
            raise ConfigError(f"unsupported qwen_type {family!r}", source=path, field="qwen_type")
        extra = FAMILY_KEYS.get(family, ())
        missing = [k for k in extra if k not in data]
        if missing:
            raise ConfigError(f"required field(s) missing for qwen_type {family}: {missing}", source=path,
                              field=missing[0])
        unknown = sorted(set(data) - set(_TOP_KEYS) - set(extra))
        if unknown:
            raise ConfigError(f"unknown field(s) {unknown} for schema version {SCHEMA_VERSION} and qwen_type "
                              f"{family}", source=path, field=unknown[0])
        m = data["mapping"]

        def _int(v):  # JSON true/2.0 compare equal to 1/2 in Python; they are not valid sizes
            return isinstance(v, int) and not isinstance(v, bool)

        if not isinstance(m, dict) or not all(_int(m.get(k)) for k in ("tp_size", "pp_size", "world_size")) \
                or m["tp_size"] not in (1, 2, 4, 8) or m["pp_size"] != 1 or m["world_size"] != m["tp_size"]:
            raise ConfigError(f"invalid mapping {m!r}", source=path, field="mapping")
        d = data["dflash2"]
        if not isinstance(d, dict):
            raise ConfigError("must be an object", source=path, field="dflash2")
        from ..config.drafter import NUMERICS_FIELDS

        missing = [k for k in NUMERICS_FIELDS if k not in d]
        if missing:
            raise ConfigError(f"required field(s) missing: {missing}", source=path, field=f"dflash2.{missing[0]}")
        if not _int(d["block_size"]) or data["max_draft_len"] != d["block_size"] - 1:
            raise ConfigError(f"max_draft_len {data['max_draft_len']!r} must be dflash2.block_size - 1 "
                              f"({d['block_size']!r})", source=path, field="max_draft_len")
        return cls(data, str(path))
