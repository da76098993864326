"""The network's declared inputs and marked outputs are exactly the contract of engine_io.yaml."""

from __future__ import annotations

import json
from collections import OrderedDict

import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.trtllm.backend import load_network
from dflash2_trt.trtllm.engine_io import concrete_shape, load_contract


def _flatten(inputs: dict) -> dict:
    """name -> InputDecl of every declared input (the stand-in's own collector: top level, parameter dataclasses,
    per-layer dicts)."""
    from dflash2_trt.trtllm.cpu.modeling_utils import declared_inputs

    return {d.name: d for d in declared_inputs(inputs)}


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    from dflash2_trt.engine.build import build_engine

    p = trained_pair("qwen3")
    out = tmp_path_factory.mktemp("io") / "eng"
    build_engine(p.drafter_dir, p.target_dir, out, target_key="tiny", overrides={"block_size": 4})
    return out


@pytest.fixture(scope="module")
def built(engine_dir):
    from dflash2_trt.engine.standin.engine import open_standin_engine

    eng, _ = open_standin_engine(engine_dir)
    yield eng
    eng.close()


def test_prepare_inputs_declares_exactly_the_contract(built):
    model = built.models[0]
    K = built.K
    decl = _flatten(model.prepare_inputs(max_batch_size=4, max_num_tokens=256, max_seq_len=512, max_blocks_per_seq=16))
    contract = {p.name: p for p in load_contract()["inputs"] if p.applies(tp_size=1)}
    assert sorted(decl) == sorted(contract)
    for name, d in decl.items():
        c = contract[name]
        assert d.dtype == c.dtype, name
        assert d.shape == concrete_shape(c.shape, K=K, NL=built.num_layers), name
        assert len(d.dim_range) == len(d.shape), name


def test_forward_takes_the_declared_inputs(built):
    import inspect

    net = load_network("cpu")
    sig = inspect.signature(net.DFlash2ForCausalLM.forward).parameters
    params = list(sig)[1:]
    decl = built.models[0].prepare_inputs(max_batch_size=4, max_num_tokens=256, max_seq_len=512, max_blocks_per_seq=16)
    assert params[:len(decl)] == list(decl)
    # what a dense target does not declare (the recurrent state of hybrid targets) must be optional
    assert all(sig[p].default is None for p in params[len(decl):]), params[len(decl):]


def test_one_step_marks_exactly_the_contract_outputs(built):
    from dflash2_trt.runtime import Request, Runtime

    rt = Runtime(built)
    seen = {}
    orig = built.step

    def spy(inputs):
        out = orig(inputs)
        seen.setdefault("inputs", inputs)
        seen["last_inputs"], seen["out"] = inputs, out
        return out

    built.step = spy
    try:
        rt.generate([Request([5, 6, 7, 8, 9], 6), Request([3, 4], 6)])
    finally:
        built.step = orig
    out, K, V = seen["out"], built.K, built.vocab_size
    contract = {p.name: p for p in load_contract()["outputs"]}
    assert list(out) == list(contract)
    bs = out["num_accepted_tokens"].shape[0]
    dt = {"int32": torch.int32, "float32": torch.float32}
    for name, c in contract.items():
        assert out[name].dtype == dt[c.dtype], name
        nlog = seen["last_inputs"]["last_token_ids"].shape[0]
        want = [nlog if s == "NLOG" else bs if s == "bs" else V if s == "V" else {"K": K, "K+1": K + 1}[s]
                for s in c.shape]
        assert list(out[name].shape) == want, name
    assert torch.equal(out["next_draft_lens"], torch.full((bs,), K, dtype=torch.int32))
    assert torch.equal(out["accepted_paths"], torch.zeros(bs, dtype=torch.int32))
    assert out["next_draft_paths"][0, 0].tolist() == list(range(K + 1))
    assert (out["next_draft_paths"][:, 1:] == -1).all()
    # the runtime's inputs carry every contract input that the runtime fills each step
    static = set(built.static_inputs(0))
    filled = set(seen["inputs"]) | static
    assert {p.name for p in load_contract()["inputs"] if p.applies(tp_size=1)} == filled


