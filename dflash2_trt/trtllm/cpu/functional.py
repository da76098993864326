"""CPU stand-in for the part of ``tensorrt_llm.functional`` (TensorRT-LLM 1.2) the network uses.

THIS IS NOT TensorRT-LLM. It executes the project's network file eagerly in torch so that the
network, the engine I/O contract and losslessness can be proven on a machine without a GPU.
Names, parameter names, order and defaults are those recorded from ``tensorrt_llm/functional.py`` in
``api_1_2.yaml`` (tests/trtllm/test_api_fidelity.py holds every signature here to that table); where
TensorRT-LLM builds a TensorRT layer, this module computes the result at once. Every result is a
:class:`.tensor.Tensor` (a torch tensor with exactly the real ``Tensor``'s operators).

TensorRT-LLM's dtype rules are enforced, not relaxed (``api_1_2.yaml`` ``dtype_rules``): ``shape()`` is
int64 (0-D for one dim) unless ``cast_to_dtype`` says otherwise; a Python int becomes an int32 constant
(one beyond int32 is refused, as ``int32_array`` overflows), a float a float32 one; elementwise ops cast an
int32 operand meeting an int64 one to int64 and refuse any other integer/bool mismatch; ``where`` and
``concat`` never cast a Tensor, so mixed dtypes there are refused (ISelectLayer / IConcatenationLayer).

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
from collections import OrderedDict
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as tF

from . import comm
from .tensor import (  # noqa: F401 - TensorRT-LLM's functional names
    Tensor, add, div, eq, floordiv, gt, lt, maximum, minimum, mul, op_and, op_or, raw, sub, wrap,
)
from .tensor import (  # the stand-in's own helpers
    align, check_same_dtype, const_tensor, const_tensors, current_device, scalar,
)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "int32": torch.int32, "int64": torch.int64, "bool": torch.bool, "int8": torch.int8}


def str_dtype_to_torch(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}") from None


def _ints(v, what: str = "shape") -> list[int]:
    """A shape / index list as TensorRT-LLM takes it: a Tensor, or a sequence of Python ints. A Python list
    holding Tensors is refused here exactly because TensorRT-LLM refuses it (build shape tensors with
    ``concat([...])``): the stand-in must not accept network code that trtllm-build would reject."""
    if isinstance(v, torch.Tensor):
        return [int(i) for i in raw(v).reshape(-1).tolist()]
    if any(isinstance(i, torch.Tensor) for i in v):
        raise TypeError(f"{what}: a list holding Tensors is not a TensorRT-LLM shape; use concat([...])")
    return [int(i) for i in v]


# ---- construction -------------------------------------------------------------------------------
_BIG_CONSTANTS: OrderedDict = OrderedDict()   # (id, device) -> (array, its device copy)
_BIG = 1 << 16   # bytes from which a constant's device copy is kept (the rotary tables, made once per shape)
_SMALL_CONSTANTS: dict = {}   # (dtype, shape, bytes, device) -> the device copy of a small constant
_SMALL_MAX = 4096


def constant(ndarray, as_dtype=None, as_shape=None) -> Tensor:
    """The array's values as a constant on the engine's device. TensorRT copies a constant into the engine once; so
    does the stand-in: a small array's device copy is kept by its values (an eager step at 64 layers makes about
    70 of them, each a host-to-device copy on a GPU, and a copy from pageable memory cannot be captured in a CUDA
    graph), a large one's (>= 64 KiB, e.g. the rotary tables the network takes from a cache) by the array itself,
    which is made read-only when cached, so a later write to it fails loudly instead of leaving a stale copy. The
    copies are never written in place (tests/engine/test_scalar_constants.py)."""
    if as_dtype is not None or as_shape is not None:
        raise NotImplementedError("constant stand-in: as_dtype / as_shape are not used by the network")
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"constant: TensorRT-LLM takes a numpy array, got {type(ndarray).__name__}")
    if ndarray.size == 0:   # api_1_2.yaml dtype_rules constant_empty
        raise ValueError(f"constant: an array with no elements (shape {ndarray.shape}) is a TensorRT weights count of "
                         f"0 with a non-null pointer, which addConstant refuses; slice a non-empty tensor instead")
    dev = current_device()
    if ndarray.ndim == 0:      # a 0-D constant is a bound or a scalar: kept on the host, moved where an op needs it
        return wrap(torch.from_numpy(np.ascontiguousarray(ndarray)).clone())
    capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if ndarray.nbytes < _BIG:
        key = (ndarray.dtype.str, ndarray.shape, ndarray.tobytes(), str(dev))
        hit = _SMALL_CONSTANTS.get(key)
        if hit is None and capturing:
            raise RuntimeError(_CAPTURE_MISS)
        if hit is None:
            if len(_SMALL_CONSTANTS) >= _SMALL_MAX:
                _SMALL_CONSTANTS.clear()
            # staged at once from pageable memory: no wait for the stream
            hit = _SMALL_CONSTANTS[key] = torch.from_numpy(np.ascontiguousarray(ndarray)).to(dev, copy=True,
                                                                                              non_blocking=True)
        return wrap(hit)
    key = (id(ndarray), str(dev))
    hit = _BIG_CONSTANTS.get(key)
    if (hit is None or hit[0] is not ndarray) and capturing:
        raise RuntimeError(_CAPTURE_MISS)
    if hit is None or hit[0] is not ndarray:
        hit = _BIG_CONSTANTS[key] = (ndarray, torch.from_numpy(np.ascontiguousarray(ndarray)).to(dev, copy=True))
        ndarray.flags.writeable = False          # the cached copy stays right: the array can no longer change
        while len(_BIG_CONSTANTS) > 64:
            _BIG_CONSTANTS.popitem(last=False)
    return wrap(hit[1])


_CAPTURE_MISS = ("constant: a new constant inside a CUDA-graph capture (its copy from host memory cannot be "
                 "captured); the step must run once eagerly first")


def cached_constants() -> dict:
    """The kept device copies of small constants, ``(dtype, shape, bytes, device) -> tensor`` (tests check that none
    was written)."""
    return dict(_SMALL_CONSTANTS)


def cached_big_constants() -> list:
    """The kept device copies of large constants, ``[(array, tensor)]``."""
    return list(_BIG_CONSTANTS.values())


def arange(start, end, dtype: str) -> Tensor:
    """TensorRT-LLM asserts that start and end are both ints or both Tensors (int32/int64, reconciled)."""
    if isinstance(start, torch.Tensor) != isinstance(end, torch.Tensor) or isinstance(start, bool):
        raise TypeError("arange: start and end must both be int or both be Tensor (TensorRT-LLM asserts it)")
    if isinstance(start, torch.Tensor):
        for t in (start, end):
            if t.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"arange: Tensor bounds must be int32 or int64, got {t.dtype}")
        start, end = int(raw(start).reshape(-1)[0]), int(raw(end).reshape(-1)[0])
    return wrap(torch.arange(int(start), int(end), dtype=str_dtype_to_torch(dtype), device=current_device()))


def shape(input: Tensor, dim: int | None = None, cast_to_dtype=None, clip_before_cast=None) -> Tensor:
    """int64 as TensorRT 10's IShapeLayer makes it (1-D for the whole shape, 0-D for one dim), unless
    ``cast_to_dtype``; on the host, where TensorRT computes shape tensors."""
    if clip_before_cast is not None:
        raise NotImplementedError("shape stand-in: clip_before_cast is not used by the network")
    res = torch.tensor(list(input.shape), dtype=torch.int64)
    if cast_to_dtype is not None:
        res = res.to(str_dtype_to_torch(cast_to_dtype))
    return wrap(res if dim is None else res[dim].reshape(()))


def cast(input: Tensor, dtype) -> Tensor:
    if not isinstance(dtype, (str, torch.dtype)):
        raise TypeError(f"{type(dtype)} is not supported")
    t = str_dtype_to_torch(dtype)
    return input if input.dtype == t else wrap(raw(input).to(t))


# ---- shape ops ----------------------------------------------------------------------------------
def view(input: Tensor, shape, zero_is_placeholder: bool = True) -> Tensor:
    if not isinstance(shape, (torch.Tensor, list, tuple)):
        raise TypeError(f"{type(shape)} is not supported")
    dims = _ints(shape, "view")
    if builtins.sum(1 for d in dims if d == -1) > 1:
        raise ValueError("view: at most one -1 (TensorRT-LLM asserts it)")
    if zero_is_placeholder and 0 in dims:
        dims = [input.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return wrap(raw(input).reshape(dims))


def unsqueeze(input: Tensor, axis: int) -> Tensor:
    return wrap(raw(input).unsqueeze(axis))


def expand(input: Tensor, expand_shape: Tensor) -> Tensor:
    if not isinstance(expand_shape, torch.Tensor):
        raise TypeError("expand: expand_shape must be a Tensor in TensorRT-LLM (e.g. concat([...]))")
    return wrap(raw(input).expand(_ints(expand_shape)))


def concat(inputs: Sequence[Tensor | int], dim: int = 0) -> Tensor:
    """As TensorRT-LLM: ints become 1-element constants (constants_to_tensors_), a 0-D Tensor a 1-element one;
    mixed dtypes are refused (IConcatenationLayer)."""
    if len(inputs) == 0:
        raise ValueError("concat: Number of inputs (0) to the concatenation layer must be > 0")
    parts = [p.reshape(1) if p.dim() == 0 else p for p in const_tensors(*inputs)]
    check_same_dtype("concat", parts)
    return wrap(torch.cat(parts, dim=dim))


def slice(input: Tensor, starts, sizes, strides=None, mode=None, fill_value=None) -> Tensor:  # noqa: A001
    if strides is not None or mode is not None or fill_value is not None:
        raise NotImplementedError("slice stand-in: strides / mode / fill_value are not used by the network")
    st, sz = _ints(starts, "slice starts"), _ints(sizes, "slice sizes")
    if len(st) != input.dim() or len(sz) != input.dim():
        raise ValueError(f"slice: starts/sizes need {input.dim()} entries, got {st} / {sz}")
    out = raw(input)
    for d, (a, n) in enumerate(zip(st, sz)):
        if a < 0 or n < 0 or a + n > input.shape[d]:
            raise IndexError(f"slice: [{a}, {a + n}) out of range for dim {d} of size {input.shape[d]}")
        out = out.narrow(d, a, n)
    return wrap(out)


def _index(t, what):
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{what}: indices must be int32 or int64, got {t.dtype}")
    return raw(t).long()


def gather(input: Tensor, dim: int, indices) -> Tensor:
    if isinstance(indices, int):
        indices = scalar(indices, torch.int32, input.device)
    if input.dim() != indices.dim():
        raise ValueError(f"gather: input and indices must have the same rank ({input.dim()} vs {indices.dim()})")
    x, idx = align(raw(input), _index(indices, "gather"))
    return wrap(torch.gather(x, dim, idx))


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    if index.dim() != 1:
        raise ValueError(f"index should have rank 1, got {index.dim()}")
    x, idx = align(raw(input), _index(index, "index_select"))
    return wrap(torch.index_select(x, dim, idx))


def select(input: Tensor, dim: int, index) -> Tensor:
    if isinstance(index, torch.Tensor):
        if index.dim() != 1 or index.shape[0] != 1:
            raise ValueError(f"index should have rank 1, got {index.dim()}")
        index = int(raw(index)[0])
    return wrap(raw(input).select(dim, int(index)))


def scatter(input: Tensor, dim: int, indices: Tensor, updates: Tensor) -> Tensor:
    check_same_dtype("scatter", [raw(input), raw(updates)])
    x, idx, upd = align(raw(input), _index(indices, "scatter"), raw(updates))
    return wrap(x.scatter(dim, idx, upd))


def repeat_interleave(tensor: Tensor, repeats: int, dim: int) -> Tensor:
    return wrap(raw(tensor).repeat_interleave(repeats, dim=dim))


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return wrap(raw(input).flatten(start_dim, end_dim))


def permute(input: Tensor, dims) -> Tensor:
    return wrap(raw(input).permute(*_ints(dims)))


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    return wrap(raw(input).transpose(dim0, dim1))


# ---- elementwise (with the Tensor's operators in .tensor: one set of TensorRT-LLM's conversion rules) ---------
def where(condition, left, right) -> Tensor:
    """ISelectLayer: the condition is bool; left and right after constants_to_tensors_ must share a dtype."""
    c = const_tensor(condition)
    if c.dtype != torch.bool:
        raise TypeError(f"where: the condition must be bool, got {c.dtype}")
    a, b = const_tensors(left, right)
    check_same_dtype("where", [a, b])
    c, a, b = align(c, a, b)
    return wrap(torch.where(c, a, b))


def exp(input: Tensor) -> Tensor:
    return wrap(torch.exp(raw(input)))


def sigmoid(input: Tensor) -> Tensor:
    return wrap(torch.sigmoid(raw(input)))


def silu(input: Tensor) -> Tensor:
    return wrap(tF.silu(raw(input)))


def tanh(input: Tensor) -> Tensor:
    return wrap(torch.tanh(raw(input)))


# ---- reductions ---------------------------------------------------------------------------------
def _keep_int(input: torch.Tensor):
    """TensorRT's reduce / cumulative layers keep the input type; torch promotes integers to int64."""
    return input.dtype if not input.dtype.is_floating_point and input.dtype != torch.bool else None


