"""The DFlash2 drafter in plain PyTorch, loaded strictly from the published HF format.

One drafter pass (docs/architecture.md §1) for a block that starts at absolute position ``start``::

    ctx   = hidden_norm(fc(concat(target hidden_states[id + 1] for id in target_layer_ids)))
            for the NEW committed context positions [cache.length, start)
    x     = embed_target([anchor, MASK, ..., MASK]) (* input_embedding_scale if configured)
    for each layer:
        r = x; h = input_layernorm(x); h, post = attention_conv.prepare(h)
        h = attention(q: block; k/v: [cached ctx, new ctx, block]) ; x = r + attention_conv.finish(h, post)
        r = x; h = post_attention_layernorm(x); h, post = mlp_conv.prepare(h)
        h = mlp(h) ; x = r + mlp_conv.finish(h, post)
    hidden = norm(x)[:, 1:]           (draft positions 1 .. block_size-1)
    logits = lm_head_target(hidden)   -> unary logits (output_multiplier, softcap)

Context keys/values go through each layer's OWN k_proj/v_proj, k_norm and RoPE at their absolute
positions, exactly like block keys. Attention is bidirectional inside the block and over the
context (``is_causal: false``); sliding-window layers only see keys with
``query_pos - key_pos < sliding_window`` (the transformers convention).

The drafter KV cache holds only committed context (post-norm, post-RoPE K and V per layer), so
each cycle costs one pass over the new context + the block; block K/V are never cached.

Silent failure modes: tapping ``hidden_states[id]`` instead of ``[id + 1]``; RoPE positions of
the context starting at 0 for every cycle instead of at their absolute positions; skipping
``k_norm`` on context keys; feeding the selector the pre-``norm`` hidden. None of these crash —
acceptance just collapses. The cross-check against the public implementation (see
tests/reference) pins them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DFlash2Config
from ..errors import CheckpointError, ConfigError
from .conv import DynamicConv
from .selector import PairwiseSelector, transform_unary_logits

__all__ = ["RMSNorm", "DrafterCache", "DFlash2Drafter", "extract_taps", "rope_cos_sin"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: normalise in fp32, cast back, then scale by the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Default (unscaled) RoPE tables for ``positions [T]`` -> cos, sin ``[T, head_dim]``."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device
                                        ).float() / head_dim))
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, d]; cos/sin [T, d] (rotate-half layout, as HF Qwen3)."""
    return x * cos + _rotate_half(x) * sin


def extract_taps(hidden_states, target_layer_ids) -> torch.Tensor:
    """Concatenate the OUTPUTS of the tapped target layers: HF ``hidden_states[id + 1]``.

    (``hidden_states[0]`` is the embedding output. transformers replaces the LAST entry by the
    final-normed state, so tapping the target's last layer would read the normed output — the
    same convention the published drafters were trained with; none of them taps it.)"""
    n = len(hidden_states)
    for i in target_layer_ids:
        if i + 1 >= n:
            raise ConfigError(f"target layer id {i} needs hidden_states[{i + 1}] but the target "
                              f"returned {n} hidden states", field="dflash_config.target_layer_ids")
    return torch.cat([hidden_states[i + 1] for i in target_layer_ids], dim=-1)


@dataclass
class DrafterCache:
    """Per-layer K/V of committed context positions [0, length). K is post-k_norm, post-RoPE."""

    k: list[torch.Tensor | None] = field(default_factory=list)
    v: list[torch.Tensor | None] = field(default_factory=list)
    length: int = 0


