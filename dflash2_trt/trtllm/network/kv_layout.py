"""The paged KV pool's layout, the per-layer attention windows, and the rotary tables.

KV layout: the drafter layers are KV layers ``num_hidden_layers + i`` of the target's paged pool
(``layer_idx_offset``, as TensorRT-LLM's EAGLE drafter layers). Every layer of the pool has ONE
per-token size (docs/TRTLLM-ENGINE.md §3), so the drafter's ``num_key_value_heads * head_dim`` must
equal the target's; :func:`check_kv_compatible` refuses other pairs (Qwen3.8-27B: 4 x 256 target,
8 x 128 drafter — 1024 values both: compatible only once the drafter's slot is read as 8 x 128,
which needs the per-layer head count the pool does not have; that pair is the hybrid issue's).
A drafter whose K/V per token and rank is a whole multiple of the target's spreads its KV heads over that
many consecutive pool layers (:func:`drafter_kv_split`).

Attention windows and every other host input of an attention call come from the runtime: the GPTAttention
plugin dereferences ``host_*`` inputs (and ``spec_decoding_use``) on the host, and a tensor made in the graph
lives in device memory, so none can be a constant. The drafter's and Muse Glimmer's sliding windows are
therefore entries of the runtime's per-layer ``host_max_attention_window_sizes`` (:func:`kv_layer_windows`;
TensorRT-LLM: the executor's ``max_attention_window`` list). A window that differs between layers makes the
model "variable window", which TensorRT-LLM 1.2's EAGLE KV rewind refuses (docs/TRTLLM-ENGINE.md §3): on
TensorRT-LLM build dense targets with ``drafter_window: full`` (lossless; acceptance past the window only:
``scripts/bench_engine.py`` measured mean acceptance 3.35 with the window vs 2.62 without on the tiny pair,
window 16). The CPU and cuda runtimes apply the windows as a mask in every step, as the model does. TensorRT-LLM's
plugin applies a window below the capacity in context steps but not in speculative-decoding generation steps
(``engine/trtllm/facts/attention_window.yaml``, read, not run), so where a target's window can bind its sliding
layers take each step's new tokens as a context chunk (:func:`sliding_context`), a drafter's is refused
(``engine/trtllm/windows.py``), and a window that cannot bind is passed as max_seq_len: then every layer has the
same window and the model is not variable-window (Muse Glimmer at max_seq_len 2018).
"""

from __future__ import annotations

import numpy as np

from .common import local_heads


