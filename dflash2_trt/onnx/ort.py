"""onnxruntime (CPU) with the DFlash2 plugins' CPU builds as custom ops.

The onnxruntime wheel ships no C API header (``onnxruntime_c_api.h``), and no package reachable
here does, so a C++ custom-op library cannot be compiled against it. The custom ops are
therefore registered through onnxruntime-extensions' Python custom-op bridge (``onnx_op``: a
Python function as the kernel of a node), and each kernel calls the plugin's CPU build
(``plugins/*/…Cpu.cpp`` + ``…Params.cpp``, compiled by :mod:`dflash2_trt.trtllm.cpu.plugin_libs`):
the same math headers the CUDA kernels use and the same validation function as the TensorRT
glue, so a shape the plugin refuses fails here with the plugin's own message.

That bridge registers every op in ONE domain, ``ai.onnx.contrib``, with a fixed input count per
op type, so :func:`for_onnxruntime` hands onnxruntime a copy of the graph in which each
``dflash2::DFlash2DynamicConv`` node is ``ai.onnx.contrib::DFlash2DynamicConv`` (3 inputs) or
``…DFlash2DynamicConvFused`` (4 inputs, ``fuse_residual = 1``) and ``dflash2::DFlash2PairwiseScan``
is ``ai.onnx.contrib::DFlash2PairwiseScan``; inputs, outputs and attributes are untouched. The
exported file itself is never changed. The bridge's kernels are fp32 (the plugins' fp16/bf16 paths
are checked bit for bit in tests/plugins; a fp16/bf16 export with plugins runs on TensorRT).

An exception raised inside a bridged kernel would abort the process (it crosses onnxruntime's C++
frames), so a kernel the plugin rejects records the plugin's message, returns NaN-filled outputs
of the expected shapes, and :class:`Session` raises that message as a
:class:`~dflash2_trt.trtllm.cpu.plugin_libs.PluginRunError` once the run returns (or fails on the
wrong outputs). Use sessions from one thread at a time.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from ..errors import DFlash2Error
from . import require

__all__ = ["CONTRIB_DOMAIN", "Session", "register_custom_ops", "for_onnxruntime", "session"]

CONTRIB_DOMAIN = "ai.onnx.contrib"
_FUSED = "DFlash2DynamicConvFused"
_LOCK = threading.Lock()
_LIBRARY: str | None = None
_ERRORS: list[str] = []   # plugin rejections of the current run (see the module docstring)


def _guarded(kernel, fallback):
    """``kernel`` that never raises into onnxruntime: a failure is recorded, ``fallback(*inputs)`` returned."""
    def run(*inputs, **attrs):
        try:
            return kernel(*inputs, **attrs)
        except Exception as exc:  # noqa: BLE001 - anything raised here would abort the process
            _ERRORS.append(str(exc) or type(exc).__name__)
            return fallback(*inputs)
    return run


def register_custom_ops() -> str:
    """Register the three custom ops with onnxruntime-extensions once per process; returns the
    custom-op library path for ``SessionOptions.register_custom_ops_library``."""
    global _LIBRARY
    with _LOCK:
        if _LIBRARY is not None:
            return _LIBRARY
        ext = require("onnxruntime_extensions")
        import torch

        from ..trtllm.cpu.plugin_libs import conv_lib, scan_lib

        D = ext.PyCustomOpDef
        conv_attrs = {"block_size": D.dt_int64, "kernel_size": D.dt_int64, "group_size": D.dt_int64,
                      "fuse_residual": D.dt_int64}

        def conv(x, delta, base, residual=None, *, block_size, kernel_size, group_size, fuse_residual):
            if int(fuse_residual) != int(residual is not None):
                raise DFlash2Error(f"DFlash2DynamicConv: fuse_residual={fuse_residual} with "
                                   f"{3 + (residual is not None)} inputs")
            t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (x, delta, base)]
            r = None if residual is None else torch.from_numpy(np.ascontiguousarray(residual))
            return conv_lib().run(*t, block_size=int(block_size), group_size=int(group_size), residual=r,
                                  kernel_size=int(kernel_size)).numpy()

        def conv_nan(x, *rest):
            return np.full(x.shape, np.nan, np.float32)

        ext.onnx_op(op_type="DFlash2DynamicConv", inputs=[D.dt_float] * 3, outputs=[D.dt_float],
                    attrs=conv_attrs)(_guarded(lambda x, d, b, **a: conv(x, d, b, **a), conv_nan))
        ext.onnx_op(op_type=_FUSED, inputs=[D.dt_float] * 4, outputs=[D.dt_float],
                    attrs=conv_attrs)(_guarded(lambda x, d, b, r, **a: conv(x, d, b, r, **a), conv_nan))

        def scan(unary, cand, proj, anchor, pred_cb, succ_cb, temperature, uniforms, *, mode):
            ins = [torch.from_numpy(np.ascontiguousarray(a)) for a in
                   (unary, cand, proj, anchor, pred_cb, succ_cb, temperature, uniforms)]
            _, _, ids, q = scan_lib().run(int(mode), *ins)
            return ids.to(torch.int32).numpy(), q.numpy()

        def scan_nan(unary, *rest):
            shape = unary.shape if unary.ndim == 3 else (0, 0, 0)
            return np.full(shape[:2], -1, np.int32), np.full(shape, np.nan, np.float32)

        ext.onnx_op(op_type="DFlash2PairwiseScan",
                    inputs=[D.dt_float, D.dt_int32, D.dt_float, D.dt_int32, D.dt_float, D.dt_float, D.dt_float,
                            D.dt_float],
                    outputs=[D.dt_int32, D.dt_float], attrs={"mode": D.dt_int64})(_guarded(scan, scan_nan))
        _LIBRARY = ext.get_library_path()
        return _LIBRARY


def for_onnxruntime(model):
    """A copy of ``model`` whose ``dflash2`` nodes are the bridge's ``ai.onnx.contrib`` ops."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    found = False
    for n in m.graph.node:
        if n.domain != "dflash2":
            continue
        found = True
        if n.op_type == "DFlash2DynamicConv" and len(n.input) == 4:
            n.op_type = _FUSED
        elif n.op_type not in ("DFlash2DynamicConv", "DFlash2PairwiseScan"):
            raise DFlash2Error(f"node {n.name}: unknown dflash2 op {n.op_type!r}")
        n.domain = CONTRIB_DOMAIN
    if found:
        keep = [o for o in m.opset_import if o.domain != "dflash2"]
        del m.opset_import[:]
        m.opset_import.extend(keep + [onnx.helper.make_opsetid(CONTRIB_DOMAIN, 1)])
    return m


