"""The plugins' CUDA build for the cuda engine backend (dflash2_trt/trtllm/cuda/plugin_lib.py,
plugins/common/df2CudaEntry.cpp), on a machine without a GPU: nvcc builds it (cached by a hash of nvcc's version,
the flags, the architecture and every source and header), it loads (cudart is static), its C ABI validates exactly
as the plugins' CPU builds do, reads the Gated DeltaNet's host inputs on the host, and a launch without a GPU is
CUDA's error in one line. What it computes is checked on a GPU (scripts/gpu_check.sh; tests/gpu)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import torch

from dflash2_trt.trtllm.cuda import plugin_lib as cl

ARCH = "90a"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found on PATH: the CUDA build needs the CUDA toolkit")
    mp = pytest.MonkeyPatch()
    cache = tmp_path_factory.mktemp("cuda-cache")
    mp.setenv("DFLASH2_TRT_CACHE", str(cache))
    try:
        path = cl.build_cuda_plugins(ARCH)
        yield path, cache
    finally:
        mp.undo()


def _forbid_compiling(monkeypatch) -> None:
    """nvcc may say its version (the cache key) but compile nothing: a build found in the cache is used as it is."""
    from dflash2_trt.trtllm.cpu import plugin_libs

    def no_compile(cmd, *a, **k):
        if "--version" in cmd:
            return subprocess.CompletedProcess(cmd, 0, cl.nvcc_version(cl.nvcc_path()), "")
        raise AssertionError(f"recompiled: {cmd}")

    def no_process(cmd, *a, **k):
        raise AssertionError(f"recompiled: {cmd}")

    monkeypatch.setattr(cl.subprocess, "run", no_compile)
    monkeypatch.setattr(plugin_libs.subprocess, "run", no_compile)      # where the link would run
    monkeypatch.setattr(plugin_libs.subprocess, "Popen", no_process)    # where the sources would be compiled


def test_build_is_cached_by_content(built, monkeypatch, tmp_path):
    path, cache = built
    assert path.is_file() and path.name == f"libdf2_cuda_sm{ARCH}.so"
    assert path.parent.parent == cache / "plugins-cuda"
    monkeypatch.setenv("DFLASH2_TRT_CACHE", str(cache))
    _forbid_compiling(monkeypatch)
    assert cl.build_cuda_plugins(ARCH) == path                     # unchanged sources: no nvcc run
    # another architecture and an edited header each get their own build
    src = cl.cuda_plugin_sources()
    ver = cl.nvcc_version(cl.nvcc_path())
    assert src.digest("100a", ver) != src.digest(ARCH, ver)
    tree = tmp_path / "plugins"
    shutil.copytree(src.root, tree)
    (tree / "common" / "df2Common.h").write_text((tree / "common" / "df2Common.h").read_text() + "\n// edit\n")
    monkeypatch.setenv("DFLASH2_PLUGIN_DIR", str(tree))
    assert cl.cuda_plugin_sources().digest(ARCH, ver) != src.digest(ARCH, ver)


def test_a_session_cache_starts_with_the_builds_it_was_given(built, monkeypatch, tmp_path):
    """tests/gpu/conftest.py: the gpu tests' fresh session cache gets the builds of the cache the run was started with
    (the GPU command's .gpucache), so the tests' minute is not spent in nvcc; an unknown or absent cache gives none."""
    from dflash2_trt.testing.plugin_cache import copy_plugin_builds

    path, cache = built
    fresh = tmp_path / "session-cache"
    assert copy_plugin_builds(cache, fresh) == [f"plugins-cuda/{path.parent.name}"]
    assert copy_plugin_builds(cache, fresh) == [] and copy_plugin_builds(None, fresh) == []
    assert copy_plugin_builds(tmp_path / "absent", fresh) == []
    monkeypatch.setenv("DFLASH2_TRT_CACHE", str(fresh))
    _forbid_compiling(monkeypatch)
    got = cl.build_cuda_plugins(ARCH)
    assert got == fresh / "plugins-cuda" / path.parent.name / path.name and got.read_bytes() == path.read_bytes()


def test_arch_comes_from_the_environment_or_a_gpu(monkeypatch):
    monkeypatch.setenv("DFLASH2_CUDA_ARCH", "100a")
    assert cl.device_arch() == "100a" and cl.gencode("100a") == "arch=compute_100a,code=sm_100a"
    assert cl.gencode("89") == "arch=compute_89,code=sm_89"
    monkeypatch.setenv("DFLASH2_CUDA_ARCH", "sm_90")
    with pytest.raises(Exception, match="DFLASH2_CUDA_ARCH"):
        cl.device_arch()
    monkeypatch.delenv("DFLASH2_CUDA_ARCH")
    if not torch.cuda.is_available():
        with pytest.raises(Exception, match="needs a CUDA GPU"):
            cl.device_arch()


def test_loads_without_a_gpu_and_says_so(built):
    lib = cl.CudaPluginLib(built[0])
    n, err = lib.device_count()
    if torch.cuda.is_available():
        assert n >= 1 and err == 0
    else:
        assert n == 0 and err != 0


def test_the_c_abi_validates_as_the_cpu_builds_do(built):
    """Descriptors the plugins refuse get the CPU build's very message from the CUDA build (validation runs before
    any pointer is touched, so null pointers do)."""
    from dflash2_trt.trtllm.cpu.plugin_libs import conv_lib, gdn_lib, scan_lib

    lib = cl.CudaPluginLib(built[0]).lib
    msg = ctypes.create_string_buffer(512)
    # conv: tokens not a multiple of the block size
    bad = [torch.empty(6, 64), torch.empty(6, 2, 4), torch.empty(2, 64)]
    attrs = (ctypes.c_int32 * 4)(4, 2, 16, 0)
    rc = lib.df2_cuda_conv_enqueue(attrs, *cl.c_descs(bad), (ctypes.c_void_p * 3)(), None, ctypes.c_int64(0), msg, 512)
    want = conv_lib().validate(bad, block_size=4, kernel_size=2, group_size=16)
    assert rc != 0 and want[0] != 0 and msg.value.decode() == want[1]
    # scan: a candidate count over 16
    bad = [torch.empty(2, 3, 17), torch.empty(2, 3, 17, dtype=torch.int32), torch.empty(2, 3, 8),
           torch.empty(2, dtype=torch.int32), torch.empty(10, 8), torch.empty(10, 8), torch.empty(2), torch.empty(2, 3)]
    nbytes = ctypes.c_int64()
    rc = lib.df2_cuda_scan_workspace(ctypes.c_int32(1), *cl.c_descs(bad), ctypes.byref(nbytes), msg, 512)
    want = scan_lib().validate(bad, mode="sample")
    assert rc != 0 and want[0] != 0 and msg.value.decode() == want[1]
    # gdn: conv_weight of the wrong channel count
    attrs = dict(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, conv_kernel=4, max_verify_tokens=4)
    c = 2 * 2 * 16 + 4 * 16
    bad = [torch.empty(5, c), torch.empty(c + 1, 4), torch.empty(5, 4), torch.empty(5, 4), torch.empty(4),
           torch.empty(4), torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
           torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)]
    values = dict(attrs, mode=0, chunk_size=64, zero_state_input=0)
    c_attrs = (ctypes.c_int32 * len(cl.GDN_ATTRS))(*(values[k] for k in cl.GDN_ATTRS))
    rc = lib.df2_cuda_gdn_workspace(c_attrs, *cl.c_descs(bad), cl.c_ptrs(bad), ctypes.byref(nbytes), msg, 512)
    want = gdn_lib().validate(bad, "forward", **attrs)
    assert rc != 0 and want[0] != 0 and msg.value.decode() == want[1]


def test_gdn_reads_its_host_inputs_on_the_host(built):
    """host_request_types is read on the host (a generation request after a context one is refused with the
    plugin's message) and a null pool address is refused before any launch."""
    lib = cl.CudaPluginLib(built[0]).lib
    msg = ctypes.create_string_buffer(512)
    hk, hv, d = 2, 4, 16
    c = 2 * hk * d + hv * d
    values = dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=d, head_v_dim=d, conv_kernel=4, max_verify_tokens=4,
                  mode=0, chunk_size=64, zero_state_input=0)
    c_attrs = (ctypes.c_int32 * len(cl.GDN_ATTRS))(*(values[k] for k in cl.GDN_ATTRS))

    def inputs(types, ptr):
        return [torch.empty(6, c), torch.empty(c, 4), torch.empty(6, hv), torch.empty(6, hv), torch.empty(hv),
                torch.empty(hv), torch.tensor([0, 2, 6], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
                torch.tensor(types, dtype=torch.int32), torch.tensor([ptr], dtype=torch.int64),
                torch.tensor([ptr], dtype=torch.int64)]

    ins = inputs([1, 0], 0)
    nbytes = ctypes.c_int64()
    rc = lib.df2_cuda_gdn_workspace(c_attrs, *cl.c_descs(ins), cl.c_ptrs(ins), ctypes.byref(nbytes), msg, 512)
    assert rc != 0 and "context" in msg.value.decode()
    ins = inputs([0, 1], 0)
    assert lib.df2_cuda_gdn_workspace(c_attrs, *cl.c_descs(ins), cl.c_ptrs(ins), ctypes.byref(nbytes), msg, 512) == 0
    assert nbytes.value > 0
    outs = (ctypes.c_void_p * 3)()
    rc = lib.df2_cuda_gdn_enqueue(c_attrs, *cl.c_descs(ins), cl.c_ptrs(ins), outs, None, ctypes.c_int64(0), msg, 512)
    assert rc != 0 and msg.value.decode() == "DFlash2GatedDeltaNet: rnn_state_ptr or conv_state_ptr is null"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the no-GPU launch path is not exercised")
def test_a_launch_without_a_gpu_is_cudas_error_in_one_line(built):
    lib = cl.CudaPluginLib(built[0]).lib
    msg = ctypes.create_string_buffer(512)
    ok = [torch.empty(8, 64), torch.empty(8, 2, 4), torch.empty(2, 64)]
    attrs = (ctypes.c_int32 * 4)(4, 2, 16, 0)
    rc = lib.df2_cuda_conv_enqueue(attrs, *cl.c_descs(ok), (ctypes.c_void_p * 3)(), None, ctypes.c_int64(0), msg, 512)
    text = msg.value.decode()
    assert rc != 0 and text.startswith("DFlash2DynamicConv") and "\n" not in text
    assert "cuda" in text.lower() or "driver" in text.lower() or "device" in text.lower()
