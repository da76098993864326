"""The CPU stand-in held to what TensorRT-LLM 1.2 really accepts (``dflash2_trt/trtllm/cpu/api_1_2.yaml``, facts
recorded from TensorRT-LLM's sources with their paths and commits).

Signatures: every stand-in callable the table lists has exactly the recorded parameters (names, order, defaults).
Rules: each of the six errors found when the network file went through TensorRT-LLM's real network-definition
code, and the host-input fault, is refused by the stand-in the way TensorRT-LLM refuses it -- the network file
that landed before this test made each of these mistakes, and a CPU run of it now stops at the first one
(test_landed_network_pattern_is_refused_*).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dflash2_trt.errors import CheckpointError
from dflash2_trt.trtllm.cpu import functional as F
from dflash2_trt.trtllm.cpu import layers as L
from dflash2_trt.trtllm.cpu.attention import PositionEmbeddingType, gpt_attention
from dflash2_trt.trtllm.cpu.modeling_utils import PretrainedConfig, PretrainedModel
from dflash2_trt.trtllm.cpu.tensor import Tensor, network_input, raw

FACTS = yaml.safe_load((Path(F.__file__).with_name("api_1_2.yaml")).read_text())
_MISSING = object()


def _recorded(sig_rows):
    return [(name, _MISSING if default == "REQUIRED" else default) for name, default in sig_rows]


def _actual(fn, skip_self=False):
    out = []
    for p in inspect.signature(fn).parameters.values():
        if skip_self and p.name == "self":
            continue
        out.append((p.name, _MISSING if p.default is inspect.Parameter.empty else p.default))
    return out


def _same(rec, act):
    """Defaults compared where the table pins them (a '<non-literal>' default is a TensorRT enum / object)."""
    assert [n for n, _ in act] == [n for n, _ in rec]
    for (n, d_rec), (_, d_act) in zip(rec, act):
        if d_rec == "<non-literal>":
            assert d_act is not _MISSING, n
        else:
            assert d_act == d_rec or (d_rec is _MISSING and d_act is _MISSING), (n, d_rec, d_act)


@pytest.mark.parametrize("name", sorted(FACTS["functional"]["signatures"]))
def test_functional_signature_equals_the_recorded_one(name):
    _same(_recorded(FACTS["functional"]["signatures"][name]), _actual(getattr(F, name)))


def test_gpt_attention_signature_equals_the_recorded_one():
    params = inspect.signature(gpt_attention).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())   # a bare * first, as the real
    rec = _recorded(FACTS["functional"]["gpt_attention"])
    act = _actual(gpt_attention)[:len(rec)]
    _same(rec, act)
    later = [n for n, _ in _actual(gpt_attention)[len(rec):]]
    want = FACTS["functional"]["gpt_attention_later_keywords"]
    assert [n for n in later if n in want] == want                  # same order, none missing
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())   # unknown keyword: TypeError
    for k, v in FACTS["functional"]["gpt_attention_defaults"].items():
        d = params[k].default
        assert (d.name if hasattr(d, "name") else d) == v, k


@pytest.mark.parametrize("name", ["Linear", "RowLinear", "RmsNorm", "Embedding"])
def test_layer_signature_equals_the_recorded_one(name):
    _same(_recorded(FACTS["layers"][name]["signature"]), _actual(getattr(L, name).__init__, skip_self=True))
    assert L.ColumnLinear is L.Linear


# ---- the Tensor's operators ------------------------------------------------------------------------------
def test_tensor_has_exactly_the_real_operators():
    t = F.constant(np.array([1.0, 2.0], np.float32))
    u = F.constant(np.array([True, False]))
    for name in FACTS["tensor_operators"]["absent"]:
        assert name in Tensor.__dict__, name
        with pytest.raises(TypeError, match="has no"):
            getattr(t, name)(u if name in ("__and__", "__or__", "__rand__", "__ror__") else 1.0)
    with pytest.raises(TypeError, match="__rtruediv__"):             # error 5: `1.0 / tensor` in the accept step
        1.0 / t
    with pytest.raises(TypeError):
        -t
    with pytest.raises(TypeError):
        t[0]
    for name in FACTS["tensor_operators"]["present"]:
        assert name in Tensor.__dict__, name
    assert raw(F.div(1.0, t)).tolist() == [1.0, 0.5]                 # the functional form works
    assert raw(2.0 - t).tolist() == [1.0, 0.0] and raw(t / 2.0).tolist() == [0.5, 1.0]


def test_tensor_methods_are_the_real_ones():
    t = F.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    present = FACTS["tensor_methods"]["present"]
    for name in present:
        assert callable(getattr(t, name)), name
    assert raw(t.view([3, 2])).tolist() == [[0, 1], [2, 3], [4, 5]] and t.rank() == 2 and t.ndim() == 2
    assert raw(t.permute([1, 0])).shape == (3, 2) and t.cast("int32").dtype == torch.int32
    for name in FACTS["tensor_methods"]["absent_examples"]:
        with pytest.raises(TypeError, match="has no"):
            getattr(t, name)() if not name.startswith("__") else {"__len__": len, "__iter__": iter,
                                                                 "__bool__": bool, "__index__": lambda x: [0][x],
                                                                 "__int__": int, "__float__": float}[name](t)


# ---- dtype rules (error 6 and friends) ------------------------------------------------------------------
def test_shape_is_int64_and_where_refuses_mixed_int_kinds():
    x = F.constant(np.zeros((3, 5), np.float32))
    n = F.shape(x, 1)
    assert n.dtype == torch.int64 and n.dim() == 0 and int(raw(n)) == 5     # TensorRT 10's IShapeLayer
    assert F.shape(x, 1, "int32").dtype == torch.int32
    i32 = F.constant(np.arange(5, dtype=np.int32))
    first = i32 + n                                                    # elementwise: int32 meeting int64 -> int64
    assert first.dtype == torch.int64
    with pytest.raises(TypeError, match="mixed dtypes"):               # error 6: where(cond, int64, int32)
        F.where(F.lt(first, n), first, i32)
    assert F.where(F.lt(first, n), F.cast(first, "int32"), i32).dtype == torch.int32
    assert F.where(F.lt(i32, 2), i32, -1).dtype == torch.int32        # a Python int follows the Tensor's kind
    with pytest.raises(TypeError, match="mixed dtypes"):
        F.concat([i32, F.cast(i32, "int64")])
    assert F.concat([n, 4]).dtype == torch.int64                       # ints become int64 next to an int64 Tensor


def test_an_empty_constant_is_refused_and_a_zero_width_slice_is_not():
    """api_1_2.yaml dtype_rules constant_empty: TensorRT's addConstant refuses weights of count 0 with the non-null
    pointer TensorRT-LLM's constant() passes (met on a real TensorRT-RTX network by the conformance harness: the
    baseline network's [bs, 0] next_draft_tokens was such a constant); a [bs, 0] tensor is made by slicing."""
    assert "addConstant" in FACTS["dtype_rules"]["constant_empty"]
    with pytest.raises(ValueError, match="no elements"):
        F.constant(np.zeros((1, 0), np.int32))
    zero = F.expand(F.constant(np.zeros(1, np.int32)), F.concat([3]))
    out = F.slice(F.unsqueeze(zero, 1), [0, 0], F.concat([3, 0]))
    assert tuple(out.shape) == (3, 0) and out.dtype == torch.int32


