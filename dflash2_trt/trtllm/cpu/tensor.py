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
"""

from __future__ import annotations

import torch


class Tensor(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl
    location = "device"
    is_network_input = False
    input_name = None

    # ---- the real Tensor's operators (functional.py: Tensor.__add__ ... __le__) ----------------------------
    def __add__(self, b):
        return _F().add(self, b)

    def __radd__(self, b):
        return _F().add(b, self)

    def __sub__(self, b):
        return _F().sub(self, b)

    def __rsub__(self, b):
        return _F().sub(b, self)

    def __mul__(self, b):
        return _F().mul(self, b)

    def __rmul__(self, b):
        return _F().mul(b, self)

    def __truediv__(self, b):
        return _F().div(self, b)

    def __floordiv__(self, b):
        return _F().floordiv(self, b)

    def __mod__(self, b):
        F = _F()
        return F.sub(self, F.mul(F.floordiv(self, b), b))

    def __lt__(self, b):
        return _F().lt(self, b)

    def __gt__(self, b):
        return _F().gt(self, b)

    def __eq__(self, b):
        return _F().eq(self, b)

    def __ge__(self, b):
        F = _F()
        return F.op_or(F.gt(self, b), F.eq(self, b))

    def __le__(self, b):
        F = _F()
        return F.op_or(F.lt(self, b), F.eq(self, b))

    def __xor__(self, b):
        F = _F()
        return F.op_or(F.op_and(self, _not(b)), F.op_and(_not(self), b))

    __hash__ = torch.Tensor.__hash__

    # ---- what the real Tensor does not have --------------------------------------------------------------
    def _absent(name):
        def f(self, *args, **kwargs):
            raise TypeError(f"tensorrt_llm's Tensor has no {name} (api_1_2.yaml tensor_operators.absent); "
                            f"use the functional form")
        f.__name__ = name
        return f

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
    del _absent


def _not(x):
    F = _F()
    return F.eq(x, False)


def _F():
    from . import functional

    return functional


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
