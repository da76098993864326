"""A warm cuda-engine step can be held by a CUDA graph: no host read of a device value, no host-to-device copy, shapes
from host inputs alone (engine/standin/capture.py runs the cuda backend's code on the ``meta`` device). Every step kind
the runtime makes (context, generation, mixed, sampled) of all three families; the check's own negative controls;
and the paged attention's plan from the host bounds a device uses gives the CPU engine's tokens."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.engine.standin.capture import check_step, open_meta_engine
from dflash2_trt.engine.standin.engine import open_standin_engine
from dflash2_trt.runtime import Request, Runtime
from dflash2_trt.sampling import GREEDY_BELOW
from dflash2_trt.testing.engines import EngineCache, run_prompts, shipped_prompts
from dflash2_trt.trtllm.cpu import attention, functional, tensor

FAMILIES = [("qwen3", "tiny"), ("qwen3_5", "tiny-hybrid"), ("muse_glimmer", "tiny-muse")]


def _shapes(outputs) -> dict:
    """A step's outputs as the meta check reports them: name -> (shape, dtype)."""
    return {k: (tuple(v.shape), v.dtype) for k, v in outputs.items()}


@contextlib.contextmanager
def _recording(eng, before=None):
    """While inside: every ``eng.step`` appends (feed, its outputs' shapes) to the yielded list, after ``before(feed)``
    when given; the engine's own ``step`` is put back on the way out."""
    steps, orig = [], eng.step

    def spy(feed):
        if before is not None:
            before(feed)
        outputs = orig(feed)
        steps.append((dict(feed), _shapes(outputs)))
        return outputs

    eng.step = spy
    try:
        yield steps
    finally:
        eng.step = orig


def _kind(feed) -> str:
    types = set(feed["host_request_types"].tolist())
    return "mixed" if types == {0, 1} else "context" if types == {0} else "generation"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """family -> (engine dir, [(feed, the CPU engine's outputs)]) of a greedy run (5 prompts, 3 at a time: context,
    generation and mixed steps) and a sampled one."""
    out = {}
    for family, key in FAMILIES:
        pair = trained_pair(family)
        d = EngineCache(pair, key, tmp_path_factory, verify=False)(4)
        eng, man = open_standin_engine(d)
        try:
            with _recording(eng) as steps:
                prompts = shipped_prompts(pair, 5)
                for temp in (0.0, 0.8):
                    Runtime(eng, max_batch_size=3).generate([Request(list(p), 8, temperature=temp, seed=i, task_id=i)
                                                             for i, p in enumerate(prompts)])
        finally:
            eng.close()
        out[family] = (d, steps)
    return out


def _distinct(steps) -> list:
    """The first step of each distinct kind of step: the same request types in the same order, the same requests
    sampling, the same shape of every input. Steps alike in all of these differ only in the values of inputs the
    network takes shapes from by the same code (15-20 steps a family are 10-12 kinds; checking each of them cost ~30 s
    of the suite more and no kind more). Greedy requests carry GREEDY_REQUEST_TEMPERATURE (positive), so sampling
    is told by GREEDY_BELOW."""
    seen, out = set(), []
    for feed, outputs in steps:
        temps = feed.get("eagle_temperature")           # the target-only baseline has none
        sig = (tuple(feed["host_request_types"].tolist()),
               None if temps is None else tuple((temps >= GREEDY_BELOW).tolist()),
               tuple((k, tuple(v.shape)) for k, v in sorted(feed.items())))
        if sig not in seen:
            seen.add(sig)
            out.append((feed, outputs))
    return out


@pytest.mark.parametrize("family", [f for f, _ in FAMILIES])
def test_every_step_kind_runs_on_meta_without_host_reads_or_copies(family, recorded):
    d, steps = recorded[family]
    steps = _distinct(steps)
    assert {_kind(f) for f, _ in steps} == {"context", "generation", "mixed"}
    sampled = [bool((f["eagle_temperature"] >= GREEDY_BELOW).any()) for f, _ in steps]
    assert any(sampled) and not all(sampled)           # greedy steps and sampled ones
    meta = open_meta_engine(d)
    try:
        assert meta.device.type == "meta" and meta.net.api.plugins.name == "cuda"
        for feed, cpu_outputs in steps:
            res = check_step(meta, feed)
            assert res.capturable, (_kind(feed), res.summary())
            assert res.outputs == cpu_outputs, _kind(feed)     # shapes and dtypes follow from host inputs alone
            if _kind(feed) == "generation":                    # as run --cuda-graphs captures it: a fixed key range
                with attention.key_range(int(meta.limits["max_seq_len"])):
                    res = check_step(meta, feed)
                assert res.capturable and res.outputs == cpu_outputs, res.summary()
    finally:
        meta.close()


