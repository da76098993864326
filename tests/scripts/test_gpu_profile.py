"""scripts/gpu_check/profile.py (``gpu_check.sh --profile``): the timed workloads under Nsight Compute. There is neither
a GPU nor ncu here, so what is tested is the orchestration and the reading of ncu's CSV exports: the profiling run
asked for the workloads' NVTX ranges with the clocks left alone, the four exports, the headline numbers, stall
reasons and stalling SASS lines read into profile.json and matched to their workloads, ncu's errors (no permission
for the counters) reported, a hang stopped with its group, one error line without ncu. A stand-in ``ncu`` on PATH
writes a report and prints exports shaped as ncu's CSV pages are (raw: a header row of metric names, a units row,
one row per launch; source: one table per launch with its SASS). Whether the counters say anything true is only
known from a GPU run."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

from dflash2_trt.testing.processes import process_alive

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check" / "profile.py"


def _load():
    spec = importlib.util.spec_from_file_location("dflash2_gpu_profile", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


P = _load()

RAW = '''"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum","launch__registers_per_thread","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_selected_per_issue_active.ratio","smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio"
"","","","","","","","","","","","%","ns","","","register/thread","%","inst","inst","inst","inst"
"0","4242","python3","127.0.0.1","{k0}","1","7","(256, 1, 1)","(128, 1, 1)","0","9.0","3.52","9,876","1,024","16","121","11.9","2.25","0.5","1","1.75"
"1","4242","python3","127.0.0.1","{k1}","1","7","(128, 1, 1)","(6144, 1, 1)","0","9.0","41.07","297,215","0","0","168","18.6","0.1","3.5","1","0"
'''
# as ncu 2025 prints it: a "Kernel Name" row (with a trailing comma) before each launch's table; cells padded
SOURCE = '''"Kernel Name","void pairwiseScanKernel<BF16>(ScanArgs<unsigned short>)",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed"
"0x7f00","      BAR.SYNC.DEFER_BLOCKING 0x0  ","120","118","512"
"0x7f10","      LDS.128 R4, [R2]  ","30","25","8192"
"0x7f20","      FFMA R8, R4, R5, R8  ","10","2","65536"
"Kernel Name","void gdnRecurrentKernel<BF16>(GdnArgs)",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed"
"0x1000","      LDG.E.128 R4, [R2.64]  ","900","880","49152"
"0x1010","      FFMA R8, R4, R5, R8  ","100","10","3145728"
'''
# a stand-in ncu. The profiling run writes the workloads it was asked for (--only) into its report, appends them to
# $CALLS.only and, for a workload named in $HANG, starts a child (the profiled program) and hangs: on SIGINT it
# writes its report and ends where $INT_SAVES is set, else ignores it (only a signal to its group ends it). The
# exports read the report: per workload one launch, a scan row or a GDN row of RAW (the conv's as a scan's)
FAKE = r"""#!{py}
import os, signal, subprocess, sys, time
args = sys.argv[1:]
with open(os.environ["CALLS"], "a") as fh:
    fh.write(" ".join(args) + "\n")
mode = os.environ.get("MODE", "ok")
ROW = {"scan": 2, "gdn": 3, "conv": 2}
if "--import" in args:
    names = open(args[args.index("--import") + 1]).read().split()
    raw = open(os.environ["RAW"]).read().splitlines()
    page = args[args.index("--page") + 1]
    if page == "source":
        if mode == "nosource":
            print("==ERROR== Option '--page source' is not supported", file=sys.stderr)
            sys.exit(1)
        tables = open(os.environ["SOURCE"]).read().split('"Kernel Name",')
        sys.stdout.write("".join('"Kernel Name",' + tables[1 if n.startswith(("scan", "conv")) else 2] for n in names))
    elif page == "raw":
        rows = raw[:2]
        for i, n in enumerate(names):
            row = raw[ROW[n.split("_")[0]]]
            row = '"%d"' % i + row[row.index(","):]
            if "--print-nvtx-rename" in args:
                row = row.replace("void pairwiseScanKernel<BF16>(ScanArgs<unsigned short>)", "df2prof_%s/" % n)
                row = row.replace("void gdnRecurrentKernel<BF16>(GdnArgs)", "df2prof_%s/" % n)
            rows.append(row)
        sys.stdout.write("\n".join(rows) + "\n")
    else:
        print('"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"')
        print('"0","pairwiseScanKernel<BF16>","GPU Speed Of Light Throughput","Duration","ns","9,876"')
    sys.exit(0)
