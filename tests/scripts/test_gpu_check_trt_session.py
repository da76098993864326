"""scripts/gpu_check_trt_session.py (the project runtime's TensorRT binding on a GPU with real device pointers, the
execution API being the CPU stand-in) runs here with the CPU playing the device: every tiny pair's tokens through the
session equal the CPU engine's, and no input is bound in the wrong memory. On an H200 it is the same script with
--device cuda (its output in the session's note)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("dflash2_gpu_check_trt", ROOT / "scripts" / "gpu_check_trt_session.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_without_a_gpu_it_says_so_in_one_line(tmp_path, capsys):
    """docs/benchmarks.md's command (`--out DIR`, device cuda) on a machine without a GPU: exit 2 and one line, as
    gpu_check.py; it built the engines first and ended in torch's ValueError traceback ("Expected a torch.device with
    a specified index or an integer, but got:cuda")."""
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU exit is not exercised here")
    assert _script().main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA GPU" in err[0] and not (tmp_path / "out").exists(), err


def test_the_gpu_check_runs_on_the_cpu(tmp_path):
    mod = _script()
    assert mod.main(["--out", str(tmp_path), "--device", "cpu", "--prompts", "2", "--new", "4"]) == 0
    doc = json.loads((tmp_path / "gpu_check_trt_session.json").read_text())
    assert doc["ok"] and [r["target"] for r in doc["results"]] == ["tiny", "tiny-hybrid", "tiny-muse"]
    assert all(r["identical"] and not r["placement_mismatches"] for r in doc["results"])
    assert doc["results"][1]["recurrent_layers"] > 0


def test_one_pair_failing_is_its_row_and_the_others_still_run(tmp_path, monkeypatch):
    """The script has not yet run past its start on a GPU: a pair that raises (anything the CPU cannot show) becomes
    its row with the error, the later pairs still run and are saved, the run says FAILED (exit 1)."""
    mod = _script()
    real = mod.check_pair
    calls = []

    def check_pair(family, key, *a, **k):
        calls.append(key)
        if key == "tiny-hybrid":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(family, key, *a, **k)

    monkeypatch.setattr(mod, "check_pair", check_pair)
    assert mod.main(["--out", str(tmp_path), "--device", "cpu", "--prompts", "1", "--new", "2"]) == 1
    doc = json.loads((tmp_path / "gpu_check_trt_session.json").read_text())
    assert calls == ["tiny", "tiny-hybrid", "tiny-muse"] and doc["ok"] is False
    rows = {r["target"]: r for r in doc["results"]}
    assert rows["tiny-hybrid"]["error"].startswith("RuntimeError: CUDA error") and rows["tiny-muse"]["identical"]
    assert "_first" not in rows["tiny"]
