"""``scripts/gpu_check.sh --profile OUT_DIR``: the plugins' timed workloads under Nsight Compute (hardware counters).

gpu_check.py times the kernels against their bounds; where a kernel misses, its time alone does not say why (the scan
at 3x its estimate, the GDN recurrence at 40% of its DRAM bound on the first H100 run). This runs
``gpu_check.py --profile-workloads`` (each timed workload once untimed, then once inside an NVTX range
``df2prof_<name>``; by default :data:`DEFAULT_WORKLOADS`: the conv, the scan greedy and sample, the GDN decode forward
(and its prefetching variant) and commit at B 64 x Kv 8; ``--workloads all`` adds the fused conv, viterbi, the other
GDN variants and one 8192-token prefill) under ``ncu --clock-control none`` with the sections of :data:`SECTIONS`,
profiling only the launches inside those ranges.

ncu writes its report only when it ends, so a single run stopped at the limit would lose every workload. Instead ncu
runs once per group of :data:`RUN_GROUPS` (the wanted workloads of each group; most important first: the GDN forward,
its prefetching variant, the commit, the conv, the scans, then the rest), each with its own report, and each report
is exported and read into profile.json before the next run starts: the limit costs only the runs it did not reach. A
run gets what is left of the limit less :data:`RUN_RESERVE_S` for its exports and the time to stop it; at its limit
ncu alone gets SIGINT (its chance to end and write its report) and :data:`NCU_INT_GRACE_S`, then its whole process
group SIGTERM and SIGKILL; a report that is there after that is read all the same. A run that would get less than
:data:`MIN_PROFILE_S` is not started (the first always is); where the counters are not accessible
(``ERR_NVGPUCTRPERM``), the later runs are not started either. Per run ``<label>`` (the workload, or ``conv`` /
``scan`` for a group of them):

- ``profile-<label>-raw.csv``: one row per profiled launch, every collected metric (base units);
- ``profile-<label>-nvtx.csv`` (a run of several workloads): the raw page with each launch named after its range;
- ``profile-<label>-source.csv``: per launch, the SASS with its warp-stall samples and executed instructions;
- ``profile-<label>-details.csv``: the sections as ncu prints them, with its rules' advice;
- ``profile-<label>.ncu-rep`` (the report itself, while the reports copied so far stay under
  :data:`MAX_REPORT_BYTES` together: the device tool brings back files of up to 16 MiB, run_all's archive included)
  and ``profile-<label>-ncu.log``;

and ``profile.json``, rewritten after each run and each export: per run its workloads, status (``profiled``,
``cut``: stopped at the limit, ``failed``, ``not_started``, ``interrupted``), ncu's exit status and errors, what
gpu_check ran, the exports' exit statuses; the workloads by status (``profiled``, ``cut``, ``failed``,
``not_started``); per launch the headline numbers (duration, DRAM / SM throughput, achieved occupancy, registers, the
largest warp-stall reasons) and the SASS lines with the most stall samples.

The library is built (or found in the cache) before ncu starts. Exit 0 when every run was profiled and read, 1 when
one was cut, failed or not started (profile.json says which; the log why: e.g. no permission for the counters), 2
without ncu or when the build fails. On SIGTERM / SIGINT the running ncu's process group is killed before this
exits (profile.json marks its run ``interrupted``).
"""

from __future__ import annotations

import argparse
import contextlib
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
from dflash2_trt.children import (die_with_parent, proc_cmdline, proc_pids, proc_stat, process_tree,  # noqa: E402
                                  stop_signals_raise)
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
# one ncu run per group (its wanted workloads; a group none of which is wanted is no run), most important first:
# the GDN decode forward and its prefetching variant decide the next kernel work, then the commit, the conv, the scans
# (small kernels: one run), the other GDN variants and the prefill. (label, workloads): the label names its files
RUN_GROUPS = (("gdn_forward", ("gdn_forward",)), ("gdn_forward_prefetch", ("gdn_forward_prefetch",)),
              ("gdn_commit", ("gdn_commit",)), ("conv", ("conv_unfused", "conv_fused")),
              ("scan", ("scan_greedy", "scan_sample", "scan_viterbi")), ("gdn_forward_cols1", ("gdn_forward_cols1",)),
              ("gdn_forward_prefetch_cols1", ("gdn_forward_prefetch_cols1",)), ("gdn_prefill", ("gdn_prefill",)))
# at a run's limit: ncu alone gets SIGINT and this long to end (it writes its report when it ends), then its group
# (ncu and the program it profiles) SIGTERM, then SIGKILL
NCU_INT_GRACE_S = 6.0
GROUP_STOP_LADDER = ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0))
RUN_RESERVE_S = 10.0     # kept after a run's limit for its exports (besides the time its stop may take)
MIN_PROFILE_S = 15.0     # a run that would get less is not started (the first one gets at least this)
EXPORT_LIMIT_S = 120.0
EXPORT_SKIP_S = 5.0      # with less of the limit left, an export is skipped (named in profile.json), not started
MAX_REPORT_BYTES = 6 << 20   # the reports copied to OUT_DIR, together
NO_COUNTERS = "ERR_NVGPUCTRPERM"


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
    p.add_argument("out", type=Path, help="output directory (profile.json, per run its CSV exports, report, log)")
    p.add_argument("--limit", type=float, default=180.0,
                   help="seconds for everything: the ncu runs, most important first, each followed by its exports "
                        "(default 180)")
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


