"""Build an exported graph with TensorRT-RTX on a CPU machine: a real TensorRT builder, no GPU.

``tensorrt-rtx-cu13`` (PyPI, the ``tensorrt-rtx`` extra) parses ONNX and builds plans without a
GPU. What such a build proves and what it does not:

- it runs TensorRT's ONNX parser over every node, TensorRT's shape and type checks over the whole
  network at every optimisation-profile corner, and the plugins' build-time methods
  (``getOutputDataTypes``, ``getOutputShapes``, ``supportsFormatCombination``, ``configurePlugin``,
  ``getWorkspaceSize``, ``clone``, ``getFieldsToSerialize``) of ``libdflash2_plugins_dynamic.so``;
- RTX targets only SM75/80/86/89/120/121: **SM90 (H200) and SM100 (B200) are rejected**, so the
  plan is not an H200/B200 engine, and nothing is executed (``enqueue`` never runs; deserialising
  needs a GPU). The H200/B200 engine is built with TensorRT 10.13's trtexec (see
  :func:`dflash2_trt.onnx.export.trtexec_command`).

Plugin graphs: the plugin library is loaded with ``IPluginRegistry.load_library`` (the
``getCreators`` entry point of the dynamic variant) and embedded in the plan
(``plugins_to_serialize``). RTX's ONNX parser aborts on the first plugin node unless an
UNVERSIONED ``libtensorrt_rtx.so`` is on the loader path, which the wheel does not ship; the loader
reads ``LD_LIBRARY_PATH`` only at process start, so :func:`build_in_subprocess` runs the build in a
fresh interpreter with a directory holding that symlink on ``LD_LIBRARY_PATH``. With
``DFLASH2_PLUGIN_TRACE=1`` the plugins print one ``[dflash2 plugin] trace ...`` line per build-time
call on stderr (plugins/common/df2PluginUtils.h); errors are printed there in any case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import DFlash2Error
from . import require

__all__ = ["COMPUTE_CAPABILITIES", "RtxBuild", "build", "build_in_subprocess", "rtx_library_dir"]

COMPUTE_CAPABILITIES = ("SM75", "SM80", "SM86", "SM89", "SM120", "SM121")
"""What TensorRT-RTX 1.7 accepts; SM90 / SM100 are not among them."""


@dataclass
class RtxBuild:
    ok: bool
    seconds: float
    plan_bytes: int
    compute_capability: str
    plugin_layers: list[str] = field(default_factory=list)
    network_outputs: dict[str, dict] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)


def _profile_from_manifest(graph: Path) -> dict[str, tuple[list[int], list[int], list[int]]]:
    from .export import profile_shapes

    m = graph.parent / "manifest.json"
    if not m.is_file():
        raise DFlash2Error(f"{m}: not found; give the optimisation profile explicitly")
    return profile_shapes(json.loads(m.read_text()))


def build(graph: str | os.PathLike, *, plugin_library: str | os.PathLike | None = None,
          compute_capability: str = "SM89", profile: dict | None = None, verbose: bool = False) -> RtxBuild:
    """Parse ``graph`` and build a plan for ``compute_capability`` in this process. ``profile``:
    input name -> (min, opt, max) shapes (default: from the export's manifest.json)."""
    trt = require("tensorrt_rtx", extra="tensorrt-rtx")
    graph = Path(graph)
    if compute_capability not in COMPUTE_CAPABILITIES:
        raise DFlash2Error(f"compute capability {compute_capability!r}: TensorRT-RTX builds for "
                           f"{', '.join(COMPUTE_CAPABILITIES)} only (not SM90/SM100)")
    profile = _profile_from_manifest(graph) if profile is None else profile
    log: list[str] = []

    class _Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            if verbose or severity <= trt.ILogger.Severity.WARNING:
                log.append(f"{severity.name}: {msg}")

    logger = _Logger()
    t0 = time.perf_counter()
    builder = trt.Builder(logger)
    if plugin_library is not None:
        lib = str(Path(plugin_library).resolve())
        if builder.get_plugin_registry().load_library(lib) is None:
            raise DFlash2Error(f"{lib}: TensorRT-RTX could not load the plugin library (see the log: "
                               f"{'; '.join(log[-3:])})")
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    errors: list[str] = []
    if not parser.parse_from_file(str(graph)):
        errors = []
        for i in range(parser.num_errors):
            e = parser.get_error(i)
            errors.append(f"node {e.node_name()} ({e.node_operator()}): {e.desc()}")
        return RtxBuild(False, time.perf_counter() - t0, 0, compute_capability, errors=errors, log=log)
    plugin_layers = [network.get_layer(i).name for i in range(network.num_layers)
                     if network.get_layer(i).type == trt.LayerType.PLUGIN_V3]
    outputs = {}
    for i in range(network.num_outputs):
        t = network.get_output(i)
        outputs[t.name] = {"dtype": str(t.dtype).split(".")[-1], "shape": list(t.shape)}
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(getattr(trt.ComputeCapability, compute_capability), 0)
    if plugin_library is not None:
        config.plugins_to_serialize = [str(Path(plugin_library).resolve())]
    prof = builder.create_optimization_profile()
    dynamic = False
    for i in range(network.num_inputs):
        inp = network.get_input(i)
        if all(d >= 0 for d in inp.shape) and inp.name not in profile:
            continue  # a static input needs no profile
        if inp.name not in profile:
            raise DFlash2Error(f"{graph}: input {inp.name!r} has no shapes in the optimisation profile")
        lo, opt, hi = profile[inp.name]
        prof.set_shape(inp.name, lo, opt, hi)
        dynamic = True
    if dynamic:
        config.add_optimization_profile(prof)
    plan = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - t0
    if plan is None:
        errors = [m for m in log if m.startswith(("ERROR", "INTERNAL_ERROR"))] or ["build failed (no plan)"]
        return RtxBuild(False, seconds, 0, compute_capability, plugin_layers, outputs, errors, log)
    return RtxBuild(True, seconds, plan.nbytes, compute_capability, plugin_layers, outputs, [], log)


def rtx_library_dir(workdir: str | os.PathLike) -> Path:
    """A directory holding ``libtensorrt_rtx.so`` -> the wheel's ``libtensorrt_rtx.so.1`` (the
    unversioned name RTX's ONNX parser dlopens for plugin nodes)."""
    import importlib.util

    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    if spec is None or not spec.submodule_search_locations:
        raise DFlash2Error("tensorrt_rtx_libs not found; install the extra: pip install -e '.[tensorrt-rtx]'")
    real = Path(list(spec.submodule_search_locations)[0]) / "libtensorrt_rtx.so.1"
    if not real.is_file():
        raise DFlash2Error(f"{real}: not found in the tensorrt-rtx wheel")
    d = Path(workdir)
    d.mkdir(parents=True, exist_ok=True)
    link = d / "libtensorrt_rtx.so"
    if not link.is_symlink():
        link.symlink_to(real)
    return d


def build_in_subprocess(graph: str | os.PathLike, *, plugin_library: str | os.PathLike | None = None,
                        compute_capability: str = "SM89", profile: dict | None = None, trace: bool = True,
                        timeout: float = 300) -> tuple[RtxBuild, str]:
    """:func:`build` in a fresh interpreter set up for plugin nodes (see the module docstring).
    Returns the build report and the child's stderr (the plugins' trace and error lines)."""
    with tempfile.TemporaryDirectory(prefix="dflash2-rtx-") as tmp:
        libdir = rtx_library_dir(Path(tmp) / "lib")
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libdir), env.get("LD_LIBRARY_PATH")]))
        if trace:
            env["DFLASH2_PLUGIN_TRACE"] = "1"
        args = {"graph": str(graph), "plugin_library": None if plugin_library is None else str(plugin_library),
                "compute_capability": compute_capability, "profile": profile}
        req = Path(tmp) / "request.json"
        req.write_text(json.dumps(args))
        res = subprocess.run([sys.executable, "-m", "dflash2_trt.onnx.rtx", str(req)], capture_output=True,
                             text=True, env=env, timeout=timeout)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise DFlash2Error(f"the TensorRT-RTX build process failed (exit {res.returncode}): "
                           f"{(res.stderr.strip().splitlines() or ['no output'])[-1]}")
    return RtxBuild(**json.loads(lines[-1])), res.stderr


def _main(argv: list[str]) -> int:
    args = json.loads(Path(argv[0]).read_text())
    prof = args.pop("profile")
    if prof is not None:
        prof = {k: tuple(v) for k, v in prof.items()}
    report = build(args["graph"], plugin_library=args["plugin_library"],
                   compute_capability=args["compute_capability"], profile=prof)
    sys.stderr.flush()
    print(json.dumps(asdict(report)), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover - run by build_in_subprocess
    sys.exit(_main(sys.argv[1:]))
