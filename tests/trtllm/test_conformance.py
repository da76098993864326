"""The conformance harness (scripts/trtllm_conformance.py): its own pieces (the fake tensorrt module made from
TensorRT-RTX, the plugin placeholders' contract checks) run everywhere TensorRT-RTX is installed; the end-to-end
run over TensorRT-LLM's real sources needs them in $DFLASH2_TRTLLM_SRC (DIR/tensorrt_llm/functional.py ...) and
skips otherwise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
rtx = pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX (tensorrt-rtx-cu12/cu13) is not installed")
sys.path.insert(0, str(REPO / "scripts"))
from trtllm_conformance_lib import fake_trt  # noqa: E402
from trtllm_conformance_lib.fake_trt import ContractError  # noqa: E402

TRT = fake_trt.make_module()


def _net():
    builder = rtx.Builder(rtx.Logger(rtx.Logger.ERROR))
    real = builder.create_network(1 << int(rtx.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    return builder, real, TRT.INetworkDefinition(real)


def _plugin(name, fields, namespace="tensorrt_llm", version="1"):
    creator = TRT.get_plugin_registry().get_plugin_creator(name, version, namespace)
    assert creator is not None, name
    pfc = TRT.PluginFieldCollection([TRT.PluginField(k, np.array(v), None) for k, v in fields.items()])
    return creator.create_plugin(name.lower(), pfc)


def _build(builder, real, profile_inputs):
    cfg = builder.create_builder_config()
    prof = builder.create_optimization_profile()
    for name, (lo, opt, hi) in profile_inputs.items():
        prof.set_shape(name, lo, opt, hi)
    cfg.add_optimization_profile(prof)
    return builder.build_serialized_network(real, cfg)


def test_fake_module_is_rtx_plus_placeholders():
    assert TRT.IS_PLACEHOLDER_TENSORRT and TRT.DataType is rtx.DataType and TRT.Weights is rtx.Weights
    reg = TRT.get_plugin_registry()
    assert reg.get_plugin_creator("GPTAttention", "1", "tensorrt_llm") is not None
    assert reg.get_plugin_creator("NoSuchPlugin", "1", "tensorrt_llm") is None   # unknown plugins: no creator
    assert reg.get_creator("DFlash2PairwiseScan", "1", "dflash2") is not None


def test_plugin_fields_keep_their_data():
    # TensorRT-RTX's own PluginField does not keep a temporary array alive (fields read freed memory); the fake one
    # owns a copy, as TensorRT's binding keeps the array alive
    pfc = TRT.PluginFieldCollection([TRT.PluginField(f"f{i}", np.array([i * 7], np.int32), None) for i in range(4)])
    p = TRT.get_plugin_registry().get_plugin_creator("Gemm", "1", "tensorrt_llm").create_plugin("g", pfc)
    assert [p.field(f"f{i}") for i in range(4)] == [0, 7, 14, 21]


def test_gemm_placeholder_checks_dtypes_and_builds():
    builder, real, net = _net()
    x = net.add_input("x", rtx.float32, (-1, 8))
    w = net.const(np.zeros((4, 8), np.float32))
    fields = {"transa": np.array(0, np.int32), "transb": np.array(1, np.int32),
              "type_id": np.array([int(rtx.float32)], np.int32)}
    layer = net.add_plugin_v2([x, w], _plugin("Gemm", fields))
    out = layer.get_output(0)
    assert out.dtype == rtx.float32 and tuple(out.shape) == (-1, 4)
    real.mark_output(out)
    assert _build(builder, real, {"x": ((1, 8), (2, 8), (4, 8))}) is not None
    # a wrong-dtype input is refused, naming the input and the rule
    _, _, net2 = _net()
    x2 = net2.add_input("x", rtx.int32, (-1, 8))
    with pytest.raises(ContractError, match="input 'input' has dtype int32, the plugin requires float32"):
        net2.add_plugin_v2([x2, net2.const(np.zeros((4, 8), np.float32))], _plugin("Gemm", fields))


def _gpt_fields(rope: bool, spec: bool = False):
    return {"use_cache": np.array([1], np.int32), "paged_kv_cache": np.array(1, np.int32),
            "remove_input_padding": np.array(1, np.int8), "is_spec_decoding_enabled": np.array(int(spec), np.int8),
            "position_embedding_type": np.array(2 if rope else 0, np.int8), "num_heads": np.array(2, np.int32),
            "num_kv_heads": np.array(1, np.int32), "head_size": np.array(4, np.int32),
            "type_id": np.array([int(rtx.float32)], np.int32), "layer_idx": np.array([3], np.int32)}


def _gpt_inputs(net, rope: bool, computed_host=None):
    c = fake_trt.gpt_attention_contract()
    flags = {"rope": rope}
    ins = []
    for e in c["inputs"]:
        if e.get("when") == "rope" and not flags["rope"]:
            continue
        if e.get("when") == "is_spec_decoding_enabled":
            continue
        dt = rtx.float32 if e["dtype"] == "plugin" else fake_trt._DT[e["dtype"]]
        rank = e.get("rank", e.get("rank_doc", 1))
        shape = (-1, 16) if e["name"] == "qkv" else tuple([2] * rank)
        if e["name"] == computed_host:
            t = net.add_input("src_" + e["name"], dt, shape)
            t = real_identity(net, t)
        else:
            t = net.add_input(e["name"], dt, shape)
        ins.append(t)
    return ins


def real_identity(net, t):
    return net.real.add_identity(t).get_output(0)


def test_gpt_attention_placeholder_contract():
    builder, real, net = _net()
    ins = _gpt_inputs(net, rope=True)
    layer = net.add_plugin_v2(ins, _plugin("GPTAttention", _gpt_fields(rope=True)))
    assert tuple(layer.get_output(0).shape) == (-1, 8)   # [num_tokens, num_heads * head_size]
    # the report's gpt_attention_bindings: the call's layer_idx and, per contract entry, the network input bound there
    (b,) = net.gpt_attention_bindings
    assert b["layer_idx"] == 3 and b["inputs"]["host_request_types"] == "host_request_types"
    assert list(b["inputs"]) == [e["name"] for e in fake_trt.gpt_attention_expected(layer.plugin)]
    # a RoPE layer without the rotary tables: the plugin numbers 17 inputs from its fields (no spec decoding), got 15
    _, _, net2 = _net()
    with pytest.raises(ContractError, match=r"numbers 17 inputs .* got 15"):
        net2.add_plugin_v2(_gpt_inputs(net2, rope=False), _plugin("GPTAttention", _gpt_fields(rope=True)))
    # a host input computed in the graph (device memory) is refused
    _, _, net3 = _net()
    with pytest.raises(ContractError, match="'host_max_attention_window_sizes' is read on the host"):
        net3.add_plugin_v2(_gpt_inputs(net3, rope=False, computed_host="host_max_attention_window_sizes"),
                           _plugin("GPTAttention", _gpt_fields(rope=False)))


def test_allgather_placeholder_multiplies_dim0_by_group():
    builder, real, net = _net()
    x = net.add_input("x", rtx.float32, (-1, 6))
    fields = {"group": np.array([0, 1], np.int32), "type_id": np.array([int(rtx.float32)], np.int32)}
    out = net.add_plugin_v2([x], _plugin("AllGather", fields)).get_output(0)
    real.mark_output(out)
    assert tuple(out.shape) == (-1, 6)
    assert _build(builder, real, {"x": ((1, 6), (2, 6), (3, 6))}) is not None
    _, _, net2 = _net()
    with pytest.raises(ContractError, match="AllGather: input 'input' has dtype float16"):
        net2.add_plugin_v2([net2.add_input("x", rtx.float16, (-1, 6))], _plugin("AllGather", fields))


def _conv_plugin_network():
    """The dynamic conv's placeholder plugin (its YAML spec's fields) and a network with its three inputs:
    (plugin, real network, placeholder network, [x, delta, base])."""
    from dflash2_trt.plugins import trt_field_collection

    sys.modules["tensorrt"] = TRT   # dflash2_trt.plugins imports tensorrt lazily
    try:
        pfc = trt_field_collection("DFlash2DynamicConv", block_size=8, kernel_size=2, group_size=16, fuse_residual=0)
    finally:
        del sys.modules["tensorrt"]
    plugin = TRT.get_plugin_registry().get_creator("DFlash2DynamicConv", "1", "dflash2").create_plugin("c", pfc)
    _, real, net = _net()
    inputs = [net.add_input("x", rtx.float32, (-1, 64)), net.add_input("delta", rtx.float32, (-1, 2, 4)),
              net.const(np.zeros((2, 64), np.float32))]
    return plugin, real, net, inputs


def test_dflash2_placeholder_from_yaml_spec():
    plugin, _, net, inputs = _conv_plugin_network()
    out = net.add_plugin_v3(inputs, [], plugin).get_output(0)
    assert tuple(out.shape) == (-1, 64) and out.dtype == rtx.float32
    _, _, net2 = _net()
    with pytest.raises(ContractError, match="input 'delta' has dtype float16"):
        net2.add_plugin_v3([net2.add_input("x", rtx.float32, (-1, 64)), net2.add_input("d", rtx.float16, (-1, 2, 4)),
                            net2.const(np.zeros((2, 64), np.float32))], [], plugin)
    _, _, net3 = _net()
    with pytest.raises(ContractError, match="dim 1 is 3, the spec says kernel_size = 2"):
        net3.add_plugin_v3([net3.add_input("x", rtx.float32, (-1, 64)), net3.add_input("d", rtx.float32, (-1, 3, 4)),
                            net3.const(np.zeros((2, 64), np.float32))], [], plugin)


def test_dead_plugins_are_the_calls_no_output_depends_on():
    """TensorRT removes a layer no network output depends on (a plugin called for what it writes, the Gated DeltaNet
    commit, included): the harness names such calls. Three conv calls: the first feeding the marked output through an
    ordinary layer, the second feeding nothing, the third read only for its shape; then the second marked too."""
    plugin, real, net, inputs = _conv_plugin_network()
    live, dead, shape_only = (net.add_plugin_v3(inputs, [], plugin).get_output(0) for _ in range(3))
    out = real.add_unary(live, rtx.UnaryOperation.ABS).get_output(0)
    real.mark_output(out)
    real.mark_output(real.add_shape(shape_only).get_output(0))      # only its dimensions are read
    assert fake_trt.dead_plugins(net) == ["DFlash2DynamicConv #1", "DFlash2DynamicConv #2"]
    real.mark_output(dead)
    assert fake_trt.dead_plugins(net) == ["DFlash2DynamicConv #2"]


def _kernel_inputs(form: str) -> set:
    """Build an RTX network whose marked output is a count (z + z) made to depend on a side layer (exp of x, or its
    int32 cast) the way network/common.py keep_alive does (``"max"``: a maximum with the float's first element
    compared with itself, or the int's first element capped at 1), or the way it did before (``"times_zero"``: that
    comparison, cast, times a constant 0, added); return the names of the tensors the built engine's kernels read
    (its layer information)."""
    class Log(rtx.ILogger):
        def __init__(self):
            super().__init__()
            self.lines = []

        def log(self, severity, msg):
            self.lines.append(msg)

    log = Log()
    builder = rtx.Builder(log)
    net = builder.create_network(1 << int(rtx.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    x = net.add_input("x", rtx.float32, (-1, 8))
    z = net.add_input("z", rtx.int32, (-1,))
    count = net.add_elementwise(z, z, rtx.ElementWiseOperation.SUM).get_output(0)
    side = net.add_unary(x, rtx.UnaryOperation.EXP).get_output(0)
    if form == "max int":
        side = net.add_cast(side, rtx.int32).get_output(0)
    flat = net.add_shuffle(side)
    flat.reshape_dims = (-1,)
    first = net.add_slice(flat.get_output(0), start=(0,), shape=(1,), stride=(1,)).get_output(0)
    E = rtx.ElementWiseOperation
    if form == "max int":
        one = net.add_constant((1,), rtx.Weights(np.ones(1, np.int32))).get_output(0)
        out = net.add_elementwise(count, net.add_elementwise(first, one, E.MIN).get_output(0), E.MAX).get_output(0)
    else:
        same = net.add_cast(net.add_elementwise(first, first, E.EQUAL).get_output(0), rtx.int32).get_output(0)
        if form == "max float":
            out = net.add_elementwise(count, same, E.MAX).get_output(0)
        else:
            zero = net.add_constant((1,), rtx.Weights(np.zeros(1, np.int32))).get_output(0)
            out = net.add_elementwise(count, net.add_elementwise(same, zero, E.PROD).get_output(0), E.SUM).get_output(0)
    net.mark_output(out)
    cfg = builder.create_builder_config()
    cfg.profiling_verbosity = rtx.ProfilingVerbosity.DETAILED
    prof = builder.create_optimization_profile()
    prof.set_shape("x", (1, 8), (4, 8), (16, 8))
    prof.set_shape("z", (1,), (4,), (16,))
    cfg.add_optimization_profile(prof)
    assert builder.build_serialized_network(net, cfg) is not None
    info = [line for line in log.lines if line.startswith("Layers:")]
    if not info:
        pytest.skip("this TensorRT-RTX logs no engine layer information")
    kernels = info[-1].split("I/O Tensors:")[0]
    reads = set()
    for part in kernels.split("Inputs: [")[1:]:
        reads.update(re.findall(r"\{ Name: ([^,]+),", part.split("], Constants")[0]))
    return reads


@pytest.mark.parametrize("form", ["max float", "max int"])
def test_keep_alive_keeps_the_side_layer_in_the_built_engine(form):
    """The Gated DeltaNet commits and the drafter's K/V writes exist for what they write; keep_alive makes
    num_accepted_tokens depend on them. Built by TensorRT-RTX (the closest TensorRT here), a layer reached only that
    way is computed: a kernel of the engine reads its input. Control: the form keep_alive had before (a product with 0,
    added) leaves no kernel reading it: Myelin folds the product and the layers behind it. A real plugin cannot be
    placed in an RTX network (no plugin layers), so the plugin's own survival is read, not built."""
    assert _kernel_inputs(form) == {"x", "z"}
    assert _kernel_inputs("times_zero") == {"z"}


