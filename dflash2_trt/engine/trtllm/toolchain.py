"""What this machine has for the TensorRT-LLM backend: :class:`Toolchain` and :func:`probe_toolchain`
(TensorRT-LLM, TensorRT, trtllm-build, CMake, nvcc, the TensorRT headers, the GPU), looked at without
importing tensorrt_llm. The builder (:mod:`.build`, :mod:`.plugin_library`) and the dry run
(:mod:`dflash2_trt.engine.plan`) read it."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
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
    # the interpreter of TensorRT-LLM's side (trtllm-build, the engine in the verify gate) when it is not this one
    # (``--trtllm-python``: an environment with TensorRT-LLM's own pins, docs/trt-session.md §11); None: this one
    python: str | None = None
    transformers: str | None = None      # transformers' version in that interpreter
    trtllm_transformers: str | None = None   # the transformers requirement of its TensorRT-LLM ("==4.57.1")
    project: str | None = None           # dflash2_trt's version in that interpreter
    project_source: str | None = None    # and its sources' digest (:func:`source_digest`): the same code both sides
    python_version: str | None = None    # that interpreter's Python and torch (engine.json's versions)
    torch: str | None = None
    probe_error: str | None = None       # why that interpreter could not be asked (the plan names it; a build stops)

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
checked against (``tensorrt-llm>=1.2,<1.3``, installed in an environment of its own: docs/trt-session.md §11); the
sources read are listed in docs/hybrid-runtime.md."""
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


PROBE_MODULE = "dflash2_trt.engine.trtllm.toolchain"


def python_side(*, with_source: bool = False) -> dict:
    """What THIS interpreter has for TensorRT-LLM's side, without importing tensorrt_llm (slow, initialises
    CUDA/MPI): ``python -m dflash2_trt.engine.trtllm.toolchain`` prints it as JSON for :func:`probe_python`, with the
    sources' digest (``with_source``: read only for another interpreter, which compares it with its own)."""
    from ... import __version__
    from ...transformers_support import installed_version, trtllm_transformers_requirement

    trtllm = None
    if importlib.util.find_spec("tensorrt_llm") is not None:
        trtllm = _dist_version("tensorrt-llm", "tensorrt_llm") or "unknown"
    venv_bin = Path(sys.executable).parent
    build = str(venv_bin / "trtllm-build") if (venv_bin / "trtllm-build").is_file() else shutil.which("trtllm-build")
    return {"python": sys.executable, "tensorrt_llm": trtllm,
            "tensorrt": _dist_version("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt_cu12", "tensorrt_cu13"),
            "trtllm_build": build, "transformers": installed_version(),
            "trtllm_transformers": trtllm_transformers_requirement(), "dflash2_trt": __version__,
            "dflash2_trt_source": source_digest() if with_source else None,
            "python_version": sys.version.split()[0], "torch": _dist_version("torch")}


def _this_project() -> str:
    """What ``pip install`` takes to install this very dflash2_trt: the checkout (``-e DIR``), else where pip installed
    it from (the distribution's ``direct_url.json``), else the release."""
    from ... import __version__

    root = Path(__file__).resolve().parents[3]
    if (root / "pyproject.toml").is_file():
        return f"-e {root}"
    try:
        url = json.loads(importlib.metadata.distribution("dflash2-trt").read_text("direct_url.json") or "{}").get("url")
    except (importlib.metadata.PackageNotFoundError, ValueError, AttributeError):
        url = None
    if url and url.startswith("file://"):
        return url[len("file://"):]
    return url or f"dflash2-trt=={__version__}"


@functools.cache
def source_digest() -> str:
    """sha256 over this package's Python and YAML files (relative path and bytes, sorted): two interpreters run the
    same dflash2_trt exactly when it is equal (trtllm-build loads the network file of the one that runs ``build``, the
    register module of the other's)."""
    import hashlib

    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    # regular files only (an editor's lock file is a dangling link); not build_configs/, which a wheel copies in from
    # the checkout's top level (the same settings either way: they are read from the build, not by trtllm-build)
    files = sorted(p for ext in ("*.py", "*.yaml") for p in root.rglob(ext)
                   if "__pycache__" not in p.parts and p.relative_to(root).parts[0] != "build_configs" and p.is_file())
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def same_interpreter(python: str) -> bool:
    """``python`` names this interpreter. Symbolic links are not followed: every virtual environment's ``python``
    links to the same base interpreter, and it is the environment (its site-packages) that matters."""
    return os.path.abspath(os.path.expanduser(python)) == os.path.abspath(sys.executable)


def probe_python(python: str, *, timeout: float = 300) -> dict:
    """:func:`python_side` of another interpreter (``--trtllm-python``), which must import this project too: it runs
    trtllm-build through :mod:`dflash2_trt.trtllm.register` (there: ``pip install --no-deps`` this project)."""
    from ...errors import MissingDependencyError

    where = f"TensorRT-LLM's Python {python} (--trtllm-python or $DFLASH2_TRTLLM_PYTHON)"
    try:
        r = subprocess.run([python, "-m", PROBE_MODULE], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise MissingDependencyError(f"{where} cannot be run: {type(exc).__name__}: {exc}") from None
    last = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1][:300]
    if r.returncode != 0:
        if "No module named" in r.stderr and "dflash2_trt" in r.stderr:
            raise MissingDependencyError(f"{where} cannot import dflash2_trt: install this project there too, without "
                                         f"touching TensorRT-LLM's pins: {python} -m pip install --no-deps "
                                         f"{_this_project()} (docs/trt-session.md §11)")
        raise MissingDependencyError(f"{where} failed to report its TensorRT-LLM ({last})")
    try:
        info = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise MissingDependencyError(f"{where} printed no report of its TensorRT-LLM ({last})") from None
    return info


