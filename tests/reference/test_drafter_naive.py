"""The drafter pass against an independent, naive re-implementation written from docs/architecture.md §1
(raw tensors from the safetensors file, float64, explicit per-position / per-head loops; no code
from dflash2_trt.reference). Without it, the drafter is only checked against itself (cache vs
recompute) and against a training script that uses the same module, so a wrong tap index, conv
order, coefficient source or RoPE position would go unnoticed (acceptance would just be lower).
"""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from dflash2_trt.assets import trained_pair
from dflash2_trt.reference.drafter import DFlash2Drafter, extract_taps


def _rms(x, w, eps):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rope(v, pos, theta):
    """Rotate-half RoPE of one head vector v [d] at absolute position pos."""
    d = v.shape[0]
    out = v.clone()
    for i in range(d // 2):
        ang = pos * theta ** (-2.0 * i / d)
        c, s = math.cos(ang), math.sin(ang)
        out[i] = v[i] * c - v[i + d // 2] * s
        out[i + d // 2] = v[i + d // 2] * c + v[i] * s
    return out


def _conv(x, proj, base, side, K, G, block):
    """y[t, c] = sum_j (base[side, j, c] + proj[t, side, j, c // G]) * x[t - j, c], taps within the block."""
    T, H = x.shape
    y = torch.zeros_like(x)
    for t in range(T):
        for j in range(K):
            if t % block - j < 0:
                continue
            coef = base[side, j] + proj[t, side, j].repeat_interleave(G)
            y[t] += coef * x[t - j]
    return y


def naive_pass(sd, cfg, taps, block_emb, start):
    """Final-normed hidden states [T, H] of one drafter pass, context positions 0..start-1."""
    dc = cfg["dflash_config"]
    eps, H, nh, nkv, d = cfg["rms_norm_eps"], cfg["hidden_size"], cfg["num_attention_heads"], \
        cfg["num_key_value_heads"], cfg["head_dim"]
    theta = cfg["rope_parameters"]["rope_theta"]
    K, G, T = dc["conv_kernel_size"], dc["conv_group_size"], block_emb.shape[0]
    ng = H // G
    C = taps.shape[0]
    assert C == start
    ctx = _rms(taps @ sd["fc.weight"].T, sd["hidden_norm.weight"], eps)
    x = block_emb
    for i, kind in enumerate(cfg["layer_types"]):
        p = f"layers.{i}."
        window = cfg["sliding_window"] if kind == "sliding_attention" else None
        # ---- attention half: residual -> norm -> pre-conv -> attention -> post-conv -> + residual
        hn = _rms(x, sd[p + "input_layernorm.weight"], eps)
        proj = (hn @ sd[p + "attention_conv.kernel_projection.weight"].T).reshape(T, 2, K, ng)
        base = sd[p + "attention_conv.base_kernel"]
        a_in = _conv(hn, proj, base, 0, K, G, T)
        wq, wk, wv, wo = (sd[p + f"self_attn.{n}_proj.weight"] for n in "qkvo")
        qn, kn = sd[p + "self_attn.q_norm.weight"], sd[p + "self_attn.k_norm.weight"]
        kv_src = torch.cat([ctx, a_in])                   # context then block
        kv_pos = list(range(C)) + list(range(start, start + T))
        keys = [[_rope(_rms((src @ wk.T)[g * d:(g + 1) * d], kn, eps), kv_pos[n], theta)
                 for g in range(nkv)] for n, src in enumerate(kv_src)]
        vals = [[(src @ wv.T)[g * d:(g + 1) * d] for g in range(nkv)] for src in kv_src]
        att = torch.zeros(T, nh * d, dtype=x.dtype)
        for t in range(T):
            qp = start + t
            for h in range(nh):
                g = h // (nh // nkv)
                q = _rope(_rms((a_in[t] @ wq.T)[h * d:(h + 1) * d], qn, eps), qp, theta)
                allowed = [n for n in range(len(kv_pos)) if window is None or qp - kv_pos[n] < window]
                sc = torch.stack([q @ keys[n][g] for n in allowed]) / math.sqrt(d)
                w = torch.softmax(sc, 0)
                att[t, h * d:(h + 1) * d] = sum(w[m] * vals[n][g] for m, n in enumerate(allowed))
        x = x + _conv(att @ wo.T, proj, base, 1, K, G, T)
        # ---- MLP half
        hn = _rms(x, sd[p + "post_attention_layernorm.weight"], eps)
        proj = (hn @ sd[p + "mlp_conv.kernel_projection.weight"].T).reshape(T, 2, K, ng)
        base = sd[p + "mlp_conv.base_kernel"]
        m_in = _conv(hn, proj, base, 0, K, G, T)
        gate = m_in @ sd[p + "mlp.gate_proj.weight"].T
        up = m_in @ sd[p + "mlp.up_proj.weight"].T
        mlp = (gate * torch.sigmoid(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
        x = x + _conv(mlp, proj, base, 1, K, G, T)
    return _rms(x, sd["norm.weight"], eps)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_drafter_pass_equals_naive_reimplementation(family):
    d = trained_pair(family).drafter_dir
    cfg = json.loads((d / "config.json").read_text())
    sd = {k: v.double() for k, v in load_file(str(d / "model.safetensors")).items()}
    bs = 4
    m = DFlash2Drafter.from_pretrained(d, block_size=bs)
    g = torch.Generator().manual_seed(5)
    start = cfg["sliding_window"] + 3          # longer than layer 0's window: the mask matters
    taps = torch.randn(1, start, m.fc.in_features, generator=g)
    emb = torch.randn(1, bs, cfg["hidden_size"], generator=g)
    with torch.no_grad():
        got = m(emb, taps, start, None)[0]
    want = naive_pass(sd, cfg, taps[0].double(), emb[0].double(), start)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_extract_taps_reads_layer_outputs():
    """hidden_states[0] is the embedding output, so layer id i is hidden_states[i + 1]."""
    hs = tuple(torch.full((1, 2, 3), float(n)) for n in range(5))
    got = extract_taps(hs, [0, 2])
    assert got.shape == (1, 2, 6)
    assert got[0, 0].tolist() == [1.0] * 3 + [3.0] * 3