SRC = os.environ.get("DFLASH2_TRTLLM_SRC")
needs_src = pytest.mark.skipif(not SRC or not (Path(SRC) / "tensorrt_llm" / "functional.py").is_file(),
                               reason="TensorRT-LLM's Python sources are not in $DFLASH2_TRTLLM_SRC")


@needs_src
@pytest.mark.parametrize("target", ["tiny", "tiny-hybrid", "tiny-muse"])
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("network", ["combined", "baseline"])
def test_networks_define_and_build_over_real_trtllm(target, tp, network):
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "trtllm_conformance.py"), "--trtllm-src", SRC,
                        "--target", target, "--tp", str(tp), "--network", network, "--json", "--quiet"],
                       capture_output=True, text=True, timeout=3000, cwd=REPO)
    reports = json.loads(r.stdout)
    assert len(reports) == 1 and not reports[0].get("error"), reports
    assert reports[0]["network"] == network
    ranks = reports[0]["ranks"]
    assert [x["rank"] for x in ranks] == list(range(tp))
    for x in ranks:
        assert x["defined"], (x["stage"], x["error"], x.get("traceback"))
        assert x["built"] and not x["error"], x["error"]
        assert x["plugin_layers"] > 0 and "GPTAttention" in x["plugins"]
        if tp > 1:
            assert "AllReduce" in x["plugins"]
    assert r.returncode == 0


