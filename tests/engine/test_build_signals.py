"""Real signals and crashes during ``dflash2-trt build`` (issue 21, items 5 and 6).

SIGTERM is handled like Ctrl-C at every moment (converting, verifying, replacing an engine with
``--force``): the temporary directory is removed, one line is printed, the exit status is 143 and
an existing engine is left as it was. A run SIGKILLed between the two renames of the ``--force``
swap leaves the previous engine under ``.E.old-*``; the next run puts it back and says so instead
of deleting it.

The build runs in a child process (``python -c``) whose only change is a delay (or a SIGKILL) at
one chosen moment, so the signal lands there; everything else is the real CLI.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dflash2_trt.assets import ASSET_ROOT

D, T = ASSET_ROOT / "qwen3" / "drafter", ASSET_ROOT / "qwen3" / "target"
REPO = Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    moment = sys.argv[1]
    if moment.endswith("convert"):   # slow every tensor write: the signal lands while converting
        from dflash2_trt.checkpoint import writer
        real = writer.StreamingSafetensorsWriter.write
        def slow(self, *a, **kw):
            time.sleep(0.05)
            return real(self, *a, **kw)
        writer.StreamingSafetensorsWriter.write = slow
    elif moment == "verify":         # the verify gate starts after a pause: the signal lands there
        from dflash2_trt.engine.standin import verify
        real_verify = verify.verify_standin_engine
        def slow_verify(*a, **kw):
            open(os.environ["MARK"], "w").close()
            time.sleep(60)
            return real_verify(*a, **kw)
        verify.verify_standin_engine = slow_verify
    elif moment == "swap":           # SIGKILL between the two renames of the --force swap
        real_replace = os.replace
        def replace(src, dst, *a, **kw):
            if os.path.basename(str(src)).startswith(".E.tmp-"):
                os.kill(os.getpid(), signal.SIGKILL)
            return real_replace(src, dst, *a, **kw)
        os.replace = replace
    from dflash2_trt.cli import main
    main(sys.argv[2:], prog_name="dflash2-trt")
""")


def _args(out, *extra):
    return ["build", "--drafter", str(D), "--target-dir", str(T), "--backend", "cpu", "--output", str(out), *extra]


def _env(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MARK=str(tmp_path / "mark"))
    return env


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _debris(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".E."))


