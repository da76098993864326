"""Typed, validated config of a DFlash2 drafter (``architectures: ["DFlash2DraftModel"]``).

All translation of the HF ``config.json`` lives in :meth:`DFlash2Config.from_hugging_face`.
Fields and their effect on the numerics (published checkpoints that motivate each in brackets):

==========================  ==========================================================================
field                       effect
==========================  ==========================================================================
block_size                  tokens per draft block = 1 anchor + (block_size-1) MASK positions; the
                            engine's max_draft_len is block_size-1 [Qwen3.8: 8, Muse Glimmer: 16].
                            2 .. max_position_embeddings - 1 (the block follows >= 1 prompt token;
                            the target's limit is checked where the pair runs); engines: <= 16
mask_token_id               id embedded (with the TARGET embedding) at positions 1..block_size-1
target_layer_ids            target decoder layers whose OUTPUT (HF hidden_states[id+1]) is tapped,
                            concatenated in the LISTED order and fed to ``fc``: tap j fills ``fc``
                            input columns [j*H, (j+1)*H). Any order is legal (unsorted lists are
                            honoured as written, like transformers and NeMo read them; never
                            sorted); ids must be distinct and < num_target_layers. A wrong order
                            does not crash, it silently ruins acceptance [both: 5 taps, ascending]
num_target_layers           number of decoder layers of the target the drafter was trained on
conv_kernel_size            taps of the dynamic conv (2 in every published drafter); <= block_size
conv_group_size             channels sharing one dynamic correction; must divide hidden_size [16]
selector_rank               R of the pairwise selector codebooks [256]
selector_top_k              candidates kept per draft position [16]
output_multiplier           unary logits *= m before the softcap [Muse Glimmer only]
final_logit_softcapping     unary logits = cap * tanh(logits / cap) [Muse Glimmer only]
input_embedding_scale       block embeddings *= s (read by public engines; absent in both drafters)
is_causal                   false in both drafters: the block attends bidirectionally; true would
                            mean a causal mask inside the block
layer_types/sliding_window  per layer, ``sliding_attention`` limits context keys to the last
                            ``sliding_window`` positions [both: all sliding, window 2048]
rope_parameters             RoPE base (``rope_type: default`` only) [1e7 / 5e5]; a scaled RoPE
                            (``rope_type``/``type`` other than default, here or in ``rope_scaling``)
                            is a ConfigError, for the target too
rms_norm_eps                every RMSNorm of the drafter [1e-6 / 1e-5]
quantization_config         refused: quantized checkpoints are not supported (drafter and target)
eos/pad/bos_token_id        null, an id or a list of ids; eos and pad must lie in [0, vocab_size)
use_cache, initializer_..   standard HF fields: not used, but type-checked (``"false"`` is not false)
==========================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigError
from ._fields import (Fields, check_hf_fields, load_config_dict, parse_attention_dims, parse_layer_types, parse_rope,
                      reject_quantization)
from .build import MAX_BLOCK_SIZE as ENGINE_MAX_BLOCK_SIZE

ARCHITECTURE = "DFlash2DraftModel"
LAYER_TYPES = ("sliding_attention", "full_attention")
MAX_CONV_KERNEL_SIZE = 4
# The fields that change the drafter's numbers (shown by inspect, recorded in converted checkpoints).
NUMERICS_FIELDS = (
    "block_size", "mask_token_id", "target_layer_ids", "num_target_layers", "conv_kernel_size",
    "conv_group_size", "selector_rank", "selector_top_k", "output_multiplier",
    "final_logit_softcapping", "input_embedding_scale", "is_causal", "layer_types", "sliding_window",
    "rope_theta", "rope_type", "rms_norm_eps", "hidden_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "dtype",
)


def max_block_size(max_position_embeddings: int) -> int:
    """The longest block a model with ``max_position_embeddings`` positions can run: the anchor follows at least
    one prompt token (position >= 1), and the block's positions anchor .. anchor + block_size - 1 must exist.
    (The PyTorch reference takes any such block; engines are limited further, to ENGINE_MAX_BLOCK_SIZE.)"""
    return max_position_embeddings - 1


def _too_long(block_size: int, max_position_embeddings: int) -> str:
    return (f"must be at most {max_block_size(max_position_embeddings)}, got {block_size}: a block of "
            f"{block_size} positions after at least one prompt token does not fit in max_position_embeddings="
            f"{max_position_embeddings} (engines take at most {ENGINE_MAX_BLOCK_SIZE})")


_DFLASH_KEYS = {
    "block_size", "mask_token_id", "target_layer_ids", "conv_kernel_size", "conv_group_size",
    "selector_rank", "selector_top_k", "output_multiplier", "final_logit_softcapping",
    "input_embedding_scale",
}
# Top-level keys that carry no numerics for the drafter (tokenizer ids, training knobs, HF bookkeeping).
_IGNORED_KEYS = {
    "architectures", "model_type", "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id",
    "initializer_range", "use_cache", "attention_dropout", "tie_word_embeddings", "max_window_layers",
    "use_sliding_window", "auto_map", "_name_or_path", "torch_dtype", "dtype",
}


@dataclass(frozen=True)
class DFlash2Config:
    # Qwen3 backbone
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rope_type: str
    layer_types: tuple[str, ...]
    sliding_window: int | None
    is_causal: bool
    dtype: str
    num_target_layers: int
    # dflash_config
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    output_multiplier: float | None = None
    final_logit_softcapping: float | None = None
    input_embedding_scale: float | None = None
    # bookkeeping
    eos_token_id: int | None = None
    source: str = "<dict>"
    ignored_keys: tuple[str, ...] = field(default=(), compare=False)

    # ---- derived -------------------------------------------------------------------------
    @property
    def num_taps(self) -> int:
        """Number of target hidden states concatenated into ``fc``."""
        return len(self.target_layer_ids)

    @property
    def max_draft_len(self) -> int:
        return self.block_size - 1

    @property
    def conv_num_groups(self) -> int:
        return self.hidden_size // self.conv_group_size

    @property
    def kernel_projection_out(self) -> int:
        """Rows of ``kernel_projection.weight``: pre and post side x taps x groups."""
        return 2 * self.conv_kernel_size * self.conv_num_groups

    def layer_window(self, layer: int) -> int | None:
        """Sliding window (context keys kept) of drafter layer ``layer``; None for full attention."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    def numerics(self) -> dict[str, Any]:
        """The fields that change the drafter's numbers, for display and checkpoint metadata."""
        keys = NUMERICS_FIELDS
        out = {k: getattr(self, k) for k in keys}
        for k, v in out.items():
            if isinstance(v, tuple):
                out[k] = list(v)
        return out

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_hugging_face(cls, path_or_dict: str | Path | Mapping[str, Any]) -> "DFlash2Config":
        data, source = load_config_dict(path_or_dict)
        f = Fields(data, source)

        archs = f.raw("architectures", None)
        if archs is not None and (not isinstance(archs, list) or ARCHITECTURE not in archs):
            raise f.error("architectures", f"expected [{ARCHITECTURE!r}] for a DFlash2 drafter, got {archs!r}")
        model_type = f.str("model_type", "qwen3")
        if model_type != "qwen3":
            raise f.error("model_type", f"DFlash2 drafters have a Qwen3 backbone ('qwen3'), got {model_type!r}")
        hidden_act = f.str("hidden_act", "silu")
        if hidden_act != "silu":
            raise f.error("hidden_act", f"only 'silu' is supported, got {hidden_act!r}")
        if f.bool("attention_bias", False):
            raise f.error("attention_bias", "DFlash2 drafters have no attention biases; true is not supported")

        reject_quantization(f)
        hidden, layers, heads, kv_heads, head_dim, vocab = parse_attention_dims(f)
        check_hf_fields(f, vocab)
        theta, rope_type, partial = parse_rope(f)
        if partial != 1.0:
            raise f.error("partial_rotary_factor", f"DFlash2 drafters use full RoPE, got {partial}")

        layer_types = f.raw("layer_types", None)
        if layer_types is None:
            # Qwen3 rule: sliding from layer max_window_layers on, when use_sliding_window.
            use_sw = f.bool("use_sliding_window", False)
            first = f.int("max_window_layers", layers, min=0)
            layer_types = ["sliding_attention" if use_sw and i >= first else "full_attention" for i in range(layers)]
        if f.data.get("use_sliding_window") is False and isinstance(layer_types, list) \
                and "sliding_attention" in layer_types:
            raise f.error("use_sliding_window", "is false but layer_types lists sliding_attention layers (contradictory)")
        layer_types, sliding_window = parse_layer_types(f, layer_types, layers, LAYER_TYPES)

        is_causal = f.bool("is_causal", False)
        num_target_layers = f.int("num_target_layers", min=1)

        dc = f.raw("dflash_config")
        if not isinstance(dc, dict):
            raise f.error("dflash_config", f"expected an object, got {dc!r}")
        d = Fields(dc, source, prefix="dflash_config.")
        unknown = sorted(set(dc) - _DFLASH_KEYS)
        if unknown:
            raise d.error(unknown[0], f"unknown key(s) {unknown}; known: {sorted(_DFLASH_KEYS)}")
        block_size = d.int("block_size")
        if block_size < 2:
            raise d.error("block_size", f"must be >= 2 (one anchor and at least one draft position), got {block_size}")
        max_positions = f.int("max_position_embeddings", 32768, min=1)
        if block_size > max_block_size(max_positions):
            raise d.error("block_size", _too_long(block_size, max_positions))
        mask = d.int("mask_token_id")
        if not 0 <= mask < vocab:
            raise d.error("mask_token_id", f"{mask} is outside the vocabulary [0, {vocab})")
        ids = d.int_list("target_layer_ids")
        if not ids:
            raise d.error("target_layer_ids", "must name at least one target layer")
        for i in ids:
            if not 0 <= i < num_target_layers:
                raise d.error("target_layer_ids", f"layer id {i} out of range [0, {num_target_layers}) (num_target_layers)")
        if len(set(ids)) != len(ids):
            raise d.error("target_layer_ids", f"duplicate layer ids in {list(ids)}")
        conv_k = d.int("conv_kernel_size")
        if not 1 <= conv_k <= min(block_size, MAX_CONV_KERNEL_SIZE):
            raise d.error("conv_kernel_size", f"must be in [1, min(block_size, {MAX_CONV_KERNEL_SIZE})], got {conv_k}")
        group = d.int("conv_group_size", min=1)
        if hidden % group:
            raise d.error("conv_group_size", f"{group} does not divide hidden_size={hidden}")
        rank = d.int("selector_rank", min=1)
        top_k = d.int("selector_top_k", min=1)
        if top_k > vocab:
            raise d.error("selector_top_k", f"{top_k} is larger than vocab_size={vocab}")
        mult = d.float("output_multiplier", None, positive=True)
        cap = d.float("final_logit_softcapping", None, positive=True)
        emb_scale = d.float("input_embedding_scale", None, positive=True)
        if emb_scale is None and f.has("input_embedding_scale"):
            emb_scale = f.float("input_embedding_scale", positive=True)

        eos = f.raw("eos_token_id", None)
        eos = eos if isinstance(eos, int) and not isinstance(eos, bool) else None
        dtype = f.dtype()
        known = _IGNORED_KEYS | {
            "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "rms_norm_eps", "vocab_size", "max_position_embeddings", "layer_types",
            "sliding_window", "is_causal", "num_target_layers", "dflash_config", "hidden_act", "attention_bias",
            "rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor", "input_embedding_scale",
        }
        return cls(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=f.int("intermediate_size", min=1),
            rms_norm_eps=f.float("rms_norm_eps", 1e-6, positive=True),
            vocab_size=vocab,
            max_position_embeddings=max_positions,
            rope_theta=theta,
            rope_type=rope_type,
            layer_types=layer_types,
            sliding_window=sliding_window,
            is_causal=is_causal,
            dtype=dtype,
            num_target_layers=num_target_layers,
            block_size=block_size,
            mask_token_id=mask,
            target_layer_ids=ids,
            conv_kernel_size=conv_k,
            conv_group_size=group,
            selector_rank=rank,
            selector_top_k=top_k,
            output_multiplier=mult,
            final_logit_softcapping=cap,
            input_embedding_scale=emb_scale,
            eos_token_id=eos,
            source=source,
            ignored_keys=f.unknown(known),
        )

    def with_block_size(self, block_size: int) -> "DFlash2Config":
        """A copy with another block size (the drafter's weights do not depend on it)."""
        from dataclasses import replace

        # the value is the option's (--block-size), not the config file's: the error names the option
        if block_size < 2:
            raise ConfigError(f"must be >= 2, got {block_size} (the drafter's config has {self.block_size})",
                              field="--block-size")
        if block_size > max_block_size(self.max_position_embeddings):
            raise ConfigError(f"{_too_long(block_size, self.max_position_embeddings)} ({self.source})",
                              field="--block-size")
        if self.conv_kernel_size > block_size:
            raise ConfigError(f"{block_size} is smaller than the drafter's conv_kernel_size={self.conv_kernel_size} "
                              f"({self.source})", field="--block-size")
        return replace(self, block_size=block_size)