class Session:
    """An ``onnxruntime.InferenceSession`` whose :meth:`run` raises a plugin's rejection as
    :class:`~dflash2_trt.trtllm.cpu.plugin_libs.PluginRunError` (other attributes: the session's)."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def run(self, output_names, feeds, *args, **kwargs):
        from ..trtllm.cpu.plugin_libs import PluginRunError

        _ERRORS.clear()
        try:
            out = self._inner.run(output_names, feeds, *args, **kwargs)
        except Exception:
            if _ERRORS:
                raise PluginRunError(_ERRORS[0]) from None
            raise
        if _ERRORS:
            raise PluginRunError(_ERRORS[0])
        return out

    def run_dict(self, feeds) -> dict:
        """``{output name: array}`` of one run."""
        names = [o.name for o in self._inner.get_outputs()]
        return dict(zip(names, self.run(names, feeds)))


def session(path: str | Path, *, threads: int | None = None) -> Session:
    """An onnxruntime CPU session of the exported graph at ``path`` (custom ops registered when
    the graph has plugin nodes; external data read from the graph's folder)."""
    ort = require("onnxruntime")
    import onnx

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    so = ort.SessionOptions()
    if threads is not None:
        so.intra_op_num_threads = threads
    if any(n.domain == "dflash2" for n in model.graph.node):
        so.register_custom_ops_library(register_custom_ops())
        model = for_onnxruntime(model)
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
        return Session(ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]))
    return Session(ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]))
