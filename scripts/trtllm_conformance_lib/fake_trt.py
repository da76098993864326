"""A ``tensorrt`` module made from ``tensorrt_rtx`` (TensorRT-RTX 1.7: a real TensorRT builder that runs on the
CPU, strongly typed only, whose Python network API has no ``add_plugin_v2`` / ``add_plugin_v3``).

Everything is TensorRT-RTX's own object except:

- ``INetworkDefinition``: :class:`PlaceholderNetwork`, a proxy around a real ``tensorrt_rtx.INetworkDefinition``
  that adds ``add_plugin_v2`` / ``add_plugin_v3``. A plugin call becomes a **placeholder**: its input contract is
  checked (count, dtypes, ranks, host-vs-device placement where known; a violation raises :class:`ContractError`
  naming the rule) and its outputs are made from ordinary layers with the plugin's output shapes and dtypes,
  data-dependent on every input (so TensorRT keeps the inputs and builds the graph as the plugin would see it).
- ``get_plugin_registry()``: a registry whose creators make placeholder plugin objects for the TensorRT-LLM
  plugins the network uses (GPTAttention, Gemm, AllReduce, AllGather, TopkLastDim, CumsumLastDim, Identity) and for
  the DFlash2 plugins (contracts from ``plugins/*/...Plugin.yaml`` through :mod:`dflash2_trt.plugins`).

An unknown plugin is an error, never a silent pass-through.
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import yaml

import tensorrt_rtx as _rtx

CONTRACT_FILE = Path(__file__).resolve().parent / "gpt_attention_contract.yaml"
TRTLLM_NAMESPACE = "tensorrt_llm"


class ContractError(RuntimeError):
    """A plugin placeholder refused its inputs (the message names the plugin, the input and the rule)."""


_DT = {"float32": _rtx.float32, "float16": _rtx.float16, "bfloat16": _rtx.bfloat16, "int32": _rtx.int32,
       "int64": _rtx.int64, "int8": _rtx.int8, "bool": _rtx.bool, "fp8": _rtx.fp8}
_DT_NAME = {v: k for k, v in _DT.items()}


def dtype_name(dt) -> str:
    return _DT_NAME.get(dt, str(dt))


# ------------------------------------------------------------------------------------------ plugin objects
class PlaceholderPlugin:
    """What a creator's ``create_plugin`` returns: the plugin type and its fields (name -> ndarray)."""

    def __init__(self, plugin_type, version, namespace, name, fields, v3):
        self.plugin_type, self.plugin_version, self.plugin_namespace = plugin_type, version, namespace
        self.name, self.fields, self.v3 = name, fields, v3

    def field(self, name, default=None):
        if name not in self.fields:
            if default is not None:
                return default
            raise ContractError(f"{self.plugin_type}: plugin field '{name}' missing (have {sorted(self.fields)})")
        v = self.fields[name].reshape(-1)
        return v[0].item() if v.size == 1 else v.tolist()


def _fields_of(pfc) -> dict:
    out = {}
    if pfc is None:
        return out
    for i in range(len(pfc)):
        f = pfc[i]
        out[f.name] = np.array(f.data).copy()
    return out


class PlaceholderCreator:
    def __init__(self, name, version, namespace, v3):
        self.name, self.plugin_version, self.plugin_namespace, self.v3 = name, version, namespace, v3

    def create_plugin(self, name, pfc, phase=None):
        return PlaceholderPlugin(self.name, self.plugin_version, self.plugin_namespace, name, _fields_of(pfc), self.v3)


class PlaceholderRegistry:
    """``trt.get_plugin_registry()``: creators for the plugins that have placeholders; others are None (as TensorRT
    answers for an unregistered creator, which the calling code asserts on)."""

    def __init__(self):
        self.loaded_libraries = []

    def _creator(self, name, version, namespace):
        if namespace == TRTLLM_NAMESPACE and name in TRTLLM_PLACEHOLDERS:
            return PlaceholderCreator(name, version, namespace, v3=False)
        if namespace == "dflash2":
            from dflash2_trt.plugins import load_specs

            specs = {s.name: s for s in load_specs().values()}
            if name in specs and specs[name].version == version:
                return PlaceholderCreator(name, version, namespace, v3=True)
        return None

    def get_plugin_creator(self, name, version, namespace=""):
        return self._creator(name, version, namespace)

    def get_creator(self, name, version, namespace=""):
        return self._creator(name, version, namespace)

    @property
    def plugin_creator_list(self):
        return [PlaceholderCreator(n, "1", TRTLLM_NAMESPACE, False) for n in TRTLLM_PLACEHOLDERS]

    def load_library(self, path):
        self.loaded_libraries.append(str(path))


