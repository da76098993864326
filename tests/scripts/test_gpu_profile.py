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
FAKE = r'''#!{py}
import os, sys, time
args = sys.argv[1:]
with open(os.environ["CALLS"], "a") as fh:
    fh.write(" ".join(args) + "\n")
mode = os.environ.get("MODE", "ok")
if "--import" in args:
    if "--page" in args and args[args.index("--page") + 1] == "source":
        if mode == "nosource":
            print("==ERROR== Option '--page source' is not supported", file=sys.stderr)
            sys.exit(1)
        sys.stdout.write(open(os.environ["SOURCE"]).read())
    elif "--print-nvtx-rename" in args:
        raw = open(os.environ["RAW"]).read()
        raw = raw.replace("void pairwiseScanKernel<BF16>(ScanArgs<unsigned short>)", "df2prof_scan_greedy/")
        sys.stdout.write(raw.replace("void gdnRecurrentKernel<BF16>(GdnArgs)", "df2prof_gdn_forward/"))
    elif args[args.index("--page") + 1] == "raw":
        sys.stdout.write(open(os.environ["RAW"]).read())
    else:
        print('"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"')
        print('"0","pairwiseScanKernel<BF16>","GPU Speed Of Light Throughput","Duration","ns","9,876"')
    sys.exit(0)
assert args[:4] == ["--clock-control", "none", "--nvtx", "--nvtx-include"], args
i = args.index("--profile-workloads")
assert args[i - 1].endswith("gpu_check.py") and args[i + 2] == "--only" and args[-2:] == ["--lib", "/cache/lib.so"], args
with open(os.environ["CALLS"] + ".only", "w") as fh:
    fh.write(args[i + 3])
print("==PROF== Connected to process 4242")
if mode == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
    sys.exit(0)
if mode == "hang":
    open(os.environ["CALLS"] + ".pid", "w").write(str(os.getpid()))
    print("hanging", flush=True)
    time.sleep(60)
rep = args[args.index("--export") + 1]
open(rep, "wb").write(b"NCU-REPORT" * (200 if mode != "big" else 2 << 20))
print("==PROF== Report: " + rep)
'''


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


def test_profile_exports_and_summary(tmp_path, fake, capsys):
    out = tmp_path / "prof"
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "60"]) == 0
    doc = json.loads((out / "profile.json").read_text())
    assert doc["ok"] and doc["profile"]["exit"] == 0 and doc["profile"]["ncu_errors"] == []
    calls = fake.read_text().splitlines()
    run = calls[0].split()
    assert [run[i + 1] for i, a in enumerate(run) if a == "--nvtx-include"] == [f"df2prof_{w}/"
                                                                                for w in P.DEFAULT_WORKLOADS]
    assert Path(str(fake) + ".only").read_text() == ",".join(P.DEFAULT_WORKLOADS)
    assert [run[i + 1] for i, a in enumerate(run) if a == "--section"] == list(P.SECTIONS)
    assert len(calls) == 5 and all("--import" in c and "--csv" in c for c in calls[1:])
    assert {p.name for p in out.iterdir()} >= {"profile.json", "profile-raw.csv", "profile-nvtx.csv",
                                                "profile-source.csv", "profile-details.csv", "profile-ncu.log",
                                                "profile.ncu-rep"}
    scan, gdn = doc["launches"]
    assert scan["workload"] == "scan_greedy" and gdn["workload"] == "gdn_forward"
    assert scan["duration_ns"] == 9876 and scan["registers"] == 121 and scan["achieved_occupancy_pct"] == 11.9
    assert scan["shared_bank_conflicts"] == 1040 and gdn["shared_bank_conflicts"] == 0
    assert "--metrics" in run and all(m in run[run.index("--metrics") + 1] for m in P.METRICS)
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
    monkeypatch.setenv("MODE", "perm")
    out = tmp_path / "prof"
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "60"]) == 1
    doc = json.loads((out / "profile.json").read_text())
    assert doc["ok"] is False and doc["launches"] == [] and doc["exports"] == {}
    assert doc["profile"]["ncu_errors"][0].startswith("==ERROR== ERR_NVGPUCTRPERM")
    assert len(fake.read_text().splitlines()) == 1                 # no report: nothing to export


