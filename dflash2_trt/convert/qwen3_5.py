"""Weight map of the Qwen3.5 hybrid target (HF ``qwen3_5``): Gated DeltaNet + gated full attention.

HF names are under ``model.language_model.`` in the multimodal wrapper (``model.`` for
``Qwen3_5ForCausalLM``); ``lm_head.weight`` is top level. Common tensors (embedding, norms, MLP,
ln_f, lm_head) follow :mod:`.qwen3`. Full-attention layers (``layer_types[L] == "full_attention"``)
map like Qwen3 plus the output gate:

=====================================================  ===========================================  ==============
TensorRT-LLM name (per rank)                           HF source (``self_attn.``)                   TP split
=====================================================  ===========================================  ==============
transformer.layers.L.attention.qkv.weight              query rows of q_proj (per head: the first    head group
                                                       head_dim of its 2*head_dim rows), k_proj,
                                                       v_proj; per rank [q; k; v]
transformer.layers.L.attention.output_gate.weight      gate rows of q_proj (the second head_dim     same heads
                                                       of each head's 2*head_dim rows)              as q
transformer.layers.L.attention.{q,k}_layernorm.weight  q_norm / k_norm                              replicated
transformer.layers.L.attention.dense.weight            o_proj                                       dim 1
=====================================================  ===========================================  ==============

Gated DeltaNet layers (``linear_attention``), names defined by this project. ``nk``/``nv`` =
``linear_num_key_heads``/``linear_num_value_heads``, ``dk``/``dv`` their head dims; value head
``j`` reads key head ``j // (nv / nk)``. Each rank owns ``nv / tp`` consecutive value heads and
the key heads they read (a key head is duplicated on ``tp / nk`` ranks when ``nk < tp``, like KV
heads):

=========================================================  ========================================  ===============
TensorRT-LLM name (per rank)                               HF source (``linear_attn.``)              TP split
=========================================================  ========================================  ===============
transformer.layers.L.linear_attention.qkv.weight           in_proj_qkv rows, per rank                key/value
                                                           [q of its key heads; k of its key heads;  head groups
                                                           v of its value heads]
transformer.layers.L.linear_attention.conv1d.weight        conv1d.weight ``[channels, 1, K]``, the   as qkv
                                                           same channel rows as qkv
transformer.layers.L.linear_attention.z.weight             in_proj_z (gate of the output norm)       value heads
transformer.layers.L.linear_attention.b.weight             in_proj_b (beta = sigmoid(b))             value heads
transformer.layers.L.linear_attention.a.weight             in_proj_a (decay input)                   value heads
transformer.layers.L.linear_attention.dt_bias              dt_bias                                   value heads
transformer.layers.L.linear_attention.A_log                A_log (kept float32 if stored float32)    value heads
transformer.layers.L.linear_attention.norm.weight          norm.weight (gated RMSNorm over dv)       replicated
transformer.layers.L.linear_attention.dense.weight         out_proj                                  dim 1
=========================================================  ========================================  ===============

Silent failure modes (none crash):

* Qwen3.5's RMSNorms (input/post layernorms, q/k layernorms, ln_f) are zero-centred: the
  effective scale is ``1 + weight``. The converter keeps the stored values bit for bit and
  records ``layernorm_weight_offset: 1.0`` in config.json; a network that reads the weights as
  plain RMSNorm scales gets near-zero activations. The Gated DeltaNet ``norm`` is NOT offset.
* Splitting ``q_proj`` as [all queries; all gates] instead of per-head interleaved, or sharding
  the gate with different heads than the query, gates the wrong heads.
* Duplicated key heads must be duplicated in the conv1d rows too (conv1d is depthwise over the
  qkv channels, so each qkv row has exactly one conv row).

Dropped deliberately: the vision tower (``model.visual.*``; the engine is text only) and the
multi-token-prediction head (``mtp.*``; DFlash2 replaces it).
"""

from __future__ import annotations

from ..config import TargetConfig
from .plan import (
    TARGET, Drop, OutTensor, Piece, head_groups, replicated, row_parallel, rows_of, stacked,
)
from .qwen3 import attention, embeddings_and_head, mlp, target_drops as _qwen3_drops, text_field


