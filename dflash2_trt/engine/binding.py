"""Binding a step's feed to an engine's inputs by TensorRT-LLM's runtime rules, shared by every execution path.

``TllmRuntime::setInputTensorsImpl`` (engine_io.yaml ``runtime_binding``, with its source) walks the ENGINE's inputs:
each one must be in the map the runtime hands over, with the engine's data type and a shape inside the input's
optimization profile 0; names that are not engine inputs are never looked at. :func:`bind` applies that walk with
the recorded messages (a dtype named as torch names it, where TensorRT-LLM prints TensorRT's type code).

The stand-in engines (``engine/standin/engine.py``: cpu and cuda) bind every step with it against the network's
declared inputs; the TensorRT path (:mod:`.trtllm.session`) binds with it against the inputs as TensorRT reports
them.
"""

from __future__ import annotations

import functools

import torch

from ..trtllm.cpu.functional import str_dtype_to_torch
from ..trtllm.engine_io import CONTRACT


@functools.lru_cache(maxsize=1)
def binding_rules() -> dict:
    import yaml

    return yaml.safe_load(CONTRACT.read_text(encoding="utf-8"))["runtime_binding"]


def dims(shape) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ")"


def bind(declared: dict, feed: dict) -> dict:
    """``declared``: engine input name -> a declaration with ``dtype`` (a dtype name), ``shape`` (-1 = dynamic) and
    ``profiles[0]`` (``(min, opt, max)`` per dimension); ``feed``: name -> tensor. Returns the feed restricted to
    the engine's inputs, in the engine's order; raises RuntimeError with the runtime's message."""
    rules = binding_rules()
    bound = {}
    for name, d in declared.items():
        if name not in feed:
            raise RuntimeError(rules["missing"].format(name=name, shape=dims(d.shape)))
        t = feed[name]
        want = str_dtype_to_torch(d.dtype)
        if not isinstance(t, torch.Tensor) or t.dtype != want:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise RuntimeError(rules["dtype"].format(name=name, expected=want, provided=got))
        ranges = d.profiles[0]
        lo, hi = [r[0] for r in ranges], [r[2] for r in ranges]
        if t.dim() != len(ranges) or any(not a <= s <= b for s, a, b in zip(t.shape, lo, hi)):
            raise RuntimeError(rules["shape"].format(name=name, shape=dims(t.shape), min=dims(lo), max=dims(hi)))
        bound[name] = t
    return bound
