"""The DFlash2 drafter (checkpoint prefix ``dflash2.``; names: ``convert/dflash2.py``): decoder layers with a
dynamic convolution (plugin ``DFlash2DynamicConv``) around each sublayer, over the KV layers it owns in the
target's pool after the target's (``layer_idx_offset``, as TensorRT-LLM's EAGLE drafter layers: :mod:`.kv_layout`).

Per step it does two things (:mod:`.combined` runs them)::

    draft     block [anchor, MASK x K] per request -> drafter layers (DFlash2DynamicConv around
              each sublayer, attention over the drafter's committed context K/V in the pool)
              -> norm (then, in the combined model: target lm_head (positions 1..K) -> output transform
              -> the selector, :mod:`.selector`)
    commit    fc(taps) of every token of the step -> each drafter layer's k/v -> written to the
              drafter layers' KV slots at the tokens' positions (the accepted ones are then
              committed by the runtime's ``seqLen += num_accepted_tokens``; the rest lie beyond
              the sequence and are overwritten by the next step, never read)

A context request's draft block is computed too (the graph is the same for every request) but discarded: it is
placed after the prompt, where the next step's block goes.
"""

from __future__ import annotations

import numpy as np

from .common import AttentionParams, F, SpecDecodingParams, api, dims
from .kv_layout import drafter_kv_split, num_kv_layers_of, rope_positions
from .layers import GatedMLP, QKNormAttention
from .selector import DFlash2Selector