def test_the_check_sees_a_host_read_and_a_copy(recorded, monkeypatch):
    d, steps = recorded["qwen3_5"]
    meta = open_meta_engine(d)
    try:
        feed = next(f for f, _ in steps if _kind(f) == "mixed")
        # unwarmed: the feed's placement and the constants made once are host-to-device copies
        cold = check_step(meta, feed, warm=False)
        assert cold.read is None and cold.copies and not cold.capturable
        assert any("engine/standin/engine.py" in c for c in cold.copies), cold.copies[:3]
        # a host value brought to the device by copying (what align did before shapes became device constants)
        monkeypatch.setattr(tensor, "_to_device", lambda x, dev: tensor.raw(x).to(dev, non_blocking=True))
        res = check_step(meta, feed)
        assert res.read is None and any("trtllm/network/accept.py" in c for c in res.copies), res.copies[:3]
        monkeypatch.undo()
        assert check_step(meta, feed).capturable
        # a host read of a device value inside the network (an int() in the cumsum the accept step uses)
        orig = functional.cumsum

        def reading(x, dim, **kw):
            int(tensor.raw(x).sum())
            return orig(x, dim, **kw)

        monkeypatch.setattr(functional, "cumsum", reading)
        res = check_step(meta, feed)
        assert res.read is not None and "meta" in res.read and "trtllm/network/" in res.read, res.read
    finally:
        meta.close()


@pytest.mark.parametrize("family,key", FAMILIES)
def test_the_attention_plan_from_host_bounds_gives_the_cpu_engines_tokens(family, key, tmp_path_factory):
    """On the CPU the plan takes its sizes from the values; on a device from host inputs (the plugin's
    max(host_past_key_value_lengths), the spec-decoding width) and the context lengths' device input. The same
    requests through both: the same tokens and acceptance, greedy and sampled."""
    pair = trained_pair(family)
    d = EngineCache(pair, key, tmp_path_factory, verify=False)(4)
    prompts = shipped_prompts(pair, 5)
    runs = {}
    for bounds in (False, True):
        with attention.sized_as_on_a_device() if bounds else contextlib.nullcontext():
            greedy, _ = run_prompts(d, prompts, new=10, max_batch=3)
            sampled, _ = run_prompts(d, prompts[:3], new=8, max_batch=2, temperature=0.8)
        runs[bounds] = [(r.output_ids, r.acceptance_lengths) for r in greedy + sampled]
    assert runs[True] == runs[False]
    assert all(len(ids) >= 8 for ids, _ in runs[False])


def test_host_bounds_cover_the_exact_sizes():
    """The bounds of a mixed batch (a context chunk after 5 committed tokens, two generation requests at 7 and 3
    committed with spec width 4, one owning 2 tokens): the key range and the query length cover what the values
    give, and the device plan's tensors equal the exact plan's where both are defined."""
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)   # noqa: E731
    args = dict(sequence_length=i32([9, 11, 5]), context_lengths=i32([4, 20, 20]), host_request_types=i32([0, 1, 1]),
                host_context_lengths=i32([4, 20, 20]), host_past_key_value_lengths=i32([9, 7, 3]), spec=True,
                spec_decoding_generation_lengths=i32([4, 2]),
                spec_decoding_position_offsets=i32([[0, 1, 2, 3], [0, 1, 1, 1]]),
                spec_decoding_packed_mask=attention.pack_mask(torch.ones(6, 4, dtype=torch.bool).tril())[:, :1],
                mask_type=attention.AttentionMaskType.causal, window=100)
    exact = attention._batch_plan(10, **args)
    with attention.sized_as_on_a_device():
        bound = attention._batch_plan(10, **args)
    assert (exact["L"], exact["N"]) == (11, 4) and (bound["L"], bound["N"]) == (11, 4)
    assert exact["exact"] is True and bound["exact"] is False
    for k in ("req", "local", "pos", "past", "n", "total", "allowed"):
        assert torch.equal(exact[k], bound[k]), k
    assert bound["host_total"].tolist() == [9, 11, 7]     # the second generation request: 3 + width 4 (it owns 2)