def check_kv_compatible(config) -> None:
    """Every layer of the paged pool holds one size per token (docs/TRTLLM-ENGINE.md §3): a drafter layer fits when its
    K/V values per token ON EACH RANK equal the target's (KV heads duplicated when fewer than ranks); its own head
    split may differ (Qwen3.8-27B: target 4 x 256, drafter 8 x 128 = 1024 both at tp 1..4; at tp 8 the target's
    duplicated 1 x 256 meets the drafter's 1 x 128 and the pair does not fit)."""
    d, tp = config.dflash2, config.mapping.tp_size
    t_tok = local_heads(config.num_key_value_heads, tp) * config.head_size
    d_tok = local_heads(d["num_key_value_heads"], tp) * d["head_dim"]
    split = d_tok // t_tok if t_tok and d_tok % t_tok == 0 else 0
    if split >= 1 and local_heads(d["num_key_value_heads"], tp) % split == 0 and \
            (d["num_attention_heads"] // tp) % split == 0:
        return   # the drafter's heads fill `split` pool layers exactly (drafter_kv_split)
    if t_tok != d_tok:
        raise ValueError(
            f"drafter KV {d['num_key_value_heads']} x {d['head_dim']} ({d_tok} values per token per rank at tp {tp}) "
            f"does not fit the target's pool layout {config.num_key_value_heads} x {config.head_size} ({t_tok}); "
            f"every pool layer has one size per token (docs/TRTLLM-ENGINE.md §3)")


def hf_layer_types(config) -> list:
    """The target's per-layer kinds in the checkpoint's (HF) names. An engine config written for TensorRT-LLM's
    runtime carries ``layer_types`` in the runtime's own names (attention / recurrent, which gptJsonConfig.cpp
    reads to size the KV pool) and the HF names as ``hf_layer_types``."""
    return list(getattr(config, "hf_layer_types", None) or config.layer_types)


def drafter_kv_split(config) -> int:
    """Pool layers per drafter layer: 1 when the drafter's K/V per token and rank equal the target's; m when they
    are m times wider (Muse Glimmer 30B: drafter 8 x 128 in a 2 x 128 target pool, m = 4 at tp 1), the drafter's
    KV heads then spread over m consecutive pool layers (check_kv_compatible allows exactly these)."""
    d, tp = config.dflash2, config.mapping.tp_size
    t_tok = local_heads(config.num_key_value_heads, tp) * config.head_size
    d_tok = local_heads(d["num_key_value_heads"], tp) * d["head_dim"]
    return max(1, d_tok // t_tok)


def total_kv_layers(config) -> int:
    """Layers of the paged pool: the target's attention layers, then the drafter layers (x their split)."""
    return num_kv_layers_of(config) + int(config.dflash2["num_hidden_layers"]) * drafter_kv_split(config)


def num_kv_layers_of(config) -> int:
    """Target layers with a KV cache (attention layers; Gated DeltaNet layers keep recurrent state instead)."""
    return sum(1 for t in hf_layer_types(config) if t != "linear_attention")


def kv_layer_windows(config, drafter_window: str, max_seq_len: int) -> list[int]:
    """The per-KV-layer attention window the runtime passes in host_max_attention_window_sizes (TensorRT-LLM:
    the executor's KvCacheConfig.max_attention_window, one entry per layer): max_seq_len for full-attention
    layers, the target's sliding window for its sliding layers (Muse Glimmer), the drafter's own window for its
    layers when ``drafter_window == "model"``. More than one value makes a variable-window model, which
    TensorRT-LLM 1.2's KV rewind for EAGLE refuses (docs/TRTLLM-ENGINE.md §3): the plan says so."""
    cap = int(max_seq_len)
    kinds = [t for t in hf_layer_types(config) if t != "linear_attention"]
    sw = getattr(config, "sliding_window", None)
    # a window at or above max_seq_len cannot bind (the runtime keeps every position below it): it is passed as
    # max_seq_len, the pool's capacity, so the plugin sees no sliding-window layer there and the windows stay uniform
    # (engine/trtllm/facts/attention_window.yaml rule.window_passed)
    out = [min(int(sw), cap) if (t == "sliding_attention" and sw) else cap for t in kinds]
    d = config.dflash2
    for i in range(int(d["num_hidden_layers"])):
        w = d.get("sliding_window") if d["layer_types"][i] == "sliding_attention" else None
        w = min(int(w), cap) if (w and drafter_window == "model") else cap
        out += [w] * drafter_kv_split(config)
    return out


def sliding_context(config) -> bool:
    """The target's sliding-window layers take the context route (``dflash2_engine.sliding_path: context``, resolved
    by the build: engine/pretrained.py resolve_sliding_path): the engine declares the second set of request inputs
    (:class:`.common.SlidingParams`) and those layers attend with it."""
    eng = getattr(config, "dflash2_engine", None) or {}
    return (eng.get("sliding_path") == "context" and bool(getattr(config, "sliding_window", None))
            and "sliding_attention" in hf_layer_types(config))


def rope_positions(config) -> int:
    """Positions of the rotary tables: the engine's max_seq_len plus one draft block (a context request's block
    sits right after its chunk)."""
    eng = getattr(config, "dflash2_engine", None) or {}
    return int(eng.get("max_seq_len", config.max_position_embeddings)) + int(config.dflash2["block_size"])


_ROPE_CACHE: dict = {}


def rope_tables(num_pos: int, dim: int, base: float):
    """(inv_freq [dim/2], cos_sin [1, num_pos * dim]) fp32 as the GPTAttention plugin takes them: the layout of
    TensorRT-LLM's RopeEmbeddingUtils.create_sinusoidal_positions_for_attention_plugin (scale 1, no scaling type):
    inv = 1 / fp32(base^(arange(0, dim, 2) / dim)) (the power in float64 rounded to fp32, the division in fp32);
    angles pos * inv in fp32; float2 (cos, sin) per position and frequency."""
    key = (int(num_pos), int(dim), float(base))
    if key not in _ROPE_CACHE:
        inv = np.float32(1.0) / (base ** (np.arange(0, dim, 2) / dim)).astype(np.float32)
        ang = np.einsum("i,j->ij", np.arange(num_pos, dtype=np.float32), inv, dtype=np.float32)[..., None]
        cos_sin = np.concatenate((np.cos(ang), np.sin(ang)), axis=-1).reshape(1, -1).astype(np.float32)
        _ROPE_CACHE[key] = (inv, cos_sin)
    return _ROPE_CACHE[key]
