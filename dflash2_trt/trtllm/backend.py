"""Which ``tensorrt_llm`` the network is written against: the real one, or the CPU stand-in.

The network (the package ``network/``) is ONE code base for both backends. Each of its modules takes every
TensorRT-LLM name it uses from the namespace :func:`current` returns:

- ``trtllm``: TensorRT-LLM 1.2 itself (``tensorrt_llm.functional``, ``.layers``, ``.module``,
  ``.models.modeling_utils``, ``Mapping``) — what ``trtllm-build --model_cls_file`` sees.
- ``cpu``: :mod:`dflash2_trt.trtllm.cpu`, a torch stand-in with the same names and argument
  lists, executed eagerly (see that package's docstrings for what it implements).
- ``cuda``: the same stand-in on CUDA tensors (the engine's device is set per step, ``cpu.tensor.on_device``), with
  the plugins' CUDA kernels in place of their CPU builds (``plugin_layers.CudaPlugins``). Not a TensorRT engine.

Two things the backends cannot share by name are wrapped here: declaring an engine input
(``input_tensor``: ``functional.Tensor(name=..., dim_range=...)`` vs a recorded declaration) and
marking an output (``mark_output``: ``Tensor.mark_output`` vs a recorded tensor). The DFlash2
plugin layers are :mod:`.plugin_layers` (TensorRT plugin vs the plugins' CPU builds).

Selection: ``DFLASH2_TRT_BACKEND=cpu|cuda|trtllm|auto`` (default ``auto``: ``trtllm`` where
``tensorrt_llm`` imports, else ``cuda`` where torch sees a CUDA GPU, else ``cpu``), or :func:`load_network` for an
explicit backend.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

from ..errors import ConfigError, MissingDependencyError

BACKENDS = ("cpu", "cuda", "trtllm")
STANDIN_BACKENDS = ("cpu", "cuda")
"""The backends that execute the network with the torch stand-in (engine directories of weights, run by the
project's runtime)."""
_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("dflash2_backend", default=None)
_cache: dict[str, SimpleNamespace] = {}


def _cpu(name: str = "cpu") -> SimpleNamespace:
    from . import plugin_layers
    from .cpu import functional, layers, modeling_utils, module
    from .cpu.attention import AttentionMaskType, PositionEmbeddingType
    from .cpu.mapping import Mapping

    return SimpleNamespace(
        name=name, functional=functional, layers=layers, Module=module.Module, ModuleList=module.ModuleList,
        Parameter=module.Parameter, Mapping=Mapping, PretrainedConfig=modeling_utils.PretrainedConfig,
        PretrainedModel=modeling_utils.PretrainedModel, AttentionMaskType=AttentionMaskType,
        PositionEmbeddingType=PositionEmbeddingType, input_tensor=modeling_utils.input_tensor,
        mark_output=modeling_utils.mark_output, all_reduce_workspace=modeling_utils.all_reduce_workspace,
        plugins=plugin_layers.CudaPlugins() if name == "cuda" else plugin_layers.CpuPlugins())


def _trtllm() -> SimpleNamespace:  # pragma: no cover - needs TensorRT-LLM (GPU machines)
    try:
        import tensorrt_llm
        from tensorrt_llm import functional, layers
        from tensorrt_llm.functional import AttentionMaskType, PositionEmbeddingType, Tensor
        from tensorrt_llm.mapping import Mapping
        from tensorrt_llm.models.modeling_utils import PretrainedConfig, PretrainedModel
        from tensorrt_llm.module import Module, ModuleList
        from tensorrt_llm.parameter import Parameter
    except ImportError as exc:
        from ..transformers_support import tensorrt_llm_import_failure

        raise MissingDependencyError(f"{tensorrt_llm_import_failure(exc)}; or use --backend cpu") from None
    from . import plugin_layers

    def input_tensor(name, dtype, shape, dim_range=None):
        return Tensor(name=name, dtype=tensorrt_llm.str_dtype_to_trt(dtype), shape=list(shape), dim_range=dim_range)

    def mark_output(tensor, name, dtype=None):
        tensor.mark_output(name, dtype)

    def all_reduce_workspace(mapping, num_profiles):
        # what TensorRT-LLM's own prepare_inputs do for tp > 1: the all-reduce plugins then take this input
        from tensorrt_llm.plugin import current_all_reduce_helper

        current_all_reduce_helper().set_workspace_tensor(mapping, num_profiles)
        return current_all_reduce_helper().workspace

    return SimpleNamespace(
        name="trtllm", functional=functional, layers=layers, Module=Module, ModuleList=ModuleList,
        Parameter=Parameter, Mapping=Mapping, PretrainedConfig=PretrainedConfig, PretrainedModel=PretrainedModel,
        AttentionMaskType=AttentionMaskType, PositionEmbeddingType=PositionEmbeddingType, input_tensor=input_tensor,
        mark_output=mark_output, all_reduce_workspace=all_reduce_workspace, plugins=plugin_layers.TrtPlugins())


def resolve(name: str | None = None) -> str:
    name = name or _forced.get() or os.environ.get("DFLASH2_TRT_BACKEND", "auto")
    if name == "auto":
        if importlib.util.find_spec("tensorrt_llm") is not None:
            return "trtllm"
        return "cuda" if cuda_available() else "cpu"
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; expected auto, {', '.join(BACKENDS)}",
                          field="DFLASH2_TRT_BACKEND")
    return name


