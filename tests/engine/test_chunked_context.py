"""Chunked context in the project runtime: a prompt longer than the step's token budget is taken in chunks, as
TensorRT-LLM's batch manager does it (dflash2_trt/engine/trtllm/facts/context_chunking.yaml, read in its sources).

References: the target's own greedy decoding (``target_generate``) for the three tiny families, and the record. A
negative control feeds every chunk as if it were a prompt's first, which must change the output."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.engine.build import build_engine
from dflash2_trt.engine.standin.engine import open_standin_engine
from dflash2_trt.errors import ConfigError
from dflash2_trt.reference.loop import load_pair, target_generate
from dflash2_trt.runtime import Request, Runtime
from dflash2_trt.runtime.runtime import context_chunk_unit
from dflash2_trt.testing.engines import shipped_prompts, standin_session
from dflash2_trt.yaml_files import load_yaml_file

FACTS = Path(__file__).parents[2] / "dflash2_trt" / "engine" / "trtllm" / "facts" / "context_chunking.yaml"
FAMILIES = {"tiny": "qwen3", "tiny-hybrid": "qwen3_5", "tiny-muse": "muse_glimmer"}
NEW = 24
TPB = 16


class Family:
    def __init__(self, key: str, tmp: Path):
        from transformers.utils import logging

        logging.set_verbosity_error()
        warnings.filterwarnings("ignore")
        self.pair = trained_pair(FAMILIES[key])
        short = shipped_prompts(self.pair, 6)
        # prompts of 31-55 tokens: each longer than a chunk unit, several chunks under the budgets below
        self.prompts = [short[i] + short[(i + 1) % 6] + short[(i + 2) % 6] for i in range(6)]
        self.engine_dir = tmp / key
        build_engine(self.pair.drafter_dir, self.pair.target_dir, self.engine_dir, target_key=key, verify=False,
                     overrides={"block_size": 8, "tokens_per_block": TPB, "max_seq_len": 256, "max_input_len": 192,
                                "max_num_tokens": 256})
        n = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            target, _ = load_pair(self.pair.target_dir, self.pair.drafter_dir)
            self.oracle = [target_generate(target, p, NEW, stop_token_ids=(2,)) for p in self.prompts]
        finally:
            torch.set_num_threads(n)


@pytest.fixture(scope="module", params=list(FAMILIES))
def fam(request, tmp_path_factory):
    return Family(request.param, tmp_path_factory.mktemp("chunked"))


def _run(engine, prompts, *, max_num_tokens=None, max_batch=4, temperature=0.0, spy=None, **kw):
    rt = Runtime(engine, max_batch_size=max_batch, max_num_tokens=max_num_tokens, **kw)
    if spy is not None:
        orig = engine.step
        engine.step = lambda inputs: orig(spy(inputs) or inputs)
    try:
        reqs = [Request(list(p), NEW, temperature=temperature, seed=i, stop_token_ids=(2,), task_id=i)
                for i, p in enumerate(prompts)]
        rt.generate(reqs)
    finally:
        if spy is not None:
            engine.step = orig
    return reqs, rt


@pytest.mark.parametrize("budget,batch", [(33, 4), (16, 2)])
def test_chunked_prompts_decode_as_the_target_does(fam, budget, batch):
    """Every prompt exceeds the budget left beside the generation requests (16 tokens: every prompt exceeds the whole
    budget); the runtime cuts them at multiples of the unit, and the tokens are the target's own greedy ones."""
    feeds = []
    eng, _ = open_standin_engine(fam.engine_dir)
    try:
        reqs, rt = _run(eng, fam.prompts, max_num_tokens=budget, max_batch=batch,
                        spy=lambda f: feeds.append({k: f[k].clone() for k in ("input_ids", "context_lengths",
                                                                               "sequence_length", "host_request_types",
                                                                               "rand_data_validation")}))
    finally:
        eng.close()
    assert [r.output_ids for r in reqs] == fam.oracle
    assert rt.chunk_unit == TPB
    # a request's steps: every engine step it took part in, its prompt's chunks included
    assert sum(r.steps for r in reqs) == sum(s["context"] + s["generation"] for s in rt.step_log)
    # a request's context_chunks: the steps that took part of its prompt; more than one where it was cut
    assert sum(r.context_chunks for r in reqs) == sum(s["context"] for s in rt.step_log)
    assert all(r.context_chunks >= 1 for r in reqs) and any(r.context_chunks > 1 for r in reqs)
    cut_steps = [s for s in rt.step_log if s.get("cut")]
    assert cut_steps, "no prompt was cut: the test does not test chunking"
    for feed, log in zip(feeds, rt.step_log):
        assert feed["input_ids"].numel() == log["tokens"] <= budget
        n_ctx = int((feed["host_request_types"] == 0).sum())
        assert n_ctx == log["context"]
        cut = log.get("cut", 0)
        # the chunks before a prompt's last come first, each a multiple of the unit, past their prompt's start or not
        assert all(int(c) % TPB == 0 for c in feed["context_lengths"][:cut])
        # no random data is drawn for them (their outputs are not used)
        assert not feed["rand_data_validation"][:cut].any()
        assert feed["rand_data_validation"][cut:].all()
    # a later chunk carries its past (sequence_length > context_lengths for a context request)
    assert any(bool(((f["host_request_types"] == 0) & (f["sequence_length"] > f["context_lengths"])).any())
               for f in feeds)


