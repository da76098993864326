"""An output path under a directory the user may not search is one error line naming the option, not a traceback:
Python 3.11's Path.exists() / is_symlink() raise PermissionError there, and every command that writes asks them of
its output (a fuzzing review found it in build, convert, export-onnx, deploy triton, bench prepare-dataset; deploy and
export-onnx write through the same AtomicOutputDir as convert)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dflash2_trt.errors import ConfigError
from dflash2_trt.overlap import refuse_unreachable

REPO = Path(__file__).resolve().parents[1]


def test_a_path_that_cannot_be_looked_at_is_refused(monkeypatch, tmp_path):
    locked = tmp_path / "locked"
    real = os.lstat

    def lstat(p, *a, **k):   # what the kernel answers a process that may not search `locked` (EACCES)
        if str(p).startswith(str(locked) + os.sep):
            raise PermissionError(13, "Permission denied", str(p))
        return real(p, *a, **k)

    monkeypatch.setattr(os, "lstat", lstat)
    with pytest.raises(ConfigError, match=r"--output: .*locked/out: cannot access it: Permission denied"):
        refuse_unreachable(locked / "out", "--output")
    refuse_unreachable(tmp_path / "missing" / "out", "--output")      # not there: the callers' own checks say so
    refuse_unreachable(tmp_path, "--output")


def _as_nobody():
    """(the command prefix running as user nobody, a world-searchable scratch directory) where this process is root
    and setpriv exists; else a skip reason."""
    if os.geteuid() != 0:
        return None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "setpriv not found (util-linux): cannot drop root to meet EACCES"
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.parametrize("args", [
    ["build", "--target", "tiny", "--output", "{locked}/out"],
    ["convert", "--target", "tiny", "--output", "{locked}/out"],
    ["bench", "prepare-dataset", "--builtin", "tiny", "--output", "{locked}/d.jsonl"],
])
def test_each_command_says_it_in_one_line(args):
    prefix = _as_nobody()
    if isinstance(prefix, str):
        pytest.skip(prefix)
    scratch = Path(tempfile.mkdtemp(prefix="dflash2-unreachable-", dir="/tmp"))
    try:
        scratch.chmod(0o755)
        locked = scratch / "locked"
        locked.mkdir(mode=0o000)
        locked.chmod(0o000)
        argv = [a.format(locked=locked, scratch=scratch) for a in args]
        env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(scratch)}
        if prefix:
            probe = subprocess.run(prefix + [sys.executable, "-c", "import dflash2_trt.cli"], capture_output=True,
                                   text=True, env=env, timeout=120)
            if probe.returncode != 0:
                pytest.skip(f"user nobody cannot import this checkout here: {probe.stderr.strip()[-200:]}")
        cmd = (prefix or []) + [sys.executable, "-m", "dflash2_trt", *argv]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
        assert "cannot access it: Permission denied" in lines[0] and f"({locked} cannot be searched)" in lines[0], lines
    finally:
        (scratch / "locked").chmod(0o755)
        shutil.rmtree(scratch, ignore_errors=True)