assert args[:4] == ["--clock-control", "none", "--nvtx", "--nvtx-include"], args
i = args.index("--profile-workloads")
assert args[i - 1].endswith("gpu_check.py") and args[i + 2] == "--only" and args[-2:] == ["--lib", "/cache/lib.so"], args
only = args[i + 3].split(",")
with open(os.environ["CALLS"] + ".only", "a") as fh:
    fh.write(args[i + 3] + "\n")
print("==PROF== Connected to process 4242")
if mode == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
    sys.exit(0)
rep = args[args.index("--export") + 1]
def save(*_):
    open(rep, "w").write(" ".join(only) + " " * (0 if mode != "big" else 2 << 20))
    print("==PROF== Report: " + rep, flush=True)
if set(only) & set(os.environ.get("HANG", "").split(",")):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(os.environ["CALLS"] + ".pid", "w").write("%d %d" % (os.getpid(), child.pid))
    def on_int(*_):
        open(os.environ["CALLS"] + ".sig", "a").write("INT\n")
        if os.environ.get("INT_SAVES"):
            save()
            child.kill()
            sys.exit(0)
    def on_term(*_):
        open(os.environ["CALLS"] + ".sig", "a").write("TERM\n")
        sys.exit(143)
    signal.signal(signal.SIGINT, on_int)
    signal.signal(signal.SIGTERM, on_term)
    print("hanging", flush=True)
    for _ in range(600):
        time.sleep(0.1)
save()
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "ncu"
    tool.write_text(FAKE.replace("{py}", sys.executable))
    tool.chmod(0o755)
    calls = tmp_path / "calls.txt"
    raw = tmp_path / "raw.csv"
    raw.write_text(RAW.format(k0="void pairwiseScanKernel<BF16>(ScanArgs<unsigned short>)",
                              k1="void gdnRecurrentKernel<BF16>(GdnArgs)"))
    src = tmp_path / "source.csv"
    src.write_text(SOURCE)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for k, v in (("CALLS", calls), ("RAW", raw), ("SOURCE", src)):
        monkeypatch.setenv(k, str(v))
    return calls


def _runs(calls: Path) -> list[list[str]]:
    """The profiling runs' argv, in order (the exports left out)."""
    return [c.split() for c in calls.read_text().splitlines() if c.startswith("--clock-control")]


def _included(run: list[str]) -> list[str]:
    return [run[i + 1] for i, a in enumerate(run) if a == "--nvtx-include"]


DEFAULT_RUNS = [("gdn_forward", ["gdn_forward"]), ("gdn_forward_prefetch", ["gdn_forward_prefetch"]),
                ("gdn_commit", ["gdn_commit"]), ("conv", ["conv_unfused"]), ("scan", ["scan_greedy", "scan_sample"])]


