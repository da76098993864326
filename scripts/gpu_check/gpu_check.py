"""GPU check of the DFlash2 plugin kernels (run through scripts/gpu_check.sh).

Builds the plugins' CUDA library (dflash2_trt.trtllm.cuda.plugin_lib: the .cu/.cpp files that go into
libdflash2_plugins.so plus plugins/common/df2CudaEntry.cpp, a C ABI doing each plugin's enqueue; the same build
the cuda engine backend runs), then on the current CUDA GPU:

1. checks them against the torch reference (dflash2_trt.reference) on random inputs:
   conv bit-exact (same fp32 operations, one rounding), walks exact on the same lattice;
2. times them against torch eager (the reference on the GPU):
   - conv at 8192 tokens x H 5120 (bf16, K 2, G 16, block 16), unfused and fused residual,
     as a fraction of the GPU's nominal DRAM bandwidth (goal >= 85% on H200) and of a measured
     device-to-device copy;
   - the scan (lattice + walk) at B 64, L 7, K 16, R 256 per call, plain stream and CUDA graph
     (goal <= 5 us);
3. the Gated DeltaNet plugin (DFlash2GatedDeltaNet): forward (context requests: y and their slots),
   verify (generation requests: y, verify_qkv, verify_gates, slots left alone) and commit (committed
   counts and both pools) against the CPU build (gatedDeltaNetCpu.cpp), bit for bit, on mixed batches
   (chunked and per-token context paths, zero_state, fp32/fp16/bf16, up to Qwen3.8-27B's per-rank
   heads); timed at a Qwen3.8-27B decode step (tp 1: 48 value x 16 key heads of 128, B 64 x Kv 8,
   bf16) against the DRAM bound of the bytes it must move (the fp32 state dominates), and the forward of one
   8192-token prompt on the chunked path (the prefill cost; no goal).
Exit codes: 0 all checks passed, 1 a correctness check failed, 2 no CUDA GPU / build failure.
Goals that are missed are reported (MISSED), not failures: they are measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"

# Nominal DRAM bandwidth (bytes/s) by device-name substring, the first that matches (so a longer name before the one
# it contains: "GH200" holds "H200"); the measured copy is reported too.
NOMINAL_BW = [("GH200", 4.0e12), ("GB200", 8.0e12), ("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12),
              ("B200", 8.0e12), ("B100", 8.0e12), ("A100", 2.0e12)]


def nominal_bw(name: str) -> float | None:
    return next((bw for key, bw in NOMINAL_BW if key in name), None)


def log(msg: str) -> None:
    print(msg, flush=True)


class LibExt:
    """The plugins' CUDA build (dflash2_trt.trtllm.cuda.plugin_lib: the kernels and validation of
    libdflash2_plugins.so behind a C ABI that does each plugin's enqueue) with the call signatures the checks
    below use: conv, scan (ids, q and the lattice the plugin leaves in its workspace) and walk; the Gated DeltaNet
    goes through :class:`ExtGdn`."""

    def __init__(self, lib):
        self.lib = lib

    def conv(self, x, delta, base, residual, block_size, group_size, stream=None):
        return self.lib.conv(x, delta, base, residual, block_size=block_size, group_size=group_size)

    def scan(self, mode, unary, cand, hidden, anchor, pred, succ, temp, uniforms, stream=None, ranks=0):
        import torch
        ids, q, ws = self.lib.scan(mode, unary, cand, hidden, anchor, pred, succ, temp, uniforms, with_workspace=True,
                                   ranks=ranks)
        b, length, k = unary.shape
        lat = ws[: b * length * k * k * 4].view(torch.float32).view(b, length, k, k)
        return ids, q, lat

    def walk(self, mode, lattice, cand, temp, uniforms, stream=None):
        return self.lib.walk(mode, lattice, cand, temp, uniforms)


def build_extension(verbose: bool, lib_path: str | None = None):
    """The CUDA build of the plugins for this GPU (nvcc on first use, cached by source hash; DFLASH2_PLUGIN_DIR
    picks another plugins/ tree), or the library at ``lib_path``."""
    from dflash2_trt.trtllm.cuda import plugin_lib

    t0 = time.monotonic()
    path = Path(lib_path) if lib_path else plugin_lib.build_cuda_plugins(progress=log if verbose else None)
    lib = plugin_lib.CudaPluginLib(path)
    log(f"plugins' CUDA build {path} ready in {time.monotonic() - t0:.1f} s (sources: {plugin_lib.plugins.plugin_dir()})")
    return LibExt(lib)


def cuda_time_us(fn, iters: int, warmup: int = 10) -> float:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def cold_l2_us(fn, iters: int) -> float:
    """Mean time of fn between CUDA events with the L2 flushed before each call (a 256 MiB write: the H200's L2 is
    60 MB), so its inputs come from DRAM: what a call sees in an engine step, where other layers run between."""
    import torch
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    fn()
    total = 0.0
    for _ in range(iters):
        flush.fill_(1)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        total += a.elapsed_time(b) * 1000.0
    return total / iters


def graph_time_us(fn, iters: int) -> float:
    """Per-call time of fn captured `per_graph` times in one CUDA graph (launch overhead amortised
    the way TensorRT/TRT-LLM replays do)."""
    import torch
    per_graph = 20
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per_graph):
            fn()
    return cuda_time_us(g.replay, max(1, iters // per_graph)) / per_graph


def load_cpu_build(tmpdir: Path):
    """The tests' g++ build of the shared math (tests/plugins/conftest.py), to check that the GPU
    computes bit for bit what the CPU build computes. None (with a note) if it cannot be built."""
    import importlib.util
    try:
        spec = importlib.util.spec_from_file_location("df2_plugin_cpu", REPO / "tests" / "plugins" / "conftest.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        conv = mod.ConvLib(mod.build_shared([PLUGINS / "dynamicConvPlugin" / "dynamicConvCpu.cpp",
                                             PLUGINS / "dynamicConvPlugin" / "dynamicConvParams.cpp"],
                                            tmpdir / "libconv.so"))
        scan = mod.ScanLib(mod.build_shared([PLUGINS / "pairwiseScanPlugin" / "pairwiseScanCpu.cpp",
                                             PLUGINS / "pairwiseScanPlugin" / "pairwiseScanParams.cpp"],
                                            tmpdir / "libscan.so"))
        return conv, scan
    except BaseException as e:  # noqa: BLE001 - pytest.skip raises BaseException subclasses
        log(f"note: CPU build of the shared math unavailable ({type(e).__name__}: {e}); GPU-vs-CPU bit identity not checked")
        return None


def load_gdn_cpu():
    """The Gated DeltaNet CPU build (the package's own g++ build, dflash2_trt.trtllm.cpu.plugin_libs); None with a
    note if it cannot be built."""
    try:
        from dflash2_trt.trtllm.cpu.plugin_libs import gdn_lib
        return gdn_lib()
    except Exception as e:  # noqa: BLE001
        log(f"note: Gated DeltaNet CPU build unavailable ({type(e).__name__}: {e})")
        return None


def check_conv(ext, results: dict, cpu=None, small: bool = False) -> bool:
    import torch
    from dflash2_trt.reference.conv import dynamic_conv

    ok = True
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = [(dt, bs, k, g, h) for dt in (torch.float32, torch.float16, torch.bfloat16)
             for bs, k, g, h in ((2, 2, 16, 512), (16, 2, 16, 5120), (7, 3, 1, 64), (16, 4, 8, 1024))
             if not (small and h > 1024)]
    for dt, bs, k, g, h in cases:
        t = bs * 5
        x = torch.randn(t, h, device="cuda", generator=gen).to(dt)
        delta = (0.3 * torch.randn(t, k, h // g, device="cuda", generator=gen)).to(dt)
        base = torch.randn(k, h, device="cuda", generator=gen).to(dt)
        res = torch.randn(t, h, device="cuda", generator=gen)
        for r in (None, res):
            got = ext.conv(x, delta, base, r, bs, g, stream())
            want = dynamic_conv(x, delta, base, block_size=bs, group_size=g, residual=r)
            same = torch.equal(got, want)
            if cpu is not None:
                c_out = cpu[0].run(x.cpu(), delta.cpu(), base.cpu(), block_size=bs, group_size=g,
                                   residual=None if r is None else r.cpu())
                if not torch.equal(got.cpu().view(torch.int32 if got.dtype == torch.float32 else torch.int16),
                                   c_out.view(torch.int32 if c_out.dtype == torch.float32 else torch.int16)):
                    same = False
                    log(f"  conv GPU != CPU build bits: dtype={dt} block={bs} K={k} G={g} fused={r is not None}")
            if not same:
                ok = False
                diff = (got.float() - want.float()).abs().max().item()
                log(f"  conv MISMATCH dtype={dt} block={bs} K={k} G={g} H={h} fused={r is not None}: max|diff|={diff}")
    log(f"conv correctness vs reference (bit-exact, {len(cases) * 2} cases): {'ok' if ok else 'FAILED'}")
    results["conv_exact"] = ok
    return ok


def bench_conv(ext, results: dict) -> None:
    import torch
    from dflash2_trt.reference.conv import dynamic_conv

    name = torch.cuda.get_device_name()
    nominal = nominal_bw(name)
    t, h, k, g, bs = 8192, 5120, 2, 16, 16
    dt = torch.bfloat16
    x = torch.randn(t, h, device="cuda").to(dt)
    delta = (0.3 * torch.randn(t, k, h // g, device="cuda")).to(dt)
    base = torch.randn(k, h, device="cuda").to(dt)
    res = torch.randn(t, h, device="cuda")
    s = torch.cuda.current_stream().cuda_stream

    big = torch.empty(512 * 1024 * 1024 // 4, device="cuda")
    big2 = torch.empty_like(big)
    copy_us = cuda_time_us(lambda: big2.copy_(big), 20)
    copy_bw = 2 * big.numel() * 4 / (copy_us * 1e-6)
    del big, big2
    log(f"device: {name}; nominal DRAM {nominal / 1e12 if nominal else float('nan'):.2f} TB/s; "
        f"measured D2D copy {copy_bw / 1e12:.2f} TB/s")
    results.update(device=name, nominal_bw=nominal, copy_bw=copy_bw)

    el = 2  # bf16
    for fused in (False, True):
        r = res if fused else None
        bytes_moved = t * h * el + t * k * (h // g) * el + k * h * el + (t * h * 4 * 2 if fused else t * h * el)
        us = cuda_time_us(lambda: ext.conv(x, delta, base, r, bs, g, s), 200)
        eager_us = cuda_time_us(lambda: dynamic_conv(x, delta, base, block_size=bs, group_size=g, residual=r), 20)
        bw = bytes_moved / (us * 1e-6)
        frac = bw / nominal if nominal else float("nan")
        goal = "ok" if nominal and frac >= 0.85 else "MISSED"
        tag = "fused residual" if fused else "unfused"
        # the same-mix ceiling: a device copy moving the same bytes (half read, half written) in the same run
        half = torch.empty(int(bytes_moved // 2), dtype=torch.uint8, device="cuda")
        half2 = torch.empty_like(half)
        mix_us = cuda_time_us(lambda: half2.copy_(half), 200)
        del half, half2
        mix_bw = bytes_moved / (mix_us * 1e-6)
        if not (frac >= 0.85 or bw / mix_bw >= 0.95):
            goal = "MISSED"
        else:
            goal = "ok"
        log(f"conv {tag}: {us:.1f} us, {bw / 1e12:.2f} TB/s = {frac * 100:.1f}% of nominal peak "
            f"({bw / copy_bw * 100:.1f}% of a 512 MiB copy, {bw / mix_bw * 100:.1f}% of a same-size copy at "
            f"{mix_bw / 1e12:.2f} TB/s) [goal >= 85% nominal or >= 95% same-mix: {goal}]; torch eager "
            f"{eager_us:.1f} us ({eager_us / us:.1f}x slower)")
        results[f"conv_{'fused' if fused else 'unfused'}"] = dict(
            us=us, bytes=bytes_moved, tbps=bw / 1e12, frac_nominal=frac, frac_copy=bw / copy_bw,
            same_mix_copy_tbps=mix_bw / 1e12, frac_same_mix=bw / mix_bw, eager_us=eager_us)


def _scan_inputs(b, l, k, r, v, dt, gen):
    import torch
    unary = torch.randn(b, l, k, device="cuda", generator=gen) * 2
    cand = torch.randint(0, v, (b, l, k), device="cuda", generator=gen, dtype=torch.int32)
    hidden = torch.randn(b, l, r, device="cuda", generator=gen).to(dt)
    anchor = torch.randint(0, v, (b,), device="cuda", generator=gen, dtype=torch.int32)
    a = (torch.randn(v, r, device="cuda", generator=gen) / r ** 0.5).to(dt)
    bc = (torch.randn(v, r, device="cuda", generator=gen) / r ** 0.5 * 4).to(dt)
    temp = torch.rand(b, device="cuda", generator=gen) + 0.25
    u = torch.rand(b, l, device="cuda", generator=gen)
    return unary, cand, hidden, anchor, a, bc, temp, u


def check_scan(ext, results: dict, cpu=None) -> bool:
    import torch
    from dflash2_trt.reference import selector as ref

    ok = True
    s = torch.cuda.current_stream().cuda_stream
    gen = torch.Generator(device="cuda").manual_seed(1)
    modes = {"greedy": 0, "sample": 1, "viterbi": 2}
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for b, l, k, r, v in ((64, 7, 16, 256, 248320), (3, 15, 5, 512, 100), (130, 1, 1, 8, 3)):
            ins = _scan_inputs(b, l, k, r, v, dt, gen)
            unary, cand, hidden, anchor, a, bc, temp, u = ins
            ref_lat = ref.pairwise_lattice(cand.long(), unary, hidden, anchor.long(), a, bc)
            for mode, m in modes.items():
                ids, q, lat = ext.scan(m, *ins, s)
                lat_ok = torch.allclose(lat, ref_lat, rtol=2e-6, atol=2e-5)
                if mode == "sample":
                    r_idx, r_ids, r_q = ref.walk_sample(lat, cand.long(), temp, u)
                else:
                    r_idx, r_ids, r_q = getattr(ref, f"walk_{mode}")(lat, cand.long())
                ids_ok = torch.equal(ids.long(), r_ids)
                q_ok = (q - r_q).abs().max().item() <= 1e-6
                # end to end against the reference's own lattice (can differ only at fp32 near-ties)
                if mode == "sample":
                    e_ids = ref.walk_sample(ref_lat, cand.long(), temp, u)[1]
                else:
                    e_ids = getattr(ref, f"walk_{mode}")(ref_lat, cand.long())[1]
                e2e = int((ids.long() != e_ids).sum())
                # the walk kernel alone on the reference lattice
                w_ids, w_q = ext.walk(m, ref_lat.contiguous(), cand, temp, u, s)
                r2 = (ref.walk_sample(ref_lat, cand.long(), temp, u) if mode == "sample"
                      else getattr(ref, f"walk_{mode}")(ref_lat, cand.long()))
                walk_ok = torch.equal(w_ids.long(), r2[1]) and (w_q - r2[2]).abs().max().item() <= 1e-6
                if cpu is not None and v <= 1000:  # CPU build: bit identity of lattice, ids and q
                    c_lat, _, c_ids, c_q = cpu[1].run(mode, *[t.cpu() for t in ins])
                    bits = (torch.equal(lat.cpu().view(torch.int32), c_lat.view(torch.int32))
                            and torch.equal(ids.cpu().long(), c_ids)
                            and torch.equal(q.cpu().view(torch.int32), c_q.view(torch.int32)))
                    if not bits:
                        ok = False
                        log(f"  scan GPU != CPU build bits: dtype={dt} B={b} L={l} K={k} R={r} mode={mode}")
                if not (lat_ok and ids_ok and q_ok and walk_ok):
                    ok = False
                    log(f"  scan MISMATCH dtype={dt} B={b} L={l} K={k} R={r} mode={mode}: lattice={lat_ok} "
                        f"ids={ids_ok} q={q_ok} walk-on-ref-lattice={walk_ok}")
                    try:   # one CTA per row: tells a cluster-path problem from a kernel one
                        ids1, q1, _ = ext.scan(m, *ins, s, ranks=1)
                        log(f"    with one CTA per row: ids {'==' if torch.equal(ids1, ids) else '!='} the default "
                            f"launch's; vs reference ids={torch.equal(ids1.long(), r_ids)}")
                    except Exception as e:  # noqa: BLE001
                        log(f"    one CTA per row failed too: {e}")
                if e2e:
                    log(f"  note: {mode} dtype={dt} B={b}: {e2e} ids differ from the reference pipeline "
                        f"(fp32 near-ties between einsum and sequential sums)")
    log(f"scan correctness vs reference (lattice allclose, walks exact, q within 1e-6): {'ok' if ok else 'FAILED'}")
    results["scan_exact"] = ok
    return ok


def bench_scan(ext, results: dict) -> None:
    import torch
    from dflash2_trt.reference import selector as ref

    b, l, k, r, v = 64, 7, 16, 256, 248320
    gen = torch.Generator(device="cuda").manual_seed(2)
    ins = _scan_inputs(b, l, k, r, v, torch.bfloat16, gen)
    unary, cand, hidden, anchor, a, bc, temp, u = ins
    s = torch.cuda.current_stream().cuda_stream
    for mode, m in (("greedy", 0), ("sample", 1), ("viterbi", 2)):
        stream_us = cuda_time_us(lambda: ext.scan(m, *ins, s), 500)
        try:
            graph_us = graph_time_us(lambda: ext.scan(m, *ins, torch.cuda.current_stream().cuda_stream), 2000)
        except Exception as e:  # noqa: BLE001 - report, do not die on a capture problem
            graph_us = float("nan")
            log(f"  (graph capture failed: {e})")

        def eager():
            lat = ref.pairwise_lattice(cand.long(), unary, hidden, anchor.long(), a, bc)
            return ref.walk_sample(lat, cand.long(), temp, u) if mode == "sample" else \
                getattr(ref, f"walk_{mode}")(lat, cand.long())

        eager_us = cuda_time_us(eager, 50)
        cold_us = cold_l2_us(lambda: ext.scan(m, *ins, s), 30)
        limit = 6.0 if mode == "sample" else 5.0
        goal = "ok" if graph_us <= limit else "MISSED"
        log(f"scan {mode} B{b} L{l} K{k} R{r}: {graph_us:.2f} us/call in a CUDA graph [goal <= {limit:g} us: {goal}], "
            f"{stream_us:.2f} us/call on a stream (incl. launch), {cold_us:.2f} us with a cold L2 (codebook rows from "
            f"DRAM); torch eager {eager_us:.0f} us")
        results[f"scan_{mode}"] = dict(graph_us=graph_us, stream_us=stream_us, cold_l2_us=cold_us, eager_us=eager_us)
    scan_variants(ext, ins, results)


def scan_variants(ext, ins, results: dict) -> None:
    """Where the scan's time goes, by variants timed the same way (CUDA graph, per call), without counters: the
    greedy scan with 1, 2 and 4 CTAs per row forced (the launcher picks 2 at B 64 on a 132-SM GPU), the walk-only
    kernel (one CTA per row: the lattice read from the workspace, the rows, the walk and the outputs, no gather and
    no sums) and an almost empty kernel (a one-element add), the floor of one launch in a graph."""
    import torch
    s = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    unary, cand, hidden, anchor, a, bc, temp, u = ins
    out: dict = {}
    for ranks in (1, 2, 4):
        try:
            out[f"greedy_ranks{ranks}_us"] = graph_time_us(lambda: ext.scan(0, *ins, s(), ranks=ranks), 1000)
        except Exception as e:  # noqa: BLE001 - a forced plan the device refuses is a result too
            out[f"greedy_ranks{ranks}_error"] = f"{type(e).__name__}: {e}"[:200]
    lat = ext.scan(0, *ins, s())[2].contiguous()
    for mode, m in (("greedy", 0), ("sample", 1)):
        out[f"walk_only_{mode}_us"] = graph_time_us(lambda: ext.walk(m, lat, cand, temp, u, s()), 1000)
    one = torch.zeros(1, device="cuda")
    out["empty_kernel_us"] = graph_time_us(lambda: one.add_(1.0), 1000)
    results["scan_variants"] = out
    log("scan variants (CUDA graph, us per call): " + ", ".join(
        f"{k[:-3] if k.endswith('_us') else k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in out.items()))


# ------------------------------------------------------------------------------- Gated DeltaNet
# (Hk, Hv, Dk, Dv, conv taps, Kv, chunk, context lengths, generation lengths): grouped heads, the per-token
# context path (chunk 0), one-token chunks, and Qwen3.8-27B's per-rank heads at tp 1.
GDN_CASES = [
    (2, 4, 16, 16, 4, 4, 64, (37, 5), (4, 2)),
    (4, 8, 128, 128, 4, 8, 64, (70, 1, 130), (8, 8, 3)),
    (4, 8, 128, 128, 4, 8, 0, (9,), (8, 1)),
    (2, 2, 64, 32, 3, 5, 7, (20,), (5, 5)),
    (16, 48, 128, 128, 4, 8, 64, (200,), (8,) * 6),
]
GDN_SMALL_CASES = 4      # --small: the cases before Qwen3.8-27B's heads


def gdn_attrs(case) -> dict:
    hk, hv, dk, dv, kc, kv, chunk = case[:7]
    return dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv, conv_kernel=kc, max_verify_tokens=kv,
                chunk_size=chunk)


def gdn_pool(hk, hv, dk, dv, kv, pools: int, g) -> "torch.Tensor":
    """A dirty rnn pool [pools, Hv, Dk + E, Dv] (gdn_slot layout): random states, random records of the deferred
    commit and random pending counts in [-2, Kv + 2] (the kernels clamp them to [0, Kv]), so that every forward
    folds records and the pools compare raw, records included."""
    import torch
    from dflash2_trt.trtllm.gdn_slot import gdn_slot_layout
    lay = gdn_slot_layout(hk, hv, dk, dv, kv)
    flat = torch.zeros(pools, lay.floats)
    flat[:, :hv * dk * dv] = 0.1 * torch.randn(pools, hv * dk * dv, generator=g)
    flat[:, lay.delta:lay.delta + hv * kv * dv] = 0.1 * torch.randn(pools, hv * kv * dv, generator=g)
    keys = torch.randn(pools, hk * kv, dk, generator=g)
    flat[:, lay.keys:lay.keys + hk * kv * dk] = (keys / keys.norm(dim=-1, keepdim=True)).reshape(pools, -1)
    flat[:, lay.decay:lay.decay + hv * kv] = 0.5 + 0.5 * torch.rand(pools, hv * kv, generator=g)
    pend = torch.randint(-2, kv + 3, (pools,), generator=g, dtype=torch.int32)
    flat[:, lay.pending] = pend.view(torch.float32)
    return flat.view(pools, *lay.row_shape)


def gdn_batch(case, dtype, seed: int, extra_slots: int = 2) -> dict:
    """Random packed inputs of a mixed batch (context requests first) and dirty state pools (records pending), on
    the CPU."""
    import torch
    hk, hv, dk, dv, kc, kv, chunk, ctx, gen = case
    c = 2 * hk * dk + hv * dv
    g = torch.Generator().manual_seed(seed)
    lens = list(ctx) + list(gen)
    t, b = sum(lens), len(lens)
    rn = lambda *sh: torch.randn(*sh, generator=g)  # noqa: E731
    pools = b + extra_slots
    return dict(
        qkv=rn(t, c).to(dtype), w=(0.5 * rn(c, kc)).to(dtype), a=rn(t, hv).to(dtype), b=rn(t, hv).to(dtype),
        dt_bias=rn(hv), A_log=torch.rand(hv, generator=g).clamp_min(0.01).log(),
        cu=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32),
        slots=torch.randperm(pools, generator=g)[:b].to(torch.int32),
        types=torch.tensor([0] * len(ctx) + [1] * len(gen), dtype=torch.int32),
        zero=torch.tensor([i % 2 for i in range(len(ctx))] + [1] * len(gen), dtype=torch.int32),
        accepted=torch.tensor([0] * len(ctx) + [int(torch.randint(0, n + 1, (1,), generator=g)) for n in gen],
                              dtype=torch.int32),
        rnn=gdn_pool(hk, hv, dk, dv, kv, pools, g), conv=rn(pools, kc - 1, c).to(dtype), lens=lens, n_ctx=len(ctx))


class ExtGdn:
    """The plugins' CUDA build of DFlash2GatedDeltaNet behind the CPU build's interface (GdnLib.forward / .commit), so
    one comparison serves both: host_request_types stays on the host and the pools are passed as their device
    addresses (host int64 inputs), as TensorRT-LLM passes them."""

    def __init__(self, ext):
        self.lib = ext.lib

    @staticmethod
    def _ptr(t):
        import torch
        return torch.tensor([t.data_ptr()], dtype=torch.int64)

    @staticmethod
    def _plain(attrs):
        return {k: v for k, v in attrs.items() if k not in ("mode", "zero_state_input")}   # the call decides both

    def forward(self, qkv, conv_weight, a, b, dt_bias, A_log, cu_seqlens, slot_mapping, request_types, rnn_state,
                conv_state, zero_state=None, **attrs):
        ins = [qkv, conv_weight, a, b, dt_bias, A_log, cu_seqlens, slot_mapping, request_types.cpu(),
               self._ptr(rnn_state), self._ptr(conv_state)] + ([] if zero_state is None else [zero_state])
        return self.lib.gdn("forward", ins, **self._plain(attrs))

    def commit(self, verify_qkv, verify_gates, conv_weight, num_accepted, cu_seqlens, slot_mapping, request_types,
               rnn_state, conv_state, **attrs):
        ins = [verify_qkv, verify_gates, conv_weight, num_accepted, cu_seqlens, slot_mapping, request_types.cpu(),
               self._ptr(rnn_state), self._ptr(conv_state)]
        return self.lib.gdn("commit", ins, **self._plain(attrs))[0]


def _bits(t):
    import torch
    t = t.detach().cpu().contiguous()
    return t.view(torch.int32) if t.dtype == torch.float32 else (t.view(torch.int16) if t.element_size() == 2 else t)


def gdn_compare(dev, cpu, case, dtype, zero_state: bool, seed: int, device: str = "cuda") -> list[str]:
    """Runs one mixed batch through `dev` (on `device`) and the CPU build `cpu`: forward (every slot folds its
    pending records first), then commit on the forward's verify rows. Returns the stage:tensor names that differ in
    any bit (empty = identical); the pools are compared raw, the deferred commit's records and counts included."""
    bt = gdn_batch(case, dtype, seed)
    attrs = gdn_attrs(case)
    n_ctx, lens = bt["n_ctx"], bt["lens"]
    ctx_rows = int(sum(lens[:n_ctx]))
    ctx_slots = bt["slots"][:n_ctx].long()
    gen_slots = bt["slots"][n_ctx:].long()
    keys = ("qkv", "w", "a", "b", "dt_bias", "A_log", "cu", "slots")
    zs = bt["zero"] if zero_state else None
    rnn_c, conv_c = bt["rnn"].clone(), bt["conv"].clone()
    out_c = cpu.forward(*(bt[k] for k in keys), bt["types"], rnn_c, conv_c, zero_state=zs, **attrs)
    to = lambda t: t.to(device)  # noqa: E731
    rnn_d, conv_d = to(bt["rnn"]), to(bt["conv"])
    out_d = dev.forward(*(to(bt[k]) for k in keys), bt["types"], rnn_d, conv_d,
                        zero_state=None if zs is None else to(zs), **attrs)
    bad = []
    y_c, y_d = out_c[0], out_d[0]
    if not _bits(y_c[:ctx_rows]).equal(_bits(y_d[:ctx_rows])):
        bad.append("forward:y")
    for name, pc, pd in (("rnn", rnn_c, rnn_d), ("conv", conv_c, conv_d)):
        if not _bits(pc[ctx_slots]).equal(_bits(pd[ctx_slots])):
            bad.append(f"forward:{name}_state")
        if not _bits(pc[gen_slots]).equal(_bits(pd[gen_slots])):
            bad.append(f"verify:{name}_state")
    if not _bits(y_c[ctx_rows:]).equal(_bits(y_d[ctx_rows:])):
        bad.append("verify:y")
    for i, name in ((1, "verify_qkv"), (2, "verify_gates")):
        if not _bits(out_c[i]).equal(_bits(out_d[i])):
            bad.append(f"verify:{name}")
    ckeys = ("w",)
    com_c = cpu.commit(out_c[1], out_c[2], *(bt[k] for k in ckeys), bt["accepted"], bt["cu"], bt["slots"],
                       bt["types"], rnn_c, conv_c, **attrs)
    com_d = dev.commit(out_d[1], out_d[2], *(to(bt[k]) for k in ckeys), to(bt["accepted"]), to(bt["cu"]),
                       to(bt["slots"]), bt["types"], rnn_d, conv_d, **attrs)
    if not _bits(com_c).equal(_bits(com_d)):
        bad.append("commit:committed")
    for name, pc, pd in (("rnn", rnn_c, rnn_d), ("conv", conv_c, conv_d)):
        if not _bits(pc).equal(_bits(pd)):
            bad.append(f"commit:{name}_state")
    return bad


def check_gdn(dev, cpu, results: dict, device: str = "cuda", small: bool = False) -> bool:
    """Every GDN_CASES batch (``small``: all but Qwen3.8-27B's heads) x dtype x zero_state through `dev` vs the CPU
    build, bit for bit."""
    import torch
    if cpu is None:
        log("gdn: the CPU build is unavailable: GPU-vs-CPU bit identity NOT checked")
        results["gdn_exact"] = None
        return True
    ok, n = True, 0
    for ci, case in enumerate(GDN_CASES[:GDN_SMALL_CASES] if small else GDN_CASES):
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            for zs in (False, True):
                n += 1
                bad = gdn_compare(dev, cpu, case, dt, zs, seed=100 * ci + n, device=device)
                if bad:
                    ok = False
                    log(f"  gdn MISMATCH case={case[:7]} ctx={case[7]} gen={case[8]} dtype={dt} zero_state={zs}: "
                        f"{', '.join(bad)}")
    log(f"gdn forward / verify / commit vs the CPU build (bit for bit, {n} batches): {'ok' if ok else 'FAILED'}")
    results["gdn_exact"] = ok
    dk128 = [c for c in (GDN_CASES[:GDN_SMALL_CASES] if small else GDN_CASES) if c[2] == 128]
    for tag, env in GDN_VARIANTS.items():
        with gdn_variant(env):
            good = check_gdn_cases(dev, cpu, dk128, " ".join(f"{k}={v}" for k, v in env.items()), device=device)
        results[f"gdn_exact{tag}"] = good
        ok = ok and good
    return ok


def gdn_decode_bytes(hk, hv, dk, dv, kc, kv, batch, el=2, pending=None) -> dict:
    """DRAM bytes a decode step must move at least, deferred commit (one layer): the forward reads each request's
    fp32 state and its `pending` records (default Kv), folds them, verifies the Kv rows and writes the state and the
    Kv rows' records (delta [Hv, Dv], keys [Hk, Dk], decay [Hv] per token), reads the conv state, qkv, a, b, writes
    y and the verify rows; the commit reads the last K-1 verify rows and writes the conv state. The workspace's
    round trips (xc, qh/kh, gates) are not counted."""
    c = 2 * hk * dk + hv * dv
    state = batch * hv * dk * dv * 4
    conv = batch * (kc - 1) * c * el
    rows = batch * kv
    record = (hv * dv + hk * dk + hv) * 4
    pend = kv if pending is None else pending
    fwd = (2 * state + batch * (pend + kv) * record + conv + rows * (c + 2 * hv) * el + rows * hv * dv * el
           + rows * c * el + rows * 2 * hv * 4)
    com = batch * min(kc - 1, kv) * c * el + conv
    return {"forward": fwd, "commit": com, "step": fwd + com}


# The profiler probes, run after every timing (``kernel_probes``, the last stage): a torch profile may leave CUPTI
# attached to the process (Kineto tears it down only with TEARDOWN_CUPTI=1 or a newer CUDA and torch, pytorch#144455),
# and later kernels would be timed with it. (stage key, variant tag, its environment, one GDN step) per probe.
LATE_PROBES: list = []


def bench_gdn(ext, results: dict) -> None:
    for batch in (1, 8, 64):
        for kv in (8, 16):
            bench_gdn_point(ext, results, batch, kv, probe=(batch, kv) == (64, 8))
    # the recurrence's variants at Dk = 128 (GDN_VARIANTS: same bits, checked in check_gdn), timed at the same points
    # beside the default's
    for tag, env in GDN_VARIANTS.items():
        if results.get(f"gdn_exact{tag}") is False:
            log(f"gdn{tag}: not timed (its bits differ from the CPU build)")
            continue
        with gdn_variant(env):
            for batch, kv in ((8, 8), (64, 8), (64, 16)):
                bench_gdn_point(ext, results, batch, kv, tag=tag, probe=(batch, kv) == (64, 8), env=env)


def kernel_probes(results: dict) -> None:
    """The last stage: whether the torch profiler records GPU kernels here (:func:`probe_profiler`), then which
    recurrence kernel each probed GDN step launched (:func:`recurrence_ran`), under its variant's environment."""
    probe_profiler(results)
    while LATE_PROBES:
        key, tag, env, step = LATE_PROBES.pop(0)
        with gdn_variant(env):
            names, error = kernels_launched(step)
        ran = recurrence_ran(names, tag)
        results[key].update(ran, kernels_probe_error=error)
        if ran["variant_ran"] is False:
            log(f"{key}: its kernel did NOT run (launched: {ran['recurrence_kernels']}); its times are another "
                f"kernel's")


def kernels_launched(fn) -> tuple[list[str] | None, str | None]:
    """(the distinct GPU kernel names of one call of ``fn``, recorded by the torch profiler; or None, why not). The
    plugins' kernels are launched through ctypes, outside any torch op, and CUPTI records them all the same. Where
    CUPTI cannot start (seen on a borrowed H100: CUPTI_ERROR_NOT_INITIALIZED) no kernel is recorded: said, not []."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        cuda = torch.autograd.DeviceType.CUDA
        names = sorted({e.name for e in prof.events() if e.device_type == cuda})
    except Exception as e:  # noqa: BLE001 - the probe informs; its failure is said, nothing else depends on it
        return None, f"{type(e).__name__}: {e}"[:300]
    if not names:
        return None, "the profiler recorded no GPU kernels (CUPTI unavailable?)"
    return names, None


def recurrence_ran(names: list[str] | None, tag: str) -> dict:
    """Which per-token recurrence kernel a GDN call launched (``names``: :func:`kernels_launched`'s), beside the one
    the variant ``tag`` asks for: the prefetching kernel falls back to the default one without a word where its grid
    cannot be planned (a CUDA query failing, no block fitting: ``prefetchGrid``), and its timings would then be the
    default's under another name."""
    if names is None:
        return {"recurrence_kernels": None, "variant_ran": None}
    rec = [n[:240] for n in names if "gdnRecurrent" in n]
    asked = "gdnRecurrentPrefetchKernel" if "prefetch" in tag else "gdnRecurrentKernel"
    return {"recurrence_kernels": rec, "variant_ran": any(asked in n for n in rec)}


def probe_profiler(results: dict) -> None:
    """Whether the torch profiler records GPU kernels on this machine (one matmul), known in seconds: the e2e part's
    real-width steps need it for their per-component split, and on the first H100 run it could not start."""
    import torch

    a = torch.randn(256, 256, device="cuda")
    names, error = kernels_launched(lambda: a @ a)
    results["profiler_probe"] = {"ok": names is not None, "kernels": names, "error": error}
    log(f"torch profiler: {'records GPU kernels (' + str(len(names)) + ' in a matmul)' if names else error}")


# The per-token recurrence's variants at Dk = 128 (environment of the launcher, read at each launch): one state column
# per lane (4 blocks per SM instead of 3), the persistent kernel that prefetches the next item's state tile into shared
# memory, and both. The same operations in the same order as the default kernel: the same bits.
GDN_VARIANTS = {
    "_cols1": {"DFLASH2_GDN_RECURRENT_COLS": "1"},
    "_prefetch": {"DFLASH2_GDN_RECURRENT_PREFETCH": "1"},
    "_prefetch_cols1": {"DFLASH2_GDN_RECURRENT_PREFETCH": "1", "DFLASH2_GDN_RECURRENT_COLS": "1"},
}


@contextlib.contextmanager
def gdn_variant(env: dict):
    """``env`` set for the plugins' launches inside (the launcher reads it at each launch), then put back."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_gdn_cases(dev, cpu, cases, label: str, device: str = "cuda") -> bool:
    """``cases`` x dtype (zero_state on the fp16 batches) through ``dev`` vs the CPU build, bit for bit; logs the
    outcome under ``label``."""
    import torch
    ok = True
    for ci, case in enumerate(cases):
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            bad = gdn_compare(dev, cpu, case, dt, dt == torch.float16, seed=500 + ci, device=device)
            if bad:
                ok = False
                log(f"  gdn ({label}) MISMATCH case={case[:7]} dtype={dt}: {', '.join(bad)}")
    log(f"gdn ({label}) vs the CPU build (bit for bit, {3 * len(cases)} batches): {'ok' if ok else 'FAILED'}")
    return ok


QWEN_GDN_HEADS = (16, 48, 128, 128, 4)   # Qwen3.8-27B at tp 1: Hk, Hv, Dk, Dv, conv taps


def gdn_on_device(ext, case, seed: int):
    """A bf16 random batch of ``case`` (gdn_batch) on the GPU for timing: the ExtGdn, its attributes, the packed
    inputs (qkv, w, a, b, dt_bias, A_log, cu, slots) on the device, the rnn and conv pools, the batch itself."""
    import torch
    bt = gdn_batch(case, torch.bfloat16, seed=seed)
    ins = [bt[k].cuda() for k in ("qkv", "w", "a", "b", "dt_bias", "A_log", "cu", "slots")]
    return ExtGdn(ext), gdn_attrs(case), ins, bt["rnn"].cuda(), bt["conv"].cuda(), bt


def bench_gdn_point(ext, results: dict, batch: int, kv: int, tag: str = "", probe: bool = False,
                    env: dict | None = None) -> None:
    """One layer's decode step, deferred commit: `step` = forward (fold of kv // 2 pending records, verify, state
    written once) + commit (pending counts, conv state), run back to back so that every forward has records to
    fold; `commit` alone; the forward is their difference. ``probe``: also record which recurrence kernel one step
    launched (:func:`recurrence_ran`), in the last stage (:data:`LATE_PROBES`; ``env``: the variant's)."""
    import torch
    hk, hv, dk, dv, kc = QWEN_GDN_HEADS
    dev, attrs, ins, rnn, conv, bt = gdn_on_device(ext, (hk, hv, dk, dv, kc, kv, 64, (), (kv,) * batch), seed=7)
    out = dev.forward(*ins, bt["types"], rnn, conv, **attrs)
    acc = torch.full((batch,), kv // 2, dtype=torch.int32, device="cuda")

    def commit():
        return dev.commit(out[1], out[2], ins[1], acc, ins[6], ins[7], bt["types"], rnn, conv, **attrs)

    def step():
        dev.forward(*ins, bt["types"], rnn, conv, **attrs)
        commit()

    nominal = results.get("nominal_bw")
    need = gdn_decode_bytes(hk, hv, dk, dv, kc, kv, batch, pending=kv // 2)
    times, graphed, graph_error = {}, {}, None
    for name, fn in (("step", step), ("commit", commit)):
        times[name] = cuda_time_us(fn, 50)
    times["forward"] = times["step"] - times["commit"]
    # the same calls replayed from a CUDA graph: the kernels' time without the host's (on a stream, a call's Python
    # and ctypes work can take longer than its kernels at small batches: the first H100 run's commit took ~47 us at
    # every batch)
    try:
        for name, fn in (("step", step), ("commit", commit)):
            graphed[name] = graph_time_us(fn, 200)
        graphed["forward"] = graphed["step"] - graphed["commit"]
    except Exception as e:  # noqa: BLE001 - the stream times stand; the reason is kept
        graph_error = f"{type(e).__name__}: {e}"[:300]
        graphed = {}
        log(f"gdn B {batch} x Kv {kv}: CUDA-graph timing failed ({graph_error}); stream times only")
    for name in ("step", "forward", "commit"):
        us = times[name]
        g_us = graphed.get(name)
        bound_us = need[name] / nominal * 1e6 if nominal else float("nan")
        g_frac = bound_us / g_us * 100 if g_us and g_us > 0 else float("nan")
        graph_txt = f"; in a CUDA graph {g_us:.1f} us ({g_frac:.0f}% of the bound)" if g_us is not None else ""
        log(f"gdn {name}{tag} (Qwen3.8-27B tp1 decode step, deferred commit: B {batch} x Kv {kv}, {kv // 2} pending, "
            f"Hv {hv} Hk {hk} x 128, bf16): {us:.1f} us on a stream{graph_txt}; DRAM bound {bound_us:.1f} us for "
            f"{need[name] / 1e6:.1f} MB ({bound_us / us * 100 if us else float('nan'):.0f}% of the bound on a stream); "
            f"per layer, x 48 layers")
        key = (f"gdn_{name}" if (batch, kv) == (64, 8) else f"gdn_{name}_b{batch}_kv{kv}") + tag
        results[key] = dict(us=us, graph_us=g_us, bytes=need[name], bound_us=bound_us,
                            frac_bound=bound_us / us if us else None,
                            frac_bound_graph=bound_us / g_us if g_us and g_us > 0 else None,
                            batch=batch, kv=kv, pending=kv // 2, graph_error=graph_error)
    if probe:
        LATE_PROBES.append((("gdn_step" if (batch, kv) == (64, 8) else f"gdn_step_b{batch}_kv{kv}") + tag, tag,
                            env or {}, step))


def bench_gdn_prefill(ext, results: dict, tokens: int = 8192) -> None:
    """One layer's forward of one prompt of ``tokens`` tokens on the chunked path (chunk 64), Qwen3.8-27B's tp 1
    heads, bf16, from a fresh slot: the prefill cost of the Gated DeltaNet (prologue, chunk matrices / solve /
    scan, conv state). No goal: reported beside the decode step's numbers."""
    import torch
    dev, attrs, ins, rnn, conv, bt = gdn_on_device(ext, (*QWEN_GDN_HEADS, 8, 64, (tokens,), ()), seed=9)
    zero = torch.ones(1, dtype=torch.int32, device="cuda")
    us = cuda_time_us(lambda: dev.forward(*ins, bt["types"], rnn, conv, zero_state=zero, **attrs), 10, warmup=2)
    log(f"gdn prefill (Qwen3.8-27B tp1 heads, one {tokens}-token prompt, chunk 64, bf16): {us / 1e3:.2f} ms per "
        f"layer, {us * 48 / 1e6:.2f} s for 48 layers ({tokens / (us * 1e-6) / 1e6:.2f} M tokens/s per layer)")
    results["gdn_prefill"] = dict(us=us, tokens=tokens, chunk=64, layers_48_s=us * 48 / 1e6)


PROFILE_RANGE = "df2prof"   # the NVTX push/pop ranges around the profiled calls: df2prof_<workload>
PROFILE_WORKLOADS = ("conv_unfused", "conv_fused", "scan_greedy", "scan_sample", "scan_viterbi", "gdn_forward",
                     "gdn_commit", "gdn_forward_cols1", "gdn_forward_prefetch", "gdn_forward_prefetch_cols1",
                     "gdn_prefill")   # profile_workloads' calls, in order (profile.py asks for these)


def profile_workloads(ext, manifest: Path | None = None, only=None) -> list[dict]:
    """The timed workloads above (``only``: those of them, in PROFILE_WORKLOADS' order; their inputs alone are made),
    each called once untimed (warm-up: module load, first-use allocations) and then once inside an NVTX push/pop range
    ``df2prof_<name>``, for Nsight Compute to profile the range's launches alone (scripts/gpu_check/profile.py:
    ``ncu --nvtx --nvtx-include df2prof_<name>/``). ``manifest`` gets the workloads in order with what each call is."""
    import torch
    wanted = PROFILE_WORKLOADS if only is None else tuple(w for w in PROFILE_WORKLOADS if w in set(only))
    unknown = sorted(set(only or ()) - set(PROFILE_WORKLOADS))
    if unknown:
        raise ValueError(f"profile workloads {unknown}: expected some of {', '.join(PROFILE_WORKLOADS)}")
    hk, hv, dk, dv, kc = QWEN_GDN_HEADS
    s = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731

    # each group's inputs, made only where one of its workloads is wanted: (name, what, the call, what runs before
    # each call or None)
    def conv_loads():
        t, h, k, g, bs = 8192, 5120, 2, 16, 16
        x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
        delta = (0.3 * torch.randn(t, k, h // g, device="cuda")).to(torch.bfloat16)
        base = torch.randn(k, h, device="cuda").to(torch.bfloat16)
        res = torch.randn(t, h, device="cuda")
        return [("conv_unfused", f"conv {t} tok x H {h} bf16, K {k}, G {g}",
                 lambda: ext.conv(x, delta, base, None, bs, g, s()), None),
                ("conv_fused", "the same with the fp32 residual", lambda: ext.conv(x, delta, base, res, bs, g, s()),
                 None)]

    def scan_loads():
        gen = torch.Generator(device="cuda").manual_seed(2)
        ins = _scan_inputs(64, 7, 16, 256, 248320, torch.bfloat16, gen)
        return [(f"scan_{mode}", f"scan {mode} B 64 L 7 K 16 R 256 bf16", lambda m=m: ext.scan(m, *ins, s()), None)
                for mode, m in (("greedy", 0), ("sample", 1), ("viterbi", 2))]

    def gdn_loads():
        batch, kv = 64, 8
        dev, attrs, gins, rnn, conv, bt = gdn_on_device(ext, (hk, hv, dk, dv, kc, kv, 64, (), (kv,) * batch), seed=7)
        out = dev.forward(*gins, bt["types"], rnn, conv, **attrs)
        acc = torch.full((batch,), kv // 2, dtype=torch.int32, device="cuda")

        def forward():
            dev.forward(*gins, bt["types"], rnn, conv, **attrs)

        def commit():
            dev.commit(out[1], out[2], gins[1], acc, gins[6], gins[7], bt["types"], rnn, conv, **attrs)

        # a forward after a commit, so that every slot folds Kv / 2 pending records (as in bench_gdn_point's step)
        loads = [("gdn_forward", f"gdn forward B {batch} x Kv {kv}, Qwen3.8-27B tp 1 heads, bf16, {kv // 2} records "
                  "pending per slot", forward, commit),
                 ("gdn_commit", f"its commit ({kv // 2} accepted)", commit, forward)]
        for tag, env in GDN_VARIANTS.items():
            def variant(env=env):
                with gdn_variant(env):
                    forward()

            loads.append((f"gdn_forward{tag}", f"the same forward with {env}", variant, commit))
        return loads

    def prefill_loads():
        pdev, pattrs, pins, prnn, pconv, pbt = gdn_on_device(ext, (*QWEN_GDN_HEADS, 8, 64, (8192,), ()), seed=9)
        zero = torch.ones(1, dtype=torch.int32, device="cuda")
        return [("gdn_prefill", "gdn forward, one 8192-token prompt, chunk 64",
                 lambda: pdev.forward(*pins, pbt["types"], prnn, pconv, zero_state=zero, **pattrs), None)]

    groups = ((("conv_unfused", "conv_fused"), conv_loads), (("scan_greedy", "scan_sample", "scan_viterbi"), scan_loads),
              (("gdn_forward", "gdn_commit", *(f"gdn_forward{tag}" for tag in GDN_VARIANTS)), gdn_loads),
              (("gdn_prefill",), prefill_loads))
    # the groups' names are PROFILE_WORKLOADS, in its order (profile.py asks ncu for these ranges)
    if tuple(n for names, _ in groups for n in names) != PROFILE_WORKLOADS:
        raise AssertionError("profile_workloads: its groups are not PROFILE_WORKLOADS")
    loads = []
    for names, build in groups:
        if any(n in wanted for n in names):
            built = build()
            if tuple(w[0] for w in built) != names:
                raise AssertionError(f"profile_workloads: {[w[0] for w in built]} is not {names}")
            loads += [w for w in built if w[0] in wanted]
    done = []
    for name, what, fn, prep in loads:
        for f in (prep, fn, prep):
            if f is not None:
                f()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(f"{PROFILE_RANGE}_{name}")
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        done.append({"workload": name, "what": what})
        log(f"profiled workload {name}: {what}")
    if manifest is not None:
        from dflash2_trt.bench.io import atomic_write_text
        atomic_write_text(manifest, json.dumps(done, indent=1))
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    p.add_argument("--skip-bench", action="store_true", help="correctness only")
    p.add_argument("--small", action="store_true",
                   help="correctness only, on the small cases (conv H <= 1024, GDN without Qwen3.8-27B's heads; the "
                        "scan's as always): what runs under compute-sanitizer (scripts/gpu_check/sanitize.py)")
    p.add_argument("--verbose-build", action="store_true")
    p.add_argument("--lib", help="a prebuilt CUDA build of the plugins (default: built from plugins/ for this GPU)")
    p.add_argument("--profile-workloads", type=Path, metavar="MANIFEST",
                   help="no checks: each timed workload once inside an NVTX range df2prof_<name>, for Nsight Compute "
                        "(scripts/gpu_check/profile.py); the workloads' list to MANIFEST (JSON)")
    p.add_argument("--only", help="with --profile-workloads: these workloads (comma-separated) of "
                                  + ", ".join(PROFILE_WORKLOADS))
    args = p.parse_args(argv)

    try:
        import torch
    except ImportError:
        log("gpu_check: torch is not installed")
        return 2
    if not torch.cuda.is_available():
        log("gpu_check: no CUDA GPU visible to torch (torch.cuda.is_available() is False): nothing was run")
        return 2
    sys.path.insert(0, str(REPO))
    t0 = time.monotonic()
    try:
        ext = build_extension(args.verbose_build, args.lib)
    except Exception as e:  # noqa: BLE001
        log(f"gpu_check: building the plugins' CUDA library failed: {e}")
        return 2
    if args.profile_workloads is not None:
        profile_workloads(ext, args.profile_workloads, only=args.only.split(",") if args.only else None)
        return 0
    results: dict = {}
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        cpu = load_cpu_build(Path(tmp))
        stages = [("conv", lambda: check_conv(ext, results, cpu, small=args.small)),
                  ("scan", lambda: check_scan(ext, results, cpu)),
                  ("gdn", lambda: check_gdn(ExtGdn(ext), load_gdn_cpu(), results, small=args.small))]
        if not (args.skip_bench or args.small):
            stages += [("bench_conv", lambda: bench_conv(ext, results)),
                       ("bench_scan", lambda: bench_scan(ext, results)), ("bench_gdn", lambda: bench_gdn(ext, results)),
                       ("bench_gdn_prefill", lambda: bench_gdn_prefill(ext, results)),
                       ("kernel_probes", lambda: kernel_probes(results))]    # last: a profile may leave CUPTI on
        results["cpu_bit_identity_checked"] = cpu is not None
        ok = run_stages(stages, results, args.json, t0)
    log(f"gpu_check finished in {results['total_s']:.0f} s: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def run_stages(stages, results: dict, json_path: Path | None, t0: float) -> bool:
    """Run each (name, fn) in order: a check's False or any stage's exception fails the run, and the next stage
    still runs; ``results`` (with ``stages_done`` and ``total_s``) is rewritten to ``json_path`` after each stage,
    so a run stopped at its time limit keeps what it measured."""
    ok = True
    results["stages_done"] = []
    for name, fn in stages:
        try:
            if fn() is False:
                ok = False
        except Exception as e:  # noqa: BLE001 - one stage's crash must not cost the others their numbers
            ok = False
            results[f"{name}_error"] = f"{type(e).__name__}: {e}"[:600]
            log(f"gpu_check: {name} failed: {results[f'{name}_error']}")
        results["stages_done"].append(name)
        results["total_s"] = time.monotonic() - t0
        if json_path:
            from dflash2_trt.bench.io import atomic_write_text

            atomic_write_text(json_path, json.dumps(results, indent=2, default=float))
    return ok


if __name__ == "__main__":
    sys.exit(main())