def probe_toolchain(python: str | None = None) -> Toolchain:
    """Look, without importing tensorrt_llm (slow, initialises CUDA/MPI), at what is installed. ``python``
    (``build --trtllm-python`` or ``$DFLASH2_TRTLLM_PYTHON``, which the command line reads): the interpreter of
    TensorRT-LLM's side, asked in a subprocess where it is not this one; the CUDA toolkit, CMake, the TensorRT headers
    and the GPU are the machine's either way."""
    if python is not None and same_interpreter(python):
        python = None
    probe_error = None
    if python is None:
        side = python_side()
    else:
        from ...errors import MissingDependencyError

        try:
            side = probe_python(python)
        except MissingDependencyError as exc:   # said by the plan, and before a build converts anything
            side, probe_error = dict.fromkeys(("tensorrt_llm", "trtllm_build", "tensorrt", "transformers",
                                               "trtllm_transformers")), str(exc)
    trtllm, build = side["tensorrt_llm"], side["trtllm_build"]
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
    return Toolchain(tensorrt_llm=trtllm, tensorrt=side["tensorrt"], trtllm_build=build, cmake=shutil.which("cmake"),
                     nvcc=nvcc, cuda=cuda, tensorrt_include=_find_tensorrt_include(), gpu_name=gpu_name,
                     gpu_sm=gpu_sm, python=python, transformers=side["transformers"],
                     trtllm_transformers=side["trtllm_transformers"], project=side.get("dflash2_trt"),
                     project_source=side.get("dflash2_trt_source"),
                     python_version=side.get("python_version"), torch=side.get("torch"), probe_error=probe_error)


def environment_problems(toolchain: Toolchain) -> tuple[list[str], list[str]]:
    """What keeps this interpreter and TensorRT-LLM's from building together, as (missing, warnings): TensorRT-LLM
    1.2 pins transformers 4.57.x and this project's Hugging Face stages need its own pin (``transformers_support``),
    so one environment cannot hold both at their declared versions (facts/trtllm_requirements.yaml)."""
    from ... import __version__
    from ...transformers_support import installed_version, version_problem

    missing, warnings = [], []
    if toolchain.probe_error:
        return [toolchain.probe_error], []
    here = installed_version()
    if (problem := version_problem(here)) is not None:
        missing.append(f"{problem}: the build's Hugging Face stages (validate, convert, the verify gate's reference) "
                       f"run here; build from an environment with this project's pins and pass --trtllm-python "
                       f"for TensorRT-LLM's (docs/trt-session.md §11)")
    if toolchain.python and (toolchain.project != __version__ or toolchain.project_source != source_digest()):
        missing.append(f"{toolchain.python} imports another dflash2_trt ({toolchain.project}, other sources) than this "
                       f"one ({__version__}): trtllm-build would mix the two; install this very one there: "
                       f"{toolchain.python} -m pip install --no-deps {_this_project()}")
    pin = toolchain.trtllm_transformers
    where = toolchain.python or "this environment"
    major = re.match(r"(\d+)", toolchain.transformers or "")
    if toolchain.tensorrt_llm and major and int(major[1]) >= 5 and trtllm_version_problem(toolchain.tensorrt_llm) \
            is None:
        fact = _requirements_facts()["import_on_transformers_5"]
        missing.append(f"TensorRT-LLM {toolchain.tensorrt_llm} in {where} sits beside transformers "
                       f"{toolchain.transformers}, on which `import tensorrt_llm` fails ({fact['fails_at']} imports "
                       f"{fact['name']}, which transformers 5 removed): give TensorRT-LLM its own transformers"
                       f"{pin or ''} and this project an environment of its own (docs/trt-session.md §11)")
    elif toolchain.tensorrt_llm and pin and toolchain.transformers and not _satisfies(toolchain.transformers, pin):
        warnings.append(f"TensorRT-LLM {toolchain.tensorrt_llm} in {where} pins transformers{pin} but transformers "
                        f"{toolchain.transformers} is installed there: TensorRT-LLM runs on a transformers it does not "
                        f"declare (untested by NVIDIA and by this project); keep its own and give this project an "
                        f"environment of its own (docs/trt-session.md §11)")
    return missing, warnings


def _requirements_facts() -> dict:
    """facts/trtllm_requirements.yaml: TensorRT-LLM 1.2's own requirements, read in its sources."""
    from ...yaml_files import load_yaml_file

    return load_yaml_file(Path(__file__).with_name("facts") / "trtllm_requirements.yaml")


def _satisfies(version: str, spec: str) -> bool:
    """``version`` meets the PEP 440 specifier ``spec`` (``==4.57.1``). Unparsable either: True (no claim is made).
    ``packaging`` comes with transformers, which requires it."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return True


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


if __name__ == "__main__":   # probe_python's other end
    print(json.dumps(python_side(with_source=True)))
