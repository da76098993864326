"""DFlash2GatedDeltaNet: the CPU build (the kernels' math, gatedDeltaNetMath.h) against transformers'
own Qwen3.5 Gated DeltaNet torch functions (``causal_conv1d_update`` for the conv and its state,
``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule`` with
``use_qk_l2norm_in_kernel=True``, beta = ``b.sigmoid()``, g = ``-A_log.exp() * softplus(a + dt_bias)``)
run per request on random inputs.

The state pool's slots hold the state and the deferred commit's records (gdn_slot; the committed
state is the state folded over the pending records: GdnLib.committed_states); the tests compare
committed states. Bit for bit (where the formulation is the same operations on the same values):
  - the conv state after a context chunk or a commit == transformers' updated conv state;
  - generation requests' committed states and conv states, and unused slots, are left as they were
    by the forward;
  - verify_qkv rows == the generation requests' qkv rows;
  - a generation request's y == the per-token path's y of a context request over the same tokens;
  - the committed state after a commit == the per-token forward over the accepted tokens only;
  - the deferred commit's contract cases (test_deferred_commit_contract_cases) == one per-token
    forward over each request's committed sequence.
Within stated fp32 tolerances (torch reduces over Dk / uses BLAS and its own exp, log1p,
sigmoid in a different order; the chunked and per-token formulations round differently):
  - y: fp32 atol 2e-6 rtol 1e-5 (measured <= 4.1e-7 abs); fp16 / bf16: one ulp of the output
    dtype (rtol 2e-3 / 1.6e-2, measured <= 8.8e-4 / 5.4e-3 relative);
  - fp32 states: atol 5e-6 rtol 1e-5 in every activation dtype (measured <= 1.4e-6 abs).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5.modeling_qwen3_5 import (causal_conv1d_update, torch_chunk_gated_delta_rule,
                                                          torch_recurrent_gated_delta_rule)

from dflash2_trt.trtllm.cpu.plugin_libs import PluginRunError

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL_Y = {torch.float32: dict(atol=2e-6, rtol=1e-5), torch.float16: dict(atol=1e-5, rtol=2e-3),
         torch.bfloat16: dict(atol=1e-5, rtol=1.6e-2)}
TOL_STATE = dict(atol=5e-6, rtol=1e-5)
CONTEXT, GENERATION = 0, 1


@dataclass(frozen=True)
class Heads:
    hk: int
    hv: int
    dk: int
    dv: int
    kc: int = 4
    kv: int = 4  # max_verify_tokens

    @property
    def c(self) -> int:
        return 2 * self.hk * self.dk + self.hv * self.dv

    def attrs(self, chunk: int = 64) -> dict:
        return dict(num_k_heads=self.hk, num_v_heads=self.hv, head_k_dim=self.dk, head_v_dim=self.dv,
                    conv_kernel=self.kc, max_verify_tokens=self.kv, chunk_size=chunk)


GROUPED = Heads(2, 4, 16, 16)  # Hv > Hk: value heads 0, 1 read key head 0; 2, 3 read key head 1


def _batch(h: Heads, dtype, ctx_lens, gen_lens, seed, extra_slots=2):
    """Random packed inputs of a mixed batch (context requests first) and state pools."""
    g = torch.Generator().manual_seed(seed)
    lens = list(ctx_lens) + list(gen_lens)
    t, b = sum(lens), len(lens)
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    pools = b + extra_slots
    return dict(
        qkv=rn(t, h.c).to(dtype), w=(0.5 * rn(h.c, h.kc)).to(dtype), a=rn(t, h.hv).to(dtype), b=rn(t, h.hv).to(dtype),
        dt_bias=rn(h.hv), A_log=torch.rand(h.hv, generator=g).clamp_min(0.01).log(),
        cu=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32),
        slots=torch.randperm(pools, generator=g)[:b].to(torch.int32),
        types=torch.tensor([CONTEXT] * len(ctx_lens) + [GENERATION] * len(gen_lens), dtype=torch.int32),
        rnn=0.1 * rn(pools, h.hv, h.dk, h.dv), conv=rn(pools, h.kc - 1, h.c).to(dtype))


def _pool(lib, h: Heads, states):
    """An rnn pool whose slots' committed states are ``states`` [slots, Hv, Dk, Dv] (no records pending)."""
    return lib.new_pool(states, **h.attrs())


def _committed(lib, h: Heads, pool):
    """Every slot's committed state [slots, Hv, Dk, Dv] (its pending records folded; the pool unchanged)."""
    return lib.committed_states(pool, **h.attrs())


def _forward(lib, h: Heads, bt: dict, chunk: int):
    """Runs the plugin's forward on a pool made from bt's states and a copy of its conv pool: (y, verify_qkv,
    verify_gates, committed states, conv, pool)."""
    pool, conv = _pool(lib, h, bt["rnn"]), bt["conv"].clone()
    y, vq, vg = lib.forward(bt["qkv"], bt["w"], bt["a"], bt["b"], bt["dt_bias"], bt["A_log"], bt["cu"], bt["slots"],
                            bt["types"], pool, conv, **h.attrs(chunk))
    return y, vq, vg, _committed(lib, h, pool), conv, pool


def _gates(bt, rows):
    """transformers' beta (in the activation dtype, widened) and g for the given rows."""
    beta = bt["b"][rows].sigmoid().float()
    g = -bt["A_log"].float().exp() * F.softplus(bt["a"][rows].float() + bt["dt_bias"])
    return g, beta


