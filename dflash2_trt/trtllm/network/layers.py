"""Blocks every network here is built from, in TensorRT-LLM's names: fused-qkv attention with per-head q/k
RMSNorm (TensorRT-LLM's Qwen3 attention, with the Qwen3.5 output gate, NoPE layers and a KV-head split over
several pool layers), the SwiGLU MLP, and the two RMSNorm variants the layer classes of ``tensorrt_llm.layers``
do not have (a weight offset, no weight)."""

from __future__ import annotations

from .common import F, api, dims, local_heads
from .kv_layout import rope_tables


def vocab_embedding(config):
    """The target's token embedding, vocabulary-parallel over the TP ranks (``sharding_dim=0``): the same in every
    family."""
    m = config.mapping
    return api.layers.Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype, tp_size=m.tp_size,
                                tp_group=m.tp_group, sharding_dim=0, tp_rank=m.tp_rank)


class QKNormAttention(api.Module):
    """Fused-qkv attention with per-head q/k RMSNorm before RoPE (TensorRT-LLM's Qwen3 attention)."""

    def __init__(self, *, hidden_size, num_heads, num_kv_heads, head_dim, eps, rope_base, rotary_dim, layer_idx,
                 dtype, mapping, norm_offset: float = 0.0, output_gate: bool = False, qk_norm_weight: bool = True,
                 q_scaling: float = 1.0, kv_split: int = 1, max_positions: int = 0):
        super().__init__()
        tp = mapping.tp_size
        self.max_positions = int(max_positions)
        self.kv_split = kv_split
        self.nq, self.nkv, self.d = num_heads // tp, local_heads(num_kv_heads, tp), head_dim
        self.layer_idx, self.rope_base, self.rotary_dim, self.eps = layer_idx, rope_base, rotary_dim, eps
        self.q_scaling = q_scaling
        # rope_base 0: a NoPE layer (Muse Glimmer's full-attention layers): no rotary at all
        self.pos_type = api.PositionEmbeddingType.rope_gpt_neox if rope_base else api.PositionEmbeddingType.learned_absolute
        self.qkv = api.layers.ColumnLinear(hidden_size, (self.nq + 2 * self.nkv) * head_dim * tp, bias=False,
                                           dtype=dtype, tp_group=mapping.tp_group, tp_size=tp, gather_output=False)
        if qk_norm_weight:
            self.q_layernorm = OffsetRmsNorm(head_dim, eps, dtype, norm_offset)
            self.k_layernorm = OffsetRmsNorm(head_dim, eps, dtype, norm_offset)
        else:   # Muse Glimmer: a weight-less per-head RMSNorm (no tensors in the checkpoint)
            self.q_layernorm = self.k_layernorm = WeightlessRmsNorm(head_dim, eps)
        if output_gate:   # Qwen3.5: out *= sigmoid(output_gate(x)) before dense, per query head
            self.output_gate = api.layers.ColumnLinear(hidden_size, num_heads * head_dim, bias=False, dtype=dtype,
                                                       tp_group=mapping.tp_group, tp_size=tp, gather_output=False)
        self.gated = output_gate
        self.dense = api.layers.RowLinear(num_heads * head_dim, hidden_size, bias=False, dtype=dtype,
                                          tp_group=mapping.tp_group, tp_size=tp)

    def normed_qkv(self, hidden):
        qkv = self.qkv(hidden)
        n = F.shape(qkv, 0)
        d, nq, nkv = self.d, self.nq, self.nkv
        q = F.slice(qkv, [0, 0], dims(n, nq * d))
        k = F.slice(qkv, [0, nq * d], dims(n, nkv * d))
        v = F.slice(qkv, [0, (nq + nkv) * d], dims(n, nkv * d))
        q = F.view(self.q_layernorm(F.view(q, dims(n, nq, d))), dims(n, nq * d))
        k = F.view(self.k_layernorm(F.view(k, dims(n, nkv, d))), dims(n, nkv * d))
        return F.concat([q, k, v], dim=1)

    def forward(self, hidden, attention_params, kv_cache_params, spec_decoding_params, *, mask_type):
        qkv = self.normed_qkv(hidden)
        if self.kv_split == 1:
            ctx = self._attend(qkv, self.layer_idx, self.nq, self.nkv, attention_params, kv_cache_params,
                               spec_decoding_params, mask_type)
        else:
            # KV heads wider than the pool's per-layer slot: head group s (nkv / split KV heads and their query
            # heads) attends in pool layer layer_idx + s; attention is independent per head group, so exact.
            n, d, nq, nkv, sp = F.shape(qkv, 0), self.d, self.nq, self.nkv, self.kv_split
            gq, gk = nq // sp, nkv // sp
            parts = []
            for g in range(sp):
                q = F.slice(qkv, [0, g * gq * d], dims(n, gq * d))
                k = F.slice(qkv, [0, (nq + g * gk) * d], dims(n, gk * d))
                v = F.slice(qkv, [0, (nq + nkv + g * gk) * d], dims(n, gk * d))
                parts.append(self._attend(F.concat([q, k, v], dim=1), self.layer_idx + g, gq, gk, attention_params,
                                          kv_cache_params, spec_decoding_params, mask_type))
            ctx = F.concat(parts, dim=1)
        if self.gated:
            ctx = ctx * F.sigmoid(self.output_gate(hidden))
        return self.dense(ctx)

    def _attend(self, qkv, layer_idx, nq, nkv, attention_params, kv_cache_params, spec_decoding_params, mask_type):
        rope = {}
        if self.rope_base:   # the plugin reads the rotary tables as inputs (fp32 constants, TensorRT-LLM's layout)
            inv, cos_sin = rope_tables(self.max_positions, self.rotary_dim, self.rope_base)
            rope = dict(rotary_inv_freq=F.constant(inv), rotary_cos_sin=F.constant(cos_sin),
                        rotary_embedding_max_positions=self.max_positions)
        ctx, _ = F.gpt_attention(
            qkv=qkv, past_key_value=None,
            sequence_length=attention_params.sequence_length,
            host_past_key_value_lengths=kv_cache_params.host_past_key_value_lengths,
            host_max_attention_window_sizes=kv_cache_params.host_max_attention_window_sizes,
            host_sink_token_length=kv_cache_params.host_sink_token_length,
            context_lengths=attention_params.context_lengths, cache_indirection=kv_cache_params.cache_indirection,
            host_request_types=attention_params.host_request_types, layer_idx=layer_idx,
            num_heads=nq, num_kv_heads=nkv, hidden_size_per_head=self.d, q_scaling=self.q_scaling,
            rotary_embedding_dim=self.rotary_dim if self.rope_base else 0,
            rotary_embedding_base=self.rope_base or 10000.0, position_embedding_type=self.pos_type,
            max_context_length=attention_params.max_context_length, mask_type=mask_type,
            kv_cache_block_offsets=kv_cache_params.kv_cache_block_offsets,
            host_kv_cache_block_offsets=kv_cache_params.host_kv_cache_block_offsets,
            host_kv_cache_pool_pointers=kv_cache_params.host_kv_cache_pool_pointers,
            host_kv_cache_pool_mapping=kv_cache_params.host_kv_cache_pool_mapping,
            spec_decoding_is_generation_length_variable=spec_decoding_params.spec_decoding_is_generation_length_variable,
            spec_decoding_max_generation_length=spec_decoding_params.spec_decoding_max_generation_length,
            spec_decoding_generation_lengths=spec_decoding_params.spec_decoding_generation_lengths,
            spec_decoding_position_offsets=spec_decoding_params.spec_decoding_position_offsets,
            spec_decoding_packed_mask=spec_decoding_params.spec_decoding_packed_mask,
            spec_decoding_use=spec_decoding_params.spec_decoding_use,
            host_runtime_perf_knobs=attention_params.host_runtime_perf_knobs,
            host_context_progress=attention_params.host_context_progress,
            host_context_lengths=attention_params.host_context_lengths, **rope)
        return ctx


