"""The project runtime over a TensorRT engine (engine/trtllm/session.py), tested up to execute_async_v3 with the CPU
stand-in of TensorRT's execution API (testing/tensorrt_standin.py), both held to the recorded facts
(engine/trtllm/facts/tensorrt_session.yaml).

- the record is sourced, and the stand-in enforces every rule it lists (one negative case per rule);
- the tiny pairs (dense, hybrid, Muse) through the session give the CPU engine's tokens and acceptance, step for
  step: the stand-in runs the CPU network on what the session bound (the KV pool in TensorRT-LLM's layout and block
  indexing, the recurrent state through its pointers), so a feed the network would read differently would differ;
- the published pairs at their real widths (config only, nothing at full size): every step kind (context,
  generation, mixed, a request on a reused state slot) through the session's full feed, each binding held to the
  rules (engine input set, dtype, profile, alignment, host/device memory, pool and state pointers and layouts,
  TensorRT-LLM's block indices, the recorded host input values)."""

from __future__ import annotations

import json

import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.errors import ConfigError
from dflash2_trt.engine.trtllm import session as sessmod
from dflash2_trt.engine.trtllm.session import TrtEngineSession, facts
from dflash2_trt.runtime import Request, Runtime
from dflash2_trt.testing import tensorrt_standin as trt
from dflash2_trt.testing.engines import EngineCache, shipped_prompts, standin_session


# ------------------------------------------------------------------------------------------------ the record
def test_the_record_is_sourced_and_the_standin_has_its_enums():
    f = facts()
    for key, src in f["sources"].items():
        assert src["repo"].startswith("NVIDIA/") and src["path"] and src["revision"], key
    for key, rule in f["tensorrt_api"]["rules"].items():
        assert rule["rule"] and rule["source"], key
    for enum_name in ("DataType", "TensorIOMode", "TensorLocation"):
        assert {m.name: m.value for m in getattr(trt, enum_name)} == f["tensorrt_api"][enum_name]
    assert f["tensorrt_api"]["rules"]["address_alignment"]["bytes"] == 256
    assert f["kv_pool"]["pool_shape"] == ["num_blocks", "num_layers_in_pool", 2, "num_kv_heads", "tokens_per_block",
                                          "head_size"]
    assert f["greedy_sampling"]["executor_default"] is True


# ------------------------------------------------------------------------------------------------ tiny engines
@pytest.fixture(scope="module")
def tiny_engines(tmp_path_factory):
    caches = {key: EngineCache(trained_pair(fam), key, tmp_path_factory, verify=False)
              for fam, key in (("qwen3", "tiny"), ("qwen3_5", "tiny-hybrid"), ("muse_glimmer", "tiny-muse"))}
    return lambda key: caches[key](4)


_session = standin_session


def _run(engine, prompts, new=12, max_batch=3, patch=None):
    reqs = [Request(list(p), new, seed=i, stop_token_ids=(2,), task_id=i) for i, p in enumerate(prompts)]
    rt = Runtime(engine, max_batch_size=max_batch)
    if patch is not None:
        patch(rt, engine)
    rt.generate(reqs)
    return reqs, rt


@pytest.mark.parametrize("key,family", [("tiny", "qwen3"), ("tiny-hybrid", "qwen3_5"), ("tiny-muse", "muse_glimmer")])
def test_the_session_gives_the_cpu_engines_tokens(tiny_engines, key, family):
    from dflash2_trt.engine.standin.engine import open_standin_engine

    engine_dir = tiny_engines(key)
    prompts = shipped_prompts(trained_pair(family), 5)
    cpu, _ = open_standin_engine(engine_dir)
    try:
        want, _ = _run(cpu, prompts)
    finally:
        cpu.close()
    sess = _session(engine_dir)
    got, rt = _run(sess, prompts)
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert [r.acceptance_lengths for r in got] == [r.acceptance_lengths for r in want]
    assert any(s["context"] and s["generation"] for s in rt.step_log)          # mixed steps ran
    assert sum(map(sum, (r.acceptance_lengths for r in got))) > sum(len(r.acceptance_lengths) for r in got)
    ctx = sess.execution.context
    assert ctx.executions == rt.step_count
    if key == "tiny-hybrid":                     # 5 requests on 3 slots: slots were reused
        assert sess.recurrent and sess.num_slots == int(sess.limits["max_batch_size"])


