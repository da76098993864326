"""TensorRT-LLM's own trtllm-build (``tensorrt_llm/commands/build.py`` ``main`` -> ``parallel_build`` ->
``build_model`` -> ``builder.build`` -> ``Builder.build_engine`` -> ``Engine.save``) run as dflash2-trt runs it
(``python -m dflash2_trt.trtllm.register`` + the recorded argv), over the conformance harness's TensorRT-LLM sources
and TensorRT-RTX. Needs, beyond the harness's files, DIR/tensorrt_llm/commands/build.py and DIR/tensorrt_llm/builder.py.

Real here: the argument parsing, PluginConfig.from_arguments / validate, BuildConfig.from_dict, PretrainedConfig,
the model class file load (SourceFileLoader), from_checkpoint, every adjustment of builder.build, optimize_model,
Builder.create_builder_config / create_network / _add_optimization_profile / build_engine (weights named and filled),
Engine.save (config.json and rank<r>.engine). What :func:`install` puts in place of what cannot run here (each listed
in the report's ``stand_ins``): the harness's stubs, plus

- ``trt.Builder``: TensorRT-RTX's, its networks wrapped with the plugin placeholders as the harness's define() wraps
  them (``trt.__version__`` is RTX's 1.7, so builder.py's TensorRT >= 10.6 branches are off: monitor_memory only);
  with ``build=False`` build_serialized_network returns placeholder bytes instead of an RTX build, with ``build=True``
  the builder optimization level is $DFLASH2_CONFORMANCE_OPT_LEVEL (default 0) instead of TensorRT's default;
- the machine: an SM 90 GPU (``get_sm_version`` 90; torch's CUDA device count 1, set_device a no-op);
- the DFlash2 plugin library: ``dflash2_trt.plugins.load_library`` is a no-op (not built here; the DFlash2 plugin
  calls reach the placeholders);
- modules not on disk: lora_helper.LoraConfig / lora_manager.LoraManager (no LoRA: the defaults only),
  version.__version__, bindings.KVCacheType (a C++ enum: the recorded names, from_string upper-cases),
  graph_rewriting.optimize (a no-op here: its one pass's match rule is checked on the same networks by
  scripts/trtllm_conformance.py, not by this path), psutil (a memory log line), QuantMode's remaining predicates (all
  False: unquantized).

:func:`run` (the script) also sets DFLASH2_TRT_BACKEND=trtllm, which ``build`` passes trtllm-build in its env; under
``build`` (:func:`trtllm_build`) the variable comes from the caller.
"""

from __future__ import annotations

import enum
import importlib
import json
import os
import sys
import types
from pathlib import Path

from . import harness
from .build_steps import argv_value

BUILD_FILES = ("commands/build.py", "builder.py")
VERSION = "1.2.0"


def _module(name: str, **attrs) -> types.ModuleType:
    """A stand-in module registered under ``name``, with a module spec (the harness's stubs have none): transformers
    asks ``importlib.util.find_spec("psutil")``, which refuses a module in sys.modules without one."""
    import importlib.machinery

    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


class KVCacheType(enum.IntEnum):
    """The C++ binding's enum (trtllm_build_cli.yaml kv_cache_type_values); from_string upper-cases its argument."""
    CONTINUOUS = 0
    PAGED = 1
    DISABLED = 2

    @classmethod
    def from_string(cls, s):
        return cls[s.upper()]


class _LoraConfig:
    """lora_helper.LoraConfig without LoRA: its default fields, model_dump as BuildConfig.to_dict calls it."""
    FIELDS = {"lora_dir": [], "lora_ckpt_source": "hf", "max_lora_rank": 64, "lora_target_modules": [],
              "trtllm_modules_to_hf_modules": {}}

    def __init__(self, **kw):
        for k, v in {**self.FIELDS, **kw}.items():
            setattr(self, k, v)

    def model_dump(self):
        return {k: getattr(self, k) for k in self.FIELDS}


