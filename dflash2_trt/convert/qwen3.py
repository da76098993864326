"""Weight map of the dense Qwen3 target (HF ``Qwen3ForCausalLM``) under TensorRT-LLM's Qwen names.

=====================================================  ============================================  ==========
TensorRT-LLM name (per rank)                           HF source                                     TP split
=====================================================  ============================================  ==========
transformer.vocab_embedding.weight                     model.embed_tokens.weight                     dim 0 (vocab)
transformer.layers.L.input_layernorm.weight            model.layers.L.input_layernorm.weight         replicated
transformer.layers.L.attention.qkv.weight              q_proj / k_proj / v_proj, fused per rank as   head group
                                                       [q heads of rank; kv heads; kv heads]
transformer.layers.L.attention.q_layernorm.weight      model.layers.L.self_attn.q_norm.weight        replicated
transformer.layers.L.attention.k_layernorm.weight      model.layers.L.self_attn.k_norm.weight        replicated
transformer.layers.L.attention.dense.weight            model.layers.L.self_attn.o_proj.weight        dim 1
transformer.layers.L.post_layernorm.weight             model.layers.L.post_attention_layernorm.weight  replicated
transformer.layers.L.mlp.fc.weight                     model.layers.L.mlp.gate_proj.weight (silu in) dim 0
transformer.layers.L.mlp.gate.weight                   model.layers.L.mlp.up_proj.weight             dim 0
transformer.layers.L.mlp.proj.weight                   model.layers.L.mlp.down_proj.weight           dim 1
transformer.ln_f.weight                                model.norm.weight                             replicated
lm_head.weight                                         lm_head.weight (embed_tokens when tied)       dim 0 (vocab)
=====================================================  ============================================  ==========

Silent failure modes: swapping fc and gate (TensorRT-LLM's ``fc`` is the SiLU input, i.e. HF
``gate_proj``) or concatenating q/k/v over all heads and then splitting the result evenly over
ranks (each rank would get a mix of q and k rows) does not crash anything — the logits are just
wrong. The layout test (``tests/convert/test_convert_logits.py``) runs the converted checkpoint
with simulated TP and compares logits with transformers.
"""

from __future__ import annotations

from ..config import TargetConfig
from .plan import (
    TARGET, Drop, OutTensor, Piece, column_parallel, head_groups, replicated, require_divisible, row_parallel,
    rows_of, stacked,
)


def attention(out: str, ckpt: str, src: str, *, heads: int, kv_heads: int, head_dim: int, hidden: int,
              tp: int, rank: int, source: str, heads_field: str, kv_field: str,
              gated: bool = False, o_in: int | None = None) -> list[OutTensor]:
    """Fused qkv, dense and q/k layernorms of one attention block (``src``: HF ``...self_attn.``).

    ``gated``: Qwen3.5's ``q_proj`` holds [query_h; gate_h] per head h (2*head_dim rows per head,
    query first — transformers views it as [.., heads, 2*head_dim] and chunks the last dim). The
    query rows go into qkv; the gate rows become ``attention.output_gate`` split with the same
    heads, so that each rank gates exactly the heads it computes.
    """
    d = head_dim
    q_heads, kv = head_groups(heads, kv_heads, tp, rank, source=source, heads_field=heads_field,
                              groups_field=kv_field)
    if gated:
        q_pieces = [Piece(ckpt, src + "q_proj.weight", (h * 2 * d, h * 2 * d + d)) for h in q_heads]
    else:
        q_pieces = [Piece(ckpt, src + "q_proj.weight", rows_of(q_heads, d))]
    qkv = q_pieces + [Piece(ckpt, src + "k_proj.weight", rows_of(kv, d)),
                      Piece(ckpt, src + "v_proj.weight", rows_of(kv, d))]
    tensors = [
        stacked(out + "qkv.weight", qkv, hidden),
        row_parallel(out + "dense.weight", ckpt, src + "o_proj.weight", (hidden, o_in or heads * d), tp, rank),
        replicated(out + "q_layernorm.weight", ckpt, src + "q_norm.weight", (d,)),
        replicated(out + "k_layernorm.weight", ckpt, src + "k_norm.weight", (d,)),
    ]
    if gated:
        gate = [Piece(ckpt, src + "q_proj.weight", (h * 2 * d + d, (h + 1) * 2 * d)) for h in q_heads]
        tensors.insert(1, stacked(out + "output_gate.weight", gate, hidden))
    return tensors