def test_offsets_not_in_trtllms_pool_index_are_refused(tiny_engines):
    """Negative control: offsets in the old CPU-pool form (K/V of block b at 2b / 2b + 1, what the runtime wrote before
    it took TensorRT-LLM's index) address other blocks' memory in a pool of L layers per block; the stand-in refuses
    them as TensorRT-LLM's attention plugin would read them wrong."""
    sess = _session(tiny_engines("tiny"))
    assert sess.num_layers > 1

    def patch(rt, _):
        rt.blocks.layers = 1                       # 2b + field: the old form

    with pytest.raises(RuntimeError, match="execute_async_v3 failed"):
        _run(sess, [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]], new=4, patch=patch)
    assert "[kv_pool] a block offset is not block" in trt.Logger.messages[-1]


# ------------------------------------------------------------------------------------------------ the stand-in
@pytest.fixture()
def scripted(tiny_engines):
    cfg = json.loads((tiny_engines("tiny") / "config.json").read_text())
    blob = trt.standin_engine(cfg, executor={"kind": "scripted"})
    return cfg, blob


def _fresh_context(blob):
    engine = trt.Runtime(trt.Logger()).deserialize_cuda_engine(blob)
    return engine, engine.create_execution_context()


def _last(rule):
    assert trt.Logger.messages and trt.Logger.messages[-1].startswith(f"[{rule}]"), trt.Logger.messages[-1:]


RULE_CASES = {}


def _case(rule):
    def deco(f):
        RULE_CASES[rule] = f
        return f
    return deco


@_case("shape_in_profile")
def _(cfg, blob):
    engine, ctx = _fresh_context(blob)
    mbs = int(cfg["build_config"]["max_batch_size"])
    assert ctx.set_input_shape("sequence_length", (mbs,))
    assert not ctx.set_input_shape("sequence_length", (mbs + 1,))            # beyond the profile's max
    _last("shape_in_profile")
    assert not ctx.set_input_shape("sequence_length", (1, 1))                 # another rank
    assert not ctx.set_input_shape("host_kv_cache_pool_pointers", (1, 3))    # a static dimension


@_case("every_input_shape_set")
def _(cfg, blob):
    engine, ctx = _fresh_context(blob)
    assert "input_ids" in ctx.infer_shapes() and not ctx.all_binding_shapes_specified
    assert ctx.execute_async_v3(0) is False
    _last("every_input_shape_set")


def _fully_bound(cfg, blob, skip=()):
    """A context with every shape and address set from a real session step, but the names in ``skip`` left unbound."""
    sess = TrtEngineSession(blob, cfg, trt=trt, device="cpu")
    rt = Runtime(sess, max_batch_size=1)
    rt.generate([Request([5, 6, 7], 1)])         # one context-only step
    ctx = sess.execution.context
    for name in skip:
        ctx._addresses.pop(name)
    return sess, ctx


@_case("every_io_address_set")
def _(cfg, blob):
    sess, ctx = _fully_bound(cfg, blob, skip=("input_ids",))
    assert ctx.execute_async_v3(0) is False
    _last("every_io_address_set")
    sess, ctx = _fully_bound(cfg, blob, skip=("logits",))                     # outputs too
    assert ctx.execute_async_v3(0) is False
    _last("every_io_address_set")


@_case("no_null_for_empty")
def _(cfg, blob):
    sess, ctx = _fully_bound(cfg, blob)
    empty = [n for n, s in ctx._shapes.items() if 0 in s]     # a context-only step: no generation rows
    assert empty and all(ctx._addresses[n] == sess._dummy.address for n in empty)
    for n in empty:
        ctx._addresses.pop(n)
    assert ctx.execute_async_v3(0) is False
    _last("no_null_for_empty")


@_case("address_alignment")
def _(cfg, blob):
    engine, ctx = _fresh_context(blob)
    assert ctx.set_tensor_address("input_ids", 4096)
    assert not ctx.set_tensor_address("input_ids", 4096 + 64)
    _last("address_alignment")
    sess, ctx = _fully_bound(cfg, blob)
    assert all(a % 256 == 0 for a in sess.addresses.values())