def cuda_free_bytes(device) -> int:
    """The bytes free on ``device`` for a new allocation, as a KV pool is sized (TensorRT-LLM's free-memory fraction):
    torch's cached, unused blocks given back first, which CUDA counts as used (an engine closed before another opens,
    as bench run's speculative TensorRT session before its baseline; a target-only engine's dropped drafter
    tensors)."""
    import torch

    torch.cuda.empty_cache()
    return int(torch.cuda.mem_get_info(device)[0])


def cuda_available() -> bool:
    """torch sees a CUDA GPU (what ``auto`` and the cuda backend ask)."""
    import torch

    return bool(torch.cuda.is_available())


def current(name: str | None = None) -> SimpleNamespace:
    name = resolve(name)
    if name not in _cache:
        _cache[name] = _trtllm() if name == "trtllm" else _cpu(name)
    return _cache[name]


@contextlib.contextmanager
def using(name: str):
    tok = _forced.set(resolve(name))
    try:
        yield current()
    finally:
        _forced.reset(tok)


def forget(backend: str) -> None:
    """Drop this process's cached namespace and network instance of ``backend``: the next :func:`current` /
    :func:`load_network` builds them afresh, as a new process would (the conformance harness does this per rank)."""
    name = resolve(backend)
    _cache.pop(name, None)
    _drop_network(f"dflash2_trt_network_{name}")


def _drop_network(name: str) -> None:
    """Remove the network package instance ``name`` and every module of it from ``sys.modules``."""
    for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[k]


MODEL_FILE = Path(__file__).resolve().parent / "model.py"
"""The model class file ``trtllm-build --model_cls_file`` takes (it loads the network package for its backend)."""
NETWORK_PACKAGE = Path(__file__).resolve().parent / "network"
"""The network package (:mod:`dflash2_trt.trtllm.network`'s folder), loaded once per backend by :func:`load_network`."""


def load_network(backend: str) -> ModuleType:
    """The network package bound to ``backend``: ``network/`` imported as ``dflash2_trt_network_<backend>`` (its
    modules as ``dflash2_trt_network_<backend>.<module>``), every module while ``using(backend)`` is active; one
    instance per backend and process."""
    name = f"dflash2_trt_network_{resolve(backend)}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, NETWORK_PACKAGE / "__init__.py",
                                                  submodule_search_locations=[str(NETWORK_PACKAGE)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod   # before exec: the package's relative imports and dataclasses look it up there
    try:
        with using(backend):
            spec.loader.exec_module(mod)
    except BaseException:
        _drop_network(name)
        raise
    return mod
