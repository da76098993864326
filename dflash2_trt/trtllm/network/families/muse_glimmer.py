"""The Muse Glimmer target (``qwen_type: muse_glimmer``; checkpoint names: ``convert/muse_glimmer.py``):
Gemma-2 sandwich norms, gated attention with a weight-less q/k norm, NoPE full-attention layers and
sliding-window layers, an RMSNorm after the embedding lookup."""

from __future__ import annotations

from ..common import F, api, layer_attention_params
from ..kv_layout import hf_layer_types, rope_positions
from ..layers import GatedMLP, OffsetRmsNorm, QKNormAttention, vocab_embedding


class MuseGlimmerDecoderLayer(api.Module):
    """Muse Glimmer's layer (names: convert/muse_glimmer.py): Gemma-2 sandwich norms, gated attention with a
    weight-less q/k norm and ``q_scaling = 1 / qk_scale_factor``, NoPE full-attention layers (rotary base 0),
    sliding-window layers (their window comes from the runtime's per-layer ``host_max_attention_window_sizes``)."""

    def __init__(self, config, layer_idx):
        super().__init__()
        h, dt, eps, off = config.hidden_size, config.dtype, config.norm_epsilon, config.layernorm_weight_offset
        peps = config.post_norm_epsilon
        self.input_layernorm = OffsetRmsNorm(h, eps, dt, off)
        self.attention = QKNormAttention(hidden_size=h, num_heads=config.num_attention_heads,
                                         num_kv_heads=config.num_key_value_heads, head_dim=config.head_size, eps=eps,
                                         rope_base=config.layer_rotary_base[layer_idx], rotary_dim=config.rotary_dim,
                                         layer_idx=layer_idx, dtype=dt, mapping=config.mapping, norm_offset=off,
                                         output_gate=bool(config.attn_output_gate),
                                         qk_norm_weight=bool(config.qk_layernorm_weight), q_scaling=config.q_scaling,
                                         max_positions=rope_positions(config))
        # Sliding-window layers get their window from the runtime's per-layer host_max_attention_window_sizes
        # (kv_layer_windows): the plugin reads it on the host, so it cannot be made in the graph.
        self.post_layernorm = OffsetRmsNorm(h, peps, dt, off)
        self.pre_feedforward_layernorm = OffsetRmsNorm(h, eps, dt, off)
        self.mlp = GatedMLP(h, config.intermediate_size, dt, config.mapping)
        self.post_feedforward_layernorm = OffsetRmsNorm(h, peps, dt, off)

    def forward(self, x, attention_params, kv_cache_params, spec_decoding_params):
        a = self.attention(self.input_layernorm(x), attention_params, kv_cache_params, spec_decoding_params,
                           mask_type=api.AttentionMaskType.causal)
        x = x + self.post_layernorm(a)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class MuseGlimmerTransformer(api.Module):
    """Muse Glimmer target (``qwen_type: muse_glimmer``). The target's lookup is followed by a weight-less
    RMSNorm (``embedding_norm``); the drafter embeds through the same table WITHOUT it (it calls
    ``vocab_embedding`` directly, as transformers' DFlash code bypasses ``embed_norm``)."""

    def __init__(self, config):
        super().__init__()
        self.eps, self.embedding_norm = config.norm_epsilon, bool(config.embedding_norm)
        self.vocab_embedding = vocab_embedding(config)
        self.layer_kinds = hf_layer_types(config)
        self.layers = api.ModuleList(MuseGlimmerDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = OffsetRmsNorm(config.hidden_size, config.norm_epsilon, config.dtype, config.ln_f_weight_offset)
        self.hidden = config.hidden_size

    def forward(self, input_ids, attention_params, kv_cache_params, spec_decoding_params, sliding_params=None):
        """``sliding_params``: the context route's second set of request inputs, which the sliding-window layers attend
        with (:func:`.common.layer_attention_params`); None: every layer takes the step's own."""
        x = self.vocab_embedding(input_ids)
        if self.embedding_norm:
            x = F.rms_norm(x, self.hidden, eps=self.eps)
        outs = []
        for kind, layer in zip(self.layer_kinds, self.layers, strict=True):
            att, kvp = layer_attention_params(kind, attention_params, kv_cache_params, sliding_params)
            x = layer(x, att, kvp, spec_decoding_params)
            outs.append(x)
        return self.ln_f(x), outs
