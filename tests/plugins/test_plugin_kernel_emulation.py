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


SUITES = ("conv", "scan")


@pytest.fixture(scope="module")
def running(emulator, tmp_path_factory):
    """Both suites started at once (each is one single-threaded process of 10 to 15 s): suite -> (process, its
    stdout file, its stderr file); whatever is still running at the end is stopped."""
    out = tmp_path_factory.mktemp("kernel-emulation-out")
    procs = {}
    for suite in SUITES:
        with open(out / f"{suite}.out", "w") as so, open(out / f"{suite}.err", "w") as se:
            procs[suite] = (subprocess.Popen([str(emulator), suite], stdout=so, stderr=se, stdin=subprocess.DEVNULL),
                            out / f"{suite}.out", out / f"{suite}.err")
    yield procs
    for proc, _, _ in procs.values():
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.parametrize("suite", SUITES)
def test_kernel_bodies_match_cpu_build(running, suite):
    proc, out, err = running[suite]
    rc = proc.wait(timeout=600)
    stdout, stderr = out.read_text(), err.read_text()
    assert rc == 0, stdout[-4000:] + stderr[-2000:]
    assert " 0 failure(s)" in stdout