def test_allreduce_placeholder_applies_the_cpp_plugin_input_rule():
    """allreducePlugin.cpp (trtllm_build_steps.yaml allreduce_workspace): one input for NCCL (0) / UB (2) only; every
    other strategy, NCCL_SYMMETRIC (8) included, takes the int64 network input all_reduce_workspace as input 1."""
    def fields(strategy):
        return {"group": np.array([0, 1], np.int32), "type_id": np.array([int(rtx.float32)], np.int32),
                "strategy": np.array([strategy], np.int8), "fusion_op": np.array([0], np.int8)}

    _, _, net = _net()
    x = net.add_input("x", rtx.float32, (-1, 8))
    net.add_plugin_v2([x], _plugin("AllReduce", fields(0)))
    with pytest.raises(ContractError, match="strategy 8 takes 2 input"):
        net.add_plugin_v2([x], _plugin("AllReduce", fields(8)))
    ws = net.add_input("all_reduce_workspace", rtx.int64, (17,))
    net.add_plugin_v2([x, ws], _plugin("AllReduce", fields(3)))
    assert net.allreduce_strategies == [0, 3]
    other = net.add_input("other", rtx.int64, (17,))
    with pytest.raises(ContractError, match="must be the network input all_reduce_workspace"):
        net.add_plugin_v2([x, other], _plugin("AllReduce", fields(3)))


