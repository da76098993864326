"""What the tests that read TensorRT-LLM's real Python sources share: where the sources are ($DFLASH2_TRTLLM_SRC, the
conformance harness's files; never part of this repository) and a child process that imports them through the
harness (its stand-in ``tensorrt`` is TensorRT-RTX, and the modules it installs are global, so never in the test
process) and prints one JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = os.environ.get("DFLASH2_TRTLLM_SRC")


def have(*files: str) -> bool:
    """The sources are given and hold these files (paths under DIR/tensorrt_llm/)."""
    return bool(SRC) and all((Path(SRC) / "tensorrt_llm" / f).is_file() for f in files)


def child_json(code: str, *args: str, timeout: int = 300) -> dict:
    """Run ``code`` as ``python -c code SRC REPO/scripts *args`` and return the JSON of its last stdout line."""
    pytest.importorskip("tensorrt_rtx", reason="the conformance harness's stand-in tensorrt is TensorRT-RTX")
    r = subprocess.run([sys.executable, "-c", code, SRC, str(REPO / "scripts"), *args], capture_output=True,
                       text=True, timeout=timeout, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
