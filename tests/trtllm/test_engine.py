"""The combined engine end to end on the CPU backend: the network file executed by the CPU stand-in, driven
by the CPU runtime with in-flight batching, against independent references.

- greedy: every prompt's output equals the target's own greedy decoding (``target_generate``, itself
  checked against transformers' ``generate`` in tests/reference), and the acceptance lengths equal the
  reference speculative loop's, for block sizes 4, 8, 16 at tp 1 and tp 2 (simulated ranks), 12 prompts
  of lengths 8..22 arriving together at max batch 4 (so requests join while others generate);
- sampling: the joint law of the first three emitted tokens equals the target's exact law (chi-square),
  and a deliberately wrong proposal q is rejected by the same test;
- paging is real: a wrong block offset, or the drafter's KV layer pointed at a target layer, changes
  what comes out.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.engine.standin.engine import open_standin_engine
from dflash2_trt.reference.loop import load_pair, target_generate
from dflash2_trt.testing.engines import EngineCache, ReferenceRuns, run_prompts, shipped_prompts
from dflash2_trt.testing.law import chi2_pvalue, exact_triples
from dflash2_trt.runtime import Request, Runtime

NEW = 40


@pytest.fixture(scope="module")
def pair():
    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    return trained_pair("qwen3")


@pytest.fixture(scope="module")
def prompts(pair):
    out = shipped_prompts(pair)
    assert len({len(p) for p in out}) >= 6
    return out


@pytest.fixture(scope="module")
def engines(pair, tmp_path_factory):
    return EngineCache(pair, "tiny", tmp_path_factory)


@pytest.fixture(scope="module")
def reference(pair, prompts):
    return ReferenceRuns(pair, prompts, NEW)


@pytest.fixture(scope="module")
def oracle(pair, prompts):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    target, _ = load_pair(pair.target_dir, pair.drafter_dir)
    eos = (2,)
    refs = [target_generate(target, p, NEW, stop_token_ids=eos) for p in prompts]
    yield refs
    torch.set_num_threads(n)


def _run(engine_dir, prompts, *, max_batch=4, temperature=0.0, seeds=None, new=NEW, patch=None):
    return run_prompts(engine_dir, prompts, new=new, max_batch=max_batch, temperature=temperature, seeds=seeds,
                       patch=patch)


@pytest.mark.parametrize("block,tp", [(4, 1), (8, 1), (16, 1), (8, 2), (4, 2), (8, 4)])
def test_greedy_lossless_and_acceptance_equals_reference(prompts, oracle, reference, engines, block, tp):
    reqs, rt = _run(engines(block, tp), prompts)
    assert max(s["context"] + s["generation"] for s in rt.step_log) == 4
    assert any(s["context"] and s["generation"] for s in rt.step_log), "no step mixed joining and generating requests"
    for r, ref, sp in zip(reqs, oracle, reference(block)):
        assert r.output_ids == ref, f"prompt {r.task_id}: engine output differs from the target's greedy decoding"
        assert r.acceptance_lengths == sp.acceptance_lengths, f"prompt {r.task_id}"
    assert sum(sum(r.acceptance_lengths) for r in reqs) / sum(len(r.acceptance_lengths) for r in reqs) > 1.5


def test_batching_does_not_change_outputs(prompts, engines, oracle):
    one, _ = _run(engines(8, 1), prompts[:4], max_batch=1)
    assert [r.output_ids for r in one] == oracle[:4]


def test_wrong_block_offset_changes_output(prompts, engines, oracle):
    def patch(rt, eng):
        orig = rt._inputs
        calls = {"n": 0}

        def shifted(ctx, gen):
            f = orig(ctx, gen)
            calls["n"] += 1
            if calls["n"] == 4:            # one step reads/writes request 0's K/V one block off
                f["kv_cache_block_offsets"][0, 0] += 2
            return f

        rt._inputs = shifted

    reqs, _ = _run(engines(8, 1), prompts[:4], patch=patch)
    assert [r.output_ids for r in reqs] != oracle[:4]


def test_drafter_layer_offset_matters(prompts, engines, oracle):
    """Point the drafter's first KV layer at target layer 0: its context K/V land in (and are read from)
    the target's slot. Greedy stays lossless only if that is harmless — it is not."""
    base, _ = _run(engines(8, 1), prompts[:4])

    def patch(rt, eng):
        eng._pool_mapping = eng._pool_mapping.clone()
        eng._pool_mapping[eng.layer_offset] = torch.tensor([0, 0], dtype=torch.int32)

    bad, _ = _run(engines(8, 1), prompts[:4], patch=patch)
    assert ([r.output_ids for r in bad], [r.acceptance_lengths for r in bad]) != \
        ([r.output_ids for r in base], [r.acceptance_lengths for r in base])


# ---- sampling --------------------------------------------------------------------------------------------
T = 1.0
RUNS = 1200


def _exact_triples(target, prompt):
    return exact_triples(target, prompt, T)


def _chi2(samples, exact):
    return chi2_pvalue(samples, exact)


@pytest.fixture(scope="module")
def sampling_case(pair, prompts, engines):
    target, _ = load_pair(pair.target_dir, pair.drafter_dir)
    cands = [p[:10] for p in prompts[:8]]
    prompt = max(cands, key=lambda pr: sum(1 for v in _exact_triples(target, pr).values() if v * RUNS >= 5))
    eng = engines(8, 1, max_batch_size=64, max_seq_len=64, max_input_len=32, max_num_tokens=1024)
    return prompt, _exact_triples(target, prompt), eng


