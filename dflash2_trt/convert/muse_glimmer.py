"""Weight map of the Muse Glimmer target (HF ``MuseGlimmerForConditionalGeneration``), text only.

Read from transformers' ``models/muse_glimmer/modeling_muse_glimmer.py`` (5.24). HF names are under
``model.language_model.`` (the multimodal wrapper); ``lm_head.weight`` is top level. Embedding,
MLP, ln_f and lm_head follow :mod:`.qwen3`; the decoder layer has Gemma-2-style sandwich norms
and a separately projected sigmoid output gate, named as TensorRT-LLM's Gemma-2/3 layer names them
(``post_layernorm`` after attention with ``inter_layernorms``, ``pre_feedforward_layernorm``,
``post_feedforward_layernorm``):

===========================================================  ========================================  ==========
TensorRT-LLM name (per rank)                                 HF source (``model.language_model.``)     TP split
===========================================================  ========================================  ==========
transformer.vocab_embedding.weight                           embed_tokens.weight (the lookup only)     dim 0
transformer.layers.L.input_layernorm.weight                  layers.L.input_layernorm.weight           replicated
transformer.layers.L.attention.qkv.weight                    self_attn.q_proj / k_proj / v_proj,       head group
                                                             per rank [q heads; kv heads; kv heads]
transformer.layers.L.attention.output_gate.weight            self_attn.gate_proj.weight                same heads
                                                             (``[heads * head_dim, hidden]``, its own  as q
                                                             matrix, not interleaved with q)
transformer.layers.L.attention.dense.weight                  self_attn.o_proj.weight                   dim 1
transformer.layers.L.post_layernorm.weight                   layers.L.post_attention_layernorm.weight  replicated
                                                             (on the attention OUTPUT, before the
                                                             residual add; eps ``post_norm_eps``)
transformer.layers.L.pre_feedforward_layernorm.weight        layers.L.pre_feedforward_layernorm.weight replicated
transformer.layers.L.mlp.fc.weight / gate.weight             mlp.gate_proj (SiLU in) / mlp.up_proj     dim 0
transformer.layers.L.mlp.proj.weight                         mlp.down_proj                             dim 1
transformer.layers.L.post_feedforward_layernorm.weight       layers.L.post_feedforward_layernorm       replicated
                                                             (eps ``post_norm_eps``)
transformer.ln_f.weight                                      norm.weight                               replicated
lm_head.weight                                               lm_head.weight (embed_tokens when tied)   dim 0
===========================================================  ========================================  ==========

No tensor, config only (``schema.py``, the muse_glimmer keys):

* ``self_attn.qk_norm`` is an RMSNorm WITHOUT weights over each q and k head
  (``qk_layernorm_weight: false``; there are no ``q_layernorm``/``k_layernorm`` tensors);
* ``embed_tokens.embed_norm`` is a weight-less RMSNorm after the target's lookup
  (``embedding_norm: true``); the drafter embeds through the same table WITHOUT it;
* the logits are ``cap * tanh(lm_head(x) * output_multiplier / cap)`` (``output_multiplier``,
  ``final_logit_softcapping``);
* ``layer_rope_theta[L] == 0`` makes layer L NoPE (transformers passes it no position
  embeddings); any other value is ignored by transformers, which rotates every other layer with the
  global ``rope_theta`` — a different non-zero value is refused here rather than guessed
  (``layer_rotary_base``: 0.0 or ``rotary_base`` per layer);
* ``qk_scale_factor`` (below, ``q_scaling``).

``qk_scale_factor``, settled by transformers' implementation: ``MuseGlimmerTextAttention`` does
``q = qk_norm(q) * qk_scale_factor`` and then calls the attention with ``scaling = head_dim ** -0.5``,
so the softmax sees ``(q . k) * qk_scale_factor / sqrt(head_dim)``: the factor MULTIPLIES the usual
1/sqrt(head_dim), it does not replace it. In TensorRT-LLM's terms (``Attention(q_scaling=...)``,
softmax scale ``1 / (q_scaling * sqrt(head_size))``) that is ``q_scaling = 1 / qk_scale_factor``.
The other reading (softmax scale = ``qk_scale_factor``) is 4x off at head_dim 16 and 11x at 128;
tests/convert/test_convert_logits.py shows it fails the comparison with transformers' logits.

Silent failure modes (none crash): reading the sandwich norms in the Qwen3 order (``post_layernorm``
as the pre-MLP norm), applying ``1 + weight`` to ``ln_f`` (the layer norms are zero-centred
``1 + weight``, the final norm is a plain scale: ``ln_f_weight_offset`` 0.0), the eps of the post
norms (``post_norm_epsilon``, 1e-8 in the release, not ``norm_epsilon``), rotating a NoPE layer,
the embedding norm in the drafter, and the q_scaling reading.

Dropped deliberately: the vision tower, adapter and projection (``model.vision_tower.*``,
``model.vision_adapter.*``, ``model.vision_projection.*``; the engine is text only;
``perception_emb_norm`` has no weights) and, when tied, ``lm_head.weight``.
"""