def test_a_page_ncu_cannot_export_leaves_the_others(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("MODE", "nosource")
    out = tmp_path / "prof"
    out.mkdir()
    (out / "profile-source.csv").write_text(SOURCE)      # an earlier run's export in the same folder: not read
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "60"]) == 0
    doc = json.loads((out / "profile.json").read_text())
    assert doc["exports"]["source"]["exit"] == 1 and "not supported" in doc["exports"]["source"]["error"]
    assert (out / "profile-source.csv").read_text() == SOURCE           # left as it was, not rewritten
    assert [d["workload"] for d in doc["launches"]] == ["scan_greedy", "gdn_forward"]
    assert all("top_sass" not in d for d in doc["launches"])


def test_a_report_too_large_to_bring_back_stays_behind(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("MODE", "big")
    monkeypatch.setattr(P, "MAX_REPORT_BYTES", 1 << 20)
    out = tmp_path / "prof"
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "60"]) == 0
    doc = json.loads((out / "profile.json").read_text())
    assert doc["report_bytes"] > 1 << 20 and not (out / "profile.ncu-rep").exists()


def test_a_hang_is_stopped_with_its_group(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("MODE", "hang")
    monkeypatch.setattr(P, "EXPORT_MIN_S", 0.5)
    monkeypatch.setattr(P, "MIN_PROFILE_S", 1.0)
    out = tmp_path / "prof"
    t0 = time.monotonic()
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "2"]) == 1
    assert time.monotonic() - t0 < 2 + 8            # stopped at its limit (SIGTERM, then SIGKILL after 5 s)
    doc = json.loads((out / "profile.json").read_text())
    assert doc["profile"]["exit"] == 124
    pid = int(Path(str(fake) + ".pid").read_text())
    assert not process_alive(pid)


def test_without_ncu_or_with_a_bad_limit_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, "find_ncu", lambda: None)
    assert P.main([str(tmp_path / "o")]) == 2
    assert "ncu) not found" in capsys.readouterr().err
    assert P.main([str(tmp_path / "o"), "--limit", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --limit")
    assert not (tmp_path / "o").exists()


def test_workloads_picked_and_refused(tmp_path, fake, capsys):
    """--workloads all asks for every range gpu_check opens, in its order; an unknown name is one error line."""
    assert P.main([str(tmp_path / "p"), "--lib", "/cache/lib.so", "--workloads", "all", "--limit", "60"]) == 0
    run = fake.read_text().splitlines()[0].split()
    assert [run[i + 1] for i, a in enumerate(run) if a == "--nvtx-include"] == [f"df2prof_{w}/" for w in P.WORKLOADS]
    assert P.main([str(tmp_path / "q"), "--workloads", "scan_greedy,gdn_everything"]) == 2
    assert capsys.readouterr().err.startswith("error: --workloads:") and not (tmp_path / "q").exists()
    G = P._GC
    assert G.profile_workloads(None, only=[]) == []             # nothing wanted: no inputs made, no GPU touched
    with pytest.raises(ValueError, match="gdn_everything"):
        G.profile_workloads(None, only=["gdn_everything"])


def test_the_workloads_are_gpu_checks_own():
    """profile.py asks ncu for the ranges that gpu_check.py's profile_workloads opens (one list: it checks its calls
    against it before it runs them)."""
    text = (ROOT / "scripts" / "gpu_check" / "gpu_check.py").read_text()
    assert P.WORKLOADS == P._GC.PROFILE_WORKLOADS and len(P.WORKLOADS) == 11
    assert "!= PROFILE_WORKLOADS" in text[text.index("def profile_workloads"):text.index("def main")]
    assert set(P.DEFAULT_WORKLOADS) <= set(P.WORKLOADS)


def test_a_stop_during_the_exports_keeps_profile_json(tmp_path, fake, monkeypatch):
    """Stopped from outside in an export (its part's limit): profile.json is already there, with the profiling run's
    status and the exports done, marked partial."""
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
    assert doc["partial"] is True and doc["profile"]["exit"] == 0 and list(doc["exports"]) == ["raw"]


def test_exports_the_limit_cannot_hold_are_skipped_not_started(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(P, "EXPORT_SKIP_S", 1e6)
    out = tmp_path / "prof"
    assert P.main([str(out), "--lib", "/cache/lib.so", "--limit", "60"]) == 1
    doc = json.loads((out / "profile.json").read_text())
    assert all("skipped" in e and e["exit"] is None for e in doc["exports"].values()) and len(doc["exports"]) == 4
    assert len(fake.read_text().splitlines()) == 1 and doc["ok"] is False and "partial" not in doc
