"""The combined DFlash2 engine: target + DFlash2 drafter + plugins + in-engine acceptance, ONE step.

This is the model class file ``trtllm-build --model_cls_file`` loads (``--model_cls_name
DFlash2ForCausalLM``), and the same file the CPU backend executes (:mod:`.backend`: every
TensorRT-LLM name comes from ``api``). It reads the checkpoint ``dflash2-trt convert`` writes
(names: ``dflash2_trt/convert/{qwen3,dflash2}.py``; config: ``convert/schema.py``).

One engine step for a batch packed as [context requests..., generation requests...]
(docs/architecture.md §3; the EAGLE one-engine contract of ``engine_io.yaml``)::

    draft     block [anchor, MASK x K] per request -> drafter layers (DFlash2DynamicConv around
              each sublayer, attention over the drafter's committed context K/V in the pool)
              -> norm -> target lm_head (positions 1..K) -> output transform -> top-k
              -> DFlash2PairwiseScan -> K drafts + proposal q
    verify    target over the request's tokens, drafts substituted at positions 1..K of every
              generation request (spec-decoding attention, chain mask from the runtime)
    accept    greedy prefix match (T = 0) or rejection sampling with q (T > 0), per request
    commit    fc(taps) of every token of the step -> each drafter layer's k/v -> written to the
              drafter layers' KV slots at the tokens' positions (the accepted ones are then
              committed by the runtime's ``seqLen += num_accepted_tokens``; the rest lie beyond
              the sequence and are overwritten by the next step, never read)
    outputs   accepted_tokens, num_accepted_tokens, accepted_paths = 0, next_draft_tokens
              (placeholders), next_draft_lens = K, next_draft_paths (the chain), logits

A context request (a whole prompt) gets its first token from the last prompt position and its
drafter context for every prompt position; its draft block is computed too (the graph is the same
for every request) but discarded: it is placed after the prompt, where the next step's block goes.

KV layout: the drafter layers are KV layers ``num_hidden_layers + i`` of the target's paged pool
(``layer_idx_offset``, as TensorRT-LLM's EAGLE drafter layers). Every layer of the pool has ONE
per-token size (docs/TRTLLM-ENGINE.md §3), so the drafter's ``num_key_value_heads * head_dim`` must
equal the target's; :func:`check_kv_compatible` refuses other pairs (Qwen3.8-27B: 4 x 256 target,
8 x 128 drafter — 1024 values both: compatible only once the drafter's slot is read as 8 x 128,
which needs the per-layer head count the pool does not have; that pair is the hybrid issue's).

Attention windows and every other host input of an attention call come from the runtime: the GPTAttention
plugin dereferences ``host_*`` inputs (and ``spec_decoding_use``) on the host, and a tensor made in the graph
lives in device memory, so none can be a constant. The drafter's and Muse Glimmer's sliding windows are
therefore entries of the runtime's per-layer ``host_max_attention_window_sizes`` (:func:`kv_layer_windows`;
TensorRT-LLM: the executor's ``max_attention_window`` list). A window that differs between layers makes the
model "variable window", which TensorRT-LLM 1.2's EAGLE KV rewind refuses (docs/TRTLLM-ENGINE.md §3): on
TensorRT-LLM build dense targets with ``drafter_window: full`` (lossless; acceptance past the window only:
``scripts/bench_engine.py`` measured mean acceptance 3.35 with the window vs 2.62 without on the tiny pair,
window 16), and a Muse Glimmer target needs that refusal relaxed, as the hybrid needs its own
(docs/hybrid-runtime.md). The CPU runtime applies the windows as a mask (its pool is not cyclic; on
TensorRT-LLM a window below the pool's capacity selects the plugin's cyclic addressing [I]).

Under TensorRT-LLM 1.2 (not run here; CPU-only machine). Expected to carry over unchanged: the
module tree and parameter names (= the checkpoint's), the layers' constructors, the target's
``gpt_attention`` call, the plugin layers (``plugin_layers.TrtPlugins``: IPluginV3 through
``add_plugin_v3``), the elementwise / where / gather / softmax / cumsum / topk structure of the draft,
accept and output code, shape tensors built with ``concat`` (the stand-in refuses Python lists
holding Tensors, as TensorRT-LLM does). The stand-in holds the file to TensorRT-LLM's recorded signatures and
dtype rules (``trtllm/cpu/api_1_2.yaml``). Relied on but unverified [I]: int64 elementwise math in
:func:`counter_uniforms`, TensorRT's
top-k/argmax tie order (the contract is lower id first), that ``host_gen_eagle_net_request_types`` is
all 1, the plugin's cyclic addressing for a window below the cache, the runtime's default
temperature (greedy needs an explicit 0), and the memory of ``[bs, K, V]`` fp32 proposal/target
probabilities at a 248k vocabulary (~1.9 GB at bs 64, K 15: to be gathered over the top-k instead).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from dflash2_trt.trtllm import backend as _backend

api = _backend.current()
F = api.functional

SELECTOR_PLUGIN_MODE = {"greedy": "sample", "viterbi": "viterbi"}
"""Build selector -> DFlash2PairwiseScan mode. ``greedy`` (the published behaviour) is the
plugin's ``sample`` mode: per request, T <= 0 walks greedily (one-hot q) and T > 0 samples from
softmax(S/T) (q kept for rejection sampling). ``viterbi`` proposes the global best path (one-hot
q) at every temperature — lossless too, never the default."""

PRIME = 2**31 - 1


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


def check_kv_compatible(config) -> None:
    """Every layer of the paged pool holds one size per token (docs/TRTLLM-ENGINE.md §3): a drafter layer fits when its
    K/V values per token ON EACH RANK equal the target's (KV heads duplicated when fewer than ranks); its own head
    split may differ (Qwen3.8-27B: target 4 x 256, drafter 8 x 128 = 1024 both at tp 1..4; at tp 8 the target's
    duplicated 1 x 256 meets the drafter's 1 x 128 and the pair does not fit)."""
    d, tp = config.dflash2, config.mapping.tp_size
    t_tok = _local(config.num_key_value_heads, tp) * config.head_size
    d_tok = _local(d["num_key_value_heads"], tp) * d["head_dim"]
    split = d_tok // t_tok if t_tok and d_tok % t_tok == 0 else 0
    if split >= 1 and _local(d["num_key_value_heads"], tp) % split == 0 and \
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
    t_tok = _local(config.num_key_value_heads, tp) * config.head_size
    d_tok = _local(d["num_key_value_heads"], tp) * d["head_dim"]
    return max(1, d_tok // t_tok)


def total_kv_layers(config) -> int:
    """Layers of the paged pool: the target's attention layers, then the drafter layers (x their split)."""
    return num_kv_layers_of(config) + int(config.dflash2["num_hidden_layers"]) * drafter_kv_split(config)


def num_kv_layers_of(config) -> int:
    """Target layers with a KV cache (attention layers; Gated DeltaNet layers keep recurrent state instead)."""
    return sum(1 for t in hf_layer_types(config) if t != "linear_attention")


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


def kv_layer_windows(config, drafter_window: str, max_seq_len: int) -> list[int]:
    """The per-KV-layer attention window the runtime passes in host_max_attention_window_sizes (TensorRT-LLM:
    the executor's KvCacheConfig.max_attention_window, one entry per layer): max_seq_len for full-attention
    layers, the target's sliding window for its sliding layers (Muse Glimmer), the drafter's own window for its
    layers when ``drafter_window == "model"``. More than one value makes a variable-window model, which
    TensorRT-LLM 1.2's KV rewind for EAGLE refuses (docs/TRTLLM-ENGINE.md §3): the plan says so."""
    kinds = [t for t in hf_layer_types(config) if t != "linear_attention"]
    sw = getattr(config, "sliding_window", None)
    out = [int(sw) if (t == "sliding_attention" and sw) else int(max_seq_len) for t in kinds]
    d = config.dflash2
    for i in range(int(d["num_hidden_layers"])):
        w = d.get("sliding_window") if d["layer_types"][i] == "sliding_attention" else None
        w = int(w) if (w and drafter_window == "model") else int(max_seq_len)
        out += [w] * drafter_kv_split(config)
    return out


def _local(n: int, tp: int) -> int:
    """Heads one rank holds (KV heads are duplicated when fewer than ranks, as convert does)."""
    return n // tp if n >= tp else 1


class QKNormAttention(api.Module):
    """Fused-qkv attention with per-head q/k RMSNorm before RoPE (TensorRT-LLM's Qwen3 attention)."""

    def __init__(self, *, hidden_size, num_heads, num_kv_heads, head_dim, eps, rope_base, rotary_dim, layer_idx,
                 dtype, mapping, norm_offset: float = 0.0, output_gate: bool = False, qk_norm_weight: bool = True,
                 q_scaling: float = 1.0, kv_split: int = 1, max_positions: int = 0):
        super().__init__()
        tp = mapping.tp_size
        self.max_positions = int(max_positions)
        self.kv_split = kv_split
        self.nq, self.nkv, self.d = num_heads // tp, _local(num_kv_heads, tp), head_dim
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
        m = config.mapping
        self.vocab_embedding = api.layers.Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype,
                                                    tp_size=m.tp_size, tp_group=m.tp_group, sharding_dim=0,
                                                    tp_rank=m.tp_rank)
        self.layers = api.ModuleList(Qwen3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = api.layers.RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)

    def forward(self, input_ids, attention_params, kv_cache_params, spec_decoding_params):
        x = self.vocab_embedding(input_ids)
        outs = []
        for layer in self.layers:
            x = layer(x, attention_params, kv_cache_params, spec_decoding_params)
            outs.append(x)
        return self.ln_f(x), outs


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


class GatedDeltaNet(api.Module):
    """Qwen3.5's linear-attention mixer (names: convert/qwen3_5.py). The recurrence, its causal conv and the
    per-request state live in the DFlash2GatedDeltaNet plugin: ``forward`` advances context requests' state
    slots and only reads generation requests' (their K+1 verify tokens); :meth:`commit` then advances a
    generation request's slot over exactly its accepted tokens, replaying the verify pass's projected qkv and
    gates. State slots are the runtime's (``slot_mapping``, ``rnn_state_ptr_<L>``, ``conv_state_ptr_<L>``)."""

    def __init__(self, config, layer_idx, dtype, mapping):
        super().__init__()
        la, tp = config.linear_attention, mapping.tp_size
        self.layer_idx = layer_idx
        self.nk, self.nv = _local(la["num_key_heads"], tp), la["num_value_heads"] // tp
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
        m = config.mapping
        self.vocab_embedding = api.layers.Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype,
                                                    tp_size=m.tp_size, tp_group=m.tp_group, sharding_dim=0,
                                                    tp_rank=m.tp_rank)
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