class _Attention(nn.Module):
    def __init__(self, cfg: DFlash2Config, window: int | None):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.nh, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.window = window
        self.is_causal = cfg.is_causal
        self.q_proj = nn.Linear(h, self.nh * d, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nh * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.nkv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.d).transpose(1, 2)
        return _apply_rope(k, cos, sin), v

    def forward(self, x, ctx, cache_k, cache_v, q_pos, ctx_pos, cos_q, sin_q, cos_c, sin_c):
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.nh, self.d)).transpose(1, 2)
        q = _apply_rope(q, cos_q, sin_q)
        k_blk, v_blk = self.kv(x, cos_q, sin_q)
        ks, vs = [], []
        if cache_k is not None:
            ks.append(cache_k)
            vs.append(cache_v)
        new_k = new_v = None
        if ctx is not None and ctx.shape[1]:
            new_k, new_v = self.kv(ctx, cos_c, sin_c)
            ks.append(new_k)
            vs.append(new_v)
        k = torch.cat(ks + [k_blk], dim=2)
        v = torch.cat(vs + [v_blk], dim=2)
        # key positions: all context positions 0..C-1, then the block's
        k_pos = torch.cat([torch.arange(k.shape[2] - t, device=x.device), q_pos])
        allowed = torch.ones(t, k.shape[2], dtype=torch.bool, device=x.device)
        diff = q_pos[:, None] - k_pos[None, :]
        if self.window is not None:
            allowed &= diff < self.window
        if self.is_causal:
            allowed &= diff >= 0
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * (self.d ** -0.5)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, self.nh * self.d)
        return self.o_proj(out), new_k, new_v


class _MLP(nn.Module):
    def __init__(self, h: int, i: int):
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, cfg: DFlash2Config, idx: int):
        super().__init__()
        h = cfg.hidden_size
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = _Attention(cfg, cfg.layer_window(idx))
        self.mlp = _MLP(h, cfg.intermediate_size)
        conv = lambda: DynamicConv(h, cfg.conv_kernel_size, cfg.conv_group_size, cfg.block_size)  # noqa: E731
        self.attention_conv = conv()
        self.mlp_conv = conv()


