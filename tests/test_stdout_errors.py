"""A command whose standard output cannot take its output (``run --json > /dev/full``, a full disk behind ``>``, a
reader that went away) ends with one line and exit 1, not a traceback (the write inside the command) nor Python's
"Exception ignored" and status 120 (the buffered rest, flushed at exit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FULL = "/dev/full"
LINE = "error: standard output: cannot write the output (No space left on device); what it holds is incomplete"


def _cli(args, stdout):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "dflash2_trt.cli", *args], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=env, timeout=300)


@pytest.mark.skipif(not os.path.exists(FULL), reason="needs /dev/full (Linux)")
def test_a_full_standard_output_is_one_line(tmp_path):
    out = tmp_path / "eng"
    with open(FULL, "w") as full:
        # the buffered case: a short output written at exit
        r = _cli(["targets"], full)
        assert r.returncode == 1 and r.stderr.strip() == LINE, r.stderr
        r = _cli(["build", "--target", "tiny", "--backend", "cpu", "--output", str(out), "--no-verify"],
                 subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        # the write inside the command: run's JSON is larger than the buffer
        r = _cli(["run", "--engine-dir", str(out), "--prompts", str(_prompts(tmp_path)), "--max-new-tokens", "4",
                  "--json"], full)
        assert r.returncode == 1 and r.stderr.strip() == LINE, r.stderr
        assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr


def test_a_reader_that_went_away_gets_no_traceback():
    """(click itself quiets EPIPE; the flush at exit added here must not undo that.)"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "dflash2_trt.cli", "targets", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    p.stdout.close()                    # as `| head -c 0` does
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and err.decode().strip() == "", err.decode()


def _prompts(tmp_path) -> Path:
    import json

    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"task_id": i, "input_ids": [5, 6, 7 + i]}) + "\n" for i in range(4)))
    return f


def test_a_closed_standard_output_is_not_an_error():
    """With fd 1 closed at start (`>&-`) Python's sys.stdout is None: the flush at exit added for a full output must
    not turn that into an AttributeError (a reviewer: rc 1 with a traceback, where the command had succeeded)."""
    import shlex
    import shutil

    if shutil.which("sh") is None:
        pytest.skip("needs a POSIX shell to start a process with fd 1 closed")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(["sh", "-c", f"{shlex.quote(sys.executable)} -m dflash2_trt.cli targets >&-"],
                       stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