def test_an_engine_stepping_ranks_as_threads_is_refused(recorded, tmp_path_factory):
    """The dispatch hook sees only the thread it runs on, and a tp engine of the stand-in steps its ranks as threads:
    the check refuses it rather than calling its copies absent."""
    pair = trained_pair("qwen3")
    d = EngineCache(pair, "tiny", tmp_path_factory, verify=False)(4, tp=2)
    meta = open_meta_engine(d)
    try:
        with pytest.raises(ValueError, match="one rank per engine"):
            check_step(meta, recorded["qwen3"][1][0][0])
    finally:
        meta.close()


@pytest.mark.parametrize("family,key", FAMILIES)
def test_a_graph_captured_at_one_generation_step_replays_the_later_ones(family, key, tmp_path_factory):
    """A bucketed CUDA graph holds the host values its capture read. On the CPU engine, every later generation step of
    the same shapes computed with the first one's host inputs (its own device inputs) gives exactly its own outputs,
    from the same pool and slots, once the attention's key range is fixed for the bucket
    (capture.replay_with_host_inputs_of). Without the fixed range the first step's host_past_key_value_lengths size
    the later steps' attention too short, and the check sees it."""
    from dflash2_trt.engine.standin.capture import replay_with_host_inputs_of

    pair = trained_pair(family)
    d = EngineCache(pair, key, tmp_path_factory, verify=False)(4)
    eng, _ = open_standin_engine(d)
    bucket = int(eng.limits["max_seq_len"])
    first, checked, short = None, [], []

    def before(feed):
        nonlocal first
        if set(feed["host_request_types"].tolist()) == {1} and feed["host_request_types"].numel() == 3:
            if first is None:
                first = dict(feed)
            elif all(tuple(first[k].shape) == tuple(v.shape) for k, v in feed.items()):
                checked.append(replay_with_host_inputs_of(eng, first, feed, key_range=bucket)["differs"])
                short.append(replay_with_host_inputs_of(eng, first, feed, key_range=0)["differs"])

    try:
        with _recording(eng, before):
            reqs = [Request(list(p), 24, task_id=i) for i, p in enumerate(shipped_prompts(pair, 3))]
            Runtime(eng, max_batch_size=3).generate(reqs)
    finally:
        eng.close()
    assert len(checked) >= 3, len(checked)
    assert all(diff == [] for diff in checked), checked
    assert any("logits" in diff or (diff and diff[0].startswith("error:")) for diff in short), short


@pytest.mark.parametrize("family,key", FAMILIES)
def test_the_target_only_baselines_steps_can_be_held_by_a_graph(family, key, tmp_path_factory):
    """``bench run --cuda-graphs`` graphs the autoregressive baseline too (the target alone, one token per request
    per step). Its steps of every kind pass the meta check, and a later generation step computed with an earlier one's
    host inputs gives its own outputs once the key range is fixed, as for the combined engine."""
    from dflash2_trt.bench.autoregressive import TargetOnlyEngine, open_target_only_engine
    from dflash2_trt.engine.standin.capture import replay_with_host_inputs_of

    pair = trained_pair(family)
    d = EngineCache(pair, key, tmp_path_factory, verify=False)(4)
    eng = open_target_only_engine(d)
    first, checked = None, []

    def before(feed):
        nonlocal first
        if _kind(feed) == "generation" and feed["host_request_types"].numel() == 3:
            if first is None:
                first = dict(feed)
            elif all(tuple(first[k].shape) == tuple(v.shape) for k, v in feed.items()):
                checked.append(replay_with_host_inputs_of(eng, first, feed,
                                                          key_range=int(eng.limits["max_seq_len"]))["differs"])

    try:
        with _recording(eng, before) as steps:
            prompts = shipped_prompts(pair, 5)
            # lengths that differ, so that a request starts beside generating ones (a mixed step)
            Runtime(eng, max_batch_size=3).generate([Request(list(p), 8 + 3 * i, task_id=i)
                                                     for i, p in enumerate(prompts)])
    finally:
        eng.close()
    assert {_kind(f) for f, _ in steps} == {"context", "generation", "mixed"}
    assert len(checked) >= 3 and all(diff == [] for diff in checked), checked
    meta = open_meta_engine(d, engine_cls=TargetOnlyEngine)
    try:
        assert meta.K == 0
        for feed, cpu_outputs in _distinct(steps):
            res = check_step(meta, feed)
            assert res.capturable and res.outputs == cpu_outputs, (_kind(feed), res.summary())
    finally:
        meta.close()
