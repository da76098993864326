"""What every module of the network shares: the backend's TensorRT-LLM names, the engine-parameter dataclasses,
small graph utilities.

``api`` is the namespace :func:`dflash2_trt.trtllm.backend.current` returns while the package is being loaded
(TensorRT-LLM 1.2 itself, or the CPU stand-in): ``load_network(backend)`` imports the package once per backend,
so each backend's instance of this module holds that backend's names. ``F`` is its ``functional``.

The parameter dataclasses group the engine inputs the way TensorRT-LLM's own models pass them
(``tensorrt_llm.layers.attention.KeyValueCacheParams`` / ``AttentionParams`` / ``SpecDecodingParams``, and the
recurrent-state inputs of RecurrentGemma / Mamba): the network declares them in :mod:`.io` and passes them down
unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dflash2_trt.trtllm import backend

api = backend.current()
F = api.functional


@dataclass
class KeyValueCacheParams:
    host_past_key_value_lengths: object = None
    host_max_attention_window_sizes: object = None
    host_sink_token_length: object = None
    kv_cache_block_offsets: object = None
    host_kv_cache_block_offsets: object = None
    host_kv_cache_pool_pointers: object = None
    host_kv_cache_pool_mapping: object = None
    cache_indirection: object = None


@dataclass
class AttentionParams:
    sequence_length: object = None
    context_lengths: object = None
    host_context_lengths: object = None
    max_context_length: int | None = None
    host_request_types: object = None
    host_runtime_perf_knobs: object = None
    host_context_progress: object = None


@dataclass
class SpecDecodingParams:
    spec_decoding_is_generation_length_variable: bool = True
    spec_decoding_max_generation_length: int = 1
    spec_decoding_generation_lengths: object = None
    spec_decoding_position_offsets: object = None
    spec_decoding_packed_mask: object = None
    spec_decoding_use: object = None


@dataclass
class RecurrentStateParams:
    """TensorRT-LLM's recurrent-state inputs (``rnn_state_ptr_<L>``, ``conv_state_ptr_<L>``, ``slot_mapping``), plus
    the packed request boundaries the plugin reads."""
    slot_mapping: object = None
    rnn_state_ptr: dict = None
    conv_state_ptr: dict = None
    host_request_types: object = None
    cu_seqlens: object = None
    zero_state: object = None   # [bs] int32: a context request whose chunk starts at 0 starts from zero state


@dataclass
class SlidingParams:
    """The second set of request inputs of an engine whose target's sliding-window layers take the context route
    (``dflash2_engine.sliding_path: context``; engine_io.yaml): every request of the step as a context request whose
    chunk is its new tokens (a generation request's K + 1 verify tokens, a causal chain), after its committed tokens.
    TensorRT-LLM's attention plugin applies a layer's window in such a context part, not in a speculative-decoding
    generation part (engine/trtllm/facts/attention_window.yaml context_route)."""
    host_request_types: object = None            # all 0 (context)
    context_lengths: object = None               # the request's new tokens this step (device)
    host_context_lengths: object = None          # the same, host
    host_past_key_value_lengths: object = None   # committed + new = sequence_length (the stock context value)

    def apply(self, att: AttentionParams, kvp: KeyValueCacheParams) -> tuple[AttentionParams, KeyValueCacheParams]:
        """``(att, kvp)`` of a sliding layer: the step's own, with the four request inputs replaced."""
        return (replace(att, host_request_types=self.host_request_types, context_lengths=self.context_lengths,
                        host_context_lengths=self.host_context_lengths),
                replace(kvp, host_past_key_value_lengths=self.host_past_key_value_lengths))


def layer_attention_params(layer_kind: str, att, kvp, sliding: SlidingParams | None):
    """The attention and KV-cache parameters of a target layer of HF kind ``layer_kind``: the step's, or on the context
    route (``sliding`` given) a sliding-window layer's second set."""
    if sliding is not None and layer_kind == "sliding_attention":
        return sliding.apply(att, kvp)
    return att, kvp


def local_heads(n: int, tp: int) -> int:
    """Heads one rank holds (KV heads are duplicated when fewer than ranks, as convert does)."""
    return n // tp if n >= tp else 1


def dims(*xs):
    """A shape tensor from ints and 0-D shape Tensors (TensorRT-LLM takes a list of ints OR a Tensor)."""
    return F.concat(list(xs))


def op_le(a, b):
    return F.op_or(F.lt(a, b), F.eq(a, b))


def logit_transform(logits, multiplier, softcap):
    """A model's own logit transform, in this order: ``* multiplier``, then ``tanh(x / softcap) * softcap`` (each
    skipped when None): the drafter's ``output_multiplier`` / ``final_logit_softcapping`` on its unary scores, and
    the target's (Muse Glimmer) on its logits."""
    if multiplier is not None:
        logits = logits * float(multiplier)
    if softcap is not None:
        cap = float(softcap)
        logits = F.tanh(logits * (1.0 / cap)) * cap
    return logits


def keep_alive(count, counts=(), values=()):
    """``count`` (int32, every element at least 1: num_accepted_tokens) unchanged, made to depend on every tensor of
    ``counts`` (int32) and ``values`` (floating): TensorRT removes a layer no output depends on, and the commits exist
    for what they write. Each takes part through a maximum with something at most 1 by construction: an int32
    tensor's first element capped at 1, a floating tensor's first element compared with itself (1, or 0 for a NaN),
    cast. A builder cannot fold that without knowing its operands' ranges. The form before, ``x * 0`` added, is folded
    by TensorRT-RTX's Myelin with the layers behind it (tests/trtllm/test_conformance.py builds both)."""
    def first(t):
        return F.slice(F.view(t, [-1]), [0], [1])

    for t in counts:
        count = F.maximum(count, F.minimum(first(t), 1))
    for t in values:
        count = F.maximum(count, F.cast(F.eq(first(t), first(t)), "int32"))
    return count