def test_fuse_attention_with_bias_match_rule():
    """graph_rewriting's FuseAttentionWithBiasPass match, reproduced: qkv = (one user) SUM(mutable, constant) and no
    qkv_bias matches; a bias already in the plugin, a second user, or a non-constant addend does not."""
    from trtllm_conformance_lib import build_steps

    _, real, net = _net()
    x = net.add_input("x", rtx.float32, (4, 8))
    y = net.add_input("y", rtx.float32, (4, 8))
    c = net.const(np.ones((4, 8), np.float32))
    s1 = real.add_elementwise(x, c, rtx.ElementWiseOperation.SUM).get_output(0)      # matches
    s2 = real.add_elementwise(x, y, rtx.ElementWiseOperation.SUM).get_output(0)      # no constant addend
    s3 = real.add_elementwise(x, c, rtx.ElementWiseOperation.PROD).get_output(0)     # not a SUM
    s4 = real.add_elementwise(y, c, rtx.ElementWiseOperation.SUM).get_output(0)      # two users
    for t in (s1, s2, s3, s4, s4):    # one user each, s4 two
        real.add_identity(t)
    net._harness_gpt_attention_qkv[:] = [(s1, False), (s1, True), (s2, False), (s3, False), (s4, False)]
    log = []
    assert build_steps.fuse_attention_with_bias_matches(real, net, log) == 1
    assert log[-1]["fuse_attention_with_bias_matches"] == [0]