def test_tensor_parallel_declares_the_all_reduce_workspace(built):
    """tp > 1: prepare_inputs declares all_reduce_workspace as TensorRT-LLM's own models do (set_workspace_tensor),
    with the contract's dtype and shape; tp 1 does not. (The harness holds the TensorRT-LLM side:
    tests/trtllm/test_conformance.py.)"""
    import copy

    from dflash2_trt.trtllm.cpu.mapping import Mapping

    declare_inputs = load_network("cpu").io.declare_inputs
    model = built.models[0]
    contract = {p.name: p for p in load_contract()["inputs"]}
    tp_only = sorted(n for n, p in contract.items() if not p.applies(tp_size=1, sliding_context=True))
    assert tp_only == ["all_reduce_workspace"]
    one = _flatten(declare_inputs(model.config, built.K, False, 4, 256, 512, 16))
    cfg = copy.copy(model.config)
    cfg.mapping = Mapping(world_size=2, rank=1, tp_size=2)
    two = _flatten(declare_inputs(cfg, built.K, False, 4, 256, 512, 16))
    assert sorted(set(two) - set(one)) == tp_only and set(one) <= set(two)
    ws, c = two["all_reduce_workspace"], contract["all_reduce_workspace"]
    assert ws.dtype == c.dtype == "int64"
    assert ws.shape == concrete_shape(c.shape, K=built.K, NL=built.num_layers, tp_size=2) == (17,)
    # one range per optimization profile, as many as the other inputs have
    assert list(ws.dim_range) == ["all_reduce_size"]
    assert len(ws.dim_range["all_reduce_size"]) == len(two["input_ids"].dim_range["num_tokens"])


def test_engine_config_fields_documented():
    cfg = load_contract()["engine_config"]
    assert cfg["speculative_decoding_mode"] == 32
    assert cfg["max_non_leaves_per_layer"] == 1
    assert cfg["architecture"] == "DFlash2ForCausalLM"
    assert json.dumps(cfg)


def test_every_host_input_of_the_attention_plugin_is_a_runtime_filled_host_input():
    """The GPTAttention plugin reads its host inputs on the host (api_1_2.yaml gpt_attention_plugin_inputs): each one
    the network passes must be an engine input in host memory that the runtime fills, with the runtime buffer named
    (engine_io.yaml host_inputs_filled_by), and the draft calls' request types too."""
    import yaml

    from dflash2_trt.trtllm.cpu.attention import _plugin_facts
    from dflash2_trt.trtllm.engine_io import CONTRACT

    data = yaml.safe_load(CONTRACT.read_text(encoding="utf-8"))
    contract = {p.name: p for p in load_contract()["inputs"]}
    host = [e["name"] for e in _plugin_facts()["inputs"] if e["memory"] == "host"]
    assert len(host) >= 10
    for name in host + ["host_gen_eagle_net_request_types"]:
        assert contract[name].memory == "host" and contract[name].filled_by == "runtime", name
        assert data["host_inputs_filled_by"][name].startswith(("[V]", "[I]")), name
    assert set(data["host_inputs_filled_by"]) <= set(contract)