def test_a_chunk_fed_as_a_first_chunk_changes_the_output(fam):
    """Negative control: each chunk given as a prompt's start (sequence_length = its own length: no past keys, and a
    recurrent layer's state restarted) is not the target's decoding."""
    def as_first(feed):
        ctx = feed["host_request_types"] == 0
        f = dict(feed)
        for k in ("sequence_length", "host_past_key_value_lengths"):
            f[k] = torch.where(ctx, feed["context_lengths"], feed[k])
        return f

    eng, _ = open_standin_engine(fam.engine_dir)
    try:
        reqs, _rt = _run(eng, fam.prompts, max_num_tokens=33, spy=as_first)
    finally:
        eng.close()
    assert [r.output_ids for r in reqs] != fam.oracle


def test_sampled_requests_draw_as_if_uncut(fam):
    """A request's random data is drawn only on the steps it emits on, so how its prompt is cut (which depends on the
    requests beside it) does not move its generator: the same draws as the uncut run, step for step."""
    eng, _ = open_standin_engine(fam.engine_dir)
    try:
        whole, rt_whole = _run(eng, fam.prompts, temperature=0.9)
        cut, rt_cut = _run(eng, fam.prompts, max_num_tokens=33, temperature=0.9)
    finally:
        eng.close()
    assert not any(s.get("cut") for s in rt_whole.step_log) and any(s.get("cut") for s in rt_cut.step_log)
    # the same draws, so on this CPU (the same float results whether a prompt is cut or not) the same tokens
    assert [r.output_ids for r in cut] == [r.output_ids for r in whole]
    for r in whole + cut:
        # drawn on its last context step and on each generation step, as the runtime draws them
        fresh = torch.Generator().manual_seed(r.seed)
        for _ in range(len(r.acceptance_lengths) + 1):
            torch.rand(2, generator=fresh), torch.rand(eng.K, generator=fresh)
        assert torch.equal(r._gen.get_state(), fresh.get_state()), r.task_id


def test_the_tensorrt_session_runs_the_chunks(fam):
    """The project runtime's TensorRT path (TrtEngineSession over the stand-in of TensorRT's execution API, which holds
    every binding to the recorded TensorRT rules) takes the same chunks to the same tokens."""
    sess = standin_session(fam.engine_dir)
    try:
        assert sess.paged_context_fmha and sess.max_attention_window == 256
        reqs, rt = _run(sess, fam.prompts, max_num_tokens=33)
    finally:
        sess.close()
    assert any(s.get("cut") for s in rt.step_log)
    assert [r.output_ids for r in reqs] == fam.oracle


def test_cancel_mid_prompt_frees_blocks_and_slot(fam):
    eng, _ = open_standin_engine(fam.engine_dir)
    try:
        rt = Runtime(eng, max_batch_size=2, max_num_tokens=16)
        free_blocks = rt.blocks.free_blocks
        r = rt.submit(Request(list(fam.prompts[0]), 4, stop_token_ids=(2,)))
        rt.step()
        assert r.context_pos == 16 and not r.output_ids and rt.has_work
        rt.cancel(r)
        assert r.stop_reason == "cancelled" and not rt.has_work and rt.in_flight == 0
        assert rt.blocks.free_blocks == free_blocks
        if rt._free_slots is not None:
            assert r.slot is None and len(rt._free_slots) == eng.num_slots
    finally:
        eng.close()