def run_groups(workloads) -> list[tuple[str, tuple[str, ...]]]:
    """The ncu runs for ``workloads``: per group of :data:`RUN_GROUPS` its wanted workloads, most important first."""
    wanted = set(workloads)
    runs = [(label, tuple(w for w in names if w in wanted)) for label, names in RUN_GROUPS]
    return [(label, names) for label, names in runs if names]


def _group_alive(pgid: int) -> bool:
    """A process of group ``pgid`` still runs (zombies, such as an ended ncu not yet reaped, left out)."""
    return any((st := proc_stat(p)) is not None and st[2] == str(pgid) and st[0] != "Z" for p in proc_pids())


def _ended(proc: subprocess.Popen) -> bool:
    """``proc`` has ended, without reaping it: while it is a zombie its pid stays its group's id, safe to signal."""
    if not hasattr(os, "waitid"):    # not Linux: reaped, and its group then left alone
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:      # reaped already
        return True


def _ncu_pids(pid: int) -> list[int]:
    """``pid`` (ncu as started) and the processes under it that are ncu too: an installation's ``ncu`` may be a
    shell script that runs the binary as its child (a shell waiting for a child does not pass SIGINT on)."""
    def named_ncu(p: int) -> bool:
        return any(Path(a).name == "ncu" for a in proc_cmdline(p)[:2])   # the binary, or a script under its shell
    return [pid] + [p for p in process_tree(pid)[1:] if named_ncu(p)]


def stop_ncu(proc: subprocess.Popen, grace: float | None = None) -> None:
    """Stop a run at its limit: ncu alone (:func:`_ncu_pids`) gets SIGINT and ``grace`` seconds
    (:data:`NCU_INT_GRACE_S`) to end, since it writes its report only when it ends; then its process group (the
    profiled program, what is left) gets each signal of :data:`GROUP_STOP_LADDER` in turn until none of it runs.
    ``proc`` is reaped on the way out."""
    grace = NCU_INT_GRACE_S if grace is None else grace
    pgid = proc.pid
    for pid in _ncu_pids(proc.pid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)
    end = time.monotonic() + grace
    while not _ended(proc) and time.monotonic() < end:
        time.sleep(0.05)
    for sig, wait in GROUP_STOP_LADDER:
        if _ended(proc) and not _group_alive(pgid):
            break
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)
        end = time.monotonic() + wait
        while (not _ended(proc) or _group_alive(pgid)) and time.monotonic() < end:
            time.sleep(0.05)
    proc.wait()


