"""scripts/gpu_check/sanitize.py (``gpu_check.sh --sanitize``): the kernels' small cases under compute-sanitizer.
There is neither a GPU nor compute-sanitizer here, so what is tested is the orchestration around the tool: each tool in
turn under its share of the limit, its exit status and summary read into sanitize.json, a tool past its share
stopped, one error line without the tool. A stand-in ``compute-sanitizer`` on PATH prints what the real one prints at
the end of a run (its ``=========``-prefixed lines and summary; the format of compute-sanitizer's user manual) and
exits as ``--error-exitcode`` asks. Whether the kernels are clean is only known from a GPU run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check" / "sanitize.py"


def _load():
    spec = importlib.util.spec_from_file_location("dflash2_gpu_sanitize", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


S = _load()

# memcheck clean; racecheck finds one hazard and exits with the error exit code it was given; synccheck hangs
FAKE = r'''#!{py}
import sys, time
args = sys.argv[1:]
tool = args[args.index("--tool") + 1]
code = int(args[args.index("--error-exitcode") + 1])
assert args[-1] == "--small" and args[-2].endswith("gpu_check.py"), args
print("========= COMPUTE-SANITIZER")
print("conv correctness vs reference (bit-exact, 18 cases): ok")
if tool == "memcheck":
    print("========= ERROR SUMMARY: 0 errors")
elif tool == "racecheck":
    print("========= Error: Race reported between Write access at dynamicConvKernel+0x1f0")
    print("=========     and Read access at dynamicConvKernel+0x2a0 [16 hazards]")
    print("========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)")
    sys.exit(code)
else:
    print("hanging", flush=True)
    time.sleep(60)
'''


def _fake_bin(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "compute-sanitizer"
    fake.write_text(FAKE.replace("{py}", sys.executable))
    fake.chmod(0o755)
    return bin_dir


def test_each_tool_in_turn_its_errors_read_and_a_hang_stopped(tmp_path):
    bin_dir = _fake_bin(tmp_path)
    out = tmp_path / "san"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, str(SCRIPT), str(out), "--limit", "9"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert time.monotonic() - t0 < 9 + 8          # the hanging tool stopped at its share (+ the 5 s grace)
    assert res.returncode == 1, res.stderr
    doc = json.loads((out / "sanitize.json").read_text())
    tools = doc["tools"]
    assert list(tools) == ["memcheck", "racecheck", "synccheck"] and doc["clean"] is False
    assert tools["memcheck"]["exit"] == 0 and tools["memcheck"]["errors"] == 0 and tools["memcheck"]["clean"]
    assert tools["racecheck"]["exit"] == S.ERROR_EXIT and tools["racecheck"]["errors"] == 1
    assert not tools["racecheck"]["clean"]
    assert tools["racecheck"]["first_lines"][0].startswith("========= Error: Race reported")
    assert tools["synccheck"]["exit"] == 124 and tools["synccheck"]["errors"] is None
    assert not tools["synccheck"]["clean"]
    for t in tools:
        assert (out / f"sanitize-{t}.log").read_text()
    assert "sanitize racecheck: exit 86, errors 1" in res.stdout


def test_clean_when_every_tool_ran_clean(tmp_path):
    bin_dir = _fake_bin(tmp_path)
    out = tmp_path / "san"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    res = subprocess.run([sys.executable, str(SCRIPT), str(out), "--tools", "memcheck"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads((out / "sanitize.json").read_text())
    assert doc["clean"] is True and list(doc["tools"]) == ["memcheck"]


def test_summary_counts():
    assert S.read_log("========= ERROR SUMMARY: 0 errors\n")["errors"] == 0
    assert S.read_log("x\n========= ERROR SUMMARY: 3 errors\n")["errors"] == 3
    two = "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 1 warning)\n========= ERROR SUMMARY: 2 errors\n"
    assert S.read_log(two)["errors"] == 2          # the same errors said twice count once
    assert S.read_log("killed before the end\n") == {"errors": None, "first_lines": []}


def test_without_the_tool_or_with_bad_options_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(S, "find_sanitizer", lambda: None)
    assert S.main([str(tmp_path / "o")]) == 2
    assert "compute-sanitizer not found" in capsys.readouterr().err
    assert S.main([str(tmp_path / "o"), "--tools", "memcheck,leakcheck"]) == 2
    assert capsys.readouterr().err.startswith("error: --tools")
    assert S.main([str(tmp_path / "o"), "--limit", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --limit")
    assert not (tmp_path / "o").exists()
