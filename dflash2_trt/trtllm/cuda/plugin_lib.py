"""The CUDA build of the DFlash2 plugins, for the cuda engine backend and the GPU checks: nvcc on first use,
loaded with ctypes.

The library holds the very kernels of ``libdflash2_plugins.so`` (``plugins/<p>Plugin/<p>Kernel.cu``), their
validation (``<p>Params.cpp``) and ``plugins/common/df2CudaEntry.cpp``, a C ABI whose ``df2_cuda_<p>_enqueue``
does what each plugin's IPluginV3 ``enqueue`` does: validate the shapes, read the plugin's host inputs on the
host, launch on the caller's stream. So the cuda backend runs the plugins' own CUDA code, not a re-implementation,
and a call can be captured in a CUDA graph (nothing allocates or synchronises inside it).

:func:`build_cuda_plugins` compiles one library per GPU architecture into
``$DFLASH2_TRT_CACHE/plugins-cuda/<sha256>/libdf2_cuda_sm<arch>.so``; the hash covers nvcc's version, the flags,
the architecture and the bytes of every source and local header, so an edited kernel gets a new build and an
unchanged one is never rebuilt (the CPU builds' scheme, :mod:`dflash2_trt.trtllm.cpu.plugin_libs`). The sources
are compiled in parallel (one nvcc per source, as many as there are CPUs, the longest first) into a temporary folder
beside the build, linked into a temporary file and renamed into place. The architecture is the visible GPU's
(``sm_90a`` on Hopper, ``sm_100a`` on Blackwell: the arch-specific targets ``plugins/CMakeLists.txt`` builds), or
``DFLASH2_CUDA_ARCH`` (e.g. ``90a``) to build without a GPU. cudart is linked statically, so the library loads on a
machine without a GPU (its calls then fail with CUDA's error, one line).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import plugins
from ...cpu_threads import available_cpus
from ...cudatools import find_cuda_tool
from ...errors import ConfigError, MissingDependencyError
from ..cpu.plugin_libs import (DTYPE_CODES, PluginBuildError, PluginRunError, cache_dir,
                                compile_atomic, compile_parallel, local_headers, sources_digest)

SOURCES: tuple[str, ...] = (
    "common/df2CudaEntry.cpp",
    "dynamicConvPlugin/dynamicConvKernel.cu", "dynamicConvPlugin/dynamicConvParams.cpp",
    "gatedDeltaNetPlugin/gatedDeltaNetKernel.cu", "gatedDeltaNetPlugin/gatedDeltaNetParams.cpp",
    "pairwiseScanPlugin/pairwiseScanKernel.cu", "pairwiseScanPlugin/pairwiseScanParams.cpp",
)
# -ffp-contract=off for the host code (the Params files), as plugins/CMakeLists.txt; the kernels' arithmetic is
# explicit (mulRn/addRn/fmaRn intrinsics), so nvcc's own contraction does not reach it.
# Each source is compiled on its own (``nvcc -c``, as many at once as there are CPUs: the Gated DeltaNet's kernels
# alone take most of the build), then the objects are linked into one library with cudart static.
NVCC_COMPILE_FLAGS: tuple[str, ...] = ("-std=c++17", "-O3", "-Xcompiler", "-fPIC,-ffp-contract=off", "-Xptxas",
                                       "-warn-spills")
NVCC_LINK_FLAGS: tuple[str, ...] = ("-shared", "-cudart", "static")
NVCC_FLAGS: tuple[str, ...] = (*NVCC_COMPILE_FLAGS, *NVCC_LINK_FLAGS)   # what the build's hash covers
_HASH_VERSION = b"dflash2-trt plugins-cuda 2\0"
_ARCH = re.compile(r"^[0-9]{2,3}[af]?$")
_MSG_LEN = 512
INT64_CODE = 4   # dflash2::DType::kINT64 (pointer-valued host inputs)
GDN_MODES = {"forward": 0, "commit": 1}
GDN_ATTRS = ("mode", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel", "max_verify_tokens",
             "chunk_size", "zero_state_input")
SCAN_MODES = {"greedy": 0, "sample": 1, "viterbi": 2}


def nvcc_path() -> str:
    """nvcc on PATH, else ``$CUDA_HOME/bin/nvcc`` (or ``$CUDA_PATH``'s), else ``/usr/local/cuda/bin/nvcc``."""
    found = find_cuda_tool("nvcc")
    if found:
        return found
    raise MissingDependencyError("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): the cuda backend "
                                 "compiles the plugins' CUDA kernels on first use; install the CUDA toolkit")


_NVCC_VERSION: dict[str, str] = {}


def nvcc_version(nvcc: str) -> str:
    if nvcc not in _NVCC_VERSION:
        try:
            res = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PluginBuildError(f"could not run {nvcc} --version ({e})") from None
        _NVCC_VERSION[nvcc] = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr.strip()
    return _NVCC_VERSION[nvcc]


def device_arch(device=None) -> str:
    """The architecture to build for: ``DFLASH2_CUDA_ARCH``, else the visible GPU's (``90a`` for compute 9.0 and
    ``100a`` for 10.0, whose arch-specific instructions the kernels may use; ``<major><minor>`` otherwise)."""
    env = os.environ.get("DFLASH2_CUDA_ARCH")
    if env:
        if not _ARCH.match(env):
            raise ConfigError(f"must look like 90a, 100a or 89, got {env!r}", field="DFLASH2_CUDA_ARCH")
        return env
    if not torch.cuda.is_available():
        raise MissingDependencyError(no_gpu_message())
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}{minor}" + ("a" if major in (9, 10) and minor == 0 else "")