def _reference(h: Heads, bt: dict, rows, rnn0, conv0, chunk: int | None):
    """transformers over the given rows from (rnn0 [Hv, Dk, Dv], conv0 [K-1, C]): (y [n, Hv Dv],
    final state, conv state [K-1, C]). chunk None = torch_recurrent_gated_delta_rule."""
    qkv = bt["qkv"][rows]
    n = qkv.shape[0]
    state = conv0.T[None].clone()  # transformers' layout [1, C, K-1], updated in place
    xc = causal_conv1d_update(qkv.T[None], state, bt["w"], None, "silu")[0].T
    q, k, v = xc.split([h.hk * h.dk, h.hk * h.dk, h.hv * h.dv], -1)
    g, beta = _gates(bt, rows)
    beta = bt["b"][rows].sigmoid()
    args = (q.reshape(1, n, h.hk, h.dk), k.reshape(1, n, h.hk, h.dk), v.reshape(1, n, h.hv, h.dv))
    kw = dict(g=g[None], beta=beta[None], initial_state=rnn0[None].clone(), output_final_state=True,
              use_qk_l2norm_in_kernel=True)
    if chunk is None:
        out, s = torch_recurrent_gated_delta_rule(*args, **kw)
    else:
        out, s = torch_chunk_gated_delta_rule(*args, chunk_size=chunk, **kw)
    return out[0].reshape(n, h.hv * h.dv), s[0], state[0].T


def _rows(bt, r):
    return slice(int(bt["cu"][r]), int(bt["cu"][r + 1]))


def _close(got, want, what, **tol):
    torch.testing.assert_close(got.float(), want.float(), **tol, msg=lambda m: f"{what}: {m}")