def install(src: Path, build: bool = True) -> dict:
    """The harness's modules plus the stand-ins above. Returns a dict the caller reads after the run: ``calls`` (what
    reached the stand-ins) and ``stand_ins``."""
    src = Path(src)
    missing = [f for f in BUILD_FILES if not (src / "tensorrt_llm" / f).is_file()]
    if missing:
        raise harness.HarnessError(f"{src}: missing TensorRT-LLM sources {missing} (expected DIR/tensorrt_llm/...)")
    harness.install(src)
    import tensorrt as trt
    import tensorrt_rtx as rtx
    import torch

    engine = ("builder_optimization_level $DFLASH2_CONFORMANCE_OPT_LEVEL (default 0)" if build
              else "placeholder engine bytes (no RTX build)")
    state = {"calls": [], "loggers": [],
             "stand_ins": ["trt.Builder (TensorRT-RTX + plugin placeholders)", engine, "get_sm_version = 90",
                           "torch.cuda.device_count = 1", "dflash2_trt.plugins.load_library (no-op)",
                           "LoraConfig / LoraManager (no LoRA)", "bindings.KVCacheType",
                           "graph_rewriting.optimize (no-op)", "psutil", f"version {VERSION}"]}
    sys.modules["tensorrt_llm.bindings"].KVCacheType = KVCacheType
    _module("tensorrt_llm.lora_helper", LoraConfig=_LoraConfig)
    _module("tensorrt_llm.lora_manager", LoraManager=type("LoraManager", (), {"LORA_MODULE_IDS": {}}))
    _module("tensorrt_llm.version", __version__=VERSION)
    sys.modules["tensorrt_llm.graph_rewriting"].optimize = lambda net: state["calls"].append("graph_rewriting.optimize")
    mem = types.SimpleNamespace(rss=0)
    _module("psutil", Process=lambda *a: types.SimpleNamespace(memory_info=lambda: mem, children=lambda **k: []))
    q = harness.QuantMode
    for n in ("is_int8_weight_only", "is_int4_weight_only", "has_per_channel_scaling", "has_per_token_dynamic_scaling",
              "has_act_or_weight_quant", "is_qserve_w4a8", "has_fp8_rowwise"):
        setattr(q, n, lambda self, *a, **k: False)

    class PlaceholderBuilder:
        def __init__(self, logger):   # builder.build makes one per rank: every rank's errors are kept
            self.logger = harness.collecting_logger()
            state["loggers"].append(self.logger)
            self._b = rtx.Builder(self.logger)

        def create_network(self, flags=0):
            state["calls"].append("create_network")
            return trt.INetworkDefinition(self._b.create_network(flags))

        def build_serialized_network(self, network, config):
            state["calls"].append("build_serialized_network")
            state["optimization_profiles"] = config.num_optimization_profiles
            if not build:
                return b"dflash2-trt conformance: placeholder engine bytes (no TensorRT-RTX build)"
            config.builder_optimization_level = int(os.environ.get("DFLASH2_CONFORMANCE_OPT_LEVEL", "0"))
            return self._b.build_serialized_network(getattr(network, "real", network), config)

        def __getattr__(self, name):
            return getattr(self._b, name)

    trt.Builder = PlaceholderBuilder
    torch.cuda.device_count = lambda: 1
    torch.cuda.set_device = lambda *a, **k: None
    importlib.import_module("tensorrt_llm.builder")
    importlib.import_module("tensorrt_llm.commands.build")
    for m in list(sys.modules.values()):
        if getattr(m, "__name__", "").startswith("tensorrt_llm") and hasattr(m, "get_sm_version"):
            m.get_sm_version = lambda: 90
    # submodules the sources use as attributes (modeling_utils: safetensors.torch; parameter.py:
    # torch.distributed.tensor.DTensor), which TensorRT-LLM's real package __init__ has imported by then
    for name in ("safetensors.torch", "torch.distributed.tensor"):
        importlib.import_module(name)
    import dflash2_trt.plugins as dp

    dp.load_library = lambda *a, **k: None   # the plugin library is not built here; placeholders stand in
    return state


def run(src: Path, target: str, tp: int, network: str, workdir: Path, build: bool = True) -> dict:
    """One trtllm-build of ``target`` at ``tp`` (``network`` combined or baseline) into ``workdir``: the report with
    the argv, the engine directory's files and its config.json."""
    os.environ["DFLASH2_TRT_BACKEND"] = "trtllm"   # what `build` puts in trtllm-build's env
    ckpt, argv, _ = harness.prepare_checkpoint(target, tp, Path(workdir), network)
    # argv = [python, -m, dflash2_trt.trtllm.register, ...flags]; TensorRT errors are reported, not raised
    state = trtllm_build(src, argv[3:], build=build, check=False)
    out = Path(argv_value(argv, "--output_dir"))
    return {"target": target, "tp": tp, "network": network, "argv": argv[3:], "built": build,
            "files": sorted(p.name for p in out.iterdir()), "config": json.loads((out / "config.json").read_text()),
            "calls": state["calls"], "optimization_profiles": state.get("optimization_profiles"),
            "tensorrt_errors": tensorrt_errors(state), "stand_ins": state["stand_ins"]}


def tensorrt_errors(state: dict) -> list[str]:
    """TensorRT's ERROR messages of every builder (one per rank), the first five."""
    return [e for lg in state["loggers"] for e in lg.errors][:5]


def trtllm_build(src: Path, flags: list[str], build: bool = False, check: bool = True) -> dict:
    """``python -m dflash2_trt.trtllm.register FLAGS`` over the real sources (the stand-ins of :func:`install`): what a
    runner of ``dflash2-trt build --backend trtllm`` can call in place of the command line it records. ``check``: a
    TensorRT error logged by any rank's builder is raised (with placeholder bytes the build itself cannot fail)."""
    state = install(src, build=build)
    from dflash2_trt.trtllm import register

    register.main(list(flags))
    if check and (errors := tensorrt_errors(state)):
        raise RuntimeError(f"TensorRT errors during trtllm-build: {errors}")
    return state