def no_gpu_message() -> str:
    """Why the cuda backend cannot run here, in one line."""
    if torch.version.cuda is None:
        return (f"the cuda backend needs a CUDA GPU and a CUDA build of torch; this torch ({torch.__version__}) is a "
                f"CPU build")
    return f"the cuda backend needs a CUDA GPU; torch {torch.__version__} (CUDA {torch.version.cuda}) sees none"


@dataclass(frozen=True)
class CudaPluginSources:
    root: Path
    sources: tuple[Path, ...]
    headers: tuple[Path, ...]

    def digest(self, arch: str, nvcc_ver: str) -> str:
        return sources_digest(_HASH_VERSION, (nvcc_ver, arch, *NVCC_FLAGS), self.root, (*self.sources, *self.headers))


def cuda_plugin_sources() -> CudaPluginSources:
    root = plugins.plugin_dir().resolve()
    sources = tuple(root / s for s in SOURCES)
    missing = [s for s in sources if not s.is_file()]
    if missing:
        env = os.environ.get("DFLASH2_PLUGIN_DIR")
        raise MissingDependencyError(
            f"the CUDA build of the plugins needs their sources, not found in {root} "
            f"({'DFLASH2_PLUGIN_DIR=' + env if env else 'the checkout beside the package'}): "
            f"{', '.join(str(m) for m in missing)}; use an editable install of a checkout or set DFLASH2_PLUGIN_DIR")
    return CudaPluginSources(root, sources, local_headers(sources))


def gencode(arch: str) -> str:
    num = arch.rstrip("af")
    return f"arch=compute_{num}{arch[len(num):]},code=sm_{arch}"


