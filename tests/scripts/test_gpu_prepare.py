"""scripts/gpu_prepare.sh git-ignores what it makes (.whl/, .gpucache/: the device tool carries only ignored paths)
through git's own exclude file, which a worktree shares with its main checkout: in a worktree ``.git`` is a file, and
writing ``.git/info/exclude`` stopped the script before it did anything."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_ignores_are_written_from_a_worktree(tmp_path):
    main = tmp_path / "main"
    main.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    (main / "README").write_text("x\n")
    for args in (["init", "-q"], ["add", "README"], ["commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=main, check=True, env=env, capture_output=True)
    _git(main, "worktree", "add", "-q", str(tmp_path / "wt"), "-b", "wt")
    wt = tmp_path / "wt"
    (wt / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "gpu_prepare.sh", wt / "scripts" / "gpu_prepare.sh")
    # a python without transformers: the script stops at its first real step, with its own message
    r = subprocess.run(["bash", str(wt / "scripts" / "gpu_prepare.sh")], capture_output=True, text=True,
                       env={**os.environ, "PYTHON": "false"})
    assert r.returncode == 2 and "transformers is not installed in false's environment" in r.stderr, r.stderr
    assert (main / ".git" / "info" / "exclude").read_text().splitlines()[-2:] == ["/.whl/", "/.gpucache/"]
    (wt / ".whl").mkdir()
    (wt / ".whl" / "x.whl").write_text("")
    assert ".whl" not in _git(wt, "status", "--porcelain")
    r = subprocess.run(["bash", str(wt / "scripts" / "gpu_prepare.sh")], capture_output=True, text=True,
                       env={**os.environ, "PYTHON": "false"})
    assert (main / ".git" / "info" / "exclude").read_text().count("/.whl/") == 1   # once, however often it runs
