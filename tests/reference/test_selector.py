"""Selector: lattice vs explicit formula, walks vs brute force / exhaustive enumeration."""

import itertools

import pytest
import torch

from dflash2_trt.reference.selector import (
    PairwiseSelector, pairwise_lattice, topk_candidates, transform_unary_logits, walk_greedy,
    walk_none, walk_sample, walk_viterbi)


def make_case(seed, b=3, l=4, k=5, v=23, r=6, zero_succ=False, quantize=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, l, v, generator=g)
    if quantize:  # force many exact ties
        logits = torch.round(logits * 2) / 2
    scores, ids = topk_candidates(logits, k)
    proj = torch.randn(b, l, r, generator=g)
    anchor = torch.randint(0, v, (b,), generator=g)
    a = torch.randn(v, r, generator=g)
    s = torch.zeros(v, r) if zero_succ else torch.randn(v, r, generator=g)
    if quantize:
        a, s, proj = (torch.round(t) for t in (a, s, proj))
    lat = pairwise_lattice(ids, scores, proj, anchor, a, s)
    return dict(logits=logits, scores=scores, ids=ids, proj=proj, anchor=anchor, a=a, s=s, lat=lat)


def pair_score(c, bi, l, prev_tok, ci):
    """Explicit per-element formula (independent of pairwise_lattice's einsum)."""
    tok = int(c["ids"][bi, l, ci])
    val = float(c["scores"][bi, l, ci])
    for r in range(c["proj"].shape[-1]):
        val += float(c["a"][prev_tok, r]) * float(c["proj"][bi, l, r]) * float(c["s"][tok, r])
    return val


def test_topk_tie_order_lower_id_first():
    u = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0, -1.0]])
    sc, ids = topk_candidates(u, 4)
    assert ids.tolist() == [[1, 3, 4, 2]]
    assert sc.dtype == torch.float32 and ids.dtype == torch.int64


def test_transform_unary_logits():
    x = torch.tensor([-100.0, 0.0, 3.0]).bfloat16()
    y = transform_unary_logits(x, 0.5, 20.0)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, torch.tanh(x.float() * 0.5 / 20.0) * 20.0)
    torch.testing.assert_close(transform_unary_logits(x), x.float())


def test_lattice_matches_formula():
    c = make_case(0)
    b, l, k = c["ids"].shape
    for bi in range(b):
        for li in range(l):
            for p in range(k):
                prev_tok = int(c["anchor"][bi]) if li == 0 else int(c["ids"][bi, li - 1, p])
                for ci in range(k):
                    assert abs(float(c["lat"][bi, li, p, ci]) - pair_score(c, bi, li, prev_tok, ci)) < 1e-4


@pytest.mark.parametrize("seed,quantize", [(1, False), (2, True), (3, True)])
def test_greedy_equals_bruteforce(seed, quantize):
    c = make_case(seed, quantize=quantize)
    idx, tok, q = walk_greedy(c["lat"], c["ids"])
    b, l, k = c["ids"].shape
    for bi in range(b):
        prev_tok = int(c["anchor"][bi])
        for li in range(l):
            vals = [pair_score(c, bi, li, prev_tok, ci) for ci in range(k)]
            best = max(vals)
            choice = next(ci for ci in range(k) if abs(vals[ci] - best) < 1e-9)  # lowest index
            assert int(idx[bi, li]) == choice
            prev_tok = int(c["ids"][bi, li, choice])
            assert int(tok[bi, li]) == prev_tok
    assert torch.equal(q, torch.nn.functional.one_hot(idx, k).float())


@pytest.mark.parametrize("seed,quantize", [(4, False), (5, True), (6, True)])
def test_viterbi_equals_exhaustive(seed, quantize):
    c = make_case(seed, l=4, k=4, quantize=quantize)
    idx, tok, _ = walk_viterbi(c["lat"], c["ids"])
    b, l, k = c["ids"].shape
    lat = c["lat"].double()
    for bi in range(b):
        best, best_path = None, None
        for path in itertools.product(range(k), repeat=l):  # lexicographic: lower indices first
            tot = float(lat[bi, 0, 0, path[0]]) + sum(
                float(lat[bi, li, path[li - 1], path[li]]) for li in range(1, l))
            if best is None or tot > best + 1e-9:
                best, best_path = tot, path
        got = tuple(int(v) for v in idx[bi])
        got_tot = float(lat[bi, 0, 0, got[0]]) + sum(
            float(lat[bi, li, got[li - 1], got[li]]) for li in range(1, l))
        assert abs(got_tot - best) < 1e-5
        if not quantize:
            assert got == best_path
    # Viterbi is never worse than greedy on the path score
    gidx, _, _ = walk_greedy(c["lat"], c["ids"])

    def score(ix, bi):
        return float(lat[bi, 0, 0, ix[bi, 0]]) + sum(
            float(lat[bi, li, ix[bi, li - 1], ix[bi, li]]) for li in range(1, l))
    for bi in range(b):
        assert score(idx, bi) >= score(gidx, bi) - 1e-6


