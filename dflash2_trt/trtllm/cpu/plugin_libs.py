"""The CPU builds of the DFlash2 plugins, compiled on first use and loaded with ctypes.

Each plugin folder has a C-ABI CPU build (``plugins/<p>Plugin/<p>Cpu.cpp`` + ``<p>Params.cpp``)
that runs the same math headers as the CUDA kernels and the same validation function as the
TensorRT glue. The CPU engine backend calls them in place of the TensorRT plugins; the plugin
tests compare them bit for bit with the torch reference.

:func:`build_cpu_plugin` compiles one with g++ into
``$DFLASH2_TRT_CACHE/plugins-cpu/<sha256>/`` (default cache ``~/.cache/dflash2-trt``), where the
hash covers the compiler flags and the bytes of every source file and of every local header they
include, so an edited plugin gets a new directory and an unchanged one is never rebuilt. A build
is written to a temporary file in its final directory and renamed into place, so processes
building at the same time never see (or leave) a half-written library.

:class:`ConvLib` / :class:`ScanLib` / :class:`GdnLib` wrap the libraries; :func:`conv_lib` /
:func:`scan_lib` / :func:`gdn_lib` build and load each once per process. A call the plugin's own validation rejects raises
:class:`PluginRunError` (a :class:`ValueError` and a :class:`DFlash2Error`) carrying the
plugin's message, e.g. ``"DFlash2DynamicConv: tokens=6 is not a multiple of block_size=4"``.

The sources are read from :func:`dflash2_trt.plugins.plugin_dir` (``DFLASH2_PLUGIN_DIR``, else
``<checkout>/plugins``). A wheel does not contain ``plugins/``: a non-editable install must set
``DFLASH2_PLUGIN_DIR`` to a checkout's ``plugins/`` folder (the error says so).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dflash2_trt import plugins
from dflash2_trt.errors import ConfigError, DFlash2Error, MissingDependencyError

__all__ = [
    "CXXFLAGS",
    "CPU_PLUGIN_NAMES",
    "DTYPE_CODES",
    "UNKNOWN_DTYPE",
    "PluginBuildError",
    "PluginRunError",
    "CpuPluginSources",
    "cache_dir",
    "cpu_plugin_sources",
    "compile_shared",
    "compile_atomic",
    "compile_parallel",
    "build_cpu_plugin",
    "descs",
    "local_headers",
    "sources_digest",
    "ConvLib",
    "ScanLib",
    "GdnLib",
    "conv_lib",
    "scan_lib",
    "gdn_lib",
]

# -ffp-contract=off: the CUDA kernels use explicit round-to-nearest multiplies/adds (no FMA, or
# an explicit fmaf where the kernel wants one), and the CPU build must not let the compiler
# contract a*b+c into an FMA either, or the two would differ in the last bit while both "look"
# right (and the conv would no longer match the torch reference bit for bit).
CXXFLAGS: tuple[str, ...] = ("-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-Wall", "-Wextra",
                             "-Werror")

# plugin name -> (sources in the plugin's folder, library file name)
_CPU_BUILDS: dict[str, tuple[tuple[str, ...], str]] = {
    "DFlash2DynamicConv": (("dynamicConvCpu.cpp", "dynamicConvParams.cpp"), "libdf2_conv_cpu.so"),
    "DFlash2PairwiseScan": (("pairwiseScanCpu.cpp", "pairwiseScanParams.cpp"), "libdf2_scan_cpu.so"),
    "DFlash2GatedDeltaNet": (("gatedDeltaNetCpu.cpp", "gatedDeltaNetParams.cpp"), "libdf2_gdn_cpu.so"),
}
CPU_PLUGIN_NAMES = tuple(_CPU_BUILDS)

_HASH_VERSION = b"dflash2-trt plugins-cpu 1\0"
_STDERR_TAIL = 4000  # characters of g++'s stderr quoted in a build error
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)

# torch dtype -> dflash2::DType (plugins/common/df2Common.h)
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int32: 3}
UNKNOWN_DTYPE = 99  # e.g. int64 / float64: not a plugin dtype at all
_MAX_DIMS = 8  # slots per tensor in the C ABI's dims array (TensorDesc::dims)
_MSG_LEN = 512
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class PluginBuildError(DFlash2Error):
    """The CPU build of a plugin could not be compiled, written or loaded."""


class PluginRunError(DFlash2Error, ValueError):
    """A CPU plugin call was rejected; the message is the plugin's own validation message."""