def test_one_tensor_is_one_output():
    """api_1_2.yaml dtype_rules mark_output: Network._mark_output names the tensor, so a tensor marked under a second
    name loses the first (met on a real TensorRT-RTX network: the baseline had no accepted_paths output). The
    stand-in refuses the second name; cast() to the tensor's own dtype is the tensor itself, as in TensorRT-LLM."""
    from dflash2_trt.trtllm.cpu import modeling_utils as MU

    assert "last name" in FACTS["dtype_rules"]["mark_output"]
    zero = F.expand(F.constant(np.zeros(1, np.int32)), F.concat([2]))
    MU.begin_outputs()
    try:
        MU.mark_output(zero, "accepted_paths", "int32")
        assert F.cast(zero, "int32") is zero
        with pytest.raises(RuntimeError, match="already output 'accepted_paths'"):
            MU.mark_output(F.cast(zero, "int32"), "next_draft_lens", "int32")
        MU.mark_output(zero + 0, "next_draft_lens", "int32")          # a distinct tensor is a distinct output
    finally:
        got = MU.outputs()
    assert list(got) == ["accepted_paths", "next_draft_lens"]


def test_strongly_typed_scalar_rule_and_mixed_kinds_refused():
    """trtllm-build's network is strongly typed by default: a Python scalar takes the other operand's dtype
    (broadcast_helper); two Tensors must agree (int32 meeting int64 excepted)."""
    k64 = F.constant(np.array([3], np.int64))
    assert raw(k64 * 2654435761).tolist() == [3 * 2654435761]          # an int64 constant next to an int64 Tensor
    k32 = F.constant(np.array([3], np.int32))
    with pytest.raises(OverflowError, match="int32"):                 # int32_array(2654435761) overflows
        k32 * 2654435761
    h = F.constant(np.ones(2, np.float16))
    assert (h * 2).dtype == torch.float16 and (1 - h).dtype == torch.float16   # scalars follow the Tensor
    with pytest.raises(TypeError, match="IElementWiseLayer"):          # no implicit float promotion
        h * F.constant(np.ones(2, np.float32))
    with pytest.raises(TypeError, match="IElementWiseLayer"):
        F.constant(np.ones(2, np.float32)) + F.constant(np.ones(2, np.int32))
    with pytest.raises(TypeError, match="truncated"):                  # int32_array([0.5]) would be 0
        k32 + 0.5
    with pytest.raises(TypeError, match="bool"):
        F.op_and(F.constant(np.ones(2, np.int32)), F.constant(np.ones(2, np.int32)))


