"""CPU stand-in for the part of ``tensorrt_llm.functional`` (TensorRT-LLM 1.2) the network uses.

THIS IS NOT TensorRT-LLM. It executes the project's network file eagerly in torch so that the
network, the engine I/O contract and losslessness can be proven on a machine without a GPU.
Names, argument names and argument order follow ``tensorrt_llm/functional.py`` of the 1.2
release; where TensorRT-LLM builds a TensorRT layer, this module computes the result at once.
A ``Tensor`` here IS a ``torch.Tensor`` (TensorRT-LLM's ``Tensor`` is a symbolic handle; the
network only uses the functional forms below and arithmetic operators, which both accept).

Semantics pinned here (each op is tested against plain torch in ``tests/trtllm/test_cpu_ops.py``):

- ``slice(input, starts, sizes)``: TensorRT ``ISliceLayer`` with stride 1 (starts/sizes per dim).
- ``gather(input, dim, indices)``: ``IGatherLayer`` in ELEMENT mode == ``torch.gather``.
- ``index_select(input, dim, index)``: ``torch.index_select`` (``IGatherLayer`` DEFAULT mode).
- ``select(input, dim, index)``: one index, the dim removed.
- ``topk(input, k, dim, largest=True)``: TensorRT's ``ITopKLayer`` does not define the order of
  equal values; the DFlash2 selector contract does (descending, ties to the LOWER token id, see
  ``reference/selector.py``), so this stand-in sorts stably. On a GPU the engine would need the
  same tie rule from its top-k (an exact-tie in fp32 logits is rare but possible) — stated, not
  proven.
- ``argmax(input, dim, keepdim=False)``: first maximal index (torch and TensorRT agree).
- ``cumsum(input, dim)``: inclusive prefix sum.
- ``rms_norm``: fp32 normalisation, cast back, times weight (TensorRT-LLM's RmsNorm layer).
- ``allreduce`` / ``allgather``: across the simulated ranks of one :class:`.comm.World`
  (threads), in rank order.
- ``embedding``: vocab-parallel lookup when ``tp_size > 1`` and ``sharding_dim == 0``: each
  rank holds ``V/tp`` rows, looks up the ids it owns, zeros elsewhere, then all-reduces.
"""

from __future__ import annotations

import builtins
from typing import Sequence

import torch
import torch.nn.functional as tF

from . import comm

Tensor = torch.Tensor

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "int32": torch.int32, "int64": torch.int64, "bool": torch.bool, "int8": torch.int8}


def str_dtype_to_torch(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}") from None