def linear_attention(dst: str, src: str, t: TargetConfig, tp: int, rank: int) -> list[OutTensor]:
    nk, nv = t.linear_num_key_heads, t.linear_num_value_heads
    dk, dv = t.linear_key_head_dim, t.linear_value_head_dim
    h = t.hidden_size
    key_dim, value_dim = nk * dk, nv * dv
    ksize = t.linear_conv_kernel_dim
    v_heads, k_heads = head_groups(nv, nk, tp, rank, source=t.source,
                                   heads_field=text_field(t, "linear_num_value_heads"),
                                   groups_field=text_field(t, "linear_num_key_heads"))
    qkv_rows = [rows_of(k_heads, dk), rows_of(k_heads, dk, key_dim), rows_of(v_heads, dv, 2 * key_dim)]
    qkv = [Piece(TARGET, src + "in_proj_qkv.weight", r) for r in qkv_rows]
    conv = [Piece(TARGET, src + "conv1d.weight", r) for r in qkv_rows]

    def per_value_head(name: str, out: str, rows_per_head: int, trailing: tuple[int, ...], **kw) -> OutTensor:
        piece = Piece(TARGET, src + name, rows_of(v_heads, rows_per_head))
        return stacked(dst + out, [piece], 1 if not trailing else trailing[0], trailing, **kw)

    return [
        stacked(dst + "qkv.weight", qkv, h),
        stacked(dst + "conv1d.weight", conv, ksize, (1, ksize)),
        per_value_head("in_proj_z.weight", "z.weight", dv, (h,)),
        per_value_head("in_proj_b.weight", "b.weight", 1, (h,)),
        per_value_head("in_proj_a.weight", "a.weight", 1, (h,)),
        per_value_head("dt_bias", "dt_bias", 1, (), keep_float32=True),
        per_value_head("A_log", "A_log", 1, (), keep_float32=True),
        replicated(dst + "norm.weight", TARGET, src + "norm.weight", (dv,)),
        row_parallel(dst + "dense.weight", TARGET, src + "out_proj.weight", (h, value_dim), tp, rank),
    ]


def target_tensors(t: TargetConfig, tp: int, rank: int) -> list[OutTensor]:
    p = t.weight_prefix
    first, last = embeddings_and_head(t, tp, rank)
    out = list(first)
    for i, kind in enumerate(t.layer_types):
        src, dst = f"{p}layers.{i}.", f"transformer.layers.{i}."
        out.append(replicated(dst + "input_layernorm.weight", TARGET, src + "input_layernorm.weight", (t.hidden_size,)))
        if kind == "linear_attention":
            out += linear_attention(dst + "linear_attention.", src + "linear_attn.", t, tp, rank)
        else:
            out += attention(dst + "attention.", TARGET, src + "self_attn.", heads=t.num_attention_heads,
                             kv_heads=t.num_key_value_heads, head_dim=t.head_dim, hidden=t.hidden_size, tp=tp,
                             rank=rank, source=t.source, heads_field=text_field(t, "num_attention_heads"),
                             kv_field=text_field(t, "num_key_value_heads"), gated=t.attn_output_gate)
        out.append(replicated(dst + "post_layernorm.weight", TARGET, src + "post_attention_layernorm.weight",
                              (t.hidden_size,)))
        out += mlp(dst + "mlp.", TARGET, src + "mlp.", hidden=t.hidden_size, inter=t.intermediate_size, tp=tp,
                   rank=rank, source=t.source, field=text_field(t, "intermediate_size"))
    return out + last


def target_drops(t: TargetConfig) -> list[Drop]:
    drops = _qwen3_drops(t)
    if t.weight_prefix == "model.language_model.":
        drops.append(Drop("vision tower: the engine is text only", prefix="model.visual."))
    drops.append(Drop("multi-token-prediction head: not used with a DFlash2 drafter", prefix="mtp."))
    return drops


__all__ = ["target_tensors", "target_drops", "linear_attention"]