# ---- error 3: rms_norm's num_groups ------------------------------------------------------------------------
def test_rms_norm_weight_and_eps_only_by_keyword():
    x = F.constant(np.ones((2, 4), np.float32))
    w = F.constant(np.full(4, 2.0, np.float32))
    with pytest.raises(TypeError, match="num_groups"):                # the landed OffsetRmsNorm: (x, dim, w, eps)
        F.rms_norm(x, 4, w, 1e-6)
    with pytest.raises(TypeError, match="num_groups"):                # (x, dim, None, eps)
        F.rms_norm(x, 4, None, 1e-6)
    assert torch.allclose(raw(F.rms_norm(x, 4, weight=w, eps=1e-6)), torch.full((2, 4), 2.0), atol=1e-5)


# ---- error 2: Linear's bias default -----------------------------------------------------------------------
class _Net(PretrainedModel):
    def __init__(self, config, bias_kw):
        super().__init__(config)
        self.fc = L.ColumnLinear(4, 4, dtype="float32", **bias_kw)
        self.proj = L.RowLinear(4, 4, dtype="float32", **bias_kw)


def test_linear_without_bias_false_needs_bias_tensors():
    cfg = PretrainedConfig.from_dict({"mapping": {"world_size": 1, "tp_size": 1}})
    weights = {"fc.weight": torch.zeros(4, 4), "proj.weight": torch.zeros(4, 4)}   # what convert writes
    with pytest.raises(CheckpointError, match="required weight"):
        _Net(cfg, {}).load(weights)                                  # the landed GatedMLP / fc / lm_head
    _Net(cfg, {"bias": False}).load(weights)


# ---- error 4 and the host-input fault: the GPTAttention plugin's inputs -----------------------------------
def _attention_args(**over):
    from dflash2_trt.trtllm.cpu.attention import KVCachePool

    pool = KVCachePool(4, 1, 1, 4, 4, torch.float32)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)   # noqa: E731
    host = {"host_past_key_value_lengths": i32([3]), "host_max_attention_window_sizes": i32([100]),
            "host_sink_token_length": i32([0]), "host_request_types": i32([0]), "host_context_lengths": i32([3]),
            "host_kv_cache_block_offsets": i32([[[[0], [1]]]]), "host_kv_cache_pool_pointers":
            torch.tensor([[pool.handle, 0]]), "host_kv_cache_pool_mapping": i32([[0, 0]])}
    dev = {"sequence_length": i32([3]), "context_lengths": i32([3]), "cache_indirection": torch.zeros(1, 1, 8,
           dtype=torch.int32), "kv_cache_block_offsets": i32([[[[0], [1]]]])}
    kw = {k: network_input(v, k, "host") for k, v in host.items()}
    kw.update({k: network_input(v, k, "device") for k, v in dev.items()})
    kw.update(qkv=F.constant(np.random.default_rng(0).standard_normal((3, 12)).astype(np.float32)),
              past_key_value=None, layer_idx=0, num_heads=1, num_kv_heads=1, hidden_size_per_head=4, q_scaling=1.0,
              max_context_length=8, position_embedding_type=PositionEmbeddingType.learned_absolute)
    kw.update(over)
    return kw, pool