from __future__ import annotations

from ..config import TargetConfig
from ..errors import ConfigError
from .plan import TARGET, Drop, OutTensor, Piece, head_groups, replicated, row_parallel, rows_of, stacked
from .qwen3 import embeddings_and_head, mlp, target_drops as _qwen3_drops, text_field


def q_scaling(t: TargetConfig) -> float:
    """TensorRT-LLM's ``q_scaling`` for transformers' reading of ``qk_scale_factor`` (module docstring)."""
    return 1.0 / t.qk_scale_factor


def layer_rotary_base(t: TargetConfig) -> list[float]:
    """Per layer: 0.0 (NoPE) or the global RoPE theta, as transformers applies ``layer_rope_theta``."""
    out = []
    for i, theta in enumerate(t.layer_rope_theta):
        if theta != 0.0 and theta != t.rope_theta:
            raise ConfigError(
                f"layer {i} has RoPE theta {theta:g} but rope_theta is {t.rope_theta:g}: transformers rotates every "
                f"layer whose layer_rope_theta is non-zero with the global rope_theta and ignores the value, so a "
                f"per-layer theta would be computed differently by different engines; refusing to guess",
                source=t.source, field=text_field(t, "layer_rope_theta"))
        out.append(0.0 if theta == 0.0 else float(t.rope_theta))
    return out


def attention(dst: str, src: str, t: TargetConfig, tp: int, rank: int) -> list[OutTensor]:
    d, h = t.head_dim, t.hidden_size
    q_heads, kv = head_groups(t.num_attention_heads, t.num_key_value_heads, tp, rank, source=t.source,
                              heads_field=text_field(t, "num_attention_heads"),
                              groups_field=text_field(t, "num_key_value_heads"))
    qkv = [Piece(TARGET, src + "q_proj.weight", rows_of(q_heads, d)),
           Piece(TARGET, src + "k_proj.weight", rows_of(kv, d)),
           Piece(TARGET, src + "v_proj.weight", rows_of(kv, d))]
    return [
        stacked(dst + "qkv.weight", qkv, h),
        stacked(dst + "output_gate.weight", [Piece(TARGET, src + "gate_proj.weight", rows_of(q_heads, d))], h),
        row_parallel(dst + "dense.weight", TARGET, src + "o_proj.weight", (h, t.num_attention_heads * d), tp, rank),
    ]


def target_tensors(t: TargetConfig, tp: int, rank: int) -> list[OutTensor]:
    layer_rotary_base(t)  # refuses a layer_rope_theta transformers would not honour, before anything is planned
    p, hs = t.weight_prefix, (t.hidden_size,)
    first, last = embeddings_and_head(t, tp, rank)
    out = list(first)
    for i in range(t.num_hidden_layers):
        src, dst = f"{p}layers.{i}.", f"transformer.layers.{i}."
        out.append(replicated(dst + "input_layernorm.weight", TARGET, src + "input_layernorm.weight", hs))
        out += attention(dst + "attention.", src + "self_attn.", t, tp, rank)
        out.append(replicated(dst + "post_layernorm.weight", TARGET, src + "post_attention_layernorm.weight", hs))
        out.append(replicated(dst + "pre_feedforward_layernorm.weight", TARGET,
                              src + "pre_feedforward_layernorm.weight", hs))
        out += mlp(dst + "mlp.", TARGET, src + "mlp.", hidden=t.hidden_size, inter=t.intermediate_size, tp=tp,
                   rank=rank, source=t.source, field=text_field(t, "intermediate_size"))
        out.append(replicated(dst + "post_feedforward_layernorm.weight", TARGET,
                              src + "post_feedforward_layernorm.weight", hs))
    return out + last


def target_drops(t: TargetConfig) -> list[Drop]:
    drops = _qwen3_drops(t)
    reason = "vision tower, adapter and projection: the engine is text only"
    drops += [Drop(reason, prefix="model.vision_tower."), Drop(reason, prefix="model.vision_adapter."),
              Drop(reason, prefix="model.vision_projection.")]
    return drops


__all__ = ["target_tensors", "target_drops", "q_scaling", "layer_rotary_base"]
