"""CPU stand-in for ``tensorrt_llm.module`` / ``tensorrt_llm.parameter`` (TensorRT-LLM 1.2).

NOT TensorRT-LLM. ``Module`` registers sub-modules and ``Parameter``s by attribute name, so a
parameter's full name is its dotted attribute path (``transformer.layers.0.attention.qkv.weight``),
exactly the names of the checkpoint's ``rank{N}.safetensors``; ``Parameter.value`` holds the torch
tensor (TensorRT-LLM: the numpy/weights value baked into the engine).
"""

from __future__ import annotations

from typing import Iterator

import torch

from .functional import str_dtype_to_torch
from .tensor import wrap


class Parameter:
    def __init__(self, value: torch.Tensor | None = None, shape=None, dtype=None):
        """TensorRT-LLM 1.2's signature: ``Parameter(value=None, shape=None, dtype=None)``."""
        if shape is None:
            if value is None:
                raise ValueError("Parameter needs a value or a shape")
            shape = tuple(value.shape)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = str_dtype_to_torch(dtype or "float32")
        self._value = None
        if value is not None:
            self.value = value

    @property
    def value(self):
        """The weights as the network sees them: a constant :class:`.tensor.Tensor` (TensorRT-LLM: a constant
        layer's output)."""
        if self._value is None:
            raise RuntimeError(f"parameter of shape {list(self.shape)} was never loaded")
        return self._wrapped

    @value.setter
    def value(self, v: torch.Tensor) -> None:
        v = torch.as_tensor(v)
        if tuple(v.shape) != self.shape:
            raise ValueError(f"parameter shape {list(self.shape)}, got {list(v.shape)}")
        self._value = v.to(self.dtype)
        self._wrapped = wrap(self._value)

    @property
    def is_loaded(self) -> bool:
        return self._value is not None


class Module:
    def __init__(self) -> None:
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_parameters", {})

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, Parameter):
            self._parameters[name] = value
        object.__setattr__(self, name, value)

    def forward(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        for n, p in self._parameters.items():
            if p is not None:
                yield prefix + n, p
        for n, m in self._modules.items():
            yield from m.named_parameters(prefix + n + ".")

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        yield prefix.rstrip("."), self
        for n, m in self._modules.items():
            yield from m.named_modules(prefix + n + ".")


class ModuleList(Module):
    def __init__(self, modules) -> None:
        super().__init__()
        self._list = []
        for i, m in enumerate(modules):
            setattr(self, str(i), m)
            self._list.append(m)

    def __getitem__(self, i):
        return self._list[i]

    def __len__(self) -> int:
        return len(self._list)

    def __iter__(self):
        return iter(self._list)