def test_the_inputs_make_one_optimization_profile_with_dynamic_batch_and_tokens(built):
    """functional.Tensor reads a dim_range value as one entry per optimization profile ([min, opt, max] for a
    dynamic dimension, the size for a static one): every input declares ONE profile (TensorRT-LLM's own models,
    without multiple_profiles), the batch / token / block dimensions range from their minimum to the build's
    maximum, and the inputs agree on every dimension name (Network._generate_optimization_profiles and the
    builder's named-dimension check). A flat [1, mid, max] made three profiles of fixed sizes: a step of any other
    size fell outside every profile."""
    import copy

    from dflash2_trt.trtllm.cpu.mapping import Mapping
    from dflash2_trt.trtllm.cpu.modeling_utils import check_profiles

    declare_inputs = load_network("cpu").io.declare_inputs
    model = built.models[0]
    for tp, recurrent in ((1, False), (2, False), (1, True)):
        cfg = copy.copy(model.config)
        cfg.mapping = Mapping(world_size=tp, rank=0, tp_size=tp)
        if recurrent:
            cfg.layer_types = ["linear_attention"] + list(cfg.layer_types)[1:]
        decl = _flatten(declare_inputs(cfg, built.K, recurrent, 4, 256, 512, 16))   # recurrent pointers included
        assert len(decl) >= 25
        assert recurrent == any(n.startswith("rnn_state_ptr_") for n in decl)
        assert check_profiles(decl.values()) == 1
        ranges = {n: dict(zip(d.dim_range, d.profiles[0])) for n, d in decl.items()}
        assert ranges["input_ids"]["num_tokens"] == (1, 128, 256)
        assert ranges["sequence_length"]["batch_size"] == (1, 2, 4)
        assert ranges["kv_cache_block_offsets"]["max_blocks_per_seq"] == (1, 8, 16)
        assert ranges["spec_decoding_generation_lengths"]["gen_batch_size"] == (0, 2, 4)
        for n, d in decl.items():   # every -1 axis is a dimension the runtime sizes: some range, or a fixed 1 (beam)
            for axis, (dim, (lo, opt, hi)) in enumerate(zip(d.dim_range, d.profiles[0])):
                if d.shape[axis] != -1:
                    assert lo == opt == hi == d.shape[axis], (n, dim)


@pytest.mark.parametrize("dim_range,why", [
    ({"batch_size": [[1, 2, 4]]}, "OrderedDict"),
    (OrderedDict(batch_size=[1, 2, 4], kv=[2]), "same number"),
    (OrderedDict(batch_size=[[4, 2, 1]], kv=[2]), "min, opt, max"),
    (OrderedDict(batch_size=[[1, 2]], kv=[2]), "min, opt, max"),
    (OrderedDict(batch_size=[[1, 2, 4]], kv=[3]), "fixed at 2"),
    (OrderedDict(batch_size=[[1, 2, 4]]), "named dimensions"),
    (OrderedDict(batch_size=[[1, 2, 4]], kv=2), "per-profile entries"),
])
def test_the_stand_in_reads_dim_range_as_tensorrt_llm_does(dim_range, why):
    from dflash2_trt.trtllm.cpu.modeling_utils import input_tensor

    ok = input_tensor("x", "int32", [-1, 2], OrderedDict(batch_size=[[1, 2, 4]], kv=[2]))
    assert ok.profiles == [[(1, 2, 4), (2, 2, 2)]]
    with pytest.raises((TypeError, ValueError), match=why):
        input_tensor("x", "int32", [-1, 2], dim_range)


def test_a_cpu_engine_does_not_open_with_a_declaration_tensorrt_llm_would_refuse(engine_dir, monkeypatch):
    """Opening a CPU engine runs the network's input declaration through TensorRT-LLM's dim_range and profile
    rules, as trtllm-build's first step does: the old flat [1, mid, max] ranges (three profiles beside inputs
    with one) stop it; the real declaration opens."""
    from dflash2_trt.engine.standin.engine import open_standin_engine

    net = load_network("cpu")
    real = net.combined.declare_inputs

    def old_style(*a, **k):
        decl = real(*a, **k)
        ids = decl["input_ids"]
        decl["input_ids"] = net.api.input_tensor(ids.name, ids.dtype, ids.shape, OrderedDict(num_tokens=[1, 8, 16]))
        return decl

    monkeypatch.setattr(net.combined, "declare_inputs", old_style)
    with pytest.raises(ValueError, match="numbers of optimization profiles"):
        open_standin_engine(engine_dir)
    monkeypatch.setattr(net.combined, "declare_inputs", real)
    eng, _ = open_standin_engine(engine_dir)
    eng.close()


