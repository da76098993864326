"""DFlash2GatedDeltaNet's CUDA kernels executed on the CPU, bit for bit against the CPU build.

CI has no GPU, and the kernels (plugins/gatedDeltaNetPlugin/gatedDeltaNetKernel.cu) index, stage and
synchronise differently from the CPU build's loops while calling the same gatedDeltaNetMath.h
functions. Here the kernel source itself is compiled by g++ over a CUDA emulation
(tests/plugins/cuda_emu/cuda_emu.h: a block's threads are fibers, __syncthreads / warp shuffles are
barriers over them, __shared__ arrays per block, vector accesses alignment-checked) and run through
the plugin's launch sequences, behind the CPU build's C ABI (cuda_emu/gdn_emu.cpp), so that
scripts/gpu_check's own comparison (gdn_compare: forward, verify and commit, every output and both
pools, bit for bit) drives it exactly as it drives the GPU extension on an H200.

What this does not check: timing, the GPU's memory model beyond barrier order, register spills
(test_plugin_kernels_nvcc.py), bank conflicts, out-of-range reads that land in allocated memory.
The full set of gpu_check's 30 batches passes too (about 8 minutes here: too slow for every run).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from dflash2_trt.trtllm.cpu.plugin_libs import GdnLib

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "gatedDeltaNetPlugin"
EMU = Path(__file__).resolve().parent / "cuda_emu"


def _gpu_check():
    spec = importlib.util.spec_from_file_location("dflash2_gpu_check", ROOT / "scripts" / "gpu_check" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


G = _gpu_check()


def emulation_source(cu: str) -> str:
    """The kernel source for cuda_emu.h: launches `K<<<grid, block, smem, stream>>>(args)` become
    `emu::launch(grid, block, smem, stream)(K, args)`, `__shared__ T name[..];` a per-block arena, the dynamic
    `extern __shared__` array the launch's bytes per block, reinterpret_cast an alignment-checked cast, inline PTX is
    dropped (compiler hints, and the cp.async helpers' device branches: their host branches copy at once)."""
    src, launches = re.subn(r"(\b[A-Za-z_]\w*(?:<[^<>;()]*>)?)<<<([^>]*)>>>\(", r"emu::launch(\2)(\1, ", cu)
    src, asm = re.subn(r'asm volatile\("[^"]*"\s*:[^;]*\);', "", src)
    src, dyn = re.subn(r"extern __shared__ __align__\(16\) unsigned char (\w+)\[\];",
                       r"unsigned char* \1 = emu::dynamicShared();", src)
    src = src.replace("reinterpret_cast<", "emu::checkedCast<")
    ids = iter(range(1, 10_000))
    src, shared = re.subn(r"__shared__\s+([\w:<>]+)\s+(\w+)((?:\[[^\]]+\])+);",
                          lambda m: f"auto& {m.group(2)} = emu::shared<{m.group(1)}{m.group(3)}>({next(ids)});", src)
    assert launches >= 9 and shared >= 6 and asm <= 8 and dyn <= 2, (launches, shared, asm, dyn)
    assert "__shared__" not in src and "<<<" not in src, "a construct the transform does not know"
    return '#include "cuda_emu.h"\n' + src


def emulation_command(cu: str, out_dir: Path, reverse: bool = False, ws_shift: int = 0) -> tuple[list[str], Path]:
    """(g++ argv without ``-o``, the library it makes): the transformed kernel source + the C ABI glue + the params
    into a library GdnLib loads (reverse: a block's threads run last to first, cuda_emu.h's EMU_REVERSE; ws_shift: the
    workspace starts that many bytes past a 256-byte boundary)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the emulated kernels are compiled with g++")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "kernel_emu.cu").write_text(emulation_source(cu))
    # -O0: a build takes 3 s instead of 9 at -O2 and a batch runs about as fast (the fibers' switching dominates);
    # the arithmetic is IEEE either way (SSE, -ffp-contract=off), so the bits compared are the same
    cmd = [gxx, "-std=c++17", "-O0", "-fPIC", "-shared", "-ffp-contract=off", "-Wall", "-Wno-unknown-pragmas",
           "-Wno-maybe-uninitialized", f"-DEMU_REVERSE={int(reverse)}", f"-DGDN_EMU_WS_SHIFT={ws_shift}",
           # cuda_emu.h's inline variables (the thread order among them) stay this library's own: GCC would
           # otherwise make them STB_GNU_UNIQUE, one object for every emulation library the process loads
           "-fno-gnu-unique", f"-I{out_dir}", f"-I{EMU}", f"-I{PLUGIN}", str(EMU / "gdn_emu.cpp"),
           str(PLUGIN / "gatedDeltaNetParams.cpp"), "-pthread"]
    return cmd, out_dir / "libdf2_gdn_emu.so"


class StaleEdit(Exception):
    """A control's edit that no longer applies to the kernel source."""


def _edit(cu: str, old: str, new: str) -> str:
    if cu.count(old) != 1:
        raise StaleEdit(f"the kernel source no longer has exactly one {old!r}: update the control")
    return cu.replace(old, new)


# the controls' edits of the kernel source (each test below says what its edit takes out and what must then fail)
PREFETCH_BARRIER = "__syncthreads(); // every thread has read the tile"
ONE_COLUMN_LAUNCH = "recurrentTiled<kDk, 1>(p, g, wk, d, s);"
NORM_BARRIER = "__syncthreads();\n                if (mine)\n                    *o = gdnL2NormApply("
SECOND_COLUMN_V = "gdnDelta(sV[t][jl[q]],"
QK_BARRIER = "__syncthreads(); // QK read by every lane before the k rows take its place"


VARIANTS = {   # every library this module loads: name -> (the edit of the kernel source or None, emulation options)
    "plain": (None, {}),
    "reverse": (None, {"reverse": True}),
    "no_prefetch_barrier": ((PREFETCH_BARRIER, "// (barrier taken out) every thread has read the tile"),
                            {"reverse": True}),
    "no_one_column_launch": ((ONE_COLUMN_LAUNCH, ""), {}),
    "no_norm_barrier": ((NORM_BARRIER, NORM_BARRIER.replace("__syncthreads();", "")), {"reverse": True}),
    "first_column_v": ((SECOND_COLUMN_V, "gdnDelta(sV[t][jl[0]],"), {}),
    "no_qk_barrier": ((QK_BARRIER, "// (barrier taken out) QK read by every lane"), {"reverse": True}),
    "workspace_off_8": (None, {"ws_shift": 8}),
}


@pytest.fixture(scope="module")
def emulation_libs(tmp_path_factory) -> dict[str, Path | str]:
    """The module's emulation libraries, compiled once and all at once (one g++ per CPU: each takes ~3 s); a control
    whose edit no longer applies gets its reason instead of a library, so only that control fails (:func:`_lib`)."""
    from dflash2_trt.trtllm.cpu.plugin_libs import compile_parallel

    root = tmp_path_factory.mktemp("gdn-emu")
    cu = (PLUGIN / "gatedDeltaNetKernel.cu").read_text()
    libs: dict[str, Path | str] = {}
    cmds = []
    for name, (edit, kw) in VARIANTS.items():
        try:
            src = cu if edit is None else _edit(cu, *edit)
        except StaleEdit as e:
            libs[name] = str(e)
            continue
        cmd, libs[name] = emulation_command(src, root / name, **kw)
        cmds.append((cmd, libs[name]))
    compile_parallel(cmds, "g++", "the Gated DeltaNet's emulation libraries")
    return libs


def _lib(libs: dict[str, Path | str], name: str) -> GdnLib:
    if isinstance(libs[name], str):
        pytest.fail(libs[name])
    return GdnLib(libs[name])


@pytest.fixture(scope="module")
def emulated(emulation_libs) -> GdnLib:
    return _lib(emulation_libs, "plain")


@pytest.fixture(scope="module")
def emulated_reverse(emulation_libs) -> GdnLib:
    return _lib(emulation_libs, "reverse")


# (Hk, Hv, Dk, Dv, conv taps, Kv, chunk, context lengths, generation lengths), as gpu_check's GDN_CASES
CASES = {
    "gpu_check_0": G.GDN_CASES[0],                                  # grouped heads, chunked context
    "gpu_check_3": G.GDN_CASES[3],                                  # Dk 64 / Dv 32, K 3, chunk 7
    "dk128_two_columns": (1, 2, 128, 128, 4, 8, 0, (20,), (8, 3)),  # the Qwen head: 2 columns per lane
    "kv32_staged_twice": (1, 2, 128, 128, 4, 32, 0, (40,), (32, 17)),  # > 16 tokens: two staged chunks
    "per_token_context": (2, 4, 16, 16, 4, 4, 0, (37, 5, 1), (4, 2)),  # a context over three staged chunks
    "group3_k2": (2, 6, 32, 16, 2, 5, 0, (7, 30), (5, 2)),          # Hv/Hk 3, K 2, Dv below a block's columns
    "scalar_path": (1, 3, 16, 17, 3, 3, 0, (20,), (3, 1)),          # C = 83: one channel per thread, Dv 17
    "partial_tile": (2, 4, 64, 100, 4, 6, 0, (33,), (6, 3)),        # Dk 64, Dv 100: a part-filled column tile
    "no_conv_state": (2, 2, 16, 16, 1, 4, 64, (5,), (4,)),          # K = 1
    "dk128_full_chunks": (1, 2, 128, 128, 4, 8, 64, (130,), (8,)),  # chunk matrices: two full 64-token chunks + 2
    "dk32_chunk16_idle_columns": (2, 4, 32, 48, 4, 4, 16, (40, 9), (4, 3)),  # chunk scan: 80 of 128 columns idle
    "dk128_dv100_chunked": (1, 2, 128, 100, 4, 8, 64, (70,), (8,)),  # chunk scan: a part-filled column tile
    "many_and_empty": (2, 4, 16, 16, 4, 4, 64, (3, 0, 5), (4,) * 20 + (0, 2) * 10),  # 43 requests, empty ones
}


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_kernels_equal_cpu_build(emulated, gdn_lib, name):
    """Forward (context y and slots), verify (y, verify_qkv, verify_gates, slots untouched) and commit
    (counts, both pools), every dtype, with and without zero_state: identical bits."""
    case = CASES[name]
    bad = {}
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for zs in (False, True):
            diff = G.gdn_compare(emulated, gdn_lib, case, dt, zs, seed=7 + zs, device="cpu")
            if diff:
                bad[(str(dt), zs)] = diff
    assert not bad, bad


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_kernels_equal_cpu_build_last_thread_first(emulated_reverse, gdn_lib, name):
    """The same comparison with every block's threads run last to first: a shared-memory read that
    lacks its barrier shows in one of the two orders only (the reader must run before its writer);
    fp32 and bf16 (four channels per 16- and 8-byte access), with and without zero_state."""
    case = CASES[name]
    bad = {}
    for dt in (torch.float32, torch.bfloat16):
        for zs in (False, True):
            diff = G.gdn_compare(emulated_reverse, gdn_lib, case, dt, zs, seed=11 + zs, device="cpu")
            if diff:
                bad[(str(dt), zs)] = diff
    assert not bad, bad


@pytest.mark.parametrize("name", ["dk128_two_columns", "kv32_staged_twice"])
def test_one_column_per_lane_at_dk128_same_bits(emulated, emulated_reverse, gdn_lib, monkeypatch, name):
    """DFLASH2_GDN_RECURRENT_COLS=1, the recurrence's other tiling at Dk = 128 (one state column per lane, 4 blocks
    per SM instead of 3; the GPU checks time both): the same bits as the CPU build, in both thread orders, from pools
    with records to fold (the per-token context path, staged verify chunks, a part-filled tile)."""
    monkeypatch.setenv("DFLASH2_GDN_RECURRENT_COLS", "1")
    case = CASES[name]
    bad = {}
    for lib, order in ((emulated, "first"), (emulated_reverse, "last")):
        for dt in (torch.float32, torch.bfloat16):
            diff = G.gdn_compare(lib, gdn_lib, case, dt, False, seed=13, device="cpu")
            if diff:
                bad[(order, str(dt))] = diff
    assert not bad, bad


PREFETCH_CASES = {   # Dk 128: the prefetching kernel's only head size
    "dk128_two_columns": CASES["dk128_two_columns"],
    "kv32_staged_twice": CASES["kv32_staged_twice"],
    "dk128_dv100_chunked": CASES["dk128_dv100_chunked"],                     # chunked context items skipped
    "dk128_many_and_empty": (2, 4, 128, 64, 4, 4, 0, (9, 0), (4,) * 5 + (2, 0)),  # 36 items, per-token context
    "dk128_dv30_falls_back": (1, 2, 128, 30, 4, 4, 0, (5,), (4, 2)),         # Dv % 4 != 0: the plain kernel
}


@pytest.mark.parametrize("cols", ["1", "2"])
@pytest.mark.parametrize("name", list(PREFETCH_CASES))
def test_prefetching_recurrence_same_bits(emulated, emulated_reverse, gdn_lib, monkeypatch, name, cols):
    """DFLASH2_GDN_RECURRENT_PREFETCH=1, the persistent recurrence that copies the next item's state tile into shared
    memory while it computes the current one: on the emulation's small device (3 SMs x 2 blocks, cuda_emu.h) every
    block loops over several items (requests, heads, tiles), so a buffer reused before every thread read it shows
    (the control below); the same bits as the CPU build in both thread orders, fp32 and bf16, with zero_state (items
    that copy nothing) and chunked context requests (items the kernel skips) among them, both tilings at Dk 128. (A
    read before the copy landed cannot show here: the emulation copies at once; on the GPU, racecheck runs gpu_check's
    variants.)"""
    monkeypatch.setenv("DFLASH2_GDN_RECURRENT_PREFETCH", "1")
    monkeypatch.setenv("DFLASH2_GDN_RECURRENT_COLS", cols)
    case = PREFETCH_CASES[name]
    bad = {}
    for lib, order, dt, zs in ((emulated, "first", torch.float32, False), (emulated, "first", torch.bfloat16, True),
                               (emulated_reverse, "last", torch.float32, True),
                               (emulated_reverse, "last", torch.bfloat16, False)):
        diff = G.gdn_compare(lib, gdn_lib, case, dt, zs, seed=17 + zs, device="cpu")
        if diff:
            bad[(order, str(dt), zs)] = diff
    assert not bad, bad


def test_the_prefetch_variable_reaches_the_launcher_and_a_reused_buffer_shows(gdn_lib, emulation_libs, monkeypatch):
    """Control for the test above: without the barrier between the state's reads and the next item's copy into the
    same buffer, the last-to-first order fails under DFLASH2_GDN_RECURRENT_PREFETCH=1 (the emulation copies at once,
    so the next tile overwrites the one a lagging thread has yet to read) and passes without it: the variable reaches
    the launcher, and the emulation sees a buffer reused too early."""
    case = CASES["dk128_two_columns"]
    racy = _lib(emulation_libs, "no_prefetch_barrier")      # last to first
    assert G.gdn_compare(racy, gdn_lib, case, torch.float32, False, seed=17, device="cpu") == []
    monkeypatch.setenv("DFLASH2_GDN_RECURRENT_PREFETCH", "1")
    diff = G.gdn_compare(racy, gdn_lib, case, torch.float32, False, seed=17, device="cpu")
    assert "verify:y" in diff, diff


def test_the_variable_picks_the_one_column_tiling(gdn_lib, emulation_libs, monkeypatch):
    """Control for the test above: with the one-column launch taken out (that branch launches nothing), the
    comparison fails under DFLASH2_GDN_RECURRENT_COLS=1 and passes without it, so the variable does reach the
    launcher and the test above ran the one-column kernel."""
    broken = _lib(emulation_libs, "no_one_column_launch")
    case = CASES["dk128_two_columns"]
    assert G.gdn_compare(broken, gdn_lib, case, torch.float32, False, seed=13, device="cpu") == []
    monkeypatch.setenv("DFLASH2_GDN_RECURRENT_COLS", "1")
    diff = G.gdn_compare(broken, gdn_lib, case, torch.float32, False, seed=13, device="cpu")
    # no recurrence ran: the slots' states are not advanced (y may even match: its buffer can be the previous call's)
    assert "forward:rnn_state" in diff and "commit:rnn_state" in diff, diff


def test_last_thread_first_sees_a_missing_barrier(gdn_lib, emulation_libs):
    """Control: without the prologue's barrier between the per-head inverse norms (written by the
    first threads of the block) and their use by every thread, the last-to-first order fails. (The
    first-to-last order cannot see this one: each reader runs after thread 0 wrote its head's norm,
    as seen when the reverse order was added; that is why both orders run.)"""
    broken = _lib(emulation_libs, "no_norm_barrier")       # last to first
    diff = G.gdn_compare(broken, gdn_lib, CASES["scalar_path"], torch.float32, False, seed=7, device="cpu")
    assert "forward:y" in diff and "verify:y" in diff, diff


def test_last_thread_first_sees_the_chunk_scans_qk_barrier_missing(gdn_lib, emulation_libs):
    """Control: the chunk scan stages the chunk's QK rows where the k rows are staged next; without the barrier
    between the lanes' intra sums (reading QK) and that restaging, the last-to-first order fails at Dk 128 and 64
    (where a column's lanes share the intra sums)."""
    broken = _lib(emulation_libs, "no_qk_barrier")         # last to first
    for case in ("dk128_full_chunks", "gpu_check_3"):
        diff = G.gdn_compare(broken, gdn_lib, CASES[case], torch.float32, False, seed=7, device="cpu")
        assert "forward:y" in diff, (case, diff)


def test_emulation_sees_a_wrong_column(gdn_lib, emulation_libs):
    """Control: the same comparison fails when the kernel reads the wrong column's v for a lane's
    second state column (only the Dk = 128 tiling has two), so a pass above is not the emulation
    hiding the kernel."""
    broken = _lib(emulation_libs, "first_column_v")
    diff = G.gdn_compare(broken, gdn_lib, CASES["dk128_two_columns"], torch.float32, False, seed=7, device="cpu")
    assert "verify:y" in diff and "commit:rnn_state" in diff, diff


def test_a_workspace_off_16_bytes_is_refused_not_read(emulation_libs):
    """The prologue stores and the recurrence loads the workspace's qh / kh rows as float4: the forward refuses a
    workspace whose base is off 16 bytes in one message (on a GPU the access would fault; without the check the
    emulation's checked casts abort the process, seen)."""
    from dflash2_trt.trtllm.cpu.plugin_libs import PluginRunError

    case = CASES["gpu_check_0"]
    off = _lib(emulation_libs, "workspace_off_8")
    with pytest.raises(PluginRunError, match="workspace .* is not 16-byte aligned"):
        G.gdn_compare(off, off, case, torch.float32, False, seed=7, device="cpu")