def test_gpt_attention_plugin_inputs_as_tensorrt_llm_checks_them():
    kw, pool = _attention_args()
    try:
        gpt_attention(**kw)                                          # the complete call is valid
        with pytest.raises(AssertionError, match="Found None input for 6 th item"):   # error 4: cache_indirection
            gpt_attention(**{**kw, "cache_indirection": None})
        with pytest.raises(ValueError, match="rotary_inv_freq"):      # error 4: a RoPE layer without its tables
            gpt_attention(**{**kw, "position_embedding_type": PositionEmbeddingType.rope_gpt_neox,
                             "rotary_embedding_dim": 4})
        # the host-input fault: a window (or spec_decoding_use) made in the graph is device memory
        with pytest.raises(ValueError, match="host_max_attention_window_sizes is read on the host"):
            gpt_attention(**{**kw, "host_max_attention_window_sizes": F.constant(np.array([100], np.int32))})
        with pytest.raises(ValueError, match="device input"):
            gpt_attention(**{**kw, "context_lengths": kw["host_context_lengths"]})
        with pytest.raises(AssertionError, match="max_context_length"):
            gpt_attention(**{**kw, "max_context_length": None})
    finally:
        pool.release()


def test_rotary_tables_are_read_from_the_plugin_input():
    """The stand-in rotates with the rotary_cos_sin it is given (as the plugin reads it), so a wrong table changes
    the result -- it is not recomputed behind the network's back."""
    from dflash2_trt.trtllm.backend import load_network

    net = load_network("cpu")
    inv, table = net.rope_tables(8, 4, 10000.0)
    rope = dict(position_embedding_type=PositionEmbeddingType.rope_gpt_neox, rotary_embedding_dim=4,
                rotary_embedding_max_positions=8, rotary_inv_freq=F.constant(inv))
    outs = []
    for t in (table, table * 0.5):
        kw, pool = _attention_args(**rope, rotary_cos_sin=F.constant(np.ascontiguousarray(t)))
        try:
            outs.append(raw(gpt_attention(**kw)[0]))
        finally:
            pool.release()
    assert not torch.allclose(outs[0], outs[1])
    kw, pool = _attention_args(**{**rope, "rotary_embedding_max_positions": 2}, rotary_cos_sin=F.constant(table))
    try:
        with pytest.raises(ValueError, match="rotary_cos_sin has"):
            gpt_attention(**kw)
    finally:
        pool.release()


def test_rope_tables_follow_the_recorded_layout():
    from dflash2_trt.trtllm.backend import load_network

    net = load_network("cpu")
    inv, table = net.rope_tables(5, 4, 500.0)
    assert inv.dtype == np.float32 and table.dtype == np.float32 and table.shape == (1, 5 * 4)
    t = table.reshape(5, 2, 2)
    for p in range(5):
        for i in range(2):
            ang = np.float32(p) * (np.float32(1.0) / np.float32(500.0 ** (2 * i / 4)))
            assert t[p, i, 0] == np.cos(np.float32(ang)) and t[p, i, 1] == np.sin(np.float32(ang))
    # the rounding order matters: base 1e4, dim 128 -- the power rounded to fp32 first, then an fp32 division
    inv, _ = net.rope_tables(2, 128, 10000.0)
    want = [np.float32(1.0) / np.float32(10000.0 ** (i / 128)) for i in range(0, 128, 2)]
    other = (1.0 / 10000.0 ** (np.arange(0, 128, 2) / 128)).astype(np.float32)   # float64 division, then rounded
    assert list(inv) == want and (other != np.array(want)).sum() > 0


# ---- error 1: MODEL_MAP -------------------------------------------------------------------------------------
def test_registration_makes_every_checkpoint_architecture_resolve(tmp_path):
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.convert.schema import ARCHITECTURES
    from dflash2_trt.trtllm.register import architectures, register

    class Model:   # stands for the network file's class; MODEL_MAP only maps names to classes
        pass

    model_map = {"LlamaForCausalLM": object}
    assert set(architectures()) == set(ARCHITECTURES.values())
    register(model_map, Model)
    # the architecture the converter writes into a real checkpoint's config.json resolves
    from dflash2_trt.convert.driver import convert_pair

    pair = trained_pair("qwen3")
    out = tmp_path / "ckpt"
    convert_pair(pair.drafter_dir, pair.target_dir, out, tp_size=1)
    import json

    arch = json.loads((out / "config.json").read_text())["architecture"]
    assert model_map[arch] is Model and model_map["LlamaForCausalLM"] is object
    with pytest.raises(RuntimeError, match="already"):
        register({arch: dict}, Model)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "muse_glimmer"])