class DynamicConv(api.Module):
    """``attention_conv`` / ``mlp_conv``: kernel projection of the normed sublayer input (both sides), then
    the pre-conv (plugin) and, after the sublayer, the post-conv fused with the residual add (plugin)."""

    def __init__(self, hidden, kernel_size, group_size, block_size, dtype):
        super().__init__()
        self.h, self.k, self.g, self.block = hidden, kernel_size, group_size, block_size
        self.base_kernel = api.Parameter(shape=(2, kernel_size, hidden), dtype=dtype)
        self.kernel_projection = api.layers.ColumnLinear(hidden, 2 * kernel_size * hidden // group_size, bias=False,
                                                         dtype=dtype, tp_size=1, gather_output=False)

    def _side(self, side):
        return F.view(F.select(self.base_kernel.value, 0, side), [self.k, self.h])

    def prepare(self, normed):
        n = F.shape(normed, 0)
        kp = F.view(self.kernel_projection(normed), dims(n, 2, self.k, self.h // self.g))   # [side, tap, group]
        pre = F.view(F.select(kp, 1, 0), dims(n, self.k, self.h // self.g))
        post = F.view(F.select(kp, 1, 1), dims(n, self.k, self.h // self.g))
        y = api.plugins.dynamic_conv(normed, pre, self._side(0), block_size=self.block, kernel_size=self.k,
                                     group_size=self.g)
        return y, post

    def finish(self, sub_out, post, residual):
        y = api.plugins.dynamic_conv(sub_out, post, self._side(1), block_size=self.block, kernel_size=self.k,
                                     group_size=self.g, residual=F.cast(residual, "float32"))
        return F.cast(y, residual.dtype)


class DFlash2DrafterLayer(api.Module):
    def __init__(self, config, i):
        super().__init__()
        d, m = config.dflash2, config.mapping
        h, dt, eps, bs = d["hidden_size"], config.dtype, d["rms_norm_eps"], d["block_size"]
        self.window = d["sliding_window"] if d["layer_types"][i] == "sliding_attention" else None
        self.input_layernorm = api.layers.RmsNorm(h, eps=eps, dtype=dt)
        self.attention = QKNormAttention(hidden_size=h, num_heads=d["num_attention_heads"],
                                         num_kv_heads=d["num_key_value_heads"], head_dim=d["head_dim"], eps=eps,
                                         rope_base=d["rope_theta"], rotary_dim=d["head_dim"],
                                         layer_idx=num_kv_layers_of(config) + i * drafter_kv_split(config),
                                         dtype=dt, mapping=m, kv_split=drafter_kv_split(config),
                                         max_positions=rope_positions(config))
        self.post_layernorm = api.layers.RmsNorm(h, eps=eps, dtype=dt)
        self.mlp = GatedMLP(h, d["intermediate_size"], dt, m)
        self.attention_conv = DynamicConv(h, d["conv_kernel_size"], d["conv_group_size"], bs, dt)
        self.mlp_conv = DynamicConv(h, d["conv_kernel_size"], d["conv_group_size"], bs, dt)

    def forward(self, x, attention_params, kv_cache_params, spec_decoding_params, *, mask_type):
        h, post = self.attention_conv.prepare(self.input_layernorm(x))
        h = self.attention(h, attention_params, kv_cache_params, spec_decoding_params, mask_type=mask_type)
        x = self.attention_conv.finish(h, post, x)
        h, post = self.mlp_conv.prepare(self.post_layernorm(x))
        return self.mlp_conv.finish(self.mlp(h), post, x)

    def commit(self, ctx, attention_params, kv_cache_params, spec_decoding_params):
        """Write the context K/V of ``ctx`` (fc(taps) of this step's tokens) into this layer's KV slots. The
        attention output is discarded: on TensorRT-LLM this is a KV write done by a full attention call
        (the price of using the stock plugin; a KV-write plugin would skip the attention math)."""
        return self.attention(ctx, attention_params, kv_cache_params, spec_decoding_params,
                              mask_type=api.AttentionMaskType.causal)


class DFlash2Drafter(api.Module):
    """The drafter under the checkpoint prefix ``dflash2.`` (no embedding, no LM head of its own)."""

    def __init__(self, config):
        super().__init__()
        d, m, dt = config.dflash2, config.mapping, config.dtype
        h = d["hidden_size"]
        self.fc = api.layers.ColumnLinear(len(d["target_layer_ids"]) * d["target_hidden_size"], h, bias=False,
                                          dtype=dt, tp_group=m.tp_group, tp_size=m.tp_size, gather_output=True)
        self.hidden_norm = api.layers.RmsNorm(h, eps=d["rms_norm_eps"], dtype=dt)
        self.layers = api.ModuleList(DFlash2DrafterLayer(config, i) for i in range(d["num_hidden_layers"]))
        self.norm = api.layers.RmsNorm(h, eps=d["rms_norm_eps"], dtype=dt)
        self.selector = DFlash2Selector(h, d["vocab_size"], d["selector_rank"], dt)
        self.K, self.hidden = d["block_size"] - 1, h
        self.mask_token_id, self.input_embedding_scale = d["mask_token_id"], d["input_embedding_scale"]
        self.is_causal, self.target_layer_ids = d["is_causal"], list(d["target_layer_ids"])

    def draft_hidden(self, anchor, vocab_embedding, attention_params, kv_cache_params, spec_decoding_params,
                     host_gen_request_types, is_gen, bs):
        """The draft block [anchor, MASK x K] of every request through the drafter layers and the final norm:
        hidden states of draft positions 1..K, ``[bs, K, hidden]``. The block embeds through the target's table
        (``vocab_embedding``; the drafter has none of its own)."""
        K, h = self.K, self.hidden
        mask_col = F.expand(F.constant(np.full((1, 1), self.mask_token_id, np.int32)), dims(bs, K))
        block = F.concat([F.unsqueeze(anchor, 1), mask_col], dim=1)                # [bs, K+1]
        x = vocab_embedding(F.view(block, dims(bs * (K + 1))))
        if self.input_embedding_scale is not None:
            x = x * self.input_embedding_scale
        draft_att, draft_kv, draft_spec = draft_attention_params(attention_params, kv_cache_params,
                                                                 spec_decoding_params, host_gen_request_types,
                                                                 is_gen, bs, K, self.is_causal)
        # every request of the draft pass is a generation request, whose visibility among the block's tokens is the
        # packed mask (all ones for a bidirectional block: draft_attention_params); the plugin's mask_type stays
        # causal, the only one XQA, the kernel of those calls, takes (engine/trtllm/facts/xqa_spec_decoding.yaml)
        for layer in self.layers:
            x = layer(x, draft_att, draft_kv, draft_spec, mask_type=api.AttentionMaskType.causal)
        hid = F.view(self.norm(x), dims(bs, K + 1, h))
        return F.slice(hid, [0, 1, 0], dims(bs, K, h))                              # draft positions 1..K

    def commit(self, layer_outs, attention_params, kv_cache_params, spec_decoding_params) -> list:
        """fc(taps) of every token of the step (the target's outputs at ``target_layer_ids``) -> each drafter
        layer's K/V written to its pool slots at the tokens' positions. Returns the layers' outputs, which exist
        for their writes only (the caller keeps them alive: :func:`.common.keep_alive`)."""
        taps = F.concat([layer_outs[i] for i in self.target_layer_ids], dim=1)
        ctx = self.hidden_norm(self.fc(taps))
        return [layer.commit(ctx, attention_params, kv_cache_params, spec_decoding_params) for layer in self.layers]


def draft_attention_params(att, kvp, spec, host_gen_types, is_gen, bs, K, is_causal):
    """Attention parameters of the draft block: every request as a generation request (host request types
    from ``host_gen_eagle_net_request_types``) with K+1 new tokens after its committed tokens — a generation
    request at its committed length, a context request after its chunk: exactly the stock
    ``host_past_key_value_lengths`` of both kinds (runtimeBuffers.cpp) — bidirectional (or causal) mask,
    offsets 0..K (device inputs made in the graph: allowed); every host input is the runtime's own (the
    plugin reads those on the host), the drafter layers' windows included (their entries of the runtime's
    per-layer host_max_attention_window_sizes)."""
    seq = F.where(is_gen, att.sequence_length, att.sequence_length + (K + 1))
    draft_att = AttentionParams(sequence_length=seq, context_lengths=att.context_lengths,
                                host_context_lengths=att.host_context_lengths, max_context_length=att.max_context_length,
                                host_request_types=host_gen_types, host_runtime_perf_knobs=att.host_runtime_perf_knobs,
                                host_context_progress=att.host_context_progress)
    draft_kv = kvp
    full = np.ones((K + 1, K + 1), bool) if not is_causal else np.tril(np.ones((K + 1, K + 1), bool))
    words = np.zeros((K + 1, (K + 32) // 32), np.int64)
    for c in range(K + 1):
        words[:, c // 32] |= full[:, c].astype(np.int64) << (c % 32)
    words = np.where(words >= 2**31, words - 2**32, words).astype(np.int32)
    draft_spec = SpecDecodingParams(
        spec_decoding_is_generation_length_variable=True, spec_decoding_max_generation_length=K + 1,
        spec_decoding_generation_lengths=F.expand(F.constant(np.full(1, K + 1, np.int32)), dims(bs)),
        spec_decoding_position_offsets=F.expand(F.constant(np.arange(K + 1, dtype=np.int32)[None]),
                                                dims(bs, K + 1)),
        spec_decoding_packed_mask=F.view(F.expand(F.constant(words[None]), dims(bs, K + 1, (K + 32) // 32)),
                                         dims(bs * (K + 1), (K + 32) // 32)),
        # the plugin reads spec_decoding_use on the host: the runtime's own input (1 in a step with generation
        # requests; in a context-only step the draft blocks are discarded, see the runtime doc)
        spec_decoding_use=spec.spec_decoding_use)
    return draft_att, draft_kv, draft_spec