REGISTRY = PlaceholderRegistry()


# ------------------------------------------------------------------------------------------ the network proxy
class PlaceholderLayer:
    """The layer ``add_plugin_v2/v3`` returns: behaves as TensorRT-LLM uses a plugin layer (type, plugin, name,
    metadata, outputs), its outputs being real tensors made by ordinary layers."""

    def __init__(self, plugin, inputs, outputs):
        self.plugin, self._inputs, self._outputs = plugin, list(inputs), list(outputs)
        self.type = _rtx.LayerType.PLUGIN_V3 if plugin.v3 else _rtx.LayerType.PLUGIN_V2
        self.name = f"placeholder_{plugin.plugin_type}"
        self.metadata = ""
        self.precision = None

    @property
    def num_outputs(self):
        return len(self._outputs)

    @property
    def num_inputs(self):
        return len(self._inputs)

    def get_output(self, i):
        return self._outputs[i]

    def get_input(self, i):
        return self._inputs[i]


class PlaceholderNetwork:
    """``trt.INetworkDefinition`` for TensorRT-LLM's ``Network``: a real TensorRT-RTX network plus plugin
    placeholders. ``placeholders`` lists (plugin type, layer name, n inputs) in call order."""

    def __init__(self, real):
        object.__setattr__(self, "_net", real)
        object.__setattr__(self, "_keep", [])
        object.__setattr__(self, "_input_names", set())
        object.__setattr__(self, "placeholders", [])
        object.__setattr__(self, "warnings", [])
        object.__setattr__(self, "placeholder_layers", 0)   # ordinary layers the placeholders are made of
        object.__setattr__(self, "_harness_gpt_attention_qkv", [])
        # per GPTAttention call: its layer_idx field and, per input entry (the contract's names), the network input
        # bound there (None: a tensor computed in the graph)
        object.__setattr__(self, "gpt_attention_bindings", [])
        object.__setattr__(self, "allreduce_strategies", [])
        # per plugin call, in call order: (plugin type, its output tensors), for dead_plugins
        object.__setattr__(self, "placeholder_outputs", [])

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_net"), name)

    def __setattr__(self, name, value):
        if name in ("placeholder_layers",):
            object.__setattr__(self, name, value)
        else:
            setattr(self._net, name, value)

    @property
    def real(self):
        return self._net

    def get_flag(self, flag):
        return self._net.get_flag(flag)

    def add_input(self, name, dtype, shape):
        t = self._net.add_input(name=name, dtype=dtype, shape=shape)
        self._input_names.add(name)
        return t

    def is_network_input(self, tensor) -> bool:
        return tensor.name in self._input_names

    def add_plugin_v2(self, inputs, plugin):
        return self._placeholder(list(inputs), plugin)

    def add_plugin_v3(self, inputs, shape_inputs, plugin):
        if list(shape_inputs):
            raise ContractError(f"{plugin.plugin_type}: the placeholder does not model shape inputs")
        return self._placeholder(list(inputs), plugin)

    def _placeholder(self, inputs, plugin):
        if not isinstance(plugin, PlaceholderPlugin):
            raise ContractError(f"add_plugin got {type(plugin).__name__}, not a plugin from the placeholder registry")
        for i, t in enumerate(inputs):
            if t is None:
                raise ContractError(f"{plugin.plugin_type}: input {i} is None")
        before = self._net.num_layers
        if plugin.v3:
            outs = dflash2_placeholder(self, inputs, plugin)
        else:
            outs = TRTLLM_PLACEHOLDERS[plugin.plugin_type](self, inputs, plugin)
        self.placeholders.append((plugin.plugin_type, plugin.name, len(inputs)))
        self.placeholder_outputs.append((plugin.plugin_type, list(outs)))
        self.placeholder_layers += self._net.num_layers - before
        return PlaceholderLayer(plugin, inputs, outs)

    # ---- subgraph helpers (ordinary TensorRT layers) ---------------------------------------------------
    def const(self, arr):
        arr = np.ascontiguousarray(arr)
        self._keep.append(arr)
        return self._net.add_constant(arr.shape, _rtx.Weights(arr)).get_output(0)

    def dim(self, t, i):
        """[1] int64: dimension i of t (dynamic)."""
        shp = self._net.add_shape(t).get_output(0)
        return self._net.add_gather(shp, self.const(np.array([i], np.int64)), 0).get_output(0)

    def shape_tensor(self, dims):
        """dims: list of int | [1]-int64 tensors -> 1-D int64 shape tensor."""
        parts = [self.const(np.array([d], np.int64)) if isinstance(d, (int, np.integer)) else d for d in dims]
        layer = self._net.add_concatenation(parts)
        layer.axis = 0
        return layer.get_output(0)

    def _cast(self, t, dt):
        return t if t.dtype == dt else self._net.add_cast(t, dt).get_output(0)

    def dependency(self, inputs):
        """A float32 [1] zero that depends on every input: 0 * (sum over inputs of sum(x))."""
        acc = None
        for x in inputs:
            if x.dtype == _rtx.bool:
                x = self._cast(x, _rtx.int32)
            rank = len(x.shape)
            if rank == 0:
                r = x
            else:
                r = self._net.add_reduce(x, _rtx.ReduceOperation.SUM, (1 << rank) - 1, False).get_output(0)
            r = self._cast(r, _rtx.float32)
            acc = r if acc is None else self._net.add_elementwise(acc, r, _rtx.ElementWiseOperation.SUM).get_output(0)
        shuf = self._net.add_shuffle(acc)
        shuf.reshape_dims = (1,)
        return self._net.add_elementwise(shuf.get_output(0), self.const(np.zeros(1, np.float32)),
                                         _rtx.ElementWiseOperation.PROD).get_output(0)

    def output(self, dims, dtype, dep):
        """A tensor of shape ``dims`` (ints / [1] int64 tensors) and ``dtype``, zeros plus ``dep``."""
        rank = len(dims)
        base = self._cast(self.const(np.zeros([1] * rank, np.float32)), dtype)
        sl = self._net.add_slice(base, start=[0] * rank, shape=[1] * rank, stride=[0] * rank)
        sl.set_input(2, self.shape_tensor(dims))
        d = self._net.add_shuffle(dep)
        d.reshape_dims = (1,) * rank
        return self._net.add_elementwise(sl.get_output(0), self._cast(d.get_output(0), dtype),
                                         _rtx.ElementWiseOperation.SUM).get_output(0)


