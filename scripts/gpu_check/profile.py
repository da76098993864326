"""``scripts/gpu_check.sh --profile OUT_DIR``: the plugins' timed workloads under Nsight Compute (hardware counters).

gpu_check.py times the kernels against their bounds; where a kernel misses, its time alone does not say why (the scan
at 3x its estimate, the GDN recurrence at 40% of its DRAM bound on the first H100 run). This runs
``gpu_check.py --profile-workloads`` (each timed workload once untimed, then once inside an NVTX range
``df2prof_<name>``; by default :data:`DEFAULT_WORKLOADS`: the conv, the scan greedy and sample, the GDN decode forward
(and its prefetching variant) and commit at B 64 x Kv 8; ``--workloads all`` adds the fused conv, viterbi, the other
GDN variants and one 8192-token prefill) under ``ncu --clock-control none`` with the sections of :data:`SECTIONS`,
profiling only the launches inside those ranges, and exports the report as CSV:

- ``profile-raw.csv``: one row per profiled launch, every collected metric (base units);
- ``profile-details.csv``: the sections as ncu prints them, with its rules' advice;
- ``profile-source.csv``: per launch, the SASS with its warp-stall samples and executed instructions;
- ``profile-nvtx.csv``: the raw page again with each launch named after its NVTX range (the workload);
- ``profile.json``: per launch the headline numbers (duration, DRAM / SM throughput, achieved occupancy, registers,
  the largest warp-stall reasons) and the SASS lines with the most stall samples; the exports' exit statuses;
- ``profile.ncu-rep`` (the report itself, where it is under :data:`MAX_REPORT_BYTES`: the device tool brings back
  files of up to 16 MiB, run_all's archive included) and ``profile-ncu.log``.

The library is built (or found in the cache) before ncu starts, outside its limit. Exit 0 when the report was made
and read, 1 when ncu failed or its report could not be read (the log says why: e.g. no permission for the counters),
2 without ncu or when the build fails. On SIGTERM / SIGINT the running ncu's process group is stopped before this
exits.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
from dflash2_trt.bench.io import atomic_write_text  # noqa: E402 - the repository's package, from this checkout
from dflash2_trt.children import run_limited, stop_signals_raise  # noqa: E402
from dflash2_trt.cudatools import find_cuda_tool  # noqa: E402



def _gpu_check():
    spec = importlib.util.spec_from_file_location("dflash2_gpu_check_main", HERE / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)      # its module level imports nothing heavy (torch is imported by its functions)
    return mod


_GC = _gpu_check()
WORKLOADS = _GC.PROFILE_WORKLOADS   # gpu_check.py's profile_workloads, in its order: NVTX ranges df2prof_<name>
RANGE = _GC.PROFILE_RANGE
# profiled by default: what decides the next kernel work, inside run_all's ~85-120 s (ncu saves and restores the
# memory a launch writes before each of its replay passes: the GDN forward's pools cost seconds per launch);
# --workloads all for every one (a second call)
DEFAULT_WORKLOADS = ("conv_unfused", "scan_greedy", "scan_sample", "gdn_forward", "gdn_commit", "gdn_forward_prefetch")
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "SchedulerStats", "MemoryWorkloadAnalysis",
            "ComputeWorkloadAnalysis", "InstructionStats", "SourceCounters")
# headline metrics of profile.json (raw page names; those the sections did not collect are left out)
HEADLINE = {
    "duration_ns": "gpu__time_duration.sum",
    "dram_pct_peak": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",   # SpeedOfLight's, CC 7.5-10.x
                      "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "memory_pct_peak": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_pct_peak": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "registers": "launch__registers_per_thread",
    "dynamic_smem_bytes": "launch__shared_mem_per_block_dynamic",
    "waves_per_sm": "launch__waves_per_multiprocessor",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "warp_instructions": "smsp__inst_executed.sum",
    "cycles_per_issue": "smsp__average_warp_latency_per_inst_issued.ratio",
    "shared_bank_conflicts": ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                              "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"),   # summed
}
# collected beside the sections (none of them has these)
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
           "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum")
NO_STALL = ("selected",)   # a warp issuing is 'selected': about one per issue, not a stall
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
TOP_STALLS = 6
TOP_SASS = 12
STOP_LADDER = ((signal.SIGTERM, 5.0), (signal.SIGKILL, None))
EXPORT_LIMIT_S = 120.0
EXPORT_MIN_S = 20.0      # each export gets at least this where the limit allows; the profiling run leaves two for them
MIN_PROFILE_S = 20.0     # ... and gets at least this itself
EXPORT_SKIP_S = 5.0      # with less of the limit left, an export is skipped (named in profile.json), not started
MAX_REPORT_BYTES = 6 << 20


def find_ncu() -> str | None:
    """ncu on PATH, else under CUDA_HOME / CUDA_PATH / /usr/local/cuda, else the newest /opt/nvidia/nsight-compute."""
    return find_cuda_tool("ncu", ("/opt/nvidia/nsight-compute/*/ncu",))


def profile_argv(ncu: str, report: Path, manifest: Path, lib: str | None, workloads=DEFAULT_WORKLOADS,
                 python: str = sys.executable) -> list[str]:
    """The profiling run: only the launches inside the workloads' NVTX ranges, the clocks left as they are."""
    argv = [ncu, "--clock-control", "none", "--nvtx"]
    for w in workloads:
        argv += ["--nvtx-include", f"{RANGE}_{w}/"]
    for s in SECTIONS:
        argv += ["--section", s]
    argv += ["--metrics", ",".join(METRICS)]
    argv += ["--import-source", "no", "--force-overwrite", "--export", str(report),
             python, str(HERE / "gpu_check.py"), "--profile-workloads", str(manifest), "--only", ",".join(workloads)]
    return argv + (["--lib", lib] if lib else [])