class WeightlessRmsNorm(api.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x):
        return F.rms_norm(x, self.dim, eps=self.eps)


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
        m = config.mapping
        self.eps, self.embedding_norm = config.norm_epsilon, bool(config.embedding_norm)
        self.vocab_embedding = api.layers.Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype,
                                                    tp_size=m.tp_size, tp_group=m.tp_group, sharding_dim=0,
                                                    tp_rank=m.tp_rank)
        self.layers = api.ModuleList(MuseGlimmerDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = OffsetRmsNorm(config.hidden_size, config.norm_epsilon, config.dtype, config.ln_f_weight_offset)
        self.hidden = config.hidden_size

    def forward(self, input_ids, attention_params, kv_cache_params, spec_decoding_params):
        x = self.vocab_embedding(input_ids)
        if self.embedding_norm:
            x = F.rms_norm(x, self.hidden, eps=self.eps)
        outs = []
        for layer in self.layers:
            x = layer(x, attention_params, kv_cache_params, spec_decoding_params)
            outs.append(x)
        return self.ln_f(x), outs


TARGET_FAMILIES = {"qwen3": Qwen3Transformer, "qwen3_5": Qwen3_5Transformer, "muse_glimmer": MuseGlimmerTransformer}
"""qwen_type -> target transformer class."""


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


class DFlash2Selector(api.Module):
    def __init__(self, hidden, vocab, rank, dtype):
        super().__init__()
        self.predecessor_codebook = api.Parameter(shape=(vocab, rank), dtype=dtype)
        self.successor_codebook = api.Parameter(shape=(vocab, rank), dtype=dtype)
        self.hidden_projection = api.layers.ColumnLinear(hidden, rank, bias=False, dtype=dtype, tp_size=1,
                                                         gather_output=False)


def counter_uniforms(key, counter):
    """Uniforms in [0, 1) from a counter-based generator: one value per (key, counter), int64 math only
    (an affine mix, then multiply / square-and-add rounds modulo the prime 2^31 - 1; every product stays
    below 2^63). ``key [B]`` int64 (per request and step), ``counter [B, N]`` int64 (absolute positions)."""
    x = (F.unsqueeze(key, 1) * 1103515245 + counter * _i64(2654435761) + 12345)
    x = x - F.floordiv(x, PRIME) * PRIME
    for add in (1442695041, 2147483587, 1013904223):
        x = x * 48271
        x = x - F.floordiv(x, PRIME) * PRIME
        x = x * x + add
        x = x - F.floordiv(x, PRIME) * PRIME
    return F.cast(F.floordiv(x, 256), "float32") * (1.0 / 2**23)   # 23 bits: exact in fp32, < 1


def _i64(v: int):
    """An int64 constant [1]: TensorRT-LLM turns a bare Python int into an int32 constant (int32_array), which a
    value beyond int32 overflows."""
    return F.constant(np.array([v], np.int64))


def inverse_cdf(probs, u, block: int = 512):
    """Smallest index whose cumulative mass exceeds ``u * total`` (fallback: the last index with mass);
    ``probs [N, V]`` fp32, ``u [N]``. The reference (``verify.sample_from_probs``) sums in fp64; one fp32
    cumsum over a 248k vocabulary rounds away increments below an ulp of the running total (a
    total-variation error of ~2e-3 per token), so this sums in two levels: block totals, then inside the
    chosen block, each an fp32 sum of at most ``block`` (or V / block) terms."""
    n, v = F.shape(probs, 0), F.shape(probs, 1)
    nb = F.floordiv(v + (block - 1), block)
    pad = nb * block - v
    padded = F.concat([probs, F.expand(F.constant(np.zeros((1, 1), np.float32)), F.concat([n, pad]))], dim=1)
    blocks = F.view(padded, F.concat([n, nb, block]))
    totals = F.sum(blocks, 2)                                                        # [N, nb]
    ctot = F.cumsum(totals, 1)
    thresh = F.view(F.unsqueeze(u, 1) * F.slice(ctot, F.concat([0, nb - 1]), F.concat([n, 1])), F.concat([n]))
    b = F.minimum(F.sum(F.cast(op_le(ctot, F.unsqueeze(thresh, 1)), "int32"), 1), nb - 1)   # block of the draw
    before = F.where(F.gt(b, 0), F.view(F.gather(ctot, 1, F.unsqueeze(F.maximum(b - 1, 0), 1)), F.concat([n])), 0.0)
    inner = F.view(F.gather(blocks, 1, F.expand(F.view(b, F.concat([n, 1, 1])), F.concat([n, 1, block]))),
                   F.concat([n, block]))
    cin = F.cumsum(inner, 1)
    # b is int64 (it meets shape() values, int64 in TensorRT 10); where() below never casts a Tensor operand, and
    # ISelectLayer refuses int64 against last_pos's int32, so the index is int32 here
    first = F.cast(b * block + F.sum(F.cast(op_le(cin, F.unsqueeze(thresh - before, 1)), "int32"), 1), "int32")
    ar = F.unsqueeze(F.arange(F.constant(np.array(0, np.int32)), v, "int32"), 0)
    last_pos = F.max(F.where(F.gt(probs, 0.0), ar, -1), 1)
    return F.where(F.lt(first, v), first, last_pos)


def op_le(a, b):
    return F.op_or(F.lt(a, b), F.eq(a, b))


class DFlash2ForCausalLM(api.PretrainedModel):
    """Target + DFlash2 drafter + acceptance in one engine (EAGLE one-engine contract)."""

    def __init__(self, config):
        super().__init__(config)
        if api.name == "trtllm":   # pragma: no cover - TensorRT-LLM only
            # trtllm-build has no plugin flag: the model class file loads the DFlash2 plugin library itself
            # (DFLASH2_PLUGIN_LIB, or the build directories dflash2_trt.plugins searches); build with --workers 1.
            from dflash2_trt.plugins import load_library

            load_library()
        check_kv_compatible(config)
        if config.qwen_type not in TARGET_FAMILIES:
            raise ValueError(f"qwen_type {config.qwen_type!r}: no engine network yet (have "
                             f"{', '.join(TARGET_FAMILIES)})")
        d, m = config.dflash2, config.mapping
        self.K = d["block_size"] - 1
        self.transformer = TARGET_FAMILIES[config.qwen_type](config)
        self.lm_head = api.layers.ColumnLinear(config.hidden_size, config.vocab_size, bias=False, dtype=config.dtype,
                                               tp_group=m.tp_group, tp_size=m.tp_size, gather_output=True)
        self.dflash2 = DFlash2Drafter(config)
        eng = getattr(config, "dflash2_engine", None) or {}
        self.selector_mode = SELECTOR_PLUGIN_MODE[eng.get("selector", "greedy")]
        self.drafter_window = eng.get("drafter_window", "model")
        self.max_seq_len = int(eng.get("max_seq_len", config.max_position_embeddings))

    # ---- engine I/O -------------------------------------------------------------------------------
    def prepare_inputs(self, max_batch_size: int, max_num_tokens: int, max_seq_len: int,
                       max_blocks_per_seq: int | None = None, num_kv_layers: int | None = None,
                       tokens_per_block: int | None = None, **unused):
        """Every engine input, with dim ranges (names and shapes: ``engine_io.yaml``). trtllm-build calls it with
        its own keyword set (max_batch_size, max_input_len, max_seq_len, max_num_tokens, max_draft_len, ...);
        the rest is ignored."""
        K = self.K
        if max_blocks_per_seq is None:
            tpb = tokens_per_block or int((getattr(self.config, "dflash2_engine", None) or {}).get("tokens_per_block", 32))
            max_blocks_per_seq = -(-max_seq_len // tpb)
        bs = [1, (max_batch_size + 1) // 2, max_batch_size]
        nt = [1, (max_num_tokens + 1) // 2, max_num_tokens]
        nl = num_kv_layers or total_kv_layers(self.config)
        T = api.input_tensor
        R = OrderedDict
        kvp = KeyValueCacheParams(
            host_past_key_value_lengths=T("host_past_key_value_lengths", "int32", [-1], R(batch_size=bs)),
            host_max_attention_window_sizes=T("host_max_attention_window_sizes", "int32", [nl], R(num_layers=[nl] * 3)),
            host_sink_token_length=T("host_sink_token_length", "int32", [1], R(scalar=[1, 1, 1])),
            kv_cache_block_offsets=T("kv_cache_block_offsets", "int32", [1, -1, 2, -1],
                                     R(num_pools=[1, 1, 1], batch_size=bs, kv=[2, 2, 2],
                                       max_blocks_per_seq=[1, max_blocks_per_seq // 2 or 1, max_blocks_per_seq])),
            host_kv_cache_block_offsets=T("host_kv_cache_block_offsets", "int32", [1, -1, 2, -1],
                                          R(num_pools=[1, 1, 1], batch_size=bs, kv=[2, 2, 2],
                                            max_blocks_per_seq=[1, max_blocks_per_seq // 2 or 1, max_blocks_per_seq])),
            host_kv_cache_pool_pointers=T("host_kv_cache_pool_pointers", "int64", [1, 2], R(num_pools=[1, 1, 1],
                                                                                             kv=[2, 2, 2])),
            host_kv_cache_pool_mapping=T("host_kv_cache_pool_mapping", "int32", [nl, 2], R(num_layers=[nl] * 3,
                                                                                            pool_and_layer=[2, 2, 2])),
            # beam search only; the plugin still takes it (use_cache): TensorRT-LLM's runtime binds it
            cache_indirection=T("cache_indirection", "int32", [-1, -1, -1],
                                R(batch_size_cache=bs, beam_width=[1, 1, 1],
                                  max_seq_len=[1, (max_seq_len + 1) // 2, max_seq_len])))
        att = AttentionParams(
            sequence_length=T("sequence_length", "int32", [-1], R(batch_size=bs)),
            context_lengths=T("context_lengths", "int32", [-1], R(batch_size=bs)),
            host_context_lengths=T("host_context_lengths", "int32", [-1], R(batch_size=bs)),
            max_context_length=max_seq_len,
            host_request_types=T("host_request_types", "int32", [-1], R(batch_size=bs)),
            host_runtime_perf_knobs=T("host_runtime_perf_knobs", "int64", [16], R(perf_knob_size=[16] * 3)),
            host_context_progress=T("host_context_progress", "int64", [1], R(context_progress_size=[1] * 3)))
        gen = [0, (max_batch_size + 1) // 2, max_batch_size]            # generation requests: 0 in a context-only step
        gen_tok = [0, (max_batch_size * (K + 1) + 1) // 2, max_batch_size * (K + 1)]
        logits = [1, (max_batch_size * (K + 1) + 1) // 2, max_batch_size * (K + 1)]
        spec = SpecDecodingParams(
            spec_decoding_is_generation_length_variable=True, spec_decoding_max_generation_length=K + 1,
            spec_decoding_generation_lengths=T("spec_decoding_generation_lengths", "int32", [-1],
                                               R(gen_batch_size=gen)),
            spec_decoding_position_offsets=T("spec_decoding_position_offsets", "int32", [-1, K + 1],
                                             R(gen_batch_size=gen, spec_decoding_max_generation_length=[K + 1] * 3)),
            spec_decoding_packed_mask=T("spec_decoding_packed_mask", "int32", [-1, (K + 1 + 31) // 32],
                                        R(gen_num_tokens=gen_tok, spec_decoding_packed_mask_size=[(K + 32) // 32] * 3)),
            spec_decoding_use=T("spec_decoding_use", "int32", [1], R(spec_decoding_use_size=[1] * 3)))
        return {
            "input_ids": T("input_ids", "int32", [-1], R(num_tokens=nt)),
            "last_token_ids": T("last_token_ids", "int32", [-1], R(num_logits=logits)),
            "kv_cache_params": kvp,
            "attention_params": att,
            "spec_decoding_params": spec,
            "draft_lens": T("draft_lens", "int32", [-1], R(batch_size=bs)),
            "eagle_temperature": T("eagle_temperature", "float32", [-1], R(batch_size=bs)),
            # eagleBuffers.cpp reshape(): [numSequences, maxDecodingTokens]
            "rand_data_validation": T("rand_data_validation", "float32", [-1, K + 1],
                                      R(batch_size=bs, max_decoding_tokens=[K + 1] * 3)),
            "rand_data_sample": T("rand_data_sample", "float32", [-1], R(batch_size=bs)),
            # eagleBuffers.cpp reshape(): [numSequences], one entry per request (setupEagleNetHostBuffers)
            "host_gen_eagle_net_request_types": T("host_gen_eagle_net_request_types", "int32", [-1], R(batch_size=bs)),
            **self._recurrent_inputs(bs),
        }

    def _recurrent_inputs(self, bs) -> dict:
        """TensorRT-LLM's recurrent-state inputs (RecurrentGemma / Mamba convention): ``slot_mapping`` and one
        ``rnn_state_ptr_<L>`` / ``conv_state_ptr_<L>`` per Gated DeltaNet layer L (host int64 addresses)."""
        if not getattr(self.transformer, "recurrent", False):
            return {}
        T, R = api.input_tensor, OrderedDict
        gdn = [i for i, t in enumerate(hf_layer_types(self.config)) if t == "linear_attention"]
        return {"recurrent_params": RecurrentStateParams(
            slot_mapping=T("slot_mapping", "int32", [-1], R(batch_size=bs)),
            rnn_state_ptr={i: T(f"rnn_state_ptr_{i}", "int64", [1], R(ptr=[1, 1, 1])) for i in gdn},
            conv_state_ptr={i: T(f"conv_state_ptr_{i}", "int64", [1], R(ptr=[1, 1, 1])) for i in gdn})}

    # ---- one step ---------------------------------------------------------------------------------
    def forward(self, input_ids, last_token_ids, kv_cache_params, attention_params, spec_decoding_params,
                draft_lens, eagle_temperature, rand_data_validation, rand_data_sample,
                host_gen_eagle_net_request_types, recurrent_params=None):
        K, d, cfg = self.K, self.config.dflash2, self.config
        att = attention_params
        bs = F.shape(att.sequence_length, 0)
        is_gen = F.gt(draft_lens, 0)                       # the stock runtime: 0 for context requests, K otherwise
        # Tokens per request as the batch manager packs them: a context request its chunk (context_lengths), a
        # generation request [last token] + K draft slots.
        n_tok = F.where(is_gen, K + 1, att.context_lengths)
        ends = F.cumsum(F.cast(n_tok, "int32"), 0)                                 # exclusive ends
        starts = ends - F.cast(n_tok, "int32")
        j = F.unsqueeze(F.arange(0, K + 1, "int32"), 0)                          # [1, K+1]
        # Absolute position of the next draft block's anchor: a generation request's last token sits at its
        # committed length (sequence_length - (K+1)); a context request's first new token right after its chunk.
        anchor_pos = F.where(is_gen, att.sequence_length - (K + 1), att.sequence_length)

        # ---- 1. draft ----------------------------------------------------------------------------
        anchor = F.index_select(input_ids, 0, starts)                              # [bs]
        mask_col = F.expand(F.constant(np.full((1, 1), d["mask_token_id"], np.int32)), dims(bs, K))
        block = F.concat([F.unsqueeze(anchor, 1), mask_col], dim=1)                # [bs, K+1]
        x = self.transformer.vocab_embedding(F.view(block, dims(bs * (K + 1))))
        if d["input_embedding_scale"] is not None:
            x = x * d["input_embedding_scale"]
        draft_att, draft_kv, draft_spec = self._draft_attention(att, kv_cache_params, spec_decoding_params,
                                                                host_gen_eagle_net_request_types, is_gen, bs)
        mask_type = api.AttentionMaskType.causal if d["is_causal"] else api.AttentionMaskType.bidirectional
        for layer in self.dflash2.layers:
            x = layer(x, draft_att, draft_kv, draft_spec, mask_type=mask_type)
        hid = F.view(self.dflash2.norm(x), dims(bs, K + 1, d["hidden_size"]))
        hid = F.slice(hid, [0, 1, 0], dims(bs, K, d["hidden_size"]))                    # draft positions 1..K
        unary = F.cast(self.lm_head(hid), "float32")
        if d["output_multiplier"] is not None:
            unary = unary * float(d["output_multiplier"])
        if d["final_logit_softcapping"] is not None:
            cap = float(d["final_logit_softcapping"])
            unary = F.tanh(unary * (1.0 / cap)) * cap
        scores, cand = F.topk(unary, d["selector_top_k"], dim=2)
        proj = self.dflash2.selector.hidden_projection(hid)
        temperature = F.cast(eagle_temperature, "float32")
        key = F.cast(rand_data_sample * float(2**31), "int64")
        counter = F.cast(F.unsqueeze(anchor_pos, 1) + F.slice(j, [0, 1], [1, K]), "int64")
        uniforms = counter_uniforms(key, counter)                                     # [bs, K]
        drafts, q = api.plugins.pairwise_scan(scores, cand, proj, anchor, self.dflash2.selector.predecessor_codebook.value,
                                              self.dflash2.selector.successor_codebook.value, temperature, uniforms,
                                              mode=self.selector_mode)

        # ---- 2. verify ---------------------------------------------------------------------------
        tok = F.arange(F.constant(np.array(0, np.int32)), F.shape(input_ids, 0), "int32")
        req = F.sum(F.cast(op_le(F.unsqueeze(ends, 0), F.unsqueeze(tok, 1)), "int32"), 1)  # request of each token
        off = tok - F.index_select(starts, 0, req)
        tok_gen = F.op_and(F.index_select(is_gen, 0, req), F.gt(off, 0))
        slot = F.maximum(off - 1, 0)
        sub = F.gather(F.index_select(drafts, 0, req), 1, F.unsqueeze(F.minimum(slot, K - 1), 1))
        target_ids = F.where(tok_gen, F.view(sub, [-1]), input_ids)   # [-1]: a static shape list
        if getattr(self.transformer, "recurrent", False):
            rs = RecurrentStateParams(slot_mapping=recurrent_params.slot_mapping,
                                      rnn_state_ptr=recurrent_params.rnn_state_ptr,
                                      conv_state_ptr=recurrent_params.conv_state_ptr,
                                      host_request_types=att.host_request_types,
                                      cu_seqlens=F.concat([F.constant(np.zeros(1, np.int32)), ends]),
                                      # TensorRT-LLM never zeroes a state slot (docs/hybrid-runtime.md E1): a
                                      # prompt's first chunk (sequence_length == context_lengths, stock inputs)
                                      # starts from zeros whatever the reused slot holds
                                      zero_state=F.cast(F.op_and(F.eq(att.sequence_length, att.context_lengths),
                                                                 F.eq(F.cast(is_gen, "int32"), 0)), "int32"))
            saved = []
            final, layer_outs = self.transformer(target_ids, attention_params, kv_cache_params, spec_decoding_params,
                                                 rs, saved)
        else:
            final, layer_outs = self.transformer(target_ids, attention_params, kv_cache_params, spec_decoding_params)

        # The runtime's logits rows: last_token_ids is the inclusive scan of logits per request (a context
        # request 1 at its last token, a generation request K+1), i.e. row r is token last_token_ids[r] - 1.
        logits = F.cast(self.lm_head(F.index_select(final, 0, last_token_ids - 1)), "float32")   # [num_logits, V]
        if getattr(cfg, "output_multiplier", None) is not None:      # the target's own logit transform (Muse Glimmer)
            logits = logits * float(cfg.output_multiplier)
        if getattr(cfg, "final_logit_softcapping", None) is not None:
            tcap = float(cfg.final_logit_softcapping)
            logits = F.tanh(logits * (1.0 / tcap)) * tcap
        vocab = F.shape(logits, 1)
        per_req = F.where(is_gen, K + 1, 1)
        logit_start = F.cumsum(F.cast(per_req, "int32"), 0) - F.cast(per_req, "int32")
        rows = F.unsqueeze(logit_start, 1) + F.where(F.unsqueeze(is_gen, 1), j, j * 0)   # [bs, K+1]
        logits3 = F.view(F.index_select(logits, 0, F.view(rows, dims(bs * (K + 1)))), dims(bs, K + 1, vocab))

        # ---- 3. accept ---------------------------------------------------------------------------
        # one uniform per request keys the counter-based generator (the runtime's first of its K+1)
        key_v = F.cast(F.view(F.slice(rand_data_validation, [0, 0], dims(bs, 1)), dims(bs)) * float(2**31), "int64")
        u = counter_uniforms(key_v, F.cast(F.unsqueeze(anchor_pos, 1) + j + 1, "int64"))   # [bs, K+1]
        n, nxt = self._accept(logits3, drafts, q, cand, temperature, u, is_gen, bs, vocab)
        jj = F.expand(j, dims(bs, K + 1))
        padded = F.concat([drafts, F.expand(F.constant(np.zeros((1, 1), np.int32)), dims(bs, 1))], dim=1)
        accepted = F.where(F.lt(jj, F.unsqueeze(n, 1)), padded,
                           F.where(F.eq(jj, F.unsqueeze(n, 1)), F.unsqueeze(nxt, 1) + jj * 0, jj * 0))

        # ---- 4. commit: recurrent state over the accepted tokens, drafter context for every token --------
        side_effects = []   # layers run for what they write (state, KV), not for their outputs
        if getattr(self.transformer, "recurrent", False):
            for gdn, keep in saved:   # generation requests: anchor + n accepted drafts; context requests: done
                side_effects.append(gdn.commit(keep, F.cast(n + 1, "int32"), rs))
        taps = F.concat([layer_outs[i] for i in d["target_layer_ids"]], dim=1)
        ctx = self.dflash2.hidden_norm(self.dflash2.fc(taps))
        for layer in self.dflash2.layers:
            side_effects.append(layer.commit(ctx, attention_params, kv_cache_params, spec_decoding_params))
        # TensorRT removes layers whose outputs reach no network output; the commits exist for their writes, so
        # num_accepted_tokens takes a zero that depends on each of them (NaN-safe: eq(x, x) then * 0).
        n = n + keep_alive(side_effects)

        # ---- 5. outputs --------------------------------------------------------------------------
        zero = F.expand(F.constant(np.zeros(1, np.int32)), dims(bs))
        chain = np.full((1, K + 1, K + 1), -1, np.int32)
        chain[0, 0] = np.arange(K + 1)
        api.mark_output(accepted, "accepted_tokens", "int32")
        api.mark_output(n + 1, "num_accepted_tokens", "int32")
        api.mark_output(zero, "accepted_paths", "int32")
        api.mark_output(F.expand(F.constant(np.full((1, K), d["mask_token_id"], np.int32)), dims(bs, K)),
                        "next_draft_tokens", "int32")
        api.mark_output(zero + K, "next_draft_lens", "int32")
        api.mark_output(F.expand(F.constant(chain), dims(bs, K + 1, K + 1)), "next_draft_paths", "int32")
        api.mark_output(logits, "logits", "float32")
        return accepted

    def _draft_attention(self, att, kvp, spec, host_gen_types, is_gen, bs):
        """Attention parameters of the draft block: every request as a generation request (host request types
        from ``host_gen_eagle_net_request_types``) with K+1 new tokens after its committed tokens — a generation
        request at its committed length, a context request after its chunk: exactly the stock
        ``host_past_key_value_lengths`` of both kinds (runtimeBuffers.cpp) — bidirectional (or causal) mask,
        offsets 0..K (device inputs made in the graph: allowed); every host input is the runtime's own (the
        plugin reads those on the host), the drafter layers' windows included (their entries of the runtime's
        per-layer host_max_attention_window_sizes)."""
        K, d = self.K, self.config.dflash2
        seq = F.where(is_gen, att.sequence_length, att.sequence_length + (K + 1))
        draft_att = AttentionParams(sequence_length=seq, context_lengths=att.context_lengths,
                                    host_context_lengths=att.host_context_lengths, max_context_length=att.max_context_length,
                                    host_request_types=host_gen_types, host_runtime_perf_knobs=att.host_runtime_perf_knobs,
                                    host_context_progress=att.host_context_progress)
        draft_kv = kvp
        full = np.ones((K + 1, K + 1), bool) if not d["is_causal"] else np.tril(np.ones((K + 1, K + 1), bool))
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

    def _accept(self, logits3, drafts, q, cand, temperature, u, is_gen, bs, vocab):
        """(n accepted drafts [bs], next token [bs]) per request: greedy where T <= 0, rejection sampling
        with the selector's q where T > 0 (``reference/verify.py`` is the plain-torch statement of both).
        Context requests accept no draft: their token comes from row 0 (the last prompt position)."""
        K = self.K
        gen_col = F.unsqueeze(is_gen, 1)
        post = F.argmax(logits3, 2)                                                    # [bs, K+1]
        ok_g = F.op_and(F.eq(drafts, F.slice(post, [0, 0], dims(bs, K))), gen_col)
        n_g = _leading_true(ok_g)
        next_g = F.view(F.gather(post, 1, F.unsqueeze(n_g, 1)), dims(bs))

        sampled = F.gt(temperature, 0.0)
        t_safe = F.where(sampled, temperature, 1.0)
        p = F.softmax(logits3 * F.unsqueeze(F.unsqueeze(F.div(1.0, t_safe), 1), 2), 2)   # [bs, K+1, V]
        # (F.div: TensorRT-LLM's Tensor has no __rtruediv__, so `1.0 / t` fails there)
        q_full = F.scatter(F.cast(F.expand(F.constant(np.zeros((1, 1, 1), np.float32)), dims(bs, K, vocab)), "float32"),
                           2, cand, q)
        q_full = F.where(F.unsqueeze(gen_col, 2), q_full, 0.0)   # context: no proposal (where: a NaN in a
        # discarded dummy draft must not leak as NaN * 0)
        d_idx = F.unsqueeze(drafts, 2)
        pd = F.view(F.gather(F.slice(p, [0, 0, 0], dims(bs, K, vocab)), 2, d_idx), dims(bs, K))
        qd = F.view(F.gather(q_full, 2, d_idx), dims(bs, K))
        u_acc = F.slice(u, [0, 0], dims(bs, K))
        u_fin = F.view(F.slice(u, [0, K], dims(bs, 1)), dims(bs))
        n_s = _leading_true(F.op_and(F.lt(u_acc * qd, pd), gen_col))
        row = F.unsqueeze(F.unsqueeze(n_s, 1), 2) + F.expand(F.constant(np.zeros((1, 1, 1), np.int32)), dims(bs, 1, vocab))
        p_n = F.view(F.gather(p, 1, row), dims(bs, vocab))
        q_pad = F.concat([q_full, F.cast(F.expand(F.constant(np.zeros((1, 1, 1), np.float32)), dims(bs, 1, vocab)),
                                         "float32")], dim=1)
        q_n = F.view(F.gather(q_pad, 1, row), dims(bs, vocab))
        resid = F.maximum(p_n - q_n, 0.0)
        empty = op_le(F.sum(resid, 1), 0.0)
        resid = F.where(F.unsqueeze(empty, 1), p_n, resid)
        next_s = inverse_cdf(resid, u_fin)
        return F.where(sampled, n_s, n_g), F.where(sampled, next_s, next_g)


def keep_alive(tensors):
    """An int32 zero [1] that depends on every tensor of ``tensors`` (their first element)."""
    z = F.constant(np.zeros(1, np.int32))
    for t in tensors:
        first = F.slice(F.view(t, [-1]), [0], [1])
        z = z + F.cast(F.eq(first, first), "int32") * 0
    return z


def dims(*xs):
    """A shape tensor from ints and 0-D shape Tensors (TensorRT-LLM takes a list of ints OR a Tensor)."""
    return F.concat(list(xs))


def _leading_true(ok):
    """Number of leading True values per row of a bool ``[B, L]``."""
    miss = F.cumsum(1 - F.cast(ok, "int32"), 1)
    return F.sum(F.cast(F.eq(miss, 0), "int32"), 1)
