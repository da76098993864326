"""scripts/gpu_e2e.py on the cpu backend (``DFLASH2_E2E_BACKEND=cpu``, its rehearsal without a GPU): a part that
fails or is stopped after some of its work keeps that work in its JSON and table, beside the error."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(monkeypatch):
    monkeypatch.setenv("DFLASH2_E2E_BACKEND", "cpu")
    spec = importlib.util.spec_from_file_location("dflash2_gpu_e2e_cpu", ROOT / "scripts" / "gpu_e2e.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_failed_target_keeps_the_steps_of_the_one_before(monkeypatch, tmp_path):
    e2e = _load(monkeypatch)
    assert e2e.BACKEND == "cpu"
    # the second target fails (qwen3-8b has no published drafter) after the first is measured
    args = argparse.Namespace(out=str(tmp_path), context_len=16, concurrency="1", targets="tiny,qwen3-8b", steps=1)
    assert e2e.run_part("steps", args) == 1
    doc = json.loads((tmp_path / "steps.json").read_text())
    assert "ConfigError" in doc["error"] and doc["partial"] is True
    assert [r["target"] for r in doc["reports"]] == ["tiny"] and doc["reports"][0]["points"][0]["concurrency"] == 1
    assert (tmp_path / "steps.txt").read_text().startswith("BENCH STEPS tiny on cpu")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps-tiny.json", "steps.json", "steps.txt"]