def export_argv(ncu: str, report: Path, page: str) -> list[str]:
    """One page of the report as CSV (``nvtx``: the raw page with each launch named after its NVTX range)."""
    argv = [ncu, "--import", str(report), "--csv", "--print-units", "base"]
    if page == "source":
        return argv + ["--page", "source", "--print-source", "sass"]
    if page == "nvtx":
        return argv + ["--page", "raw", "--print-nvtx-rename", "kernel"]
    return argv + ["--page", page]


def _number(text: str):
    """A CSV cell as a number where it is one ('1,234.5' too), else None."""
    t = (text or "").replace(",", "").strip()
    try:
        return float(t)
    except ValueError:
        return None


def csv_tables(text: str) -> list[list[list[str]]]:
    """The CSV tables of an export: ncu may print lines that are not CSV (its ==PROF== notes) and, on the source page,
    one table per launch; a table starts at a row whose cells are all quoted names and runs while rows keep its
    width."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in text.splitlines():
        if not line.startswith('"'):
            current = None
            continue
        row = next(csv.reader(io.StringIO(line)))
        if current is not None and len(row) == len(current[0]) and not _is_header(row, current[0]):
            current.append(row)
        else:
            current = [row]
            tables.append(current)
    return tables


def _is_header(row: list[str], header: list[str]) -> bool:
    return row == header


def read_raw(text: str) -> list[dict]:
    """The raw page: its header row, a units row (empty under ID), then one row per launch -> one dict per launch."""
    for table in csv_tables(text):
        head = table[0]
        if "ID" not in head or "Kernel Name" not in head:
            continue
        rows = [r for r in table[1:] if r[head.index("ID")].strip()]
        return [dict(zip(head, r)) for r in rows]
    return []


def headline(row: dict) -> dict:
    """The launch's headline numbers and its largest stall reasons (warps stalled per issued instruction)."""
    out = {"id": row.get("ID"), "kernel": row.get("Kernel Name"), "grid": row.get("Grid Size"),
           "block": row.get("Block Size")}
    for key, metric in HEADLINE.items():
        if key == "shared_bank_conflicts":
            vals = [_number(row.get(m, "")) for m in metric]
            if any(v is not None for v in vals):
                out[key] = sum(v for v in vals if v is not None)
            continue
        for name in (metric,) if isinstance(metric, str) else metric:   # the first the report has
            v = _number(row.get(name, ""))
            if v is not None:
                out[key] = v
                break
    stalls = {}
    for name, value in row.items():
        m = STALL.match(name)
        v = _number(value)
        if m and v is not None and v > 0 and m.group(1) not in NO_STALL:
            stalls[m.group(1)] = v
    out["stalls_per_issue"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:TOP_STALLS])
    return out


