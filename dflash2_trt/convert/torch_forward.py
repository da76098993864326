"""Layout proof: run a converted checkpoint in plain torch, with tensor parallelism simulated.

Reads ONLY the converted directory (``config.json`` + ``rank{N}.safetensors``, TensorRT-LLM
names): never the HF checkpoints. Each rank computes with its own shards exactly as a
TensorRT-LLM rank would — fused qkv split into its local q/k/v heads, column-parallel outputs
kept local, row-parallel partial sums added up (the all-reduce), ``lm_head`` and the drafter's
``fc`` gathered over ranks. If the forward reproduces transformers' target logits and the
reference drafter's logits, the names, fusions, splits and config fields written by the
converter mean what the network will assume they mean.

Everything runs in float32 (weights are upcast), so dtype casts in the conversion are the only
source of differences. Muse Glimmer targets (``qwen_type: muse_glimmer``) read their extra keys
(``q_scaling``, weight-less q/k norm, per-layer NoPE, the sandwich norms with their own eps, the
plain ``ln_f``, the embedding norm, the logit multiplier and softcap) from config.json exactly as
:mod:`.schema` defines them; a target's sliding-window layers are masked to their window. For the Gated DeltaNet recurrence it calls transformers' torch reference
(``torch_chunk_gated_delta_rule``); for the DFlash2 conv, the project's reference
:func:`~dflash2_trt.reference.conv.dynamic_conv`: the point is the layout, not those kernels.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ..transformers_support import require_supported_transformers
from .schema import CheckpointConfig


class ConvertedCheckpoint:
    """Rank shards of a converted checkpoint, loaded as float32 tensors."""

    def __init__(self, directory: str | Path):
        from safetensors.torch import load_file

        self.directory = Path(directory)
        self.config = CheckpointConfig.load(self.directory)
        self.tp = self.config.tp_size
        self.shards = [load_file(str(self.directory / f"rank{r}.safetensors")) for r in range(self.tp)]

    def w(self, rank: int, name: str) -> torch.Tensor:
        return self.shards[rank][name].float()

    def ranks(self, name: str) -> list[torch.Tensor]:
        return [self.w(r, name) for r in range(self.tp)]


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (w + offset)


def _rope(x: torch.Tensor, pos: torch.Tensor, rotary_dim: int, base: float) -> torch.Tensor:
    """Rotate-half RoPE on the first ``rotary_dim`` dims of x ``[B, heads, T, d]``."""
    inv = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    f = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
    xr, xp = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rot = torch.cat([-xr[..., half:], xr[..., :half]], -1)
    return torch.cat([xr * cos + rot * sin, xp], -1)


def _local_heads(n: int, tp: int) -> int:
    """Heads (or head groups) one rank holds: n / tp, or 1 duplicated group when n < tp."""
    return n // tp if n >= tp else 1


def _attention(ck: ConvertedCheckpoint, pre: str, x: torch.Tensor, *, heads: int, kv_heads: int, d: int,
               rotary_dim: int, base: float, eps: float, offset: float, q_pos: torch.Tensor,
               ctx: torch.Tensor | None = None, k_pos: torch.Tensor | None = None, causal: bool = True,
               window: int | None = None, gated: bool = False, qk_weight: bool = True,
               q_scaling: float = 1.0) -> torch.Tensor:
    """Sum over ranks of one attention block. ``ctx`` (drafter): extra key/value inputs before x.

    ``base`` 0: no rotary (NoPE). ``qk_weight`` False: the q/k RMSNorm has no weights. Softmax
    scale ``1 / (q_scaling * sqrt(d))`` (TensorRT-LLM's ``q_scaling``)."""
    b, t, _ = x.shape
    nq, nkv = heads // ck.tp, _local_heads(kv_heads, ck.tp)
    total = 0.0
    for r in range(ck.tp):
        wqkv = ck.w(r, pre + "qkv.weight")
        assert wqkv.shape[0] == (nq + 2 * nkv) * d, (pre, wqkv.shape)

        def proj(inp):
            qkv = inp @ wqkv.T
            q, k, v = qkv.split([nq * d, nkv * d, nkv * d], -1)
            return (q.view(*inp.shape[:2], nq, d).transpose(1, 2), k.view(*inp.shape[:2], nkv, d).transpose(1, 2),
                    v.view(*inp.shape[:2], nkv, d).transpose(1, 2))

        def norm(t, which):
            return _rms(t, ck.w(r, pre + which) if qk_weight else torch.ones(()), eps, offset if qk_weight else 0.0)

        def rope(t, pos):
            return _rope(t, pos, rotary_dim, base) if base else t

        q, k, v = proj(x)
        q = rope(norm(q, "q_layernorm.weight"), q_pos)
        k = rope(norm(k, "k_layernorm.weight"), q_pos)
        kp = q_pos
        if ctx is not None:
            _, kc, vc = proj(ctx)
            kc = rope(norm(kc, "k_layernorm.weight"), k_pos)
            k, v, kp = torch.cat([kc, k], 2), torch.cat([vc, v], 2), torch.cat([k_pos, q_pos])
        rep = nq // nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        diff = q_pos[:, None] - kp[None, :]
        allowed = torch.ones_like(diff, dtype=torch.bool)
        if causal:
            allowed &= diff >= 0
        if window is not None:
            allowed &= diff < window
        s = (q @ k.transpose(-1, -2)) / (q_scaling * d ** 0.5)
        p = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
        o = (p @ v).transpose(1, 2).reshape(b, t, nq * d)
        if gated:
            o = o * torch.sigmoid(x @ ck.w(r, pre + "output_gate.weight").T)
        total = total + o @ ck.w(r, pre + "dense.weight").T
    return total


def _mlp(ck: ConvertedCheckpoint, pre: str, x: torch.Tensor) -> torch.Tensor:
    total = 0.0
    for r in range(ck.tp):
        h = F.silu(x @ ck.w(r, pre + "fc.weight").T) * (x @ ck.w(r, pre + "gate.weight").T)
        total = total + h @ ck.w(r, pre + "proj.weight").T
    return total


def _gated_deltanet(ck: ConvertedCheckpoint, pre: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    la = ck.config["linear_attention"]
    nk, nv = _local_heads(la["num_key_heads"], ck.tp), la["num_value_heads"] // ck.tp
    dk, dv, ks = la["key_head_dim"], la["value_head_dim"], la["conv_kernel_size"]
    b, t, _ = x.shape
    total = 0.0
    for r in range(ck.tp):
        qkv = x @ ck.w(r, pre + "qkv.weight").T                      # [B, T, C]
        conv_w = ck.w(r, pre + "conv1d.weight")                        # [C, 1, K]
        assert conv_w.shape == (qkv.shape[-1], 1, ks), conv_w.shape
        qkv = F.silu(F.conv1d(qkv.transpose(1, 2), conv_w, padding=ks - 1, groups=qkv.shape[-1])[..., :t])
        q, k, v = qkv.transpose(1, 2).split([nk * dk, nk * dk, nv * dv], -1)
        z = (x @ ck.w(r, pre + "z.weight").T).view(b, t, nv, dv)
        beta = torch.sigmoid(x @ ck.w(r, pre + "b.weight").T)
        g = -ck.w(r, pre + "A_log").exp() * F.softplus(x @ ck.w(r, pre + "a.weight").T + ck.w(r, pre + "dt_bias"))
        core, _ = torch_chunk_gated_delta_rule(q.reshape(b, t, nk, dk), k.reshape(b, t, nk, dk),
                                               v.reshape(b, t, nv, dv), g=g, beta=beta,
                                               use_qk_l2norm_in_kernel=True)
        core = _rms(core.float(), ck.w(r, pre + "norm.weight"), eps) * F.silu(z)
        total = total + core.reshape(b, t, nv * dv) @ ck.w(r, pre + "dense.weight").T
    return total


def _embed(ck: ConvertedCheckpoint, ids: torch.Tensor) -> torch.Tensor:
    """Vocab-parallel lookup: each rank contributes the rows it holds, zeros elsewhere; summed."""
    total = 0.0
    start = 0
    for w in ck.ranks("transformer.vocab_embedding.weight"):
        local = ids - start
        mine = (local >= 0) & (local < w.shape[0])
        total = total + w[local.clamp(0, w.shape[0] - 1)] * mine[..., None]
        start += w.shape[0]
    return total


def _lm_head(ck: ConvertedCheckpoint, h: torch.Tensor) -> torch.Tensor:
    return torch.cat([h @ w.T for w in ck.ranks("lm_head.weight")], -1)


def target_forward(ck: ConvertedCheckpoint, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Causal forward over ``input_ids [B, T]`` (positions 0..T-1). Returns (logits, hidden states):
    ``hidden[0]`` = embeddings, ``hidden[i + 1]`` = output of layer i (HF ``hidden_states``; the last
    is before ln_f)."""
    c = ck.config
    if "linear_attention" in c["layer_types"]:   # once per forward: its Gated DeltaNet is transformers' own function
        require_supported_transformers("the converter's Gated DeltaNet check")
    eps, off = c["norm_epsilon"], c["layernorm_weight_offset"]
    muse = c.family == "muse_glimmer"   # its keys exist only there (schema.FAMILY_KEYS)
    post_eps = c["post_norm_epsilon"] if muse else eps
    x = _embed(ck, input_ids)
    if muse and c["embedding_norm"]:
        x = _rms(x, torch.ones(()), eps)
    pos = torch.arange(input_ids.shape[1])
    hidden = [x]
    for i, kind in enumerate(c["layer_types"]):
        p = f"transformer.layers.{i}."
        h = _rms(x, ck.w(0, p + "input_layernorm.weight"), eps, off)
        if kind == "linear_attention":
            a = _gated_deltanet(ck, p + "linear_attention.", h, eps)
        else:
            a = _attention(ck, p + "attention.", h, heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"],
                           d=c["head_size"], rotary_dim=c["rotary_dim"],
                           base=c["layer_rotary_base"][i] if muse else c["rotary_base"], eps=eps, offset=off,
                           q_pos=pos, gated=c["attn_output_gate"],
                           window=c["sliding_window"] if kind == "sliding_attention" else None,
                           qk_weight=c["qk_layernorm_weight"] if muse else True,
                           q_scaling=c["q_scaling"] if muse else 1.0)
        if muse and c["inter_layernorms"]:   # Gemma-2 sandwich: post norms on the sub-layer outputs
            x = x + _rms(a, ck.w(0, p + "post_layernorm.weight"), post_eps, off)
            m = _mlp(ck, p + "mlp.", _rms(x, ck.w(0, p + "pre_feedforward_layernorm.weight"), eps, off))
            x = x + _rms(m, ck.w(0, p + "post_feedforward_layernorm.weight"), post_eps, off)
        else:
            x = x + a
            x = x + _mlp(ck, p + "mlp.", _rms(x, ck.w(0, p + "post_layernorm.weight"), eps, off))
        hidden.append(x)
    logits = _lm_head(ck, _rms(x, ck.w(0, "transformer.ln_f.weight"), eps, c["ln_f_weight_offset"] if muse else off))
    if muse:
        cap = c["final_logit_softcapping"]
        logits = logits * c["output_multiplier"]
        if cap:
            logits = cap * torch.tanh(logits / cap)
    return logits, hidden


def drafter_forward(ck: ConvertedCheckpoint, block_ids: torch.Tensor, taps: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One drafter pass for a block ``[anchor, MASK...]`` at positions C..C+T-1 over the context
    ``taps [B, C, n_taps*H_target]`` at positions 0..C-1. Returns (final-normed hidden ``[B, T, H]``,
    unary logits of draft positions ``[B, T-1, V]`` fp32, ``hidden_projection`` of them ``[B, T-1, R]``)."""
    from ..reference.conv import dynamic_conv
    from ..reference.selector import transform_unary_logits

    dc = ck.config.dflash2
    pre = dc["tensor_prefix"]
    eps, bs, k_sz, g = dc["rms_norm_eps"], block_ids.shape[1], dc["conv_kernel_size"], dc["conv_group_size"]
    ctx = torch.cat([taps @ w.T for w in ck.ranks(pre + "fc.weight")], -1)   # column-parallel, gathered
    ctx = _rms(ctx, ck.w(0, pre + "hidden_norm.weight"), eps)
    assert dc["embedding"] == "transformer.vocab_embedding.weight"
    x = _embed(ck, block_ids)
    if dc["input_embedding_scale"] is not None:
        x = x * dc["input_embedding_scale"]
    c = taps.shape[1]
    q_pos, k_pos = torch.arange(c, c + bs), torch.arange(c)

    def conv(name, h):
        kp = h @ ck.w(0, f"{name}.kernel_projection.weight").T
        delta = kp.view(*h.shape[:-1], 2, k_sz, h.shape[-1] // g)          # [side, tap, group]
        base = ck.w(0, f"{name}.base_kernel")
        return delta, base

    for i, kind in enumerate(dc["layer_types"]):
        p = f"{pre}layers.{i}."
        h = _rms(x, ck.w(0, p + "input_layernorm.weight"), eps)
        delta, base = conv(p + "attention_conv", h)
        h = dynamic_conv(h, delta[..., 0, :, :], base[0], block_size=bs, group_size=g)
        h = _attention(ck, p + "attention.", h, heads=dc["num_attention_heads"], kv_heads=dc["num_key_value_heads"],
                       d=dc["head_dim"], rotary_dim=dc["head_dim"], base=dc["rope_theta"], eps=eps, offset=0.0,
                       q_pos=q_pos, ctx=ctx, k_pos=k_pos, causal=dc["is_causal"],
                       window=dc["sliding_window"] if kind == "sliding_attention" else None)
        x = x + dynamic_conv(h, delta[..., 1, :, :], base[1], block_size=bs, group_size=g)
        h = _rms(x, ck.w(0, p + "post_layernorm.weight"), eps)
        delta, base = conv(p + "mlp_conv", h)
        h = _mlp(ck, p + "mlp.", dynamic_conv(h, delta[..., 0, :, :], base[0], block_size=bs, group_size=g))
        x = x + dynamic_conv(h, delta[..., 1, :, :], base[1], block_size=bs, group_size=g)
    hidden = _rms(x, ck.w(0, pre + "norm.weight"), eps)
    draft = hidden[:, 1:]
    unary = transform_unary_logits(_lm_head(ck, draft), dc["output_multiplier"], dc["final_logit_softcapping"])
    proj = draft @ ck.w(0, pre + "selector.hidden_projection.weight").T
    return hidden, unary, proj
