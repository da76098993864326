"""Can a step of the cuda engine be held by a CUDA graph? The check, on any machine: the step run on the ``meta`` device.

A CUDA graph records a step's device work once and replays it. That only holds if the step, once warm, never
reads a device value on the host (``.item()``, ``int(t)``, ``.cpu()``, a ``nonzero`` or a boolean mask: each waits
for the stream, which a capture refuses) and never copies host memory to the device inside the step (a copy from
pageable memory cannot be captured; a shape computed on the host must become the device constant of its value).
What the runtime hands the engine (the feed) is placed before the step, as TensorRT-LLM binds its inputs before
``execute_async_v3``; an unchanged feed is not copied again (``placed_inputs``).

:func:`check_step` runs one step of the cuda backend's very code (the network, the stand-in's operations, the
plugin layers' placement and outputs, ``CudaPlugins``) with every device tensor on the ``meta`` device: tensors
with shapes and dtypes and no values. A host read of a device value fails there (PyTorch has no value to give), a
host-to-device copy is seen by a dispatch hook, and the plugins' library is its Python side without kernels
(:class:`~dflash2_trt.trtllm.cuda.plugin_lib.ShapeOnlyPluginLib`). So a step that passes has no host
synchronisation and no host-to-device copy, and its shapes follow from host inputs alone (which a replay needs:
the graph's shapes are fixed). It does NOT show that CUDA accepts the capture: the kernels' own launches, the
allocator and the driver are not exercised; ``bench steps`` does that on a GPU (``graph_ms`` / ``graph_error``).
Not seen either: a ``torch.tensor(data, device=...)`` made from Python values (no operator is dispatched for its
copy; the stand-in makes its constants with :func:`~dflash2_trt.trtllm.cpu.tensor.scalar` instead); an op that
indexes a device tensor with a CPU index (meta accepts it; CUDA copies the index); copies made by another thread
(so an engine stepping several ranks as threads is refused); and a one-value CPU tensor derived from a host input,
which ``align`` would turn into a constant (the network derives none: every host input it reads on the device was
checked to be absent).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...errors import NumericsError
from ..format import load_engine_dir
from .engine import StandinEngine, input_memory, limits_from

_HERE = Path(__file__).resolve().parents[2]          # the dflash2_trt package


def _site(stack) -> str:
    """Where in the project's code: the innermost frame, then the innermost two outside the stand-in's own operations
    (the network's line that asked for it), as ``path:line`` from the package."""
    frames = [f for f in stack if f.filename.startswith(str(_HERE)) and not f.filename.endswith("capture.py")]
    if not frames:
        return "?"
    callers = [f for f in frames[:-1] if "trtllm/cpu/" not in f.filename][-2:]
    return " <- ".join(f"{Path(f.filename).relative_to(_HERE)}:{f.lineno}" for f in [frames[-1], *callers[::-1]])


class _HostToDevice(TorchDispatchMode):
    """Records every operator that copies a CPU tensor to another device (``_to_copy``, ``copy_``)."""

    def __init__(self):
        super().__init__()
        self.copies: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        src = dst = None
        if func is torch.ops.aten._to_copy.default:
            src, dst = args[0], kwargs.get("device") or args[0].device
        elif func is torch.ops.aten.copy_.default:
            src, dst = args[1], args[0].device
        if isinstance(src, torch.Tensor) and src.device.type == "cpu" and torch.device(dst).type != "cpu":
            self.copies.append(f"{name} of a CPU tensor {list(src.shape)} {src.dtype} to {dst} at "
                               f"{_site(traceback.extract_stack())}")
        return func(*args, **kwargs)


@dataclass
class StepCheck:
    """What :func:`check_step` found. ``read``: the first host read of a device value (its error and where it
    happened), or None. ``copies``: the host-to-device copies of the checked run. ``outputs``: name -> (shape,
    dtype) of the step's outputs (when it completed)."""

    read: str | None = None
    copies: list[str] = field(default_factory=list)
    outputs: dict = field(default_factory=dict)

    @property
    def capturable(self) -> bool:
        return self.read is None and not self.copies

    def summary(self) -> str:
        if self.capturable:
            return "no host read of a device value, no host-to-device copy"
        return "; ".join(([f"host read: {self.read}"] if self.read else []) + self.copies[:5])


def open_meta_engine(engine_dir, *, engine_cls=None) -> StandinEngine:
    """The engine directory's network as the cuda backend runs it, on the ``meta`` device (its checkpoint's shapes
    and dtypes; no GPU needed). ``engine_cls``: another :class:`StandinEngine` of the directory (the target-only
    baseline's :class:`~dflash2_trt.bench.autoregressive.TargetOnlyEngine`)."""
    cfg, man = load_engine_dir(engine_dir)
    pre = cfg["pretrained_config"]
    return (engine_cls or StandinEngine)(pre, Path(engine_dir) / "checkpoint", limits_from(cfg["build_config"], pre),
                                         backend="cuda", device="meta")


def check_step(engine: StandinEngine, feed: dict, *, warm: bool = True) -> StepCheck:
    """Run ``feed`` (a runtime step's flat feed) through ``engine`` (:func:`open_meta_engine`) once to warm it (the
    constants a step makes once, the feed's placement) unless ``warm`` is False, then once more watching for
    host-to-device copies; a host read of a device value ends the run and is reported with its site."""
    if engine.device.type != "meta":
        raise ValueError(f"check_step runs a meta engine (open_meta_engine), not one on {engine.device}")
    if len(engine.local_ranks) > 1:   # the ranks are threads, and a dispatch hook sees only its own thread
        raise ValueError(f"check_step checks one rank per engine; this one steps {len(engine.local_ranks)} ranks "
                         f"as threads")
    res = StepCheck()
    try:
        if warm:
            engine.run_step(feed)
        with _HostToDevice() as watch:
            outs = engine.run_step(feed)
        res.copies = watch.copies
        res.outputs = {k: (tuple(v.shape), v.dtype) for k, v in outs[0].items()}
    except (NotImplementedError, RuntimeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "meta" not in msg.lower() and "data-independent" not in msg and "no data" not in msg:
            raise
        res.read = f"{type(e).__name__}: {msg[:200]} at {_site(traceback.extract_tb(e.__traceback__))}"
    return res


def replay_with_host_inputs_of(engine: StandinEngine, captured: dict, later: dict, *, key_range: int) -> dict:
    """What a CUDA graph captured for step ``captured`` computes when it is replayed for step ``later``: ``later``'s
    device inputs (a replay reads the buffers they are copied into) with ``captured``'s host inputs (a graph keeps
    what its capture read on the host: the attention's sizes, the plugins' host inputs). Both ways on a CPU
    ``engine``, from the same KV pool and state slots, sized as a device sizes (the attention's host bounds, its key
    range fixed at ``key_range``, :func:`~dflash2_trt.trtllm.cpu.attention.key_range`). Returns ``{"eager": outputs,
    "replayed": outputs, "differs": [output names]}`` (or one ``"error: ..."`` entry when the replayed step fails):
    a bucketed graph is sound only where ``differs`` is empty.
    The two steps must have the same device-input shapes (one bucket), else ValueError."""
    from ...trtllm.cpu import attention

    if engine.device.type != "cpu":
        raise ValueError("replay_with_host_inputs_of runs on a CPU engine")
    if set(captured) != set(later):
        raise ValueError("the two steps bind different inputs")
    for k in later:
        a, b = captured[k], later[k]
        if input_memory(k) == "device" and (tuple(a.shape), a.dtype) != (tuple(b.shape), b.dtype):
            raise ValueError(f"{k}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}: not one bucket")
    mixed = {k: captured[k] if input_memory(k) == "host" else later[k] for k in later}
    saved = _state(engine)
    runs = {}
    try:
        for name, feed in (("eager", later), ("replayed", mixed)):
            _restore(engine, saved)
            with attention.sized_as_on_a_device(), attention.key_range(key_range):
                try:
                    runs[name] = {k: v.clone() for k, v in engine.run_step(feed)[0].items()}
                # e.g. a NaN from a row whose keys were all cut off (the network's topk: NumericsError)
                except (ValueError, RuntimeError, NumericsError) as e:
                    if name == "eager":
                        raise
                    runs["differs"] = [f"error: {type(e).__name__}: {str(e).splitlines()[0][:200]}"]
                    return runs
    finally:
        _restore(engine, saved)
    runs["differs"] = [k for k in runs["eager"] if not torch.equal(runs["eager"][k], runs["replayed"][k])]
    return runs


def _state(engine: StandinEngine) -> list:
    """Copies of everything a step writes in the engine: its ranks' KV pools and recurrent-state slots."""
    return [(pool.data.clone() if pool is not None else None,
             {layer: (sp.rnn.clone(), sp.conv.clone()) for layer, sp in engine.states[r].items()})
            for r, pool in enumerate(engine.pools)]


def _restore(engine: StandinEngine, saved: list) -> None:
    for (kv, slots), pool, states in zip(saved, engine.pools, engine.states):
        if pool is not None:
            pool.data.copy_(kv)
        for layer, (rnn, conv) in slots.items():
            states[layer].rnn.copy_(rnn)
            states[layer].conv.copy_(conv)
