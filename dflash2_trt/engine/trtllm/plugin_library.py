"""The DFlash2 plugin library for TensorRT-LLM: ``libdflash2_plugins.so`` built with CMake against the TensorRT
headers for the GPU's architecture (no GPU: the build config's ``gpus``), cached under
``$DFLASH2_TRT_CACHE/plugins-trt/<sha256>/`` (the hash covers every file under ``plugins/``, the flags, the
TensorRT header version and nvcc's version); ``DFLASH2_PLUGIN_LIB`` names a prebuilt one instead. Loading it into a
process is :mod:`dflash2_trt.plugins`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from ...cpu_threads import available_cpus
from ...errors import ConfigError, MissingDependencyError
from ...plugins import LIBRARY_NAME, plugin_dir
from ..common import shell_line
from .command import cuda_archs
from .process import EngineBuildError, exit_description, log_tail
from .toolchain import Toolchain, plugin_toolchain_missing

PLUGIN_TARGET = "dflash2_plugins"
_PLUGIN_HASH_VERSION = b"dflash2-trt plugins-trt 1\0"


def plugin_archs(cfg, toolchain: Toolchain) -> tuple[str, ...]:
    """The architectures to build the plugin library for: the local GPU's (which must be one of the build
    config's ``gpus``), else all of ``gpus`` (cross-compiling needs no GPU)."""
    if toolchain.gpu_sm:
        if toolchain.gpu_sm not in cfg.gpus:
            raise ConfigError(f"this machine's GPU {toolchain.gpu_name} ({toolchain.gpu_sm}) is not one of the build "
                              f"config's gpus ({', '.join(cfg.gpus)}); the kernels target Hopper and Blackwell",
                              source=cfg.source, field="gpus")
        return (toolchain.gpu_sm,)
    return tuple(cfg.gpus)


def _plugin_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not any(part.startswith(".") or part == "build" or part.startswith("build-")
                                   for part in rel.parts):
            out.append(p)
    return out


def plugin_digest(root: Path, archs, toolchain: Toolchain) -> str:
    h = hashlib.sha256(_PLUGIN_HASH_VERSION)
    for a in archs:
        h.update(f"arch={a}\0".encode())
    h.update(f"cuda={toolchain.cuda}\0".encode())
    inc = Path(toolchain.tensorrt_include or "")
    ver = inc / "NvInferVersion.h"
    h.update(ver.read_bytes() if ver.is_file() else b"no NvInferVersion.h")
    for f in _plugin_files(root):
        data = f.read_bytes()
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def plugin_cache_dir() -> Path:
    from ...trtllm.cpu.plugin_libs import cache_dir   # imports torch: only when a build needs the cache

    return cache_dir() / "plugins-trt"


def cmake_commands(root: Path, build_dir: Path, archs, toolchain: Toolchain) -> list[list[str]]:
    configure = [toolchain.cmake or "cmake", "-S", str(root), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DCMAKE_CUDA_ARCHITECTURES={cuda_archs(archs)}",
                 f"-DTensorRT_INCLUDE_DIR={toolchain.tensorrt_include}"]
    inc = Path(toolchain.tensorrt_include or "")
    if inc.name == "include":
        configure.append(f"-DTensorRT_ROOT={inc.parent}")
    if toolchain.nvcc:
        configure.append(f"-DCMAKE_CUDA_COMPILER={toolchain.nvcc}")
    build = [toolchain.cmake or "cmake", "--build", str(build_dir), "--target", PLUGIN_TARGET, "-j",
             str(available_cpus())]
    return [configure, build]


def ensure_plugin_library(cfg, toolchain: Toolchain, runner, *, progress=None) -> dict:
    """``{"path", "cached", "archs", "commands"}`` of the plugin library, built into the cache unless there."""
    env_lib = os.environ.get("DFLASH2_PLUGIN_LIB")
    if env_lib:
        p = Path(env_lib)
        if not p.is_file():
            raise ConfigError(f"{p} does not exist", field="DFLASH2_PLUGIN_LIB")
        return {"path": str(p.resolve()), "cached": True, "archs": None, "commands": [], "from": "DFLASH2_PLUGIN_LIB"}
    archs = plugin_archs(cfg, toolchain)
    root = plugin_dir().resolve()
    if not (root / "CMakeLists.txt").is_file():
        raise MissingDependencyError(f"the plugin sources are not in {root} (a wheel does not carry plugins/): set "
                                     f"DFLASH2_PLUGIN_DIR to a checkout's plugins/, or DFLASH2_PLUGIN_LIB to a built "
                                     f"{LIBRARY_NAME}")
    missing = plugin_toolchain_missing(toolchain)
    if missing:
        raise MissingDependencyError("cannot build the plugin library: " + "; ".join(missing))
    digest = plugin_digest(root, archs, toolchain)
    final = plugin_cache_dir() / digest
    lib = final / LIBRARY_NAME
    if lib.is_file():
        if progress:
            progress(f"plugins: cached {lib}")
        return {"path": str(lib), "cached": True, "archs": list(archs), "commands": [], "sha256_of_sources": digest}
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        cmds = cmake_commands(root, work / "build", archs, toolchain)
        log = work / "build.log"
        if progress:
            progress(f"plugins: building {LIBRARY_NAME} for {', '.join(archs)} (log {log})")
        for argv in cmds:
            with open(log, "a") as fh:
                fh.write(f"# {shell_line(argv)}\n")
            rc = runner(argv, env={}, log=log, cwd=None, echo=None)
            if rc != 0:
                raise EngineBuildError(f"CMake failed ({exit_description(rc)}) building the plugin library: {shell_line(argv)}"
                                       f"\n{log_tail(log)}")
        cache = _read_cmake_cache(work / "build" / "CMakeCache.txt")
        inc = cache.get("TensorRT_INCLUDE_DIR", "")
        if not inc or inc.endswith("NOTFOUND"):
            raise EngineBuildError(f"CMake did not find the TensorRT headers (TensorRT_INCLUDE_DIR={inc!r}), so the "
                                   f"library would hold kernels but no plugins; set TensorRT_ROOT")
        built = work / "build" / LIBRARY_NAME
        if not built.is_file():
            raise EngineBuildError(f"CMake exited 0 but wrote no {built}\n{log_tail(log)}")
        stage = work / "out"
        stage.mkdir()
        shutil.copy2(built, stage / LIBRARY_NAME)
        shutil.copy2(log, stage / "build.log")
        (stage / "build.json").write_text(json.dumps({"archs": list(archs), "commands": cmds,
                                                      "toolchain": toolchain.to_dict()}, indent=2) + "\n")
        try:
            os.rename(stage, final)
        except OSError:
            if not lib.is_file():   # not a concurrent build that got there first
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"path": str(lib), "cached": False, "archs": list(archs), "commands": cmds, "sha256_of_sources": digest}


def _read_cmake_cache(path: Path) -> dict[str, str]:
    out = {}
    try:
        for line in path.read_text(errors="replace").splitlines():
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):[A-Z]+=(.*)$", line)
            if m:
                out[m.group(1)] = m.group(2)
    except OSError:
        pass
    return out
