"""Binding a step's inputs to a CPU engine by the rules of TensorRT-LLM's C++ runtime.

``TllmRuntime::setInputTensorsImpl`` (engine_io.yaml ``runtime_binding``, with its source) walks the engine's
inputs: each one must be in the map the runtime hands over, with the engine's data type and a shape inside the
input's optimization profile; names that are not engine inputs are never looked at. The CPU engine applies the same
walk to its feed and passes the network only the engine's inputs, so a runtime feed that TensorRT-LLM's runtime
would refuse (a missing input, an int64 where the engine takes int32, a batch beyond the profile) fails here too,
with TensorRT-LLM's message (a dtype named as torch names it, where TensorRT-LLM prints TensorRT's type code).
"""

from __future__ import annotations

import functools

import torch

from ...trtllm.cpu.functional import str_dtype_to_torch
from ...trtllm.engine_io import CONTRACT


@functools.lru_cache(maxsize=1)
def _rules() -> dict:
    import yaml

    return yaml.safe_load(CONTRACT.read_text(encoding="utf-8"))["runtime_binding"]


def _shape(dims) -> str:
    return "(" + ", ".join(str(int(d)) for d in dims) + ")"


def bind(declared: dict, feed: dict) -> dict:
    """``declared``: engine input name -> InputDecl (one optimization profile); ``feed``: name -> tensor.
    Returns the feed restricted to the engine's inputs; raises RuntimeError with the runtime's message."""
    rules = _rules()
    bound = {}
    for name, d in declared.items():
        if name not in feed:
            raise RuntimeError(rules["missing"].format(name=name, shape=_shape(d.shape)))
        t = feed[name]
        want = str_dtype_to_torch(d.dtype)
        if not isinstance(t, torch.Tensor) or t.dtype != want:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise RuntimeError(rules["dtype"].format(name=name, expected=want, provided=got))
        ranges = d.profiles[0]          # min, opt, max per dimension (a static one: its size three times)
        lo, hi = [r[0] for r in ranges], [r[2] for r in ranges]
        if t.dim() != len(ranges) or any(not a <= s <= b for s, a, b in zip(t.shape, lo, hi)):
            raise RuntimeError(rules["shape"].format(name=name, shape=_shape(t.shape), min=_shape(lo),
                                                     max=_shape(hi)))
        bound[name] = t
    return bound