def test_profile_exports_and_summary(tmp_path, fake, capsys):
    """One ncu run per group, the GDN forward first, each with its own report, exports and log; every launch read
    into profile.json with its workload."""
    out = tmp_path / "prof"
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "60"]) == 0
    doc = json.loads((out / "profile.json").read_text())
    assert doc["ok"] and "partial" not in doc and doc["cut"] == doc["failed"] == doc["not_started"] == []
    assert [(r["label"], r["workloads"]) for r in doc["runs"]] == DEFAULT_RUNS
    assert all(r["status"] == "profiled" and r["exit"] == 0 and r["ncu_errors"] == [] for r in doc["runs"])
    assert doc["profiled"] == [w for _, ws in DEFAULT_RUNS for w in ws]
    assert sorted(doc["profiled"]) == sorted(P.DEFAULT_WORKLOADS)
    runs = _runs(fake)
    assert [_included(r) for r in runs] == [[f"df2prof_{w}/" for w in ws] for _, ws in DEFAULT_RUNS]
    assert Path(str(fake) + ".only").read_text().split() == [",".join(ws) for _, ws in DEFAULT_RUNS]
    assert all([r[i + 1] for i, a in enumerate(r) if a == "--section"] == list(P.SECTIONS) for r in runs)
    calls = fake.read_text().splitlines()
    # per run: raw, source, details; the nvtx page only for the run of several workloads
    assert len(calls) == 5 + 5 * 3 + 1 and sum("--print-nvtx-rename" in c for c in calls) == 1
    names = {p.name for p in out.iterdir()}
    for label, ws in DEFAULT_RUNS:
        assert {f"profile-{label}-{x}" for x in ("raw.csv", "source.csv", "details.csv", "ncu.log")} <= names
        assert f"profile-{label}.ncu-rep" in names
    assert "profile-scan-nvtx.csv" in names and "profile-gdn_forward-nvtx.csv" not in names
    launches = doc["launches"]
    assert [d["workload"] for d in launches] == doc["profiled"]
    assert [d["run"] for d in launches] == [label for label, ws in DEFAULT_RUNS for _ in ws]
    gdn, scan = launches[0], launches[-2]
    assert scan["workload"] == "scan_greedy" and gdn["workload"] == "gdn_forward"
    assert scan["duration_ns"] == 9876 and scan["registers"] == 121 and scan["achieved_occupancy_pct"] == 11.9
    assert scan["shared_bank_conflicts"] == 1040 and gdn["shared_bank_conflicts"] == 0
    assert "--metrics" in runs[0] and all(m in runs[0][runs[0].index("--metrics") + 1] for m in P.METRICS)
    assert gdn["dram_pct_peak"] == 41.07 and gdn["grid"] == "(6144, 1, 1)"
    assert list(scan["stalls_per_issue"]) == ["barrier", "short_scoreboard", "long_scoreboard"]
    assert list(gdn["stalls_per_issue"]) == ["long_scoreboard", "barrier"]   # a zero is not a reason, 'selected' none
    assert scan["top_sass"][0]["sass"] == "BAR.SYNC.DEFER_BLOCKING 0x0" and scan["top_sass"][0]["share"] == 0.75
    assert gdn["top_sass"][0] == {"address": "0x1000", "sass": "LDG.E.128 R4, [R2.64]", "samples": 900.0,
                                  "executed": 49152.0, "share": 0.9}
    text = capsys.readouterr().out
    assert "scan_greedy" in text and "long_scoreboard 3.5" in text


def test_source_tables_named_by_function_are_matched_by_name():
    """Where the source page gives one table per function (a "Function Name" row before each), not one per launch,
    the tables go to the launches of that function by name."""
    raw = RAW.format(k0="void pairwiseScanKernel<BF16>(ScanArgs<unsigned short>)",
                     k1="void gdnRecurrentKernel<BF16>(GdnArgs)")
    raw += raw.splitlines()[2].replace('"0","4242"', '"2","4242"') + "\n"       # a second scan launch
    tables = SOURCE.split('"Kernel Name",')
    source = '"Kernel Name",' + tables[2] + '"Kernel Name",' + tables[1]        # one per function, other order
    launches = P.summarize(raw, source, None)
    assert [d["id"] for d in launches] == ["0", "1", "2"]
    assert launches[0]["top_sass"][0]["sass"].startswith("BAR.SYNC") and launches[2]["top_sass"] == launches[0]["top_sass"]
    assert launches[1]["top_sass"][0]["sass"].startswith("LDG.E.128")


