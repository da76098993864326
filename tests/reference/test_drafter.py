"""Drafter: strict loading of the published tensor names, KV cache == recompute, sliding window."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash2_trt.config import DFlash2Config
from dflash2_trt.errors import CheckpointError
from dflash2_trt.reference.drafter import DFlash2Drafter, _Attention, rope_cos_sin
from dflash2_trt.testing.tiny import tiny_pair


@pytest.fixture(scope="module")
def tiny_dir():
    return tiny_pair("qwen3").drafter_dir


def _copy(src, dst, edit):
    shutil.copytree(src, dst)
    sd = load_file(str(dst / "model.safetensors"))
    edit(sd)
    save_file(sd, str(dst / "model.safetensors"))
    return dst


def test_strict_loading_errors(tiny_dir, tmp_path):
    m = DFlash2Drafter.from_pretrained(tiny_dir)
    assert not any(p.is_meta for p in m.parameters())
    d = _copy(tiny_dir, tmp_path / "missing", lambda sd: sd.pop("layers.1.mlp_conv.base_kernel"))
    with pytest.raises(CheckpointError, match="missing.*layers.1.mlp_conv.base_kernel"):
        DFlash2Drafter.from_pretrained(d)
    d = _copy(tiny_dir, tmp_path / "extra", lambda sd: sd.update({"model.embed_tokens.weight": torch.zeros(2, 2)}))
    with pytest.raises(CheckpointError, match="unexpected.*model.embed_tokens.weight"):
        DFlash2Drafter.from_pretrained(d)
    d = _copy(tiny_dir, tmp_path / "shape", lambda sd: sd.update(
        {"candidate_selector.successor_codebook": torch.zeros(256, 8)}))
    with pytest.raises(CheckpointError, match="successor_codebook"):
        DFlash2Drafter.from_pretrained(d)


def test_loaded_values_match_file(tiny_dir):
    m = DFlash2Drafter.from_pretrained(tiny_dir)
    sd = load_file(str(tiny_dir / "model.safetensors"))
    assert set(sd) == set(m.state_dict())
    for k, v in m.state_dict().items():
        assert torch.equal(v, sd[k]), k


@pytest.mark.parametrize("bs", [4, 8])
def test_cache_equals_recompute(tiny_dir, bs):
    """Feeding the context in several committed chunks gives the same block hidden states as one
    pass over the whole context (the cache holds post-norm, post-RoPE K/V at absolute positions)."""
    m = DFlash2Drafter.from_pretrained(tiny_dir, block_size=bs)
    g = torch.Generator().manual_seed(0)
    c_total = 23          # longer than the sliding window (16) of layer 0
    taps = torch.randn(1, c_total, m.fc.in_features, generator=g)
    emb = torch.randn(1, bs, 64, generator=g)
    with torch.no_grad():
        full = m(emb, taps, c_total, None)
        cache = m.new_cache()
        s = 0
        for chunk in (5, 1, 9, 8):
            out = m(emb, taps[:, s:s + chunk], s + chunk, cache)
            s += chunk
        assert cache.length == c_total
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)


def test_sliding_window_limits_context_keys():
    cfg = DFlash2Config.from_hugging_face(json.loads((tiny_pair("qwen3").drafter_dir / "config.json").read_text()))
    torch.manual_seed(0)
    w, start, t = 6, 10, 4
    att = _Attention(cfg, window=w)
    ctx = torch.randn(1, start, 64)
    x = torch.randn(1, t, 64)
    q_pos = torch.arange(start, start + t)
    c_pos = torch.arange(0, start)
    cq, sq = rope_cos_sin(q_pos, cfg.head_dim, cfg.rope_theta, torch.float32)
    cc, sc = rope_cos_sin(c_pos, cfg.head_dim, cfg.rope_theta, torch.float32)

    def run(c):
        with torch.no_grad():
            return att(x, c, None, None, q_pos, c_pos, cq, sq, cc, sc)[0]

    base = run(ctx)
    far = ctx.clone()
    far[:, start - w] += 5.0        # q_pos - k_pos >= w for every query: invisible
    torch.testing.assert_close(run(far), base)
    near = ctx.clone()
    near[:, start - w + 1] += 5.0   # visible to the anchor query only
    out = run(near)
    assert not torch.allclose(out[:, 0], base[:, 0])
    torch.testing.assert_close(out[:, 1:], base[:, 1:])


def test_embedding_bypasses_embed_norm_and_scales(tiny_dir):
    """Block embeddings are a raw lookup in the target table (a normed-embedding wrapper such as
    Muse Glimmer's is bypassed); input_embedding_scale and the unary transform come from the
    drafter config."""
    from dataclasses import replace

    m = DFlash2Drafter.from_pretrained(tiny_dir)

    class NormedEmbedding(torch.nn.Embedding):
        def forward(self, ids):
            e = super().forward(ids)
            return e / e.norm(dim=-1, keepdim=True)

    emb = NormedEmbedding(256, 64)
    ids = torch.tensor([[3, 255, 255]])
    torch.testing.assert_close(m.embed_block(ids, emb), emb.weight[ids])
    m.cfg = replace(m.cfg, input_embedding_scale=2.5, output_multiplier=0.2, final_logit_softcapping=3.0)
    torch.testing.assert_close(m.embed_block(ids, emb), 2.5 * emb.weight[ids])
    lm = torch.nn.Linear(64, 256, bias=False)
    h = torch.randn(1, 2, 64)
    with torch.no_grad():
        torch.testing.assert_close(m.unary_logits(h, lm), torch.tanh(lm(h) * 0.2 / 3.0) * 3.0)
