"""The Qwen3.5 hybrid target (``qwen_type: qwen3_5``; checkpoint names: ``convert/qwen3_5.py``): Gated DeltaNet
(linear-attention) layers and gated full-attention layers, zero-centred norms. The recurrent state lives in the
runtime's state slots (docs/hybrid-runtime.md); the KV pool holds the attention layers only."""

from __future__ import annotations

import numpy as np

from ..common import F, RecurrentStateParams, api, dims, local_heads
from ..kv_layout import hf_layer_types, rope_positions
from ..layers import GatedMLP, OffsetRmsNorm, QKNormAttention, vocab_embedding


class GatedDeltaNet(api.Module):
    """Qwen3.5's linear-attention mixer (names: convert/qwen3_5.py). The recurrence, its causal conv and the
    per-request state live in the DFlash2GatedDeltaNet plugin: ``forward`` first folds each slot's pending records
    (the previous step's accepted tokens) into its state, then advances context requests' slots and verifies
    generation requests' K+1 tokens from their committed state, recording per token what a later fold needs;
    :meth:`commit` then commits exactly the accepted tokens: the slot's pending count (the next forward folds them)
    and the conv state. It must run in every step whose forward ran (without it the verify's records are never
    folded: nothing accepted). State slots are the runtime's (``slot_mapping``, ``rnn_state_ptr_<L>``,
    ``conv_state_ptr_<L>``; a slot row is the state and the records: docs/hybrid-runtime.md §5)."""

    def __init__(self, config, layer_idx, dtype, mapping):
        super().__init__()
        la, tp = config.linear_attention, mapping.tp_size
        self.layer_idx = layer_idx
        self.nk, self.nv = local_heads(la["num_key_heads"], tp), la["num_value_heads"] // tp
        self.dk, self.dv, self.kconv = la["key_head_dim"], la["value_head_dim"], la["conv_kernel_size"]
        self.c = 2 * self.nk * self.dk + self.nv * self.dv
        h, g = config.hidden_size, mapping.tp_group
        col = lambda out: api.layers.ColumnLinear(h, out * tp, bias=False, dtype=dtype, tp_group=g, tp_size=tp,  # noqa: E731
                                                  gather_output=False)
        self.qkv = col(self.c)
        self.conv1d = _WeightOnly((self.c, 1, self.kconv), dtype)   # depthwise causal conv weight [C, 1, K]
        self.z = col(self.nv * self.dv)
        self.b = col(self.nv)
        self.a = col(self.nv)
        self.dt_bias = api.Parameter(shape=(self.nv,), dtype="float32")
        self.A_log = api.Parameter(shape=(self.nv,), dtype="float32")
        self.norm = OffsetRmsNorm(self.dv, config.norm_epsilon, dtype, 0.0)   # the one Qwen3.5 norm without offset
        self.dense = api.layers.RowLinear(la["num_value_heads"] * self.dv, h, bias=False, dtype=dtype, tp_group=g,
                                          tp_size=tp)
        self.max_verify = config.dflash2["block_size"]

    def _attrs(self):
        return dict(num_k_heads=self.nk, num_v_heads=self.nv, head_k_dim=self.dk, head_v_dim=self.dv,
                    conv_kernel=self.kconv, max_verify_tokens=self.max_verify)

    def forward(self, x, rs):
        n = F.shape(x, 0)
        conv_w = F.view(self.conv1d.weight.value, [self.c, self.kconv])
        y, vqkv, vgates = api.plugins.gated_delta_net(
            self.qkv(x), conv_w, self.a(x), self.b(x), self.dt_bias.value, self.A_log.value, rs.cu_seqlens,
            rs.slot_mapping, rs.host_request_types, rs.rnn_state_ptr[self.layer_idx], rs.conv_state_ptr[self.layer_idx],
            zero_state=rs.zero_state, **self._attrs())
        core = self.norm(F.view(y, dims(n, self.nv, self.dv)))
        z = F.view(self.z(x), dims(n, self.nv, self.dv))
        core = F.cast(F.cast(core, "float32") * F.silu(F.cast(z, "float32")), x.dtype)
        return self.dense(F.view(core, dims(n, self.nv * self.dv))), (vqkv, vgates, conv_w)

    def commit(self, saved, num_accepted, rs):
        vqkv, vgates, conv_w = saved
        return api.plugins.gated_delta_net_commit(vqkv, vgates, conv_w, num_accepted, rs.cu_seqlens, rs.slot_mapping,
                                                  rs.host_request_types, rs.rnn_state_ptr[self.layer_idx],
                                                  rs.conv_state_ptr[self.layer_idx], **self._attrs())


