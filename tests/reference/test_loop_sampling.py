"""End-to-end sampling check through `speculative_generate` (not just the verify function):
a small-vocabulary pair (V=8) built in the test — a 1-layer random Qwen3 target and a random
DFlash2 drafter whose proposal differs from the target (top-4 candidates, so q is zero on half
the vocabulary) — and the joint distribution of the first two generated tokens. The first token
comes from the prefill; the second from the first draft/verify cycle (accepted draft or
correction), so wiring errors in the loop (p and q rows misaligned, q taken from the wrong
tensor) show up here.

Significance level alpha = 1e-3, fixed seeds, N = 1000 runs (the 2%-TV sensitivity is shown on
200k samples in test_verify.py; this test is sized for CI time and is asserted to reject the
perturbed-q loop, with half as many runs: measured p ~ 1e-40 at 600 runs, 1e-90 at 1000).
"""

import warnings

import pytest
import torch
from scipy.stats import chisquare

import dflash2_trt.reference.loop as loop
from dflash2_trt.config import DFlash2Config
from dflash2_trt.reference.drafter import DFlash2Drafter
from dflash2_trt.reference.loop import speculative_generate

V, N, ALPHA, T = 8, 1000, 1e-3, 1.0
PROMPT = [3, 1, 4]


@pytest.fixture(scope="module")
def small_pair():
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    tcfg = transformers.Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                    max_position_embeddings=64, tie_word_embeddings=False)
    target = transformers.Qwen3ForCausalLM(tcfg).eval()
    with torch.no_grad():
        for n, p in target.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.5 / p.shape[1] ** 0.5)
    dcfg = DFlash2Config.from_hugging_face({
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "hidden_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "intermediate_size": 64, "vocab_size": V, "num_target_layers": 1, "rms_norm_eps": 1e-6,
        "layer_types": ["full_attention"], "is_causal": False, "dtype": "float32",
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "dflash_config": {"block_size": 3, "mask_token_id": V - 1, "target_layer_ids": [0],
                          "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 4,
                          "selector_top_k": 4}})
    drafter = DFlash2Drafter(dcfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in drafter.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() == 2 else 0.1)
                    + (1.0 if n.endswith("norm.weight") else 0.0))
    return target, drafter


def _exact_joint(target):
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([PROMPT])).logits[0, -1].double() / T, -1)
        rows = torch.stack([torch.softmax(target(torch.tensor([PROMPT + [a]])).logits[0, -1].double() / T, -1)
                            for a in range(V)])
    return (p1[:, None] * rows).reshape(-1)


def _samples(target, drafter, runs=N):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = []
        for s in range(runs):
            r = speculative_generate(target, drafter, PROMPT, max_new_tokens=2, selector="sample",
                                     temperature=T, seed=s)
            out.append(r.output_ids[0] * V + r.output_ids[1])
        return torch.tensor(out)
    finally:
        torch.set_num_threads(n)


def _pvalue(samples, probs):
    obs = torch.bincount(samples, minlength=V * V).double()
    exp = probs / probs.sum() * samples.numel()
    small = exp < 5          # pool sparse cells into one
    o = torch.cat([obs[~small], obs[small].sum()[None]])
    e = torch.cat([exp[~small], exp[small].sum()[None]])
    return chisquare(o.numpy(), e.numpy()).pvalue


def test_loop_sampling_matches_target(small_pair):
    target, drafter = small_pair
    joint = _exact_joint(target)
    pv = _pvalue(_samples(target, drafter), joint)
    assert pv > ALPHA, f"first two generated tokens deviate from the target (p={pv:.2e})"


def test_loop_sampling_detects_wrong_proposal(small_pair, monkeypatch):
    target, drafter = small_pair
    real = loop.scatter_proposal

    def uniform_q(cand_ids, q, vocab):   # claims a uniform proposal over the candidates
        return real(cand_ids, torch.full_like(q, 1.0 / q.shape[-1]), vocab)

    monkeypatch.setattr(loop, "scatter_proposal", uniform_q)
    pv = _pvalue(_samples(target, drafter, N // 2), _exact_joint(target))
    assert pv < ALPHA, pv
