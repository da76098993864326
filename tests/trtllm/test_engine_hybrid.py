"""The Qwen3.5 hybrid target inside the engine (Gated DeltaNet layers through the DFlash2GatedDeltaNet plugin's
CPU build, recurrent state in runtime-owned slots, committed in-engine over the accepted tokens only).

References: the target's own greedy decoding (``target_generate``, checked against transformers' generate in
tests/reference) and the reference speculative loop (snapshot + replay of the hybrid cache)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.engine.standin.engine import open_standin_engine
from dflash2_trt.reference.loop import load_pair, target_generate
from dflash2_trt.runtime import Request, Runtime
from dflash2_trt.testing.engines import EngineCache, ReferenceRuns, run_prompts
from dflash2_trt.testing.law import chi2_pvalue, exact_triples

NEW = 40


@pytest.fixture(scope="module")
def pair():
    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    return trained_pair("qwen3_5")


@pytest.fixture(scope="module")
def prompts(pair):
    ps = json.loads((pair.drafter_dir.parent / "prompts.json").read_text())["prompts"]
    out = [list(p) for p in ps[:12]]
    assert len({len(p) for p in out}) >= 6
    return out


@pytest.fixture(scope="module")
def target(pair):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    t, _ = load_pair(pair.target_dir, pair.drafter_dir)
    yield t
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def reference(pair, prompts):
    return ReferenceRuns(pair, prompts, NEW)


@pytest.fixture(scope="module")
def oracle(target, prompts):
    return [target_generate(target, p, NEW, stop_token_ids=(2,)) for p in prompts]


@pytest.fixture(scope="module")
def engines(pair, tmp_path_factory):
    return EngineCache(pair, "tiny-hybrid", tmp_path_factory, verify=False)


def _run(engine_dir, prompts, *, max_batch=4, temperature=0.0, seeds=None, new=NEW):
    return run_prompts(engine_dir, prompts, new=new, max_batch=max_batch, temperature=temperature, seeds=seeds)


@pytest.mark.parametrize("block,tp", [(4, 1), (8, 1), (8, 2), (8, 4)])
def test_hybrid_greedy_lossless_and_acceptance_equals_reference(prompts, oracle, reference, engines, block, tp):
    reqs, rt = _run(engines(block, tp), prompts)
    assert any(s["context"] and s["generation"] for s in rt.step_log)
    assert max(s["context"] + s["generation"] for s in rt.step_log) == 4
    for r, ref, sp in zip(reqs, oracle, reference(block)):
        assert r.output_ids == ref, f"prompt {r.task_id}"
        assert r.acceptance_lengths == sp.acceptance_lengths, f"prompt {r.task_id}"


def _force_prefixes(monkeypatch, K):
    """Replace the drafts after a cycling prefix length m = 0..K with a token that differs from the selector's,
    so that every acceptance length 1..K+1 occurs (acceptance <= m + 1; = m + 1 when the first m were right)."""
    from dflash2_trt.trtllm.cpu.tensor import raw, wrap
    from dflash2_trt.trtllm.plugin_layers import CpuPlugins

    orig = CpuPlugins.pairwise_scan
    state = {"step": 0}

    def forced(self, unary, cand_ids, *a, **kw):
        ids, q = orig(self, unary, cand_ids, *a, **kw)
        m = state["step"] % (K + 1)
        state["step"] += 1
        ids = raw(ids).clone()                    # a plugin output, edited as plain torch, handed back as one
        ids[:, m:] = (ids[:, m:] + 7) % 250 + 3   # never the selector's own token, always a real word id
        return wrap(ids), q

    monkeypatch.setattr(CpuPlugins, "pairwise_scan", forced)


@pytest.mark.parametrize("block", [4, 8])
def test_every_acceptance_length_occurs_and_output_stays_exact(prompts, oracle, engines, block, monkeypatch):
    _force_prefixes(monkeypatch, block - 1)
    reqs, _ = _run(engines(block), prompts)
    assert [r.output_ids for r in reqs] == oracle
    seen = {a for r in reqs for a in r.acceptance_lengths}
    assert seen == set(range(1, block + 1)), sorted(seen)


def test_committing_the_whole_verify_block_breaks_it(prompts, oracle, engines, monkeypatch):
    """Control: the DeltaNet state advanced over all K+1 verify tokens instead of the accepted prefix."""
    from dflash2_trt.trtllm.backend import load_network

    net = load_network("cpu")
    orig = net.GatedDeltaNet.commit

    def commit_all(self, saved, num_accepted, rs):
        return orig(self, saved, num_accepted * 0 + self.max_verify, rs)

    monkeypatch.setattr(net.GatedDeltaNet, "commit", commit_all)
    reqs, _ = _run(engines(8), prompts[:6])
    assert [r.output_ids for r in reqs] != oracle[:6]


def test_state_slots_are_reused_and_reset(prompts, oracle, engines):
    """Max batch 2 over 6 requests: slots are handed back and reused, never zeroed by the runtime (as
    TensorRT-LLM's): the engine itself starts a prompt's first chunk from zero state (zero_state)."""
    reqs, rt = _run(engines(8), prompts[:6], max_batch=2)
    assert [r.output_ids for r in reqs] == oracle[:6]
    assert sorted(rt._free_slots) == list(range(rt.engine.num_slots))


def _context_logits_on_reused_slot(engine_dir, first, second):
    """Logits of ``second``'s context step when it reuses the slot ``first`` just left (max batch 1)."""
    eng, _ = open_standin_engine(engine_dir)
    try:
        rt = Runtime(eng, max_batch_size=1)
        seen = []
        orig = eng.step

        def spy(inputs):
            out = orig(inputs)
            if int(inputs["draft_lens"][0]) == 0:       # a context step
                seen.append(out["logits"].clone())
            return out

        eng.step = spy
        rt.generate([Request(list(first), 12), Request(list(second), 2)])
        return seen[-1]
    finally:
        eng.close()


def test_a_reused_slot_starts_from_zero_state(prompts, engines, monkeypatch):
    """The runtime never zeroes a slot (as TensorRT-LLM's); the engine's zero_state makes a reused slot's context
    step bit-identical to a fresh one. Control: without zero_state the previous request's state leaks in (the tiny
    model's strong decay hides it from greedy outputs, not from the logits)."""
    from dflash2_trt.trtllm.plugin_layers import CpuPlugins

    fresh = _context_logits_on_reused_slot(engines(8), prompts[1], prompts[1])   # reset: what came before is moot
    a = _context_logits_on_reused_slot(engines(8), prompts[0], prompts[1])
    assert torch.equal(a, fresh)
    orig = CpuPlugins.gated_delta_net

    def no_reset(self, *args, zero_state=None, **kw):
        return orig(self, *args, zero_state=None, **kw)

    monkeypatch.setattr(CpuPlugins, "gated_delta_net", no_reset)
    b = _context_logits_on_reused_slot(engines(8), prompts[0], prompts[1])
    assert not torch.equal(b, fresh)


def test_hybrid_sampling_joint_law(target, prompts, engines):
    T, runs = 1.0, 900
    cands = [p[:10] for p in prompts[:8]]
    prompt = max(cands, key=lambda pr: sum(1 for v in exact_triples(target, pr, T).values() if v * runs >= 5))
    exact = exact_triples(target, prompt, T)
    eng = engines(8, max_batch_size=64, max_seq_len=64, max_input_len=32, max_num_tokens=1024)
    reqs, _ = _run(eng, [prompt] * runs, max_batch=64, temperature=T, seeds=list(range(runs)), new=3)
    samples = [tuple(r.output_ids) for r in reqs]
    assert sum(r.acceptance_lengths[0] >= 2 for r in reqs if r.acceptance_lengths) >= runs // 4
    assert chi2_pvalue(samples, exact) > 1e-3