@needs_src
def test_define_only_runs_trtllm_builds_steps_and_declares_the_workspace(tmp_path):
    """Define-only over the real sources, every target, tp and network: the report lists exactly
    trtllm_build_steps.yaml's steps in order; the combined network is defined with builder.build's max_seq_len
    (S + K + num_eagle_layers), the baseline (TargetOnlyForCausalLM, mode NONE) with S and no draft length; no graph
    rewrite matches; tp 2 declares all_reduce_workspace (int64 [7 tp + 3]) and its all-reduces keep strategy AUTO
    (3, with the workspace), tp 1 declares none and has no all-reduce. The baseline declares the combined engine's
    input names (target_only.py: its inputs with K = 0, one feed for both) and no selector scan."""
    import yaml

    r = subprocess.run([sys.executable, str(REPO / "scripts" / "trtllm_conformance.py"), "--trtllm-src", SRC,
                        "--target", "all", "--tp", "all", "--json", "--quiet", "--no-build"],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    reports = json.loads(r.stdout)
    steps = [s["id"] for s in yaml.safe_load((REPO / "scripts" / "trtllm_conformance_lib" /
                                              "trtllm_build_steps.yaml").read_text())["steps"]]
    assert len(reports) == 12
    assert sorted((r["target"], r["tp"], r["network"]) for r in reports) == sorted(
        (t, tp, n) for t in ("tiny", "tiny-hybrid", "tiny-muse") for tp in (1, 2) for n in ("combined", "baseline"))
    combined_inputs = {}
    for rep in sorted(reports, key=lambda r: r["network"] != "combined"):
        argv = rep["trtllm_build_argv"]
        baseline = rep["network"] == "baseline"
        S = int(argv[argv.index("--max_seq_len") + 1])
        K = 0 if baseline else int(argv[argv.index("--max_draft_len") + 1])
        assert ("--max_draft_len" in argv, "--speculative_decoding_mode" in argv) == (not baseline, not baseline)
        for x in rep["ranks"]:
            where = (rep["target"], rep["tp"], rep["network"], x["rank"])
            assert x["defined"] and not x["error"], (where, x["stage"], x["error"], x.get("traceback"))
            assert x["model_cls_name"] == ("TargetOnlyForCausalLM" if baseline else "DFlash2ForCausalLM")
            assert x["register_default_is_model_cls"] is True
            assert x["missing_outputs"] == x["extra_outputs"] == [], where   # the outputs engine_io.yaml names
            # every plugin call feeds an output: TensorRT would remove one that does not (the baseline's Gated
            # DeltaNet commits did not until target_only.py kept them alive as the combined engine does)
            assert x["dead_plugins"] == [], (where, x["dead_plugins"])
            assert [s["step"] for s in x["build_steps"]] == steps
            assert x["build_config"]["max_seq_len"] == S + 2 * K   # num_eagle_layers = K in our config
            applied = {s["step"]: s.get("applied") for s in x["build_steps"]}
            assert applied["speculative_max_seq_len"] is applied["eagle_limits"] is (not baseline)
            names = {sig[0] for sig in x["input_signature"]}
            if baseline:
                # target_only.py: the combined engine's inputs with K = 0, so one feed serves both engines
                assert names == combined_inputs[rep["target"], rep["tp"], x["rank"]], where
                assert x["plugins"].get("GPTAttention") and not any("PairwiseScan" in k for k in x["plugins"]), \
                    x["plugins"]
            else:
                combined_inputs[rep["target"], rep["tp"], x["rank"]] = names
                assert x["plugins"].get("DFlash2PairwiseScan") == 1, x["plugins"]   # the key the check above reads
            assert x["graph_rewrites"] == 0
            prof = next(s for s in x["build_steps"] if s["step"] == "add_optimization_profile")
            assert not prof["named_dimension_errors"] and not prof["inputs_with_other_profile_counts"]
            ws = [s for s in x["input_signature"] if s[0] == "all_reduce_workspace"]
            if rep["tp"] > 1:
                assert ws == [["all_reduce_workspace", "INT64", [7 * rep["tp"] + 3]]]
                assert x["allreduce_strategies"] == [3]
            else:
                assert ws == [] and x["allreduce_strategies"] == []
    assert r.returncode == 0


# the context route's second set of request inputs (engine_io.yaml, `when: sliding_path context`), by the plugin input
# entry (gpt_attention_contract.yaml's names) each must reach
ROUTE_SLOTS = {"host_request_types": "sliding_host_request_types", "context_lengths": "sliding_context_lengths",
               "host_context_lengths": "sliding_host_context_lengths",
               "host_past_key_value_lengths": "sliding_host_past_key_value_lengths"}
TINY_FAMILY = {"tiny": "qwen3", "tiny-hybrid": "qwen3_5", "tiny-muse": "muse_glimmer"}


def _hf_attention_kinds(target):
    """The target's attention layers in order (its paged pool's target layers), from the shipped HF config itself."""
    cfg = json.loads((REPO / "dflash2_trt" / "assets" / "tiny" / TINY_FAMILY[target] / "target" /
                      "config.json").read_text())
    text = cfg.get("text_config", cfg)
    kinds = text.get("layer_types") or ["full_attention"] * int(text["num_hidden_layers"])
    return [k for k in kinds if k != "linear_attention"], text.get("sliding_window")


@needs_src
def test_the_context_route_reaches_the_attention_plugin_entries_through_real_trtllm():
    """Through TensorRT-LLM's own gpt_attention (which assembles the plugin's inputs in its entry order): on a target
    whose sliding window binds (tiny-muse: every build takes the context route by default), exactly its
    sliding-window layers (the HF config's layer_types) bind the four sliding_* inputs, each at the entry the plugin
    reads as that request field; every other entry of theirs is what the full-attention layers bind. No other layer
    (full, drafter) and no layer of the other targets binds a sliding_* input. Combined and baseline, tp 1 and 2."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "trtllm_conformance.py"), "--trtllm-src", SRC,
                        "--target", "all", "--tp", "all", "--json", "--quiet", "--no-build"],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    reports = json.loads(r.stdout)
    assert len(reports) == 12
    routed_seen = 0
    for rep in reports:
        kinds, window = _hf_attention_kinds(rep["target"])
        routed = {i for i, k in enumerate(kinds) if k == "sliding_attention"} if window else set()
        for x in rep["ranks"]:
            where = (rep["target"], rep["tp"], rep["network"], x["rank"])
            calls = x["gpt_attention_bindings"]
            target_calls = {b["layer_idx"]: b for b in calls if b["layer_idx"] < len(kinds)}
            assert sorted(target_calls) == list(range(len(kinds))), where   # one call per target attention layer
            full = [b for i, b in target_calls.items() if i not in routed]
            assert full, where
            for b in calls:
                bound = {slot: n for slot, n in b["inputs"].items() if n and n.startswith("sliding_")}
                if b["layer_idx"] in routed and b is target_calls.get(b["layer_idx"]):
                    assert bound == ROUTE_SLOTS, (where, b["layer_idx"], b["inputs"])
                    for slot, n in b["inputs"].items():
                        if slot not in ROUTE_SLOTS and slot in full[0]["inputs"]:
                            assert n == full[0]["inputs"][slot], (where, b["layer_idx"], slot)
                    routed_seen += 1
                else:
                    assert bound == {}, (where, b["layer_idx"], bound)
            for b in full:
                assert all(b["inputs"][slot] == slot for slot in ROUTE_SLOTS), (where, b["layer_idx"], b["inputs"])
    assert routed_seen == 3 * (1 + 2) * 2   # tiny-muse: 3 sliding layers, ranks 1 + 2, combined and baseline