def dead_plugins(pnet) -> list[str]:
    """The plugin calls none of whose outputs reaches a marked network output: TensorRT removes such a layer when it
    builds the engine (a plugin is taken to have no side effects), so a call made for what it writes (the Gated
    DeltaNet commit) must feed an output. ``"<plugin type> #<its call index among that type>"`` each. Walks the real
    network backwards from its outputs over every layer input (shape inputs included), but not into a shape layer's
    input: only its dimensions are read, and TensorRT removes a layer whose values nothing reads; tensors by name."""
    net = pnet.real
    producer = {}
    for i in range(net.num_layers):
        layer = net.get_layer(i)
        for k in range(layer.num_outputs):
            producer[layer.get_output(k).name] = layer
    live, stack = set(), [net.get_output(i).name for i in range(net.num_outputs)]
    while stack:
        name = stack.pop()
        if name in live:
            continue
        live.add(name)
        layer = producer.get(name)
        if layer is None or layer.type == _rtx.LayerType.SHAPE:
            continue
        for j in range(layer.num_inputs):
            t = layer.get_input(j)
            if t is not None:
                stack.append(t.name)
    seen, dead = {}, []
    for kind, outs in pnet.placeholder_outputs:
        seen[kind] = seen.get(kind, 0) + 1
        if not any(o.name in live for o in outs):
            dead.append(f"{kind} #{seen[kind] - 1}")
    return dead


