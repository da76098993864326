"""scripts/gpu_check/sanitize.py (``gpu_check.sh --sanitize``): the kernels' small cases under compute-sanitizer.
There is neither a GPU nor compute-sanitizer here, so what is tested is the orchestration around the tool: the
builds once before the tools (stubbed here), each tool in turn under its share of the limit with the kernel filter,
its exit status and summary read into sanitize.json, a tool past its share stopped with its group, a tool that
refuses the filter run again without it, a device the tool does not support said as such, a share too short
skipped, one error line without the tool. A stand-in ``compute-sanitizer`` on PATH prints what the real one prints
at the end of a run (its ``=========``-prefixed lines and summaries, as compute-sanitizer's user manual shows them)
and exits as ``--error-exitcode`` asks. Whether the kernels are clean is only known from a GPU run."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check" / "sanitize.py"


def _load():
    spec = importlib.util.spec_from_file_location("dflash2_gpu_sanitize", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


S = _load()

# memcheck clean; racecheck finds one hazard; synccheck hangs (MODE=hang) or refuses the kernel filter
# (MODE=old) or the device (MODE=gvisor); every run appends its argv to CALLS
FAKE = r'''#!{py}
import os, sys, time
args = sys.argv[1:]
with open(os.environ["CALLS"], "a") as fh:
    fh.write(" ".join(args) + "\n")
tool = args[args.index("--tool") + 1]
code = int(args[args.index("--error-exitcode") + 1])
assert args[-3:] == ["--small", "--lib", "/cache/libdf2_cuda_sm90a.so"] and args[-4].endswith("gpu_check.py"), args
mode = os.environ.get("MODE", "hang")
print("========= COMPUTE-SANITIZER")
if mode == "old" and "--kernel-name-exclude" in args:
    print("========= Error: Unrecognized option '--kernel-name-exclude'")
    sys.exit(1)
if mode == "gvisor":
    print("========= Error: Device not supported")
    sys.exit(255)
print("conv correctness vs reference (bit-exact, 18 cases): ok")
if tool == "memcheck":
    print("========= ERROR SUMMARY: 0 errors")
elif tool == "racecheck":
    print("========= Error: Race reported between Write access at dynamicConvKernel+0x1f0")
    print("=========     and Read access at dynamicConvKernel+0x2a0 [16 hazards]")
    print("========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)")
    sys.exit(code)
elif mode == "hang":
    open(os.environ["CALLS"] + ".pid", "w").write(str(os.getpid()))
    print("hanging", flush=True)
    time.sleep(60)
else:
    print("========= ERROR SUMMARY: 0 errors")
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "compute-sanitizer"
    tool.write_text(FAKE.replace("{py}", sys.executable))
    tool.chmod(0o755)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setattr(S, "prebuild", lambda: "/cache/libdf2_cuda_sm90a.so")
    monkeypatch.setattr(S, "MIN_SHARE_S", 1.0)     # the stand-in starts in well under a second
    return calls


def test_each_tool_in_turn_its_errors_read_and_a_hang_stopped(tmp_path, fake, capsys):
    out = tmp_path / "san"
    t0 = time.monotonic()
    assert S.main([str(out), "--limit", "6"]) == 1
    assert time.monotonic() - t0 < 6 + 4           # the hanging tool stopped at the end of its share
    doc = json.loads((out / "sanitize.json").read_text())
    tools = doc["tools"]
    assert list(tools) == ["memcheck", "racecheck", "synccheck"] and doc["clean"] is False
    assert tools["memcheck"]["exit"] == 0 and tools["memcheck"]["errors"] == 0 and tools["memcheck"]["clean"]
    assert tools["racecheck"]["exit"] == S.ERROR_EXIT and tools["racecheck"]["errors"] == 1
    assert not tools["racecheck"]["clean"]
    assert tools["racecheck"]["first_lines"][0].startswith("========= Error: Race reported")
    assert tools["synccheck"]["exit"] == 124 and tools["synccheck"]["errors"] is None
    assert not tools["synccheck"]["clean"]
    calls = fake.read_text().splitlines()
    assert len(calls) == 3 and all("--kernel-name-exclude kns=native" in c for c in calls)
    for t in tools:
        assert (out / f"sanitize-{t}.log").read_text()
    assert "sanitize racecheck: exit 86, errors 1" in capsys.readouterr().out
    pid = int(Path(str(fake) + ".pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)                             # the stopped tool is gone, not left running


def test_without_the_kernel_filter_where_the_tool_refuses_it(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("MODE", "old")
    out = tmp_path / "san"
    assert S.main([str(out), "--tools", "memcheck,synccheck", "--limit", "60"]) == 0
    doc = json.loads((out / "sanitize.json").read_text())
    assert doc["clean"] is True
    assert [t["kernel_filter"] for t in doc["tools"].values()] == [False, False]
    calls = fake.read_text().splitlines()
    assert ["--kernel-name-exclude" in c for c in calls] == [True, False, False]   # refused once, then never asked again


def test_a_device_the_tool_does_not_support_is_said_so(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("MODE", "gvisor")
    out = tmp_path / "san"
    assert S.main([str(out), "--tools", "memcheck", "--limit", "30"]) == 1
    rec = json.loads((out / "sanitize.json").read_text())["tools"]["memcheck"]
    assert rec["unsupported"] is True and rec["clean"] is False and rec["errors"] is None


def test_a_share_too_short_is_skipped(tmp_path, fake):
    out = tmp_path / "san"
    assert S.main([str(out), "--limit", "0.5"]) == 1      # every share under the minimum (1 s here)
    doc = json.loads((out / "sanitize.json").read_text())
    assert all(t["exit"] is None and "skipped" in t for t in doc["tools"].values())
    assert not fake.exists()                                                # none started


def test_the_handlers_are_put_back(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("MODE", "clean")
    before = signal.getsignal(signal.SIGTERM)
    assert S.main([str(tmp_path / "san"), "--tools", "synccheck", "--limit", "20"]) == 0
    assert signal.getsignal(signal.SIGTERM) is before


def test_summary_counts():
    assert S.read_log("========= ERROR SUMMARY: 0 errors\n")["errors"] == 0
    assert S.read_log("x\n========= ERROR SUMMARY: 3 errors\n")["errors"] == 3
    two = "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 1 warning)\n========= ERROR SUMMARY: 2 errors\n"
    assert S.read_log(two)["errors"] == 2          # the same errors said twice count once
    assert S.read_log("killed before the end\n") == {"errors": None, "first_lines": []}


def test_without_the_tool_or_with_bad_options_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(S, "find_sanitizer", lambda: None)
    assert S.main([str(tmp_path / "o")]) == 2
    assert "compute-sanitizer not found" in capsys.readouterr().err
    assert S.main([str(tmp_path / "o"), "--tools", "memcheck,leakcheck"]) == 2
    assert capsys.readouterr().err.startswith("error: --tools")
    assert S.main([str(tmp_path / "o"), "--limit", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --limit")
    assert not (tmp_path / "o").exists()


# sanitize.py as run_all starts it, with the builds stubbed (no GPU here): a stop signal while a tool hangs
DRIVER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("s", sys.argv[1])
S = importlib.util.module_from_spec(spec)
spec.loader.exec_module(S)
S.prebuild = lambda: "/cache/libdf2_cuda_sm90a.so"
S.MIN_SHARE_S = 1.0
sys.exit(S.main([sys.argv[2], "--tools", "synccheck", "--limit", "60"]))
"""


def test_stopped_from_outside_it_stops_the_running_tool_first(tmp_path, fake):
    """run_all stops a part by signalling its process group; the tool runs in a session of its own, out of that
    group's reach, so sanitize.py kills it before it exits (143 on SIGTERM): the hanging tool is gone, not left
    running on the GPU."""
    import subprocess

    pidfile = Path(str(fake) + ".pid")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(SCRIPT), str(tmp_path / "san")],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        tool = int(pidfile.read_text())
        assert _alive(tool)
        os.killpg(proc.pid, signal.SIGTERM)            # as run_all stops a part
        assert proc.wait(20) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while _alive(tool) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(tool)
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    from dflash2_trt.testing.processes import process_alive
    return process_alive(pid)