# ------------------------------------------------------------------------------------ building
def cache_dir() -> Path:
    """``$DFLASH2_TRT_CACHE``, else ``$XDG_CACHE_HOME/dflash2-trt`` (``~/.cache/dflash2-trt``)."""
    env = os.environ.get("DFLASH2_TRT_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dflash2-trt"


@dataclass(frozen=True)
class CpuPluginSources:
    """What the CPU build of one plugin is compiled from."""

    name: str
    root: Path                  # the plugin dir (plugin_dir())
    sources: tuple[Path, ...]   # the .cpp files handed to g++
    headers: tuple[Path, ...]   # local headers they include, transitively (hashed, not compiled)
    library: str                # file name of the built library

    def digest(self) -> str:
        """sha256 over the flags and the bytes (and names relative to ``root``) of every file."""
        return sources_digest(_HASH_VERSION, CXXFLAGS, self.root, (*self.sources, *self.headers))


def sources_digest(version: bytes, parts, root: Path, files) -> str:
    """sha256 of a build: ``version``, each of ``parts`` (flags, compiler, architecture), then every file's name
    relative to ``root``, size and bytes, in name order (the CPU and CUDA builds' cache keys)."""
    def rel(p: Path) -> str:
        try:
            return p.relative_to(root).as_posix()
        except ValueError:
            return p.as_posix()

    h = hashlib.sha256(version)
    for part in parts:
        h.update(str(part).encode() + b"\0")
    for f in sorted(set(files), key=rel):
        data = f.read_bytes()
        h.update(rel(f).encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def _missing_sources(name: str, root: Path, missing: Sequence[Path]) -> MissingDependencyError:
    env = os.environ.get("DFLASH2_PLUGIN_DIR")
    origin = f"DFLASH2_PLUGIN_DIR={env}" if env else "the default, <package>/../plugins"
    return MissingDependencyError(
        f"the CPU build of {name} needs the plugin sources, which are not in {root} ({origin}); "
        f"missing: {', '.join(str(m) for m in missing)}. They are part of a source checkout of dflash2-trt "
        f"(its plugins/ folder) and are not shipped in the wheel: use an editable install of a checkout "
        f"(pip install -e <checkout>) or set DFLASH2_PLUGIN_DIR to <checkout>/plugins.")


def local_headers(sources: Sequence[Path]) -> tuple[Path, ...]:
    """Headers reached through ``#include "..."`` (resolved next to the including file), transitively.
    One that does not exist is left to g++ to report."""
    seen: set[Path] = set()
    todo = list(sources)
    while todo:
        f = todo.pop()
        for inc in _INCLUDE.findall(f.read_text(errors="replace")):
            h = (f.parent / inc).resolve()
            if h not in seen and h not in sources and h.is_file():
                seen.add(h)
                todo.append(h)
    return tuple(sorted(seen))


def cpu_plugin_sources(name: str) -> CpuPluginSources:
    """The files of plugin ``name``'s CPU build, located through its YAML spec in plugin_dir()."""
    if name not in _CPU_BUILDS:
        raise ConfigError(f"unknown plugin {name!r}; known: {list(CPU_PLUGIN_NAMES)}", field="plugin")
    root = plugins.plugin_dir()
    if not root.is_dir():
        raise _missing_sources(name, root, [root])
    spec = plugins.load_spec(name)
    files, library = _CPU_BUILDS[name]
    root = root.resolve()
    sources = tuple(spec.source.parent.resolve() / f for f in files)
    missing = [s for s in sources if not s.is_file()]
    if missing:
        raise _missing_sources(name, root, missing)
    return CpuPluginSources(name=name, root=root, sources=sources, headers=local_headers(sources), library=library)


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _STDERR_TAIL else "...\n" + text[-_STDERR_TAIL:]


def compile_shared(sources: Sequence[str | os.PathLike], out: str | os.PathLike) -> Path:
    """``g++ CXXFLAGS sources -o out``, atomically: g++ writes a temporary file next to ``out``
    that is renamed onto ``out`` only once complete. Raises MissingDependencyError without g++,
    PluginBuildError (with the command and the end of g++'s stderr) when compiling fails."""
    out = Path(out)
    gxx = shutil.which("g++")
    if gxx is None:
        raise MissingDependencyError(
            "g++ not found on PATH: the CPU builds of the DFlash2 plugins are compiled with g++ (C++17) on "
            "first use; install it (e.g. the g++ / build-essential package) or put it on PATH")
    return compile_atomic([gxx, *CXXFLAGS, *(str(s) for s in sources)], out, "g++")


def compile_atomic(argv: Sequence[str], out: str | os.PathLike, tool: str) -> Path:
    """``argv -o TMP`` then TMP renamed onto ``out``: the compiler writes a temporary file next to ``out``, so
    processes building at once never see (or leave) a half-written library. PluginBuildError (with the command and
    the end of the compiler's stderr) when it fails; the CPU and CUDA builds both compile this way."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    except OSError as e:
        raise PluginBuildError(f"cannot write {out.parent} ({e}); point DFLASH2_TRT_CACHE at a writable "
                               f"directory") from None
    os.close(fd)
    tmp = Path(tmp_name)
    cmd = [*argv, "-o", str(tmp)]
    try:
        try:
            res = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise PluginBuildError(f"could not run {tool} ({e}): {shlex.join(cmd)}") from None
        if res.returncode != 0:
            raise PluginBuildError(
                f"{tool} failed (exit {res.returncode}) building {out.name}\ncommand: {shlex.join(cmd)}\n"
                f"stderr:\n{_tail(res.stderr) or '(empty)'}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def compile_parallel(commands: Sequence[tuple[Sequence[str], Path]], tool: str, what: str,
                     jobs: int | None = None) -> None:
    """Run each ``(argv, object)`` compile (``argv -o object``), at most ``jobs`` (default: the CPUs this process may
    use) at once, in the order given (put the longest first). The first failure stops the others and raises PluginBuildError
    with its command and the end of its stderr; an interrupt stops them too (each with its own children:
    :func:`~dflash2_trt.children.kill_tree`). Each compiler's stderr goes to a file next to its object (a pipe read
    only at the end could fill and stall it)."""
    from dflash2_trt.children import kill_tree
    from dflash2_trt.cpu_threads import available_cpus

    jobs = max(1, jobs or available_cpus())
    pending = list(commands)
    running: list[tuple[subprocess.Popen, list[str], Path]] = []
    started: list[subprocess.Popen] = []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                argv, obj = pending.pop(0)
                cmd = [*argv, "-o", str(obj)]
                err = Path(f"{obj}.stderr")
                try:
                    fh = open(err, "w")
                except OSError as e:
                    raise PluginBuildError(f"cannot write {err} ({e}); point DFLASH2_TRT_CACHE at a writable "
                                           f"directory") from None
                with fh:
                    try:
                        started.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh,
                                                        stdin=subprocess.DEVNULL))
                    except OSError as e:
                        raise PluginBuildError(f"could not run {tool} ({e}): {shlex.join(cmd)}") from None
                running.append((started[-1], cmd, err))
            for item in list(running):
                proc, cmd, err = item
                rc = proc.poll()
                if rc is None:
                    continue
                running.remove(item)
                if rc != 0:
                    raise PluginBuildError(
                        f"{tool} failed (exit {rc}) building {what}\ncommand: {shlex.join(cmd)}\n"
                        f"stderr:\n{_tail(err.read_text(errors='replace')) or '(empty)'}")
            if running:
                time.sleep(0.05)
    finally:
        # a failure or an interrupt: no compiler is left running (all stopped first, then waited for)
        for proc in started:
            if proc.poll() is None:
                kill_tree(proc.pid)
        for proc in started:
            proc.wait()


def build_cpu_plugin(name: str) -> Path:
    """Path of the CPU build of plugin ``name`` (``"DFlash2DynamicConv"`` / ``"DFlash2PairwiseScan"``),
    compiled into ``cache_dir()/plugins-cpu/<sha256>/`` unless a build of the same sources and
    flags is already there."""
    src = cpu_plugin_sources(name)
    out = cache_dir() / "plugins-cpu" / src.digest() / src.library
    if out.is_file():
        return out
    return compile_shared(src.sources, out)


# ---------------------------------------------------------------------------- ctypes wrappers
def descs(tensors) -> tuple:
    """(n, dtypes int32[n], nbDims int32[n], dims int64[n*8]) for a list of tensors, or of
    (dtype_code, shape) tuples for shapes that must not be allocated (e.g. unknown dims = -1)."""
    n = len(tensors)
    dtypes = (ctypes.c_int32 * n)()
    nbdims = (ctypes.c_int32 * n)()
    dims = (ctypes.c_int64 * (_MAX_DIMS * n))()
    for i, t in enumerate(tensors):
        if isinstance(t, torch.Tensor):
            code, shape = DTYPE_CODES.get(t.dtype, UNKNOWN_DTYPE), tuple(t.shape)
        else:
            code, shape = t
        if len(shape) > _MAX_DIMS:
            raise PluginRunError(f"input {i} has {len(shape)} dims; the plugins take at most {_MAX_DIMS}")
        dtypes[i] = code
        nbdims[i] = len(shape)
        for d, v in enumerate(shape):
            dims[i * _MAX_DIMS + d] = v
    return n, dtypes, nbdims, dims


def _ptr(t: torch.Tensor | None):
    return ctypes.c_void_p(0 if t is None else t.data_ptr())


def _on_cpu(plugin: str, tensors: Sequence[torch.Tensor | None]) -> None:
    for i, t in enumerate(tensors):
        if t is not None and t.device.type != "cpu":
            raise PluginRunError(f"{plugin}: input {i} is on {t.device}; the CPU build takes CPU tensors")


def _int32(plugin: str, what: str, v: Any) -> int:
    if isinstance(v, bool):
        v = int(v)
    if not isinstance(v, int) or not _INT32_MIN <= v <= _INT32_MAX:
        raise PluginRunError(f"{plugin}: {what}={v!r} is not an int32")
    return v


def _load(path: Path, symbols: Sequence[str]) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(str(path))
        for s in symbols:
            getattr(lib, s)
    except (OSError, AttributeError) as e:
        raise PluginBuildError(f"{path} is not a usable CPU plugin build ({e}); delete it to rebuild") from None
    return lib


class ConvLib:
    """ctypes wrapper of plugins/dynamicConvPlugin/dynamicConvCpu.cpp (DFlash2DynamicConv)."""

    PLUGIN = "DFlash2DynamicConv"

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.lib = _load(self.path, ["df2_conv_validate", "df2_conv_run", "df2_float_to_half", "df2_half_to_float",
                                     "df2_float_to_bf16", "df2_exp"])
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

    def _attrs(self, block_size, kernel_size, group_size, fuse):
        vals = {"block_size": block_size, "kernel_size": kernel_size, "group_size": group_size,
                "fuse_residual": fuse}
        return (ctypes.c_int32 * 4)(*(_int32(self.PLUGIN, k, v) for k, v in vals.items()))

    def validate(self, inputs, *, block_size, kernel_size, group_size, fuse=False) -> tuple[int, str]:
        """(status, message) of the plugin's validation for ``inputs`` (tensors or (dtype_code, shape))."""
        msg = ctypes.create_string_buffer(_MSG_LEN)
        n, dt, nd, dims = descs(inputs)
        rc = self.lib.df2_conv_validate(self._attrs(block_size, kernel_size, group_size, fuse), n, dt, nd, dims,
                                        msg, _MSG_LEN)
        return rc, msg.value.decode()

    def run(self, x, delta, base, *, block_size, group_size, residual=None, kernel_size=None) -> torch.Tensor:
        """y = dynamic_conv(x, delta, base) in x's dtype, or residual + y in fp32 when ``residual``
        is given. ``kernel_size`` defaults to base.shape[0]."""
        _on_cpu(self.PLUGIN, [x, delta, base, residual])
        x, delta, base = x.contiguous(), delta.contiguous(), base.contiguous()
        k = (base.shape[0] if base.dim() > 0 else 0) if kernel_size is None else kernel_size
        inputs = [x, delta, base] + ([residual.contiguous()] if residual is not None else [])
        attrs = self._attrs(block_size, k, group_size, residual is not None)
        out = torch.empty(x.shape, dtype=torch.float32 if residual is not None else x.dtype)
        msg = ctypes.create_string_buffer(_MSG_LEN)
        n, dt, nd, dims = descs(inputs)
        rc = self.lib.df2_conv_run(attrs, n, dt, nd, dims, _ptr(x), _ptr(delta), _ptr(base),
                                   _ptr(inputs[3] if residual is not None else None), _ptr(out), msg, _MSG_LEN)
        if rc != 0:
            raise PluginRunError(msg.value.decode() or f"{self.PLUGIN}: rejected (status {rc})")
        return out


class ScanLib:
    """ctypes wrapper of plugins/pairwiseScanPlugin/pairwiseScanCpu.cpp (DFlash2PairwiseScan)."""

    PLUGIN = "DFlash2PairwiseScan"
    MODES = {"greedy": 0, "sample": 1, "viterbi": 2}

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.lib = _load(self.path, ["df2_scan_validate", "df2_scan_run", "df2_scan_walk"])
        self.lib.df2_scan_validate.restype = ctypes.c_int32
        self.lib.df2_scan_run.restype = ctypes.c_int32
        self.lib.df2_scan_walk.restype = ctypes.c_int32
        self.lib.df2_scan_walk.argtypes = [ctypes.c_int32, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32] + [
            ctypes.c_void_p] * 5

    def _mode(self, mode) -> int:
        """A mode name, or an int handed to the plugin as is (its validation range-checks it)."""
        if isinstance(mode, str):
            if mode not in self.MODES:
                raise PluginRunError(f"{self.PLUGIN}: mode {mode!r} is not one of {sorted(self.MODES)}")
            return self.MODES[mode]
        return _int32(self.PLUGIN, "mode", mode)

    def validate(self, inputs, mode="greedy") -> tuple[int, str]:
        """(status, message) of the plugin's validation for ``inputs`` (tensors or (dtype_code, shape))."""
        msg = ctypes.create_string_buffer(_MSG_LEN)
        n, dt, nd, dims = descs(inputs)
        rc = self.lib.df2_scan_validate(ctypes.c_int32(self._mode(mode)), n, dt, nd, dims, msg, _MSG_LEN)
        return rc, msg.value.decode()

    def run(self, mode, unary, cand, hidden, anchor, pred_cb, succ_cb, temperature, uniforms):
        """The whole plugin: (lattice [B,L,K,K] fp32, idx [B,L] int64, ids [B,L] int64, q [B,L,K] fp32)."""
        ins = [unary, cand, hidden, anchor, pred_cb, succ_cb, temperature, uniforms]
        _on_cpu(self.PLUGIN, ins)
        ins = [t.contiguous() for t in ins]
        m = self._mode(mode)
        rc, text = self.validate(ins, m)  # before unary's shape sizes the outputs
        if rc != 0:
            raise PluginRunError(text or f"{self.PLUGIN}: rejected (status {rc})")
        b, l, k = ins[0].shape
        lattice = torch.empty(b, l, k, k)
        idx = torch.empty(b, l, dtype=torch.int32)
        ids = torch.empty(b, l, dtype=torch.int32)
        q = torch.empty(b, l, k)
        msg = ctypes.create_string_buffer(_MSG_LEN)
        n, dt, nd, dims = descs(ins)
        rc = self.lib.df2_scan_run(ctypes.c_int32(m), n, dt, nd, dims, *map(_ptr, ins),
                                   _ptr(lattice), _ptr(idx), _ptr(ids), _ptr(q), msg, _MSG_LEN)
        if rc != 0:
            raise PluginRunError(msg.value.decode() or f"{self.PLUGIN}: rejected (status {rc})")
        return lattice, idx.long(), ids.long(), q

    def walk(self, mode, lattice, temperature=None, uniforms=None):
        """The walk alone over a given lattice [B,L,K,K]: (idx [B,L] int64, q [B,L,K] fp32).
        ``temperature`` [B] defaults to 1, ``uniforms`` [B,L] to 0."""
        _on_cpu(self.PLUGIN, [lattice, temperature, uniforms])
        m = self._mode(mode)
        if lattice.dim() != 4 or lattice.shape[2] != lattice.shape[3]:
            raise PluginRunError(f"{self.PLUGIN}: walk: lattice must be [B, L, K, K], got {list(lattice.shape)}")
        lattice = lattice.float().contiguous()
        b, l, k, _ = lattice.shape
        temperature = torch.ones(b) if temperature is None else temperature.float().contiguous()
        uniforms = torch.zeros(b, l) if uniforms is None else uniforms.float().contiguous()
        if tuple(temperature.shape) != (b,) or tuple(uniforms.shape) != (b, l):
            raise PluginRunError(f"{self.PLUGIN}: walk: temperature must be [{b}] and uniforms [{b}, {l}], got "
                                 f"{list(temperature.shape)} and {list(uniforms.shape)}")
        idx = torch.empty(b, l, dtype=torch.int32)
        q = torch.empty(b, l, k)
        rc = self.lib.df2_scan_walk(m, b, l, k, lattice.data_ptr(), temperature.data_ptr(),
                                    uniforms.data_ptr(), idx.data_ptr(), q.data_ptr())
        if rc != 0:
            raise PluginRunError(f"{self.PLUGIN}: walk: mode={m}, L={l}, K={k} outside mode 0-2, L in [1, 15], "
                                 f"K in [1, 16]")
        return idx.long(), q


class GdnLib:
    """ctypes wrapper of plugins/gatedDeltaNetPlugin/gatedDeltaNetCpu.cpp (DFlash2GatedDeltaNet).

    The state pools are torch tensors the caller owns (the runtime's slots): ``rnn_state`` float32
    ``[slots, Hv, Dk + E, Dv]`` (a slot = the state and the deferred commit's records,
    :mod:`dflash2_trt.trtllm.gdn_slot`) and ``conv_state`` ``[slots, K-1, C]`` in the activation dtype;
    the plugin receives their addresses as the int64 ``rnn_state_ptr`` / ``conv_state_ptr`` inputs, as
    TensorRT-LLM's recurrent layers do, and updates them in place. :meth:`new_pool` makes a pool from
    states, :meth:`committed_states` reads the committed state of every slot (its records folded).
    """

    PLUGIN = "DFlash2GatedDeltaNet"
    MODES = {"forward": 0, "commit": 1}
    ATTRS = ("mode", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel", "max_verify_tokens",
             "chunk_size", "zero_state_input")
    INT64 = 4  # dflash2::DType::kINT64 (not in DTYPE_CODES: elsewhere an int64 tensor is "unknown")

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.lib = _load(self.path, ["df2_gdn_validate", "df2_gdn_forward", "df2_gdn_commit", "df2_gdn_softplus",
                                     "df2_gdn_sigmoid", "df2_gdn_silu", "df2_gdn_log"])
        for f in ("df2_gdn_validate", "df2_gdn_forward", "df2_gdn_commit"):
            getattr(self.lib, f).restype = ctypes.c_int32
        # the CPU build's fold and layout (a library of the kernels alone, the emulation's, may lack them)
        self.has_fold = all(hasattr(self.lib, f) for f in ("df2_gdn_fold", "df2_gdn_slot_layout"))
        if self.has_fold:
            self.lib.df2_gdn_fold.restype = ctypes.c_int32
            self.lib.df2_gdn_slot_layout.restype = ctypes.c_int32
        for f in ("df2_gdn_softplus", "df2_gdn_sigmoid", "df2_gdn_silu", "df2_gdn_log"):
            getattr(self.lib, f).restype = ctypes.c_float
            getattr(self.lib, f).argtypes = [ctypes.c_float]

    def _attrs(self, mode, *, num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_kernel, max_verify_tokens,
               chunk_size=64, zero_state_input=0):
        if isinstance(mode, str):
            if mode not in self.MODES:
                raise PluginRunError(f"{self.PLUGIN}: mode {mode!r} is not one of {sorted(self.MODES)}")
            mode = self.MODES[mode]
        vals = dict(mode=mode, num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=head_k_dim,
                    head_v_dim=head_v_dim, conv_kernel=conv_kernel, max_verify_tokens=max_verify_tokens,
                    chunk_size=chunk_size, zero_state_input=zero_state_input)
        return (ctypes.c_int32 * len(self.ATTRS))(*(_int32(self.PLUGIN, k, vals[k]) for k in self.ATTRS))

    def _descs(self, inputs):
        return descs([(self.INT64, tuple(t.shape)) if isinstance(t, torch.Tensor) and t.dtype == torch.int64 else t
                      for t in inputs])

    def validate(self, inputs, mode="forward", **attrs) -> tuple[int, str]:
        """(status, message) of the plugin's shape validation for ``inputs`` (tensors or
        (dtype_code, shape); int64 is code 4)."""
        msg = ctypes.create_string_buffer(_MSG_LEN)
        n, dt, nd, dims = self._descs(inputs)
        rc = self.lib.df2_gdn_validate(self._attrs(mode, **attrs), n, dt, nd, dims, msg, _MSG_LEN)
        return rc, msg.value.decode()

    @staticmethod
    def layout(**attrs):
        """The slot layout (:class:`dflash2_trt.trtllm.gdn_slot.GdnSlotLayout`) for these attributes."""
        from ..gdn_slot import gdn_slot_layout

        return gdn_slot_layout(attrs["num_k_heads"], attrs["num_v_heads"], attrs["head_k_dim"], attrs["head_v_dim"],
                               attrs["max_verify_tokens"])

    def slot_layout_of_build(self, **attrs) -> tuple[int, ...]:
        """The CPU build's own layout (gatedDeltaNetSlotLayout): (state, pending, delta, keys, decay,
        record_rows, floats)."""
        out = (ctypes.c_int64 * 7)()
        msg = ctypes.create_string_buffer(_MSG_LEN)
        rc = self.lib.df2_gdn_slot_layout(self._attrs("forward", **attrs), out, msg, _MSG_LEN)
        if rc != 0:
            raise PluginRunError(msg.value.decode() or f"{self.PLUGIN}: rejected (status {rc})")
        return tuple(out)

    @classmethod
    def new_pool(cls, states: torch.Tensor, **attrs) -> torch.Tensor:
        """An rnn pool ``[slots, Hv, Dk + E, Dv]`` whose slots hold ``states [slots, Hv, Dk, Dv]`` as their
        committed state (no pending records; the record area zero)."""
        lay = cls.layout(**attrs)
        pool = torch.zeros(states.shape[0], *lay.row_shape, dtype=torch.float32, device=states.device)
        cls.state_part(pool, **attrs).copy_(states)
        return pool

    @classmethod
    def state_part(cls, pool: torch.Tensor, **attrs) -> torch.Tensor:
        """The state part of every slot (as of the last fold, records not applied): a view ``[slots, Hv, Dk, Dv]``."""
        lay = cls.layout(**attrs)
        hv, dk, dv = attrs["num_v_heads"], attrs["head_k_dim"], attrs["head_v_dim"]
        return pool.view(pool.shape[0], lay.floats)[:, :hv * dk * dv].view(pool.shape[0], hv, dk, dv)

    @classmethod
    def pending(cls, pool: torch.Tensor, **attrs) -> torch.Tensor:
        """Every slot's raw pending count (int32 ``[slots]``, a copy)."""
        lay = cls.layout(**attrs)
        return pool.view(pool.shape[0], lay.floats)[:, lay.pending].clone().view(torch.int32)

    def fold(self, pool: torch.Tensor, slots=None, **attrs) -> None:
        """Folds the pending records of ``slots`` (default: all) into their state, in place, and sets their counts
        to 0 (what the next forward does first): the same arithmetic as the plugin's."""
        if not self.has_fold:
            raise PluginRunError(f"{self.PLUGIN}: {self.path} has no df2_gdn_fold (not a CPU build)")
        _on_cpu(self.PLUGIN, [pool])
        lay = self.layout(**attrs)
        if pool.dtype != torch.float32 or not pool.is_contiguous() or pool[0].numel() != lay.floats:
            raise PluginRunError(f"{self.PLUGIN}: rnn_state must be a contiguous torch.float32 pool "
                                 f"[slots, {', '.join(map(str, lay.row_shape))}]")
        idx = torch.arange(pool.shape[0], dtype=torch.int32) if slots is None else \
            torch.as_tensor(slots, dtype=torch.int32).reshape(-1).contiguous()
        msg = ctypes.create_string_buffer(_MSG_LEN)
        rc = self.lib.df2_gdn_fold(self._attrs("forward", **attrs), ctypes.c_void_p(pool.data_ptr()),
                                   ctypes.c_int64(pool.shape[0]), ctypes.c_void_p(idx.data_ptr()),
                                   ctypes.c_int64(idx.numel()), msg, _MSG_LEN)
        if rc != 0:
            raise PluginRunError(msg.value.decode() or f"{self.PLUGIN}: rejected (status {rc})")

    def committed_states(self, pool: torch.Tensor, **attrs) -> torch.Tensor:
        """The committed state of every slot, ``[slots, Hv, Dk, Dv]`` (a CPU copy; the pool is not changed): the
        state part with the pending records folded in."""
        work = pool.detach().to("cpu", copy=True).contiguous()
        self.fold(work, **attrs)
        return self.state_part(work, **attrs).clone()

    def _pools(self, rnn_state, conv_state, act_dtype, attrs) -> tuple[int, torch.Tensor, torch.Tensor]:
        """Checks the pools against the attributes; returns (slots, rnn_state_ptr, conv_state_ptr)."""
        hv, dk, dv = attrs["num_v_heads"], attrs["head_k_dim"], attrs["head_v_dim"]
        c = 2 * attrs["num_k_heads"] * dk + hv * dv
        keep = attrs["conv_kernel"] - 1
        for name, t, dtype, tail in (("rnn_state", rnn_state, torch.float32, self.layout(**attrs).row_shape),
                                     ("conv_state", conv_state, act_dtype, (keep, c))):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not t.is_contiguous():
                raise PluginRunError(f"{self.PLUGIN}: {name} must be a contiguous CPU tensor (the pool is updated "
                                     f"in place)")
            if t.dtype != dtype or t.dim() != 1 + len(tail) or tuple(t.shape[1:]) != tail:
                raise PluginRunError(f"{self.PLUGIN}: {name} must be {dtype} [slots, {', '.join(map(str, tail))}], "
                                     f"got {t.dtype} {list(t.shape)}")
        if rnn_state.shape[0] != conv_state.shape[0]:
            raise PluginRunError(f"{self.PLUGIN}: rnn_state has {rnn_state.shape[0]} slots but conv_state "
                                 f"{conv_state.shape[0]}")
        ptrs = [torch.tensor([t.data_ptr()], dtype=torch.int64) for t in (rnn_state, conv_state)]
        return int(rnn_state.shape[0]), ptrs[0], ptrs[1]

    def _run(self, fn, mode, ins, outs, slots, attrs):
        _on_cpu(self.PLUGIN, ins)
        msg = ctypes.create_string_buffer(_MSG_LEN)
        n, dt, nd, dims = self._descs(ins)
        in_ptrs = (ctypes.c_void_p * len(ins))(*(t.data_ptr() for t in ins))
        out_ptrs = (ctypes.c_void_p * len(outs))(*(t.data_ptr() for t in outs))
        rc = fn(self._attrs(mode, **attrs), n, dt, nd, dims, in_ptrs, out_ptrs, ctypes.c_int64(slots), msg, _MSG_LEN)
        if rc != 0:
            raise PluginRunError(msg.value.decode() or f"{self.PLUGIN}: rejected (status {rc})")

    def forward(self, qkv, conv_weight, a, b, dt_bias, A_log, cu_seqlens, slot_mapping, request_types, rnn_state,
                conv_state, zero_state=None, **attrs):
        """The forward over a packed mixed batch: ``(y [T, Hv*Dv], verify_qkv [B, Kv, C],
        verify_gates [B, Kv, 2, Hv])``. Every slot first folds its pending records (none where
        ``zero_state`` [B] int32 flags a context request: the plugin's zero_state_input = 1, from zeros);
        context requests' slots then advance (state and conv state); generation requests' slots keep their
        committed state and get this step's verify records (pending 0 until the commit). Rows of verify_*
        that the plugin does not write are zero."""
        if zero_state is not None:
            attrs = {**attrs, "zero_state_input": 1}
        slots, rnn_ptr, conv_ptr = self._pools(rnn_state, conv_state, qkv.dtype, attrs)
        ins = [t.contiguous() for t in (qkv, conv_weight, a, b, dt_bias, A_log, cu_seqlens, slot_mapping,
                                        request_types)] + [rnn_ptr, conv_ptr]
        if zero_state is not None:
            ins.append(zero_state.contiguous())
        rc, text = self.validate(ins, "forward", **attrs)  # before the shapes size the outputs
        if rc != 0:
            raise PluginRunError(text or f"{self.PLUGIN}: rejected (status {rc})")
        t, bsz, kv, hv = qkv.shape[0], slot_mapping.shape[0], attrs["max_verify_tokens"], attrs["num_v_heads"]
        outs = [torch.empty(t, hv * attrs["head_v_dim"], dtype=qkv.dtype),
                torch.zeros(bsz, kv, qkv.shape[1], dtype=qkv.dtype), torch.zeros(bsz, kv, 2, hv)]
        self._run(self.lib.df2_gdn_forward, "forward", ins, outs, slots, attrs)
        return tuple(outs)

    def commit(self, verify_qkv, verify_gates, conv_weight, num_accepted, cu_seqlens, slot_mapping, request_types,
               rnn_state, conv_state, **attrs) -> torch.Tensor:
        """Commits each generation request's first ``num_accepted`` verify tokens: its slot's pending count
        (the next forward folds that many records) and its conv state; returns ``committed [B]`` (int32, 0
        for context requests)."""
        slots, rnn_ptr, conv_ptr = self._pools(rnn_state, conv_state, verify_qkv.dtype, attrs)
        ins = [t.contiguous() for t in (verify_qkv, verify_gates, conv_weight, num_accepted, cu_seqlens,
                                        slot_mapping, request_types)] + [rnn_ptr, conv_ptr]
        rc, text = self.validate(ins, "commit", **attrs)
        if rc != 0:
            raise PluginRunError(text or f"{self.PLUGIN}: rejected (status {rc})")
        outs = [torch.zeros(slot_mapping.shape[0], dtype=torch.int32)]
        self._run(self.lib.df2_gdn_commit, "commit", ins, outs, slots, attrs)
        return outs[0]

    def scalar(self, fn: str, x: float) -> float:
        """One of the plugin's scalar functions (softplus, sigmoid, silu, log) on x."""
        return float(getattr(self.lib, f"df2_gdn_{fn}")(x))


# --------------------------------------------------------------------- once-per-process access
_LIBS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _cached(name: str, cls):
    with _LOCK:
        lib = _LIBS.get(name)
        if lib is None:
            lib = _LIBS[name] = cls(build_cpu_plugin(name))
        return lib


def conv_lib() -> ConvLib:
    """The DFlash2DynamicConv CPU build, built (or found in the cache) and loaded once per process."""
    return _cached("DFlash2DynamicConv", ConvLib)


def scan_lib() -> ScanLib:
    """The DFlash2PairwiseScan CPU build, built (or found in the cache) and loaded once per process."""
    return _cached("DFlash2PairwiseScan", ScanLib)


def gdn_lib() -> GdnLib:
    """The DFlash2GatedDeltaNet CPU build, built (or found in the cache) and loaded once per process."""
    return _cached("DFlash2GatedDeltaNet", GdnLib)