def test_viterbi_tie_rule_lower_index():
    # All-equal lattice: every path ties -> the all-zero path.
    lat = torch.zeros(1, 3, 3, 3)
    ids = torch.arange(9).reshape(1, 3, 3)
    idx, tok, _ = walk_viterbi(lat, ids)
    assert idx.tolist() == [[0, 0, 0]]
    g_idx, _, _ = walk_greedy(lat, ids)
    assert g_idx.tolist() == [[0, 0, 0]]


def test_zero_successor_reduces_to_none():
    for seed in range(5):
        c = make_case(seed + 10, zero_succ=True)
        n_idx, n_tok, n_q = walk_none(c["lat"], c["ids"])
        assert torch.equal(n_tok, c["logits"].argmax(-1))
        for walk in (walk_greedy, walk_viterbi):
            idx, tok, q = walk(c["lat"], c["ids"])
            assert torch.equal(tok, n_tok) and torch.equal(idx, n_idx)
        # sampling with a zero successor codebook is plain sampling from the unary softmax
        u = torch.rand(c["ids"].shape[:2], generator=torch.Generator().manual_seed(seed))
        t = torch.full((c["ids"].shape[0],), 0.7)
        _, _, q = walk_sample(c["lat"], c["ids"], t, u)
        torch.testing.assert_close(q, torch.softmax(c["scores"] / 0.7, -1))


def test_sample_walk_inverse_cdf_and_q():
    c = make_case(20)
    b, l, k = c["ids"].shape
    g = torch.Generator().manual_seed(0)
    u = torch.rand(b, l, generator=g)
    t = torch.tensor([0.5, 1.0, 2.0])
    idx, tok, q = walk_sample(c["lat"], c["ids"], t, u)
    for bi in range(b):
        prev = 0
        for li in range(l):
            row = c["lat"][bi, li, prev].double()
            p = torch.softmax(row / float(t[bi]), -1)
            torch.testing.assert_close(q[bi, li].double(), p, rtol=1e-5, atol=1e-6)
            cdf = torch.cumsum(q[bi, li], -1)
            want = int((cdf > u[bi, li]).nonzero()[0])
            assert int(idx[bi, li]) == want
            prev = want
    # u just below 1 with cdf rounding below it: fallback to the last index with p > 0
    lat = torch.tensor([[[[0.0, 0.0, -1e9]]]]).expand(1, 1, 3, 3).contiguous()
    ids = torch.tensor([[[5, 6, 7]]])
    idx, _, _ = walk_sample(lat, ids, torch.tensor([1.0]), torch.tensor([[1.0]]))
    assert idx.tolist() == [[1]]


def test_selector_module_uses_codebooks():
    g = torch.Generator().manual_seed(3)
    sel = PairwiseSelector(hidden_size=8, vocab_size=30, rank=4, top_k=5)
    with torch.no_grad():
        for p in sel.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    h = torch.randn(1, 3, 8, generator=g)
    logits = torch.randn(1, 3, 30, generator=g)
    anchor = torch.tensor([2])
    out = sel(h, logits, anchor, "greedy")
    sc, ids = topk_candidates(logits, 5)
    lat = pairwise_lattice(ids, sc, sel.hidden_projection(h), anchor, sel.predecessor_codebook,
                           sel.successor_codebook)
    torch.testing.assert_close(out.lattice, lat)
    assert torch.equal(out.tokens, walk_greedy(lat, ids)[1])


def test_selector_module_refuses_top_k_zero():
    """top_k=0 is an error, not 'use the default width' (an `or` would silently pick top_k=16)."""
    sel = PairwiseSelector(hidden_size=8, vocab_size=30, rank=4, top_k=5)
    with pytest.raises(ValueError, match="top_k=0"):
        sel(torch.zeros(1, 3, 8), torch.zeros(1, 3, 30), torch.tensor([2]), "greedy", top_k=0)
    assert sel(torch.zeros(1, 3, 8), torch.zeros(1, 3, 30), torch.tensor([2]), "greedy").cand_ids.shape[-1] == 5