def mlp(out: str, ckpt: str, src: str, *, hidden: int, inter: int, tp: int, rank: int, source: str,
        field: str) -> list[OutTensor]:
    require_divisible(inter, tp, what="intermediate_size", source=source, field=field)
    return [
        column_parallel(out + "fc.weight", ckpt, src + "gate_proj.weight", (inter, hidden), tp, rank),
        column_parallel(out + "gate.weight", ckpt, src + "up_proj.weight", (inter, hidden), tp, rank),
        row_parallel(out + "proj.weight", ckpt, src + "down_proj.weight", (hidden, inter), tp, rank),
    ]


def text_field(t: TargetConfig, name: str) -> str:
    return f"{t.text_config_key}.{name}" if t.text_config_key else name


def embeddings_and_head(t: TargetConfig, tp: int, rank: int) -> tuple[list[OutTensor], list[OutTensor]]:
    """(head-of-file tensors, end-of-file tensors): vocab_embedding first, ln_f and lm_head last."""
    p = t.weight_prefix
    require_divisible(t.vocab_size, tp, what="vocab_size", source=t.source, field=text_field(t, "vocab_size"))
    emb = p + "embed_tokens.weight"
    head_src = emb if t.tie_word_embeddings else "lm_head.weight"
    # Vocab-parallel embedding (TensorRT-LLM use_parallel_embedding, sharding dim 0): replicating it would
    # cost every rank the whole table (2.5 GB in bf16 for Qwen3.8-27B, +37% of a tp-8 rank's weights).
    first = [column_parallel("transformer.vocab_embedding.weight", TARGET, emb, (t.vocab_size, t.hidden_size), tp,
                             rank)]
    last = [
        replicated("transformer.ln_f.weight", TARGET, p + "norm.weight", (t.hidden_size,)),
        column_parallel("lm_head.weight", TARGET, head_src, (t.vocab_size, t.hidden_size), tp, rank),
    ]
    return first, last


def target_tensors(t: TargetConfig, tp: int, rank: int) -> list[OutTensor]:
    p = t.weight_prefix
    first, last = embeddings_and_head(t, tp, rank)
    out = list(first)
    for i in range(t.num_hidden_layers):
        src, dst = f"{p}layers.{i}.", f"transformer.layers.{i}."
        out.append(replicated(dst + "input_layernorm.weight", TARGET, src + "input_layernorm.weight", (t.hidden_size,)))
        out += attention(dst + "attention.", TARGET, src + "self_attn.", heads=t.num_attention_heads,
                         kv_heads=t.num_key_value_heads, head_dim=t.head_dim, hidden=t.hidden_size, tp=tp, rank=rank,
                         source=t.source, heads_field=text_field(t, "num_attention_heads"),
                         kv_field=text_field(t, "num_key_value_heads"))
        out.append(replicated(dst + "post_layernorm.weight", TARGET, src + "post_attention_layernorm.weight",
                              (t.hidden_size,)))
        out += mlp(dst + "mlp.", TARGET, src + "mlp.", hidden=t.hidden_size, inter=t.intermediate_size, tp=tp,
                   rank=rank, source=t.source, field=text_field(t, "intermediate_size"))
    return out + last


def target_drops(t: TargetConfig) -> list[Drop]:
    drops = []
    if t.tie_word_embeddings:
        drops.append(Drop("tie_word_embeddings: lm_head is the embedding table (as transformers ties it)",
                          name="lm_head.weight"))
    return drops
