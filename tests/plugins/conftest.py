"""Fixtures for the plugin tests: g++ builds of the plugins' shared math (CPU) loaded by ctypes.

The libraries are compiled once per session into a pytest temp dir (never into the repo) from
plugins/*/…Cpu.cpp + …Params.cpp, with -ffp-contract=off: the CUDA kernels use explicit
round-to-nearest multiplies/adds (no FMA), and the CPU build must not contract either, or the
two would differ in the last bit while both "look" right.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int32: 3}
UNKNOWN_DTYPE = 99  # e.g. int64 / float64: not a plugin dtype at all


def build_shared(sources: list[Path], out: Path) -> Path:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: cannot build the CPU copy of the plugin math")
    cmd = [gxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror",
           *map(str, sources), "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise AssertionError(f"g++ failed ({' '.join(cmd)}):\n{res.stderr}")
    return out


def descs(tensors) -> tuple:
    """(n, dtypes int32[n], nbDims int32[n], dims int64[n*8]) for a list of tensors, or of
    (dtype_code, shape) tuples for shapes that must not be allocated (e.g. unknown dims = -1)."""
    n = len(tensors)
    dtypes = (ctypes.c_int32 * n)()
    nbdims = (ctypes.c_int32 * n)()
    dims = (ctypes.c_int64 * (8 * n))()
    for i, t in enumerate(tensors):
        if isinstance(t, torch.Tensor):
            code, shape = DTYPE_CODES.get(t.dtype, UNKNOWN_DTYPE), tuple(t.shape)
        else:
            code, shape = t
        dtypes[i] = code
        nbdims[i] = len(shape)
        for d, v in enumerate(shape):
            dims[i * 8 + d] = v
    return n, dtypes, nbdims, dims


def _ptr(t: torch.Tensor | None):
    return ctypes.c_void_p(0 if t is None else t.data_ptr())


class ConvLib:
    """ctypes wrapper of plugins/dynamicConvPlugin/dynamicConvCpu.cpp."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.df2_conv_validate.restype = ctypes.c_int32
        self.lib.df2_conv_run.restype = ctypes.c_int32
        self.lib.df2_float_to_half.restype = ctypes.c_uint16
        self.lib.df2_float_to_half.argtypes = [ctypes.c_float]
        self.lib.df2_half_to_float.restype = ctypes.c_float
        self.lib.df2_half_to_float.argtypes = [ctypes.c_uint16]
        self.lib.df2_float_to_bf16.restype = ctypes.c_uint16
        self.lib.df2_float_to_bf16.argtypes = [ctypes.c_float]
        self.lib.df2_exp.restype = ctypes.c_float
        self.lib.df2_exp.argtypes = [ctypes.c_float]

    @staticmethod
    def _attrs(block_size, kernel_size, group_size, fuse):
        return (ctypes.c_int32 * 4)(block_size, kernel_size, group_size, int(fuse))

    def validate(self, inputs, *, block_size, kernel_size, group_size, fuse=False) -> tuple[int, str]:
        msg = ctypes.create_string_buffer(512)
        n, dt, nd, dims = descs(inputs)
        rc = self.lib.df2_conv_validate(self._attrs(block_size, kernel_size, group_size, fuse), n, dt, nd, dims,
                                        msg, 512)
        return rc, msg.value.decode()

    def run(self, x, delta, base, *, block_size, group_size, residual=None, kernel_size=None) -> torch.Tensor:
        x, delta, base = x.contiguous(), delta.contiguous(), base.contiguous()
        k = base.shape[0] if kernel_size is None else kernel_size
        inputs = [x, delta, base] + ([residual.contiguous()] if residual is not None else [])
        out = torch.empty(x.shape, dtype=torch.float32 if residual is not None else x.dtype)
        msg = ctypes.create_string_buffer(512)
        n, dt, nd, dims = descs(inputs)
        rc = self.lib.df2_conv_run(self._attrs(block_size, k, group_size, residual is not None), n, dt, nd, dims,
                                   _ptr(x), _ptr(delta), _ptr(base), _ptr(inputs[3] if residual is not None else None),
                                   _ptr(out), msg, 512)
        if rc != 0:
            raise ValueError(msg.value.decode())
        return out


class ScanLib:
    """ctypes wrapper of plugins/pairwiseScanPlugin/pairwiseScanCpu.cpp."""

    MODES = {"greedy": 0, "sample": 1, "viterbi": 2}

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.df2_scan_validate.restype = ctypes.c_int32
        self.lib.df2_scan_run.restype = ctypes.c_int32
        self.lib.df2_scan_walk.restype = ctypes.c_int32
        self.lib.df2_scan_walk.argtypes = [ctypes.c_int32, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32] + [
            ctypes.c_void_p] * 5

    def validate(self, inputs, mode="greedy") -> tuple[int, str]:
        msg = ctypes.create_string_buffer(512)
        n, dt, nd, dims = descs(inputs)
        m = self.MODES.get(mode, mode)
        rc = self.lib.df2_scan_validate(ctypes.c_int32(m), n, dt, nd, dims, msg, 512)
        return rc, msg.value.decode()

    def run(self, mode, unary, cand, hidden, anchor, pred_cb, succ_cb, temperature, uniforms):
        ins = [t.contiguous() for t in (unary, cand, hidden, anchor, pred_cb, succ_cb, temperature, uniforms)]
        b, l, k = unary.shape
        lattice = torch.empty(b, l, k, k)
        idx = torch.empty(b, l, dtype=torch.int32)
        ids = torch.empty(b, l, dtype=torch.int32)
        q = torch.empty(b, l, k)
        msg = ctypes.create_string_buffer(512)
        n, dt, nd, dims = descs(ins)
        rc = self.lib.df2_scan_run(ctypes.c_int32(self.MODES[mode]), n, dt, nd, dims, *map(_ptr, ins),
                                   _ptr(lattice), _ptr(idx), _ptr(ids), _ptr(q), msg, 512)
        if rc != 0:
            raise ValueError(msg.value.decode())
        return lattice, idx.long(), ids.long(), q

    def walk(self, mode, lattice, temperature=None, uniforms=None):
        lattice = lattice.float().contiguous()
        b, l, k, _ = lattice.shape
        temperature = torch.ones(b) if temperature is None else temperature.float().contiguous()
        uniforms = torch.zeros(b, l) if uniforms is None else uniforms.float().contiguous()
        idx = torch.empty(b, l, dtype=torch.int32)
        q = torch.empty(b, l, k)
        rc = self.lib.df2_scan_walk(self.MODES[mode], b, l, k, lattice.data_ptr(), temperature.data_ptr(),
                                    uniforms.data_ptr(), idx.data_ptr(), q.data_ptr())
        assert rc == 0
        return idx.long(), q


@pytest.fixture(scope="session")
def plugin_build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plugin-cpu-build")


@pytest.fixture(scope="session")
def conv_lib(plugin_build_dir) -> ConvLib:
    d = PLUGINS / "dynamicConvPlugin"
    return ConvLib(build_shared([d / "dynamicConvCpu.cpp", d / "dynamicConvParams.cpp"],
                                plugin_build_dir / "libdf2_conv_cpu.so"))


@pytest.fixture(scope="session")
def scan_lib(plugin_build_dir) -> ScanLib:
    d = PLUGINS / "pairwiseScanPlugin"
    return ScanLib(build_shared([d / "pairwiseScanCpu.cpp", d / "pairwiseScanParams.cpp"],
                                plugin_build_dir / "libdf2_scan_cpu.so"))