class DFlash2Drafter(nn.Module):
    """DFlash2 drafter (backbone + conv + pairwise selector). Parameter names = the published
    checkpoint tensor names, so :meth:`from_pretrained` is a strict ``load_state_dict``."""

    def __init__(self, cfg: DFlash2Config, target_hidden_size: int | None = None):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        th = target_hidden_size or h
        self.fc = nn.Linear(cfg.num_taps * th, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(_Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.candidate_selector = PairwiseSelector(h, cfg.vocab_size, cfg.selector_rank, cfg.selector_top_k)
        if cfg.rope_type != "default":
            raise ConfigError(f"only rope_type 'default' is implemented, got {cfg.rope_type!r}",
                              source=cfg.source, field="rope_parameters.rope_type")

    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    # ---- loading ---------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, directory: str | Path, *, block_size: int | None = None,
                        dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
                        target_hidden_size: int | None = None) -> "DFlash2Drafter":
        """Strict load: every published tensor must be present with its exact shape and dtype,
        and no other tensor may exist (a renamed or extra tensor is an error, never ignored).

        The directory goes through :func:`dflash2_trt.loading.validate_drafter` first (config,
        headers, the published inventory), so the errors are the ones ``inspect`` reports; every
        tensor is then checked for NaN/Inf as it is read."""
        from ..loading import validate_drafter

        directory = Path(directory)
        cfg, ckpt = validate_drafter(directory, check_values=False, target_hidden_size=target_hidden_size)
        if block_size is not None and block_size != cfg.block_size:
            cfg = cfg.with_block_size(block_size)
        with torch.device("meta"):
            model = cls(cfg, target_hidden_size)
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        if set(expected) != set(ckpt.keys()):  # the module and the published inventory disagree: a bug here
            raise CheckpointError(f"drafter module and published inventory differ: "
                                  f"{sorted(set(expected) ^ set(ckpt.keys()))[:5]}", file=directory)
        dt = dtype or _DTYPES[cfg.dtype]
        sd = {}
        for name, shape in expected.items():
            t = ckpt.get(name)
            if tuple(t.shape) != shape:
                raise CheckpointError(f"shape {list(t.shape)}, expected {list(shape)}",
                                      file=directory, tensor=name)
            sd[name] = t.to(device=device, dtype=dt)
        model.load_state_dict(sd, strict=True, assign=True)
        return model.eval()

    # ---- forward ---------------------------------------------------------------------------
    def context_features(self, taps: torch.Tensor) -> torch.Tensor:
        """``[B, C, n_taps * H_target]`` -> ``hidden_norm(fc(taps))`` ``[B, C, H]``."""
        return self.hidden_norm(self.fc(taps))

    def new_cache(self) -> DrafterCache:
        n = len(self.layers)
        return DrafterCache([None] * n, [None] * n, 0)

    def forward(self, block_embeds: torch.Tensor, new_taps: torch.Tensor | None, start: int,
                cache: DrafterCache | None = None, *, commit: bool = True) -> torch.Tensor:
        """One drafter pass.

        Args:
            block_embeds: ``[B, T, H]`` target embeddings of ``[anchor, MASK, ...]`` (T = block
                size; several packed blocks are not supported here).
            new_taps: ``[B, C_new, n_taps*H_t]`` tapped target hidden states of the context
                positions ``[start - C_new, start)`` not yet in ``cache``.
            start: absolute position of the anchor.
            cache: committed context K/V; extended with the new context when ``commit``.

        Returns the final-normed hidden states ``[B, T, H]`` of all block positions.
        """
        cache = cache if cache is not None else self.new_cache()
        b, t, _ = block_embeds.shape
        dev = block_embeds.device
        c_new = 0 if new_taps is None else new_taps.shape[1]
        if cache.length + c_new != start:
            raise ValueError(f"drafter: cache holds {cache.length} context positions + {c_new} new "
                             f"!= anchor position {start}")
        ctx = self.context_features(new_taps) if c_new else None
        dt = block_embeds.dtype
        q_pos = torch.arange(start, start + t, device=dev)
        c_pos = torch.arange(cache.length, start, device=dev)
        cos_q, sin_q = rope_cos_sin(q_pos, self.cfg.head_dim, self.cfg.rope_theta, dt)
        cos_c, sin_c = rope_cos_sin(c_pos, self.cfg.head_dim, self.cfg.rope_theta, dt)
        x = block_embeds
        new_kv = []
        for i, layer in enumerate(self.layers):
            r = x
            h, post = layer.attention_conv.prepare(layer.input_layernorm(x), t)
            h, nk, nv = layer.self_attn(h, ctx, cache.k[i], cache.v[i], q_pos, c_pos,
                                        cos_q, sin_q, cos_c, sin_c)
            x = r + layer.attention_conv.finish(h, post, t)
            r = x
            h, post = layer.mlp_conv.prepare(layer.post_attention_layernorm(x), t)
            x = r + layer.mlp_conv.finish(layer.mlp(h), post, t)
            new_kv.append((nk, nv))
        if commit and c_new:
            for i, (nk, nv) in enumerate(new_kv):
                cache.k[i] = nk if cache.k[i] is None else torch.cat([cache.k[i], nk], dim=2)
                cache.v[i] = nv if cache.v[i] is None else torch.cat([cache.v[i], nv], dim=2)
            cache.length = start
        return self.norm(x)

    def embed_block(self, block_ids: torch.Tensor, embed: nn.Embedding) -> torch.Tensor:
        """Block embeddings: a plain lookup in the TARGET's embedding table.

        Deliberately ``F.embedding(ids, embed.weight)`` and not ``embed(ids)``: Muse Glimmer's
        target embedding module applies a weight-less RMSNorm after the lookup
        (``MuseGlimmerTextNormedEmbedding.embed_norm``), and DFlash drafters embed WITHOUT it
        (transformers' DFlash candidate generator bypasses ``embed_norm`` for the same reason).
        Calling the module would silently feed normed embeddings — acceptance drops, nothing
        errors. ``input_embedding_scale`` (absent in the published drafters) multiplies after.
        """
        e = F.embedding(block_ids, embed.weight)
        if self.cfg.input_embedding_scale is not None:
            e = e * self.cfg.input_embedding_scale
        return e

    def unary_logits(self, hidden: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor]
                     ) -> torch.Tensor:
        """fp32 unary logits of draft positions: transform(lm_head_target(hidden))."""
        return transform_unary_logits(lm_head(hidden), self.cfg.output_multiplier,
                                      self.cfg.final_logit_softcapping)
