"""The GPU check's pytest part (scripts/gpu_check/run_all.py ``pytest_gpu``) sets ``DFLASH2_REQUIRE_GPU=1``: where
torch sees no CUDA GPU the gpu tests then fail instead of all skipping, which had made the part green (a review ran
the part here: 9 skipped, exit 0). Without the variable (CI, this machine) they skip as before."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the refusal where torch sees no GPU")
@pytest.mark.parametrize("value,rc", [("1", 1), ("", 0), ("0", 0)])
def test_the_gpu_part_fails_without_a_gpu_only_where_it_requires_one(value, rc):
    env = {**os.environ, "DFLASH2_REQUIRE_GPU": value}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                        str(ROOT / "tests" / "gpu")], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == rc, r.stdout + r.stderr
    if rc:
        assert "DFLASH2_REQUIRE_GPU is set and torch" in r.stdout + r.stderr and "sees no CUDA GPU" in r.stdout
    else:
        assert " skipped" in r.stdout and "passed" not in r.stdout


def test_run_all_requires_the_gpu_in_its_pytest_part():
    spec = importlib.util.spec_from_file_location("dflash2_gpu_check_all_req", ROOT / "scripts" / "gpu_check" /
                                                  "run_all.py")
    run_all = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))   # its dataclass looks there
    spec.loader.exec_module(run_all)
    part = next(p for p in run_all.default_parts(sys.executable) if p.name == "pytest_gpu")
    argv = part.argv(Path("/w"), 60.0)
    assert argv[:2] == ["env", "DFLASH2_REQUIRE_GPU=1"] and "-m" in argv and str(ROOT / "tests" / "gpu") in argv
