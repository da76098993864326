"""CPU stand-in for ``tensorrt_llm.models.modeling_utils`` (PretrainedConfig, PretrainedModel) and for
the network-input / output declarations (``functional.Tensor(name=..., dim_range=...)``,
``Tensor.mark_output``), TensorRT-LLM 1.2.

NOT TensorRT-LLM. ``PretrainedConfig`` keeps every key of the checkpoint's ``config.json`` as an
attribute (unknown keys included, as the real class does) and builds ``mapping``.
``PretrainedModel.load(weights)`` requires every parameter and refuses unknown names (the real
one raises on missing required weights; unexpected ones are an error here too, because a name
the network does not read is a silent layout bug).

Inputs: ``input_tensor(name, dtype, shape, dim_range)`` returns an :class:`InputDecl` (the real
backend returns a TensorRT network input). Outputs: ``mark_output(tensor, name, dtype)`` records
the tensor in the running step's output dict (``outputs()``), where the real backend marks a
network output.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...errors import CheckpointError
from .functional import str_dtype_to_torch
from .mapping import Mapping
from .module import Module
from .tensor import current_device


class PretrainedConfig:
    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)
        m = kwargs.get("mapping") or {}
        self.mapping = m if isinstance(m, Mapping) else Mapping(
            world_size=m.get("world_size", 1), rank=m.get("rank", 0), tp_size=m.get("tp_size", 1),
            pp_size=m.get("pp_size", 1))

    @classmethod
    def from_dict(cls, config: dict) -> "PretrainedConfig":
        return cls(**dict(config))

    def set_rank(self, rank: int) -> None:
        self.mapping = Mapping(world_size=self.mapping.world_size, rank=rank, tp_size=self.mapping.tp_size)


class PretrainedModel(Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.config = config

    @classmethod
    def from_config(cls, config: PretrainedConfig):
        return cls(config)

    def load(self, weights: dict[str, torch.Tensor], source: str | Path | None = None) -> None:
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(weights))
        if missing:
            raise CheckpointError(f"{len(missing)} required weight(s) not provided, e.g. {missing[:3]}",
                                  file=source, tensor=missing[0])
        extra = sorted(set(weights) - set(params))
        if extra:
            raise CheckpointError(f"{len(extra)} weight(s) the network does not use, e.g. {extra[:3]}",
                                  file=source, tensor=extra[0])
        for name, p in params.items():
            w = weights[name]
            if tuple(w.shape) != p.shape:
                raise CheckpointError(f"shape {list(w.shape)}, the network expects {list(p.shape)}",
                                      file=source, tensor=name)
            if w.dtype != p.dtype:
                raise CheckpointError(f"dtype {w.dtype}, the network expects {p.dtype}", file=source, tensor=name)
            p.value = w

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, rank: int, config: PretrainedConfig):
        from safetensors.torch import load_file

        path = Path(ckpt_dir) / f"rank{rank}.safetensors"
        config.set_rank(rank)
        model = cls(config)
        dev = current_device()   # the engine's device (tensor.on_device)
        try:
            weights = load_file(str(path), device="cpu" if dev.type == "meta" else str(dev))
        except Exception as exc:  # safetensors raises several types
            raise CheckpointError(f"cannot read rank weights: {exc}", file=path) from None
        if dev.type == "meta":   # the capture check's engine: shapes and dtypes, no values
            weights = {k: v.to(dev) for k, v in weights.items()}
        skip = tuple(getattr(cls, "ignored_weight_prefixes", ()))   # e.g. the target-only baseline: no drafter
        model.load({k: v for k, v in weights.items() if not (skip and k.startswith(skip))}, source=path)
        return model


@dataclass
class InputDecl:
    """One declared engine input: what ``prepare_inputs`` hands to ``trtllm-build``."""

    name: str
    dtype: str
    shape: tuple
    dim_range: "OrderedDict[str, list]" = field(default_factory=OrderedDict)

    @property
    def torch_dtype(self) -> torch.dtype:
        return str_dtype_to_torch(self.dtype)


    @property
    def profiles(self) -> list[list[tuple[int, int, int]]]:
        """Per optimization profile, per dimension: (min, opt, max), read as ``functional.DimRange`` reads it."""
        out = []
        for i in range(len(next(iter(self.dim_range.values())))):
            out.append([tuple(r[i]) if isinstance(r[i], (list, tuple)) else (r[i],) * 3 for r in self.dim_range.values()])
        return out


def input_tensor(name: str, dtype: str, shape, dim_range=None) -> InputDecl:
    """``functional.Tensor(name, dtype, shape, dim_range)`` as a declaration, held to the rules the real class and
    ``DimRange`` apply (api_1_2.yaml ``input_tensor``): ``dim_range`` an OrderedDict {dimension: [one entry per
    optimization profile]}, every dimension with the same number of profiles (>= 1), an entry either the size of
    a static dimension or [min, opt, max] with 0 <= min <= opt <= max; one named dimension per axis of ``shape``
    (the network names each axis), and a fixed axis (not -1) only ever its own size."""
    shape = tuple(shape)
    if dim_range is not None:
        if not isinstance(dim_range, OrderedDict):
            raise TypeError(f"input {name!r}: dim_range must be an OrderedDict (functional.Tensor asserts it)")
        if len(dim_range) < 1:
            raise ValueError(f"input {name!r}: dim_range needs at least one dimension")
        counts = {dim: len(r) for dim, r in dim_range.items() if isinstance(r, (list, tuple))}
        if len(counts) != len(dim_range):
            raise TypeError(f"input {name!r}: every dim_range value is a list of per-profile entries: {dim_range}")
        if len(set(counts.values())) != 1 or min(counts.values()) < 1:
            raise ValueError(f"input {name!r}: every dimension needs the same number (>= 1) of profile entries, "
                             f"got {counts}")
        if len(dim_range) != len(shape):
            raise ValueError(f"input {name!r}: {len(dim_range)} named dimensions for a rank-{len(shape)} shape")
        for axis, (dim, ranges) in enumerate(dim_range.items()):
            for prof, r in enumerate(ranges):
                if isinstance(r, (list, tuple)):
                    if len(r) != 3 or not all(isinstance(v, int) for v in r) or not 0 <= r[0] <= r[1] <= r[2]:
                        raise ValueError(f"input {name!r}: dimension {dim!r}, profile {prof}: a dynamic entry is "
                                         f"[min, opt, max] with 0 <= min <= opt <= max, got {r}")
                    lo, hi = r[0], r[2]
                elif isinstance(r, int) and not isinstance(r, bool):
                    lo = hi = r
                else:
                    raise TypeError(f"input {name!r}: dimension {dim!r}, profile {prof}: entry {r!r} is neither a "
                                    f"size nor [min, opt, max]")
                if shape[axis] != -1 and not lo == hi == shape[axis]:
                    raise ValueError(f"input {name!r}: dimension {dim!r} is fixed at {shape[axis]} in the shape but "
                                     f"ranges {r} in profile {prof}")
    return InputDecl(name, dtype, shape, OrderedDict(dim_range or {}))


def declared_inputs(decl: dict) -> list[InputDecl]:
    """Every InputDecl of a ``prepare_inputs`` result (top-level ones and those inside its parameter dataclasses,
    one level deep as the network builds them; dicts of per-layer inputs included)."""
    out = []

    def take(v):
        if isinstance(v, InputDecl):
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                take(x)

    for v in decl.values():
        if hasattr(v, "__dataclass_fields__") and not isinstance(v, InputDecl):   # a parameter dataclass
            for f in v.__dataclass_fields__:
                take(getattr(v, f))
        else:
            take(v)
    return out


def check_profiles(decls) -> int:
    """What ``Network._generate_optimization_profiles`` and the builder's named-dimension check need of all the
    inputs together: the same number of profiles for every input (the profile count is the first input's, and
    every input is indexed by it), and a dimension name with one range per profile across inputs. Returns the
    profile count."""
    decls = [d for d in decls if d.dim_range]
    counts = {d.name: len(d.profiles) for d in decls}
    if len(set(counts.values())) > 1:
        raise ValueError(f"inputs with different numbers of optimization profiles: {counts}")
    n = next(iter(counts.values()), 0)
    for p in range(n):
        seen: dict[str, tuple] = {}
        for d in decls:
            for dim, rng in zip(d.dim_range, d.profiles[p]):
                if seen.setdefault(dim, rng) != rng:
                    raise ValueError(f"profile {p}: dimension {dim!r} has ranges {seen[dim]} and {rng} "
                                     f"(input {d.name!r})")
    return n


ALL_REDUCE_POINTERS_PER_RANK, ALL_REDUCE_POINTERS_OF_COUNTER = 7, 3   # plugin.CustomAllReduceHelper (api_1_2.yaml)


def all_reduce_workspace(mapping: Mapping, num_profiles: int) -> InputDecl:
    """``plugin.current_all_reduce_helper().set_workspace_tensor(mapping, num_profiles)``: the int64 input
    ``all_reduce_workspace`` [7 * tp_size + 3] (dim ``all_reduce_size``, one range per profile) the all-reduce
    plugins take as their workspace. The simulated collectives (:mod:`.comm`) do not read it."""
    n = ALL_REDUCE_POINTERS_PER_RANK * mapping.tp_size + ALL_REDUCE_POINTERS_OF_COUNTER
    return InputDecl("all_reduce_workspace", "int64", (n,), OrderedDict(all_reduce_size=[n] * num_profiles))


_out = threading.local()


def begin_outputs() -> None:
    _out.d = OrderedDict()
    _out.marked = []   # (network tensor, name): TensorRT names a tensor, so one tensor is one output


def _marked_as(tensor):
    return next((name for t, name in getattr(_out, "marked", []) if t is tensor), None)


def mark_output(tensor: torch.Tensor, name: str, dtype=None) -> None:
    d = getattr(_out, "d", None)
    if d is None:
        raise RuntimeError("mark_output outside an engine step")
    if name in d:
        raise RuntimeError(f"output {name!r} marked twice")
    from .tensor import Tensor, raw

    if not isinstance(tensor, Tensor):
        raise TypeError(f"mark_output({name!r}): not a network tensor ({type(tensor).__name__}); every value the "
                        f"network computes must come from the stand-in's ops")
    t = raw(tensor)
    if dtype is not None and t.dtype != str_dtype_to_torch(dtype):
        # Tensor.mark_output(name, dtype) sets the output's type; TensorRT refuses a type that is not the tensor's
        raise TypeError(f"mark_output({name!r}): the tensor is {t.dtype}, the output is declared {dtype}")
    first = _marked_as(tensor)
    if first is not None:
        # Network._mark_output marks the ITensor and then sets its name (cast to the same dtype returns the tensor
        # itself): a second name renames the first output away, and the engine lacks it (api_1_2.yaml mark_output)
        raise RuntimeError(f"mark_output({name!r}): this tensor is already output {first!r}; TensorRT would rename "
                           f"it and the engine would have no {first!r} output (mark a distinct tensor)")
    _out.marked.append((tensor, name))
    d[name] = t


def outputs() -> "OrderedDict[str, torch.Tensor]":
    d = getattr(_out, "d", None)
    _out.d = None
    _out.marked = []
    return d
