"""Build checks that need only compilers: the CMake project (kernels-only here; glue too when
TensorRT headers are given), the glue against TensorRT headers, and scripts/gpu_check.

TensorRT headers: set DFLASH2_TRT_INCLUDE to a directory holding NvInferRuntime.h (for example
an `include/` taken from a public NVIDIA/TensorRT snapshot) to compile the IPluginV3 glue.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"
GLUE = [PLUGINS / "dynamicConvPlugin" / "dynamicConvPlugin.cpp", PLUGINS / "pairwiseScanPlugin" / "pairwiseScanPlugin.cpp",
        PLUGINS / "gatedDeltaNetPlugin" / "gatedDeltaNetPlugin.cpp"]


def _cuda_include() -> Path | None:
    nvcc = shutil.which("nvcc")
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    if nvcc is not None:
        roots.append(str(Path(nvcc).resolve().parents[1]))
    for root in filter(None, roots):
        inc = Path(root) / "include"
        if (inc / "cuda_runtime_api.h").is_file():
            return inc
    return None


def _trt_include() -> Path | None:
    d = os.environ.get("DFLASH2_TRT_INCLUDE")
    return Path(d) if d and (Path(d) / "NvInferRuntime.h").is_file() else None


def test_cmake_builds_kernels_library(tmp_path, capsys):
    if shutil.which("cmake") is None or shutil.which("nvcc") is None:
        pytest.skip("cmake or nvcc not found")
    # Hopper's PTX only: what this test checks is the CMake project and what it links. The machine code of every
    # kernel for sm_90a and sm_100a is the spill check's (test_plugin_kernels_nvcc) and the cuda backend's build's
    # (test_plugin_cuda_lib); ptxas over the same kernels a third time was a third of this test's 22 s
    cfg = ["cmake", "-S", str(PLUGINS), "-B", str(tmp_path), "-DCMAKE_BUILD_TYPE=Release",
           "-DCMAKE_CUDA_ARCHITECTURES=90a-virtual"]
    trt = _trt_include()
    if trt is not None:
        cfg.append(f"-DTensorRT_ROOT={trt.parent}")
    t0 = time.monotonic()
    res = subprocess.run(cfg, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert ("building the IPluginV3 glue" if trt else "building kernels only") in res.stdout
    res = subprocess.run(["cmake", "--build", str(tmp_path), "-j2"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    with capsys.disabled():
        print(f"\ncmake configure+build ({'with glue' if trt else 'kernels only'}): {time.monotonic() - t0:.1f} s")
    lib = tmp_path / "libdflash2_plugins.so"
    assert lib.is_file()
    syms = subprocess.run(["nm", "-DC", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert "dflash2::launchDynamicConv" in syms and "dflash2::launchPairwiseScan" in syms
    assert "dflash2::launchGatedDeltaNetForward" in syms and "dflash2::launchGatedDeltaNetCommit" in syms
    if trt is not None:
        assert "DynamicConvPluginCreator" in syms and "PairwiseScanPluginCreator" in syms
        assert "GatedDeltaNetPluginCreator" in syms
        # the LD_PRELOAD/ctypes variant self-registers every creator (common/df2StaticRegistration.cpp)
        for creator in ("DynamicConvPluginCreator", "PairwiseScanPluginCreator", "GatedDeltaNetPluginCreator"):
            assert f"nvinfer1::PluginRegistrar<dflash2::{creator}>::PluginRegistrar()" in syms, creator
        dyn = tmp_path / "libdflash2_plugins_dynamic.so"
        dsyms = subprocess.run(["nm", "-DC", "--defined-only", str(dyn)], capture_output=True, text=True).stdout
        exported = {line.split()[-1] for line in dsyms.splitlines() if " T " in line}
        assert {"getCreators", "setLoggerFinder"} <= exported
        # loadLibrary fails if a creator is already registered: the dynamic variant must not self-register
        assert "PluginRegistrar" not in dsyms


@pytest.mark.parametrize("source", GLUE, ids=lambda p: p.name)
def test_glue_compiles_against_tensorrt_headers(source):
    trt, cuda = _trt_include(), _cuda_include()
    if trt is None:
        pytest.skip("DFLASH2_TRT_INCLUDE not set to TensorRT headers: glue compile check skipped")
    if cuda is None:
        pytest.skip("CUDA headers not found next to nvcc")
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-isystem", str(trt),
           "-isystem", str(cuda), str(source)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"


def test_glue_harness_without_tensorrt_library(tmp_path):
    """The glue's behaviour (creator fields, capabilities, dtypes/formats, configure/validation,
    serialisation round trip, enqueue error path) through tests/plugins/glue_harness.cpp, compiled
    against the TensorRT headers without static registration and linked with the real kernels."""
    trt, cuda, nvcc = _trt_include(), _cuda_include(), shutil.which("nvcc")
    if trt is None:
        pytest.skip("DFLASH2_TRT_INCLUDE not set to TensorRT headers: glue harness skipped")
    if cuda is None or nvcc is None:
        pytest.skip("nvcc / CUDA headers not found")
    libdir = next((d for d in (cuda.parent / "lib64", cuda.parent / "lib") if (d / "libcudart.so").exists()), None)
    if libdir is None:
        pytest.skip("libcudart.so not found next to the CUDA headers")
    objs = []
    for cu in sorted(PLUGINS.glob("*Plugin/*Kernel.cu")):
        o = tmp_path / (cu.stem + ".o")
        res = subprocess.run([nvcc, "-std=c++17", "-O2", "-c", "-gencode=arch=compute_90a,code=sm_90a", str(cu),
                              "-o", str(o)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        objs.append(str(o))
    exe = tmp_path / "glue_harness"
    cmd = ["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror",
           "-isystem", str(trt), "-isystem", str(cuda), "-I", str(PLUGINS),
           str(Path(__file__).with_name("glue_harness.cpp")), *map(str, GLUE),
           str(PLUGINS / "common" / "df2LibraryEntry.cpp"),
           str(PLUGINS / "dynamicConvPlugin" / "dynamicConvParams.cpp"),
           str(PLUGINS / "pairwiseScanPlugin" / "pairwiseScanParams.cpp"),
           str(PLUGINS / "gatedDeltaNetPlugin" / "gatedDeltaNetParams.cpp"), *objs,
           f"-L{libdir}", "-lcudart", f"-Wl,-rpath,{libdir}", "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    res = subprocess.run([str(exe)], capture_output=True, text=True)
    assert res.returncode == 0 and "0 failure(s)" in res.stdout, res.stdout + res.stderr
    assert res.stdout.count("PASS") >= 50


@pytest.mark.parametrize("call, ok", [('fail(msg, sizeof(msg), "H=%lld", static_cast<long long>(h))', True),
                                      ('fail(msg, sizeof(msg), "H=%d", static_cast<long long>(h))', False),
                                      ('fail(msg, sizeof(msg), "H=%lld and %d", static_cast<long long>(h))', False)],
                         ids=["matching", "wrong_type", "missing_argument"])
def test_validation_messages_are_format_checked(tmp_path, call, ok):
    """common/df2Validation.h: every plugin's rejections go through ParamFail, whose printf format
    attribute makes g++ (-Wall -Werror, the CPU builds' flags) reject a message whose arguments do
    not match it, instead of printing garbage (or reading past the arguments) on the day it fires."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    src = tmp_path / "fmt.cpp"
    src.write_text('#include "common/df2Validation.h"\n'
                   'dflash2::Status f(long h) { constexpr dflash2::ParamFail fail{"P"}; char msg[64]; '
                   f"return {call}; }}\n")
    res = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-I", str(PLUGINS),
                          str(src)], capture_output=True, text=True)
    assert (res.returncode == 0) == ok, res.stderr
    if not ok:
        assert "-Werror=format" in res.stderr