def sum(input: Tensor, dim: int, keepdim: bool = False) -> Tensor:  # noqa: A001
    x = raw(input)
    return wrap(torch.sum(x, dim=dim, keepdim=keepdim, dtype=_keep_int(x)))


def max(input: Tensor, dim: int, keepdim: bool = False) -> Tensor:  # noqa: A001
    return wrap(torch.amax(raw(input), dim=dim, keepdim=keepdim))


def cumsum(input: Tensor, dim: int, prefer_plugin: bool = True) -> Tensor:
    x = raw(input)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim should be in [{-x.dim()}, {x.dim()}) when input have rank {x.dim()}")
    return wrap(torch.cumsum(x, dim=dim, dtype=_keep_int(x)))


def argmax(input: Tensor, dim: int, keepdim: bool = False) -> Tensor:
    return wrap(torch.argmax(raw(input), dim=dim, keepdim=keepdim).to(torch.int32))


def topk(input: Tensor, k, dim: int, largest: bool = True, prefer_plugin: bool = True) -> tuple[Tensor, Tensor]:
    """(values, int32 indices); stable order: equal values keep ascending index order."""
    x = raw(input)
    if x.device.type == "cpu" and torch.isnan(x).any():   # on a GPU the check would wait for the stream: CPU only
        # NaN logits come from weights that are not what the build wrote (a file corrupted in place keeps its size,
        # the one thing `run` checks without --verify): one error line, not a traceback from deep in the network
        from ...errors import NumericsError

        raise NumericsError("the engine computed NaN values (topk: their order is undefined): its weights are "
                            "corrupt or hold NaN/Inf, or its dtype overflowed (`run --verify` checks an engine's files "
                            "against engine.json, `inspect --check-values` a checkpoint's tensors)")
    values, idx = torch.sort(x, dim=dim, descending=largest, stable=True)
    return wrap(values.narrow(dim, 0, k).contiguous()), wrap(idx.narrow(dim, 0, k).to(torch.int32).contiguous())