def build_cuda_plugins(arch: str | None = None, *, progress=None) -> Path:
    """Path of the CUDA build of the plugins for ``arch`` (default :func:`device_arch`), compiled unless a build of
    the same sources, flags, nvcc and architecture is in the cache."""
    arch = arch or device_arch()
    src = cuda_plugin_sources()
    nvcc = nvcc_path()
    out = cache_dir() / "plugins-cuda" / src.digest(arch, nvcc_version(nvcc)) / f"libdf2_cuda_sm{arch}.so"
    if out.is_file():
        return out
    jobs = min(available_cpus(), len(src.sources))
    if progress:
        progress(f"[plugins] nvcc sm_{arch}, {len(src.sources)} sources ({jobs} at once): {out}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        objects = Path(tempfile.mkdtemp(dir=out.parent, prefix=".objects-"))
    except OSError as e:
        raise PluginBuildError(f"cannot write {out.parent} ({e}); point DFLASH2_TRT_CACHE at a writable "
                               f"directory") from None
    try:
        obj = {s: objects / f"{i}-{s.name}.o" for i, s in enumerate(src.sources)}
        longest_first = sorted(src.sources, key=lambda s: s.stat().st_size, reverse=True)
        compile_parallel([([nvcc, *NVCC_COMPILE_FLAGS, f"-gencode={gencode(arch)}", f"-I{src.root}", "-c", str(s)],
                           obj[s]) for s in longest_first], "nvcc", out.name, jobs)
        return compile_atomic([nvcc, *NVCC_LINK_FLAGS, f"-gencode={gencode(arch)}", *(str(obj[s]) for s in src.sources)],
                              out, "nvcc")
    finally:
        shutil.rmtree(objects, ignore_errors=True)


# ------------------------------------------------------------------------------------------- the ctypes wrapper
def c_descs(tensors) -> tuple:
    n = len(tensors)
    dtypes, nbdims, dims = (ctypes.c_int32 * n)(), (ctypes.c_int32 * n)(), (ctypes.c_int64 * (8 * n))()
    for i, t in enumerate(tensors):
        dtypes[i] = INT64_CODE if t.dtype == torch.int64 else DTYPE_CODES.get(t.dtype, 99)
        if t.dim() > 8:
            raise PluginRunError(f"input {i} has {t.dim()} dims; the plugins take at most 8")
        nbdims[i] = t.dim()
        for d, v in enumerate(t.shape):
            dims[i * 8 + d] = v
    return n, dtypes, nbdims, dims


def c_ptrs(tensors):
    return (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))