def _sample(eng, prompt, runs, patch=None):
    reqs, _ = _run(eng, [prompt] * runs, max_batch=64, temperature=T, seeds=list(range(runs)), new=3, patch=patch)
    return [tuple(r.output_ids) for r in reqs], sum(r.acceptance_lengths[0] >= 2 for r in reqs if r.acceptance_lengths)


def test_sampling_joint_law_matches_target(sampling_case):
    prompt, exact, eng = sampling_case
    samples, accepted = _sample(eng, prompt, RUNS)
    assert accepted >= RUNS // 4, "multi-token acceptance hardly happened"
    assert _chi2(samples, exact) > 1e-3


def test_wrong_proposal_q_is_detected(sampling_case, monkeypatch):
    """The selector's q replaced by the uniform law over the candidates while the drafts are still drawn
    from the real q: acceptance min(1, p/q') and the residual max(0, p - q') use the wrong proposal, and the
    law must break. (A one-hot q on the drafted token would NOT be wrong: rejection sampling against a
    point mass is lossless whatever chose the point — that is why greedy and Viterbi proposals are.)"""
    prompt, exact, eng = sampling_case
    from dflash2_trt.trtllm.cpu.tensor import raw, wrap
    from dflash2_trt.trtllm.plugin_layers import CpuPlugins

    orig = CpuPlugins.pairwise_scan

    def wrong_q(self, unary, cand_ids, *a, **kw):
        ids, q = orig(self, unary, cand_ids, *a, **kw)
        return ids, wrap(torch.full_like(raw(q), 1.0 / q.shape[-1]))   # handed back as a plugin output

    monkeypatch.setattr(CpuPlugins, "pairwise_scan", wrong_q)
    samples, _ = _sample(eng, prompt, RUNS // 2)
    assert _chi2(samples, exact) < 1e-6


def test_sampling_is_reproducible(sampling_case):
    prompt, _, eng = sampling_case
    a, _ = _sample(eng, prompt, 16)
    b, _ = _sample(eng, prompt, 16)
    assert a == b and len(set(a)) > 1


def test_late_arrivals_streaming_and_cancel(prompts, engines, oracle):
    """Requests submitted while others generate (serving), streamed tokens, and a cancelled request."""
    eng, man = open_standin_engine(engines(8, 1))
    try:
        rt = Runtime(eng, max_batch_size=3)
        streamed = {}

        def on_tokens(r, toks):
            streamed.setdefault(r.task_id, []).extend(toks)

        reqs = [Request(list(p), NEW, stop_token_ids=(2,), task_id=i) for i, p in enumerate(prompts[:6])]
        rt.submit(reqs[0])
        victim = Request(list(prompts[6]), NEW, task_id="victim")
        rt.submit(victim)
        step, nxt = 0, 1
        while rt.has_work:
            rt.step(on_tokens)
            step += 1
            if step == 2:
                rt.cancel(victim)
            if step % 3 == 0 and nxt < len(reqs):
                rt.submit(reqs[nxt])
                nxt += 1
            if not rt.has_work and nxt < len(reqs):
                rt.submit(reqs[nxt])
                nxt += 1
        assert [r.output_ids for r in reqs] == oracle[:6]
        assert all(streamed[r.task_id] == r.output_ids for r in reqs)
        assert victim.stop_reason == "cancelled" and not rt.blocks.owned
        assert rt.blocks.free_blocks == rt.blocks.num_blocks
    finally:
        eng.close()


def test_sampling_law_in_a_mixed_batch_over_several_steps(pair, prompts, oracle, engines, sampling_case):
    """Block size 2 (one draft per step), so the 2nd and 3rd tokens come from two different steps; sampled
    requests of one prompt share every batch with greedy requests of other prompts. The sampled law must still
    be the target's, and every greedy request must still be exactly the target's greedy decoding (a mix-up of
    rows, temperatures or uniforms between requests would break one or the other)."""
    prompt, exact, _ = sampling_case
    eng = engines(2, 1, max_batch_size=64, max_seq_len=128, max_input_len=32, max_num_tokens=1024)
    runs = 900
    greedy = [list(p[:12]) for p in prompts[:6]]
    e, man = open_standin_engine(eng)
    try:
        rt = Runtime(e, max_batch_size=64)
        reqs = []
        for i in range(runs):
            reqs.append(Request(list(prompt), 3, temperature=T, seed=i, task_id=("s", i)))
            if i % 150 == 0:
                g = greedy[(i // 150) % len(greedy)]
                reqs.append(Request(g, 12, temperature=0.0, stop_token_ids=(2,), task_id=("g", g)))
        rt.generate(reqs)
    finally:
        e.close()
    target, _ = load_pair(pair.target_dir, pair.drafter_dir)
    samples = [tuple(r.output_ids) for r in reqs if r.task_id[0] == "s"]
    assert _chi2(samples, exact) > 1e-3
    for r in reqs:
        if r.task_id[0] == "g":
            assert r.output_ids == target_generate(target, r.prompt_ids, 12, stop_token_ids=(2,))
    assert sum(len(r.acceptance_lengths) >= 2 for r in reqs if r.task_id[0] == "s") > runs // 2
