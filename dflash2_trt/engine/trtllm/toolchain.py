"""What this machine has for the TensorRT-LLM backend: :class:`Toolchain` and :func:`probe_toolchain`
(TensorRT-LLM, TensorRT, trtllm-build, CMake, nvcc, the TensorRT headers, the GPU), looked at without
importing tensorrt_llm. The builder (:mod:`.build`, :mod:`.plugin_library`) and the dry run
(:mod:`dflash2_trt.engine.plan`) read it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Toolchain:
    """What this machine has for the TensorRT-LLM backend (None = absent)."""

    tensorrt_llm: str | None = None     # version of the importable tensorrt_llm
    tensorrt: str | None = None         # version of the tensorrt Python package
    trtllm_build: str | None = None     # path of the trtllm-build executable
    cmake: str | None = None
    nvcc: str | None = None
    cuda: str | None = None             # nvcc's release, e.g. "12.9"
    tensorrt_include: str | None = None  # directory holding NvInferRuntime.h
    gpu_name: str | None = None
    gpu_sm: str | None = None           # e.g. "sm_90a" (compute capability 9.0)

    def to_dict(self) -> dict:
        return asdict(self)


def _dist_version(*names: str) -> str | None:
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


SUPPORTED_TRTLLM = (1, 2)
"""The TensorRT-LLM minor the network (``trtllm/network``), the build steps and the runtime facts were written and
checked against (pyproject's ``tensorrt-llm>=1.2,<1.3``); the sources read are listed in docs/hybrid-runtime.md."""
ANY_TRTLLM_ENV = "DFLASH2_TRTLLM_ANY_VERSION"
"""``1``: build with an installed TensorRT-LLM outside :data:`SUPPORTED_TRTLLM` anyway (untested; the engine records
the version it was built with)."""


def trtllm_version_problem(version: str | None) -> str | None:
    """Why the installed TensorRT-LLM ``version`` is not one this project builds with, or None (also for None:
    absent is said elsewhere, and for ``unknown``: no metadata to read, e.g. a source tree on PYTHONPATH)."""
    if version is None or version == "unknown":
        return None
    m = re.match(r"(\d+)\.(\d+)", version)
    if m and (int(m[1]), int(m[2])) == SUPPORTED_TRTLLM:
        return None
    want = ".".join(map(str, SUPPORTED_TRTLLM))
    newer = m is not None and (int(m[1]), int(m[2])) > SUPPORTED_TRTLLM
    why = (" (not checked against it; releases after 1.3.0rc20 have no TensorRT engine backend at all)" if newer else
           " (older releases lack pieces the network uses)" if m else " (unreadable version)")
    return (f"TensorRT-LLM {version} is installed; this project's network, build and runtime are written and checked "
            f"against {want}.x{why}: pip install 'tensorrt-llm>={want},<{SUPPORTED_TRTLLM[0]}.{SUPPORTED_TRTLLM[1] + 1}'"
            f" (or set {ANY_TRTLLM_ENV}=1 to build anyway, untested)")


def trtllm_version_refusal(version: str | None) -> str | None:
    """:func:`trtllm_version_problem`, unless ``DFLASH2_TRTLLM_ANY_VERSION=1`` waives it."""
    return None if os.environ.get(ANY_TRTLLM_ENV) == "1" else trtllm_version_problem(version)


def sm_of(compute_cap: str) -> str:
    """``"9.0"`` -> ``"sm_90a"`` (Hopper and Blackwell datacenter parts get their ``a`` target)."""
    major, _, minor = compute_cap.strip().partition(".")
    sm = f"sm_{int(major)}{int(minor or 0)}"
    return sm + "a" if sm in ("sm_90", "sm_100") else sm


def _find_tensorrt_include() -> str | None:
    cands = []
    for env in ("TensorRT_ROOT", "TENSORRT_ROOT", "TRT_ROOT"):
        if os.environ.get(env):
            cands.append(Path(os.environ[env]) / "include")
    cands += [Path("/usr/include/x86_64-linux-gnu"), Path("/usr/include/aarch64-linux-gnu"), Path("/usr/include"),
              Path("/usr/local/tensorrt/include"), Path("/opt/tensorrt/include")]
    for c in cands:
        if (c / "NvInferRuntime.h").is_file():
            return str(c)
    return None


def probe_toolchain() -> Toolchain:
    """Look, without importing tensorrt_llm (slow, initialises CUDA/MPI), at what is installed."""
    trtllm = None
    if importlib.util.find_spec("tensorrt_llm") is not None:
        trtllm = _dist_version("tensorrt-llm", "tensorrt_llm") or "unknown"
    venv_bin = Path(sys.executable).parent
    build = shutil.which("trtllm-build") or (str(venv_bin / "trtllm-build") if (venv_bin / "trtllm-build").is_file()
                                              else None)
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)
    cuda = None
    if nvcc:
        try:
            m = re.search(r"release (\d+\.\d+)", subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                                                                timeout=30).stdout)
            cuda = m.group(1) if m else None
        except (OSError, subprocess.SubprocessError):
            cuda = None
    gpu_name = gpu_sm = None
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30)
            first = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
            if "," in first:
                gpu_name, cap = (x.strip() for x in first.rsplit(",", 1))
                gpu_sm = sm_of(cap)
        except (OSError, subprocess.SubprocessError, ValueError):
            gpu_name = gpu_sm = None
    return Toolchain(tensorrt_llm=trtllm, tensorrt=_dist_version("tensorrt", "tensorrt-cu12", "tensorrt-cu13",
                                                                  "tensorrt_cu12", "tensorrt_cu13"),
                     trtllm_build=build, cmake=shutil.which("cmake"), nvcc=nvcc, cuda=cuda,
                     tensorrt_include=_find_tensorrt_include(), gpu_name=gpu_name, gpu_sm=gpu_sm)


def plugin_toolchain_missing(toolchain: Toolchain) -> list[str]:
    missing = []
    if not toolchain.cmake:
        missing.append("cmake (>= 3.24) not on PATH")
    if not toolchain.nvcc:
        missing.append("nvcc (the CUDA toolkit) not found")
    if not toolchain.tensorrt_include:
        missing.append("TensorRT headers (NvInferRuntime.h) not found: set TensorRT_ROOT to a TensorRT install or "
                       "source tree")
    return missing