@_case("name_is_io_tensor")
def _(cfg, blob):
    engine, ctx = _fresh_context(blob)
    assert not ctx.set_tensor_address("position_ids", 4096)
    _last("name_is_io_tensor")
    assert not ctx.set_input_shape("position_ids", (3,))


@_case("dtype_is_engine_dtype")
def _(cfg, blob):
    sess = TrtEngineSession(blob, cfg, trt=trt, device="cpu")
    orig = sess.step

    def wrong(inputs):
        return orig(dict(inputs, input_ids=inputs["input_ids"].long()))
    sess.step = wrong
    with pytest.raises(RuntimeError, match=r"^input_ids: expected type torch.int32, provided type torch.int64$"):
        Runtime(sess, max_batch_size=1).generate([Request([5, 6, 7], 2)])
    engine, _ = _fresh_context(blob)
    assert engine.get_tensor_dtype("eagle_temperature") == trt.DataType.FLOAT


@_case("output_shape_inferred")
def _(cfg, blob):
    engine, ctx = _fresh_context(blob)
    assert ctx.get_tensor_shape("logits")[0] == -1                          # nothing set yet
    K = int(cfg["pretrained_config"]["dflash2"]["block_size"]) - 1
    ctx.set_input_shape("last_token_ids", (5,))
    ctx.set_input_shape("sequence_length", (2,))
    assert ctx.get_tensor_shape("logits") == (5, int(cfg["pretrained_config"]["vocab_size"]))
    assert ctx.get_tensor_shape("next_draft_paths") == (2, K + 1, K + 1)
    sess, ctx = _fully_bound(cfg, blob)
    assert not ctx.write_outputs({"num_accepted_tokens": torch.ones(7, dtype=torch.int32)}, [])
    _last("output_shape_inferred")


@_case("host_read_inputs_in_host_memory")
def _(cfg, blob, monkeypatch=None):
    sess, ctx = _fully_bound(cfg, blob)
    assert all(sess.bound[n].device.type == "cpu" for n in sess.bound)
    # as on a GPU (a CUDA stream handed in): a host input whose address lies in device memory is refused, and so is a
    # device input in host memory
    host = ctx._addresses["host_request_types"]
    trt._cuda_segments, orig = (lambda: [(host, host + 256)]), trt._cuda_segments
    try:
        assert ctx.execute_async_v3(1) is False
        _last("host_read_inputs_in_host_memory")
        assert "host_request_types" in trt.Logger.messages[-1] and "input_ids" in trt.Logger.messages[-1]
    finally:
        trt._cuda_segments = orig


def test_an_output_the_network_did_not_make_is_refused(scripted):
    """A real engine writes every output it declares; a stand-in network that made fewer would leave the runtime
    reading whatever the buffer held."""
    cfg, blob = scripted
    sess, ctx = _fully_bound(cfg, blob)
    assert not ctx.write_outputs({}, [])
    _last("engine_outputs")
    assert "logits" in trt.Logger.messages[-1]


def test_every_recorded_rule_has_a_case():
    assert set(RULE_CASES) == set(facts()["tensorrt_api"]["rules"])


@pytest.mark.parametrize("rule", sorted(facts()["tensorrt_api"]["rules"]))
def test_the_standin_enforces_the_recorded_rule(scripted, rule):
    RULE_CASES[rule](*scripted)


