"""The dense Qwen3 target (``qwen_type: qwen3``; checkpoint names: ``convert/qwen3.py``), as TensorRT-LLM's
``models/qwen``: embedding, decoder layers (QK-norm attention + SwiGLU MLP, pre-norm), final norm."""

from __future__ import annotations

from ..common import api, layer_attention_params
from ..kv_layout import hf_layer_types, rope_positions
from ..layers import GatedMLP, QKNormAttention, vocab_embedding


class Qwen3DecoderLayer(api.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        h, dt, eps = config.hidden_size, config.dtype, config.norm_epsilon
        self.input_layernorm = api.layers.RmsNorm(h, eps=eps, dtype=dt)
        self.attention = QKNormAttention(hidden_size=h, num_heads=config.num_attention_heads,
                                         num_kv_heads=config.num_key_value_heads, head_dim=config.head_size, eps=eps,
                                         rope_base=config.rotary_base, rotary_dim=config.rotary_dim,
                                         layer_idx=layer_idx, dtype=dt, mapping=config.mapping,
                                         max_positions=rope_positions(config))
        self.post_layernorm = api.layers.RmsNorm(h, eps=eps, dtype=dt)
        self.mlp = GatedMLP(h, config.intermediate_size, dt, config.mapping)

    def forward(self, x, attention_params, kv_cache_params, spec_decoding_params):
        x = x + self.attention(self.input_layernorm(x), attention_params, kv_cache_params, spec_decoding_params,
                               mask_type=api.AttentionMaskType.causal)
        return x + self.mlp(self.post_layernorm(x))


class Qwen3Transformer(api.Module):
    """Dense Qwen3 target (``qwen_type: qwen3``). Returns every layer's output for the taps."""

    def __init__(self, config):
        super().__init__()
        self.vocab_embedding = vocab_embedding(config)
        self.layer_kinds = hf_layer_types(config)
        self.layers = api.ModuleList(Qwen3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = api.layers.RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)

    def forward(self, input_ids, attention_params, kv_cache_params, spec_decoding_params, sliding_params=None):
        """``sliding_params``: the context route's second set of request inputs, which the sliding-window layers attend
        with (:func:`.common.layer_attention_params`); None: every layer takes the step's own."""
        x = self.vocab_embedding(input_ids)
        outs = []
        for kind, layer in zip(self.layer_kinds, self.layers, strict=True):
            att, kvp = layer_attention_params(kind, attention_params, kv_cache_params, sliding_params)
            x = layer(x, att, kvp, spec_decoding_params)
            outs.append(x)
        return self.ln_f(x), outs