def test_gpu_check_script_parses_and_exits_cleanly_without_gpu():
    py_compile.compile(str(REPO / "scripts" / "gpu_check" / "gpu_check.py"), doraise=True)
    assert subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_check.sh")]).returncode == 0
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU exit path is not exercised here")
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check" / "gpu_check.py"), "--skip-bench"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "no CUDA GPU" in res.stdout


@pytest.mark.gpu
def test_gpu_check_runs_on_gpu(tmp_path):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    res = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--skip-bench"], capture_output=True,
                         text=True, env={**os.environ, "PYTHON": sys.executable})
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr


def test_gpu_check_all_hands_the_run_to_run_all(tmp_path):
    """``gpu_check.sh --all OUT_DIR``'s plumbing, with a stand-in ``nvidia-smi`` and Python (nothing of the GPU is
    checked here): the parts, their limits and what OUT_DIR holds are ``scripts/gpu_check/run_all.py``'s
    (tests/scripts/test_gpu_check_all.py); the script hands it exactly the output folder (and ``--parts``), and a
    missing or extra argument is refused before anything runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in (not a GPU)'\n")
    calls = tmp_path / "calls.txt"
    (bin_dir / "py").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    out = tmp_path / "out"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": str(bin_dir / "py")}
    res = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--all", str(out)], capture_output=True,
                         text=True, env=env)
    assert res.returncode == 0, res.stderr
    res = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--all", str(out), "--parts", "profile"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    run_all = REPO / "scripts" / "gpu_check" / "run_all.py"
    assert calls.read_text().splitlines() == [f"{run_all} {out}", f"{run_all} {out} --parts profile"]
    for args in (["--all"], ["--all", str(out), "--json"]):
        res = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), *args], capture_output=True, text=True,
                             env=env)
        assert res.returncode == 2 and "--all takes one output directory" in res.stderr, res.stderr
    assert len(calls.read_text().splitlines()) == 2


def test_gpu_check_help_needs_no_gpu():
    """``gpu_check.sh --help`` prints its usage on any machine (it said "no NVIDIA GPU found ... nothing was run" and
    exited 2 where there is no GPU), and the usage names only options gpu_check.py takes."""
    import re

    res = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--help"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})   # no nvidia-smi on this PATH
    assert res.returncode == 0 and res.stdout.startswith("GPU check of the DFlash2 plugin kernels"), res.stderr
    assert "Usage: scripts/gpu_check.sh" in res.stdout and "#" not in res.stdout and "set -euo" not in res.stdout
    first = res.stdout.split("Usage: ", 1)[1].splitlines()[0]
    py = (REPO / "scripts" / "gpu_check" / "gpu_check.py").read_text()
    for opt in re.findall(r"--[a-z][a-z-]*", first):
        assert f'"{opt}"' in py, opt
