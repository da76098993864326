"""DFlash2PairwiseScan: the CPU build of the kernels' math against the torch reference.

The walks are compared on the SAME lattice (the reference's), so ids must match exactly,
ties included; the lattice itself is compared with a tolerance (the reference sums with einsum,
the kernel sequentially in r). Viterbi is also checked against exhaustive K^L enumeration.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from dflash2_trt.reference.selector import (pairwise_lattice, walk_greedy, walk_sample,
                                            walk_viterbi)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _problem(gen, b, l, k, r, v, dtype=torch.float32, scale=1.0):
    unary = torch.randn(b, l, k, generator=gen) * 2
    cand = torch.randint(0, v, (b, l, k), generator=gen, dtype=torch.int32)
    hidden = (torch.randn(b, l, r, generator=gen) * scale).to(dtype)
    anchor = torch.randint(0, v, (b,), generator=gen, dtype=torch.int32)
    a = (torch.randn(v, r, generator=gen) / r ** 0.5).to(dtype)
    bc = (torch.randn(v, r, generator=gen) / r ** 0.5).to(dtype) * 4
    temp = torch.rand(b, generator=gen) * 1.5 + 0.25
    u = torch.rand(b, l, generator=gen)
    return unary, cand, hidden, anchor, a, bc, temp, u


def _ref_lattice(unary, cand, hidden, anchor, a, bc):
    return pairwise_lattice(cand.long(), unary, hidden, anchor.long(), a, bc)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("shape", [(3, 7, 16, 256, 500), (2, 1, 1, 8, 3), (4, 15, 5, 512, 50), (5, 4, 16, 24, 7)])
def test_lattice_and_walks_match_reference(scan_lib, dtype, shape):
    gen = torch.Generator().manual_seed(sum(shape))
    prob = _problem(gen, *shape, dtype=dtype)
    unary, cand, hidden, anchor, a, bc, temp, u = prob
    ref_lat = _ref_lattice(unary, cand, hidden, anchor, a, bc)
    for mode in ("greedy", "sample", "viterbi"):
        lat, idx, ids, q = scan_lib.run(mode, *prob)
        torch.testing.assert_close(lat, ref_lat, rtol=2e-6, atol=2e-5)
        # lattice rows at l = 0 are all the anchor's row
        assert torch.equal(lat[:, 0], lat[:, 0, :1].expand_as(lat[:, 0]))
        if mode == "greedy":
            r_idx, r_ids, r_q = walk_greedy(lat, cand.long())
        elif mode == "viterbi":
            r_idx, r_ids, r_q = walk_viterbi(lat, cand.long())
        else:
            r_idx, r_ids, r_q = walk_sample(lat, cand.long(), temp, u)
        assert torch.equal(idx, r_idx), mode
        assert torch.equal(ids, r_ids), mode
        assert torch.equal(ids, cand.long().gather(-1, idx.unsqueeze(-1)).squeeze(-1))
        torch.testing.assert_close(q, r_q, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["greedy", "viterbi"])
def test_walk_ties_go_to_lower_indices(scan_lib, mode):
    """Integer-valued lattices: ties everywhere; the order must be the reference's exactly."""
    gen = torch.Generator().manual_seed(5)
    for k, l in ((16, 7), (4, 15), (3, 3), (1, 5), (7, 1)):
        lat = torch.randint(0, 3, (64, l, k, k), generator=gen).float()
        lat[:, 0] = lat[:, 0, :1]
        cand = torch.arange(l * k).repeat(64, 1).view(64, l, k)
        ref = walk_greedy if mode == "greedy" else walk_viterbi
        r_idx, _, r_q = ref(lat, cand)
        idx, q = scan_lib.walk(mode, lat)
        assert torch.equal(idx, r_idx), (k, l)
        assert torch.equal(q, r_q)
    # an explicit all-equal lattice: every choice is index 0
    idx, _ = scan_lib.walk(mode, torch.zeros(2, 4, 5, 5))
    assert torch.equal(idx, torch.zeros(2, 4, dtype=torch.long))


