"""Weight map of the DFlash2 drafter into the combined checkpoint, under the ``dflash2.`` prefix.

The drafter owns no embedding and no LM head: it reads the target's
``transformer.vocab_embedding`` and ``lm_head``. Its backbone layers follow the TensorRT-LLM Qwen
names (see :mod:`.qwen3`) under ``dflash2.layers.N.``.

=======================================================  ==========================================  ===============
name (per rank)                                          HF drafter source                           TP split
=======================================================  ==========================================  ===============
dflash2.fc.weight                                        fc.weight ``[H, n_taps*H_target]``          dim 0 (gather
                                                                                                     the output)
dflash2.hidden_norm.weight                               hidden_norm.weight                          replicated
dflash2.layers.N.input_layernorm.weight                  layers.N.input_layernorm.weight             replicated
dflash2.layers.N.attention.qkv.weight                    layers.N.self_attn.{q,k,v}_proj             head group
dflash2.layers.N.attention.{q,k}_layernorm.weight        layers.N.self_attn.{q,k}_norm               replicated
dflash2.layers.N.attention.dense.weight                  layers.N.self_attn.o_proj                   dim 1
dflash2.layers.N.post_layernorm.weight                   layers.N.post_attention_layernorm.weight    replicated
dflash2.layers.N.mlp.{fc,gate,proj}.weight               layers.N.mlp.{gate,up,down}_proj            dim 0, 0, 1
dflash2.layers.N.attention_conv.base_kernel              layers.N.attention_conv.base_kernel         replicated
dflash2.layers.N.attention_conv.kernel_projection.weight layers.N.attention_conv.kernel_projection   replicated
dflash2.layers.N.mlp_conv.{base_kernel,kernel_projection.weight}  the same for mlp_conv             replicated
dflash2.norm.weight                                      norm.weight                                 replicated
dflash2.selector.predecessor_codebook                    candidate_selector.predecessor_codebook     replicated
dflash2.selector.successor_codebook                      candidate_selector.successor_codebook       replicated
dflash2.selector.hidden_projection.weight                candidate_selector.hidden_projection.weight replicated
=======================================================  ==========================================  ===============

The conv and its kernel projection act on the full (replicated) hidden state around each
sublayer, so they are replicated. The selector's codebooks are only ever gathered at the top-k
candidate ids (K=16 rows per position), which every rank needs whole: replicated too (2 x V x R,
~254 MB in bf16 for Qwen3.8; a vocab split would need a gather of 2*K rows per position).

Silent failure mode: ``kernel_projection``'s output rows are ordered [side, tap, group]; the
converter copies the matrix as is, so that order is the network's responsibility (pinned by
the layout test, which calls the reference conv).
"""

from __future__ import annotations

from ..config import DFlash2Config
from .plan import DRAFTER, OutTensor, column_parallel, replicated, require_divisible
from .qwen3 import attention, mlp

PREFIX = "dflash2."


def drafter_tensors(d: DFlash2Config, target_hidden: int, tp: int, rank: int) -> list[OutTensor]:
    h = d.hidden_size
    require_divisible(h, tp, what="hidden_size", source=d.source, field="hidden_size")
    out = [
        column_parallel(PREFIX + "fc.weight", DRAFTER, "fc.weight", (h, d.num_taps * target_hidden), tp, rank),
        replicated(PREFIX + "hidden_norm.weight", DRAFTER, "hidden_norm.weight", (h,)),
    ]
    for i in range(d.num_hidden_layers):
        src, dst = f"layers.{i}.", f"{PREFIX}layers.{i}."
        out.append(replicated(dst + "input_layernorm.weight", DRAFTER, src + "input_layernorm.weight", (h,)))
        out += attention(dst + "attention.", DRAFTER, src + "self_attn.", heads=d.num_attention_heads,
                         kv_heads=d.num_key_value_heads, head_dim=d.head_dim, hidden=h, tp=tp, rank=rank,
                         source=d.source, heads_field="num_attention_heads", kv_field="num_key_value_heads")
        out.append(replicated(dst + "post_layernorm.weight", DRAFTER, src + "post_attention_layernorm.weight", (h,)))
        out += mlp(dst + "mlp.", DRAFTER, src + "mlp.", hidden=h, inter=d.intermediate_size, tp=tp, rank=rank,
                   source=d.source, field="intermediate_size")
        for conv in ("attention_conv", "mlp_conv"):
            out.append(replicated(f"{dst}{conv}.base_kernel", DRAFTER, f"{src}{conv}.base_kernel",
                                  (2, d.conv_kernel_size, h)))
            out.append(replicated(f"{dst}{conv}.kernel_projection.weight", DRAFTER,
                                  f"{src}{conv}.kernel_projection.weight", (d.kernel_projection_out, h)))
    r, v = d.selector_rank, d.vocab_size
    out += [
        replicated(PREFIX + "norm.weight", DRAFTER, "norm.weight", (h,)),
        replicated(PREFIX + "selector.predecessor_codebook", DRAFTER, "candidate_selector.predecessor_codebook", (v, r)),
        replicated(PREFIX + "selector.successor_codebook", DRAFTER, "candidate_selector.successor_codebook", (v, r)),
        replicated(PREFIX + "selector.hidden_projection.weight", DRAFTER,
                   "candidate_selector.hidden_projection.weight", (r, h)),
    ]
    return out