# ------------------------------------------------------------------------------- forward
@pytest.mark.parametrize("chunk", [64, 0], ids=["chunked", "per_token"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_forward_mixed_batch_matches_transformers(gdn_lib, dtype, chunk):
    """Context chunks of 1, 7, 64 and 200 tokens and three verify blocks in ONE call."""
    h = GROUPED
    bt = _batch(h, dtype, [1, 7, 64, 200], [4, 4, 3], seed=11)
    y, vq, vg, rnn, conv, _ = _forward(gdn_lib, h, bt, chunk)
    assert y.dtype == dtype and y.shape == (bt["qkv"].shape[0], h.hv * h.dv)
    used = set()
    for r, kind in enumerate(bt["types"].tolist()):
        rows, sl = _rows(bt, r), int(bt["slots"][r])
        used.add(sl)
        yr, sr, cr = _reference(h, bt, rows, bt["rnn"][sl], bt["conv"][sl], chunk or None)
        _close(y[rows], yr, f"y of request {r}", **TOL_Y[dtype])
        if kind == CONTEXT:
            _close(rnn[sl], sr, f"state of context request {r}", **TOL_STATE)
            assert torch.equal(conv[sl], cr), f"conv state of context request {r}"
        else:  # verify reads the committed state and leaves it as it was (until the commit), bit for bit
            assert torch.equal(rnn[sl], bt["rnn"][sl]) and torch.equal(conv[sl], bt["conv"][sl]), r
            n = rows.stop - rows.start
            assert torch.equal(vq[r, :n], bt["qkv"][rows]), f"verify_qkv of request {r}"
            g, beta = _gates(bt, rows)
            _close(vg[r, :n, 0], g, "g", atol=1e-6, rtol=1e-6)
            _close(vg[r, :n, 1], beta, "beta", atol=1e-6, rtol=TOL_Y[dtype]["rtol"] if dtype != torch.float32 else 1e-6)
    for sl in set(range(bt["rnn"].shape[0])) - used:
        assert torch.equal(rnn[sl], bt["rnn"][sl]) and torch.equal(conv[sl], bt["conv"][sl]), f"unused slot {sl}"


@pytest.mark.parametrize("h", [Heads(1, 1, 16, 16, kv=5), Heads(2, 6, 32, 16, kc=2, kv=5), Heads(1, 2, 128, 128, kv=5)],
                         ids=["1x1", "group3_kc2", "dk128"])
def test_forward_head_layouts(gdn_lib, h):
    """Head grouping Hv/Hk = 1 and 3, Dk != Dv, conv kernel 2, and Qwen3.8-27B's head dims (128)."""
    bt = _batch(h, torch.float32, [7, 130], [5, 2], seed=12)
    for chunk in (64, 0):
        y, _, _, rnn, conv, _ = _forward(gdn_lib, h, bt, chunk)
        for r, kind in enumerate(bt["types"].tolist()):
            rows, sl = _rows(bt, r), int(bt["slots"][r])
            yr, sr, cr = _reference(h, bt, rows, bt["rnn"][sl], bt["conv"][sl], chunk or None)
            _close(y[rows], yr, f"chunk={chunk} y of request {r}", **TOL_Y[torch.float32])
            if kind == CONTEXT:
                _close(rnn[sl], sr, f"chunk={chunk} state of request {r}", **TOL_STATE)
                assert torch.equal(conv[sl], cr)


def test_chunk_sizes_agree_with_per_token_path(gdn_lib):
    """Chunk sizes 1, 7, 64 (200 tokens: 3 full chunks and a partial one at 64) agree with the
    per-token reference path within fp32 tolerance, and the chunked path is not the per-token one."""
    h = GROUPED
    bt = _batch(h, torch.float32, [200, 13], [], seed=13)
    y0, _, _, rnn0, conv0, _ = _forward(gdn_lib, h, bt, 0)
    for chunk in (1, 7, 64):
        y, _, _, rnn, conv, _ = _forward(gdn_lib, h, bt, chunk)
        _close(y, y0, f"chunk {chunk} y", **TOL_Y[torch.float32])
        _close(rnn, rnn0, f"chunk {chunk} state", **TOL_STATE)
        assert torch.equal(conv, conv0)
    assert not torch.equal(y, y0)  # a different formulation: rounding differs somewhere


@pytest.mark.parametrize("chunk", [64, 0], ids=["chunked", "per_token"])
def test_zero_state_starts_first_chunks_from_zeros(gdn_lib, chunk):
    """zero_state (TensorRT-LLM never zeroes a slot): flagged context requests start from zero
    recurrent and conv state whatever their slot holds, unflagged ones continue from their slot,
    and generation requests ignore the flag. A 1-token first chunk with K = 4 leaves the conv
    state [0, 0, x0], as transformers' zero padding does."""
    h = GROUPED
    bt = _batch(h, torch.bfloat16, [1, 9, 70, 5], [4, 3], seed=22)  # slots hold garbage
    flags = [1, 1, 0, 1, 1, 0]
    pool, conv = _pool(gdn_lib, h, bt["rnn"]), bt["conv"].clone()
    y, _, _ = gdn_lib.forward(bt["qkv"], bt["w"], bt["a"], bt["b"], bt["dt_bias"], bt["A_log"], bt["cu"], bt["slots"],
                              bt["types"], pool, conv, zero_state=torch.tensor(flags, dtype=torch.int32),
                              **h.attrs(chunk))
    rnn = _committed(gdn_lib, h, pool)
    for r, kind in enumerate(bt["types"].tolist()):
        rows, sl = _rows(bt, r), int(bt["slots"][r])
        zero = flags[r] and kind == CONTEXT
        rnn0 = torch.zeros_like(bt["rnn"][sl]) if zero else bt["rnn"][sl]
        conv0 = torch.zeros_like(bt["conv"][sl]) if zero else bt["conv"][sl]
        yr, sr, cr = _reference(h, bt, rows, rnn0, conv0, chunk or None)
        _close(y[rows], yr, f"y of request {r} (zero={zero})", **TOL_Y[torch.bfloat16])
        if kind == CONTEXT:
            _close(rnn[sl], sr, f"state of request {r} (zero={zero})", **TOL_STATE)
            assert torch.equal(conv[sl], cr), r
        else:
            assert torch.equal(rnn[sl], bt["rnn"][sl]) and torch.equal(conv[sl], bt["conv"][sl]), r
    first = int(bt["slots"][0])
    assert torch.equal(conv[first, :2], torch.zeros_like(conv[first, :2])) and torch.equal(conv[first, 2], bt["qkv"][0])


def test_generation_read_equals_per_token_context_bit_for_bit(gdn_lib):
    """The same 4 tokens from the same state as a verify block and as a context chunk (per-token
    path): identical y bits, and the context request's slot advances while the verify one does not."""
    h = GROUPED
    bt = _batch(h, torch.bfloat16, [4], [4], seed=14)
    bt["qkv"][4:], bt["a"][4:], bt["b"][4:] = bt["qkv"][:4], bt["a"][:4], bt["b"][:4]
    s_ctx, s_gen = bt["slots"].tolist()
    bt["rnn"][s_gen], bt["conv"][s_gen] = bt["rnn"][s_ctx], bt["conv"][s_ctx]
    y, _, _, rnn, _, _ = _forward(gdn_lib, h, bt, 0)
    assert torch.equal(y[:4], y[4:])
    assert torch.equal(rnn[s_gen], bt["rnn"][s_gen]) and not torch.equal(rnn[s_ctx], bt["rnn"][s_ctx])


# -------------------------------------------------------------------------------- commit
def _commit(lib, h, bt, vq, vg, accepted, pool, conv):
    return lib.commit(vq, vg, bt["w"], torch.tensor(accepted, dtype=torch.int32), bt["cu"], bt["slots"], bt["types"],
                      pool, conv, **h.attrs())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_commit_equals_reference_over_accepted_tokens(gdn_lib, dtype):
    h = GROUPED
    ctx = [9, 70]
    bt = _batch(h, dtype, ctx, [4, 4, 4, 4, 3], seed=15)
    accepted = [0] * len(ctx) + [1, 2, 4, 0, 3]  # context entries are ignored
    _, vq, vg, rnn, conv, pool = _forward(gdn_lib, h, bt, 64)
    after_fwd_rnn, after_fwd_conv = rnn.clone(), conv.clone()
    committed = _commit(gdn_lib, h, bt, vq, vg, accepted, pool, conv)
    assert committed.tolist() == accepted
    rnn = _committed(gdn_lib, h, pool)
    for r, kind in enumerate(bt["types"].tolist()):
        sl = int(bt["slots"][r])
        if kind == CONTEXT or accepted[r] == 0:  # the commit leaves these slots alone
            assert torch.equal(rnn[sl], after_fwd_rnn[sl]) and torch.equal(conv[sl], after_fwd_conv[sl]), r
            continue
        start = int(bt["cu"][r])
        rows = slice(start, start + accepted[r])
        for chunk in (None, 64):  # transformers' recurrent and chunked forms over the accepted tokens only
            _, sr, cr = _reference(h, bt, rows, bt["rnn"][sl], bt["conv"][sl], chunk)
            _close(rnn[sl], sr, f"committed state of request {r} (reference chunk={chunk})", **TOL_STATE)
            assert torch.equal(conv[sl], cr), f"committed conv state of request {r}"


def test_commit_is_the_per_token_forward_over_the_accepted_tokens(gdn_lib):
    """Bit for bit: committing n verify tokens == running the per-token path over those n tokens
    as a context chunk from the same state (same functions, same order)."""
    h = GROUPED
    bt = _batch(h, torch.bfloat16, [], [4, 4, 4], seed=16)
    accepted = [1, 3, 4]
    _, vq, vg, _, conv, pool = _forward(gdn_lib, h, bt, 64)
    _commit(gdn_lib, h, bt, vq, vg, accepted, pool, conv)
    rnn = _committed(gdn_lib, h, pool)
    for r, n in enumerate(accepted):
        sl, start = int(bt["slots"][r]), int(bt["cu"][r])
        sub = dict(bt, qkv=bt["qkv"][start:start + n], a=bt["a"][start:start + n], b=bt["b"][start:start + n],
                   cu=torch.tensor([0, n], dtype=torch.int32), slots=bt["slots"][r:r + 1],
                   types=torch.tensor([CONTEXT], dtype=torch.int32))
        _, _, _, rnn_ctx, conv_ctx, _ = _forward(gdn_lib, h, sub, 0)
        assert torch.equal(rnn[sl], rnn_ctx[sl]) and torch.equal(conv[sl], conv_ctx[sl]), r


def test_committing_the_whole_verify_block_is_wrong(gdn_lib):
    """Control: a commit over all K+1 verify tokens instead of the accepted prefix lands far from
    the reference over the accepted tokens (the test above could not pass by accident)."""
    h = GROUPED
    bt = _batch(h, torch.float32, [], [4, 4], seed=17)
    accepted = [1, 2]
    _, vq, vg, _, conv, pool = _forward(gdn_lib, h, bt, 64)
    _commit(gdn_lib, h, bt, vq, vg, [4, 4], pool, conv)  # the whole block
    rnn = _committed(gdn_lib, h, pool)
    for r, n in enumerate(accepted):
        sl, start = int(bt["slots"][r]), int(bt["cu"][r])
        _, sr, cr = _reference(h, bt, slice(start, start + n), bt["rnn"][sl], bt["conv"][sl], None)
        assert (rnn[sl] - sr).abs().max() > 1000 * TOL_STATE["atol"], r
        assert not torch.equal(conv[sl], cr), r


def test_speculative_steps_track_the_committed_sequence(gdn_lib):
    """Two requests in one batch over several steps: a prompt in two context chunks (chunked path,
    the second from the committed state), then verify + commit steps with acceptance 2, 4, 1, 3.
    The verify outputs of the accepted positions and the final states equal transformers over the
    committed sequence alone (prompt + accepted tokens), from zero state."""
    h = GROUPED
    dtype = torch.float32
    g = torch.Generator().manual_seed(18)
    pools = 3
    rnn = _pool(gdn_lib, h, torch.zeros(pools, h.hv, h.dk, h.dv))
    conv = torch.zeros(pools, h.kc - 1, h.c, dtype=dtype)
    w = (0.5 * torch.randn(h.c, h.kc, generator=g)).to(dtype)
    dt_bias, A_log = torch.randn(h.hv, generator=g), torch.rand(h.hv, generator=g).clamp_min(0.01).log()
    committed = {0: [], 1: []}  # per request: the (qkv, a, b) rows of its committed sequence
    slots = {0: 2, 1: 0}

    def rows(n):
        return (torch.randn(n, h.c, generator=g).to(dtype), torch.randn(n, h.hv, generator=g).to(dtype),
                torch.randn(n, h.hv, generator=g).to(dtype))

    # (request, kind, tokens, accepted): request 1 starts prefilling while request 0 verifies
    steps = [[(0, CONTEXT, 100, None)], [(0, CONTEXT, 50, None), (1, CONTEXT, 37, None)],
             [(1, CONTEXT, 20, None), (0, GENERATION, 4, 2)], [(0, GENERATION, 4, 4), (1, GENERATION, 4, 1)],
             [(0, GENERATION, 4, 1), (1, GENERATION, 4, 3)], [(0, GENERATION, 4, 3), (1, GENERATION, 4, 4)]]
    verify_checks = []
    for step in steps:
        data = [rows(n) for _, _, n, _ in step]
        cu = torch.tensor([0, *torch.tensor([n for _, _, n, _ in step]).cumsum(0).tolist()], dtype=torch.int32)
        bt = dict(qkv=torch.cat([d[0] for d in data]), a=torch.cat([d[1] for d in data]),
                  b=torch.cat([d[2] for d in data]), w=w, dt_bias=dt_bias, A_log=A_log, cu=cu,
                  slots=torch.tensor([slots[r] for r, *_ in step], dtype=torch.int32),
                  types=torch.tensor([k for _, k, _, _ in step], dtype=torch.int32))
        y, vq, vg = gdn_lib.forward(bt["qkv"], w, bt["a"], bt["b"], dt_bias, A_log, cu, bt["slots"], bt["types"],
                                    rnn, conv, **h.attrs(64))
        gdn_lib.commit(vq, vg, w, torch.tensor([acc or 0 for *_, acc in step], dtype=torch.int32), cu, bt["slots"],
                       bt["types"], rnn, conv, **h.attrs(64))
        for i, (r, kind, n, acc) in enumerate(step):
            keep = n if kind == CONTEXT else acc
            if kind == GENERATION:  # y of the accepted positions, at their place in the sequence
                at = sum(len(x[0]) for x in committed[r])
                verify_checks.append((r, at, y[cu[i]:cu[i] + keep]))
            committed[r].append(tuple(x[:keep] for x in data[i]))
    for r in (0, 1):
        seq = {k: torch.cat([c[j] for c in committed[r]]) for j, k in enumerate(("qkv", "a", "b"))}
        bt = dict(seq, w=w, dt_bias=dt_bias, A_log=A_log)
        n = len(seq["qkv"])
        yr, sr, cr = _reference(h, bt, slice(0, n), torch.zeros(h.hv, h.dk, h.dv),
                                torch.zeros(h.kc - 1, h.c, dtype=dtype), 64)
        _close(_committed(gdn_lib, h, rnn)[slots[r]], sr, f"final state of request {r} ({n} committed tokens)",
               **TOL_STATE)
        assert torch.equal(conv[slots[r]], cr)
        for rr, at, yv in verify_checks:
            if rr == r:
                _close(yv, yr[at:at + len(yv)], f"verify y of request {r} at {at}", **TOL_Y[dtype])
    assert len(verify_checks) == 7


def test_deferred_commit_contract_cases(gdn_lib):
    """The deferred commit's contract (docs/hybrid-runtime.md §5, engine_io.yaml recurrent_state) on the per-token
    path, bit for bit against ONE per-token forward over each request's committed sequence from zeros:
      - pending counts: 0 after every forward, the accepted count after the commit;
      - a step with 0 accepted: the next forward folds nothing;
      - a context request after a generation on the same slot (no zero_state) folds the pending records first;
      - a forward whose commit does not run: its verify records stay unfolded (pending 0), i.e. 0 accepted;
      - a request that ends with records pending: its committed state is their fold (committed_states), and a
        zero_state context request reusing the slot starts from zeros, count cleared, whatever the slot holds."""
    h = GROUPED
    dtype = torch.bfloat16
    lay = gdn_lib.layout(**h.attrs())
    g = torch.Generator().manual_seed(31)
    pool = _pool(gdn_lib, h, torch.randn(3, h.hv, h.dk, h.dv, generator=g))           # garbage slots, and
    flat = pool.view(3, -1)
    flat[:, lay.pending + 1:] = torch.randn(3, flat.shape[1] - lay.pending - 1, generator=g)  # garbage records
    flat[:, lay.pending] = torch.tensor([3, 4, 2], dtype=torch.int32).view(torch.float32)     # pending
    conv = torch.randn(3, h.kc - 1, h.c, generator=g).to(dtype)
    w = (0.5 * torch.randn(h.c, h.kc, generator=g)).to(dtype)
    dt_bias, A_log = torch.randn(h.hv, generator=g), torch.rand(h.hv, generator=g).clamp_min(0.01).log()
    slot = {"A": 2, "B": 0, "C": 2}                          # C reuses A's slot after A ends
    seq = {k: [] for k in slot}                               # per request: its committed (qkv, a, b) rows
    ys = []                                                   # (request, position, y rows of accepted tokens)
    pending = lambda: gdn_lib.pending(pool, **h.attrs()).tolist()  # noqa: E731

    def step(reqs, commit=True):
        """reqs: (request, kind, tokens, zero_state, accepted)."""
        data = [(torch.randn(n, h.c, generator=g).to(dtype), torch.randn(n, h.hv, generator=g).to(dtype),
                 torch.randn(n, h.hv, generator=g).to(dtype)) for _, _, n, _, _ in reqs]
        cu = torch.tensor([0, *torch.tensor([n for _, _, n, _, _ in reqs]).cumsum(0).tolist()], dtype=torch.int32)
        sl = torch.tensor([slot[r] for r, *_ in reqs], dtype=torch.int32)
        types = torch.tensor([k for _, k, *_ in reqs], dtype=torch.int32)
        y, vq, vg = gdn_lib.forward(torch.cat([d[0] for d in data]), w, torch.cat([d[1] for d in data]),
                                    torch.cat([d[2] for d in data]), dt_bias, A_log, cu, sl, types, pool, conv,
                                    zero_state=torch.tensor([z for *_, z, _ in reqs], dtype=torch.int32),
                                    **h.attrs(0))
        assert all(pending()[s] == 0 for s in sl.tolist())
        if commit:
            acc = [a for *_, a in reqs]
            gdn_lib.commit(vq, vg, w, torch.tensor(acc, dtype=torch.int32), cu, sl, types, pool, conv, **h.attrs(0))
            assert [pending()[s] for s, k in zip(sl.tolist(), types.tolist()) if k == GENERATION] == \
                [a for a, k in zip(acc, types.tolist()) if k == GENERATION]
        for i, (r, kind, n, _, acc) in enumerate(reqs):
            keep = n if kind == CONTEXT else (acc if commit else 0)
            if kind == GENERATION:
                ys.append((r, sum(len(x[0]) for x in seq[r]), y[cu[i]:cu[i] + keep]))
            seq[r].append(tuple(x[:keep] for x in data[i]))

    def reference(r):
        rows = {k: torch.cat([c[j] for c in seq[r]]) for j, k in enumerate(("qkv", "a", "b"))}
        n = len(rows["qkv"])
        p0 = _pool(gdn_lib, h, torch.zeros(1, h.hv, h.dk, h.dv))
        c0 = torch.zeros(1, h.kc - 1, h.c, dtype=dtype)
        y, _, _ = gdn_lib.forward(rows["qkv"], w, rows["a"], rows["b"], dt_bias, A_log,
                                  torch.tensor([0, n], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                                  torch.tensor([CONTEXT], dtype=torch.int32), p0, c0, **h.attrs(0))
        return y, _committed(gdn_lib, h, p0)[0], c0[0]

    def check(r):
        yr, sr, cr = reference(r)
        assert torch.equal(_committed(gdn_lib, h, pool)[slot[r]], sr) and torch.equal(conv[slot[r]], cr), r
        for rr, at, yv in ys:
            if rr == r:
                assert torch.equal(yv, yr[at:at + len(yv)]), (r, at)

    step([("A", CONTEXT, 9, 1, 0), ("B", CONTEXT, 6, 1, 0)])   # zero_state: garbage records never folded
    step([("A", GENERATION, 4, 0, 0), ("B", GENERATION, 4, 0, 3)])   # A: 0 accepted
    assert [pending()[slot["A"]], pending()[slot["B"]]] == [0, 3]
    step([("B", CONTEXT, 5, 0, 0), ("A", GENERATION, 4, 0, 2)])      # B: a context request after a generation
    step([("A", GENERATION, 4, 0, 4), ("B", GENERATION, 3, 0, 3)], commit=False)  # no commit: nothing accepted
    step([("A", GENERATION, 4, 0, 4), ("B", GENERATION, 3, 0, 1)])
    check("A")                                                  # A ends here, 4 records pending
    assert pending()[slot["A"]] == 4
    step([("C", CONTEXT, 7, 1, 0), ("B", GENERATION, 4, 0, 2)])      # C reuses A's slot from zeros
    check("B")
    check("C")
    assert len(ys) == 8


def test_slot_layout_is_the_plugins(gdn_lib):
    """dflash2_trt.trtllm.gdn_slot (what the engine config, the dry run and the runtimes size a slot with) ==
    gatedDeltaNetSlotLayout of the plugin; Qwen3.8-27B at block 8: state_size 128 + 11 record rows."""
    for hk, hv, dk, dv, kv in ((2, 4, 16, 16, 4), (1, 3, 16, 17, 3), (2, 6, 32, 16, 5), (16, 48, 128, 128, 8),
                               (2, 6, 128, 128, 8), (16, 48, 128, 128, 32)):
        attrs = Heads(hk, hv, dk, dv, kv=kv).attrs()
        assert gdn_lib.slot_layout_of_build(**attrs) == gdn_lib.layout(**attrs).as_tuple(), (hk, hv, dk, dv, kv)
    qwen = gdn_lib.layout(**Heads(16, 48, 128, 128, kv=8).attrs())
    assert (qwen.record_rows, qwen.state_size, qwen.floats * 4) == (11, 139, 3_416_064)


# ------------------------------------------------------------------------ scalar functions
def test_scalar_functions_match_torch(gdn_lib):
    """softplus / sigmoid / silu / log built from the rounding-exact primitives (so that the GPU
    and the CPU build agree) stay within 3 ulp of torch's fp32 functions."""
    xs = torch.cat([torch.linspace(-30, 30, 601), torch.tensor([-100.0, -20.0, 19.999, 20.0, 20.001, 0.0, 1e-8])])
    for name, fn in (("softplus", F.softplus), ("sigmoid", torch.sigmoid), ("silu", F.silu)):
        want = fn(xs)
        got = torch.tensor([gdn_lib.scalar(name, float(x)) for x in xs])
        ulp = torch.finfo(torch.float32).eps * want.abs().clamp_min(torch.finfo(torch.float32).tiny)
        assert ((got - want).abs() <= 3 * ulp + 1e-38).all(), name
    for x in torch.tensor([1.0, 1.0000001, 1.5, 2.0, 3.7, 1e3, 4.8e8, 3e38]).tolist():  # fp32 values
        want = torch.log(torch.tensor(x, dtype=torch.float64)).float()
        got = gdn_lib.scalar("log", x)
        assert abs(got - float(want)) <= 2 * torch.finfo(torch.float32).eps * max(abs(float(want)), 1e-30), x


# ---------------------------------------------------------------------------- validation
I32, I64, F32_, BF16 = 3, 4, 0, 2


def _fwd_descs(h: Heads, t=10, b=3, dt=BF16):
    c = h.c
    return [(dt, (t, c)), (dt, (c, h.kc)), (dt, (t, h.hv)), (dt, (t, h.hv)), (F32_, (h.hv,)), (F32_, (h.hv,)),
            (I32, (b + 1,)), (I32, (b,)), (I32, (b,)), (I64, (1,)), (I64, (1,))]


def _commit_descs(h: Heads, b=3, dt=BF16):
    return [(dt, (b, h.kv, h.c)), (F32_, (b, h.kv, 2, h.hv)), (dt, (h.c, h.kc)), (I32, (b,)), (I32, (b + 1,)),
            (I32, (b,)), (I32, (b,)), (I64, (1,)), (I64, (1,))]


def _set(descs, i, d):
    out = list(descs)
    out[i] = d
    return out


def test_validation_accepts_good_and_unknown_dims(gdn_lib):
    h = GROUPED
    assert gdn_lib.validate(_fwd_descs(h), "forward", **h.attrs()) == (0, "")
    assert gdn_lib.validate(_commit_descs(h), "commit", **h.attrs()) == (0, "")
    dyn = _fwd_descs(h)  # TensorRT build time: T and B unknown
    dyn = [(d, tuple(-1 if (i in (0, 2, 3) and j == 0) or (i in (6, 7, 8)) else v for j, v in enumerate(s)))
           for i, (d, s) in enumerate(dyn)]
    assert gdn_lib.validate(dyn, "forward", **h.attrs())[0] == 0


@pytest.mark.parametrize("case,attrs,mutate,needle", [
    ("mode", dict(mode=2), None, "mode=2; expected 0 (forward) or 1 (commit)"),
    ("grouping", dict(num_v_heads=3), None, "num_v_heads=3 is not a multiple of num_k_heads=2"),
    ("dk", dict(head_k_dim=48), None, "head_k_dim=48 not supported"),
    ("dv", dict(head_v_dim=0), None, "head_v_dim=0 outside [1, 512]"),
    ("kc", dict(conv_kernel=9), None, "conv_kernel=9 outside [1, 8]"),
    ("kv", dict(max_verify_tokens=33), None, "max_verify_tokens=33 outside [1, 32]"),
    ("chunk", dict(chunk_size=65), None, "chunk_size=65 outside [0, 64]"),
    ("nb", {}, lambda d: d[:10], "expected 11 inputs in forward mode with zero_state_input=0, got 10"),
    ("zero attr", dict(zero_state_input=2), None, "zero_state_input=2 must be 0 or 1"),
    ("zero missing", dict(zero_state_input=1), None, "expected 12 inputs in forward mode with zero_state_input=1, got 11"),
    ("zero B", dict(zero_state_input=1), lambda d: d + [(I32, (2,))], "input 11 (zero_state) dim 0 is 2 but B=3"),
    ("zero dtype", dict(zero_state_input=1), lambda d: d + [(I64, (3,))],
     "input 11 (zero_state) has dtype int64, expected int32"),
    ("dtype", {}, lambda d: _set(d, 0, (I32, (10, 128))), "input 0 (qkv) has dtype int32; supported"),
    ("w dtype", {}, lambda d: _set(d, 1, (F32_, (128, 4))), "input 1 (conv_weight) has dtype float32, expected bfloat16"),
    ("dt_bias", {}, lambda d: _set(d, 4, (BF16, (4,))), "input 4 (dt_bias) has dtype bfloat16, expected float32"),
    ("C", {}, lambda d: _set(d, 0, (BF16, (10, 120))), "input 0 (qkv) dim 1 is 120 but 2 Hk Dk + Hv Dv=128"),
    ("taps", {}, lambda d: _set(d, 1, (BF16, (128, 3))), "input 1 (conv_weight) dim 1 is 3 but conv_kernel=4"),
    ("a tokens", {}, lambda d: _set(d, 2, (BF16, (9, 4))), "input 2 (a) dim 0 is 9 but T=10"),
    ("b heads", {}, lambda d: _set(d, 3, (BF16, (10, 2))), "input 3 (b) dim 1 is 2 but num_v_heads=4"),
    ("cu", {}, lambda d: _set(d, 6, (I32, (3,))), "input 6 (cu_seqlens) dim 0 is 3 but B+1=4"),
    ("types", {}, lambda d: _set(d, 8, (I32, (2,))), "input 8 (host_request_types) dim 0 is 2 but B=3"),
    ("ptr dtype", {}, lambda d: _set(d, 9, (I32, (1,))), "input 9 (rnn_state_ptr) has dtype int32, expected int64"),
    ("ptr shape", {}, lambda d: _set(d, 10, (I64, (2,))), "input 10 (conv_state_ptr) dim 0 is 2 but one pointer=1"),
    ("rank", {}, lambda d: _set(d, 0, (BF16, (10, 128, 1))), "input 0 (qkv) must have 2 dims, got 3"),
])
def test_forward_validation_rejects(gdn_lib, case, attrs, mutate, needle):
    h = GROUPED
    d = _fwd_descs(h)
    attrs = {**h.attrs(), **attrs}
    rc, msg = gdn_lib.validate(mutate(d) if mutate else d, attrs.pop("mode", "forward"), **attrs)
    assert rc == 1, case
    assert needle in msg and msg.startswith("DFlash2GatedDeltaNet: "), msg


@pytest.mark.parametrize("case,mutate,needle", [
    ("nb", lambda d: d + [(I32, (3,))], "expected 9 inputs in commit mode, got 10"),
    ("kv", lambda d: _set(d, 0, (BF16, (3, 5, 128))), "input 0 (verify_qkv) dim 1 is 5 but max_verify_tokens=4"),
    ("gates dtype", lambda d: _set(d, 1, (BF16, (3, 4, 2, 4))), "input 1 (verify_gates) has dtype bfloat16"),
    ("gates pair", lambda d: _set(d, 1, (F32_, (3, 4, 3, 4))), "input 1 (verify_gates) dim 2 is 3 but 2 (g, beta)=2"),
    ("accepted", lambda d: _set(d, 3, (I32, (2,))), "input 3 (num_accepted) dim 0 is 2 but B=3"),
    ("slots", lambda d: _set(d, 5, (I64, (3,))), "input 5 (slot_mapping) has dtype int64, expected int32"),
])
def test_commit_validation_rejects(gdn_lib, case, mutate, needle):
    h = GROUPED
    rc, msg = gdn_lib.validate(mutate(_commit_descs(h)), "commit", **h.attrs())
    assert rc == 1, case
    assert needle in msg, msg


def _mutated(bt, **kw):
    return dict(bt, **kw)


@pytest.mark.parametrize("case,change,needle", [
    ("type value", lambda bt: _mutated(bt, types=torch.tensor([0, 2, 1], dtype=torch.int32)),
     "host_request_types[1]=2; expected 0 (context) or 1 (generation)"),
    ("context after generation", lambda bt: _mutated(bt, types=torch.tensor([0, 1, 0], dtype=torch.int32)),
     "host_request_types[2] is a context request after a generation request"),
    ("cu start", lambda bt: _mutated(bt, cu=torch.tensor([1, 5, 8, 11], dtype=torch.int32)), "cu_seqlens[0]=1 must be 0"),
    ("cu decreasing", lambda bt: _mutated(bt, cu=torch.tensor([0, 5, 4, 11], dtype=torch.int32)),
     "cu_seqlens decreases at request 1 (5 -> 4)"),
    ("cu end", lambda bt: _mutated(bt, cu=torch.tensor([0, 5, 8, 10], dtype=torch.int32)),
     "cu_seqlens[B]=10 but the packed inputs have T=11 tokens"),
    ("verify too long", lambda bt: _mutated(bt, cu=torch.tensor([0, 2, 7, 11], dtype=torch.int32)),
     "generation request 1 has 5 tokens, more than max_verify_tokens=4"),
    ("slot range", lambda bt: _mutated(bt, slots=torch.tensor([0, 5, 1], dtype=torch.int32)),
     "slot_mapping[1]=5 outside the state pool's 5 slots"),
    ("slot shared", lambda bt: _mutated(bt, slots=torch.tensor([3, 1, 3], dtype=torch.int32)),
     "slot_mapping: requests 0 and 2 share slot 3"),
])
def test_forward_rejects_bad_request_data(gdn_lib, case, change, needle):
    h = GROUPED
    bt = change(_batch(h, torch.float32, [5], [3, 3], seed=19))
    rnn, conv = _pool(gdn_lib, h, bt["rnn"]), bt["conv"].clone()
    before = rnn.clone()
    with pytest.raises(PluginRunError) as e:
        gdn_lib.forward(bt["qkv"], bt["w"], bt["a"], bt["b"], bt["dt_bias"], bt["A_log"], bt["cu"], bt["slots"],
                        bt["types"], rnn, conv, **h.attrs())
    assert needle in str(e.value), str(e.value)
    assert torch.equal(rnn, before) and torch.equal(conv, bt["conv"])  # nothing written on a rejection


def test_commit_rejects_bad_accepted_counts(gdn_lib):
    h = GROUPED
    bt = _batch(h, torch.float32, [5], [3, 4], seed=20)
    _, vq, vg, _, conv, pool = _forward(gdn_lib, h, bt, 64)
    for accepted, needle in (([0, 4, 1], "num_accepted[1]=4 outside [0, 3]"),
                             ([0, 1, -1], "num_accepted[2]=-1 outside [0, 4]")):
        with pytest.raises(PluginRunError, match=__import__("re").escape(needle)):
            _commit(gdn_lib, h, bt, vq, vg, accepted, pool, conv)


def test_pools_are_checked(gdn_lib):
    h = GROUPED
    bt = _batch(h, torch.bfloat16, [5], [3], seed=21)
    args = [bt[k] for k in ("qkv", "w", "a", "b", "dt_bias", "A_log", "cu", "slots", "types")]
    pool = _pool(gdn_lib, h, bt["rnn"])
    assert pool.shape[1:] == (4, 16 + 7, 16)  # a slot: the state and 7 rows of records (gdn_slot)
    for rnn, conv, needle in (
            (pool.double(), bt["conv"], "rnn_state must be torch.float32 [slots, 4, 23, 16]"),
            (bt["rnn"], bt["conv"], "rnn_state must be torch.float32 [slots, 4, 23, 16]"),  # a bare state pool
            (pool, bt["conv"].float(), "conv_state must be torch.bfloat16 [slots, 3, 128]"),
            (pool[:2], bt["conv"], "rnn_state has 2 slots but conv_state 4"),
            (pool.transpose(1, 3), bt["conv"], "must be a contiguous CPU tensor")):
        with pytest.raises(PluginRunError, match=__import__("re").escape(needle)):
            gdn_lib.forward(*args, rnn, conv, **h.attrs())
