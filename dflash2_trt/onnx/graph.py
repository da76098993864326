"""A small ONNX graph builder: named values, opset-aware helpers, weights streamed to external data.

The drafter graph is written node by node (not traced through ``torch.onnx``), so every node,
name, dtype and dynamic dimension is the one this package chose, and the PyTorch reference stays
an independent statement of the same math (tests/onnx compares the two).

Weights (initializers of at least :data:`EXTERNAL_MIN_BYTES`) are appended to ONE external data
file as they are added, each at a 64-byte aligned offset, so a big model is never held in memory
at once and the ``.onnx`` file itself stays small (protobuf caps a file at 2 GiB). Small constants
(shape vectors, masks) stay inline.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

__all__ = ["OPSETS", "EXTERNAL_MIN_BYTES", "ONNX_DTYPES", "GraphBuilder", "onnx_dtype"]

OPSETS = range(17, 24)
"""Default-domain opsets the exporter writes (17..23; ReduceMean/Max/Min take axes as an input
from 18 on, as an attribute before)."""

EXTERNAL_MIN_BYTES = 1024
_ALIGN = 64

ONNX_DTYPES = {
    "float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
    "int32": TensorProto.INT32, "int64": TensorProto.INT64, "bool": TensorProto.BOOL,
}
_TORCH_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                torch.int32: "int32", torch.int64: "int64", torch.bool: "bool"}


def onnx_dtype(dtype: str | torch.dtype) -> int:
    return ONNX_DTYPES[_TORCH_NAMES.get(dtype, dtype)]  # type: ignore[arg-type]


def _raw_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    if t.dtype == torch.bool:
        return t.numpy().astype(np.bool_).tobytes()
    return t.numpy().tobytes()


class GraphBuilder:
    """Collects nodes, inputs, outputs and initializers of one graph.

    Args:
        opset: default-domain opset (one of :data:`OPSETS`).
        data_path: external data file for the weights (created here); ``None`` keeps every
            initializer inline (small test graphs).
    """

    def __init__(self, opset: int, data_path: str | os.PathLike | None = None):
        if opset not in OPSETS:
            raise ValueError(f"opset {opset} not in {OPSETS.start}..{OPSETS.stop - 1}")
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[TensorProto] = []
        self.domains: dict[str, int] = {}
        self._used: set[str] = set()
        self._consts: dict[tuple, str] = {}
        self.data_path = Path(data_path) if data_path is not None else None
        self._data = open(self.data_path, "xb") if self.data_path is not None else None
        self._offset = 0
        self.external_bytes = 0

    # ---- names ---------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self._used:
            name = f"{base}_{i}"
            i += 1
        self._used.add(name)
        return name

    # ---- graph I/O ------------------------------------------------------------------------
    def input(self, name: str, dtype: str, shape: Sequence[int | str]) -> str:
        self._claim(name)
        self.inputs.append(helper.make_tensor_value_info(name, ONNX_DTYPES[dtype], list(shape)))
        return name

    def output(self, name: str, dtype: str, shape: Sequence[int | str]) -> None:
        """Declare ``name`` (an existing value, produced by a node) a graph output."""
        if name not in self._used:
            raise ValueError(f"output {name!r} is produced by no node")
        self.outputs.append(helper.make_tensor_value_info(name, ONNX_DTYPES[dtype], list(shape)))

    def _claim(self, name: str) -> None:
        if name in self._used:
            raise ValueError(f"value name {name!r} used twice")
        self._used.add(name)

    # ---- constants and weights --------------------------------------------------------------
    def const(self, value, dtype: str | None = None, name: str = "const") -> str:
        """A small inline initializer (deduplicated by value)."""
        arr = np.asarray(value) if dtype is None else np.asarray(value, dtype=_NP[dtype])
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key in self._consts:
            return self._consts[key]
        n = self.fresh(name)
        self.initializers.append(onnx.numpy_helper.from_array(arr, n))
        self._consts[key] = n
        return n

    def weight(self, name: str, tensor: torch.Tensor) -> str:
        """A weight initializer named ``name``: external data when large, else inline."""
        self._claim(name)
        raw = _raw_bytes(tensor)
        t = TensorProto(name=name, data_type=onnx_dtype(tensor.dtype), dims=list(tensor.shape))
        if self._data is None or len(raw) < EXTERNAL_MIN_BYTES:
            t.raw_data = raw
        else:
            pad = -self._offset % _ALIGN
            if pad:
                self._data.write(b"\0" * pad)
                self._offset += pad
            self._data.write(raw)
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", self.data_path.name), ("offset", str(self._offset)),
                         ("length", str(len(raw)))):
                e = t.external_data.add()
                e.key, e.value = k, v
            self._offset += len(raw)
            self.external_bytes += len(raw)
        self.initializers.append(t)
        return name

    def close_data(self) -> None:
        if self._data is not None and not self._data.closed:
            self._data.flush()
            os.fsync(self._data.fileno())
            self._data.close()

    # ---- nodes ------------------------------------------------------------------------------
    def op(self, op_type: str, *inputs: str | None, outputs: int | Sequence[str] = 1, domain: str = "",
           name: str | None = None, **attrs):
        """Add one node; returns its output name (or the list of names when it has several)."""
        if isinstance(outputs, int):
            outs = [self.fresh(f"{(name or op_type).lower()}_out") for _ in range(outputs)]
        else:
            outs = list(outputs)
            for o in outs:
                self._claim(o)
        node_name = self.fresh(name or op_type)
        self.nodes.append(helper.make_node(op_type, ["" if i is None else i for i in inputs], outs,
                                           name=node_name, domain=domain or None, **attrs))
        if domain:
            self.domains.setdefault(domain, 1)
        return outs[0] if len(outs) == 1 else outs

    # ---- opset-aware helpers ------------------------------------------------------------------
    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: int = 1) -> str:
        axes_input = op_type == "ReduceSum" or self.opset >= 18
        if axes_input:
            return self.op(op_type, x, self.const(list(axes), "int64", "axes"), keepdims=keepdims)
        return self.op(op_type, x, axes=list(axes), keepdims=keepdims)

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Unsqueeze", x, self.const(list(axes), "int64", "axes"))

    def squeeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Squeeze", x, self.const(list(axes), "int64", "axes"))

    def reshape(self, x: str, shape: Sequence[int] | str) -> str:
        s = shape if isinstance(shape, str) else self.const(list(shape), "int64", "shape")
        return self.op("Reshape", x, s)

    def slice(self, x: str, starts, ends, axes, steps=None) -> str:
        def vec(v):
            return v if isinstance(v, str) else self.const(list(v), "int64", "slice")
        args = [x, vec(starts), vec(ends), vec(axes)] + ([vec(steps)] if steps is not None else [])
        return self.op("Slice", *args)

    def dim(self, x: str, axis: int) -> str:
        """Dimension ``axis`` of ``x`` as an int64 vector of length 1."""
        return self.op("Shape", x, start=axis, end=axis + 1)

    def cast(self, x: str, dtype: str, current: str | None = None) -> str:
        if current == dtype:
            return x
        return self.op("Cast", x, to=ONNX_DTYPES[dtype])

    def gather(self, x: str, index: int | str, axis: int) -> str:
        idx = index if isinstance(index, str) else self.const(np.int64(index), name="index")
        return self.op("Gather", x, idx, axis=axis)

    # ---- the model ----------------------------------------------------------------------------
    def model(self, graph_name: str, doc: str = "") -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs, self.initializers, doc_string=doc)
        opsets = [helper.make_opsetid("", self.opset)] + [helper.make_opsetid(d, v) for d, v in self.domains.items()]
        ir = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
        return helper.make_model(g, opset_imports=opsets, ir_version=ir, producer_name="dflash2-trt")


_NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64, "bool": np.bool_}