def test_no_permission_for_the_counters_is_reported(tmp_path, fake, monkeypatch):
    """ncu without access to the counters: the first run fails with ncu's error line and the later runs, which would
    fail the same way, are not started."""
    monkeypatch.setenv("MODE", "perm")
    out = tmp_path / "prof"
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "60"]) == 1
    doc = json.loads((out / "profile.json").read_text())
    assert doc["ok"] is False and doc["launches"] == [] and doc["profiled"] == []
    first, *rest = doc["runs"]
    assert first["status"] == "failed" and "exports" not in first
    assert first["ncu_errors"][0].startswith("==ERROR== ERR_NVGPUCTRPERM")
    assert rest and all(r["status"] == "not_started" and "ERR_NVGPUCTRPERM" in r["why"] for r in rest)
    assert doc["failed"] == ["gdn_forward"] and len(doc["not_started"]) == len(P.DEFAULT_WORKLOADS) - 1
    assert len(fake.read_text().splitlines()) == 1                 # no report: nothing to export


def test_a_page_ncu_cannot_export_leaves_the_others(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("MODE", "nosource")
    out = tmp_path / "prof"
    out.mkdir()
    (out / "profile-gdn_forward-source.csv").write_text(SOURCE)      # an earlier run's export in the folder: not read
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "60"]) == 0
    doc = json.loads((out / "profile.json").read_text())
    for r in doc["runs"]:
        assert r["exports"]["source"]["exit"] == 1 and "not supported" in r["exports"]["source"]["error"]
    assert (out / "profile-gdn_forward-source.csv").read_text() == SOURCE           # left as it was, not rewritten
    assert [d["workload"] for d in doc["launches"]] == [w for _, ws in DEFAULT_RUNS for w in ws]
    assert all("top_sass" not in d for d in doc["launches"])


def test_reports_are_copied_while_they_fit_together(tmp_path, fake, monkeypatch):
    """The reports come back in run order while their sum stays under MAX_REPORT_BYTES (the device tool's 16 MiB, the
    archive of every part included); profile.json gives each one's size and whether it was copied."""
    monkeypatch.setenv("MODE", "big")          # each report ~2 MiB
    monkeypatch.setattr(P, "MAX_REPORT_BYTES", 5 << 20)
    out = tmp_path / "prof"
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "60"]) == 0
    doc = json.loads((out / "profile.json").read_text())
    assert all(r["report_bytes"] > 2 << 20 for r in doc["runs"])
    assert [r["report_copied"] for r in doc["runs"]] == [True, True, False, False, False]
    assert sorted(p.name for p in out.glob("*.ncu-rep")) == ["profile-gdn_forward.ncu-rep",
                                                             "profile-gdn_forward_prefetch.ncu-rep"]


def _quick(monkeypatch):
    """The stop and the reserves in fractions of a second, for runs stopped at their limits."""
    monkeypatch.setattr(P, "NCU_INT_GRACE_S", 1.5)
    monkeypatch.setattr(P, "GROUP_STOP_LADDER", ((P.signal.SIGTERM, 1.5), (P.signal.SIGKILL, 1.0)))
    monkeypatch.setattr(P, "RUN_RESERVE_S", 0.5)
    monkeypatch.setattr(P, "MIN_PROFILE_S", 1.5)
    monkeypatch.setattr(P, "EXPORT_SKIP_S", 0.3)


def _signals(fake: Path) -> list[str]:
    f = Path(str(fake) + ".sig")
    return f.read_text().split("\n")[:-1] if f.exists() else []


