"""The stand-in's ``Tensor``: a torch tensor that behaves, as far as the network can tell, like
``tensorrt_llm.functional.Tensor`` (TensorRT-LLM 1.2; facts in ``api_1_2.yaml``, ``tensor_operators``).

NOT TensorRT-LLM. What the network gets from the stand-in (inputs, constants, parameter values, every op's
result) is a :class:`Tensor`. Its operators are exactly the real Tensor's (``+ - * / // %``, ``< > == >= <=``
and their reflected forms where the real one has them), each routed to the stand-in's functional form so the
same dtype rules apply; the ones the real Tensor lacks (``1.0 / t``, ``-t``, ``t[i]``, ``t & u``, ``t ** 2``,
...) raise ``TypeError`` as they do there. torch's own operations on it return plain torch tensors
(``__torch_function__`` is disabled), which is what the stand-in's internals work with.

``location``: ``"host"`` for a network input the runtime binds in host memory (``engine_io.yaml`` memory:
host), ``"device"`` for everything else, as in TensorRT: a layer's output always lives on the device. The
attention stand-in refuses a host parameter that is not a host network input (the real plugin would
dereference a device pointer on the host).

Where the tensors live: the stand-in runs on the CPU (the ``cpu`` backend) or on a CUDA GPU (the ``cuda``
backend). :func:`on_device` sets the engine's device for the duration of a step or a load; constants and
``arange`` are made there. Host inputs stay in host memory and shape tensors (``shape()``) on the host, as
TensorRT keeps shape tensors; where an op meets operands on both, the host ones are copied to the device
(:func:`align`), which is what TensorRT does when a layer reads a host tensor. On the CPU backend every tensor is
on the CPU and nothing moves.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import sys
from typing import Sequence

import torch

_DEVICE: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar("dflash2_standin_device", default=None)


def current_device() -> torch.device:
    """The device the running engine step (or load) makes its constants on: ``cpu`` unless :func:`on_device`."""
    return _DEVICE.get() or torch.device("cpu")


@contextlib.contextmanager
def on_device(device):
    """Run the enclosed network code with its constants made on ``device`` (``"cpu"`` or ``"cuda[:n]"``)."""
    tok = _DEVICE.set(torch.device(device))
    try:
        yield
    finally:
        _DEVICE.reset(tok)


def align(*xs):
    """The operands of one op on one device: when any tensor among ``xs`` is on a device (a GPU, or ``meta`` in the
    capture check), the CPU tensors among them are brought there. A one-value CPU tensor that is not a host input of
    the engine (a shape value, a bound, a 0-D constant) becomes the device constant of that value, made once
    (:func:`scalar`: a fill kernel, no copy), as TensorRT turns a shape computation into the values its layers
    read; anything else (a host input read by a device op) is copied. Nothing else is returned changed."""
    dev = next((x.device for x in xs if isinstance(x, torch.Tensor) and x.device.type != "cpu"), None)
    if dev is None:
        return xs
    return tuple(_to_device(x, dev) if isinstance(x, torch.Tensor) and x.device != dev else x for x in xs)


def _to_device(x: torch.Tensor, dev: torch.device) -> torch.Tensor:
    host_input = getattr(x, "is_network_input", False)
    x = raw(x)
    if x.device.type == "cpu" and x.numel() == 1 and not host_input:
        return scalar(x.reshape(-1)[0].item(), x.dtype, dev).reshape(x.shape)
    # non_blocking: a host-to-device copy from pageable memory is staged at once, without waiting for the stream
    return x.to(dev, non_blocking=True)


_SCALARS: dict = {}
_SCALARS_MAX = 4096


def scalar(x, dtype: torch.dtype, device) -> torch.Tensor:
    """A [1] constant ``x`` on ``device``, made once and reused (a TensorRT constant is built into the engine once; an
    eager step at 64 layers asks for about 900 of them, each a fill kernel on a GPU). Constants are never written in
    place (the stand-in Tensor has no in-place operators; ``tests/engine/test_scalar_constants.py`` holds every cached
    one to its value after engine steps); at most ``_SCALARS_MAX`` are kept. Nothing is cached while a CUDA graph is
    being captured (a constant made then exists only in the graph)."""
    device = torch.device(device)
    # a float by its bits (float.hex): -0.0 == 0.0 and NaN != NaN as values, and either would mix the cache up
    key = (type(x), float(x).hex() if isinstance(x, float) or type(x).__name__.startswith("float") else x, dtype,
           device)
    try:
        hit = _SCALARS.get(key)
    except TypeError:            # an unhashable value: made every time
        hit, key = None, None
    if hit is not None:
        return hit
    # on a GPU a fill kernel (torch.tensor([x], device=...) would copy from the host and wait for the stream)
    t = torch.tensor([x], dtype=dtype) if device.type == "cpu" else torch.full((1,), x, dtype=dtype, device=device)
    if key is not None and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        if len(_SCALARS) >= _SCALARS_MAX:
            _SCALARS.clear()
        _SCALARS[key] = t
    return t


def cached_scalars() -> dict:
    """The reused constants, ``(type, value or a float's bits, dtype, device) -> tensor`` (tests check none was
    written)."""
    return dict(_SCALARS)

INT32_RANGE = (-2**31, 2**31 - 1)


class Tensor(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl
    location = "device"
    is_network_input = False
    input_name = None

    # ---- the real Tensor's operators (functional.py: Tensor.__add__ ... __le__) ----------------------------
    def __add__(self, b):
        return add(self, b)

    def __radd__(self, b):
        return add(b, self)

    def __sub__(self, b):
        return sub(self, b)

    def __rsub__(self, b):
        return sub(b, self)

    def __mul__(self, b):
        return mul(self, b)

    def __rmul__(self, b):
        return mul(b, self)

    def __truediv__(self, b):
        return div(self, b)

    def __floordiv__(self, b):
        return floordiv(self, b)

    def __mod__(self, b):
        return sub(self, mul(floordiv(self, b), b))

    def __lt__(self, b):
        return lt(self, b)

    def __gt__(self, b):
        return gt(self, b)

    def __eq__(self, b):
        return eq(self, b)

    def __ge__(self, b):
        return op_or(gt(self, b), eq(self, b))

    def __le__(self, b):
        return op_or(lt(self, b), eq(self, b))

    def __xor__(self, b):
        return op_or(op_and(self, _not(b)), op_and(_not(self), b))

    __hash__ = torch.Tensor.__hash__

    # ---- what the real Tensor does not have --------------------------------------------------------------
    def _absent(name):
        def f(self, *args, **kwargs):
            raise TypeError(f"tensorrt_llm's Tensor has no {name} (api_1_2.yaml tensor_operators, tensor_methods); "
                            f"use the functional form")
        f.__name__ = name
        return f

    # ---- the real Tensor's methods (api_1_2.yaml tensor_methods), routed to the functional forms ----------------
    def view(self, shape, zero_is_placeholder=True):
        return _functional().view(self, shape, zero_is_placeholder)

    def flatten(self, start_dim=0, end_dim=-1):
        return _functional().flatten(self, start_dim, end_dim)

    def permute(self, dims):
        return _functional().permute(self, dims)

    def transpose(self, dim0, dim1):
        return _functional().transpose(self, dim0, dim1)

    def unsqueeze(self, dim):
        return _functional().unsqueeze(self, dim)

    def select(self, dim, index):
        return _functional().select(self, dim, index)

    def cast(self, dtype):
        return _functional().cast(self, dtype)

    def max(self, dim, keepdim=False):
        return _functional().max(self, dim, keepdim)

    def mark_output(self, name=None, dtype=None):
        """Tensor.mark_output: records the tensor as engine output ``name`` of the running step."""
        if name is None:
            raise ValueError("mark_output: the stand-in's tensors have no names; pass the output's name")
        sys.modules[__package__ + ".modeling_utils"].mark_output(self, name, dtype)

    def rank(self):
        return torch.Tensor.dim(self)

    def ndim(self):   # noqa: D102 - a method on the real Tensor, not torch's property
        return torch.Tensor.dim(self)

    def _unimplemented(name):
        def f(self, *args, **kwargs):
            raise NotImplementedError(f"Tensor.{name} exists in TensorRT-LLM but the stand-in does not implement it "
                                      f"(not used by the network)")
        f.__name__ = name
        return f

    mean = _unimplemented("mean")
    abs = _unimplemented("abs")
    sqrt = _unimplemented("sqrt")
    log = _unimplemented("log")
    squeeze = _unimplemented("squeeze")
    split = _unimplemented("split")
    unbind = _unimplemented("unbind")
    repeat = _unimplemented("repeat")
    is_dynamic = _unimplemented("is_dynamic")
    del _unimplemented

    __rtruediv__ = _absent("__rtruediv__")
    __rfloordiv__ = _absent("__rfloordiv__")
    __rmod__ = _absent("__rmod__")
    __neg__ = _absent("__neg__")
    __pow__ = _absent("__pow__")
    __rpow__ = _absent("__rpow__")
    __and__ = _absent("__and__")
    __rand__ = _absent("__rand__")
    __or__ = _absent("__or__")
    __ror__ = _absent("__ror__")
    __invert__ = _absent("__invert__")
    __getitem__ = _absent("__getitem__")
    __ne__ = _absent("__ne__")
    for _name in ("reshape", "expand", "to", "float", "long", "int", "half", "double", "tolist", "item", "numpy",
                  "contiguous", "clone", "detach", "sum", "softmax", "exp", "sigmoid", "__len__", "__iter__",
                  "__bool__", "__index__", "__int__", "__float__",
                  # no writes in place: a TensorRT tensor is an edge of the graph (and the stand-in's constants are
                  # shared between steps, tensor.scalar / functional.constant)
                  "__setitem__", "add_", "sub_", "mul_", "div_", "copy_", "fill_", "zero_", "clamp_", "masked_fill_",
                  "index_put_", "scatter_", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                  "__irshift__"):
        locals()[_name] = _absent(_name)
    del _name
    del _absent

    # TensorRT-LLM's Tensor has no in-place operators, so Python's `x += y` makes x + y: the same here (torch's would
    # write into x)
    __iadd__, __isub__, __imul__ = __add__, __sub__, __mul__
    __itruediv__, __ifloordiv__, __imod__ = __truediv__, __floordiv__, __mod__


def _not(x):
    return eq(x, False)


def _functional():
    """The stand-in's functional module (it made every Tensor there is, so it is loaded; looked up rather than
    imported: functional imports this module)."""
    return sys.modules[__package__ + ".functional"]


def raw(x):
    """The plain torch tensor behind ``x`` (any other value unchanged)."""
    return x.as_subclass(torch.Tensor) if isinstance(x, Tensor) else x


def wrap(x):
    """A layer output: a device :class:`Tensor` sharing ``x``'s storage."""
    if isinstance(x, torch.Tensor):
        return torch.Tensor.as_subclass(x, Tensor)
    return x


