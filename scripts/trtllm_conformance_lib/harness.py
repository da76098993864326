"""Import shell around the real ``tensorrt_llm`` sources and the trtllm-build network-definition path
(documented in ``scripts/trtllm_conformance.py``)."""

from __future__ import annotations

import copy
import enum
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import traceback
import types
from pathlib import Path

from .build_steps import argv_value

REAL_FILES = [   # read from DIR/tensorrt_llm/<file>; everything else under tensorrt_llm is a stub below
    "_utils.py", "_common.py", "logger.py", "module.py", "parameter.py", "network.py", "functional.py",
    "mapping.py", "plugin/plugin.py", "layers/linear.py", "layers/normalization.py", "layers/embedding.py",
    "models/modeling_utils.py",
]


class HarnessError(RuntimeError):
    pass


def _mod(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__harness_stub__ = True
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = m
    return m


def _pkg(name, path=None, **attrs):
    m = _mod(name, **attrs)
    m.__path__ = [str(path)] if path else []
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    m.__spec__.submodule_search_locations = m.__path__
    return m


def _unused(what):
    def f(*a, **k):
        raise HarnessError(f"{what} is a harness stub (not on the network-definition path) and was called")
    return f


def _stub_class(what):
    return type(what.rsplit(".", 1)[-1], (), {"__init__": _unused(what), "__harness_stub__": True})


class _MPIComm:
    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Split_type(self, split_type=None, **_):
        return self

    def Barrier(self):
        pass


class QuantMode(enum.IntFlag):
    """Stub of tensorrt_llm.quantization.QuantMode: only the unquantized mode (0) is modelled."""
    NONE = 0

    @staticmethod
    def from_quant_algo(quant_algo=None, kv_cache_quant_algo=None):
        if quant_algo is not None or kv_cache_quant_algo is not None:
            raise HarnessError(f"quantization ({quant_algo}, {kv_cache_quant_algo}) is not modelled by the harness")
        return QuantMode(0)

    def _no(self, *a, **k):
        return False

    has_int8_kv_cache = has_fp8_kv_cache = has_fp4_kv_cache = has_kv_cache_quant = has_fp8_qdq = has_nvfp4 = _no
    has_act_and_weight_quant = has_per_group_scaling = is_weight_only = has_any_quant = _no


class QuantAlgo(str, enum.Enum):
    W8A16 = "W8A16"
    W4A16 = "W4A16"
    W4A16_AWQ = "W4A16_AWQ"
    W4A8_AWQ = "W4A8_AWQ"
    W8A8_SQ_PER_CHANNEL = "W8A8_SQ_PER_CHANNEL"
    FP8 = "FP8"
    FP8_PER_CHANNEL_PER_TOKEN = "FP8_PER_CHANNEL_PER_TOKEN"
    INT8 = "INT8"
    NVFP4 = "NVFP4"
    MIXED_PRECISION = "MIXED_PRECISION"


class KVCacheType(enum.IntEnum):
    CONTINUOUS = 0
    PAGED = 1
    DISABLED = 2


def install(src: Path):
    """Put the fake tensorrt, the stubs and the real source files into sys.modules. Idempotent per process."""
    src = Path(src)
    root = src / "tensorrt_llm"
    missing = [f for f in REAL_FILES if not (root / f).is_file()]
    if missing:
        raise HarnessError(f"{src}: missing TensorRT-LLM sources {missing} (expected DIR/tensorrt_llm/...)")
    if getattr(sys.modules.get("tensorrt_llm"), "__harness_src__", None) == str(src):
        return sys.modules["tensorrt_llm"]
    from .fake_trt import make_module

    sys.modules["tensorrt"] = make_module()
    # third-party modules the sources import at top level, absent here and off the definition path
    _pkg("mpi4py")
    sys.modules["mpi4py"].MPI = _mod("mpi4py.MPI", COMM_WORLD=_MPIComm(), COMM_TYPE_SHARED=0)
    # _utils.py (1.2.0rc2) wraps COMM_WORLD in mpi4py.util.pkl5.Intracomm at import; one rank per process here
    sys.modules["mpi4py"].util = _pkg("mpi4py.util")
    sys.modules["mpi4py.util"].pkl5 = _mod("mpi4py.util.pkl5", Intracomm=lambda comm: comm)
    _mod("nvtx", annotate=lambda *a, **k: __import__("contextlib").nullcontext(), mark=lambda *a, **k: None)
    _mod("onnx_graphsurgeon", Graph=_stub_class("onnx_graphsurgeon.Graph"))

    pkg = _pkg("tensorrt_llm", root)
    pkg.__harness_src__ = str(src)
    _mod("tensorrt_llm.envs", get_env=lambda name: {"TRTLLM_PRINT_STACKS_PERIOD": -1}.get(name))
    dt = enum.Enum("DataType", "FLOAT HALF BF16 INT64 INT32 INT8 BOOL FP8 UINT8 NVFP4")
    b = _pkg("tensorrt_llm.bindings", DataType=dt, GptJsonConfig=_stub_class("bindings.GptJsonConfig"),
             LayerType=enum.Enum("LayerType", "ATTENTION RECURRENT LINEAR NOOP"),
             MpiComm=types.SimpleNamespace(local_init=_unused("bindings.MpiComm.local_init")))
    b.BuildInfo = _mod("tensorrt_llm.bindings.BuildInfo", ENABLE_MULTI_DEVICE=False)
    b.executor = _mod("tensorrt_llm.bindings.executor",
                      RuntimeDefaults=_stub_class("bindings.executor.RuntimeDefaults"))
    b.internal = _pkg("tensorrt_llm.bindings.internal")
    b.internal.runtime = _mod("tensorrt_llm.bindings.internal.runtime",
                              lamport_initialize=_unused("lamport_initialize"),
                              lamport_initialize_all=_unused("lamport_initialize_all"),
                              max_workspace_size_lowprecision=_unused("max_workspace_size_lowprecision"))
    # mapping.py (1.2.0rc2): DeviceMeshTopology (the PyTorch backend's Ray mode, TLLM_DISABLE_MPI=1) derives from
    # _torch.device_mesh.DeviceMeshTopologyImpl; Mapping() is an MpiTopology here, so the base is a name only
    _pkg("tensorrt_llm._torch")
    _mod("tensorrt_llm._torch.device_mesh",
         DeviceMeshTopologyImpl=_stub_class("_torch.device_mesh.DeviceMeshTopologyImpl"))
    _mod("tensorrt_llm._ipc_utils", IpcMemory=_stub_class("IpcMemory"), can_access_peer=_unused("can_access_peer"))

    class _FLayerInfoMemo:   # graph_rewriting: functional records per-call metadata there (graph rewriting only)
        _inst = None
        cur_flayer = None

        @classmethod
        def instance(cls):
            cls._inst = cls._inst or cls()
            return cls._inst

        def remove(self, name):
            pass

        def get(self, name):
            return None

    _mod("tensorrt_llm.graph_rewriting", FLayerInfoMemo=_FLayerInfoMemo, record_signature=lambda f: f,
         Layer=_stub_class("graph_rewriting.Layer"))

    q = _pkg("tensorrt_llm.quantization", QuantMode=QuantMode, QuantAlgo=QuantAlgo)
    q.mode = _mod("tensorrt_llm.quantization.mode", QuantMode=QuantMode, QuantAlgo=QuantAlgo,
                  KV_CACHE_QUANT_ALGO_LIST=[QuantAlgo.FP8, QuantAlgo.INT8], QUANT_ALGO_LIST=list(QuantAlgo),
                  W8A8_SQ_PLUGIN_LIST=[])
    q.functional = _mod("tensorrt_llm.quantization.functional",
                        preprocess_weights_for_mixed_gemm=_unused("preprocess_weights_for_mixed_gemm"))
    q.layers = _mod("tensorrt_llm.quantization.layers", **{n: _stub_class(f"quantization.layers.{n}") for n in (
        "FP8Linear", "Fp8RowwiseFusedGatedMLP", "Fp8RowwiseGatedMLP", "WeightOnlyGroupwiseQuantLinear",
        "WeightOnlyGroupwiseQuantRowLinear", "WeightOnlyQuantLinear", "WeightOnlyQuantRowLinear")})
    q.utils = _pkg("tensorrt_llm.quantization.utils")
    q.utils.fp4_utils = _mod("tensorrt_llm.quantization.utils.fp4_utils")

    def quantize(model, quant_config):   # PretrainedModel.__post_init__: a no-op without quantization
        if quant_config.quant_algo is not None or quant_config.kv_cache_quant_algo is not None:
            raise HarnessError("quantized checkpoints are not modelled by the harness")
        return model

    q.quantize = _mod("tensorrt_llm.quantization.quantize", quantize=quantize, fp8_quantize=_unused("fp8_quantize"))
    _mod("tensorrt_llm.llmapi")
    _mod("tensorrt_llm.llmapi.kv_cache_type", KVCacheType=KVCacheType)
    _mod("tensorrt_llm.top_model_mixin", TopModelMixin=type("TopModelMixin", (), {}))

    # layers: the real linear / normalization / embedding; the package __init__ (which imports every layer family)
    # is replaced by this shell exporting what the network and modeling_utils import
    layers = _pkg("tensorrt_llm.layers", root / "layers")
    _mod("tensorrt_llm.layers.lora", LoraRuntimeParams=_stub_class("layers.lora.LoraRuntimeParams"),
         Lora=_stub_class("layers.lora.Lora"), Dora=_stub_class("layers.lora.Dora"),
         LoraParams=_stub_class("LoraParams"))
    _mod("tensorrt_llm.layers.attention", Attention=_stub_class("layers.attention.Attention"),
         BertAttention=_stub_class("layers.attention.BertAttention"),
         AttentionParams=_stub_class("AttentionParams"), KeyValueCacheParams=_stub_class("KeyValueCacheParams"))
    _mod("tensorrt_llm.layers.moe", MOE=_stub_class("layers.moe.MOE"), MoeOOTB=_stub_class("layers.moe.MoeOOTB"))
    _mod("tensorrt_llm.layers.conv", Conv2d=_stub_class("layers.conv.Conv2d"))

    def real(name):
        return importlib.import_module(name)

    real("tensorrt_llm._utils")
    # version skew between the stored revisions: _common.py (0fccc5b9) imports print_all_stacks, which the stored
    # _utils.py revisions (000a01de; b35ac1b6 = 1.2.0rc2) lack; only _common._init (plugin-library init, not called
    # here) uses it
    sys.modules["tensorrt_llm._utils"].__dict__.setdefault("print_all_stacks", _unused("_utils.print_all_stacks"))
    plugin = _pkg("tensorrt_llm.plugin", root / "plugin")
    pp = real("tensorrt_llm.plugin.plugin")
    for n in ("TRT_LLM_PLUGIN_NAMESPACE", "PluginConfig", "init_all_reduce_helper", "current_all_reduce_helper",
              "_load_plugin_lib", "CustomAllReduceHelper", "add_plugin_argument"):
        setattr(plugin, n, getattr(pp, n))
    for n in ("_common", "logger", "module", "network", "functional", "parameter", "mapping"):
        real(f"tensorrt_llm.{n}")
    lin, norm, emb = (real(f"tensorrt_llm.layers.{n}") for n in ("linear", "normalization", "embedding"))
    for m in (lin, norm, emb):
        for k, v in vars(m).items():
            if isinstance(v, type):
                setattr(layers, k, v)
    for n in ("MLP", "GatedMLP", "FusedGatedMLP", "FusedRgLru", "RgLru", "LoraParams", "AttentionParams",
              "KeyValueCacheParams"):
        if not hasattr(layers, n):
            setattr(layers, n, _stub_class(f"layers.{n}"))
    from tensorrt_llm._utils import str_dtype_to_trt

    pkg.str_dtype_to_trt = str_dtype_to_trt
    pkg.functional, pkg.layers, pkg.plugin = sys.modules["tensorrt_llm.functional"], layers, plugin

    models = _pkg("tensorrt_llm.models", root / "models")
    # MODEL_MAP shim: the real models/__init__.py imports every model family and maps TensorRT-LLM's own
    # architectures; none of them is a DFlash2 architecture, so the shim starts empty (register() fills it)
    models.MODEL_MAP = {}
    _mod("tensorrt_llm.models.convert_utils", weight_only_quantize_dict=_unused("weight_only_quantize_dict"))
    _mod("tensorrt_llm.models.generation_mixin", GenerationMixin=type("GenerationMixin", (), {}))
    mu = real("tensorrt_llm.models.modeling_utils")
    models.PretrainedConfig, models.PretrainedModel = mu.PretrainedConfig, mu.PretrainedModel
    pkg.models = models
    return pkg


# -------------------------------------------------------------------------------------------- the build path
NETWORKS = ("combined", "baseline")   # what `build --backend trtllm` hands trtllm-build; baseline: `--baseline`


def prepare_checkpoint(target: str, tp: int, workdir: Path, network: str = "combined"
                       ) -> tuple[Path, list[str], object]:
    """The derived checkpoint dflash2-trt's trtllm build gives trtllm-build (engine/trtllm/build.py): the converted
    checkpoint (engine/checkpoint.ensure_checkpoint) + config.json from pretrained.engine_pretrained_config, and the
    trtllm-build argv trtllm/command.trtllm_build_argv records. ``network`` "baseline": what ``build --baseline``
    hands its second trtllm-build (build.py _build_baseline): the same rank files, the config marked target-only
    (pretrained.baseline_pretrained_config), the argv with ``target_only=True`` (TargetOnlyForCausalLM, no
    speculative decoding mode, no --max_draft_len)."""
    from dflash2_trt.engine.checkpoint import ensure_checkpoint
    from dflash2_trt.engine.plan import prepare
    from dflash2_trt.engine.pretrained import baseline_pretrained_config, engine_pretrained_config
    from dflash2_trt.engine.trtllm.command import trtllm_build_argv
    from dflash2_trt.targets import get_target, resolve_dirs

    if network not in NETWORKS:
        raise HarnessError(f"network {network!r}: one of {NETWORKS}")
    baseline = network == "baseline"
    entry = get_target(target)
    ddir, tdir = resolve_dirs(entry)
    prep = prepare(ddir, tdir, target_key=target, overrides={"tp_size": tp})
    ck = workdir / f"{target}-tp{tp}.checkpoint"
    ensure_checkpoint(prep, ck)   # the second network of a (target, tp) reuses it after its manifest check
    bck = workdir / f"{target}-tp{tp}.{'baseline' if baseline else 'build'}-checkpoint"
    bck.mkdir(parents=True, exist_ok=True)
    pre = engine_pretrained_config(json.loads((ck / "config.json").read_text()), prep.cfg, prep.d)
    if baseline:
        pre = baseline_pretrained_config(pre)
    (bck / "config.json").write_text(json.dumps(pre, indent=2) + "\n")
    for r in range(tp):
        link = bck / f"rank{r}.safetensors"
        if not link.exists():
            link.symlink_to((ck / f"rank{r}.safetensors").resolve())
    argv = trtllm_build_argv(prep.cfg, checkpoint_dir=bck, output_dir=workdir / f"engine-{network}",
                             target_only=baseline)
    return bck, argv, prep


def plugin_config_from_argv(argv, dtype):
    """The PluginConfig trtllm-build makes from the recorded command line (the real PluginConfig class)."""
    from tensorrt_llm.plugin import PluginConfig

    pc = PluginConfig(dtype=dtype)
    for flag in ("gpt_attention_plugin", "gemm_plugin", "context_fmha", "use_paged_context_fmha",
                 "remove_input_padding", "tokens_per_block"):
        if f"--{flag}" in argv:
            v = argv_value(argv, f"--{flag}")
            setattr(pc, flag, int(v) if flag == "tokens_per_block" else v)
    if argv_value(argv, "--kv_cache_type") == "paged":
        pc.paged_kv_cache = True
    return pc


def define(model_file: Path, ckpt: Path, argv: list[str], rank: int, register: bool = True, build: bool = True,
           progress=None) -> dict:
    """trtllm-build's definition of one rank's network (commands/build.py -> builder.build, reproduced): config from
    the checkpoint through PretrainedConfig (MODEL_MAP), model_cls.from_checkpoint, a Network over TensorRT-RTX,
    prepare_inputs, forward, then an RTX engine build. Returns a report dict; raises nothing."""
    rep = {"rank": rank, "defined": False, "error": None, "stage": None}
    say = progress or (lambda msg: None)
    t0 = __import__("time").perf_counter()
    try:
        rep["stage"] = "load network file"
        from dflash2_trt.trtllm import backend

        # a fresh network per rank, as a fresh trtllm-build process would load it: the model class file loads the
        # network package for its backend (backend.load_network), which keeps one instance per process
        backend.forget("trtllm")
        spec = importlib.util.spec_from_file_location(f"dflash2_conformance_net_{os.getpid()}_{rank}", model_file)
        net_mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = net_mod
        with backend.using("trtllm"):
            spec.loader.exec_module(net_mod)
        # commands/build.py: the class is getattr(the loaded --model_cls_file, --model_cls_name) (facts
        # trtllm_build_cli.yaml model_cls_name_required): DFlash2ForCausalLM, or TargetOnlyForCausalLM for --baseline
        rep["model_cls_name"] = argv_value(argv, "--model_cls_name")
        model_cls = getattr(net_mod, rep["model_cls_name"])
        combined_cls = net_mod.DFlash2ForCausalLM
        import tensorrt_llm.models as tm
        from tensorrt_llm.models.modeling_utils import PretrainedConfig

        tm.MODEL_MAP.clear()
        if register:
            from dflash2_trt.trtllm.register import register as reg

            # `python -m dflash2_trt.trtllm.register` maps the architectures to the combined class for both
            # builds (the config class and MODEL_MAP lookups); the baseline's class comes from --model_cls_name
            reg(tm.MODEL_MAP, combined_cls)
            # register()'s own default (what `python -m dflash2_trt.trtllm.register` does) is the same class
            # object the model class file exposes, or TensorRT-LLM would build one class and load another
            rep["register_default_is_model_cls"] = all(v is combined_cls for v in reg({}).values())
        rep["stage"] = "PretrainedConfig.from_json_file (MODEL_MAP)"
        cfg = PretrainedConfig.from_json_file(str(ckpt / "config.json"))
        rank_cfg = copy.deepcopy(cfg)
        rank_cfg.set_rank(rank)
        import dflash2_trt.plugins as dp

        dp.load_library = lambda *a, **k: None   # the plugin library is not built here; placeholders stand in
        rep["stage"] = "from_checkpoint (model __init__ + load)"
        model = model_cls.from_checkpoint(str(ckpt), config=rank_cfg)
        # builder.build(model, build_config) before the network (build_steps.py / trtllm_build_steps.yaml)
        from . import build_steps

        steps = []
        rep["build_steps"] = steps
        rep["stage"] = "builder.build: build_config adjustments"
        pc = plugin_config_from_argv(argv, model.config.dtype)
        bc = build_steps.build_config_from_argv(argv, model.config, pc, steps)
        rep["build_config"] = {k: bc[k] for k in ("max_seq_len", "max_num_tokens", "opt_num_tokens", "max_input_len")}
        rep["stage"] = "builder.optimize_model_with_config"
        model = build_steps.optimize_model_with_config(model, pc, steps)
        rep["stage"] = "network"
        import tensorrt as trt
        import tensorrt_rtx as rtx
        from tensorrt_llm.network import Network, net_guard

        logger = collecting_logger()
        rep["_logger"] = logger
        builder = rtx.Builder(logger)
        real_net = builder.create_network(1 << int(rtx.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        pnet = trt.INetworkDefinition(real_net)
        network = Network()._init(pnet)
        network.plugin_config = pc
        # builder.build: nccl_plugin = dtype if world_size > 1 else None
        network.plugin_config.set_nccl_plugin(model.config.dtype if rank_cfg.mapping.world_size > 1 else None)
        steps.append({"step": "set_nccl_plugin", "nccl_plugin": network.plugin_config.nccl_plugin})
        with net_guard(network):
            network.set_named_parameters(model.named_parameters())
            rep["stage"] = "prepare_inputs"
            inputs = model.prepare_inputs(**build_steps.prepare_input_args(bc))
            steps.append({"step": "prepare_inputs", "inputs": real_net.num_inputs})
            rep["stage"] = "forward"
            model(**inputs)
            steps.append({"step": "forward", "layers": real_net.num_layers})
        rep["stage"] = "graph_rewriting.optimize"
        rep["graph_rewrites"] = build_steps.fuse_attention_with_bias_matches(real_net, pnet, steps)
        rep["stage"] = "Builder._add_optimization_profile"
        rep["profiles"] = build_steps.optimization_profiles(network, steps)
        rep["allreduce_strategies"] = sorted(set(pnet.allreduce_strategies))
        rep["defined"] = True
        rep["layers"] = real_net.num_layers
        rep["network_layers"] = real_net.num_layers - pnet.placeholder_layers   # without the placeholders' insides
        rep["inputs"] = real_net.num_inputs
        rep["outputs"] = real_net.num_outputs
        rep["output_names"] = [real_net.get_output(i).name for i in range(real_net.num_outputs)]
        # the engine's outputs as TensorRT named them against the contract the runtime binds (engine_io.yaml):
        # a tensor marked under two names, or an output never marked, is a name missing here
        from dflash2_trt.trtllm.engine_io import load_contract

        want = [o.name for o in load_contract()["outputs"]]
        rep["missing_outputs"] = [n for n in want if n not in rep["output_names"]]
        rep["extra_outputs"] = [n for n in rep["output_names"] if n not in want]
        rep["input_signature"] = [_signature(real_net.get_input(i)) for i in range(real_net.num_inputs)]
        rep["output_signature"] = [_signature(real_net.get_output(i)) for i in range(real_net.num_outputs)]
        rep["layer_digest"] = _layer_digest(real_net)
        rep["plugin_layers"] = len(pnet.placeholders)
        counts = {}
        for t, _, _ in pnet.placeholders:
            counts[t] = counts.get(t, 0) + 1
        rep["plugins"] = counts
        rep["gpt_attention_bindings"] = pnet.gpt_attention_bindings
        from .fake_trt import dead_plugins

        rep["dead_plugins"] = dead_plugins(pnet)     # calls TensorRT would remove: no output depends on them
        rep["warnings"] = sorted(set(w.split(": ", 1)[1] for w in pnet.warnings))
        rep["define_seconds"] = round(__import__("time").perf_counter() - t0, 1)
        say(f"rank {rank}: defined in {rep['define_seconds']} s ({rep['layers']} layers)")
        if not build:
            rep["stage"] = "done (no build)"
            raise _NoBuild
        rep["stage"] = "TensorRT-RTX build"
        network._fill_weights()
        bcfg = builder.create_builder_config()
        bcfg.builder_optimization_level = int(os.environ.get("DFLASH2_CONFORMANCE_OPT_LEVEL", "0"))
        for p in network._generate_optimization_profiles():
            bcfg.add_optimization_profile(p)
        plan = builder.build_serialized_network(real_net, bcfg)
        rep["built"] = plan is not None
        rep["engine_bytes"] = plan.nbytes if plan is not None else 0
        if plan is None:
            rep["error"] = "TensorRT-RTX build_serialized_network returned None (see TensorRT errors above)"
        rep["build_seconds"] = round(__import__("time").perf_counter() - t0 - rep["define_seconds"], 1)
        say(f"rank {rank}: RTX build {'OK' if rep['built'] else 'FAILED'} in {rep['build_seconds']} s")
        rep["stage"] = "done"
    except _NoBuild:
        pass
    except BaseException as exc:   # noqa: BLE001 - the report carries the first error
        if isinstance(exc, KeyboardInterrupt):
            raise
        tb = traceback.extract_tb(exc.__traceback__)
        rep["error"] = f"{type(exc).__name__}: {exc}"
        rep["traceback"] = [f"{Path(f.filename).name}:{f.lineno} {f.name}: {(f.line or '').strip()}" for f in tb[-8:]]
    logger = rep.pop("_logger", None)
    if logger is not None and logger.errors:
        rep["tensorrt_errors"] = logger.errors[:5]
        if rep["error"]:
            rep["error"] += f" [TensorRT: {logger.errors[0]}]"
    return rep


class _NoBuild(Exception):
    pass


def _signature(t) -> list:
    """[name, dtype, shape] of a network input or output (-1 for a dynamic dimension)."""
    return [t.name, str(t.dtype).rsplit(".", 1)[-1], [int(x) for x in t.shape]]


def _layer_digest(real_net) -> str:
    """SHA-256 over every layer in order: its type, the module path of its name, where each of its inputs comes from
    (a network input by name, or producer layer and output index), each output's dtype and shape, and a constant's
    values. Two definitions with the same digest built the same graph, layer for layer. TensorRT-LLM names a layer
    ``<module path>/<function>_L<line>/.../<TYPE_OP>_<n>`` (Network._set_layer_name): the Python frames and the
    counter depend on where the network's code sits in its files, so they are left out; the TYPE_OP stays."""
    import hashlib
    import re

    import numpy as np
    import tensorrt_rtx as rtx

    def module_path(name):
        parts = [p for p in name.split("/") if not re.search(r"_L\d+$", p)]
        if parts:
            parts[-1] = re.sub(r"_\d+$", "", parts[-1])
        return "/".join(parts)

    producer = {real_net.get_input(i).name: f"input:{real_net.get_input(i).name}" for i in range(real_net.num_inputs)}
    h = hashlib.sha256()
    for i in range(real_net.num_layers):
        layer = real_net.get_layer(i)
        ins = []
        for k in range(layer.num_inputs):
            t = layer.get_input(k)
            ins.append(None if t is None else producer.get(t.name, "?"))
        outs = []
        for j in range(layer.num_outputs):
            o = layer.get_output(j)
            producer[o.name] = f"{i}:{j}"
            outs.append([str(o.dtype), [int(x) for x in o.shape]])
        values = None
        if layer.type == rtx.LayerType.CONSTANT:
            layer.__class__ = rtx.IConstantLayer
            w = np.asarray(layer.weights)
            values = [str(w.dtype), list(w.shape), hashlib.sha256(w.tobytes()).hexdigest()]
        h.update(json.dumps([str(layer.type), module_path(layer.name), ins, outs, values]).encode())
    return h.hexdigest()


def _make_logger_class():
    import tensorrt_rtx as rtx

    class CollectingLogger(rtx.ILogger):
        """TensorRT messages of severity ERROR and worse, kept for the report (not printed)."""

        def __init__(self):
            rtx.ILogger.__init__(self)
            self.errors = []

        def log(self, severity, msg):
            if severity <= rtx.ILogger.Severity.ERROR and "CUDA driver version is insufficient" not in msg:
                self.errors.append(msg.strip())

    return CollectingLogger


def collecting_logger():
    """A TensorRT-RTX logger that keeps the ERROR messages (``.errors``) instead of printing them."""
    global _LOGGER_CLS
    if _LOGGER_CLS is None:
        _LOGGER_CLS = _make_logger_class()
    return _LOGGER_CLS()


_LOGGER_CLS = None