def softmax(input: Tensor, dim: int | None = None) -> Tensor:
    x = raw(input)
    return wrap(torch.softmax(x, dim=x.dim() - 1 if dim is None else dim))


# ---- linear algebra / layers' math --------------------------------------------------------------
def matmul(input: Tensor, mat2: Tensor, transa: bool = False, transb: bool = False,
           use_fp32_acc: bool = True) -> Tensor:
    a, b = align(raw(input), raw(mat2))
    check_same_dtype("matmul", [a, b])
    a = a.transpose(-1, -2) if transa else a
    b = b.transpose(-1, -2) if transb else b
    if use_fp32_acc and a.dtype == torch.float16:
        return wrap(torch.matmul(a.float(), b.float()).to(torch.float16))
    return wrap(torch.matmul(a, b))


def rms_norm(input: Tensor, normalized_shape, num_groups: int = 1, weight: Tensor | None = None,
             eps: float = 1e-06) -> Tensor:
    """TensorRT-LLM 1.2's signature: ``num_groups`` third, so weight and eps must be passed by keyword (a weight
    given positionally lands in num_groups: refused here, a TypeError/garbage there)."""
    if not isinstance(num_groups, int) or isinstance(num_groups, bool):
        raise TypeError(f"rms_norm: num_groups must be an int, got {type(num_groups).__name__} (weight passed "
                        f"positionally? TensorRT-LLM 1.2's order is (input, normalized_shape, num_groups, weight, eps))")
    if num_groups != 1:
        raise NotImplementedError("rms_norm stand-in: num_groups > 1 is not used by the network")
    if not isinstance(eps, float):
        raise TypeError(f"rms_norm: eps must be a float, got {type(eps).__name__}")
    shape_ = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    dims = tuple(range(-len(shape_), 0))
    x = raw(input)
    xf = x.float()
    y = (xf / torch.sqrt(xf.pow(2).mean(dims, keepdim=True) + eps)).to(x.dtype)
    return wrap(y) if weight is None else mul(wrap(y), weight)


