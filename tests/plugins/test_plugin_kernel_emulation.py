"""The plugin kernels' bodies run on the CPU, against the CPU builds, bit for bit.

The dynamic conv and pairwise scan kernels are thin CUDA wrappers around __host__ __device__
bodies (plugins/*Plugin/*KernelBody.h). tests/plugins/kernel_emulation.cpp, compiled with g++
(-ffp-contract=off, the CPU builds' flags), runs those bodies over every thread of every block of
a launch, with the launchers' own plans (strips and paths of the conv; cluster ranks, warp groups,
rounds and the shared-memory layout of the scan; each phase's threads in both orders), and compares
every output bit with the CPU builds (dynamicConvCpu.cpp, pairwiseScanCpu.cpp, linked in).
This checks the kernels' index math, tails, block boundaries and data flow without a GPU; what it
cannot check (races, the hardware's vector accesses, timing) is left to scripts/gpu_check.sh.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PLUGINS = HERE.parents[1] / "plugins"
FLAGS = ["-std=c++17", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror"]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    exe = tmp_path_factory.mktemp("kernel-emulation") / "kernel_emulation"
    cpu_builds = [PLUGINS / "dynamicConvPlugin" / "dynamicConvCpu.cpp",
                  PLUGINS / "dynamicConvPlugin" / "dynamicConvParams.cpp",
                  PLUGINS / "pairwiseScanPlugin" / "pairwiseScanCpu.cpp",
                  PLUGINS / "pairwiseScanPlugin" / "pairwiseScanParams.cpp"]
    cmd = [gxx, *FLAGS, "-I", str(PLUGINS), str(HERE / "kernel_emulation.cpp"), *map(str, cpu_builds), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    return exe


@pytest.mark.parametrize("suite", ["conv", "scan"])
def test_kernel_bodies_match_cpu_build(emulator, suite):
    res = subprocess.run([str(emulator), suite], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert " 0 failure(s)" in res.stdout
