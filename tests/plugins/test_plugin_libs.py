"""dflash2_trt.trtllm.cpu.plugin_libs: building the plugins' CPU builds into the cache (hash hits,
source edits, failures), loading them once per process, and the package's wrappers against the
torch reference."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from dflash2_trt import plugins
from dflash2_trt.errors import ConfigError, DFlash2Error, MissingDependencyError
from dflash2_trt.reference.conv import dynamic_conv
from dflash2_trt.reference.selector import pairwise_lattice, walk_greedy, walk_sample, walk_viterbi
from dflash2_trt.trtllm.cpu import plugin_libs
from dflash2_trt.trtllm.cpu.plugin_libs import (ConvLib, PluginBuildError, PluginRunError, ScanLib,
                                                build_cpu_plugin)

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
CONV, SCAN = "DFlash2DynamicConv", "DFlash2PairwiseScan"

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh, empty cache for this test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("DFLASH2_TRT_CACHE", str(root))
    return root


@pytest.fixture
def plugin_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the repo's plugins/ that DFLASH2_PLUGIN_DIR points at (free to edit)."""
    root = tmp_path / "plugins"
    shutil.copytree(PLUGINS, root, ignore=shutil.ignore_patterns("build", "__pycache__"))
    monkeypatch.setenv("DFLASH2_PLUGIN_DIR", str(root))
    return root


class _CountRuns:
    def __init__(self, monkeypatch):
        self.calls: list[list[str]] = []
        real = subprocess.run

        def run(cmd, *a, **kw):
            self.calls.append(list(cmd))
            return real(cmd, *a, **kw)

        monkeypatch.setattr(subprocess, "run", run)