def test_bf16_engine_steps_under_the_strongly_typed_rules(family, tmp_path):
    """Every other tiny test engine is float32; a bfloat16 engine exercises the dtype rules where they bite (Python
    scalars next to bf16 Tensors, fp32 logits next to bf16 hidden states, bias and norm weights): greedy and sampled
    steps of every family must run with no op the strongly typed rules refuse."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.build import build_engine
    from dflash2_trt.testing.engines import run_prompts, shipped_prompts

    pair = trained_pair(family)
    out = tmp_path / "e"
    build_engine(pair.drafter_dir, pair.target_dir, out, dtype="bfloat16",
                 overrides={"block_size": 4, "tokens_per_block": 16})
    for temperature in (0.0, 1.0):
        reqs, _ = run_prompts(out, shipped_prompts(pair, 3), new=6, temperature=temperature, seeds=[1, 2, 3])
        assert all(len(r.output_ids) == 6 for r in reqs)


def test_all_reduce_workspace_is_the_recorded_input():
    """The CPU stand-in's all_reduce_workspace declares what plugin.py's set_workspace_tensor declares."""
    from dflash2_trt.trtllm.cpu.mapping import Mapping
    from dflash2_trt.trtllm.cpu.modeling_utils import all_reduce_workspace

    facts = FACTS["all_reduce_workspace"]
    assert [n for n, _ in facts["set_workspace_tensor"]] == ["mapping", "num_profiles"]
    inp = facts["input"]
    for tp, profiles in ((2, 1), (4, 3)):
        d = all_reduce_workspace(Mapping(world_size=tp, rank=0, tp_size=tp), profiles)
        n = inp["pointers_per_rank"] * tp + inp["pointers_of_counter"]
        assert (d.name, d.dtype, d.shape) == (inp["name"], inp["dtype"], (n,))
        assert list(d.dim_range.items()) == [(inp["dim_name"], [n] * profiles)]


def test_input_tensor_follows_the_recorded_dim_range_rules():
    """The stand-in's input_tensor refuses what functional.Tensor / DimRange assert (api_1_2.yaml input_tensor)
    and reads an entry as the record says: an int is a static size, [min, opt, max] a dynamic range."""
    from collections import OrderedDict

    from dflash2_trt.trtllm.cpu.modeling_utils import check_profiles, input_tensor

    facts = FACTS["input_tensor"]["dim_range"]
    assert facts["type"] == "OrderedDict" and facts["min_dimensions"] == facts["min_profiles"] == 1
    two = input_tensor("a", "int32", [-1, 4], OrderedDict(n=[[1, 2, 8], [8, 16, 32]], w=[4, 4]))
    assert two.profiles == [[(1, 2, 8), (4, 4, 4)], [(8, 16, 32), (4, 4, 4)]]
    for bad in ({"n": [[1, 2, 8]], "w": [4]}, OrderedDict(), OrderedDict(n=[[1, 2, 8]], w=[4, 4]),
                OrderedDict(n=[[2, 1, 8]], w=[4])):
        try:
            input_tensor("a", "int32", [-1, 4], bad)
        except (TypeError, ValueError):
            continue
        raise AssertionError(f"accepted {bad}")
    one = input_tensor("b", "int32", [-1], OrderedDict(n=[[1, 2, 8]]))
    try:
        check_profiles([two, one])          # 2 profiles beside 1: the network indexes every input by profile
    except ValueError as exc:
        assert "numbers of optimization profiles" in str(exc)
    else:
        raise AssertionError("inputs with 2 and 1 profiles were accepted")
    try:                                    # the same dimension name with two ranges in one profile
        check_profiles([input_tensor("c", "int32", [-1], OrderedDict(n=[[1, 2, 8]])),
                        input_tensor("d", "int32", [-1], OrderedDict(n=[[1, 4, 8]]))])
    except ValueError as exc:
        assert "dimension 'n'" in str(exc)
    else:
        raise AssertionError("one dimension name with two ranges was accepted")