def embedding(input: Tensor, weight: Tensor, tp_size=1, tp_group=None, sharding_dim=0, tp_rank=None,
              per_token_scale=None, padding=None) -> Tensor:
    if per_token_scale is not None:
        raise NotImplementedError("embedding stand-in: per_token_scale is not used by the network")
    ids, w = align(_index(input, "embedding"), raw(weight))
    if padding is not None:
        w = torch.cat([w, raw(padding)], dim=0)
    if not (tp_size > 1 and tp_group is not None):
        return wrap(tF.embedding(ids, w))
    if sharding_dim != 0:
        raise NotImplementedError("embedding: only vocab (dim 0) sharding is implemented")
    if tp_rank is None:
        raise ValueError("Rank cannot be none for tensor parallelism on vocab dim")
    rows = raw(weight).shape[0]
    local = ids - int(tp_rank) * rows
    mine = (local >= 0) & (local < rows)
    out = torch.where(mine.unsqueeze(-1), tF.embedding(local.clamp(0, rows - 1), w), torch.zeros((), dtype=w.dtype, device=w.device))
    return allreduce(wrap(out), tp_group)


# ---- collectives --------------------------------------------------------------------------------
def allreduce(tensor: Tensor, group, all_reduce_params=None) -> Tensor:
    """Sum over the ranks of ``group`` (a list of ranks), computed in fp32 and cast back."""
    return wrap(comm.current().allreduce(raw(tensor), group))


def allgather(tensor: Tensor, group, gather_dim: int = 0) -> Tensor:
    return wrap(comm.current().allgather(raw(tensor), group, gather_dim))


# gpt_attention is large enough to live in its own module; re-exported under its real name.
from .attention import (  # noqa: E402
    AttentionMaskType, PositionEmbeddingType, RotaryScalingType, gpt_attention,
)

__all__ = [n for n in dir() if not n.startswith("_") and n not in ("annotations", "builtins", "torch", "tF",
                                                                      "Sequence", "comm", "OrderedDict")]