def test_a_tp2_rank_session_binds_tensorrt_llms_workspace_in_host_memory():
    """Rank r of a tp engine: its own heads, TensorRT-LLM's all-reduce table (7 tp + 3 entries, host memory: the
    AllReduce plugins read it on the host, facts multi_rank) bound with every step."""
    from dflash2_trt.engine import plan as planmod
    from dflash2_trt.engine.pretrained import engine_pretrained_config
    from dflash2_trt.engine.trtllm.command import trtllm_engine_config
    from dflash2_trt.errors import ConfigError

    p = trained_pair("qwen3")
    prep = planmod.prepare(p.drafter_dir, p.target_dir, target_key="tiny", overrides={"tp_size": 2})
    cfg = trtllm_engine_config(engine_pretrained_config(prep.checkpoint_config, prep.cfg, prep.d), prep.cfg)
    blob = trt.standin_engine(cfg, executor={"kind": "scripted"})
    mr = facts()["multi_rank"]
    assert mr["memory"] == "host" and mr["table_entries"] == "7 * tp + 3"
    with pytest.raises(ConfigError, match="a tp 2 engine runs as 2 processes, one per rank: mpirun -n 2"):
        TrtEngineSession(blob, cfg, trt=trt, device="cpu", rank=1, num_blocks=8)      # a rank alone would hang
    sess = TrtEngineSession(blob, cfg, trt=trt, device="cpu", rank=1, num_blocks=8, launched=True)
    assert sess.rank == 1 and sess.kv_heads == cfg["pretrained_config"]["num_key_value_heads"] // 2
    ws = sess.static_inputs()["all_reduce_workspace"]
    assert ws.dtype == torch.int64 and ws.shape == (17,) and sessmod.memory_of("all_reduce_workspace") == "host"
    rt = Runtime(sess, max_batch_size=2)
    reqs = [Request([5, 6, 7], 3, task_id=0), Request([8, 9], 3, task_id=1)]
    rt.generate(reqs)
    assert all(r.done for r in reqs)
    assert sess.bound["all_reduce_workspace"].device.type == "cpu" and sess.bound["all_reduce_workspace"].numel() == 17
    with pytest.raises(ConfigError, match="rank 2 of a tp 2 engine"):
        TrtEngineSession(blob, cfg, trt=trt, device="cpu", rank=2, launched=True)


# ------------------------------------------------------------------------------------------------ published pairs
def _published(key, tp=1):
    from dflash2_trt.engine import plan as planmod
    from dflash2_trt.engine.pretrained import engine_pretrained_config
    from dflash2_trt.engine.trtllm.command import engine_config_fixes, trtllm_engine_config
    from dflash2_trt.testing.fixtures import MUSE_DRAFTER, MUSE_TARGET, QWEN_DRAFTER, QWEN_TARGET

    d, t = {"qwen3.8-27b": (QWEN_DRAFTER, QWEN_TARGET), "muse-glimmer-30b": (MUSE_DRAFTER, MUSE_TARGET)}[key]
    p = planmod.prepare(d, t, target_key=key, overrides={"tp_size": tp})
    cfg = trtllm_engine_config(engine_pretrained_config(p.checkpoint_config, p.cfg, p.d), p.cfg)
    engine_config_fixes(cfg)
    return cfg


@pytest.mark.parametrize("key,tp,rank", [("qwen3.8-27b", 1, 0), ("muse-glimmer-30b", 1, 0),
                                         ("muse-glimmer-30b", 2, 1)])   # its build config's tp 2: rank 1's engine