def test_a_run_cut_at_its_limit_costs_only_the_runs_it_did_not_reach(tmp_path, fake, monkeypatch):
    """The reviewer's case: the second run (the prefetching GDN forward) hangs. The first run's report is read and
    kept; the hanging ncu gets SIGINT alone first, ends and writes its report (read: its launch is there, its run
    marked cut); the runs after it, which the limit no longer holds, are named as not started."""
    _quick(monkeypatch)
    monkeypatch.setenv("HANG", "gdn_forward_prefetch")
    monkeypatch.setenv("INT_SAVES", "1")
    out = tmp_path / "prof"
    t0 = time.monotonic()
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "12"]) == 1
    assert time.monotonic() - t0 < 12 + 2
    doc = json.loads((out / "profile.json").read_text())
    assert [r["status"] for r in doc["runs"]] == ["profiled", "cut", "not_started", "not_started", "not_started"]
    assert doc["profiled"] == ["gdn_forward"] and doc["cut"] == ["gdn_forward_prefetch"]
    assert doc["not_started"] == ["gdn_commit", "conv_unfused", "scan_greedy", "scan_sample"]
    cut = doc["runs"][1]
    assert cut["exit"] == 124 and cut["launches"] == 1 and cut["exports"]["raw"]["exit"] == 0
    assert all("limit left" in r["why"] for r in doc["runs"][2:])
    assert [d["workload"] for d in doc["launches"]] == ["gdn_forward", "gdn_forward_prefetch"]
    assert _signals(fake) == ["INT"]                  # ncu ended on SIGINT: its group never needed SIGTERM
    assert (out / "profile-gdn_forward_prefetch-raw.csv").is_file() and doc["ok"] is False
    ncu_pid, child = map(int, Path(str(fake) + ".pid").read_text().split())
    assert not process_alive(ncu_pid) and not process_alive(child)


def test_an_ncu_that_is_a_shell_script_gets_its_sigint_too(tmp_path, fake, monkeypatch):
    """An installation's ncu may be a shell script running the binary as its child (a shell waiting for a child does
    not pass SIGINT on): the binary under it gets the SIGINT as well, ends and writes its report."""
    _quick(monkeypatch)
    monkeypatch.setenv("HANG", "gdn_forward")
    monkeypatch.setenv("INT_SAVES", "1")
    real = tmp_path / "real" / "ncu"
    real.parent.mkdir()
    fake.with_name("bin").joinpath("ncu").rename(real)
    wrapper = fake.with_name("bin") / "ncu"
    wrapper.write_text(f'#!/bin/bash\n"{real}" "$@"\necho "wrapper: $?"\n')
    wrapper.chmod(0o755)
    out = tmp_path / "prof"
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "8", "--workloads", "gdn_forward"]) == 1
    doc = json.loads((out / "profile.json").read_text())
    (run,) = doc["runs"]
    assert run["status"] == "cut" and run["launches"] == 1 and _signals(fake) == ["INT"]
    assert "wrapper: 0" in (out / "profile-gdn_forward-ncu.log").read_text()


# the profiled program as the stand-in starts it, saying which signals it got
CHILD = ("import signal, sys, time, os; f = os.environ['CALLS'] + '.sig'; "
         "[signal.signal(s, lambda n, _: (open(f, 'a').write('child ' + signal.Signals(n).name[3:] + chr(10)), "
         "sys.exit(1))) for s in (signal.SIGINT, signal.SIGTERM)]; time.sleep(60)")


def test_ncu_deaf_to_sigint_is_stopped_with_its_group(tmp_path, fake, monkeypatch):
    """ncu that does not end on SIGINT: after its grace the group (ncu and the program it profiles) gets SIGTERM;
    the SIGINT went to ncu alone."""
    _quick(monkeypatch)
    monkeypatch.setenv("HANG", "gdn_forward")
    fake.with_name("bin").joinpath("ncu").write_text(
        FAKE.replace("{py}", sys.executable).replace('"import time; time.sleep(60)"', repr(CHILD)))
    out = tmp_path / "prof"
    t0 = time.monotonic()
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "6", "--workloads", "gdn_forward"]) == 1
    assert time.monotonic() - t0 < 6 + 4
    doc = json.loads((out / "profile.json").read_text())
    (run,) = doc["runs"]
    assert run["status"] == "cut" and run["exit"] == 124 and "exports" not in run and doc["cut"] == ["gdn_forward"]
    assert sorted(_signals(fake)) == ["INT", "TERM", "child TERM"]
    ncu_pid, child = map(int, Path(str(fake) + ".pid").read_text().split())
    assert not process_alive(ncu_pid) and not process_alive(child)