# ------------------------------------------------------------------------------------------ contract checks
def _need(cond, plugin, msg):
    if not cond:
        raise ContractError(f"{plugin}: {msg}")


def _check_dtype(plugin, what, t, allowed):
    allowed = allowed if isinstance(allowed, (list, tuple, set)) else [allowed]
    _need(t.dtype in allowed, plugin, f"input '{what}' has dtype {dtype_name(t.dtype)}, the plugin requires "
                                      f"{' or '.join(dtype_name(a) for a in allowed)}")


def _check_rank(plugin, what, t, rank):
    _need(len(t.shape) == rank, plugin, f"input '{what}' has rank {len(t.shape)} (shape {tuple(t.shape)}), "
                                        f"the plugin requires rank {rank}")


def _type_id(plugin):
    return _rtx.DataType(int(plugin.field("type_id")))


_CONTRACT = None


def gpt_attention_contract() -> dict:
    global _CONTRACT
    if _CONTRACT is None:
        _CONTRACT = yaml.safe_load(CONTRACT_FILE.read_text())
    return _CONTRACT


def gpt_attention_expected(plugin) -> list:
    """The input entries the GPTAttention plugin numbers for these fields (C++ isEntryUsed order)."""
    c = gpt_attention_contract()
    for f, want in c["unsupported_fields"].items():
        got = plugin.field(f, default=np.array([0]))
        _need(int(np.array(got).reshape(-1)[0]) == want, "GPTAttention",
              f"field {f}={got}: the placeholder does not model this configuration")
    flags = {
        "always": True,
        "use_cache": bool(plugin.field("use_cache")),
        "paged_kv_cache": bool(plugin.field("paged_kv_cache")),
        "remove_input_padding": bool(plugin.field("remove_input_padding")),
        "is_spec_decoding_enabled": bool(plugin.field("is_spec_decoding_enabled")),
        "rope": int(plugin.field("position_embedding_type")) in c["rope_position_embedding_types"],
    }
    out = []
    for e in c["inputs"]:
        when = e.get("when", "always")
        if all(flags[w.strip()] for w in when.split(" and ")):
            out.append(e)
    return out


def gpt_attention_placeholder(net, inputs, plugin):
    name = "GPTAttention"
    # graph rewriting (build_steps.fuse_attention_with_bias_matches) needs each call's qkv and whether it has a bias
    net._harness_gpt_attention_qkv.append((inputs[0], bool(plugin.field("qkv_bias_enabled", 0))))
    expected = gpt_attention_expected(plugin)
    _need(len(inputs) == len(expected), name,
          f"the plugin numbers {len(expected)} inputs for its fields ({', '.join(e['name'] for e in expected)}), "
          f"got {len(inputs)}")
    qkv_dt = _type_id(plugin)
    for e, t in zip(expected, inputs):
        dt = qkv_dt if e["dtype"] == "plugin" else _DT[e["dtype"]]
        _check_dtype(name, e["name"], t, dt)
        if "rank" in e:
            _check_rank(name, e["name"], t, e["rank"])
        if "rank_doc" in e and len(t.shape) != e["rank_doc"]:
            net.warnings.append(f"GPTAttention layer {len(net.placeholders)}: input '{e['name']}' has rank "
                                f"{len(t.shape)} (shape {tuple(t.shape)}), documented rank {e['rank_doc']}")
        if e["memory"] == "host":
            _need(net.is_network_input(t), name,
                  f"input '{e['name']}' is read on the host, so it must be a network input the runtime binds in host "
                  f"memory; got '{t.name}', a tensor computed in the graph (device memory)")
    net.gpt_attention_bindings.append({
        "layer_idx": int(plugin.field("layer_idx")),
        "inputs": {e["name"]: (t.name if net.is_network_input(t) else None) for e, t in zip(expected, inputs)}})
    qkv = inputs[0]
    nh, hs, nkv = int(plugin.field("num_heads")), int(plugin.field("head_size")), int(plugin.field("num_kv_heads"))
    width = qkv.shape[-1]
    _need(width in (-1, (nh + 2 * nkv) * hs), name,
          f"qkv width {width} != (num_heads + 2 num_kv_heads) * head_size = {(nh + 2 * nkv) * hs}")
    dep = net.dependency(inputs)
    return [net.output([net.dim(qkv, 0), nh * hs], qkv.dtype, dep)]