def _t(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _ints(v, what: str = "shape") -> list[int]:
    """A shape / index list as TensorRT-LLM takes it: a Tensor, or a sequence of Python ints. A Python list
    holding Tensors is refused here exactly because TensorRT-LLM refuses it (build shape tensors with
    ``concat([...])``): the stand-in must not accept network code that trtllm-build would reject."""
    if isinstance(v, torch.Tensor):
        return [int(i) for i in v.reshape(-1).tolist()]
    if any(isinstance(i, torch.Tensor) for i in v):
        raise TypeError(f"{what}: a list holding Tensors is not a TensorRT-LLM shape; use concat([...])")
    return [int(i) for i in v]


# ---- construction -------------------------------------------------------------------------------
def constant(ndarray) -> Tensor:
    return torch.as_tensor(ndarray).clone()


def arange(start, end, dtype: str) -> Tensor:
    """TensorRT-LLM asserts that start and end are both ints or both Tensors."""
    if isinstance(start, torch.Tensor) != isinstance(end, torch.Tensor):
        raise TypeError("arange: start and end must both be int or both be Tensor (TensorRT-LLM asserts it)")
    return torch.arange(int(start), int(end), dtype=str_dtype_to_torch(dtype))


def shape(input: Tensor, dim: int | None = None) -> Tensor:
    """int32, as TensorRT-LLM's ``shape`` casts it: 1-D for the whole shape, 0-D for one dim."""
    if dim is None:
        return torch.tensor(list(input.shape), dtype=torch.int32)
    return torch.tensor(input.shape[dim], dtype=torch.int32)


def cast(input: Tensor, dtype) -> Tensor:
    return input.to(str_dtype_to_torch(dtype))


# ---- shape ops ----------------------------------------------------------------------------------
def view(input: Tensor, shape, zero_is_placeholder: bool = True) -> Tensor:
    dims = _ints(shape, "view")
    if zero_is_placeholder and 0 in dims:
        dims = [input.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return input.reshape(dims)


def unsqueeze(input: Tensor, axis: int) -> Tensor:
    return input.unsqueeze(axis)


def expand(input: Tensor, expand_shape: Tensor) -> Tensor:
    if not isinstance(expand_shape, torch.Tensor):
        raise TypeError("expand: expand_shape must be a Tensor in TensorRT-LLM (e.g. concat([...]))")
    return input.expand(_ints(expand_shape))


def concat(inputs: Sequence[Tensor | int], dim: int = 0) -> Tensor:
    """As TensorRT-LLM: an int becomes a 1-element int32 constant, a 0-D Tensor a 1-element one."""
    parts = []
    for i in inputs:
        if isinstance(i, int) and not isinstance(i, bool):
            parts.append(torch.tensor([i], dtype=torch.int32))
        elif isinstance(i, torch.Tensor) and i.dim() == 0:
            parts.append(i.reshape(1))
        else:
            parts.append(_t(i))
    return torch.cat(parts, dim=dim)


def slice(input: Tensor, starts, sizes) -> Tensor:  # noqa: A001 - TensorRT-LLM's name
    st, sz = _ints(starts, "slice starts"), _ints(sizes, "slice sizes")
    if len(st) != input.dim() or len(sz) != input.dim():
        raise ValueError(f"slice: starts/sizes need {input.dim()} entries, got {st} / {sz}")
    out = input
    for d, (a, n) in enumerate(zip(st, sz)):
        if a < 0 or n < 0 or a + n > input.shape[d]:
            raise IndexError(f"slice: [{a}, {a + n}) out of range for dim {d} of size {input.shape[d]}")
        out = out.narrow(d, a, n)
    return out


def gather(input: Tensor, dim: int, indices: Tensor) -> Tensor:
    return torch.gather(input, dim, indices.long())


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    return torch.index_select(input, dim, index.long().reshape(-1))


def select(input: Tensor, dim: int, index) -> Tensor:
    return input.select(dim, int(index))


def scatter(input: Tensor, dim: int, indices: Tensor, updates: Tensor) -> Tensor:
    return input.scatter(dim, indices.long(), updates)


def repeat_interleave(tensor: Tensor, repeats: int, dim: int) -> Tensor:
    return tensor.repeat_interleave(repeats, dim=dim)


def permute(input: Tensor, dims) -> Tensor:
    return input.permute(*_ints(dims))


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    return input.transpose(dim0, dim1)


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return input.flatten(start_dim, end_dim)


# ---- elementwise --------------------------------------------------------------------------------
def where(condition: Tensor, left, right) -> Tensor:
    return torch.where(condition.bool(), _t(left), _t(right))


def eq(left, right) -> Tensor:
    return torch.eq(_t(left), _t(right))


def lt(left, right) -> Tensor:
    return torch.lt(_t(left), _t(right))


def gt(left, right) -> Tensor:
    return torch.gt(_t(left), _t(right))


def op_and(left, right) -> Tensor:
    return torch.logical_and(_t(left), _t(right))


def op_or(left, right) -> Tensor:
    return torch.logical_or(_t(left), _t(right))


def minimum(left, right) -> Tensor:
    return torch.minimum(_t(left), _t(right))


def maximum(left, right) -> Tensor:
    return torch.maximum(_t(left), _t(right))


def floordiv(left, right) -> Tensor:
    return torch.div(_t(left), _t(right), rounding_mode="floor")


def exp(input: Tensor) -> Tensor:
    return torch.exp(input)


def sigmoid(input: Tensor) -> Tensor:
    return torch.sigmoid(input)


def silu(input: Tensor) -> Tensor:
    return tF.silu(input)


def tanh(input: Tensor) -> Tensor:
    return torch.tanh(input)


# ---- reductions ---------------------------------------------------------------------------------
def _keep_int(input: Tensor):
    """TensorRT's reduce / cumulative layers keep the input type; torch promotes integers to int64."""
    return input.dtype if not input.dtype.is_floating_point and input.dtype != torch.bool else None


def sum(input: Tensor, dim: int, keepdim: bool = False) -> Tensor:  # noqa: A001
    return torch.sum(input, dim=dim, keepdim=keepdim, dtype=_keep_int(input))


def max(input: Tensor, dim: int, keepdim: bool = False) -> Tensor:  # noqa: A001
    return torch.amax(input, dim=dim, keepdim=keepdim)


def cumsum(input: Tensor, dim: int) -> Tensor:
    return torch.cumsum(input, dim=dim, dtype=_keep_int(input))


def argmax(input: Tensor, dim: int, keepdim: bool = False) -> Tensor:
    return torch.argmax(input, dim=dim, keepdim=keepdim).to(torch.int32)


def topk(input: Tensor, k: int, dim: int, largest: bool = True) -> tuple[Tensor, Tensor]:
    """(values, int32 indices); stable order: equal values keep ascending index order."""
    if torch.isnan(input).any():
        raise ValueError("topk: NaN in the input (their order is undefined)")
    values, idx = torch.sort(input, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k).contiguous(), idx.narrow(dim, 0, k).to(torch.int32).contiguous()


def softmax(input: Tensor, dim: int = -1) -> Tensor:
    return torch.softmax(input, dim=dim)


# ---- linear algebra / layers' math --------------------------------------------------------------
def matmul(input: Tensor, mat2: Tensor, transa: bool = False, transb: bool = False) -> Tensor:
    a = input.transpose(-1, -2) if transa else input
    b = mat2.transpose(-1, -2) if transb else mat2
    return torch.matmul(a, b)


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    n = len(_ints(normalized_shape)) if not isinstance(normalized_shape, int) else 1
    dims = tuple(range(-n, 0))
    xf = input.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)
    y = xf.to(input.dtype)
    return y if weight is None else weight * y


def embedding(input: Tensor, weight: Tensor, tp_size: int = 1, tp_group=None, sharding_dim: int = 0,
              tp_rank: int | None = None) -> Tensor:
    ids = input.long()
    if tp_size == 1:
        return tF.embedding(ids, weight)
    if sharding_dim != 0:
        raise NotImplementedError("embedding: only vocab (dim 0) sharding is implemented")
    rows = weight.shape[0]
    local = ids - int(tp_rank) * rows
    mine = (local >= 0) & (local < rows)
    out = torch.where(mine.unsqueeze(-1), tF.embedding(local.clamp(0, rows - 1), weight), torch.zeros((), dtype=weight.dtype))
    return allreduce(out, tp_group)


# ---- collectives --------------------------------------------------------------------------------
def allreduce(tensor: Tensor, group, all_reduce_params=None) -> Tensor:
    """Sum over the ranks of ``group`` (a list of ranks), computed in fp32 and cast back."""
    return comm.current().allreduce(tensor, group)


def allgather(tensor: Tensor, group, gather_dim: int = 0) -> Tensor:
    return comm.current().allgather(tensor, group, gather_dim)


# gpt_attention is large enough to live in its own module; re-exported under its real name.
from .attention import (  # noqa: E402
    AttentionMaskType, PositionEmbeddingType, RotaryScalingType, gpt_attention,
)

__all__ = [n for n in dir() if not n.startswith("_") and n not in ("annotations", "builtins", "torch", "tF",
                                                                      "Sequence", "comm")]