def test_the_runtime_feeds_the_host_values_tensorrt_llm_writes(built):
    """Host inputs whose values TensorRT-LLM's runtime sets itself (engine_io.yaml host_input_values, read in its
    batch manager and EAGLE kernels): the CPU runtime feeds the same value in every entry at every step, context
    and generation steps alike."""
    import yaml

    from dflash2_trt.runtime import Request
    from dflash2_trt.testing.engines import run_with_step_spy
    from dflash2_trt.trtllm.engine_io import CONTRACT

    values = yaml.safe_load(CONTRACT.read_text(encoding="utf-8"))["host_input_values"]
    assert set(values) == {"host_gen_eagle_net_request_types", "spec_decoding_use"}
    steps = []
    run_with_step_spy(built, [Request([5, 6, 7, 8, 9], 6), Request([3, 4], 6)],
                      lambda f: steps.append({k: f[k].clone() for k in values}))
    assert len(steps) >= 3
    for name, fact in values.items():
        for s in steps:
            assert s[name].numel() > 0 and (s[name] == fact["every_entry"]).all(), (name, s[name])


def test_the_engine_decodes_a_temperature_below_1e_5_greedily(built):
    """TensorRT-LLM's runtime copies the request's temperature into eagle_temperature unchanged, and greedy reaches
    the engine as a small positive temperature (0 is refused by its EAGLE layer: engine_io.yaml
    request_temperature). So the engine itself reads anything below GREEDY_BELOW as greedy; sampled as is, 1e-45
    divided the logits into inf (a NaN softmax, token 0 forever). Fed straight into the engine here, bypassing the
    CPU runtime's own mapping."""
    from dflash2_trt.runtime import Request
    from dflash2_trt.sampling import GREEDY_BELOW
    from dflash2_trt.testing.engines import run_with_step_spy

    def run(t):
        done = run_with_step_spy(built, [Request([5, 6, 7, 8, 9], 12, seed=3), Request([3, 4], 12, seed=4)],
                                 lambda f: dict(f, eagle_temperature=torch.full_like(f["eagle_temperature"], t)))
        return [r.output_ids for r in done]

    greedy = run(0.0)
    assert all(len(set(o)) > 3 for o in greedy)
    for t in (1e-45, 1e-38, 1e-6, 9.9e-6):
        assert run(t) == greedy, t
    assert GREEDY_BELOW == pytest.approx(1e-5)


def test_decoding_temperature_is_zero_below_the_greedy_threshold():
    from dflash2_trt.sampling import GREEDY_BELOW
    from dflash2_trt.trtllm.cpu.tensor import network_input

    net = load_network("cpu")
    t = torch.tensor([0.0, 1e-45, 1e-6, 9.9e-6, GREEDY_BELOW, 0.7, 2.0], dtype=torch.float32)
    out = net.accept.decoding_temperature(network_input(t, "eagle_temperature", "device"))
    assert torch.equal(torch.as_tensor(out), torch.tensor([0, 0, 0, 0, GREEDY_BELOW, 0.7, 2.0], dtype=torch.float32))


def test_recurrent_state_contract_is_the_plugins_slot():
    """engine_io.yaml recurrent_state: its layout is gdn_slot's (the plugin's, checked in tests/plugins), in offset
    order, E is the config's state_size - Dk, and the test it names exists."""
    from pathlib import Path

    import yaml

    from dflash2_trt.trtllm.engine_io import CONTRACT
    from dflash2_trt.trtllm.gdn_slot import gdn_slot_layout

    rs = yaml.safe_load(CONTRACT.read_text())["recurrent_state"]
    lay = gdn_slot_layout(16, 48, 128, 128, 8)
    parts = [p["part"] for p in rs["layout"]]
    assert parts == sorted(parts, key=lambda p: getattr(lay, p)) == ["state", "pending", "delta", "keys", "decay"]
    assert rs["rnn_pool_row"]["config"]["state_size"] == "Dk + E" and lay.state_size == 128 + 11
    assert set(rs["cases"]) == {"zero_state", "context_after_generation", "zero_accepted",
                                "request_ends_with_records_pending", "commit_must_run_after_every_forward"}
    path, name = rs["tested_by"].split("::")
    assert f"def {name}(" in (Path(__file__).resolve().parents[2] / path).read_text()