def gemm_placeholder(net, inputs, plugin):
    name = "Gemm"
    _need(len(inputs) == 2, name, f"expects 2 inputs (input, mat2), got {len(inputs)}")
    x, w = inputs
    dt = _type_id(plugin)
    _check_dtype(name, "input", x, dt)
    _check_dtype(name, "mat2", w, dt)
    transa, transb = int(plugin.field("transa")), int(plugin.field("transb"))
    _need(transa == 0, name, "transa=1 is not modelled")
    _check_rank(name, "mat2", w, 2)
    k = x.shape[-1]
    wk = w.shape[1] if transb else w.shape[0]
    n = w.shape[0] if transb else w.shape[1]
    _need(k == -1 or wk == -1 or k == wk, name, f"inner dimensions differ: input {tuple(x.shape)}, mat2 "
                                                 f"{tuple(w.shape)} (transb={transb})")
    dims = [net.dim(x, i) for i in range(len(x.shape) - 1)] + [int(n)]
    return [net.output(dims, dt, net.dependency(inputs))]


def allreduce_placeholder(net, inputs, plugin):
    name = "AllReduce"
    _need(int(plugin.field("fusion_op")) == 0, name, "fused all-reduce is not modelled")
    strategy = int(plugin.field("strategy"))
    # functional.create_allreduce_plugin gives the workspace input to every strategy but NCCL (0), UB (2) and
    # NCCL_SYMMETRIC (8); the C++ plugin (allreducePlugin.cpp supportsFormatCombination, every stored revision)
    # counts one base input for NCCL and UB only and TLLM_CHECKs the count: NCCL_SYMMETRIC without the workspace is
    # refused there (trtllm_build_steps.yaml, allreduce_workspace)
    want = 1 if strategy in (0, 2) else 2
    _need(len(inputs) == want, name, f"strategy {strategy} takes {want} input(s) in allreducePlugin.cpp "
          f"(the workspace for every strategy but NCCL/UB), got {len(inputs)}")
    if want == 2:
        ws = inputs[1]
        _need(net.is_network_input(ws) and ws.name == "all_reduce_workspace", name,
              f"input 1 must be the network input all_reduce_workspace, got {ws.name!r}")
        _need(str(ws.dtype).endswith("INT64"), name, f"all_reduce_workspace must be int64, got {ws.dtype}")
    net.allreduce_strategies.append(strategy)
    x = inputs[0]
    _check_dtype(name, "input", x, _type_id(plugin))
    group = plugin.field("group")
    group = group if isinstance(group, list) else [group]
    _need(len(group) >= 1, name, "empty group")
    return [net.output([net.dim(x, i) for i in range(len(x.shape))], x.dtype, net.dependency(inputs))]


def allgather_placeholder(net, inputs, plugin):
    name = "AllGather"
    _need(len(inputs) == 1, name, f"expects 1 input, got {len(inputs)}")
    x = inputs[0]
    _check_dtype(name, "input", x, _type_id(plugin))
    group = plugin.field("group")
    n = len(group) if isinstance(group, list) else 1
    d0 = net._net.add_elementwise(net.dim(x, 0), net.const(np.array([n], np.int64)),
                                  _rtx.ElementWiseOperation.PROD).get_output(0)
    dims = [d0] + [net.dim(x, i) for i in range(1, len(x.shape))]
    return [net.output(dims, x.dtype, net.dependency(inputs))]