class CudaPluginLib:
    """The CUDA build of the three plugins. Every call takes the plugin's inputs as torch tensors where the
    plugin's spec puts them (device inputs on the GPU, host inputs on the CPU), contiguous, and enqueues on the
    current torch stream of the inputs' device."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self.lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise PluginBuildError(f"{self.path} is not a usable CUDA plugin build ({e}); delete it to rebuild") from None
        for name in ("df2_cuda_device_count", "df2_cuda_conv_enqueue", "df2_cuda_scan_workspace",
                     "df2_cuda_scan_enqueue", "df2_cuda_scan_enqueue_ranks", "df2_cuda_scan_walk", "df2_cuda_gdn_workspace", "df2_cuda_gdn_enqueue",
                     "df2_cuda_last_error"):
            getattr(self.lib, name).restype = ctypes.c_int32
        self.lib.df2_cuda_scan_walk.argtypes = [ctypes.c_int32, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32] + [
            ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_char_p, ctypes.c_int32]

    def device_count(self) -> tuple[int, int]:
        """(devices, CUDA error code) as this library's runtime sees them."""
        err = ctypes.c_int32()
        n = self.lib.df2_cuda_device_count(ctypes.byref(err))
        return n, err.value

    @staticmethod
    def _check(plugin, rc, msg) -> None:
        if rc != 0:
            raise PluginRunError(msg.value.decode(errors="replace") or f"{plugin}: rejected (status {rc})")

    @staticmethod
    def _placed(plugin: str, tensors, host: set[int] = frozenset()) -> list[torch.Tensor]:
        out = []
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise PluginRunError(f"{plugin}: input {i} is {type(t).__name__}, not a tensor")
            want_device = i not in host
            if (t.device.type != "cpu") != want_device:
                raise PluginRunError(f"{plugin}: input {i} is on {t.device}; the plugin reads it in "
                                     f"{'device' if want_device else 'host'} memory")
            out.append(t.contiguous())
        return out

    @staticmethod
    def _stream(t: torch.Tensor) -> int:
        return torch.cuda.current_stream(t.device).cuda_stream

    @staticmethod
    def _device(t: torch.Tensor):
        """The inputs' GPU as the calling thread's current device for the launch (the library launches on the
        thread's current device; the stream must belong to it)."""
        return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()

    def conv(self, x, delta, base, residual=None, *, block_size: int, group_size: int,
             kernel_size: int | None = None) -> torch.Tensor:
        """DFlash2DynamicConv: y in x's dtype, or residual + y in fp32 when ``residual``."""
        plugin = "DFlash2DynamicConv"
        ins = self._placed(plugin, [x, delta, base] + ([residual] if residual is not None else []))
        k = base.shape[0] if kernel_size is None else kernel_size
        attrs = (ctypes.c_int32 * 4)(int(block_size), int(k), int(group_size), int(residual is not None))
        out = torch.empty(x.shape, dtype=torch.float32 if residual is not None else x.dtype, device=x.device)
        msg = ctypes.create_string_buffer(_MSG_LEN)
        with self._device(x):
            rc = self.lib.df2_cuda_conv_enqueue(attrs, *c_descs(ins), c_ptrs(ins), ctypes.c_void_p(out.data_ptr()),
                                                ctypes.c_int64(self._stream(x)), msg, _MSG_LEN)
        self._check(plugin, rc, msg)
        return out

    def scan(self, mode, unary, cand, hidden, anchor, pred_cb, succ_cb, temperature, uniforms,
             *, with_workspace: bool = False, ranks: int = 0):
        """DFlash2PairwiseScan: (ids [B, L] int32, q [B, L, K] fp32) [+ the workspace, whose start is the lattice
        [B, L, K, K] fp32 the plugin computes, with ``with_workspace``]. ``ranks``: the CTAs per request row
        (0: the launcher's choice; 1, 2, 4, 8 forced, for checks)."""
        plugin = "DFlash2PairwiseScan"
        m = SCAN_MODES[mode] if isinstance(mode, str) else int(mode)
        ins = self._placed(plugin, [unary, cand, hidden, anchor, pred_cb, succ_cb, temperature, uniforms])
        d = c_descs(ins)
        msg = ctypes.create_string_buffer(_MSG_LEN)
        nbytes = ctypes.c_int64()
        self._check(plugin, self.lib.df2_cuda_scan_workspace(ctypes.c_int32(m), *d, ctypes.byref(nbytes), msg,
                                                             _MSG_LEN), msg)
        b, length, k = unary.shape
        ws = torch.empty(max(int(nbytes.value), 1), dtype=torch.uint8, device=unary.device)
        ids = torch.empty(b, length, dtype=torch.int32, device=unary.device)
        q = torch.empty(b, length, k, dtype=torch.float32, device=unary.device)
        with self._device(unary):
            rc = self.lib.df2_cuda_scan_enqueue_ranks(ctypes.c_int32(ranks), ctypes.c_int32(m), *d, c_ptrs(ins),
                                                      ctypes.c_void_p(ws.data_ptr()), ctypes.c_void_p(ids.data_ptr()),
                                                      ctypes.c_void_p(q.data_ptr()),
                                                      ctypes.c_int64(self._stream(unary)), msg, _MSG_LEN)
        self._check(plugin, rc, msg)
        return (ids, q, ws) if with_workspace else (ids, q)

    def walk(self, mode, lattice, cand, temperature, uniforms):
        """The walk kernel alone over ``lattice [B, L, K, K]`` fp32: (ids [B, L] int32, q [B, L, K])."""
        plugin = "DFlash2PairwiseScan"
        m = SCAN_MODES[mode] if isinstance(mode, str) else int(mode)
        lattice, cand, temperature, uniforms = self._placed(plugin, [lattice, cand, temperature, uniforms])
        b, length, k, _ = lattice.shape
        ids = torch.empty(b, length, dtype=torch.int32, device=lattice.device)
        q = torch.empty(b, length, k, dtype=torch.float32, device=lattice.device)
        msg = ctypes.create_string_buffer(_MSG_LEN)
        with self._device(lattice):
            rc = self.lib.df2_cuda_scan_walk(m, b, length, k, lattice.data_ptr(), cand.data_ptr(),
                                             temperature.data_ptr(), uniforms.data_ptr(), ids.data_ptr(), q.data_ptr(),
                                             self._stream(lattice), msg, _MSG_LEN)
        self._check(plugin, rc, msg)
        return ids, q

    def gdn(self, mode: str, inputs, **attrs):
        """DFlash2GatedDeltaNet in ``mode`` (forward | commit) with the plugin's inputs in its order (forward:
        qkv, conv_weight, a, b, dt_bias, A_log, cu_seqlens, slot_mapping, host_request_types (host),
        rnn_state_ptr, conv_state_ptr (host int64 [1]: the pools' device addresses) [, zero_state]; commit:
        verify_qkv, verify_gates, conv_weight, num_accepted, cu_seqlens, slot_mapping, host_request_types,
        rnn_state_ptr, conv_state_ptr). Returns the outputs: forward (y, verify_qkv, verify_gates), commit
        (committed,)."""
        plugin = "DFlash2GatedDeltaNet"
        commit = mode == "commit"
        host = {6, 7, 8} if commit else {8, 9, 10}
        ins = self._placed(plugin, inputs, host)
        values = dict(attrs, mode=GDN_MODES[mode], zero_state_input=int(not commit and len(ins) == 12))
        values.setdefault("chunk_size", 64)
        c_attrs = (ctypes.c_int32 * len(GDN_ATTRS))(*(int(values[k]) for k in GDN_ATTRS))
        d = c_descs(ins)
        p = c_ptrs(ins)
        msg = ctypes.create_string_buffer(_MSG_LEN)
        nbytes = ctypes.c_int64()
        self._check(plugin, self.lib.df2_cuda_gdn_workspace(c_attrs, *d, p, ctypes.byref(nbytes), msg, _MSG_LEN), msg)
        dev = ins[0].device
        ws = torch.empty(int(nbytes.value) + 256, dtype=torch.uint8, device=dev)
        ws_ptr = (ws.data_ptr() + 255) & ~255
        bsz = ins[7 if not commit else 5].shape[0]
        if commit:
            outs = [torch.zeros(bsz, dtype=torch.int32, device=dev)]
        else:
            qkv = ins[0]
            kv, hv = int(values["max_verify_tokens"]), int(values["num_v_heads"])
            outs = [torch.empty(qkv.shape[0], hv * int(values["head_v_dim"]), dtype=qkv.dtype, device=dev),
                    torch.zeros(bsz, kv, qkv.shape[1], dtype=qkv.dtype, device=dev),
                    torch.zeros(bsz, kv, 2, hv, dtype=torch.float32, device=dev)]
        with self._device(ins[0]):
            rc = self.lib.df2_cuda_gdn_enqueue(c_attrs, *d, p, c_ptrs(outs), ctypes.c_void_p(ws_ptr),
                                               ctypes.c_int64(self._stream(ins[0])), msg, _MSG_LEN)
        self._check(plugin, rc, msg)
        return tuple(outs)


