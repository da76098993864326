"""Verification: greedy prefix rule, and a statistical test that rejection sampling over the
selector's candidate proposal reproduces the target distribution (and fails when q is wrong).

Statistical setting: vocabulary V=8, a bigram "target" P[prev] (each row a fixed random
distribution), a drafter proposal that is deliberately different (its own random unary logits,
top-K=4 candidates so q is zero on half the vocabulary, and a pairwise lattice that depends on the
predecessor), block of L=3 drafts, temperature 0.8 for the walk. N=200,000 independent runs with
a fixed seed; Pearson chi-square goodness of fit at significance level alpha=1e-3 for the first
emitted token (8 cells) and the first two emitted tokens (64 cells). With N=200k the test rejects
a distribution 2% (total variation) away from the truth with p << 1e-3 — asserted below so that
the sample size is shown to be sufficient, not assumed.
"""

import pytest
import torch
from scipy.stats import chisquare

from dflash2_trt.reference.selector import pairwise_lattice, topk_candidates, walk_sample
from dflash2_trt.reference.verify import (
    accept_greedy, accept_sampling, sample_from_probs, scatter_proposal)

ALPHA = 1e-3
V, K, L, R, N = 8, 4, 3, 4, 200_000


def test_accept_greedy_prefix_and_bonus():
    logits = torch.full((2, 4, 6), -5.0)
    post = torch.tensor([[1, 2, 3, 4], [5, 0, 0, 0]])
    logits.scatter_(-1, post[..., None], 5.0)
    draft = torch.tensor([[1, 2, 3], [4, 0, 0]])
    n, nxt = accept_greedy(draft, logits)
    assert n.tolist() == [3, 0] and nxt.tolist() == [4, 5]
    draft = torch.tensor([[1, 9 % 6, 3], [5, 0, 1]])
    n, nxt = accept_greedy(draft, logits)
    assert n.tolist() == [1, 2] and nxt.tolist() == [2, 0]


def test_accept_greedy_tie_goes_to_lower_id():
    logits = torch.zeros(1, 2, 5)
    logits[0, 0, [1, 3]] = 1.0
    n, nxt = accept_greedy(torch.tensor([[3]]), logits)
    assert n.tolist() == [0] and nxt.tolist() == [1]


def test_sample_from_probs_inverse_cdf():
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5]] * 3)
    got = sample_from_probs(p, torch.tensor([0.0, 0.49, 0.5]))
    assert got.tolist() == [1, 1, 3]
    # unnormalized mass is fine; u -> 1 falls back to the last positive entry
    assert sample_from_probs(torch.tensor([[2.0, 2.0, 0.0]]), torch.tensor([0.9999999])).tolist() == [1]


class Setting:
    def __init__(self, seed=1234):
        g = torch.Generator().manual_seed(seed)
        self.P = torch.softmax(torch.randn(V, V, generator=g) * 1.2, -1)      # target bigram
        self.unary_logits = torch.randn(L, V, generator=g) * 1.5               # drafter (different)
        self.a = torch.randn(V, R, generator=g)
        self.s = torch.randn(V, R, generator=g) * 0.7
        self.proj = torch.randn(L, R, generator=g)
        self.temp = 0.8
        self.g = torch.Generator().manual_seed(seed + 1)

    def cycle(self, anchors, perturb_q=False):
        """One draft/verify cycle for each anchor. Returns emitted tokens [n, L+1] and count."""
        n_rows = anchors.shape[0]
        scores, ids = topk_candidates(self.unary_logits.expand(n_rows, L, V), K)
        lat = pairwise_lattice(ids, scores, self.proj.expand(n_rows, L, R), anchors, self.a, self.s)
        u = torch.rand(n_rows, L, generator=self.g)
        _, draft, q = walk_sample(lat, ids, torch.full((n_rows,), self.temp), u)
        if perturb_q:  # claim a uniform proposal over the candidates instead of the real q
            q = torch.full_like(q, 1.0 / K)
        q_full = scatter_proposal(ids, q, V)
        prevs = torch.cat([anchors[:, None], draft], dim=1)                 # [n, L+1]
        p = self.P[prevs]                                                   # [n, L+1, V]
        n, nxt = accept_sampling(draft, q_full, p, torch.rand(n_rows, L, generator=self.g),
                                 torch.rand(n_rows, generator=self.g))
        emitted = torch.cat([draft, torch.zeros(n_rows, 1, dtype=torch.long)], dim=1)
        emitted[torch.arange(n_rows), n] = nxt
        return emitted, n + 1

    def first_two(self, anchor, perturb_q=False):
        anchors = torch.full((N,), anchor, dtype=torch.long)
        emitted, count = self.cycle(anchors, perturb_q)
        first = emitted[:, 0].clone()
        second = emitted[:, 1].clone()
        need = count < 2                  # first cycle emitted only one token: run the next cycle
        if need.any():
            e2, _ = self.cycle(first[need], perturb_q)
            second[need] = e2[:, 0]
        return first, second


def chi2_p(samples, probs):
    obs = torch.bincount(samples, minlength=probs.numel()).double().numpy()
    probs = probs.double() / probs.double().sum()
    exp = probs.numpy() * samples.numel()
    assert exp.min() >= 5, "cells too sparse for chi-square"
    return chisquare(obs, exp).pvalue


def tv_shift(probs, amount=0.02):
    """A distribution at total-variation distance `amount` from probs: mass moved between the
    two LARGEST cells (the hardest 2% shift to detect, their counts having the most variance)."""
    q = probs.clone().double()
    top2 = torch.topk(q, 2).indices
    q[top2[0]] -= amount
    q[top2[1]] += amount
    return q


@pytest.mark.parametrize("anchor", [0, 5])
def test_sampling_is_lossless(anchor):
    st = Setting()
    first, second = st.first_two(anchor)
    p1 = st.P[anchor]
    joint = (p1[:, None] * st.P).reshape(-1)
    pv1 = chi2_p(first, p1)
    pv2 = chi2_p(first * V + second, joint)
    assert pv1 > ALPHA, f"first token deviates from the target (p={pv1:.2e})"
    assert pv2 > ALPHA, f"first two tokens deviate from the target (p={pv2:.2e})"
    # the proposal really differs from the target (otherwise the test proves nothing)
    scores, ids = topk_candidates(st.unary_logits[None], K)
    lat = pairwise_lattice(ids, scores, st.proj[None], torch.tensor([anchor]), st.a, st.s)
    q0 = scatter_proposal(ids, torch.softmax(lat[:, :, 0] / st.temp, -1), V)[0, 0]
    assert 0.5 * (q0 - p1).abs().sum() > 0.2
    # power: the same samples reject a distribution 2% (TV) away
    assert chi2_p(first, tv_shift(p1)) < ALPHA
    assert chi2_p(first * V + second, tv_shift(joint)) < ALPHA


def test_sampling_test_fails_with_perturbed_q():
    st = Setting()
    first, second = st.first_two(0, perturb_q=True)
    p1 = st.P[0]
    joint = (p1[:, None] * st.P).reshape(-1)
    assert chi2_p(first, p1) < ALPHA or chi2_p(first * V + second, joint) < ALPHA