def test_whole_prompt_refusals_name_why(fam):
    """Without chunking a prompt over the budget is refused in one line naming why: chunking turned off, or an engine
    built without paged context FMHA (TensorRT-LLM's requirement for it)."""
    eng, _ = open_standin_engine(fam.engine_dir)
    try:
        req = Request(list(fam.prompts[0]), 4, task_id="a")
        with pytest.raises(ConfigError, match=r"request a: prompt of (\d+) tokens exceeds max_num_tokens 16 \(a "
                                              r"prompt is taken whole in one step: chunked context is off; an engine "
                                              r"built with --max-num-tokens \1 or more takes it whole\)"):
            Runtime(eng, max_batch_size=2, max_num_tokens=16, chunked_context=False).check(req)
        eng.paged_context_fmha = False
        with pytest.raises(ConfigError, match="built without paged context FMHA, which chunked context needs"):
            Runtime(eng, max_batch_size=2, max_num_tokens=16).check(req)
        del eng.paged_context_fmha
        Runtime(eng, max_batch_size=2, max_num_tokens=16).check(req)
    finally:
        eng.close()


def test_chunk_sizes_follow_the_record():
    """The unit and the first-come-first-served cut, as facts/context_chunking.yaml records TensorRT-LLM's."""
    facts = load_yaml_file(FACTS)
    assert facts["chunk_unit"]["base"] == "tokens_per_block" and facts["chunk_unit"]["sliding_window_floor"] == 256
    assert facts["policy"]["default"] == "first_come_first_served" and facts["policy"]["fcfs_round_down_when_cut"]
    assert facts["requires"]["paged_context_fmha"]
    lim = {"tokens_per_block": 32, "max_input_len": 4096}
    assert context_chunk_unit(lim, 8192, 8192) == 32                   # max_input_len within the largest window
    assert context_chunk_unit(lim, 2048, 8192) == 256                  # past it: the FMHA's kv step
    assert context_chunk_unit(lim, 2048, 100) == 100                   # clamped to max_context_length
    assert context_chunk_unit(lim, None, 8192) == 32

    class Fake:
        K, vocab_size, num_blocks, num_layers = 3, 10, 64, 1
        limits = {"max_batch_size": 4, "max_num_tokens": 64, "max_seq_len": 512, "max_input_len": 256,
                  "tokens_per_block": 16}

    rt = Runtime(Fake())
    r = Request([1] * 100, 4)
    assert rt._chunk_size(r, 200) == 100                # the rest fits: taken whole
    assert rt._chunk_size(r, 100) == 100
    assert rt._chunk_size(r, 47) == 32                  # cut: rounded down to the unit
    assert rt._chunk_size(r, 15) == 0                   # under one unit: waits
    r.context_pos = 90
    assert rt._chunk_size(r, 10) == 10                  # a last chunk of any length
    off = Runtime(Fake(), chunked_context=False)
    assert off._chunk_size(Request([1] * 100, 4), 47) == 0


def test_chunks_at_tp2_decode_as_the_target_does(tmp_path):
    """A tp 2 engine (each rank its heads and its share of every recurrent state) takes the same chunks to the target's
    tokens: the hybrid, whose later chunks continue each rank's state slots."""
    ref = Family("tiny-hybrid", tmp_path)
    build_engine(ref.pair.drafter_dir, ref.pair.target_dir, tmp_path / "tp2", target_key="tiny-hybrid", verify=False,
                 tp_size=2, overrides={"block_size": 8, "tokens_per_block": TPB, "max_seq_len": 256,
                                       "max_input_len": 192, "max_num_tokens": 256})
    eng, _ = open_standin_engine(tmp_path / "tp2")
    try:
        reqs, rt = _run(eng, ref.prompts, max_num_tokens=33)
    finally:
        eng.close()
    assert any(s.get("cut") for s in rt.step_log)
    assert [r.output_ids for r in reqs] == ref.oracle