def test_a_stop_from_outside_kills_the_running_ncu_and_keeps_profile_json(tmp_path, fake):
    """run_all's limit (SIGTERM to profile.py) in the middle of a run: the run's group is killed at once (ncu is in a
    session of its own, out of reach of a stop aimed at profile.py's), profile.json marks that run interrupted."""
    import signal
    import subprocess

    out = tmp_path / "prof"
    env = {**os.environ, "HANG": "gdn_forward_prefetch"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(out), "--lib", "/cache/lib.so", "--limit", "60"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pid_file = Path(str(fake) + ".pid")
    t0 = time.monotonic()
    while not pid_file.exists() and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    assert pid_file.exists(), proc.stderr.read() if proc.poll() is not None else "no hang"
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143
    doc = json.loads((out / "profile.json").read_text())
    assert doc["partial"] is True and [r["status"] for r in doc["runs"][:3]] == ["profiled", "interrupted",
                                                                                "not_started"]
    ncu_pid, child = map(int, pid_file.read_text().split())
    t1 = time.monotonic()
    while (process_alive(ncu_pid) or process_alive(child)) and time.monotonic() - t1 < 5:
        time.sleep(0.05)
    assert not process_alive(ncu_pid) and not process_alive(child)


def test_without_ncu_or_with_a_bad_limit_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, "find_ncu", lambda: None)
    assert P.main([str(tmp_path / "o")]) == 2
    assert "ncu) not found" in capsys.readouterr().err
    assert P.main([str(tmp_path / "o"), "--limit", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --limit")
    assert not (tmp_path / "o").exists()


def test_workloads_picked_and_refused(tmp_path, fake, capsys):
    """--workloads all asks for every range gpu_check opens, one run per group; an unknown name is one error line."""
    assert P.main([str(tmp_path / "p"), "--lib", "/cache/lib.so", "--workloads", "all", "--limit", "300"]) == 0
    runs = _runs(fake)
    assert [_included(r) for r in runs] == [[f"df2prof_{w}/" for w in ws] for _, ws in P.RUN_GROUPS]
    assert sorted(i for r in runs for i in _included(r)) == sorted(f"df2prof_{w}/" for w in P.WORKLOADS)
    doc = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert sorted(doc["profiled"]) == sorted(P.WORKLOADS) and doc["ok"]
    assert P.main([str(tmp_path / "q"), "--workloads", "scan_greedy,gdn_everything"]) == 2
    assert capsys.readouterr().err.startswith("error: --workloads:") and not (tmp_path / "q").exists()
    G = P._GC
    assert G.profile_workloads(None, only=[]) == []             # nothing wanted: no inputs made, no GPU touched
    with pytest.raises(ValueError, match="gdn_everything"):
        G.profile_workloads(None, only=["gdn_everything"])


def test_the_workloads_are_gpu_checks_own():
    """profile.py asks ncu for the ranges that gpu_check.py's profile_workloads opens (one list: it checks its calls
    against it before it runs them); its runs hold each exactly once, the GDN forward and its prefetching variant
    first."""
    text = (ROOT / "scripts" / "gpu_check" / "gpu_check.py").read_text()
    assert P.WORKLOADS == P._GC.PROFILE_WORKLOADS and len(P.WORKLOADS) == 11
    assert "!= PROFILE_WORKLOADS" in text[text.index("def profile_workloads"):text.index("def main")]
    assert set(P.DEFAULT_WORKLOADS) <= set(P.WORKLOADS)
    grouped = [w for _, ws in P.RUN_GROUPS for w in ws]
    assert sorted(grouped) == sorted(P.WORKLOADS) and len(set(grouped)) == len(grouped)
    assert [label for label, _ in P.RUN_GROUPS][:2] == ["gdn_forward", "gdn_forward_prefetch"]
    assert len({label for label, _ in P.RUN_GROUPS}) == len(P.RUN_GROUPS)
    assert P.run_groups(["scan_sample", "gdn_commit", "conv_fused"]) == [
        ("gdn_commit", ("gdn_commit",)), ("conv", ("conv_fused",)), ("scan", ("scan_sample",))]


def test_a_stop_during_the_exports_keeps_profile_json(tmp_path, fake, monkeypatch):
    """Stopped from outside in an export (its part's limit): profile.json is already there, with the run's status,
    the exports done, marked partial."""
    real, calls = P.export, []

    def export(*a, **kw):
        calls.append(a[2])
        if len(calls) == 2:
            raise SystemExit(143)
        return real(*a, **kw)

    monkeypatch.setattr(P, "export", export)
    out = tmp_path / "prof"
    with pytest.raises(SystemExit):
        P.main([str(out), "--lib", "/cache/lib.so", "--limit", "60"])
    doc = json.loads((out / "profile.json").read_text())
    first = doc["runs"][0]
    assert doc["partial"] is True and first["exit"] == 0 and list(first["exports"]) == ["raw"]
    assert first["status"] == "interrupted" and doc["interrupted"] == ["gdn_forward"]
    assert all(r["status"] == "not_started" for r in doc["runs"][1:])


def test_exports_the_limit_cannot_hold_are_skipped_not_started(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(P, "EXPORT_SKIP_S", 1e6)
    out = tmp_path / "prof"
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "60", "--workloads", "gdn_forward"]) == 1
    doc = json.loads((out / "profile.json").read_text())
    (run,) = doc["runs"]
    assert all("skipped" in e and e["exit"] is None for e in run["exports"].values()) and len(run["exports"]) == 3
    assert len(fake.read_text().splitlines()) == 1 and doc["ok"] is False and "partial" not in doc
    assert run["status"] == "failed" and doc["failed"] == ["gdn_forward"]


def test_a_run_stopped_at_its_limit_keeps_time_for_its_exports():
    """A run's limit leaves RUN_RESERVE_S after its stop: more than an export needs to be started at all (else the
    report of a cut run would never be read); inside run_all's profile part (110 s) the first run gets over a minute
    and a second one can still start after a first that took half a minute."""
    assert P.RUN_RESERVE_S > P.EXPORT_SKIP_S
    stop_s = P.NCU_INT_GRACE_S + sum(g for _, g in P.GROUP_STOP_LADDER)
    assert 110 - 2 - P.RUN_RESERVE_S - stop_s > 60
    assert 110 - 2 - 30 - P.RUN_RESERVE_S - stop_s >= P.MIN_PROFILE_S


def test_a_stop_from_outside_in_the_graces_still_kills_the_group(tmp_path, monkeypatch):
    """run_all's SIGTERM may come while a run is being stopped (in ncu's SIGINT grace): the group is killed all the
    same, nothing of it left running."""
    deaf = ("import signal, subprocess, sys, time, os; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "open(sys.argv[1], 'w').write('%d %d' % (os.getpid(), c.pid)); time.sleep(60)")
    pids = tmp_path / "pids"

    def stop_ncu(proc, grace=None):
        proc.send_signal(P.signal.SIGINT)
        raise SystemExit(143)

    monkeypatch.setattr(P, "stop_ncu", stop_ncu)
    with pytest.raises(SystemExit):
        P.run_ncu([sys.executable, "-c", deaf, str(pids)], 1.5, tmp_path / "log")
    parent, child = map(int, pids.read_text().split())
    t0 = time.monotonic()
    while process_alive(child) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert not process_alive(parent) and not process_alive(child)