def _hash_dirs(cache: Path) -> list[str]:
    d = cache / "plugins-cpu"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def _no_temp_files(cache: Path) -> bool:
    return not [p for p in (cache / "plugins-cpu").rglob("*") if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------------------ building
@needs_gxx
def test_build_then_cache_hit_does_not_recompile(cache, monkeypatch):
    runs = _CountRuns(monkeypatch)
    conv = build_cpu_plugin(CONV)
    assert len(runs.calls) == 1
    cmd = runs.calls[0]
    assert cmd[0].endswith("g++") and list(plugin_libs.CXXFLAGS) == cmd[1:1 + len(plugin_libs.CXXFLAGS)]
    assert "-ffp-contract=off" in cmd
    digest = plugin_libs.cpu_plugin_sources(CONV).digest()
    assert conv == cache / "plugins-cpu" / digest / "libdf2_conv_cpu.so" and conv.is_file()
    assert len(digest) == 64
    mtime = conv.stat().st_mtime_ns

    assert build_cpu_plugin(CONV) == conv
    assert len(runs.calls) == 1 and conv.stat().st_mtime_ns == mtime  # reused, not rebuilt
    scan = build_cpu_plugin(SCAN)
    assert len(runs.calls) == 2 and scan.name == "libdf2_scan_cpu.so" and scan.parent != conv.parent
    assert _no_temp_files(cache)
    assert ConvLib(conv).validate([torch.zeros(8, 64)], block_size=4, kernel_size=2, group_size=8)[0] == 1


@needs_gxx
def test_edited_source_or_header_gets_a_new_hash_dir(cache, plugin_copy, monkeypatch):
    monkeypatch.delenv("DFLASH2_PLUGIN_DIR")
    original = build_cpu_plugin(CONV)
    monkeypatch.setenv("DFLASH2_PLUGIN_DIR", str(plugin_copy))
    # An identical copy elsewhere hashes the same (names are relative to the plugin dir).
    assert build_cpu_plugin(CONV) == original

    cpu = plugin_copy / "dynamicConvPlugin" / "dynamicConvCpu.cpp"
    cpu.write_text(cpu.read_text() + "\n// an edited comment\n")
    edited = build_cpu_plugin(CONV)
    assert edited.parent != original.parent and edited.is_file() and original.is_file()

    # A header reached only through #include (common/df2Common.h) is part of the hash too.
    common = plugin_copy / "common" / "df2Common.h"
    common.write_text(common.read_text() + "\n// another edited comment\n")
    edited2 = build_cpu_plugin(CONV)
    assert len({original.parent, edited.parent, edited2.parent}) == 3
    assert len(_hash_dirs(cache)) == 3
    # the edited build works like the original
    x, delta, base = torch.randn(8, 16), torch.randn(8, 2, 2), torch.randn(2, 16)
    a = ConvLib(original).run(x, delta, base, block_size=4, group_size=8)
    b = ConvLib(edited2).run(x, delta, base, block_size=4, group_size=8)
    assert torch.equal(a, b)


@needs_gxx
def test_compile_error_names_command_and_stderr(cache, plugin_copy):
    cpu = plugin_copy / "pairwiseScanPlugin" / "pairwiseScanCpu.cpp"
    cpu.write_text(cpu.read_text() + '\n#error "deliberately broken for the test"\n')
    with pytest.raises(PluginBuildError) as e:
        build_cpu_plugin(SCAN)
    msg = str(e.value)
    assert isinstance(e.value, DFlash2Error)
    assert "g++ failed (exit 1) building libdf2_scan_cpu.so" in msg
    assert "-ffp-contract=off" in msg and str(cpu) in msg  # the command
    assert "deliberately broken for the test" in msg      # g++'s stderr
    # nothing half-written is left behind, and nothing counts as a cached build
    assert _no_temp_files(cache)
    assert not list((cache / "plugins-cpu").rglob("*.so"))


@needs_gxx
def test_warnings_are_errors(cache, plugin_copy):
    cpu = plugin_copy / "dynamicConvPlugin" / "dynamicConvCpu.cpp"
    cpu.write_text(cpu.read_text() + "\nstatic int df2UnusedForTheTest() { int unused = 0; return 1; }\n")
    with pytest.raises(PluginBuildError, match="unused"):
        build_cpu_plugin(CONV)


def test_missing_gxx(cache, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda *a, **kw: None)
    with pytest.raises(MissingDependencyError, match=r"g\+\+ not found on PATH.*CPU builds of the DFlash2 plugins"):
        build_cpu_plugin(CONV)
    assert not list(cache.rglob("*.so"))


@needs_gxx
def test_cached_build_needs_no_gxx(cache, monkeypatch):
    path = build_cpu_plugin(SCAN)
    monkeypatch.setattr(shutil, "which", lambda *a, **kw: None)
    assert build_cpu_plugin(SCAN) == path


def test_missing_sources_say_what_to_do(tmp_path, cache, monkeypatch):
    """A wheel has no plugins/ (a non-editable install): the error says where it looked and how to fix it."""
    monkeypatch.setenv("DFLASH2_PLUGIN_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(MissingDependencyError) as e:
        build_cpu_plugin(CONV)
    msg = str(e.value)
    assert str(tmp_path / "nowhere") in msg and "DFLASH2_PLUGIN_DIR" in msg
    assert "not shipped in the wheel" in msg and "pip install -e" in msg

    # the default location of an installed package (site-packages/plugins) does not exist
    monkeypatch.delenv("DFLASH2_PLUGIN_DIR")
    monkeypatch.setattr(plugins, "plugin_dir", lambda: tmp_path / "site-packages" / "plugins")
    with pytest.raises(MissingDependencyError, match="the default, <package>/../plugins"):
        build_cpu_plugin(SCAN)


def test_missing_cpu_source_is_named(cache, plugin_copy):
    (plugin_copy / "dynamicConvPlugin" / "dynamicConvCpu.cpp").unlink()
    with pytest.raises(MissingDependencyError, match=r"missing: .*dynamicConvCpu\.cpp"):
        build_cpu_plugin(CONV)


def test_unknown_plugin():
    with pytest.raises(ConfigError, match="unknown plugin 'Nope'"):
        build_cpu_plugin("Nope")



def test_parallel_compiles_stop_at_the_first_failure(tmp_path):
    """compile_parallel (the CUDA build's one-nvcc-per-source step): every command gets ``-o OBJECT``; the first one
    that fails is named with its stderr, and the compilers still running are stopped, not waited for."""
    import time

    ok = [(["sh", "-c", 'touch "$2"', "cc"], tmp_path / f"{i}.o") for i in range(3)]
    plugin_libs.compile_parallel(ok, "cc", "lib.so", jobs=2)
    assert all(obj.is_file() for _, obj in ok)
    marker = tmp_path / "slow-finished"
    slow = (["sh", "-c", f"sleep 23.25; touch {marker}", "cc"], tmp_path / "slow.o")
    bad = (["sh", "-c", "echo 'kernel.cu(3): error: no such thing' >&2; exit 2", "cc"], tmp_path / "bad.o")
    t0 = time.monotonic()
    with pytest.raises(PluginBuildError) as e:
        plugin_libs.compile_parallel([slow, bad], "cc", "lib.so", jobs=2)
    assert time.monotonic() - t0 < 10 and not marker.exists()
    # the compiler's own children (nvcc's cicc, ptxas; here the shell's sleep) are stopped with it
    from dflash2_trt.children import proc_cmdline, proc_pids

    def sleeping():
        return [p for p in proc_pids() if proc_cmdline(p) == ["sleep", "23.25"]]

    # SIGKILL is sent before compile_parallel returns; the process leaves /proc's command lines as it dies, which on a
    # loaded machine can take a moment (seen once): gone within seconds, not after its 23 s
    deadline = time.monotonic() + 5
    while sleeping() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sleeping()
    msg = str(e.value)
    assert msg.startswith("cc failed (exit 2) building lib.so") and "kernel.cu(3): error: no such thing" in msg
    assert f"-o {tmp_path / 'bad.o'}" in msg


@needs_gxx
def test_concurrent_processes_share_one_build(cache):
    code = ("from dflash2_trt.trtllm.cpu.plugin_libs import build_cpu_plugin, ConvLib; "
            "p = build_cpu_plugin('DFlash2DynamicConv'); ConvLib(p); print(p)")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    outs = [p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    paths = {o[0].strip() for o in outs}
    assert len(paths) == 1 and Path(paths.pop()).is_file()
    assert _no_temp_files(cache) and len(_hash_dirs(cache)) == 1


@needs_gxx
def test_accessors_build_and_load_once(cache, monkeypatch):
    monkeypatch.setattr(plugin_libs, "_LIBS", {})
    builds = []
    real = plugin_libs.build_cpu_plugin
    monkeypatch.setattr(plugin_libs, "build_cpu_plugin", lambda name: builds.append(name) or real(name))
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(plugin_libs.conv_lib())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(g is got[0] for g in got) and isinstance(got[0], ConvLib)
    assert plugin_libs.scan_lib() is plugin_libs.scan_lib() and isinstance(plugin_libs.scan_lib(), ScanLib)
    assert builds == [CONV, SCAN]


def test_not_a_library(tmp_path):
    bad = tmp_path / "libdf2_conv_cpu.so"
    bad.write_text("not an ELF")
    with pytest.raises(PluginBuildError, match="not a usable CPU plugin build"):
        ConvLib(bad)


# ----------------------------------------------------------------- the wrappers vs the reference
def test_conv_lib_matches_reference(conv_lib):
    gen = torch.Generator().manual_seed(21)
    bs, k, g, h, t = 4, 2, 8, 32, 12
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(t, h, generator=gen).to(dtype)
        delta = (0.3 * torch.randn(t, k, h // g, generator=gen)).to(dtype)
        base = torch.randn(k, h, generator=gen).to(dtype)
        residual = torch.randn(t, h, generator=gen)
        for res in (None, residual):
            got = conv_lib.run(x, delta, base, block_size=bs, group_size=g, residual=res)
            want = dynamic_conv(x, delta, base, block_size=bs, group_size=g, residual=res)
            assert got.dtype == want.dtype and torch.equal(got, want)


def test_scan_lib_matches_reference(scan_lib):
    gen = torch.Generator().manual_seed(22)
    b, l, k, r, v = 2, 5, 4, 16, 30
    unary = torch.randn(b, l, k, generator=gen) * 2
    cand = torch.randint(0, v, (b, l, k), generator=gen, dtype=torch.int32)
    hidden = torch.randn(b, l, r, generator=gen).half()
    anchor = torch.randint(0, v, (b,), generator=gen, dtype=torch.int32)
    a = (torch.randn(v, r, generator=gen) / r ** 0.5).half()
    bc = (torch.randn(v, r, generator=gen) / r ** 0.5).half() * 4
    temp = torch.rand(b, generator=gen) + 0.25
    u = torch.rand(b, l, generator=gen)
    ref_lat = pairwise_lattice(cand.long(), unary, hidden, anchor.long(), a, bc)
    for mode, walk in (("greedy", walk_greedy), ("viterbi", walk_viterbi), ("sample", walk_sample)):
        lat, idx, ids, q = scan_lib.run(mode, unary, cand, hidden, anchor, a, bc, temp, u)
        torch.testing.assert_close(lat, ref_lat, rtol=2e-6, atol=2e-5)
        r_idx, r_ids, r_q = walk(lat, cand.long(), temp, u) if mode == "sample" else walk(lat, cand.long())
        assert torch.equal(idx, r_idx) and torch.equal(ids, r_ids), mode
        torch.testing.assert_close(q, r_q, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------ rejected calls
def test_conv_run_rejections_carry_the_plugins_message(conv_lib):
    x, delta, base = torch.zeros(6, 64), torch.zeros(6, 2, 8), torch.zeros(2, 64)
    with pytest.raises(PluginRunError, match="^DFlash2DynamicConv: .*not a multiple of block_size=4") as e:
        conv_lib.run(x, delta, base, block_size=4, group_size=8)
    assert isinstance(e.value, ValueError) and isinstance(e.value, DFlash2Error)
    with pytest.raises(PluginRunError, match="kernel_size=5 outside"):
        conv_lib.run(x, delta, base, block_size=6, group_size=8, kernel_size=5)
    with pytest.raises(PluginRunError, match="block_size=4294967296 is not an int32"):
        conv_lib.run(x, delta, base, block_size=2**32, group_size=8)
    with pytest.raises(PluginRunError, match="input 0 is on meta"):
        conv_lib.run(x.to("meta"), delta, base, block_size=6, group_size=8)


def test_scan_run_rejections_carry_the_plugins_message(scan_lib):
    f, i = torch.float32, torch.int32
    b, l, k, r, v = 2, 3, 17, 16, 10
    ins = [torch.zeros(b, l, k), torch.zeros(b, l, k, dtype=i), torch.zeros(b, l, r), torch.zeros(b, dtype=i),
           torch.zeros(v, r), torch.zeros(v, r), torch.zeros(b, dtype=f), torch.zeros(b, l, dtype=f)]
    with pytest.raises(PluginRunError, match=r"^DFlash2PairwiseScan: .*K=17 candidates per position outside"):
        scan_lib.run("greedy", *ins)
    ins[0] = torch.zeros(b, l)  # not 3-D: the plugin's message, not a Python unpacking error
    with pytest.raises(PluginRunError, match="^DFlash2PairwiseScan: "):
        scan_lib.run("greedy", *ins)
    with pytest.raises(PluginRunError, match="mode 'best' is not one of"):
        scan_lib.run("best", *ins)
    with pytest.raises(PluginRunError, match="walk: mode=0, L=3, K=17"):
        scan_lib.walk("greedy", torch.zeros(1, 3, 17, 17))
    with pytest.raises(PluginRunError, match=r"walk: lattice must be \[B, L, K, K\]"):
        scan_lib.walk("greedy", torch.zeros(1, 3, 4, 5))
    with pytest.raises(PluginRunError, match="temperature must be"):
        scan_lib.walk("sample", torch.zeros(2, 3, 4, 4), torch.ones(3))
