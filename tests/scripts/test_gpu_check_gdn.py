"""scripts/gpu_check/gpu_check.py's Gated DeltaNet check, run here with the CPU build standing in for the GPU
(the check itself needs a CUDA GPU): the comparison is bit for bit per stage, and it names the stage and tensor
that differ. The GPU side (the plugins' CUDA build, dflash2_trt/trtllm/cuda/plugin_lib.py) is compiled and its C ABI's
host side checked, not run, on this machine (tests/plugins/test_plugin_cuda_lib.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("dflash2_gpu_check", ROOT / "scripts" / "gpu_check" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


G = _load()
SMALL = G.GDN_CASES[0]


@pytest.fixture(scope="module")
def cpu(_tiny_cache):
    from dflash2_trt.errors import MissingDependencyError
    from dflash2_trt.trtllm.cpu.plugin_libs import gdn_lib

    try:
        return gdn_lib()
    except MissingDependencyError as e:
        pytest.skip(str(e))


class _Perturbed:
    """The CPU build with one defect, standing in for a kernel that is wrong in one place."""

    def __init__(self, lib, defect):
        self.lib, self.defect = lib, defect

    def forward(self, *args, zero_state=None, **attrs):
        if self.defect == "ignores zero_state":
            zero_state = None
        y, vq, vg = self.lib.forward(*args, zero_state=zero_state, **attrs)
        if self.defect == "last y bit":
            y.view(torch.int16 if y.element_size() == 2 else torch.int32)[-1, -1] ^= 1
        return y, vq, vg

    def commit(self, *args, **attrs):
        out = self.lib.commit(*args, **attrs)
        if self.defect == "commit state":
            args[7][args[5][-1].long()].view(-1)[0] += 1.0   # rnn_state of the last request's slot
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_build_matches_itself(cpu, dtype):
    assert G.gdn_compare(cpu, cpu, SMALL, dtype, zero_state=True, seed=3, device="cpu") == []


@pytest.mark.parametrize("defect, stage", [("last y bit", ["verify:y"]),
                                           ("commit state", ["commit:rnn_state"])])
def test_a_one_bit_difference_is_named_by_stage(cpu, defect, stage):
    assert G.gdn_compare(_Perturbed(cpu, defect), cpu, SMALL, torch.float16, zero_state=False, seed=4,
                         device="cpu") == stage


def test_ignoring_zero_state_is_caught(cpu):
    bad = G.gdn_compare(_Perturbed(cpu, "ignores zero_state"), cpu, SMALL, torch.float32, zero_state=True, seed=5,
                        device="cpu")
    assert "forward:y" in bad and "forward:rnn_state" in bad


def test_check_gdn_reports_failure(cpu, monkeypatch, capsys):
    monkeypatch.setattr(G, "GDN_CASES", [SMALL])
    res = {}
    assert G.check_gdn(cpu, cpu, res, device="cpu") is True and res["gdn_exact"] is True
    assert G.check_gdn(_Perturbed(cpu, "last y bit"), cpu, res, device="cpu") is False and res["gdn_exact"] is False
    out = capsys.readouterr().out
    assert "gdn MISMATCH" in out and "verify:y" in out and "FAILED" in out
    assert G.check_gdn(cpu, None, res) is True and res["gdn_exact"] is None   # said, not claimed


def test_decode_bound_bytes_are_dominated_by_the_fp32_state():
    """Deferred commit: the forward reads and writes the state once (plus the records, Kv per request each way at
    most), the commit moves only the conv state and the last verify rows."""
    b = G.gdn_decode_bytes(16, 48, 128, 128, 4, 8, 64)
    state = 64 * 48 * 128 * 128 * 4
    records = 64 * 8 * (48 * 128 + 16 * 128 + 48) * 4
    assert 2 * state + 2 * records < b["forward"] < 2.2 * state + 2 * records
    assert b["commit"] < 0.05 * state and b["step"] == b["forward"] + b["commit"]
    assert 470e6 < b["step"] < 480e6                      # docs: ~476 MB per layer at B 64 x Kv 8
    assert G.gdn_decode_bytes(16, 48, 128, 128, 4, 8, 64, pending=4)["forward"] == b["forward"] - records // 2



def test_each_stage_is_saved_as_it_ends_and_a_crash_does_not_stop_the_next(cpu, monkeypatch, tmp_path):
    """gpu_check runs under a time limit in the one GPU command: its JSON is rewritten after every stage (a run stopped
    at the limit keeps the stages done), a failed check fails the run, and a stage that raises is recorded and the
    next one still runs."""
    import json

    monkeypatch.setattr(G, "GDN_CASES", [SMALL])
    path, res, seen = tmp_path / "kernels.json", {}, []

    def crash():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def later():
        seen.append(json.loads(path.read_text()))     # what a run stopped here would have left
        return True

    stages = [("gdn", lambda: G.check_gdn(cpu, cpu, res, device="cpu")),
              ("bad", lambda: G.check_gdn(_Perturbed(cpu, "last y bit"), cpu, {}, device="cpu")),
              ("bench_conv", crash), ("bench_gdn", later)]
    assert G.run_stages(stages, res, path, 0.0) is False
    assert seen[0]["stages_done"] == ["gdn", "bad", "bench_conv"] and seen[0]["gdn_exact"] is True
    assert seen[0]["bench_conv_error"].startswith("RuntimeError: CUDA error")
    doc = json.loads(path.read_text())
    assert doc["stages_done"] == ["gdn", "bad", "bench_conv", "bench_gdn"] and doc["total_s"] > 0
    assert G.run_stages(stages[:1], {}, path, 0.0) is True


def test_which_recurrence_ran_is_recorded_beside_its_times():
    """The prefetching recurrence falls back to the default kernel without a word where its grid cannot be planned
    (``prefetchGrid``: a CUDA query failing, no block fitting): its timings would be the default's under its name.
    The GPU check records which recurrence kernel one step launched (the profiler's kernel names) and says when it
    is not the one asked for; where the profiler records nothing, it says why and decides nothing."""
    mod = _load()
    prefix = "void dflash2::(anonymous namespace)::"
    default = [prefix + "gdnPrologueKernel<dflash2::(anonymous namespace)::BF16>(...)",
               prefix + "gdnRecurrentKernel<128, dflash2::(anonymous namespace)::BF16, 2>(...)"]
    prefetch = [prefix + "gdnRecurrentPrefetchKernel<128, dflash2::(anonymous namespace)::BF16, 1>(...)"]
    assert mod.recurrence_ran(default, "") == {"recurrence_kernels": default[1:], "variant_ran": True}
    assert mod.recurrence_ran(default, "_prefetch")["variant_ran"] is False          # the silent fallback
    assert mod.recurrence_ran(prefetch, "_prefetch_cols1")["variant_ran"] is True
    assert mod.recurrence_ran(prefetch, "_cols1")["variant_ran"] is False
    assert mod.recurrence_ran(None, "_prefetch") == {"recurrence_kernels": None, "variant_ran": None}


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the probe's failure where there is no GPU")
@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_the_kernel_probe_says_why_it_has_no_names():
    mod = _load()
    names, error = mod.kernels_launched(lambda: torch.ones(2) + 1)
    assert names is None and error, error


def test_nominal_bandwidth_takes_the_longest_matching_name():
    mod = _load()
    assert mod.nominal_bw("NVIDIA H200") == 4.8e12 and mod.nominal_bw("NVIDIA GH200 480GB") == 4.0e12
    assert mod.nominal_bw("NVIDIA H100 80GB HBM3") == 3.35e12 and mod.nominal_bw("NVIDIA H100 NVL") == 3.9e12
    assert mod.nominal_bw("NVIDIA L4") is None


def test_the_kernel_probes_run_last_under_their_variants_environment(monkeypatch):
    """A torch profile may leave CUPTI attached (pytorch#144455), so the probes run after every timing, in the last
    stage: each probed step under its variant's environment, its result beside that step's times."""
    import os

    mod = _load()
    seen = []
    monkeypatch.setattr(mod, "probe_profiler", lambda results: results.update(profiler_probe={"ok": True}))

    def launched(fn):
        seen.append(os.environ.get("DFLASH2_GDN_RECURRENT_PREFETCH"))
        return fn(), None

    monkeypatch.setattr(mod, "kernels_launched", launched)
    prefix = "void dflash2::(anonymous namespace)::"
    results = {"gdn_step": {"us": 1.0}, "gdn_step_prefetch": {"us": 2.0}}
    monkeypatch.setattr(mod, "LATE_PROBES", [
        ("gdn_step", "", {}, lambda: [prefix + "gdnRecurrentKernel<128, BF16, 2>(...)"]),
        ("gdn_step_prefetch", "_prefetch", {"DFLASH2_GDN_RECURRENT_PREFETCH": "1"},
         lambda: [prefix + "gdnRecurrentKernel<128, BF16, 2>(...)"]),          # fell back
    ])
    monkeypatch.delenv("DFLASH2_GDN_RECURRENT_PREFETCH", raising=False)
    mod.kernel_probes(results)
    assert seen == [None, "1"] and "DFLASH2_GDN_RECURRENT_PREFETCH" not in os.environ
    assert results["gdn_step"]["variant_ran"] is True and results["gdn_step_prefetch"]["variant_ran"] is False
    assert results["gdn_step"]["us"] == 1.0 and results["profiler_probe"] == {"ok": True} and mod.LATE_PROBES == []
    src = (ROOT / "scripts" / "gpu_check" / "gpu_check.py").read_text()
    stages = src[src.index('stages += [("bench_conv"'):]
    assert stages.index('("kernel_probes"') > stages.index('("bench_gdn_prefill"')   # after every timing