def run_ncu(argv: list[str], limit: float, log: Path) -> int:
    """One ncu run in a session of its own, its output to ``log``: its exit status, or 124 where it was stopped at
    ``limit`` seconds (:func:`stop_ncu`). Interrupted (a stop from outside), its group is killed at once before the
    exception goes on (this process may have but a few seconds left)."""
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                preexec_fn=die_with_parent(), env={**os.environ, "PYTHONUNBUFFERED": "1", **NCU_ENV})
        try:
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                stop_ncu(proc)        # a stop from outside in its graces: killed below all the same
                return 124
        except BaseException:
            _kill_group(proc)
            raise
    return 128 - rc if rc < 0 else rc


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to ``proc``'s whole group, then reap it. Not after it was reaped: its id could name another group by
    then (before, ended or not, it still names its own)."""
    if proc.returncode is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


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
        return _profile(args, ncu, lib, Path(tmp), deadline)


STATUSES = ("profiled", "cut", "failed", "not_started", "interrupted")


def _profile(args, ncu: str, lib: str, tmp: Path, deadline: float) -> int:
    """The runs of :func:`run_groups` in turn, each exported and read as it ends (see the module docstring)."""
    doc: dict = {"ncu": ncu, "lib": lib, "sections": list(SECTIONS), "workloads": list(args.workloads)}
    runs = [{"label": label, "workloads": list(names), "status": "not_started"}
            for label, names in run_groups(args.workloads)]
    doc["runs"] = runs
    launches: list[dict] = []
    doc["launches"] = launches
    copied = 0

    def save(final: bool = False) -> None:   # after each step: a stop from outside keeps what is done
        for status in STATUSES:
            doc[status] = [w for r in runs if r["status"] == status for w in r["workloads"]]
        doc["ok"] = bool(runs) and all(r["status"] == "profiled" for r in runs)
        body = doc if final else {**doc, "partial": True}
        atomic_write_text(args.out / "profile.json", json.dumps(body, indent=1))

    why_not = None    # set once the later runs are not to start
    current = None
    try:
        for i, run in enumerate(runs):
            left = deadline - time.monotonic() - 2          # the final write and the exit
            limit = left - RUN_RESERVE_S - NCU_INT_GRACE_S - sum(g for _, g in GROUP_STOP_LADDER)
            if i == 0:
                limit = max(limit, MIN_PROFILE_S)
            elif why_not is None and limit < MIN_PROFILE_S:
                why_not = f"{max(left, 0):.0f} s of the limit left"
            if why_not is not None:
                run["why"] = why_not
                print(f"profile: {run['label']}: not started ({why_not})", flush=True)
                continue
            current = run
            copied += _one_run(args, ncu, lib, tmp, deadline, run, round(limit, 1), launches, save,
                               MAX_REPORT_BYTES - copied)
            current = None
            if any(NO_COUNTERS in e for e in run.get("ncu_errors", ())):
                why_not = "the performance counters are not accessible (ERR_NVGPUCTRPERM)"
    except BaseException:
        if current is not None:
            current["status"] = "interrupted"
        save()
        raise
    save(final=True)
    for status in ("cut", "failed", "not_started"):
        if doc[status]:
            print(f"profile: {status}: {', '.join(doc[status])}", flush=True)
    return 0 if doc["ok"] else 1


def _one_run(args, ncu: str, lib: str, tmp: Path, deadline: float, run: dict, limit: float, launches: list,
             save, room: int) -> int:
    """One ncu run (``run``: its record, filled in here), its exports and launches; returns the bytes of the report
    copied to OUT_DIR (where it fits in ``room``)."""
    label, names = run["label"], run["workloads"]
    report, manifest = tmp / f"profile-{label}.ncu-rep", tmp / f"profile-{label}-manifest.json"
    log = args.out / f"profile-{label}-ncu.log"
    run.update(status="running", limit=limit, launches=0)
    save()
    print(f"profile: {label} ({', '.join(names)}; limit {limit:.0f} s)", flush=True)
    t0 = time.monotonic()
    rc = run_ncu(profile_argv(ncu, report, manifest, lib, names), limit, log)
    run.update(exit=rc, seconds=round(time.monotonic() - t0, 1))
    text = log.read_text(errors="replace")
    run["ncu_errors"] = [ln for ln in text.splitlines() if ln.startswith("==ERROR==")][:10]
    with contextlib.suppress(OSError, ValueError):
        run["ran"] = json.loads(manifest.read_text())
    print(f"profile: {label}: ncu exit {rc} after {run['seconds']} s", flush=True)
    for ln in run["ncu_errors"]:
        print(f"  {ln}", flush=True)
    status = "cut" if rc == 124 else "failed"
    run["status"] = status          # until its report is read
    if not report.is_file():
        save()
        return 0
    exports: dict = {}
    texts: dict = {}
    run["exports"] = exports
    pages = ["raw"] + (["nvtx"] if len(names) > 1 else []) + ["source", "details"]
    for page in pages:
        left = deadline - time.monotonic() - 2      # the final write and the exit
        if left < EXPORT_SKIP_S:
            exports[page] = {"exit": None, "skipped": f"{max(left, 0):.0f} s of the limit left"}
            print(f"profile: {label}: export {page}: skipped ({exports[page]['skipped']})", flush=True)
            continue
        exports[page], texts[page] = export(ncu, report, page, args.out / f"profile-{label}-{page}.csv",
                                            min(left, EXPORT_LIMIT_S))
        print(f"profile: {label}: export {page}: exit {exports[page]['exit']}"
              + (f" ({exports[page]['error']})" if "error" in exports[page] else ""), flush=True)
        save()
    size = report.stat().st_size
    run["report_bytes"] = size
    kept = size if size <= room else 0
    if kept:
        shutil.copyfile(report, args.out / f"profile-{label}.ncu-rep")
    run["report_copied"] = bool(kept)
    raw = texts.get("raw")
    found = summarize(raw, texts.get("source"), texts.get("nvtx")) if raw else []
    for d in found:
        d["run"] = label
        if d["workload"] is None and len(names) == 1:     # a run of one workload: every launch is its
            d["workload"] = names[0]
    launches += found
    run["launches"] = len(found)
    if rc == 0 and found:
        run["status"] = "profiled"
    save()
    for d in found:
        stalls = ", ".join(f"{k} {v:.1f}" for k, v in d["stalls_per_issue"].items())
        dur = d.get("duration_ns")
        nan = float("nan")
        print(f"  {d.get('workload') or '?':13s} {(d['kernel'] or '')[:48]:48s} "
              f"{dur / 1e3 if dur is not None else nan:9.1f} us  DRAM {d.get('dram_pct_peak', nan):5.1f}%"
              f"  SM {d.get('sm_pct_peak', nan):5.1f}%  occupancy {d.get('achieved_occupancy_pct', nan):5.1f}%"
              f"  stalls: {stalls}", flush=True)
    return kept


if __name__ == "__main__":
    sys.exit(main())