class _WeightOnly(api.Module):
    """A parameter named ``<module>.weight`` whose op is the plugin's (the DeltaNet's conv1d)."""

    def __init__(self, shape, dtype):
        super().__init__()
        self.weight = api.Parameter(shape=shape, dtype=dtype)


class Qwen3_5DecoderLayer(api.Module):
    def __init__(self, config, layer_idx, kv_layer_idx):
        super().__init__()
        h, dt, eps, off = config.hidden_size, config.dtype, config.norm_epsilon, config.layernorm_weight_offset
        self.kind = hf_layer_types(config)[layer_idx]
        self.input_layernorm = OffsetRmsNorm(h, eps, dt, off)
        if self.kind == "linear_attention":
            self.linear_attention = GatedDeltaNet(config, layer_idx, dt, config.mapping)
        else:
            self.attention = QKNormAttention(hidden_size=h, num_heads=config.num_attention_heads,
                                             num_kv_heads=config.num_key_value_heads, head_dim=config.head_size,
                                             eps=eps, rope_base=config.rotary_base, rotary_dim=config.rotary_dim,
                                             layer_idx=kv_layer_idx, dtype=dt, mapping=config.mapping, norm_offset=off,
                                             output_gate=bool(config.attn_output_gate),
                                             max_positions=rope_positions(config))
        self.post_layernorm = OffsetRmsNorm(h, eps, dt, off)
        self.mlp = GatedMLP(h, config.intermediate_size, dt, config.mapping)

    def forward(self, x, attention_params, kv_cache_params, spec_decoding_params, rs, saved):
        h = self.input_layernorm(x)
        if self.kind == "linear_attention":
            out, keep = self.linear_attention(h, rs)
            saved.append((self.linear_attention, keep))
        else:
            out = self.attention(h, attention_params, kv_cache_params, spec_decoding_params,
                                 mask_type=api.AttentionMaskType.causal)
        x = x + out
        return x + self.mlp(self.post_layernorm(x))


class Qwen3_5Transformer(api.Module):
    """Qwen3.5 hybrid target (``qwen_type: qwen3_5``): Gated DeltaNet + gated full-attention layers, zero-centred
    norms. Only attention layers own KV layers of the pool (numbered in order); DeltaNet layers own state slots."""

    recurrent = True

    def __init__(self, config):
        super().__init__()
        self.vocab_embedding = vocab_embedding(config)
        kv_idx, layers = 0, []
        for i, kind in enumerate(hf_layer_types(config)):
            layers.append(Qwen3_5DecoderLayer(config, i, kv_idx))
            kv_idx += kind != "linear_attention"
        self.layers = api.ModuleList(layers)
        self.ln_f = OffsetRmsNorm(config.hidden_size, config.norm_epsilon, config.dtype,
                                  config.layernorm_weight_offset)

    def forward(self, input_ids, attention_params, kv_cache_params, spec_decoding_params, rs=None, saved=None):
        x = self.vocab_embedding(input_ids)
        outs = []
        for layer in self.layers:
            x = layer(x, attention_params, kv_cache_params, spec_decoding_params, rs, saved)
            outs.append(x)
        return self.ln_f(x), outs


def step_state_params(recurrent_params, attention_params, ends, is_gen) -> RecurrentStateParams:
    """The state inputs of one combined-engine step: the runtime's slots and pointers, the packed request
    boundaries ``cu_seqlens = [0, ends...]``, and ``zero_state``: TensorRT-LLM never zeroes a state slot
    (docs/hybrid-runtime.md E1), so a prompt's first chunk (sequence_length == context_lengths, stock inputs)
    starts from zeros whatever the reused slot holds."""
    att = attention_params
    return RecurrentStateParams(slot_mapping=recurrent_params.slot_mapping,
                                rnn_state_ptr=recurrent_params.rnn_state_ptr,
                                conv_state_ptr=recurrent_params.conv_state_ptr,
                                host_request_types=att.host_request_types,
                                cu_seqlens=F.concat([F.constant(np.zeros(1, np.int32)), ends]),
                                zero_state=F.cast(F.op_and(F.eq(att.sequence_length, att.context_lengths),
                                                           F.eq(F.cast(is_gen, "int32"), 0)), "int32"))
