"""Sliding-window layers on TensorRT-LLM (engine/trtllm/windows.py): the record of what TensorRT-LLM's attention plugin
does with a window below the KV capacity (facts/attention_window.yaml, read in its sources), and the build plan and the
runtime's windows held to it: a TensorRT-LLM build is refused where a window can bind, and a window that cannot bind
is passed as max_seq_len."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dflash2_trt.cli import main
from dflash2_trt.engine.binding import layer_windows
from dflash2_trt.engine.trtllm.windows import FACTS_FILE, window_facts
from dflash2_trt.trtllm.backend import load_network
from dflash2_trt.testing.fixtures import MUSE_DRAFTER, MUSE_TARGET

MUSE = ("--target", "muse-glimmer-30b", "--drafter", str(MUSE_DRAFTER), "--target-dir", str(MUSE_TARGET))


def _plan(*args):
    r = CliRunner().invoke(main, ["build", "--dry-run", "--json", "--backend", "trtllm", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_the_record_names_a_source_for_every_fact_and_agrees_with_itself():
    f = window_facts()
    for name, src in f["sources"].items():
        assert src["repo"] == "NVIDIA/TensorRT-LLM" and src["path"] and src["revision"], name
    for section in ("window_inputs", "context", "spec_decoding_generation", "kv_blocks"):
        srcs = f[section]["source"]
        for s in ([srcs] if isinstance(srcs, str) else srcs):
            assert s in f["sources"], (section, s)
    g = f["spec_decoding_generation"]
    # the plugin carries no tree flag, the op's default is tree, and XQA takes a window only for chained drafts: so
    # neither XQA path is given the window, and the step does not apply it
    assert g["plugin_sets_spec_dec_tree"] is False and g["spec_dec_tree_default"] is True
    assert g["jit_passes_window"] is False and g["precompiled_passes_window"] is False
    assert g["applies_window"] is (g["jit_passes_window"] or g["precompiled_passes_window"])
    assert f["context"]["applies_window"] is True
    assert f["window_inputs"]["layer_window"].startswith("host_max_attention_window_sizes[layer_idx]")
    assert f["rule"]["window_can_bind"] == "W < max_seq_len + 2K"
    from dflash2_trt.engine.trtllm.runtime_rules import facts

    b = facts("spec_decoding_sm100")
    for section in ("dispatcher", "tests"):
        srcs = b[section]["source"]
        for s in ([srcs] if isinstance(srcs, str) else srcs):
            assert b["sources"][s]["repo"] == "NVIDIA/TensorRT-LLM" and b["sources"][s]["revision"], (section, s)
    assert b["dispatcher"]["sm100_spec_decoding_supported"] is False and b["tensorrt_engine_spec_decoding_on_sm100"] \
        is b["dispatcher"]["sm100_spec_decoding_supported"]


def test_muse_glimmer_is_refused_where_its_window_can_bind_and_built_where_it_cannot():
    # K = 15: the 2048-token window binds at max_seq_len 2019 (positions reach 2019 + 30 - 1 = 2048), not at 2018
    at = _plan(*MUSE, "--max-seq-len", "2019", "--max-input-len", "2001")
    assert at["supported"]["trtllm_engine"] is False and at["supported"]["cpu_engine"] is True
    (msg,) = at["trtllm_blockers"]
    assert "the target's sliding layers (window 2048)" in msg and "max_seq_len 2019" in msg and FACTS_FILE in msg
    assert "--max-seq-len 2018 (the window never binds: exact)" in msg and "--backend cuda" in msg
    below = _plan(*MUSE, "--max-seq-len", "2018", "--max-input-len", "2001")
    assert below["supported"]["trtllm_engine"] is True and below["trtllm_blockers"] == []
    # the build config's 40960: the fix names the prompt limit too (32768 would not fit 2018)
    default = _plan(*MUSE)
    assert "--max-seq-len 2018 --max-input-len 2001 " in default["trtllm_blockers"][0]


def test_a_window_that_cannot_bind_is_passed_as_max_seq_len():
    net = load_network("cpu")
    below = _plan(*MUSE, "--max-seq-len", "2018", "--max-input-len", "2001")["engine_config"]
    assert set(layer_windows(net, below, 2018).tolist()) == {2018}        # uniform: no sliding layer to the plugin
    full = _plan(*MUSE)["engine_config"]
    assert set(layer_windows(net, full, 40960).tolist()) == {2048, 40960}  # the sliding layers keep theirs


@pytest.mark.parametrize("target,side", [("tiny-muse", "the target's"), ("tiny", "the drafter's")])
def test_a_window_no_max_seq_len_can_hide_offers_the_other_ways_only(target, side):
    # window 16: with K 15 (tiny-muse) or 7 (tiny) no engine that admits a prompt keeps every position within it
    plan = _plan("--target", target)
    # tiny-muse's build config keeps its drafter's window too (drafter_window: model): one line per side
    assert len(plan["trtllm_blockers"]) == (2 if target == "tiny-muse" else 1)
    (msg,) = [m for m in plan["trtllm_blockers"] if f"{side} sliding layers (window 16)" in m]
    assert "--backend cuda" in msg and "--max-seq-len" not in msg
    assert ("--set drafter_window=full" in msg) is (side == "the drafter's")
    ok = _plan("--target", "tiny", "--set", "drafter_window=full", "--dtype", "float16")
    assert ok["trtllm_blockers"] == [] and ok["supported"]["trtllm_engine"] is True


def test_the_refusal_follows_the_record(monkeypatch):
    """Were the record to say the plugin applies the window in speculative-decoding steps, nothing would be refused."""
    from dflash2_trt.engine.trtllm import windows

    assert _plan(*MUSE)["trtllm_blockers"]
    f = window_facts()
    patched = {**f, "spec_decoding_generation": {**f["spec_decoding_generation"], "applies_window": True}}
    monkeypatch.setattr(windows, "window_facts", lambda: patched)
    assert _plan(*MUSE)["trtllm_blockers"] == []


def test_blackwell_is_named_in_a_trtllm_plan_and_refused_on_a_blackwell_machine(monkeypatch):
    from dflash2_trt.engine.plan import dry_run_plan
    from dflash2_trt.engine.trtllm.toolchain import Toolchain
    from dflash2_trt.engine.trtllm.windows import is_sm100_family

    assert [is_sm100_family(s) for s in ("sm_100a", "sm_103", "sm_90a", "sm_120", None)] == [True, True, False,
                                                                                              False, False]
    args = (MUSE_DRAFTER, MUSE_TARGET)
    kw = dict(target_key="muse-glimmer-30b", backend="trtllm", overrides={"max_seq_len": 2018, "max_input_len": 2001})
    # no GPU here: the config's gpus include sm_100a, so the plan warns; a cpu plan does not
    plan = dry_run_plan(*args, **kw, toolchain=Toolchain())
    assert plan["trtllm_blockers"] == [] and any("on Blackwell (SM 100 / 103)" in w for w in plan["warnings"])
    cpu = dry_run_plan(*args, **{**kw, "backend": "cpu"}, toolchain=Toolchain())
    assert not any("Blackwell" in w for w in cpu["warnings"])
    # on a B200 the build would refuse: the plan says so as a blocker, unless the override is set
    b200 = Toolchain(gpu_name="NVIDIA B200", gpu_sm="sm_100a")
    (msg,) = dry_run_plan(*args, **kw, toolchain=b200)["trtllm_blockers"]
    assert "GPU is sm_100a" in msg and "DFLASH2_TRTLLM_ALLOW_SM100=1" in msg
    monkeypatch.setenv("DFLASH2_TRTLLM_ALLOW_SM100", "1")
    assert dry_run_plan(*args, **kw, toolchain=b200)["trtllm_blockers"] == []
    h200 = Toolchain(gpu_name="NVIDIA H200", gpu_sm="sm_90a")
    assert not any("Blackwell" in w for w in dry_run_plan(*args, **kw, toolchain=h200)["warnings"])
