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
    from ..yaml_files import load_yaml_file

    return load_yaml_file(CONTRACT)["runtime_binding"]


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


@functools.lru_cache(maxsize=1)
def _static_values() -> dict:
    from ..yaml_files import load_yaml_file

    return load_yaml_file(CONTRACT)["static_input_values"]


def layer_windows(net, pre: dict, max_seq_len: int) -> torch.Tensor:
    """The runtime's per-KV-layer attention window (``host_max_attention_window_sizes``: TensorRT-LLM's executor
    ``max_attention_window`` list, model.kv_layer_windows): max_seq_len, or a sliding layer's own window (the drafter's
    with ``drafter_window: model``, Muse Glimmer's sliding layers). The plugin reads it on the host."""
    cfg = net.api.PretrainedConfig.from_dict(pre)
    eng = pre.get("dflash2_engine") or {}
    return torch.tensor(net.kv_layer_windows(cfg, eng.get("drafter_window", "model"), int(max_seq_len)),
                        dtype=torch.int32)


def static_inputs(*, windows: torch.Tensor, pool_pointers: torch.Tensor, pool_mapping: torch.Tensor,
                  state_pointers: dict, all_reduce_workspace: torch.Tensor | None = None) -> dict:
    """What a runtime fills once (TensorRT-LLM: ``setStaticInputTensors``), for every execution path (the stand-in
    engines and the TensorRT session): the windows, the pool's pointer table and layer mapping, the sink length,
    perf knobs and context progress with TensorRT-LLM's values (engine_io.yaml ``static_input_values``: multi-block mode off,
    as ModelRunnerCpp sets it for EAGLE), the per-layer state pointers (``{name: int64 [1] CPU tensor}``) and, for a
    tp engine, the all-reduce workspace table."""
    s = _static_values()
    knobs = torch.full((s["host_runtime_perf_knobs"]["size"],), s["host_runtime_perf_knobs"]["fill"],
                       dtype=torch.int64)
    knobs[0] = s["host_runtime_perf_knobs"]["index_0"]
    out = {
        "host_max_attention_window_sizes": windows,
        "host_sink_token_length": torch.tensor(s["host_sink_token_length"], dtype=torch.int32),
        "host_kv_cache_pool_pointers": pool_pointers.to(torch.int64),
        "host_kv_cache_pool_mapping": pool_mapping.to(torch.int32),
        "host_runtime_perf_knobs": knobs,
        "host_context_progress": torch.tensor(s["host_context_progress"], dtype=torch.int64),
        **state_pointers,
    }
    if all_reduce_workspace is not None:
        out["all_reduce_workspace"] = all_reduce_workspace
    return out