class GatedMLP(api.Module):
    """SwiGLU: ``proj(silu(fc(x)) * gate(x))`` (TensorRT-LLM names; fc = HF gate_proj)."""

    def __init__(self, hidden_size, ffn_hidden_size, dtype, mapping):
        super().__init__()
        tp, g = mapping.tp_size, mapping.tp_group
        self.fc = api.layers.ColumnLinear(hidden_size, ffn_hidden_size, bias=False, dtype=dtype, tp_group=g,
                                          tp_size=tp, gather_output=False)
        self.gate = api.layers.ColumnLinear(hidden_size, ffn_hidden_size, bias=False, dtype=dtype, tp_group=g,
                                            tp_size=tp, gather_output=False)
        self.proj = api.layers.RowLinear(ffn_hidden_size, hidden_size, bias=False, dtype=dtype, tp_group=g, tp_size=tp)

    def forward(self, x):
        return self.proj(F.silu(self.fc(x)) * self.gate(x))


class OffsetRmsNorm(api.Module):
    """RMSNorm whose scale is ``weight + offset``: Qwen3.5's zero-centred norms store ``weight`` with
    ``layernorm_weight_offset: 1.0`` (convert/schema.py); offset 0 is the plain RmsNorm."""

    def __init__(self, dim, eps, dtype, offset: float = 0.0):
        super().__init__()
        self.dim, self.eps, self.offset = dim, eps, float(offset)
        self.weight = api.Parameter(shape=(dim,), dtype=dtype)

    def forward(self, x):
        w = self.weight.value
        if self.offset:
            return F.rms_norm(x, self.dim, eps=self.eps) * (w + self.offset)
        return F.rms_norm(x, self.dim, weight=w, eps=self.eps)


class WeightlessRmsNorm(api.Module):
    """RMSNorm without a weight (Muse Glimmer's per-head q/k norm: no tensors in the checkpoint)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x):
        return F.rms_norm(x, self.dim, eps=self.eps)
