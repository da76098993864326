"""CPU stand-in for ``tensorrt_llm.functional.gpt_attention`` over a paged KV pool.

NOT TensorRT-LLM: a torch implementation of the subset of the GPT attention plugin's behaviour
that the DFlash2 network relies on, with TensorRT-LLM 1.2's argument names
(``tensorrt_llm/functional.py: gpt_attention``; plugin ``cpp/tensorrt_llm/plugins/
gptAttentionPlugin``; paged layout ``cpp/tensorrt_llm/kernels/kvCacheUtils.h`` ``KVBlockArray``).
Arguments the subset does not use are accepted and ignored only when they hold their neutral
value; anything else raises ``NotImplementedError`` instead of computing something different.

Semantics (remove_input_padding, paged KV cache):

- ``qkv [num_tokens, (H + 2*Hkv) * D]``: the requests' new tokens packed back to back, in batch
  order (context requests first). The per-request inputs mean what TensorRT-LLM 1.2's batch
  manager puts there (``cpp/tensorrt_llm/batch_manager/runtimeBuffers.cpp`` ``setFromInputs``):
  a context request (``host_request_types[b] == 0``, a prompt or a prompt chunk) owns
  ``n_b = host_context_lengths[b]`` tokens (the chunk's input length) and ``sequence_length[b]``
  = chunk start + n_b (its ``host_past_key_value_lengths`` is ALSO chunk start + n_b there, so it
  is not used for context requests); a generation request (1) owns
  ``spec_decoding_generation_lengths[g]`` tokens (``g`` = its index among the generation
  requests; 1 without spec decoding), ``sequence_length[b]`` = committed length + n_b and
  ``host_past_key_value_lengths[b]`` = the committed length. Here ``past = sequence_length - n``
  for both kinds.
- A context request's tokens sit at positions ``past + 0..n-1``. A generation request's token i
  sits at ``past + spec_decoding_position_offsets[g, i]`` and sees the step's other tokens through
  ``spec_decoding_packed_mask[row, :]``, one row per generation token, the generation requests'
  rows back to back (``[num_gen_tokens, ceil(N/32)]``; bit j of word j // 32: it sees new token j);
  every past token is visible.
- Context requests: ``mask_type`` causal (key position <= query position) or bidirectional.
- RoPE (``rope_gpt_neox``, rotate-half on the first ``rotary_embedding_dim`` dims) is applied to
  q and k at the token positions; K (post-RoPE) and V of the new tokens are WRITTEN to the pool
  at positions ``past .. past+n-1`` of layer ``layer_idx`` before attending, as the plugin does.
- Window: ``host_max_attention_window_sizes[layer_idx] = W`` masks keys with
  ``q_pos - k_pos >= W`` (transformers' sliding-window convention), in every step kind; every token
  stays at its own position. The real plugin applies such a window in context steps but not in
  speculative-decoding generation steps (engine/trtllm/facts/attention_window.yaml, read, not run):
  there a target's sliding layers take each step's new tokens as context chunks (the context route,
  trtllm/network/common.py SlidingParams) and a drafter's binding window is refused
  (engine/trtllm/windows.py), so the two agree wherever a TensorRT-LLM engine is built.
- Scale ``1 / (sqrt(D) * q_scaling)``; GQA: query head h reads KV head ``h // (H / Hkv)``.
- Pool addressing: ``host_kv_cache_pool_pointers[p, 0]`` is the :class:`KVCachePool`'s device address on
  a GPU (a handle on the CPU), ``host_kv_cache_pool_mapping[layer] = (pool, layer in pool)``, and
  ``kv_cache_block_offsets[p, b, 0|1, j]`` the K|V offset of the request's j-th ``tokens_per_block``
  tokens in TensorRT-LLM's index, ``block * layers * 2 + field``; layer ``l`` of the pool reads
  sub-block ``offset + 2 * l`` of a pool laid out ``[num_blocks, layers, 2, Hkv, tokens_per_block, D]``,
  as the plugin addresses TensorRT-LLM's primary pool.

Returns ``(context [num_tokens, H * D], None)`` (the second output is the non-paged
``present_key_value``, unused with a paged cache).
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import itertools
import threading
from collections import OrderedDict

import torch

from .tensor import raw, wrap


class AttentionMaskType(enum.IntEnum):
    padding = 0
    causal = 1
    sliding_window_causal = 2
    bidirectional = 3
    bidirectionalglm = 4
    blocksparse = 5
    custom_mask = 6


class PositionEmbeddingType(enum.IntEnum):
    learned_absolute = 0
    rope_gptj = 1
    rope_gpt_neox = 2
    long_rope = 3
    alibi = 4
    alibi_with_scale = 5
    relative = 6
    chatglm = 7
    yarn = 8
    mrope = 9
    deferred = 10

    def is_rope(self) -> bool:
        return self in (PositionEmbeddingType.rope_gptj, PositionEmbeddingType.rope_gpt_neox)


class RotaryScalingType(enum.IntEnum):
    none = 0
    linear = 1
    dynamic = 2
    longrope = 3
    llama3 = 4
    yarn = 5
    mrope = 6


class KVCachePool:
    """One paged KV pool of one rank, laid out as TensorRT-LLM's primary pool: ``[num_blocks, layers, 2,
    kv_heads, tokens_per_block, head_dim]`` (a block holds every layer's K and V of its tokens). A block offset is
    TensorRT-LLM's index, ``block * layers * 2 + field`` (field 0: K, 1: V; ``runtime/kv_cache.py``), and layer
    ``l`` of the pool reads sub-block ``offset + 2 * l``, as the attention plugin adds ``l * 2`` sub-blocks to the
    pool's address (``engine/trtllm/facts/tensorrt_session.yaml`` kv_pool). So the pool is addressed here as a
    flat array of ``num_blocks * layers * 2`` sub-blocks of ``[kv_heads, tokens_per_block, head_dim]``.

    Every layer's sub-block holds ``kv_heads * tokens_per_block * head_dim`` values (one size for every layer,
    as TensorRT-LLM's pool); a layer whose attention has another head split of the same per-token width
    (the Qwen3.8-27B drafter: 8 x 128 in a 4 x 256 target's pool) views the same bytes as its own
    ``[Hkv', tokens_per_block, D']`` (:meth:`view`): it alone writes and reads that layer, so any consistent
    view is valid."""

    _registry: dict[int, "KVCachePool"] = {}
    _ids = itertools.count(1)
    _lock = threading.Lock()

    def __init__(self, num_blocks: int, num_layers: int, num_kv_heads: int, tokens_per_block: int,
                 head_dim: int, dtype: torch.dtype, device="cpu"):
        self.num_blocks, self.num_layers = num_blocks, num_layers
        self.num_kv_heads, self.tokens_per_block, self.head_dim = num_kv_heads, tokens_per_block, head_dim
        self.data = torch.zeros(num_blocks, num_layers, 2, num_kv_heads, tokens_per_block, head_dim, dtype=dtype,
                                device=device)
        # True where the pool's memory is a runtime's that may never have been zeroed (TensorRT-LLM's: the TensorRT
        # stand-in copies it in); this pool's own memory is zeroed and only ever holds K/V the network wrote
        self.foreign = False
        with KVCachePool._lock:
            # what host_kv_cache_pool_pointers[p, 0] holds: on a GPU the pool's device address (as TensorRT-LLM's
            # runtime passes it), on the CPU a handle
            self.handle = self.data.data_ptr() if self.data.is_cuda else next(KVCachePool._ids)
            KVCachePool._registry[self.handle] = self

    @classmethod
    def from_handle(cls, handle: int) -> "KVCachePool":
        try:
            return cls._registry[int(handle)]
        except KeyError:
            raise ValueError(f"gpt_attention: no KV pool at {int(handle):#x}") from None

    def release(self) -> None:
        with KVCachePool._lock:
            KVCachePool._registry.pop(self.handle, None)

    @property
    def sub_blocks(self) -> int:
        return self.num_blocks * self.num_layers * 2

    # token-level access used by gpt_attention -----------------------------------------------

    def view(self, num_kv_heads: int, head_dim: int) -> torch.Tensor:
        """The pool as ``[num_blocks * layers * 2, num_kv_heads, tokens_per_block, head_dim]`` sub-blocks (same
        storage), in a layer's own head split."""
        if num_kv_heads * head_dim != self.num_kv_heads * self.head_dim:
            raise ValueError(f"gpt_attention: {num_kv_heads} x {head_dim} KV values per token do not fit a pool of "
                             f"{self.num_kv_heads} x {self.head_dim}")
        return self.data.view(self.sub_blocks, num_kv_heads, self.tokens_per_block, head_dim)

    def write_tokens(self, layer: int, offsets: torch.Tensor, req: torch.Tensor, positions: torch.Tensor,
                     k: torch.Tensor, v: torch.Tensor) -> None:
        """Every token at once: token t of request ``req[t]`` at ``positions[t]``; offsets ``[bs, 2, max_blocks]``;
        k, v ``[T, Hkv, D]`` in the layer's own head split."""
        tpb = self.tokens_per_block
        data = self.view(k.shape[1], k.shape[2])
        blk, slot = positions // tpb, positions % tpb
        if self.data.device.type != "cpu":   # a position past the table (a discarded draft) must not read past it
            blk = blk.clamp(max=offsets.shape[-1] - 1)
        for kv, val in ((0, k), (1, v)):
            rows = offsets[req, kv, blk].long() + 2 * layer
            if self.data.device.type == "cpu":   # on a device the host copy of the offsets was checked (check_host_offsets)
                self._check_rows(rows)
            data[rows, :, slot] = val.to(data.dtype)

    def read_batch(self, layer: int, offsets: torch.Tensor, length: int, lengths: torch.Tensor,
                   num_kv_heads: int | None = None, head_dim: int | None = None):
        """K, V of positions ``0..length-1`` of every request: ``[bs, length, Hkv, D]`` each. Positions past a
        request's own length read block 0 / whatever its offsets say: K there must be masked by the caller. In a
        ``foreign`` pool V there is zeroed too: TensorRT-LLM does not zero the memory it allocates (``torch.empty``,
        facts ``kv_pool.allocation``), and a masked position's weight 0 times a NaN it holds is NaN; what a pool holds
        past a sequence's length must not reach the output. A pool of this module's own holds zeros or K/V the
        network wrote there (finite), whose product with 0 is 0: the fill is skipped (it cost 4-8% of a tiny
        engine's step)."""
        tpb = self.tokens_per_block
        pos = torch.arange(length, device=offsets.device)
        blk = (pos // tpb).clamp(max=offsets.shape[-1] - 1)
        slot = pos % tpb
        valid = pos[None, :] < lengths[:, None]
        data = self.view(num_kv_heads or self.num_kv_heads, head_dim or self.head_dim)
        out = []
        for kv in (0, 1):
            rows = offsets[:, kv, blk].long() + 2 * layer                    # [bs, length]
            if self.data.device.type == "cpu":
                self._check_rows(rows[valid])
            rows = torch.where(valid, rows, 2 * layer)
            out.append(data[rows, :, slot[None, :].expand_as(rows)])
        if self.foreign:
            out[1].masked_fill_(~valid[:, :, None, None], 0)                    # a gathered copy
        return out[0], out[1]

    def check_host_offsets(self, host_offsets: torch.Tensor, totals: torch.Tensor) -> None:
        """On a GPU, the block offsets a step will use, checked once on the host copy the runtime binds beside the
        device one (``host_kv_cache_block_offsets`` ``[bs, 2, max_blocks]``, the same values): the first
        ceil(total / tokens_per_block) entries of each request are blocks of this pool in TensorRT-LLM's index
        (K at ``block * layers * 2``, V one further). No device synchronisation."""
        need = -(-totals.long() // self.tokens_per_block)
        two_l = 2 * self.num_layers
        for b, n in enumerate(need.tolist()):
            off = host_offsets[b, :, :n].long()
            self._check_rows(off)
            if off.numel() and not (torch.equal(off[0] % two_l, torch.zeros_like(off[0]))
                                    and torch.equal(off[1] - off[0], torch.ones_like(off[0]))):
                raise IndexError(f"gpt_attention: request {b}'s block offsets are not TensorRT-LLM's index (K at "
                                 f"block * {two_l}, V at K + 1)")

    def _check_rows(self, rows: torch.Tensor) -> None:
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= self.sub_blocks):
            raise IndexError(f"gpt_attention: block offset outside the pool (0..{self.sub_blocks - 1})")


def _rope(x: torch.Tensor, pos: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    """rotate-half RoPE on the first ``dim`` channels of ``x [n, heads, D]``: fp32 tables, rounded to x's dtype,
    multiply-adds in x's dtype — as the reference drafter and transformers' Qwen3 do. (TensorRT-LLM's kernel
    rotates in fp32, so bf16 engines can differ from this stand-in in the last bit.)"""
    if dim == 0:
        return x
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    f = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([f, f], dim=-1)
    cos, sin = emb.cos()[:, None, :].to(x.dtype), emb.sin()[:, None, :].to(x.dtype)
    xr, xp = x[..., :dim], x[..., dim:]
    half = dim // 2
    rot = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    return torch.cat([xr * cos + rot * sin, xp], dim=-1)


def _unpack_mask(packed: torch.Tensor, n: int) -> torch.Tensor:
    """``[n, ceil(N/32)]`` int32 words -> ``[n, n]`` bool (bit j of word j//32)."""
    j = torch.arange(n)
    words = packed[:n, j // 32].long() & 0xFFFFFFFF
    return ((words >> (j % 32)) & 1).bool()


def _unpack_all(packed: torch.Tensor, n: int) -> torch.Tensor:
    """``[bs, >=n, words]`` -> ``[bs, n, n]`` bool."""
    j = torch.arange(n)
    words = packed[:, :n][:, :, j // 32].long() & 0xFFFFFFFF
    return ((words >> (j % 32)) & 1).bool()


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """Inverse of the unpacking: bool ``[..., n, n]`` -> int32 ``[..., n, ceil(n/32)]``."""
    n = mask.shape[-1]
    words = (n + 31) // 32
    out = torch.zeros(*mask.shape[:-1], words, dtype=torch.int64)
    for j in range(n):
        out[..., j // 32] |= mask[..., j].long() << (j % 32)
    out = torch.where(out >= 2**31, out - 2**32, out)
    return out.to(torch.int32)


# Defaults of TensorRT-LLM 1.2's gpt_attention arguments the stand-in does not implement: passing these (or
# None / False / 0 / an all-zero tensor) is accepted; anything else raises NotImplementedError.
_NEUTRAL = {"tp_size": 1, "tp_rank": 0, "vision_start": -1, "vision_length": -1, "beam_width": 1,
            "block_sparse_block_size": 64, "block_sparse_homo_head_pattern": False,
            "block_sparse_num_local_blocks": 16, "block_sparse_vertical_stride": 8}


def _neutral(name: str, val) -> bool:
    if isinstance(val, torch.Tensor):
        return not bool(val.ne(0).any())
    if val is None or val is False or (isinstance(val, (int, float)) and val == 0):
        return True
    return name in _NEUTRAL and val == _NEUTRAL[name]


_PLAN_CACHE: "OrderedDict" = OrderedDict()
_KEY_RANGE: contextvars.ContextVar[int] = contextvars.ContextVar("dflash2_attention_key_range", default=0)
_BOUNDS_ON_CPU: contextvars.ContextVar[bool] = contextvars.ContextVar("dflash2_attention_bounds_on_cpu",
                                                                       default=False)


@contextlib.contextmanager
def sized_as_on_a_device():
    """Plan the enclosed CPU steps as a device plans them (:func:`_batch_plan`: the sizes from host inputs, and the
    key range of :func:`key_range`) instead of from the values: what the CPU checks and simulations of device steps
    use."""
    tok = _BOUNDS_ON_CPU.set(True)
    try:
        yield
    finally:
        _BOUNDS_ON_CPU.reset(tok)


@contextlib.contextmanager
def key_range(length: int):
    """Size the key range of every device plan in the enclosed steps to at least ``length`` keys (the bucket a CUDA
    graph is captured for: its shapes then stay fixed while the requests grow inside it; keys past a request's length
    are masked). The CPU's exact plans are not affected."""
    tok = _KEY_RANGE.set(int(length))
    try:
        yield
    finally:
        _KEY_RANGE.reset(tok)


def _host_max(t, lo: int, hi: int) -> int:
    """max of a host input's entries ``lo:hi`` (0 when empty)."""
    return int(t[lo:hi].max()) if hi > lo else 0


def _batch_plan(T, sequence_length, context_lengths, host_request_types, host_context_lengths,
                host_past_key_value_lengths, spec, spec_decoding_generation_lengths, spec_decoding_position_offsets,
                spec_decoding_packed_mask, mask_type, window) -> dict:
    """Everything of a gpt_attention call that depends only on the batch's attention parameters (shared by every
    layer that takes the same parameters in one step): each token's request, index and position, and the mask.

    It is computed where the step's data is, by tensor operations on the device inputs (``sequence_length``,
    ``context_lengths``, the spec-decoding inputs), and its sizes come from host inputs and shapes only, as the
    real plugin sizes its launches (``api_1_2.yaml`` gpt_attention_plugin_launch_sizes): the requests'
    split into context and generation from ``host_request_types`` (context requests first), the longest query from
    ``host_context_lengths`` and the spec-decoding width, the longest key range from
    ``host_past_key_value_lengths``. So on a GPU planning reads nothing back from the device and makes no
    host-to-device copy (a CUDA graph can hold the step; ``tests/engine/test_capture_safety.py`` runs it with the
    device inputs on the ``meta`` device, which has no values to read). On the CPU the values are at hand: the
    plan checks them and takes the exact sizes (the longest query and key range the values give), so the CPU
    engine's arithmetic does not depend on the bounds."""
    dev = sequence_length.device
    exact = dev.type == "cpu" and not _BOUNDS_ON_CPU.get()
    bs = sequence_length.shape[0]
    # the plugin reads the first bs entries of the host array (an older runtime revision made host_gen_eagle_net_request_types [bs, K])
    types = torch.as_tensor(host_request_types).reshape(-1)[:bs].long()
    if types.shape[0] < bs:
        raise ValueError(f"gpt_attention: host_request_types has {types.shape[0]} entries for {bs} requests")
    n_ctx = int((types == 0).sum())
    if not bool((types[:n_ctx] == 0).all()):
        raise ValueError("gpt_attention: context requests come first (the plugin splits the batch at the last "
                         "context request)")
    n_g = bs - n_ctx
    if n_ctx and host_context_lengths is None:
        raise ValueError("gpt_attention: context requests need host_context_lengths")
    host_ctx = None if host_context_lengths is None else torch.as_tensor(host_context_lengths).reshape(-1).long()
    spec_gen = bool(spec and n_g)
    if spec_gen:
        for name, t, rank in (("spec_decoding_generation_lengths", spec_decoding_generation_lengths, 1),
                              ("spec_decoding_position_offsets", spec_decoding_position_offsets, 2),
                              ("spec_decoding_packed_mask", spec_decoding_packed_mask, 2)):
            if t is None or t.dim() != rank:
                raise ValueError(f"gpt_attention: {name} must be a rank-{rank} tensor with spec decoding "
                                 f"(TensorRT-LLM's layout), got {None if t is None else tuple(t.shape)}")
        if spec_decoding_generation_lengths.shape[0] < n_g or spec_decoding_position_offsets.shape[0] < n_g:
            raise ValueError(f"gpt_attention: spec-decoding inputs cover fewer than the {n_g} generation requests")
    # a generation request's new tokens: up to the spec-decoding width (position_offsets' second dimension, as the
    # plugin takes num_decoding_draft_tokens + 1), one without spec decoding
    width = int(spec_decoding_position_offsets.shape[1]) if spec_gen else 1
    ar_b = torch.arange(bs, device=dev)
    is_ctx = ar_b < n_ctx
    gen_idx = (ar_b - n_ctx).clamp(min=0)                                    # index among generation requests
    n_gen = spec_decoding_generation_lengths.long()[gen_idx.clamp(max=max(n_g - 1, 0))] if spec_gen else \
        torch.ones(bs, dtype=torch.long, device=dev)
    if n_ctx:
        ctx_len = (host_ctx if exact else torch.as_tensor(context_lengths).reshape(-1)).long()[:bs]
        if ctx_len.shape[0] < bs:
            raise ValueError(f"gpt_attention: {ctx_len.shape[0]} context lengths for {bs} requests")
        n = torch.where(is_ctx, ctx_len.to(dev), n_gen)                     # new tokens per request
    else:
        n = n_gen
    seq = sequence_length.long()
    past = seq - n                 # context: the chunk's start; generation: the committed length
    total = seq
    if exact:
        bad = torch.nonzero((n < 0) | (past < 0)).flatten()
        if bad.numel():
            b = int(bad[0])
            raise ValueError(f"gpt_attention: request {b} has {int(n[b])} new tokens for sequence length "
                             f"{int(seq[b])}")
    T_in = T
    if not spec_gen:               # every request's token count is on the host
        T = (int(host_ctx[:n_ctx].sum()) if n_ctx else 0) + n_g
        if T != T_in and (spec or n_ctx or T > T_in):
            raise ValueError(f"gpt_attention: {T_in} tokens given, the requests own {T}")
        # T < T_in: spec_decoding_use 0 with multi-token generation requests (a draft block in a context-only step):
        # the plugin takes one token per request, the first bs tokens in order; the rest of its output is undefined
        # (zeros here). Only a discarded result may depend on this.
    if exact:
        if int(n.sum()) != T:
            raise ValueError(f"gpt_attention: {T_in} tokens given, the requests own {int(n.sum())}")
        if spec_gen and int(n[n_ctx:].max()) > width:
            raise ValueError(f"gpt_attention: a generation request has more new tokens than the {width} spec-decoding "
                             f"positions")
        if spec_gen and spec_decoding_packed_mask.shape[0] < int(n[n_ctx:].sum()):
            raise ValueError(f"gpt_attention: spec_decoding_packed_mask has {spec_decoding_packed_mask.shape[0]} rows, "
                             f"the generation requests have {int(n[n_ctx:].sum())} tokens")
    # the plugin's launch sizes: max_past_kv_length = max(host_past_key_value_lengths) of each part (a context chunk's
    # is chunk start + chunk length, a generation request's its committed length, to which its up to `width` new
    # tokens come), the longest context chunk or the generation width
    hp = torch.as_tensor(host_past_key_value_lengths).reshape(-1).long()[:bs]
    if hp.shape[0] < bs:
        raise ValueError(f"gpt_attention: host_past_key_value_lengths has {hp.shape[0]} entries for {bs} requests")
    L_host = max(_host_max(hp, 0, n_ctx), _host_max(hp, n_ctx, bs) + width if n_g else 0, 1)
    N_host = max(_host_max(host_ctx, 0, n_ctx) if n_ctx else 0, width if n_g else 0, 1)
    if exact:
        L, N = int(total.max()), int(n.max())
        host_total = total
        # what a device (and the real plugin) sizes from must cover what the values say, or it would drop keys there
        for part, lo, hi, extra in (("context", 0, n_ctx, 0), ("generation", n_ctx, bs, width)):
            if hi > lo and _host_max(hp, lo, hi) + extra < int(total[lo:hi].max()):
                raise ValueError(f"gpt_attention: the {part} requests reach {int(total[lo:hi].max())} tokens, but "
                                 f"host_past_key_value_lengths gives them {_host_max(hp, lo, hi) + extra} (the plugin "
                                 f"sizes its key range from it: max over the part"
                                 f"{' plus the spec-decoding width' if extra else ''})")
        if n_ctx and context_lengths is not None and not torch.equal(
                torch.as_tensor(context_lengths).reshape(-1)[:n_ctx].long(), host_ctx[:n_ctx]):
            raise ValueError("gpt_attention: context_lengths (device) and host_context_lengths differ for a context "
                             "request (the plugin reads the device copy in its kernels, the host one for its sizes)")
    else:
        L, N = max(L_host, _KEY_RANGE.get()), N_host
        host_total = torch.cat([hp[:n_ctx], hp[n_ctx:] + width])
    # Vectorised over the batch: every token knows its request and its index among the request's new tokens.
    cum = torch.cumsum(n, 0)
    tok = torch.arange(T, device=dev)
    req = torch.searchsorted(cum, tok, right=True).clamp(max=bs - 1)         # [T]
    local = tok - (cum - n)[req]                                             # [T]
    spec_req = (~is_ctx) & spec_gen                                          # [bs]
    if spec_gen:
        offs = spec_decoding_position_offsets.long()[gen_idx[req], local.clamp(0, width - 1)]
        pos = past[req] + torch.where(spec_req[req], offs, local)
    else:
        pos = past[req] + local
    qpos = torch.zeros(bs, N, dtype=torch.long, device=dev)
    qpos[req, local] = pos
    kpos = torch.arange(L, device=dev)
    # allowed[b, i, key]: past keys visible; new key j = key - past visible through the request's new-token mask
    i_idx = torch.arange(N, device=dev)
    j_rel = kpos[None, :] - past[:, None]                                     # [bs, L]
    is_new = (j_rel >= 0) & (kpos[None, :] < total[:, None])
    if mask_type == AttentionMaskType.causal:
        new_ok = j_rel[:, None, :] <= i_idx[None, :, None]
    else:
        new_ok = torch.ones(bs, N, L, dtype=torch.bool, device=dev)
    if spec_gen:
        # packed mask rows: the generation requests' tokens back to back ([num_gen_tokens, W], TensorRT-LLM's
        # layout); generation request g's token i is row gstart[g] + i; bit j of word j // 32: it sees new token j
        glen = spec_decoding_generation_lengths.long()[:n_g]
        gstart = torch.cumsum(glen, 0) - glen
        rows = gstart[gen_idx.clamp(max=n_g - 1)][:, None] + i_idx[None, :]   # [bs, N]
        packed = spec_decoding_packed_mask
        words = packed[rows.clamp(0, packed.shape[0] - 1)][:, :, (i_idx // 32).clamp(max=packed.shape[1] - 1)]
        bits = (((words.long() & 0xFFFFFFFF) >> (i_idx % 32)) & 1).bool()      # [bs, N, N]
        own = (i_idx[None, :] < n[:, None])                                   # [bs, N]: the request's own tokens
        m = bits & own[:, :, None] & own[:, None, :]
        jc = j_rel.clamp(0, N - 1)
        spec_ok = torch.gather(m, 2, jc[:, None, :].expand(bs, N, L))
        new_ok = torch.where(spec_req[:, None, None], spec_ok, new_ok)
    allowed = torch.where(is_new[:, None, :], new_ok, (j_rel < 0)[:, None, :])
    allowed &= (qpos[:, :, None] - kpos[None, None, :]) < window
    return {"T": T, "T_in": T_in, "bs": bs, "req": req, "local": local, "pos": pos, "past": past, "n": n,
            "total": total, "host_total": host_total, "L": L, "N": N, "allowed": allowed, "exact": exact, "rope": {}}


def _rope_from_table(plan: dict, pos, table, dim: int, max_positions: int, dtype):
    """cos / sin per token from the plugin's ``rotary_cos_sin`` input ([1, max_positions * dim] fp32, float2
    (cos, sin) per position and frequency), as the plugin reads it: a position past the table is refused."""
    # by the table's address too: the drafter's layers and the target's may share a plan with tables of their own
    # (comparing the values would read a device table back)
    key = ("table", table.data_ptr(), tuple(table.shape), dim, max_positions, dtype)
    if key not in plan["rope"]:
        if table.numel() != max_positions * dim:
            raise ValueError(f"gpt_attention: rotary_cos_sin has {table.numel()} values, expected "
                             f"rotary_embedding_max_positions {max_positions} x rotary_embedding_dim {dim}")
        if plan["exact"] and int(pos.max()) >= max_positions:
            raise IndexError(f"gpt_attention: position {int(pos.max())} is past rotary_embedding_max_positions "
                             f"{max_positions} (the plugin would read outside rotary_cos_sin)")
        if not plan["exact"] and plan["L"] > max_positions:   # every position is below the key range's bound
            raise IndexError(f"gpt_attention: the step reaches position {plan['L'] - 1}, past "
                             f"rotary_embedding_max_positions {max_positions} (the plugin would read outside "
                             f"rotary_cos_sin)")
        t = table.reshape(max_positions, dim // 2, 2)[pos.long().clamp(0, max_positions - 1).to(table.device)]
        cos, sin = t[..., 0], t[..., 1]
        plan["rope"][key] = (table, torch.cat([cos, cos], -1)[:, None, :].to(dtype),
                             torch.cat([sin, sin], -1)[:, None, :].to(dtype))
    return plan["rope"][key][1:]


def _rope_apply(x, cos, sin, dim: int):
    xr, xp = x[..., :dim], x[..., dim:]
    half = dim // 2
    rot = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    return torch.cat([xr * cos + rot * sin, xp], dim=-1)


def _plugin_facts() -> dict:
    global _FACTS
    if _FACTS is None:
        from pathlib import Path

        from ...yaml_files import load_yaml_file

        _FACTS = load_yaml_file(Path(__file__).with_name("api_1_2.yaml"))["gpt_attention_plugin_inputs"]
    return _FACTS


_FACTS = None


def check_plugin_inputs(args: dict) -> list:
    """The GPTAttention plugin's input list exactly as TensorRT-LLM's gpt_attention assembles it
    (``api_1_2.yaml`` gpt_attention_plugin_inputs): the Python-side asserts, no None entry ("Found None input
    for {idx} th item in plugin inputs"), host inputs bound by the runtime in host memory (a tensor made in the
    graph lives on the device, and the plugin dereferences these on the host), device inputs not host ones,
    and a RoPE layer's rotary tables (fp32). Returns the list (names)."""
    for name in ("host_request_types", "host_context_lengths", "host_max_attention_window_sizes",
                 "host_sink_token_length"):
        if args.get(name) is None:
            raise AssertionError(f"gpt_attention: {name} is None (TensorRT-LLM asserts it is given)")
    if not isinstance(args.get("max_context_length"), int) or isinstance(args.get("max_context_length"), bool):
        raise AssertionError("gpt_attention: max_context_length must be an int (TensorRT-LLM asserts it)")
    facts = _plugin_facts()
    pet = args["position_embedding_type"]
    if pet.name in facts["rope_tables_required_for"]:
        for name in ("rotary_inv_freq", "rotary_cos_sin"):
            if args.get(name) is None:
                raise ValueError(f"gpt_attention: a {pet.name} layer's plugin reads {name} as an input (the rotary "
                                 f"tables of RopeEmbeddingUtils.create_sinusoidal_positions_for_attention_plugin); "
                                 f"none was passed")
    names = []
    for idx, entry in enumerate(e for e in facts["inputs"] if e.get("if") is None or args.get(e["if"]) is not None):
        name = entry["name"]
        val = args.get(name)
        if val is None:
            raise AssertionError(f"gpt_attention: Found None input for {idx} th item in plugin inputs ({name})")
        host = getattr(val, "is_network_input", False) and getattr(val, "location", "device") == "host"
        if entry["memory"] == "host" and not host:
            raise ValueError(f"gpt_attention: {name} is read on the host by the plugin; it must be an engine input "
                             f"the runtime binds in host memory, not a tensor made in the graph (device memory)")
        if entry["memory"] == "device" and host:
            raise ValueError(f"gpt_attention: {name} is a device input of the plugin; the host tensor "
                             f"{getattr(val, 'input_name', '?')!r} was passed")
        if entry.get("dtype") and str(val.dtype).removeprefix("torch.") != entry["dtype"]:
            raise TypeError(f"gpt_attention: {name} must be {entry['dtype']}, got {val.dtype}")
        names.append(name)
    return names


def gpt_attention(*, qkv, past_key_value, attention_mask=None, attention_packed_mask=None,
                  sequence_length, host_past_key_value_lengths, host_max_attention_window_sizes,
                  host_sink_token_length, context_lengths, cache_indirection, host_request_types,
                  layer_idx: int, num_heads: int, num_kv_heads: int, hidden_size_per_head: int, q_scaling: float,
                  attn_logit_softcapping_scale: float = 0.0, rotary_embedding_dim: int = 0,
                  rotary_embedding_base: float = 10000.0,
                  rotary_embedding_scale_type: RotaryScalingType = RotaryScalingType.none,
                  rotary_embedding_short_m_scale: float = 1.0, rotary_embedding_long_m_scale: float = 1.0,
                  rotary_embedding_scale: float = 1.0, rotary_embedding_max_positions: int = 1024,
                  rotary_embedding_original_max_positions: int = 1024,
                  position_embedding_type: PositionEmbeddingType = PositionEmbeddingType.learned_absolute,
                  rotary_inv_freq=None, rotary_cos_sin=None, kv_orig_quant_scale=None, kv_quant_orig_scale=None,
                  attention_output_orig_quant_scale=None, attention_output_sf_scale=None, kv_cache_quant_mode=None,
                  max_context_length: int | None = None, mask_type: AttentionMaskType = AttentionMaskType.causal,
                  block_sparse_block_size: int = 64, block_sparse_homo_head_pattern: bool = False,
                  block_sparse_num_local_blocks: int = 16, block_sparse_vertical_stride: int = 8,
                  alibi_slopes=None, tp_size: int = 1, tp_rank: int = 0, vision_start: int = -1,
                  vision_length: int = -1, kv_cache_block_offsets=None, host_kv_cache_block_offsets=None,
                  host_kv_cache_pool_pointers=None, host_kv_cache_pool_mapping=None, do_cross_attention: bool = False,
                  cross_kv=None, cross_kv_length=None, encoder_input_lengths=None, relative_attention_bias=None,
                  logn_scaling=None, max_distance: int = 0, host_context_lengths=None, qkv_bias=None,
                  use_cache: bool = True, spec_decoding_is_generation_length_variable: bool = False,
                  spec_decoding_max_generation_length: int = 0, spec_decoding_generation_lengths=None,
                  spec_decoding_position_offsets=None, spec_decoding_packed_mask=None, spec_decoding_use=None,
                  long_rope_rotary_inv_freq=None, long_rope_rotary_cos_sin=None, mrope_rotary_cos_sin=None,
                  mrope_position_deltas=None, host_runtime_perf_knobs=None, host_context_progress=None,
                  is_mla_enabled_flag: bool = False, q_lora_rank: int = 0, kv_lora_rank: int = 0,
                  qk_nope_head_dim: int = 0, qk_rope_head_dim: int = 0, v_head_dim: int = 0, q_b_proj=None,
                  kv_b_proj=None, k_b_proj_trans=None, skip_attn=None, cp_group=(0,), cp_size: int = 1,
                  cp_rank: int = 0, num_kv_heads_origin: int = -1):
    """TensorRT-LLM 1.2's signature (``api_1_2.yaml``); see the module docstring for what is implemented."""
    args = dict(locals())
    unused = {k: args[k] for k in (
        "attention_mask", "attention_packed_mask", "attn_logit_softcapping_scale", "kv_orig_quant_scale",
        "kv_quant_orig_scale", "attention_output_orig_quant_scale", "attention_output_sf_scale", "alibi_slopes",
        "cross_kv", "cross_kv_length", "encoder_input_lengths", "relative_attention_bias", "logn_scaling",
        "max_distance", "qkv_bias", "long_rope_rotary_inv_freq", "long_rope_rotary_cos_sin",
        "mrope_rotary_cos_sin", "mrope_position_deltas", "is_mla_enabled_flag", "q_lora_rank", "kv_lora_rank",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_b_proj", "kv_b_proj", "k_b_proj_trans",
        "skip_attn", "tp_size", "tp_rank", "vision_start", "vision_length", "block_sparse_block_size",
        "block_sparse_homo_head_pattern", "block_sparse_num_local_blocks", "block_sparse_vertical_stride")}
    for name, val in unused.items():
        if not _neutral(name, val):
            raise NotImplementedError(f"gpt_attention stand-in: argument {name}={val!r} is not implemented")
    if qkv_bias is not None:
        raise NotImplementedError("gpt_attention stand-in: qkv_bias is not implemented")
    if cp_size != 1 or past_key_value is not None:
        raise NotImplementedError("gpt_attention stand-in: context parallelism / a contiguous KV cache")
    check_plugin_inputs(args)
    if not _neutral("host_sink_token_length", host_sink_token_length):
        raise NotImplementedError("gpt_attention stand-in: attention sink tokens are not implemented")
    if not _neutral("kv_cache_quant_mode", kv_cache_quant_mode):
        raise NotImplementedError("gpt_attention stand-in: a quantised KV cache is not implemented")
    if rotary_embedding_scale_type != RotaryScalingType.none or rotary_embedding_scale != 1.0:
        raise NotImplementedError("gpt_attention stand-in: scaled RoPE is not implemented")
    if do_cross_attention or not use_cache:
        raise NotImplementedError("gpt_attention stand-in: only paged self-attention")
    if position_embedding_type not in (PositionEmbeddingType.rope_gpt_neox, PositionEmbeddingType.learned_absolute):
        raise NotImplementedError(f"gpt_attention stand-in: position embedding {position_embedding_type!r}")
    # the batch plan is cached per set of attention-parameter tensors (the network's own objects)
    key_tensors = (sequence_length, context_lengths, host_request_types, host_context_lengths,
                   host_past_key_value_lengths, spec_decoding_generation_lengths, spec_decoding_position_offsets,
                   spec_decoding_packed_mask)
    key_ids = tuple(id(t) for t in key_tensors)
    (qkv, sequence_length, context_lengths, host_request_types, host_context_lengths, host_past_key_value_lengths,
     spec_decoding_generation_lengths, spec_decoding_position_offsets, spec_decoding_packed_mask, spec_decoding_use,
     host_max_attention_window_sizes, host_kv_cache_pool_mapping, host_kv_cache_pool_pointers, kv_cache_block_offsets,
     rotary_cos_sin) = (
        raw(t) for t in (qkv, sequence_length, context_lengths, host_request_types, host_context_lengths,
                         host_past_key_value_lengths, spec_decoding_generation_lengths, spec_decoding_position_offsets,
                         spec_decoding_packed_mask, spec_decoding_use, host_max_attention_window_sizes,
                         host_kv_cache_pool_mapping, host_kv_cache_pool_pointers, kv_cache_block_offsets,
                         rotary_cos_sin))
    H, Hkv, D = num_heads, num_kv_heads, hidden_size_per_head
    if qkv.dim() != 2 or qkv.shape[1] != (H + 2 * Hkv) * D:
        raise ValueError(f"gpt_attention: qkv must be [tokens, {(H + 2 * Hkv) * D}], got {tuple(qkv.shape)}")
    rot = rotary_embedding_dim if position_embedding_type == PositionEmbeddingType.rope_gpt_neox else 0
    spec = spec_decoding_use is not None and bool(int(torch.as_tensor(spec_decoding_use).reshape(-1)[0]))
    if mask_type not in (AttentionMaskType.causal, AttentionMaskType.bidirectional):
        raise NotImplementedError(f"gpt_attention stand-in: mask_type {mask_type!r}")
    if spec and mask_type != AttentionMaskType.causal and bool(
            (torch.as_tensor(host_request_types).reshape(-1)[:sequence_length.shape[0]] == 1).any()):
        # the real plugin runs such a call only in XQA, which takes mask_type causal only; visibility among the new
        # tokens is the packed mask's (engine/trtllm/facts/xqa_spec_decoding.yaml mask_type_required)
        raise ValueError("gpt_attention: speculative-decoding generation requests run only in XQA, which takes "
                         "mask_type causal only (\"No available XQA kernels are found for speculative decoding "
                         "mode.\"); put a bidirectional block into spec_decoding_packed_mask instead")
    pool_idx, layer_in_pool = (int(v) for v in host_kv_cache_pool_mapping[layer_idx])
    pool = KVCachePool.from_handle(host_kv_cache_pool_pointers[pool_idx, 0])
    window = int(host_max_attention_window_sizes[layer_idx])
    scale = 1.0 / (D ** 0.5 * q_scaling)
    rep = H // Hkv
    key = (key_ids, bool(spec), int(mask_type), window, qkv.shape[0], _BOUNDS_ON_CPU.get(), _KEY_RANGE.get())
    hit = _PLAN_CACHE.get(key)
    dev = qkv.device
    if hit is None:
        plan = _batch_plan(qkv.shape[0], sequence_length, context_lengths, host_request_types, host_context_lengths,
                           host_past_key_value_lengths, spec, spec_decoding_generation_lengths,
                           spec_decoding_position_offsets, spec_decoding_packed_mask, mask_type, window)
        plan["checked_pools"] = set()
        _PLAN_CACHE[key] = (key_tensors, plan)      # the tensors stay referenced: their ids cannot be reused
        while len(_PLAN_CACHE) > 8:
            _PLAN_CACHE.popitem(last=False)
    else:
        plan = hit[1]
    T, bs, pos, L, N = (plan[k] for k in ("T", "bs", "pos", "L", "N"))
    req, local, past, total, allowed = (plan[k] for k in ("req", "local", "past", "total", "allowed"))
    if plan["T_in"] != T:
        qkv = qkv[:T]
    q = qkv[:, :H * D].reshape(T, H, D)
    k = qkv[:, H * D:(H + Hkv) * D].reshape(T, Hkv, D)
    v = qkv[:, (H + Hkv) * D:].reshape(T, Hkv, D)
    if rot:
        cos, sin = _rope_from_table(plan, pos, rotary_cos_sin, rot, rotary_embedding_max_positions, q.dtype)
        q = _rope_apply(q, cos, sin, rot)
        k = _rope_apply(k, cos, sin, rot)
    offsets = kv_cache_block_offsets[pool_idx]                               # [bs, 2, max_blocks]
    tpb = pool.tokens_per_block
    need = -(-plan["host_total"] // tpb)
    short = torch.nonzero(need > offsets.shape[-1]).flatten()
    if plan["exact"] and short.numel():    # on a device the sizes are bounds; read_batch clamps past the table
        b = int(short[0])
        raise IndexError(f"gpt_attention: request {b} needs {int(need[b])} blocks for {int(total[b])} tokens, it has "
                         f"{offsets.shape[-1]} block offsets")
    if host_kv_cache_block_offsets is not None and (pool_idx, pool.handle) not in plan["checked_pools"]:
        # once per step and pool, on the host copy (the only check on a GPU, where the device one is not read back)
        pool.check_host_offsets(raw(host_kv_cache_block_offsets)[pool_idx],
                                plan["host_total"].clamp(max=offsets.shape[-1] * tpb))
        plan["checked_pools"].add((pool_idx, pool.handle))
    pool.write_tokens(layer_in_pool, offsets, req, past[req] + local, k, v)  # KV slot = past + i (not + offset)
    kk, vv = pool.read_batch(layer_in_pool, offsets, L, total, Hkv, D)    # [bs, L, Hkv, D]
    qp = torch.zeros(bs, N, H, D, dtype=torch.float32, device=dev)
    qp[req, local] = q.float()
    # scores [bs, Hkv, rep*N, L] = q [bs, Hkv, rep*N, D] @ k^T [bs, Hkv, D, L]
    qg = qp.reshape(bs, N, Hkv, rep, D).permute(0, 2, 3, 1, 4).reshape(bs, Hkv, rep * N, D)
    kt = kk.float().permute(0, 2, 3, 1)                                       # [bs, Hkv, D, L]
    sc = torch.matmul(qg, kt).reshape(bs, Hkv, rep, N, L) * scale
    sc = sc.masked_fill(~allowed[:, None, None], float("-inf"))
    pr = torch.softmax(sc, dim=-1).reshape(bs, Hkv, rep * N, L)
    o = torch.matmul(pr, vv.float().permute(0, 2, 1, 3))                      # [bs, Hkv, rep*N, D]
    o = o.reshape(bs, Hkv, rep, N, D).permute(0, 3, 1, 2, 4).reshape(bs, N, H * D)
    out = o[req, local].to(qkv.dtype)
    if plan["T_in"] != T:
        out = torch.cat([out, torch.zeros(plan["T_in"] - T, out.shape[1], dtype=out.dtype, device=dev)])
    return wrap(out), None
