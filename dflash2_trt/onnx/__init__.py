"""ONNX export of the DFlash2 drafter (plugin nodes or a plugin-free decomposition), and the
runtimes that check it on a CPU machine: onnxruntime with the plugins' CPU builds as custom ops
(:mod:`.ort`) and a TensorRT-RTX build (:mod:`.rtx`).

The ``onnx`` package is an optional dependency (``pip install -e '.[onnx]'``): nothing here imports
it until :func:`export_onnx` is called.
"""

from __future__ import annotations

from ..errors import MissingDependencyError

__all__ = ["export_onnx", "require"]


def require(module: str, extra: str = "onnx"):
    """Import ``module`` or raise a MissingDependencyError naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(f"{module} is not installed ({exc}); install the extra: "
                                     f"pip install -e '.[{extra}]'") from None


def export_onnx(*args, **kwargs):
    """See :func:`dflash2_trt.onnx.export.export_onnx`."""
    require("onnx")
    from .export import export_onnx as _export

    return _export(*args, **kwargs)