def topk_last_dim_placeholder(net, inputs, plugin):
    name = "TopkLastDim"
    _need(len(inputs) == 1, name, f"expects 1 input, got {len(inputs)}")
    x = inputs[0]
    _check_rank(name, "input", x, 2)
    _check_dtype(name, "input", x, _type_id(plugin))
    k = int(plugin.field("k"))
    _need(x.shape[-1] == -1 or 1 <= k <= x.shape[-1], name, f"k={k} outside [1, {x.shape[-1]}]")
    dep = net.dependency(inputs)
    return [net.output([net.dim(x, 0), k], x.dtype, dep), net.output([net.dim(x, 0), k], _rtx.int32, dep)]


def cumsum_last_dim_placeholder(net, inputs, plugin):
    name = "CumsumLastDim"
    _need(len(inputs) == 1, name, f"expects 1 input, got {len(inputs)}")
    x = inputs[0]
    _check_rank(name, "input", x, 2)
    _check_dtype(name, "input", x, _type_id(plugin))
    return [net.output([net.dim(x, 0), net.dim(x, 1)], x.dtype, net.dependency(inputs))]


def identity_placeholder(net, inputs, plugin):
    _need(len(inputs) == 1, "Identity", f"expects 1 input, got {len(inputs)}")
    x = inputs[0]
    return [net.output([net.dim(x, i) for i in range(len(x.shape))], x.dtype, net.dependency(inputs))]


TRTLLM_PLACEHOLDERS = {
    "GPTAttention": gpt_attention_placeholder,
    "Gemm": gemm_placeholder,
    "AllReduce": allreduce_placeholder,
    "AllGather": allgather_placeholder,
    "TopkLastDim": topk_last_dim_placeholder,
    "CumsumLastDim": cumsum_last_dim_placeholder,
    "Identity": identity_placeholder,
}


# ---- DFlash2 plugins: contracts from their YAML specs ------------------------------------------------------
class _Dyn:
    """A dimension known only at run time (input index, dim)."""

    def __init__(self, idx, dim):
        self.idx, self.dim = idx, dim


def _eval_dim(expr, env):
    try:
        return eval(expr, {"__builtins__": {}}, env)   # noqa: S307 - the project's own spec files
    except (TypeError, NameError):
        return None   # arithmetic on a run-time dimension: not checkable at definition time


def _when(expr, attrs):
    return True if not expr else bool(eval(expr, {"__builtins__": {}}, dict(attrs)))   # noqa: S307


def _allowed(dtypes, names_dt, source_name):
    if isinstance(dtypes, str):
        first = dtypes.split(";")[0].strip()
        m = re.fullmatch(r"same_as (\w+)", first)
        if m:
            return [names_dt[m.group(1)]]
        raise ContractError(f"{source_name}: cannot read dtypes {dtypes!r}")
    return [_DT[d] for d in dtypes]