def test_sample_walk_on_reference_lattice(scan_lib):
    gen = torch.Generator().manual_seed(9)
    lat = torch.randn(256, 7, 16, 16, generator=gen) * 3
    lat[:, 0] = lat[:, 0, :1]
    temp = torch.rand(256, generator=gen) + 0.1
    u = torch.rand(256, 7, generator=gen)
    u[0] = 0.0
    u[1] = 1.0 - 2 ** -24  # largest float below 1: exercises the cumsum fallback
    cand = torch.arange(7 * 16).repeat(256, 1).view(256, 7, 16)
    r_idx, _, r_q = walk_sample(lat, cand, temp, u)
    idx, q = scan_lib.walk("sample", lat, temp, u)
    assert torch.equal(idx, r_idx)
    torch.testing.assert_close(q, r_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(q.sum(-1), torch.ones(256, 7), rtol=0, atol=1e-6)


def test_sample_with_unusable_temperature_is_greedy(scan_lib):
    gen = torch.Generator().manual_seed(2)
    lat = torch.randn(4, 5, 6, 6, generator=gen)
    lat[:, 0] = lat[:, 0, :1]
    temp = torch.tensor([0.0, -1.0, float("nan"), float("inf")])
    idx, q = scan_lib.walk("sample", lat, temp, torch.rand(4, 5, generator=gen))
    g_idx, g_q = scan_lib.walk("greedy", lat)
    assert torch.equal(idx, g_idx) and torch.equal(q, g_q)


def _path_score(lat_b, path):
    s = lat_b[0, 0, path[0]]
    for pos in range(1, len(path)):
        s = s + lat_b[pos, path[pos - 1], path[pos]]  # fp32, left to right like the DP
    return s


@pytest.mark.parametrize("k,l", [(3, 4), (4, 3), (2, 6), (5, 2), (1, 3)])
def test_viterbi_equals_exhaustive_search(scan_lib, k, l):
    gen = torch.Generator().manual_seed(k * 100 + l)
    for trial in range(8):
        lat = torch.randn(1, l, k, k, generator=gen)
        if trial % 2:
            lat = torch.randint(0, 3, lat.shape, generator=gen).float()  # ties
        lat[:, 0] = lat[:, 0, :1]
        idx, _ = scan_lib.walk("viterbi", lat)
        paths = list(itertools.product(range(k), repeat=l))
        scores = torch.stack([_path_score(lat[0], p) for p in paths])
        best = scores.max()
        got = _path_score(lat[0], idx[0].tolist())
        assert got == best, (trial, got.item(), best.item())
        if (scores == best).sum() == 1:
            assert tuple(idx[0].tolist()) == paths[int(scores.argmax())]


def test_out_of_range_ids_read_zero_rows(scan_lib):
    gen = torch.Generator().manual_seed(4)
    unary, cand, hidden, anchor, a, bc, temp, u = _problem(gen, 2, 3, 4, 16, 10)
    cand[0, 1, 2] = 10      # == V
    cand[1, 2, 0] = -1
    anchor[1] = 1 << 20
    lat, _, _, _ = scan_lib.run("greedy", unary, cand, hidden, anchor, a, bc, temp, u)
    zeros_a = torch.cat([a, torch.zeros(1, 16)])       # row V = zeros
    zeros_b = torch.cat([bc, torch.zeros(1, 16)])
    c2 = cand.clone().long()
    c2[c2 < 0] = 10
    c2[c2 >= 10] = 10
    an = anchor.clone().long()
    an[an >= 10] = 10
    ref = pairwise_lattice(c2, unary, hidden, an, zeros_a, zeros_b)
    torch.testing.assert_close(lat, ref, rtol=2e-6, atol=2e-5)


# ------------------------------------------------------------------------------- validation
def _good(b=2, l=3, k=4, r=16, v=10, dtype=torch.float16):
    f, i = torch.float32, torch.int32
    return [torch.zeros(b, l, k, dtype=f), torch.zeros(b, l, k, dtype=i), torch.zeros(b, l, r, dtype=dtype),
            torch.zeros(b, dtype=i), torch.zeros(v, r, dtype=dtype), torch.zeros(v, r, dtype=dtype),
            torch.zeros(b, dtype=f), torch.zeros(b, l, dtype=f)]


def _with(i, t, **kw):
    ins = _good(**kw)
    ins[i] = t
    return ins


def test_scan_validation_accepts(scan_lib):
    for dtype in DTYPES:
        for mode in ("greedy", "sample", "viterbi"):
            assert scan_lib.validate(_good(dtype=dtype), mode) == (0, "")
    assert scan_lib.validate(_good(k=16, l=15, r=512)) == (0, "")
    dyn = [(0, (-1, 7, 16)), (3, (-1, 7, 16)), (1, (-1, 7, 256)), (3, (-1,)), (1, (-1, 256)), (1, (-1, 256)),
           (0, (-1,)), (0, (-1, 7))]
    assert scan_lib.validate(dyn)[0] == 0


@pytest.mark.parametrize("case,inputs,mode,needle", [
    ("K>16", lambda: _good(k=17), "greedy", "K=17 candidates per position outside [1, 16]"),
    ("L>15", lambda: _good(l=16), "greedy", "L=16 draft positions outside [1, 15]"),
    ("R odd", lambda: _good(r=12), "greedy", "rank R=12 not supported"),
    ("R big", lambda: _good(r=520), "greedy", "rank R=520 not supported"),
    ("mode", lambda: _good(), 3, "mode=3"),
    ("unary dtype", lambda: _with(0, torch.zeros(2, 3, 4, dtype=torch.float16)), "greedy",
     "input 0 (unary) has dtype float16, expected float32"),
    ("cand int64", lambda: _with(1, torch.zeros(2, 3, 4, dtype=torch.int64)), "greedy",
     "input 1 (cand_ids) has dtype unknown, expected int32"),
    ("codebook dtype", lambda: _with(5, torch.zeros(10, 16, dtype=torch.bfloat16)), "greedy",
     "input 5 (succ_codebook) has dtype bfloat16, expected float16"),
    ("hidden int", lambda: _with(2, torch.zeros(2, 3, 16, dtype=torch.int32)), "greedy",
     "input 2 (proj_hidden) has dtype int32"),
    ("B mismatch", lambda: _with(3, torch.zeros(3, dtype=torch.int32)), "greedy",
     "input 3 (anchor) dim 0 is 3 but B=2"),
    ("R mismatch", lambda: _with(4, torch.zeros(10, 24, dtype=torch.float16)), "greedy",
     "input 4 (pred_codebook) dim 1 is 24 but R=16"),
    ("V mismatch", lambda: _with(5, torch.zeros(11, 16, dtype=torch.float16)), "greedy",
     "input 5 (succ_codebook) dim 0 is 11 but V=10"),
    ("uniforms L", lambda: _with(7, torch.zeros(2, 4)), "greedy", "input 7 (uniforms) dim 1 is 4 but L=3"),
    ("dims", lambda: _with(6, torch.zeros(2, 1)), "sample", "input 6 (temperature) must have 1 dims"),
    ("nb", lambda: _good()[:7], "greedy", "expected 8 inputs, got 7"),
])
def test_scan_validation_rejects(scan_lib, case, inputs, mode, needle):
    rc, msg = scan_lib.validate(inputs(), mode)
    assert rc == 1, case
    assert needle in msg and msg.startswith("DFlash2PairwiseScan: "), msg
