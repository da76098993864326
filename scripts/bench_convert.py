#!/usr/bin/env python
"""Benchmark ``dflash2-trt convert`` against a plain copy of the same bytes, at real widths.

Builds on disk a synthetic Qwen3.8-27B pair with every real width and the full vocabulary
(hidden 5120, vocab 248320, 24 q / 4 kv heads of 256, Gated DeltaNet 16 k / 48 v heads of 128,
MLP 17408; drafter 32 q / 8 kv heads of 128, R 256) but only a few layers (default: target
[linear, linear, linear, full], drafter 2 layers, ~10 GB in bf16 with A_log/dt_bias in fp32,
target sharded in ~2 GB files with an index as published checkpoints are). Then, in the same
run and alternating, it times:

* ``copy``:    ``shutil.copyfile`` of every source file + fsync (the floor for moving those bytes);
  before each timing the sources are read once (page cache warm) and ``os.sync()`` flushes
  pending writes, so both start from the same state;
* ``streamed copy``: the same bytes with ``copy_file_range`` while each written chunk is pushed to
  disk and dropped from the page cache (the write-behind the converter does), then fsync: a copy
  that is as clever about the disk as the converter, so the ratio to it shows what conversion itself
  (slicing, casting, SHA-256, the NaN/Inf check) costs;
* ``convert``: the ``dflash2-trt convert`` command in a subprocess (startup included), whose
  peak RSS and CPU time are read from ``wait4``.

Each rep also prints the CPU seconds of both sides and the load average before it: ``convert``
does the copy's kernel work plus SHA-256 of every output byte and the NaN/Inf check, on a second
core, so its wall time matches the copy only while that core is free (a busy shared machine
shows as a load average above ~1 and a ratio that follows the CPU ratio).

Reports per-rep times, the ratio of medians (goal <= 1.15 including start-up; also the ratio
without the start-up before ``convert_pair`` runs, i.e. the interpreter and the CLI's imports, from
the time the CLI reports; the transformers/torch import of the target inventory runs inside it,
overlapping the data pass) and the converter's peak RSS (goal < 1 GiB, independent of model size:
compare ``--target-layers 4`` and ``8``). It is a side-by-side ratio on whatever machine runs it,
not a timed test: on a shared machine both sides are noisy, so run it more than once.

    python scripts/bench_convert.py [--workdir DIR] [--tp-size 1] [--reps 2] [--keep]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARD_BYTES = 2 << 30
PATTERN_BYTES = 32 << 20


def _configs(target_layers: int, drafter_layers: int) -> tuple[dict, dict]:
    from dflash2_trt.testing.fixtures import QWEN_DRAFTER, QWEN_TARGET

    target = json.loads((QWEN_TARGET / "config.json").read_text())
    text = target["text_config"]
    types = ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(target_layers)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    text.update(num_hidden_layers=target_layers, layer_types=types)
    drafter = json.loads((QWEN_DRAFTER / "config.json").read_text())
    taps = min(5, target_layers)
    drafter.update(num_hidden_layers=drafter_layers, layer_types=["sliding_attention"] * drafter_layers,
                   max_window_layers=drafter_layers, num_target_layers=target_layers)
    drafter["dflash_config"] = dict(drafter["dflash_config"], target_layer_ids=list(range(taps)))
    return target, drafter


class _Filler:
    """Finite bf16/fp32 bytes from a fixed random pattern (content is irrelevant to the timing)."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.bf16 = (torch.randn(PATTERN_BYTES // 2, generator=g) * 0.02).bfloat16().view(torch.uint8).numpy()
        self.f32 = (torch.randn(PATTERN_BYTES // 4, generator=g) * 0.02).view(torch.uint8).numpy()

    def write(self, writer, name: str, tag: str, nbytes: int) -> None:
        pat = self.f32 if tag == "F32" else self.bf16
        off = 0
        while off < nbytes:
            n = min(len(pat), nbytes - off)
            writer.write(name, off, pat[:n])
            off += n


def _write_checkpoint(directory: Path, specs: list, filler: _Filler, shard_bytes: int | None) -> None:
    from dflash2_trt.checkpoint.writer import SafetensorsLayout, StreamingSafetensorsWriter

    directory.mkdir(parents=True)
    groups, cur, size = [], [], 0
    for s in specs:
        if cur and shard_bytes is not None and size + s.nbytes > shard_bytes:
            groups.append(cur)
            cur, size = [], 0
        cur.append(s)
        size += s.nbytes
    groups.append(cur)
    weight_map = {}
    for i, group in enumerate(groups):
        fname = "model.safetensors" if len(groups) == 1 else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        w = StreamingSafetensorsWriter(directory / fname, SafetensorsLayout(group, {"format": "pt"}))
        for s in group:
            filler.write(w, s.name, s.dtype, s.nbytes)
            weight_map[s.name] = fname
        w.finish()
        w.close()
    if len(groups) > 1:
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def build_synthetic(root: Path, target_layers: int, drafter_layers: int) -> tuple[Path, Path, int]:
    from dflash2_trt.checkpoint import expected_drafter_tensors, expected_target_tensors
    from dflash2_trt.checkpoint.writer import TensorSpec
    from dflash2_trt.config import DFlash2Config, TargetConfig

    tcfg_dict, dcfg_dict = _configs(target_layers, drafter_layers)
    tdir, ddir = root / "target", root / "drafter"
    tcfg = TargetConfig.from_hugging_face(tcfg_dict)
    dcfg = DFlash2Config.from_hugging_face(dcfg_dict)
    filler = _Filler()
    tspecs = [TensorSpec(n, e.dtype or "F32", e.shape) for n, e in sorted(expected_target_tensors(tcfg).items())]
    dspecs = [TensorSpec(n, e.dtype, e.shape) for n, e in sorted(expected_drafter_tensors(dcfg, tcfg.hidden_size).items())]
    _write_checkpoint(tdir, tspecs, filler, SHARD_BYTES)
    _write_checkpoint(ddir, dspecs, filler, None)
    (tdir / "config.json").write_text(json.dumps(tcfg_dict, indent=2))
    (ddir / "config.json").write_text(json.dumps(dcfg_dict, indent=2))
    total = sum(s.nbytes for s in tspecs + dspecs)
    return ddir, tdir, total


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _settle(sources: list[Path]) -> None:
    for src in sources:
        for f in sorted(src.iterdir()):
            with open(f, "rb") as fh:
                while fh.read(64 << 20):
                    pass
    os.sync()
    time.sleep(1.0)


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed_copy(sources: list[Path], dest: Path, copy_one) -> tuple[float, float]:
    """``copy_one(src_file, dst_file)`` for every file of every source directory, into ``dest/<dir name>/``:
    (wall seconds, CPU seconds of this process)."""
    c0 = _cpu_self()
    t0 = time.perf_counter()
    for src in sources:
        d = dest / src.name
        d.mkdir(parents=True)
        for f in sorted(src.iterdir()):
            copy_one(f, d / f.name)
    return time.perf_counter() - t0, _cpu_self() - c0


def time_copy(sources: list[Path], dest: Path) -> tuple[float, float]:
    """The plain copy: ``shutil.copyfile`` + fsync per file. (wall s, CPU s)."""
    def one(f, out):
        shutil.copyfile(f, out)
        _fsync_path(out)
    return _timed_copy(sources, dest, one)


def _sync_range():
    """libc ``sync_file_range`` (Linux), or None."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return fn


def time_copy_streamed(sources: list[Path], dest: Path, chunk: int = 64 << 20) -> tuple[float, float]:
    """A second, stronger baseline: the same bytes copied inside the kernel (``copy_file_range``) while
    the pages written one chunk before are pushed to disk and dropped from the cache, then fsync: the
    floor for a copy that does not leave gigabytes of dirty pages to the final fsync. (wall s, CPU s)."""
    sfr = _sync_range()

    def one(f, out):
        size = f.stat().st_size
        fi, fo = os.open(f, os.O_RDONLY), os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            done = 0
            while done < size:
                n = os.copy_file_range(fi, fo, min(chunk, size - done))
                if n <= 0:
                    raise SystemExit(f"copy_file_range stopped at byte {done} of {f}")
                if sfr is not None:
                    sfr(fo, done, n, 2)                  # SYNC_FILE_RANGE_WRITE: start this chunk
                    if done >= chunk:                   # wait for the one before, then drop it
                        sfr(fo, done - chunk, chunk, 1 | 2 | 4)
                        os.posix_fadvise(fo, done - chunk, chunk, os.POSIX_FADV_DONTNEED)
                done += n
            os.fsync(fo)
        finally:
            os.close(fi)
            os.close(fo)
    return _timed_copy(sources, dest, one)


def time_convert(drafter: Path, target: Path, out: Path, tp: int) -> tuple[float, float, int, float]:
    """(wall seconds of the command, seconds the converter reports after its imports, peak RSS bytes,
    CPU seconds of the command: user + system, all threads)."""
    cmd = [sys.executable, "-m", "dflash2_trt.cli", "convert", "--drafter", str(drafter), "--target-dir",
           str(target), "--output", str(out), "--tp-size", str(tp)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"convert failed ({proc.returncode}):\n{err}")
    m = re.search(r"read in ([0-9.]+) s", proc.stdout.read().decode())
    cpu = usage.ru_utime + usage.ru_stime
    return elapsed, float(m.group(1)) if m else float("nan"), usage.ru_maxrss * 1024, cpu  # maxrss: KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, help="where to build (default: a temp dir under /tmp)")
    ap.add_argument("--target-layers", type=int, default=4)
    ap.add_argument("--drafter-layers", type=int, default=2)
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the synthetic checkpoint and outputs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.workdir is not None and not args.workdir.is_dir():
        ap.error(f"--workdir {args.workdir}: not a directory")

    root = Path(tempfile.mkdtemp(prefix="dflash2-bench-", dir=args.workdir))
    try:
        t0 = time.perf_counter()
        drafter, target, total = build_synthetic(root / "src", args.target_layers, args.drafter_layers)
        build_s = time.perf_counter() - t0
        print(f"synthetic pair: {total / 2**30:.2f} GiB ({args.target_layers} target layers, "
              f"{args.drafter_layers} drafter layers) built in {build_s:.1f} s", file=sys.stderr)
        copies, streamed, converts, inner, rss, cpus, loads = [], [], [], [], [], [], []
        for rep in range(args.reps):
            # Same starting state for both: no dirty pages pending (os.sync), sources in the page cache.
            _settle([target, drafter])
            load = os.getloadavg()[0]
            c, c_cpu = time_copy([target, drafter], root / f"copy{rep}")
            shutil.rmtree(root / f"copy{rep}")
            _settle([target, drafter])
            cs, _ = time_copy_streamed([target, drafter], root / f"scopy{rep}")
            shutil.rmtree(root / f"scopy{rep}")
            streamed.append(cs)
            _settle([target, drafter])
            v, vi, r, v_cpu = time_convert(drafter, target, root / f"out{rep}", args.tp_size)
            out_bytes = sum(f.stat().st_size for f in (root / f"out{rep}").iterdir())
            shutil.rmtree(root / f"out{rep}")
            copies.append(c)
            converts.append(v)
            inner.append(vi)
            rss.append(r)
            cpus.append((round(c_cpu, 1), round(v_cpu, 1)))
            loads.append(round(load, 2))
            print(f"rep {rep}: copy {c:.2f} s ({total / c / 2**20:.0f} MiB/s), streamed copy {cs:.2f} s, convert {v:.2f} s "
                  f"(after start-up {vi:.1f} s) "
                  f"({total / v / 2**20:.0f} MiB/s, output {out_bytes / 2**30:.2f} GiB), "
                  f"convert peak RSS {r / 2**20:.0f} MiB; CPU s copy {c_cpu:.1f}, convert {v_cpu:.1f}; "
                  f"load average before {load:.2f}", file=sys.stderr)
        report = {
            "source_gib": round(total / 2**30, 3),
            "tp_size": args.tp_size,
            "target_layers": args.target_layers,
            "drafter_layers": args.drafter_layers,
            "copy_s": [round(x, 2) for x in copies],
            "convert_s": [round(x, 2) for x in converts],
            "streamed_copy_s": [round(x, 2) for x in streamed],
            "convert_after_imports_s": inner,
            "ratio_of_medians": round(statistics.median(converts) / statistics.median(copies), 3),
            "ratio_after_imports": round(statistics.median(inner) / statistics.median(copies), 3),
            "ratio_to_streamed_copy": round(statistics.median(converts) / statistics.median(streamed), 3),
            "convert_peak_rss_mib": round(max(rss) / 2**20, 1),
            "cpu_s_copy_convert": cpus,
            "load_average_before": loads,
            "goal": {"ratio": 1.15, "rss_mib": 1024},
        }
        print(json.dumps(report, indent=2) if args.json else
              f"convert/copy = {report['ratio_of_medians']} (goal <= 1.15x including start-up, RSS < 1 GiB; "
              f"{report['ratio_after_imports']} without the interpreter and CLI imports); "
              f"convert/streamed copy = {report['ratio_to_streamed_copy']}; "
              f"converter peak RSS = {report['convert_peak_rss_mib']} MiB (goal < 1024)")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}", file=sys.stderr)


if __name__ == "__main__":
    main()