def dflash2_placeholder(net, inputs, plugin):
    from dflash2_trt.plugins import load_specs

    spec = {s.name: s for s in load_specs().values()}[plugin.plugin_type]
    name = spec.name
    attrs = {a.name: int(plugin.field(a.name)) for a in spec.attributes}
    ins = [s for s in spec.inputs if _when(s.when, attrs)]
    _need(len(inputs) == len(ins), name, f"expects {len(ins)} inputs for attributes {attrs} "
                                         f"({', '.join(s.name for s in ins)}), got {len(inputs)}")
    host = set()
    for c in spec.constraints:
        m = re.search(r"([\w, ]+) in host memory", c)
        if m:
            host |= {w.strip() for w in re.split(r",|\band\b", m.group(1)) if w.strip()}
    env, names_dt = dict(attrs), {}
    bare = re.compile(r"[A-Za-z_]\w*")
    for idx, (s, t) in enumerate(zip(ins, inputs)):   # pass 1: dtypes, ranks, bind bare symbols
        names_dt[s.name] = t.dtype
        _check_dtype(name, s.name, t, _allowed(s.dtypes, names_dt, name))
        _check_rank(name, s.name, t, len(s.shape))
        for d, expr in enumerate(s.shape):
            if bare.fullmatch(expr) and expr not in env:
                env[expr] = t.shape[d] if t.shape[d] != -1 else _Dyn(idx, d)
    for s, t in zip(ins, inputs):   # pass 2: every dimension the spec fixes, where both sides are static
        for d, expr in enumerate(s.shape):
            want, actual = _eval_dim(expr, env), t.shape[d]
            if isinstance(want, (int, np.integer)) and actual != -1:
                _need(int(want) == actual, name, f"input '{s.name}' dim {d} is {actual}, the spec says {expr} = "
                                                 f"{int(want)}")
        if s.name in host:
            _need(net.is_network_input(t), name, f"input '{s.name}' is read on the host (spec constraint), so it "
                                                 f"must be a network input; got '{t.name}', computed in the graph")
    dep = net.dependency(inputs)
    outs = []
    for s in spec.outputs:
        if not _when(s.when, attrs):
            continue
        dt_spec = s.dtypes
        if isinstance(dt_spec, str) and ";" in dt_spec:
            base, rule = dt_spec.split(";", 1)
            m = re.fullmatch(r"\s*(\w+) when (.+)", rule)
            dt = _DT[m.group(1)] if m and _when(m.group(2), attrs) else _allowed(base, names_dt, name)[0]
        else:
            dt = _allowed(dt_spec, names_dt, name)[0]
        dims = []
        for expr in s.shape:
            v = env.get(expr) if re.fullmatch(r"[A-Za-z_]\w*", expr) else _eval_dim(expr, env)
            if isinstance(v, _Dyn):
                dims.append(net.dim(inputs[v.idx], v.dim))
            elif isinstance(v, (int, np.integer)):
                dims.append(int(v))
            else:
                raise ContractError(f"{name}: output '{s.name}' dim {expr!r} is not computable from the inputs")
        outs.append(net.output(dims, dt, dep))
    return outs


# ------------------------------------------------------------------------------------------ the module
class PluginField:
    """``trt.PluginField``: TensorRT's binding keeps the data array alive (TensorRT-LLM and dflash2_trt.plugins
    pass temporaries); TensorRT-RTX's does not (its fields read freed memory), so the placeholder registry gets
    fields that own a copy of their data."""

    def __init__(self, name="", data=None, type=None):
        self.name, self.type = name, type
        self.data = np.array(data).copy() if data is not None else np.zeros(0, np.int32)
        self.size = int(self.data.size)


class PluginFieldCollection(list):
    def __init__(self, fields=()):
        super().__init__(fields)


_LOCATIONS = {}


def _patch_itensor():
    """TensorRT 10's ITensor has a ``dtype`` setter and a ``location``; TensorRT-RTX (strongly typed only) has
    neither. ``Tensor.__init__`` sets both on every network input: the dtype setter here accepts only the tensor's
    own dtype (a change is refused, as strongly typed TensorRT refuses it) and the location is recorded per name."""
    cls = _rtx.ITensor
    if getattr(cls, "_placeholder_patched", False):
        return
    get_dtype = cls.__dict__["dtype"].fget

    def set_dtype(self, value):
        if value != get_dtype(self):
            raise ContractError(f"tensor '{self.name}': cannot change dtype {dtype_name(get_dtype(self))} -> "
                                f"{dtype_name(value)} (strongly typed network)")

    cls.dtype = property(get_dtype, set_dtype)
    cls.location = property(lambda self: _LOCATIONS.get(self.name, _rtx.TensorLocation.DEVICE),
                            lambda self, v: _LOCATIONS.__setitem__(self.name, v))
    cls._placeholder_patched = True


def make_module() -> types.ModuleType:
    """The ``tensorrt`` module TensorRT-LLM's sources import."""
    _patch_itensor()
    mod = types.ModuleType("tensorrt")
    for k in dir(_rtx):
        if not k.startswith("__"):
            setattr(mod, k, getattr(_rtx, k))
    mod.__version__ = _rtx.__version__
    import importlib.machinery

    mod.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    mod.__doc__ = "tensorrt_rtx with plugin placeholders (scripts/trtllm_conformance_lib/fake_trt.py)"
    mod.INetworkDefinition = PlaceholderNetwork
    mod.get_plugin_registry = lambda: REGISTRY
    mod.PluginField, mod.PluginFieldCollection = PluginField, PluginFieldCollection
    mod.IS_PLACEHOLDER_TENSORRT = True
    return mod