def test_the_budget_holds_every_generation_request_and_no_more_than_the_engine():
    """The runtime runs every generation request each step, so its budget must hold max_batch_size x (K+1) tokens
    (trtllm-build's rule for the engine's; below it, the capacity left to chunks went negative, once a negative chunk)
    and no more than the engine's max_num_tokens (its input shapes)."""
    class Fake:
        K, vocab_size, num_blocks, num_layers = 3, 10, 64, 1
        limits = {"max_batch_size": 4, "max_num_tokens": 64, "max_seq_len": 512, "max_input_len": 256,
                  "tokens_per_block": 16}

    assert Runtime(Fake(), max_num_tokens=16).max_num_tokens == 16
    assert Runtime(Fake(), max_batch_size=2, max_num_tokens=8).max_num_tokens == 8
    for bad in (15, 65):
        with pytest.raises(ConfigError, match=r"max_num_tokens: must be in \[16, 64\] \(max_batch_size 4 x \(K\+1\) 4 "
                                              r"generation tokens, the engine's max_num_tokens\), got " + str(bad)):
            Runtime(Fake(), max_num_tokens=bad)


class _FakeEngine:
    """Only what the scheduler reads (the step is not run): K 3, batch 8, a 64-token budget, 16 tokens a block."""
    K, vocab_size, num_blocks, num_layers, mask_token_id = 3, 10, 64, 1, 0
    limits = {"max_batch_size": 8, "max_num_tokens": 64, "max_seq_len": 512, "max_input_len": 256,
              "tokens_per_block": 16}


class _Planned(Exception):
    pass


def _planned_chunks(rt, waiting, generating):
    """The context_lengths of the first step with ``generating`` requests generating and prompts of the lengths
    ``waiting`` arriving (the engine's step stops the runtime with its feed)."""
    def step(inputs):
        raise _Planned(inputs)

    rt.engine.step = step
    for _ in range(generating):
        rt.adopt(Request([1] * 3, 8), 1)
    for n in waiting:
        rt.submit(Request([1] * n, 4))
    with pytest.raises(_Planned) as ei:
        rt.step()
    feed = ei.value.args[0]
    return feed["context_lengths"][feed["host_request_types"] == 0].tolist()


def test_a_request_with_no_chunk_this_step_does_not_hold_back_the_next():
    """The batch manager's micro-batch scheduler skips a context request whose chunk comes out 0 and goes on, so a
    short prompt behind it runs whole; without chunking its loop ends at the first prompt that does not fit whole.
    3 generation requests take 12 of the 64 tokens: 100 gets 48 (3 units of 16), 30 gets 0 (4 left), 3 runs whole."""
    assert _planned_chunks(Runtime(_FakeEngine()), [100, 30, 3], generating=3) == [48, 3]
    assert _planned_chunks(Runtime(_FakeEngine(), chunked_context=False), [60, 3], generating=3) == []
    assert _planned_chunks(Runtime(_FakeEngine(), chunked_context=False), [3, 60], generating=3) == [3]


def test_cancel_takes_a_waiting_request_by_identity():
    """Requests compare by value (a dataclass): cancelling one must not drop an equal one queued before it."""
    rt = Runtime(_FakeEngine())
    a, b = Request([1, 2], 4), Request([1, 2], 4)
    rt.submit(a), rt.submit(b)
    rt.cancel(b)
    assert list(rt._waiting) == [a] and rt._waiting[0] is a and b.stop_reason == "cancelled"


def test_the_environment_switch(monkeypatch):
    """$DFLASH2_CHUNKED_CONTEXT: 1 or unset chunks, 0 takes prompts whole, anything else is an error naming it; an
    explicit argument wins (the Triton model passes its parameter)."""
    monkeypatch.delenv("DFLASH2_CHUNKED_CONTEXT", raising=False)
    assert Runtime(_FakeEngine()).chunked_context
    monkeypatch.setenv("DFLASH2_CHUNKED_CONTEXT", "0")
    assert not Runtime(_FakeEngine()).chunked_context and Runtime(_FakeEngine(), chunked_context=True).chunked_context
    with pytest.raises(ConfigError, match=r"exceeds max_num_tokens 64 \(a prompt is taken whole in one step: chunked "
                                          r"context is off \(\$DFLASH2_CHUNKED_CONTEXT=0\); an engine built with "
                                          r"--max-num-tokens 100 or more takes it whole\)"):
        Runtime(_FakeEngine()).check(Request([1] * 100, 4))
    monkeypatch.setenv("DFLASH2_CHUNKED_CONTEXT", "")           # emptied, as `export X=` does: unset
    assert Runtime(_FakeEngine()).chunked_context
    monkeypatch.setenv("DFLASH2_CHUNKED_CONTEXT", "yes")
    with pytest.raises(ConfigError, match=r"DFLASH2_CHUNKED_CONTEXT: must be 0 or 1, got 'yes'"):
        Runtime(_FakeEngine())
