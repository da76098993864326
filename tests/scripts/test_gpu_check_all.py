"""scripts/gpu_check/run_all.py (``gpu_check.sh --all``, the one command of a GPU session): the device tool brings
back at most 8 files of its output folder and the call has a fixed budget, so whatever the parts write, the folder
holds the summary and one archive of everything, refreshed after each part; a part past its limit is stopped with
its children, the later parts still run, and a part the budget cannot hold is skipped, not started."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tarfile
import time
from pathlib import Path

import pytest

from dflash2_trt.testing.processes import process_alive

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("dflash2_gpu_check_all", ROOT / "scripts" / "gpu_check" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)      # its dataclass looks its module up there
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


A = _load()
PY = sys.executable
MANY = "import pathlib, sys; d = pathlib.Path(sys.argv[1]) / 'e2e'; d.mkdir(); " \
       "[(d / f'steps-{i}.json').write_text('{}') for i in range(12)]; print('wrote 12')"
# a part that starts a child of its own and hangs: the limit must stop both
HANG = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
       "open(sys.argv[1] + '/child.pid', 'w').write(str(c.pid)); print('hanging', flush=True); time.sleep(60)"


def test_the_output_folder_holds_two_files_and_every_part_survives_another(tmp_path):
    out = tmp_path / "all"
    parts = [A.Part("many", 30, lambda w, s: [PY, "-c", MANY, str(w)]),
             A.Part("crash", 30, lambda w, s: [PY, "-c", "raise SystemExit(3)"]),
             A.Part("hang", 1.2, lambda w, s: [PY, "-c", HANG, str(w)]),
             A.Part("late", 30, lambda w, s: [PY, "-c", "print('never')"])]
    seen = []
    t0 = time.monotonic()
    summary = A.run_all(out, parts, budget=2.0, say=seen.append, reserve=0.2, min_part=0.6)
    assert time.monotonic() - t0 < 2.0 + 1.5      # ends near its budget, not after the parts' own limits
    assert sorted(p.name for p in out.iterdir()) == ["results.tar.gz", "summary.json"]
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["many"]["exit"] == 0 and summary["hang"]["exit"] == 124 and summary["crash"]["exit"] == 3
    assert summary["late"]["exit"] is None and "skipped" in summary["late"]
    with tarfile.open(out / "results.tar.gz") as tar:
        names = set(tar.getnames())
        log = tar.extractfile("hang.log").read().decode()
        pid = int(tar.extractfile("child.pid").read())
    assert {f"e2e/steps-{i}.json" for i in range(12)} <= names
    assert {"many.log", "hang.log", "crash.log", "summary.json"} <= names and "late.log" not in names
    assert "hanging" in log and not process_alive(pid)
    assert any("== hang: exit 124" in s for s in seen)


def test_a_part_given_less_than_its_own_minimum_is_skipped_not_started(tmp_path):
    """A part that cannot finish anything in what is left (sanitize's three tools of 15 s, profile's first ncu run)
    is skipped, so its seconds are not spent on a start that is stopped before its first result (a review)."""
    parts = [A.Part("needs_more", 30, lambda w, s: [PY, "-c", "print('ran')"], min_s=5.0),
             A.Part("fits", 30, lambda w, s: [PY, "-c", "print('ran')"])]
    summary = A.run_all(tmp_path / "all", parts, budget=3.0, say=lambda s: None, reserve=0.2, min_part=0.6)
    assert summary["needs_more"]["exit"] is None and "skipped" in summary["needs_more"]
    assert summary["fits"]["exit"] == 0
    by_name = {p.name: p for p in A.default_parts(python="py")}
    # each at least what its script needs before its first result (profile.py, sanitize.py)
    assert by_name["sanitize"].min_s >= 3 * 15 and by_name["profile"].min_s >= 15 + 10
    assert all(p.min_s is None or p.min_s <= p.limit for p in by_name.values())


def test_a_bad_budget_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFLASH2_GPU_BUDGET_S", "soon")
    assert A.main([str(tmp_path / "all")]) == 2
    assert capsys.readouterr().err.startswith("error: DFLASH2_GPU_BUDGET_S")
    assert not (tmp_path / "all").exists()


def test_the_default_parts_most_valuable_first_inside_the_default_budget(tmp_path):
    """The kernels first (never run on a GPU since their rewrite), then the engine flow (lossless at most half of the
    part's limit, the steps the rest), the TensorRT session's binding, the gpu-marked tests, the kernels under
    compute-sanitizer with what is left; the default budget leaves the ~570 s call room for the wheels' install."""
    parts = A.default_parts(python="py")
    assert [p.name for p in parts] == ["kernels", "e2e", "trt_session", "profile", "pytest_gpu", "sanitize"]
    w = tmp_path
    argv = {p.name: p.argv(w, p.limit) for p in parts}
    assert argv["kernels"] == ["py", str(ROOT / "scripts" / "gpu_check" / "gpu_check.py"), "--json",
                               str(w / "kernels.json")]
    assert argv["e2e"] == ["py", str(ROOT / "scripts" / "gpu_e2e.py"), "--out", str(w / "e2e"), "--budget",
                           str(300 - 10)]
    assert argv["trt_session"][1:] == [str(ROOT / "scripts" / "gpu_check_trt_session.py"), "--out",
                                       str(w / "trt_session"), "--prompts", "5", "--new", "8"]
    assert argv["profile"] == ["py", str(ROOT / "scripts" / "gpu_check" / "profile.py"), str(w / "profile"),
                               "--limit", str(120 - 10)]
    assert argv["pytest_gpu"][-3:] == ["-m", "gpu", str(ROOT / "tests" / "gpu")]
    assert argv["sanitize"] == ["py", str(ROOT / "scripts" / "gpu_check" / "sanitize.py"), str(w / "sanitize"),
                                "--limit", str(90 - 10)]
    assert A.PACK_RESERVE_S > A.KILL_GRACE_S       # the last part's stop and packing fit inside the budget
    assert A.DEFAULT_BUDGET_S + 20 <= 570              # and the budget leaves ~20 s of the call for the install


def test_parts_picks_some_in_the_default_order(tmp_path, monkeypatch, capsys):
    """A session's second call runs what its first could not: ``--parts`` keeps the default order; an unknown name is
    one error line and nothing runs."""
    parts = A.default_parts(python="py")
    assert [p.name for p in A.select(parts, "sanitize,profile")] == ["profile", "sanitize"]
    assert A.select(parts, None) == parts
    assert A.main([str(tmp_path / "all"), "--parts", "kernels,nvtx"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --parts:") and "kernels, e2e, trt_session, profile" in err
    assert not (tmp_path / "all").exists()
    ran = []
    monkeypatch.setattr(A, "run_all", lambda out, ps, budget: ran.append([p.name for p in ps]) or {})
    assert A.main([str(tmp_path / "all"), "--parts", "trt_session"]) == 0
    assert ran == [["trt_session"]]


# a part that writes a first file, then (on SIGTERM: a second, saving what it has) sleeps; its pid to a file
SLOW = ("import pathlib, os, signal, sys, time; d = pathlib.Path(sys.argv[1]); (d / 'slow.pid').write_text(str(os.getpid())); "
        "(d / 'slow.partial').write_text('so far'); "
        "signal.signal(signal.SIGTERM, lambda *a: ((d / 'slow.saved').write_text('saved'), sys.exit(143))); "
        "print('slow part started', flush=True); time.sleep(60)")
DRIVER = ("import sys, pathlib, importlib.util; spec = importlib.util.spec_from_file_location('ra', sys.argv[1]); "
          "A = importlib.util.module_from_spec(spec); sys.modules['ra'] = A; spec.loader.exec_module(A); "
          "A.REPACK_S = 0.3; PY = sys.executable; out = pathlib.Path(sys.argv[2]); "
          "A.run_all(out, [A.Part('fast', 30, lambda w, s: [PY, '-c', 'print(1)']), "
          "A.Part('slow', 30, lambda w, s: [PY, '-c', sys.argv[3], str(w)])], budget=60)")


def _drive_until_the_slow_part_runs(tmp_path):
    import subprocess

    out = tmp_path / "all"
    proc = subprocess.Popen([PY, "-c", DRIVER, str(ROOT / "scripts" / "gpu_check" / "run_all.py"), str(out), SLOW],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:      # until a repack has the slow part's first file
        try:
            with tarfile.open(out / "results.tar.gz") as tar:
                if "slow.partial" in tar.getnames():
                    pid = int(tar.extractfile("slow.pid").read())
                    return proc, out, pid
        except (OSError, tarfile.TarError, KeyError, ValueError):
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the slow part's files never reached results.tar.gz")


def test_a_stop_from_outside_stops_the_running_part_and_keeps_its_files(tmp_path):
    """The call's own limit (SIGTERM to run_all): the running part, in a session of its own, is stopped too (given a
    moment to save), what it wrote is packed and the summary says it was interrupted; nothing is left running."""
    import signal

    proc, out, pid = _drive_until_the_slow_part_runs(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fast"]["exit"] == 0 and summary["slow"]["exit"] == "interrupted"
    with tarfile.open(out / "results.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"slow.partial", "slow.saved", "slow.log", "fast.log", "summary.json"} <= names
    t0 = time.monotonic()
    while process_alive(pid) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert not process_alive(pid)


def test_a_kill_from_outside_leaves_the_last_repack_and_no_part_running(tmp_path):
    """SIGKILL cannot be handled: the part dies with run_all (the kernel's parent-death signal), and OUT_DIR holds
    the repack made while the part ran (its summary entry says running)."""
    import signal

    proc, out, pid = _drive_until_the_slow_part_runs(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    t0 = time.monotonic()
    while process_alive(pid) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert not process_alive(pid)
    assert json.loads((out / "summary.json").read_text())["slow"]["exit"] == "running"


def test_packing_while_a_part_writes_leaves_out_what_went_away(tmp_path, monkeypatch):
    """The repack runs while the part writes: a file that is gone by the time it is read (a temporary file renamed
    into place) is left out and the archive stays whole."""
    work, out = tmp_path / "w", tmp_path / "o"
    work.mkdir()
    out.mkdir()
    (work / "kept.json").write_text("{}")
    (work / ".x.tmp").write_text("half")
    real = Path.read_bytes

    def read_bytes(self):
        if self.name == ".x.tmp":
            raise FileNotFoundError(self)
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    A.pack(work, out)
    with tarfile.open(out / "results.tar.gz") as tar:
        assert tar.getnames() == ["kept.json"] and tar.extractfile("kept.json").read() == b"{}"


# a part that ignores SIGTERM (only SIGKILL ends it), its first file written at once
STUBBORN = ("import pathlib, os, signal, sys, time; d = pathlib.Path(sys.argv[1]); "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); (d / 'slow.pid').write_text(str(os.getpid())); "
            "(d / 'slow.partial').write_text('so far'); time.sleep(60)")


def test_a_second_stop_does_not_cut_the_first_ones_clean_up_short(tmp_path):
    """Two SIGTERMs in a row (a supervisor that repeats itself, two Ctrl-Cs): the second is ignored, so the part's stop
    ladder still reaches SIGKILL (a reviewer found the part of a SIGTERM-deaf part left running) and the summary still
    says interrupted."""
    import signal
    import subprocess

    out = tmp_path / "all"
    proc = subprocess.Popen([PY, "-c", DRIVER, str(ROOT / "scripts" / "gpu_check" / "run_all.py"), str(out),
                             STUBBORN], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    pid = None
    while pid is None and time.monotonic() - t0 < 30:
        try:
            with tarfile.open(out / "results.tar.gz") as tar:
                pid = int(tar.extractfile("slow.pid").read())
        except (OSError, tarfile.TarError, KeyError, ValueError, AttributeError):
            time.sleep(0.1)
    assert pid is not None
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143
    t1 = time.monotonic()
    while process_alive(pid) and time.monotonic() - t1 < 5:
        time.sleep(0.05)
    assert not process_alive(pid)
    assert json.loads((out / "summary.json").read_text())["slow"]["exit"] == "interrupted"


def _incompressible(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(n))


def _scratch(work: Path) -> None:
    """A scratch folder as the parts leave it, with large artefacts that gzip cannot shrink."""
    for name, n in (("profile/profile-gdn_forward.ncu-rep", 900_000), ("profile/profile-conv.ncu-rep", 300_000),
                    ("profile/profile-gdn_forward-source.csv", 500_000), ("sanitize/sanitize-memcheck.log", 20_000),
                    ("profile/profile-gdn_forward-raw.csv", 40_000)):
        _incompressible(work / name, n)
    (work / "profile" / "profile.json").write_text('{"ok": true}')
    (work / "kernels.json").write_text("{}")
    (work / "summary.json").write_text("{}")


def test_an_archive_over_the_limit_leaves_out_the_largest_optional_files(tmp_path):
    """The device tool brings back nothing of a file over 16 MiB: an archive over the limit is made again without the
    largest optional artefacts (ncu's reports, the source pages, sanitizer logs) until it fits; what was left out is
    said, and the rest (profile.json, the raw page, kernels.json) stays."""
    work, out = tmp_path / "w", tmp_path / "o"
    out.mkdir()
    _scratch(work)
    noted = []
    left = A.pack(work, out, max_bytes=1_000_000, note=lambda lo: noted.append([d["file"] for d in lo]))
    assert [d["file"] for d in left] == ["profile/profile-gdn_forward.ncu-rep"]
    assert left[0]["bytes"] == 900_000 and "largest first" in left[0]["why"]
    assert noted == [["profile/profile-gdn_forward.ncu-rep"]]
    assert (out / "results.tar.gz").stat().st_size <= 1_000_000
    with tarfile.open(out / "results.tar.gz") as tar:
        names = set(tar.getnames())
    assert "profile/profile-gdn_forward.ncu-rep" not in names
    assert {"profile/profile.json", "profile/profile-gdn_forward-raw.csv", "kernels.json", "summary.json",
            "profile/profile-conv.ncu-rep", "profile/profile-gdn_forward-source.csv"} <= names
    assert sorted(p.name for p in out.iterdir()) == ["results.tar.gz"]          # no temporary left behind
    left = A.pack(work, out, max_bytes=600_000)           # tighter: the next largest optional ones go too
    assert [d["file"] for d in left] == ["profile/profile-gdn_forward.ncu-rep",
                                         "profile/profile-gdn_forward-source.csv"]
    assert (out / "results.tar.gz").stat().st_size <= 600_000
    assert A.pack(work, out) == []                        # under the default 15 MiB: everything


def test_when_the_optional_files_are_not_enough_the_largest_others_go_but_the_summary(tmp_path):
    work, out = tmp_path / "w", tmp_path / "o"
    out.mkdir()
    _scratch(work)
    _incompressible(work / "e2e.log", 400_000)
    left = A.pack(work, out, max_bytes=100_000)
    files = [d["file"] for d in left]
    assert set(files[:4]) == {"profile/profile-gdn_forward.ncu-rep", "profile/profile-conv.ncu-rep",
                              "profile/profile-gdn_forward-source.csv", "sanitize/sanitize-memcheck.log"}
    assert files[4] == "e2e.log" and "the rest" in left[4]["why"]
    assert (out / "results.tar.gz").stat().st_size <= 100_000
    with tarfile.open(out / "results.tar.gz") as tar:
        assert {"summary.json", "kernels.json", "profile/profile.json"} <= set(tar.getnames())


def test_a_pack_that_fails_leaves_the_archive_before_it_whole(tmp_path, monkeypatch):
    work, out = tmp_path / "w", tmp_path / "o"
    out.mkdir()
    _scratch(work)
    A.pack(work, out)
    before = (out / "results.tar.gz").read_bytes()
    real = Path.read_bytes

    def read_bytes(self):
        if self.name == "kernels.json":
            raise PermissionError(self)
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(PermissionError):
        A.pack(work, out, max_bytes=1_000_000)
    assert sorted(p.name for p in out.iterdir()) == ["results.tar.gz"]
    assert (out / "results.tar.gz").read_bytes() == before


def test_summary_json_says_what_the_archive_left_out(tmp_path, monkeypatch):
    """Inside run_all: a part whose reports would take the archive over the limit; summary.json (beside the archive
    and inside it) lists what was left out and why, and the outer folder still holds the two files."""
    monkeypatch.setattr(A, "MAX_ARCHIVE_BYTES", 400_000)
    big = "import os, pathlib, sys; d = pathlib.Path(sys.argv[1]) / 'profile'; d.mkdir(); " \
          "(d / 'profile-gdn_forward.ncu-rep').write_bytes(os.urandom(700_000)); (d / 'profile.json').write_text('{}')"
    out = tmp_path / "all"
    summary = A.run_all(out, [A.Part("profile", 30, lambda w, s: [PY, "-c", big, str(w)]),
                              A.Part("after", 30, lambda w, s: [PY, "-c", "print(1)"])],
                        budget=60, say=lambda s: None)
    assert summary["profile"]["exit"] == 0 and summary["after"]["exit"] == 0
    assert [d["file"] for d in summary["left_out"]] == ["profile/profile-gdn_forward.ncu-rep"]
    assert json.loads((out / "summary.json").read_text()) == summary
    assert sorted(p.name for p in out.iterdir()) == ["results.tar.gz", "summary.json"]
    with tarfile.open(out / "results.tar.gz") as tar:
        inner = json.loads(tar.extractfile("summary.json").read())
        assert "profile/profile.json" in tar.getnames()
    assert inner == summary