def network_input(x: torch.Tensor, name: str, location: str) -> Tensor:
    """A tensor bound to engine input ``name`` in ``location`` memory (what the runtime hands the engine)."""
    t = torch.Tensor.as_subclass(torch.as_tensor(x), Tensor)
    t.location, t.is_network_input, t.input_name = location, True, name
    return t


# ---- TensorRT-LLM's conversion rules for Python scalars and the elementwise ops (functional.py:
# constant_to_tensor_, constants_to_tensors_, broadcast_helper, elementwise_binary); functional re-exports them
def const_tensor(x, dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """constant_to_tensor_: a Python scalar as a [1] constant (bool -> bool, int -> int32, float -> float32 when
    dtype is None) on ``device`` (default: :func:`current_device`); a Tensor as it is."""
    if isinstance(x, torch.Tensor):
        return raw(x)
    if dtype is None:
        dtype = torch.bool if isinstance(x, bool) else torch.int32 if isinstance(x, int) else torch.float32
    if dtype == torch.int32 and isinstance(x, int) and not INT32_RANGE[0] <= x <= INT32_RANGE[1]:
        raise OverflowError(f"Python int {x} does not fit the int32 constant TensorRT-LLM makes of it "
                            f"(int32_array); make an int64 constant explicitly")
    return scalar(x, dtype, current_device() if device is None else device)


def const_tensors(*xs) -> list[torch.Tensor]:
    """constants_to_tensors_: when an input is an int64 Tensor (or an int beyond int32), Python ints become int64
    constants; Tensors are never cast. Scalars are made where the Tensor operands are (a shape computation stays
    on the host), and the results share one device (:func:`align`)."""
    dev = next((x.device for x in xs if isinstance(x, torch.Tensor)), None)
    has64 = builtins.any((isinstance(x, int) and not isinstance(x, bool) and not INT32_RANGE[0] <= x <= INT32_RANGE[1])
                         or (isinstance(x, torch.Tensor) and x.dtype == torch.int64) for x in xs)
    return list(align(*(const_tensor(x, torch.int64 if has64 and isinstance(x, int) and not isinstance(x, bool)
                                     else None, dev) for x in xs)))


def check_same_dtype(op: str, tensors: Sequence[torch.Tensor]) -> None:
    kinds = {t.dtype for t in tensors}
    if len(kinds) > 1:
        raise TypeError(f"{op}: inputs of mixed dtypes {sorted(str(k) for k in kinds)} (TensorRT's layer refuses "
                        f"them; TensorRT-LLM does not cast Tensor operands here)")


def _scalar_as(x, dtype: torch.dtype, op: str, device) -> torch.Tensor:
    """broadcast_helper in a strongly typed network (BuildConfig.strongly_typed defaults to True): a Python scalar
    becomes a constant of the other operand's dtype. A float meeting an integer Tensor would be truncated there
    (int32_array([0.5]) == 0) and an int beyond the integer dtype overflows: both refused here."""
    if not dtype.is_floating_point and dtype != torch.bool and isinstance(x, float):
        raise TypeError(f"{op}: the Python float {x!r} would become a {dtype} constant (truncated); cast the "
                        f"Tensor or use an int")
    if dtype == torch.int32 and isinstance(x, int) and not INT32_RANGE[0] <= x <= INT32_RANGE[1]:
        raise OverflowError(f"{op}: Python int {x} does not fit the int32 constant TensorRT-LLM makes of it "
                            f"next to an int32 Tensor (int32_array)")
    return scalar(x, dtype, device)


def _binary(left, right, fn, op: str):
    """elementwise_binary over broadcast_helper, strongly typed (TensorRT-LLM's default build): a Python scalar
    takes the Tensor operand's dtype; an int32 Tensor meeting an int64 one is cast to int64; any other dtype
    mismatch between two Tensors reaches TensorRT's IElementWiseLayer, which refuses it in a strongly typed
    network (no implicit float promotion)."""
    lt_, rt_ = isinstance(left, torch.Tensor), isinstance(right, torch.Tensor)
    if not (lt_ or rt_):
        raise TypeError(f"{op}: at least one operand must be a Tensor")
    a = raw(left) if lt_ else _scalar_as(left, right.dtype, op, right.device)
    b = raw(right) if rt_ else _scalar_as(right, a.dtype, op, a.device)
    a, b = align(a, b)
    if {a.dtype, b.dtype} == {torch.int32, torch.int64}:
        a, b = a.long(), b.long()
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: operands of dtypes {a.dtype} and {b.dtype} (TensorRT's IElementWiseLayer refuses "
                        f"them in a strongly typed network; cast explicitly)")
    return wrap(fn(a, b))


def add(left, right) -> Tensor:
    return _binary(left, right, torch.add, "add")


def sub(left, right) -> Tensor:
    return _binary(left, right, torch.sub, "sub")


def mul(left, right) -> Tensor:
    return _binary(left, right, torch.mul, "mul")


def div(left, right) -> Tensor:
    def f(a, b):
        return torch.div(a, b) if a.dtype.is_floating_point else torch.div(a, b, rounding_mode="trunc")
    return _binary(left, right, f, "div")


def floordiv(left, right) -> Tensor:
    return _binary(left, right, lambda a, b: torch.div(a, b, rounding_mode="floor"), "floordiv")


def eq(left, right) -> Tensor:
    return _binary(left, right, torch.eq, "eq")


def lt(left, right) -> Tensor:
    return _binary(left, right, torch.lt, "lt")


def gt(left, right) -> Tensor:
    return _binary(left, right, torch.gt, "gt")


def _bool_op(left, right, fn, op):
    dev = next((x.device for x in (left, right) if isinstance(x, torch.Tensor)), None)
    a, b = align(const_tensor(left, device=dev), const_tensor(right, device=dev))
    if a.dtype != torch.bool or b.dtype != torch.bool:
        raise TypeError(f"{op}: TensorRT's logical ops take bool operands, got {a.dtype} and {b.dtype}")
    return wrap(fn(a, b))


def op_and(left, right) -> Tensor:
    return _bool_op(left, right, torch.logical_and, "op_and")


def op_or(left, right) -> Tensor:
    return _bool_op(left, right, torch.logical_or, "op_or")


def minimum(left, right) -> Tensor:
    return _binary(left, right, torch.minimum, "minimum")


def maximum(left, right) -> Tensor:
    return _binary(left, right, torch.maximum, "maximum")