def _wait_for(pred, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("the moment never came")


def _build(tmp_path, out, *extra):
    r = subprocess.run([sys.executable, "-m", "dflash2_trt.cli", *_args(out, *extra)], env=_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    return r


@pytest.fixture(scope="module")
def old_engine(tmp_path_factory):
    """A complete engine built once; tests copy it to replace it with --force."""
    out = tmp_path_factory.mktemp("signals") / "E"
    r = _build(out.parent, out, "--no-verify")
    assert r.returncode == 0, r.stderr
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("moment,force", [("convert", False), ("after convert", False), ("verify", False),
                                          ("verify", True)])
def test_sigterm_during_build_cleans_up_and_exits_143(tmp_path, old_engine, moment, force):
    out = tmp_path / "E"
    before = None
    if force:
        _copy(old_engine, out)
        before = _snapshot(out)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, moment, *_args(out, "--verify", *(["--force"] * force))],
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if moment == "convert":      # the checkpoint's rank file is being streamed (its own temporary dir)
            _wait_for(lambda: any(tmp_path.glob(".E.tmp-*/.checkpoint.tmp-*/rank0.safetensors")), proc)
            time.sleep(0.3)
        elif moment == "after convert":   # the checkpoint is in place; config, tokenizer, hashes follow
            _wait_for(lambda: any(tmp_path.glob(".E.tmp-*/checkpoint/manifest.json")), proc)
        else:
            _wait_for((tmp_path / "mark").exists, proc)
        assert [p for p in tmp_path.glob(".E.tmp-*")], "the temporary directory should exist at this moment"
        proc.send_signal(signal.SIGTERM)
        out_text, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (proc.returncode, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == ["terminated (SIGTERM): stopped; any output in progress was removed"], err
    assert out_text == ""
    assert _debris(tmp_path) == []
    if force:
        assert _snapshot(out) == before            # the engine it was replacing is untouched
    else:
        assert not out.exists()


def test_crash_between_the_swap_renames_restores_the_engine(tmp_path, old_engine):
    out = _copy(old_engine, tmp_path / "E")
    before = _snapshot(out)
    r = subprocess.run([sys.executable, "-c", _CHILD, "swap", *_args(out, "--no-verify", "--force",
                                                                     "--block-size", "4")],
                       env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not out.exists()                                      # the crash state: only .E.old-* / .E.tmp-*
    assert any(n.startswith(".E.old-") for n in _debris(tmp_path)), _debris(tmp_path)

    # The next plain build must not delete the complete engine hidden under .E.old-*: it is put back,
    # named, and (not --force) the build is refused as for any existing engine.
    r = _build(tmp_path, out, "--no-verify")
    assert r.returncode == 1, r.stderr
    assert "restored" in r.stderr and ".E.old-" in r.stderr and "--force" in r.stderr, r.stderr
    assert _snapshot(out) == before
    assert _debris(tmp_path) == [], _debris(tmp_path)     # the half-swapped new one was removed (and named)
    assert "removed" in r.stderr and ".E.tmp-" in r.stderr


def test_crash_between_the_swap_renames_then_force_says_so(tmp_path, old_engine):
    out = _copy(old_engine, tmp_path / "E")
    r = subprocess.run([sys.executable, "-c", _CHILD, "swap", *_args(out, "--no-verify", "--force")],
                       env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL and not out.exists()
    r = _build(tmp_path, out, "--no-verify", "--force", "--block-size", "4")
    assert r.returncode == 0, r.stderr
    assert "restored" in r.stderr and "cpu engine, block 4" in r.stdout
    assert _debris(tmp_path) == []


def test_a_signal_during_a_nested_commit_stops_the_enclosing_output(tmp_path, monkeypatch):
    """SIGTERM while the checkpoint inside an engine's temporary directory is swapped into place (signals
    held) used to be dropped, and the build ran on and succeeded (exit 0, seen in the 'after convert'
    moment above). Now it is delivered once the inner swap is done, and the engine output is removed."""
    from dflash2_trt.checkpoint import writer

    class Terminated(KeyboardInterrupt):   # what the CLI's SIGTERM handler raises (errors.Terminated)
        pass

    def raise_terminated(signum, frame):
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    real_replace = os.replace

    def replace(src, dst, *a, **kw):
        r = real_replace(src, dst, *a, **kw)
        if os.path.basename(str(src)).startswith(".checkpoint.tmp-"):
            os.kill(os.getpid(), signal.SIGTERM)          # a real signal, inside the held window
        return r

    monkeypatch.setattr(writer.os, "replace", replace)
    try:
        with pytest.raises(Terminated):
            with writer.AtomicOutputDir(tmp_path / "E") as outer:
                with writer.AtomicOutputDir(outer / "checkpoint") as inner:
                    (inner / "rank0.safetensors").write_bytes(b"x")
                (outer / "config.json").write_text("{}")    # never reached: the signal stops the run here
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert list(tmp_path.iterdir()) == []
    # the outermost swap still drops a signal (the run has succeeded once its output is in place)
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    monkeypatch.setattr(writer.os, "replace", lambda src, dst, *a, **kw: (
        real_replace(src, dst, *a, **kw), os.kill(os.getpid(), signal.SIGTERM))[0])
    try:
        with writer.AtomicOutputDir(tmp_path / "E2") as out:
            (out / "f").write_text("x")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (tmp_path / "E2" / "f").read_text() == "x"


_LATE_CHILD = textwrap.dedent("""
    import atexit, os, sys, time
    def slow_teardown():             # registered first, so it runs last: the signal lands while the process ends
        open(os.environ["MARK"], "w").close()
        time.sleep(60)
    atexit.register(slow_teardown)
    from dflash2_trt.cli import main
    main(sys.argv[1:], prog_name="dflash2-trt")
""")


@pytest.mark.parametrize("sig,code,line,command", [
    (signal.SIGTERM, 143, "terminated (SIGTERM) after the command had finished: its output is complete", "build"),
    (signal.SIGINT, 130, "interrupted after the command had finished: its output is complete", "build"),
    (signal.SIGINT, 130, "interrupted after the command had finished: its output is complete", "targets")])
def test_a_signal_after_the_command_finished_is_one_line(tmp_path, old_engine, sig, code, line, command):
    """A signal that lands after `build` printed `wrote ...`, while the process tears down: it exited 0 with a
    KeyboardInterrupt traceback (Ctrl-C) or -15 without a word (SIGTERM). Now one line, 130 / 143, and the
    engine (already in place) is complete. The build is a --force rebuild of the module's engine; `targets`
    shows the same holds for any command."""
    from dflash2_trt.engine.format import load_engine_dir

    out = _copy(old_engine, tmp_path / "E")
    args = _args(out, "--no-verify", "--force") if command == "build" else ["targets"]
    proc = subprocess.Popen([sys.executable, "-c", _LATE_CHILD, *args],
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for((tmp_path / "mark").exists, proc)
        proc.send_signal(sig)
        out_text, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, (proc.returncode, err)
    assert [ln for ln in err.splitlines() if ln.strip()] == [line], err
    if command == "build":
        assert out_text.startswith(f"wrote {out} (cpu engine"), out_text
        load_engine_dir(out, verify=True)         # every file there, every hash right
        assert _debris(tmp_path) == []
    else:
        assert "qwen3.8-27b" in out_text          # the whole table came out before the signal