def read_source(text: str) -> list[tuple[str | None, list[dict]]]:
    """The source page: per launch (in the report's order) the kernel it names (a ``"Kernel Name","<name>",`` row
    before each table: a trailing comma, so a third, empty cell) and its SASS lines with the most warp-stall
    samples."""
    out = []
    title = None
    for table in csv_tables(text):
        head = table[0]
        if len(head) >= 2 and head[0] in ("Kernel Name", "Function Name") and not any(c.strip() for c in head[2:]):
            title = head[1]
            continue
        samples = next((i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All")), None)
        src = head.index("Source") if "Source" in head else None
        if samples is None or src is None:
            continue
        addr = head.index("Address") if "Address" in head else None
        execd = next((i for i, h in enumerate(head) if h.startswith("Instructions Executed")), None)
        lines = []
        total = 0.0
        for r in table[1:]:
            n = _number(r[samples]) or 0.0
            total += n
            lines.append({"address": r[addr] if addr is not None else None, "sass": r[src].strip(), "samples": n,
                          "executed": _number(r[execd]) if execd is not None else None})
        top = sorted(lines, key=lambda d: -d["samples"])[:TOP_SASS]
        for d in top:
            d["share"] = round(d["samples"] / total, 4) if total else None
        out.append((title, top))
        title = None
    return out


def summarize(raw: str, source: str | None, nvtx: str | None) -> list[dict]:
    """profile.json's launches: headline numbers, the workload (from the NVTX-named export, matched by ID) and the
    top SASS lines (the source page's tables are in the raw page's order)."""
    launches = [headline(r) for r in read_raw(raw)]
    names = {r.get("ID"): r.get("Kernel Name", "") for r in read_raw(nvtx)} if nvtx else {}
    for d in launches:
        n = names.get(d["id"], "")
        m = re.search(rf"{RANGE}_(\w+)", n)
        d["workload"] = m.group(1) if m else None
    if source:
        tops = read_source(source)
        if len(tops) == len(launches):          # one table per launch, in order
            for d, (_, top) in zip(launches, tops):
                d["top_sass"] = top
        else:                                   # one per function: matched by the name the table gives
            for d in launches:
                name = (d["kernel"] or "").split("(")[0]
                hit = next((top for title, top in tops if title and name and title.split("(")[0] == name), None)
                if hit is not None:
                    d["top_sass"] = hit
    return launches



def prebuild() -> str:
    """The plugins' CUDA library, from the cache or built now, before ncu's limit starts."""
    from dflash2_trt.trtllm.cuda.plugin_lib import build_cuda_plugins
    return str(build_cuda_plugins(progress=lambda m: print(m, flush=True)))


# ncu formats numbers by the locale (a European one writes 27.595.520 and 65,77): the C locale's are parsed here
NCU_ENV = {"LC_ALL": "C", "LANG": "C"}


def export(ncu: str, report: Path, page: str, dest: Path, limit: float) -> tuple[dict, str | None]:
    """One export to ``dest`` (written whole or not at all): its record (exit status; on failure, its last line) and
    its text (None where it failed: a file of that name left by an earlier run in the same folder is not read)."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run(export_argv(ncu, report, page), capture_output=True, text=True, timeout=limit,
                              env={**os.environ, **NCU_ENV})
    except subprocess.TimeoutExpired:
        return {"exit": 124, "seconds": round(time.monotonic() - t0, 1)}, None
    rec = {"exit": proc.returncode, "seconds": round(time.monotonic() - t0, 1)}
    if proc.returncode == 0 and proc.stdout.strip():
        atomic_write_text(dest, proc.stdout)
        rec["bytes"] = len(proc.stdout)
        return rec, proc.stdout
    rec["error"] = ((proc.stderr or proc.stdout).strip().splitlines() or ["(no output)"])[-1][:300]
    return rec, None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="output directory (profile.json, the CSV exports, the report, the log)")
    p.add_argument("--limit", type=float, default=180.0,
                   help="seconds for the profiling run (default 180; the exports get what is left, at least 20)")
    p.add_argument("--lib", help="a prebuilt CUDA build of the plugins (default: built or found in the cache)")
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                   help=f"comma-separated, of {', '.join(WORKLOADS)}; or all (default: {','.join(DEFAULT_WORKLOADS)})")
    args = p.parse_args(argv)
    args.workloads = list(WORKLOADS) if args.workloads == "all" else [w for w in args.workloads.split(",") if w]
    bad = [w for w in args.workloads if w not in WORKLOADS]
    if bad or not args.workloads:
        print(f"error: --workloads: expected a comma-separated list of {', '.join(WORKLOADS)} (or all), got "
              f"{','.join(bad) or 'nothing'}", file=sys.stderr)
        return 2
    if not args.limit > 0:
        print(f"error: --limit must be a positive number of seconds, got {args.limit}", file=sys.stderr)
        return 2
    ncu = find_ncu()
    if ncu is None:
        print("profile: Nsight Compute (ncu) not found (PATH, CUDA_HOME/bin, /usr/local/cuda/bin, "
              "/opt/nvidia/nsight-compute): nothing was run", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.limit
    with stop_signals_raise():   # a stop from outside kills the running tool's group first
        return _run(args, ncu, deadline)


def _run(args, ncu: str, deadline: float) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    lib = args.lib
    if lib is None:
        try:
            lib = prebuild()
        except Exception as e:  # noqa: BLE001 - one line, whatever the build raised
            print(f"profile: building the plugins failed: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="df2prof.") as tmp:
        return _profile(args, ncu, lib, Path(tmp) / "profile.ncu-rep", deadline)


def _profile(args, ncu: str, lib: str, report: Path, deadline: float) -> int:
    log = args.out / "profile-ncu.log"
    doc: dict = {"ncu": ncu, "lib": lib, "sections": list(SECTIONS), "workloads": list(args.workloads)}
    t0 = time.monotonic()
    limit = max(deadline - time.monotonic() - 2 * EXPORT_MIN_S, MIN_PROFILE_S)
    rc = run_limited(profile_argv(ncu, report, args.out / "profile-manifest.json", lib, args.workloads), limit, log,
                     own_group=True, cwd=REPO, env=NCU_ENV, ladder=STOP_LADDER)
    doc["profile"] = {"exit": rc, "seconds": round(time.monotonic() - t0, 1), "limit": round(limit, 1)}
    text = log.read_text(errors="replace")
    doc["profile"]["ncu_errors"] = [ln for ln in text.splitlines() if ln.startswith("==ERROR==")][:10]
    print(f"profile: ncu exit {rc} after {doc['profile']['seconds']} s", flush=True)
    for ln in doc["profile"]["ncu_errors"]:
        print(f"  {ln}", flush=True)
    ok = report.is_file()
    exports: dict = {}
    texts: dict = {}
    doc["exports"] = exports

    def save_so_far() -> None:   # the limit may stop this script in an export: profile.json holds what is done
        atomic_write_text(args.out / "profile.json", json.dumps({**doc, "partial": True}, indent=1))

    save_so_far()
    pages = (("raw", "profile-raw.csv"), ("nvtx", "profile-nvtx.csv"), ("source", "profile-source.csv"),
             ("details", "profile-details.csv"))
    if ok:
        for i, (page, name) in enumerate(pages):
            left = deadline - time.monotonic() - 2      # the final write and the exit
            if left < EXPORT_SKIP_S:
                exports[page] = {"exit": None, "skipped": f"{max(left, 0):.0f} s of the limit left"}
                print(f"profile: export {page}: skipped ({exports[page]['skipped']})", flush=True)
                continue
            share = min(max(left / (len(pages) - i), EXPORT_MIN_S), left)
            exports[page], texts[page] = export(ncu, report, page, args.out / name, min(share, EXPORT_LIMIT_S))
            print(f"profile: export {page}: exit {exports[page]['exit']}"
                  + (f" ({exports[page]['error']})" if "error" in exports[page] else ""), flush=True)
            save_so_far()
    if ok:
        size = report.stat().st_size
        doc["report_bytes"] = size
        if size <= MAX_REPORT_BYTES:
            shutil.copyfile(report, args.out / "profile.ncu-rep")

    raw = texts.get("raw")
    launches = summarize(raw, texts.get("source"), texts.get("nvtx")) if raw else []
    doc["launches"] = launches
    doc["ok"] = bool(ok and launches)
    atomic_write_text(args.out / "profile.json", json.dumps(doc, indent=1))
    for d in launches:
        stalls = ", ".join(f"{k} {v:.1f}" for k, v in d["stalls_per_issue"].items())
        dur = d.get("duration_ns")
        print(f"  {d.get('workload') or '?':13s} {(d['kernel'] or '')[:48]:48s} "
              f"{dur / 1e3 if dur is not None else float('nan'):9.1f} us  DRAM {d.get('dram_pct_peak', float('nan')):5.1f}%"
              f"  SM {d.get('sm_pct_peak', float('nan')):5.1f}%  occupancy {d.get('achieved_occupancy_pct', float('nan')):5.1f}%"
              f"  stalls: {stalls}", flush=True)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
