"""scripts/gpu_e2e.py on the cpu backend (``DFLASH2_E2E_BACKEND=cpu``, its rehearsal without a GPU): a part that
fails or is stopped after some of its work keeps that work in its JSON and table, beside the error."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash2_trt.testing.processes import process_alive

ROOT = Path(__file__).resolve().parents[2]


def _load(monkeypatch):
    monkeypatch.setenv("DFLASH2_E2E_BACKEND", "cpu")
    spec = importlib.util.spec_from_file_location("dflash2_gpu_e2e_cpu", ROOT / "scripts" / "gpu_e2e.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_failed_target_costs_no_other_target_its_steps(monkeypatch, tmp_path):
    """A target that fails (here: tiny at its second concurrency, qwen3-8b at once as it has no published drafter; on
    a GPU: a profiler without kernels, memory) is named with its error and keeps the points it measured before
    (report marked partial), and the targets after it are measured (the first GPU run lost muse-glimmer-30b's steps
    to qwen3.8-27b's crash)."""
    import dflash2_trt.bench.steps as bench_steps

    e2e = _load(monkeypatch)
    assert e2e.BACKEND == "cpu"
    real, calls = bench_steps.measure, []

    def measure(engine, concurrency, *a, **kw):
        calls.append(concurrency)
        if concurrency == 2 and calls.count(2) == 1:          # the first target's second level, once
            raise RuntimeError("injected failure at concurrency 2")
        return real(engine, concurrency, *a, **kw)

    monkeypatch.setattr(bench_steps, "measure", measure)
    args = argparse.Namespace(out=str(tmp_path), context_len=16, concurrency="1,2", targets="tiny,qwen3-8b,tiny-hybrid",
                              steps=1)
    assert e2e.run_part("steps", args) == 1
    doc = json.loads((tmp_path / "steps.json").read_text())
    assert [(e["target"], e["points_kept"]) for e in doc["errors"]] == [("tiny", 1), ("qwen3-8b", 0)]
    assert "injected failure" in doc["errors"][0]["error"] and "ConfigError" in doc["errors"][1]["error"]
    assert doc["partial"] is False and "error" not in doc
    assert [(r["target"], [p["concurrency"] for p in r["points"]], r.get("partial", False)) for r in doc["reports"]] \
        == [("tiny", [1], True), ("tiny-hybrid", [1, 2], False)]
    table = (tmp_path / "steps.txt").read_text()
    assert table.startswith("BENCH STEPS tiny on cpu") and "qwen3-8b: FAILED: ConfigError" in table
    assert json.loads((tmp_path / "steps-tiny.json").read_text())["partial"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps-tiny-hybrid.json", "steps-tiny.json", "steps.json",
                                                          "steps.txt"]


def test_each_target_gets_a_share_of_the_steps_part(monkeypatch, tmp_path):
    """With the part's limit, a target that uses its share (what is left over the targets still to run) stops after
    the level in progress and keeps its levels; the next target still starts. Here the shares are ~0 s: each target
    keeps its first level only. That is the plan, not a failure: the stops are listed apart from the errors and the
    part exits 0 (a reader of summary.json could not tell a planned stop from a crash). Without a limit (a direct
    run) nothing is cut."""
    e2e = _load(monkeypatch)
    args = argparse.Namespace(out=str(tmp_path), context_len=16, concurrency="1,2", targets="tiny,tiny-hybrid",
                              steps=1, part_limit=e2e.SHARE_RESERVE_S)
    assert e2e.run_part("steps", args) == 0
    doc = json.loads((tmp_path / "steps.json").read_text())
    assert doc["errors"] == []
    stops = doc["stopped_at_share"]
    assert [(e["target"], e["points_kept"]) for e in stops] == [("tiny", 1), ("tiny-hybrid", 1)]
    assert all("share of the part's time" in e["reason"] for e in stops)
    assert "tiny: stopped: its share of the part's time" in doc["table"]
    assert [[p["concurrency"] for p in r["points"]] for r in doc["reports"]] == [[1], [1]]
    (tmp_path / "all").mkdir()
    doc = e2e.part_steps(tmp_path / "all", 16, "1,2", ["tiny"], 1, limit=None)
    assert doc["errors"] == [] and [p["concurrency"] for p in doc["reports"][0]["points"]] == [1, 2]


def test_concurrent_lossless_cells_stopped_at_the_limit_keep_their_rows(tmp_path):
    """The lossless cells as processes at once (on a GPU all six: the tiny pairs leave it idle). Stopped at the
    part's limit (SIGTERM to its process group, as gpu_e2e's and run_all's limits send it) after one cell has
    saved a row, the part saves the table of every row so far, partial, and no cell process is left."""
    out = tmp_path / "e2e"
    env = {**os.environ, "DFLASH2_E2E_BACKEND": "cpu", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(ROOT / "scripts" / "gpu_e2e.py"), "--out", str(out), "--one", "lossless",
            "--lossless-targets", "tiny", "--lossless-dtypes", "float32,bfloat16", "--lossless-levels", "16,1",
            "--lossless-jobs", "2"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    cells = out / "lossless-cells"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if list(cells.glob("*.json")):          # a cell has saved its c16 row; c1 is still to come
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0]
        os.killpg(proc.pid, signal.SIGTERM)
        text, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, text
    doc = json.loads((out / "lossless.json").read_text())
    assert doc["partial"] is True and doc["concurrent_cells"] == 2 and doc["backend"] == "cpu"
    # the cells still running when the part was stopped are named (their finished levels are in rows)
    assert doc["cells_stopped"] and set(doc["cells_stopped"]) <= {"tiny-float32", "tiny-bfloat16"}
    assert doc["cells_not_started"] == [] and "stopped at the limit: " in doc["table"]
    rows = doc["rows"]
    assert rows and all(r["target"] == "tiny" and r["concurrency"] == 16 for r in rows)
    assert all(r["identical"] == r["requests"] == 32 for r in rows if r["dtype"] == "float32")
    assert (out / "lossless.txt").read_text().startswith("LOSSLESS on cpu")
    pids = [int(ln.split("(pid ")[1].split(",")[0]) for ln in text.splitlines() if "started (pid" in ln]
    assert len(pids) == 2, text
    for pid in pids:
        deadline = time.monotonic() + 10
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process_alive(pid), f"cell process {pid} outlived the part"


def test_the_budget_gives_the_steps_what_lossless_leaves(monkeypatch):
    """run_all gives the engine flow one budget (``--budget``): lossless at most half of it while steps follows, the
    steps whatever is left (minus the 5 s stop and the driver's exit); without a budget each part its own limit."""
    e2e = _load(monkeypatch)
    assert e2e.part_limits(["lossless", "steps"], 300, 290, 0) == 145
    assert e2e.part_limits(["steps"], 300, 290, 60) == 290 - 60 - 6      # lossless took 60 s of its 145
    assert e2e.part_limits(["lossless"], 300, 290, 0) == 290 - 6          # alone, lossless may use it all
    assert e2e.part_limits(["steps"], 300, None, 200) == 300
    assert e2e.part_limits(["steps"], 300, 290, 300) == 1                 # spent: the part starts and is stopped
    assert e2e.default_jobs() == 1                                        # the cpu rehearsal: one cell at a time


def test_isolated_targets_each_run_in_a_process_of_their_own(monkeypatch, tmp_path):
    """The driver's steps part measures each target in a child process (what a failed CUDA-graph capture or a sticky
    CUDA error leaves in a process cannot cost the next target): a target that fails in its child is named with its
    error, the next one is measured, each child's log is kept; a child that ends without its outcome (killed) keeps
    the levels it wrote, marked partial, and its error names the exit status."""
    e2e = _load(monkeypatch)
    args = argparse.Namespace(out=str(tmp_path), context_len=16, concurrency="1,2", targets="qwen3-8b,tiny",
                              steps=1, isolate=True)
    assert e2e.run_part("steps", args) == 1
    doc = json.loads((tmp_path / "steps.json").read_text())
    assert [e["target"] for e in doc["errors"]] == ["qwen3-8b"] and "ConfigError" in doc["errors"][0]["error"]
    assert [(r["target"], [p["concurrency"] for p in r["points"]]) for r in doc["reports"]] == [("tiny", [1, 2])]
    assert (tmp_path / "steps-tiny.log").is_file() and (tmp_path / "steps-qwen3-8b.log").is_file()
    assert not list(tmp_path.glob(".steps-*"))              # the outcomes were read and removed
    # a child that dies after writing a level: what it wrote is kept, marked partial, the error says how it ended;
    # a report an earlier run left is not taken for this child's
    d = tmp_path / "killed"
    d.mkdir()
    (d / "steps-tiny.json").write_text(json.dumps({"target": "tiny", "points": [{"concurrency": 9}]}))
    fake = tmp_path / "child.sh"      # argv: script --out DIR ...: writes one level, then dies without an outcome
    fake.write_text("#!/bin/sh\necho '{\"target\": \"tiny\", \"points\": [{\"concurrency\": 1}]}' > \"$3/steps-tiny.json\"; "
                    "exit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(e2e.sys, "executable", str(fake))
    report, errors, stopped = e2e.steps_in_child(d, "tiny", 16, "1", 1, None)
    assert stopped == []
    assert report == {"target": "tiny", "points": [{"concurrency": 1}], "partial": True}
    assert errors[0]["points_kept"] == 1 and "exit status 3" in errors[0]["error"]
    # while it runs, its levels so far are handed on (the part's steps.json follows them)
    fake.write_text("#!/bin/sh\necho '{\"target\": \"tiny\", \"points\": [{\"concurrency\": 1}]}' > \"$3/steps-tiny.json\"; "
                    "sleep 1; exit 3\n")
    monkeypatch.setattr(e2e, "CHILD_TICK_S", 0.2)
    seen = []
    e2e.steps_in_child(d, "tiny", 16, "1", 1, None, on_tick=seen.append)
    assert seen and seen[-1] == {"target": "tiny", "points": [{"concurrency": 1}]}
    monkeypatch.setattr(e2e.sys, "executable", "/bin/false")   # dies before writing anything: no stale report
    (d / "steps-tiny.json").write_text(json.dumps({"target": "tiny", "points": [{"concurrency": 9}]}))
    report, errors, _ = e2e.steps_in_child(d, "tiny", 16, "1", 1, None)
    assert report is None and errors[0]["points_kept"] == 0 and "exit status 1" in errors[0]["error"]


def test_a_childs_planned_stop_is_not_an_error(monkeypatch, tmp_path):
    """A target child that stopped at its share as planned says so in its outcome; the parent lists it apart from
    the errors, so the part's status stays 0."""
    e2e = _load(monkeypatch)
    fake = tmp_path / "child.sh"
    stop = {"target": "tiny", "reason": "its share of the time (5 s) was used up", "points_kept": 1}
    fake.write_text("#!/bin/sh\necho '{\"target\": \"tiny\", \"points\": [{\"concurrency\": 1}]}' > \"$3/steps-tiny.json\"; "
                    f"echo '{json.dumps({'errors': [], 'stopped_at_share': [stop]})}' > \"$3/.steps-tiny.outcome.json\"\n")
    fake.chmod(0o755)
    monkeypatch.setattr(e2e.sys, "executable", str(fake))
    report, errors, stopped = e2e.steps_in_child(tmp_path, "tiny", 16, "1", 1, None)
    assert report == {"target": "tiny", "points": [{"concurrency": 1}]} and errors == [] and stopped == [stop]
    import dflash2_trt.bench.steps as steps_mod

    monkeypatch.setattr(steps_mod, "render", lambda report: f"BENCH STEPS {report['target']}")  # the fake's is short
    doc = e2e.part_steps(tmp_path, 16, "1", ["tiny"], 1, isolate=True)
    assert doc["errors"] == [] and doc["stopped_at_share"] == [stop]


def test_the_first_levels_eager_points_are_kept_before_its_graph_captures(monkeypatch):
    """bench steps replays the first level from CUDA graphs right after measuring it eagerly, before ``partial``
    (which may end the sweep): a target child killed during those captures lost the eager points too (0 points, as
    on the first GPU runs). ``checkpoint`` now receives them before the first capture."""
    import dflash2_trt.bench.steps as steps_mod

    seen = []
    monkeypatch.setattr(steps_mod, "can_graph", lambda engine: True)

    def graph_point(engine, concurrency, context_len, steps):
        seen.append(("capture", concurrency))
        raise KeyboardInterrupt     # the kill during the capture

    monkeypatch.setattr(steps_mod, "graph_point", graph_point)
    with pytest.raises(KeyboardInterrupt):
        steps_mod.measure_steps("tiny", backend="cpu", concurrency="1,2", context_len=12, steps=1, warmup=0,
                                profile_steps=0, checkpoint=lambda d: seen.append(("kept", d)))
    assert [s[0] for s in seen] == ["kept", "capture"]
    kept = seen[0][1]
    assert kept["partial"] is True and [p["concurrency"] for p in kept["points"]] == [1]
    assert "wall_ms" in kept["points"][0]["speculative"]


def test_the_lossless_part_holds_chunked_context_to_the_target(monkeypatch, tmp_path):
    """The lossless part's chunked run (the project runtime's chunked context, first run on a GPU there) cuts prompts
    and compares with the target's own decoding; a mismatch there makes the table not all identical."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.build import build_engine

    e2e = _load(monkeypatch)
    pair = trained_pair("qwen3_5")
    res = build_engine(pair.drafter_dir, pair.target_dir, tmp_path / "e", target_key="tiny-hybrid", verify=False,
                       overrides={"max_batch_size": 16, "tokens_per_block": 16})
    c = e2e.chunked_run(pair, tmp_path / "e", tuple(res.manifest["eos_token_ids"]), "float32")
    assert c["identical"] == c["requests"] == 16 and c["cut_steps"] > 0 and min(c["prompt_tokens"]) > 16, c
    row = {"target": "tiny-hybrid", "dtype": "float32", "concurrency": 1, "requests": 32, "identical": 32,
           "ties_only": 0, "differ": [], "mean_acceptance": 5.0, "steps": 9, "mixed_steps": 1, "tokens": 90,
           "wall_s": 1.0, "verify_gate": True, "chunked": c}
    assert e2e.lossless_doc([row])["all_identical"]
    assert "16/16 identical (prompts of" in e2e.lossless_doc([row])["table"]
    assert not e2e.lossless_doc([{**row, "chunked": {**c, "identical": 15}}])["all_identical"]
    assert not e2e.lossless_doc([{**row, "chunked": {**c, "cut_steps": 0}}])["all_identical"]
    assert not e2e.lossless_doc([{**row, "chunked": {"error": "Traceback\nRuntimeError: x", "identical": 0}}])[
        "all_identical"]