class _NoKernels:
    """What :class:`ShapeOnlyPluginLib` has for a loaded library: every ``df2_cuda_*`` entry point accepts its
    arguments and does nothing (status 0, no workspace)."""

    def __getattr__(self, name):
        if not name.startswith("df2_cuda_"):
            raise AttributeError(name)
        return lambda *args: 0


class ShapeOnlyPluginLib(CudaPluginLib):
    """:class:`CudaPluginLib` with no kernels behind it, for tensors on the ``meta`` device (the capture check,
    ``engine/standin/capture.py``): the same Python side (where each input must be, the outputs and workspace it
    allocates, their shapes and dtypes) without the library's validation and launches. Its outputs hold no
    values."""

    def __init__(self):
        self.path, self.lib = None, _NoKernels()

    @staticmethod
    def _stream(t: torch.Tensor) -> int:
        return 0


_LIB: dict[str, CudaPluginLib] = {}
_LOCK = threading.Lock()


def cuda_plugin_lib(arch: str | None = None) -> CudaPluginLib:
    """The CUDA build for ``arch`` (default: the visible GPU's), built or found in the cache and loaded once per
    process."""
    arch = arch or device_arch()
    with _LOCK:
        if arch not in _LIB:
            _LIB[arch] = CudaPluginLib(build_cuda_plugins(arch))
        return _LIB[arch]