def test_published_pair_full_feed_through_every_step_kind(key, tp, rank):
    import yaml

    from dflash2_trt.engine.trtllm.runtime_rules import state_pool_bytes_per_slot
    from dflash2_trt.trtllm.engine_io import CONTRACT

    cfg = _published(key, tp)
    pre = cfg["pretrained_config"]
    blob = trt.standin_engine(cfg, executor={"kind": "scripted"})
    sess = TrtEngineSession(blob, cfg, trt=trt, device="cpu", num_blocks=12, num_slots=2, rank=rank,
                            launched=tp > 1)
    assert sess.kv_heads == max(pre["num_key_value_heads"] // tp, 1)
    assert ("all_reduce_workspace" in sess.inputs) == (tp > 1)
    K, L = sess.K, sess.num_layers
    # the pool and the state as TensorRT-LLM lays them out (facts kv_pool, recurrent_state; RnnStateManager's slot)
    pool = sess.pools[0]
    assert pool.shape == (12, L, 2, sess.kv_heads, sess.tokens_per_block, sess.head_size)
    assert pool.data_ptr() % 256 == 0
    if key == "qwen3.8-27b":
        assert sess.recurrent and len(sess.gdn_layers) == 48 and L == 21
        slot = state_pool_bytes_per_slot({k: pre[k] for k in ("state_size", "conv_kernel", "rnn_hidden_size",
                                                              "rnn_conv_dim_size", "rnn_head_size")}, 2)
        for layer in sess.gdn_layers:
            assert sess.rnn_states[layer][0].numel() * 4 == slot["state"]
            assert sess.conv_states[layer][0].numel() * 2 == slot["conv"]
    else:
        assert not sess.recurrent and len(set(sess._windows.tolist())) > 1      # a variable-window model
        # at its build config's 40960 tokens the 2048-token window binds: its sliding layers take the context route
        assert sess.sliding_context and {n for n in sess.inputs if n.startswith("sliding_")} == {
            "sliding_host_request_types", "sliding_context_lengths", "sliding_host_context_lengths",
            "sliding_host_past_key_value_lengths"}
    host_values = {k: v["every_entry"] for k, v in yaml.safe_load(CONTRACT.read_text())["host_input_values"].items()}

    steps, holders = [], {}
    orig = sess.step
    rt = Runtime(sess, max_batch_size=2)
    prompts = [list(range(3, 3 + n)) for n in (21, 9, 40)]
    reqs = [Request(p, 8, seed=i, task_id=i) for i, p in enumerate(prompts)]

    def spy(inputs):
        for r in reqs:
            if r.slot is not None:
                holders.setdefault(r.slot, set()).add(r.task_id)
        out = orig(inputs)
        steps.append((dict(inputs), dict(sess.bound), dict(sess.addresses), {k: v.clone() for k, v in out.items()
                                                                             if k != "logits"}))
        return out
    sess.step = spy
    rt.generate(reqs)
    assert all(r.done and len(r.output_ids) == 8 for r in reqs)
    kinds = {(bool(s["context"]), bool(s["generation"])) for s in rt.step_log}
    assert kinds == {(True, False), (False, True), (True, True)}          # context, generation, mixed
    for inputs, bound, addrs, out in steps:
        assert set(bound) == set(sess.inputs)                                # every engine input, nothing else
        for name, t in bound.items():
            spec = sess.inputs[name]
            assert t.dtype == sessmod.str_dtype_to_torch(spec.dtype), name
            assert t.dim() == len(spec.profile) and all(lo <= s <= hi for s, (lo, _, hi) in zip(t.shape, spec.profile))
            assert addrs[name] % 256 == 0, name
            want = "cpu" if sessmod.memory_of(name) == "host" else sess.device.type
            assert t.device.type == want, name
        for name, spec in sess.outputs.items():
            assert addrs[name] % 256 == 0
        assert int(bound["host_kv_cache_pool_pointers"][0, 0]) == pool.data_ptr()
        assert bound["host_kv_cache_pool_mapping"].tolist() == [[0, i] for i in range(L)]
        offs = bound["kv_cache_block_offsets"].long()
        assert torch.equal(offs, bound["host_kv_cache_block_offsets"].long())
        assert bool(((offs % (2 * L)) <= 1).all())                           # TensorRT-LLM's K/V block index
        assert torch.equal(offs, inputs["kv_cache_block_offsets"].long())      # the runtime's own, unchanged
        assert int((offs // (2 * L)).max()) < sess.num_blocks
        for name, every in host_values.items():
            assert bool((bound[name] == every).all()), name
        assert bound["host_runtime_perf_knobs"].tolist() == [0] + [-1] * 15
        assert bound["host_max_attention_window_sizes"].tolist() == sess._windows.tolist()
        if tp > 1:                 # TensorRT-LLM's table, in host memory, the same address every step
            assert bound["all_reduce_workspace"].shape == (7 * tp + 3,) and bound["all_reduce_workspace"].is_cpu
            assert addrs["all_reduce_workspace"] == steps[0][2]["all_reduce_workspace"]
        if sess.recurrent:
            for layer in sess.gdn_layers:
                assert int(bound[f"rnn_state_ptr_{layer}"][0]) == sess.rnn_states[layer].data_ptr()
                assert int(bound[f"conv_state_ptr_{layer}"][0]) == sess.conv_states[layer].data_ptr()
            assert bound["slot_mapping"].tolist() == inputs["slot_mapping"].tolist()
        assert out["next_draft_lens"].tolist() == [K] * len(out["next_draft_lens"])
        if sess.sliding_context:   # the second set: every request a context chunk of its new tokens after its past
            bs = len(inputs["sequence_length"])
            assert inputs["sliding_host_request_types"].tolist() == [0] * bs
            new = inputs["sliding_host_context_lengths"].tolist()
            assert inputs["sliding_context_lengths"].tolist() == new and sum(new) == len(inputs["input_ids"])
            assert new == [int(c) if t == 0 else K + 1 for c, t in zip(inputs["host_context_lengths"],
                                                                      inputs["host_request_types"])]
            assert inputs["sliding_host_past_key_value_lengths"].tolist() == inputs["sequence_length"].tolist()
    if sess.recurrent:          # three requests on two slots: one slot served two of them (a reused slot)
        assert set(holders) == {0, 1} and max(len(v) for v in holders.values()) == 2
    assert sess.execution.context.executions == len(steps) == rt.step_count


# ------------------------------------------------------------------------------------------------ CUDA graphs
@pytest.mark.parametrize("key,family", [("tiny", "qwen3"), ("tiny-hybrid", "qwen3_5"), ("tiny-muse", "muse_glimmer")])
def test_graphed_generation_steps_give_the_eager_sessions_tokens(tiny_engines, key, family):
    """``cuda_graphs`` on the project runtime, simulated on the stand-in: a capture keeps the bound addresses and the
    host values its enqueue read (host_past_key_value_lengths set to the rounded length, as TensorRT-LLM's executor
    sets it), a replay executes on those addresses with those host values. Greedy and sampled, in-flight batched:
    the eager session's tokens, with most generation steps replayed."""
    engine_dir = tiny_engines(key)
    prompts = shipped_prompts(trained_pair(family), 6)
    for temperature in (0.0, 0.8):
        runs = []
        for graphed in (False, True):
            sess = _session(engine_dir, simulate_graphs=graphed)
            reqs = [Request(list(p), 16, seed=i, temperature=temperature, stop_token_ids=(2,), task_id=i)
                    for i, p in enumerate(prompts)]
            rt = Runtime(sess, max_batch_size=3)
            rt.generate(reqs)
            runs.append(([r.output_ids for r in reqs], [r.acceptance_lengths for r in reqs]))
            if graphed:
                st = sess.graphs.report()
                assert st["replayed"] + st["captured"] + st["eager"] == rt.step_count and st["failed"] == [], st
                assert st["captured"] >= 1 and st["replayed"] >= 5, st
            sess.close()
        assert runs[1] == runs[0], temperature


def test_a_graph_replays_the_host_values_of_its_capture(tiny_engines, monkeypatch):
    """Negative control: a graph keeps the host values its capture read. Captured WITHOUT the executor's rounded
    host_past_key_value_lengths, a graph replayed for a later step of its key sizes the attention from the capture's
    shorter lengths, which the stand-in refuses (the real plugin would drop keys)."""
    from dflash2_trt.engine.trtllm import session_graphs

    engine_dir = tiny_engines("tiny")
    prompts = shipped_prompts(trained_pair("qwen3"), 3)
    monkeypatch.setattr(session_graphs, "size_for_capture", lambda bound, past: None)
    sess = _session(engine_dir, simulate_graphs=True)
    try:
        with pytest.raises(ValueError, match="host_past_key_value_lengths gives them"):
            Runtime(sess, max_batch_size=3).generate([Request(list(p), 16, task_id=i) for i, p in enumerate(prompts)])
        assert sess.graphs.stats["replayed"] == 1
    finally:
        sess.close()


def _staggered(engine_dir, prompts, granule=None, **kw):
    """One request generating alone for 6 steps, then two more joining (batch 3), then the first alone again."""
    sess = _session(engine_dir, **kw)
    if granule is not None:
        sess.graphs.granule = granule
    reqs = [Request(list(p), n, seed=i, task_id=i) for i, (p, n) in enumerate(zip(prompts, (40, 6, 6)))]
    rt = Runtime(sess, max_batch_size=3)
    rt.submit(reqs[0])
    for _ in range(6):
        rt.step()
    rt.submit(reqs[1])
    rt.submit(reqs[2])
    while rt.has_work:
        rt.step()
    out = ([r.output_ids for r in reqs], [r.acceptance_lengths for r in reqs], sess.graphs)
    sess.close()
    return out


def test_graphs_cross_rounding_boundaries(tiny_engines):
    """A small rounding granule (8 tokens for the executor's 256): a request's length passes several rounding steps,
    each a key of its own captured with its rounded length; the replays see every key (else the stand-in refuses,
    as in the control above) and give the eager session's tokens."""
    engine_dir = tiny_engines("tiny-hybrid")
    prompts = shipped_prompts(trained_pair("qwen3_5"), 3)
    want = _staggered(engine_dir, prompts)
    got = _staggered(engine_dir, prompts, granule=8, simulate_graphs=True)
    assert got[:2] == want[:2]
    assert got[2].stats["captured"] >= 4 and got[2].stats["replayed"] >= 3, got[2].stats


def test_a_graph_whose_buffer_moved_is_dropped(tiny_engines):
    """A graph captured at batch 1, then the outputs' buffers grow (two requests join: batch 3), then batch 1 again
    with the same key: the graph is dropped and captured again, not launched on freed memory."""
    engine_dir = tiny_engines("tiny-hybrid")
    prompts = shipped_prompts(trained_pair("qwen3_5"), 3)
    want = _staggered(engine_dir, prompts)
    got = _staggered(engine_dir, prompts, simulate_graphs=True)
    assert got[:2] == want[:2]
    assert got[2].dropped >= 1 and got[2].stats["replayed"] >= 5, (got[2].dropped, got[2].stats)


def test_cuda_graphs_on_the_session_are_refused_where_they_cannot_apply(tiny_engines):
    engine_dir = tiny_engines("tiny")
    with pytest.raises(ConfigError, match="need the session on a GPU; it runs on cpu"):
        _session(engine_dir, cuda_graphs=True)


# ------------------------------------------------------------------------------------------------ opening
def test_an_engine_that_does_not_open_names_the_tensorrt_that_built_it(standin_trt_engine, tmp_path, monkeypatch):
    """TensorRT deserializes an engine only on the release that built it. When it cannot, the one line says which
    TensorRT engine.json records and which is loaded, where they differ (TensorRT's own log line is easy to miss among a
    server's); where they agree, or either is unknown, the line stays TensorRT's general one."""
    import shutil
    import types

    from dflash2_trt.engine.trtllm.session import EngineOpenError, open_trt_session, tensorrt_mismatch

    assert tensorrt_mismatch("10.13.3.9", "10.13.3.9") is None and tensorrt_mismatch(None, "10.11.0") is None
    assert tensorrt_mismatch("10.13.3", "10.13.3.post1") is None and tensorrt_mismatch("10.13.3", None) is None
    assert "TensorRT 10.13.3" in tensorrt_mismatch("10.13.3", "10.11.0.33")
    d = tmp_path / "engine"
    shutil.copytree(standin_trt_engine[0], d)
    blob = d / "rank0.engine"
    blob.write_bytes(b"x" * blob.stat().st_size)                  # not an engine this TensorRT can read
    man = json.loads((d / "engine.json").read_text())
    man.setdefault("versions", {})["tensorrt"] = "10.13.3.9"
    (d / "engine.json").write_text(json.dumps(man))
    other = types.SimpleNamespace(**{k: getattr(trt, k) for k in dir(trt) if not k.startswith("__")},
                                  __version__="10.11.0.33")
    with pytest.raises(EngineOpenError) as e:
        open_trt_session(d, trt=other, device="cpu", load_plugins=False)
    msg = str(e.value)
    assert msg.startswith(f"{blob}: TensorRT could not deserialize the engine") and "\n" not in msg, msg
    assert "built with TensorRT 10.13.3.9 (engine.json versions.tensorrt) and TensorRT 10.11.0.33 is loaded" in msg
    same = types.SimpleNamespace(**vars(other))
    same.__version__ = "10.13.3.9"
    with pytest.raises(EngineOpenError) as e:
        open_trt_session(d, trt=same, device="cpu", load_plugins=False)
    assert "built with" not in str(e.value) and str(e.value).startswith(f"{blob}: TensorRT could not deserialize"), \
        str(e.value)
    # an engine built for another GPU architecture (an H200's on a B200): named the same way
    man["gpu"] = {"name": "NVIDIA H200", "sm": "sm_90a"}
    (d / "engine.json").write_text(json.dumps(man))
    monkeypatch.setattr(sessmod, "current_gpu_sm", lambda: "sm_100a")
    with pytest.raises(EngineOpenError) as e:
        open_trt_session(d, trt=other, device="cpu", load_plugins=False)
    assert "TensorRT 10.11.0.33 is loaded here" in str(e.value), str(e.value)
    assert "the engine was built on sm_90a (engine.json gpu.sm) and this GPU is sm_100a" in str(e.value)
    assert sessmod.gpu_mismatch("sm_90a", "sm_90a") is None and sessmod.gpu_mismatch(None, "sm_90a") is None
