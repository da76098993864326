"""Sliding-window layers on TensorRT-LLM (engine/trtllm/windows.py): the record of what TensorRT-LLM's attention plugin
does with a window below the KV capacity (facts/attention_window.yaml, read in its sources), and the build plan and the
runtime's windows held to it: where a target's window can bind its sliding layers take the context route (a window the
route cannot take, or a drafter's that can bind, is refused), and a window that cannot bind is passed as max_seq_len."""

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


def test_muse_glimmer_takes_the_context_route_where_its_window_can_bind():
    # K = 15: the 2048-token window can bind at max_seq_len 2019 (positions reach 2019 + 30 - 1 = 2048 with the
    # executor's draft slots), not at 2018; where it can, the sliding layers take each step's new tokens as a context
    # chunk (sliding_path auto -> context) and the engine the project runtime: no blocker. From 2049 the plugin gets the
    # 2048 window and the context part applies it; at 2019..2048 every window is passed as max_seq_len (the project
    # runtime keeps positions below it, so none binds there) and the route only keeps the executor away
    for seq in (("--max-seq-len", "2019", "--max-input-len", "2001"), ()):
        at = _plan(*MUSE, *seq)
        assert at["supported"]["trtllm_engine"] is True and at["trtllm_blockers"] == [], at["trtllm_blockers"]
        assert at["engine_config"]["dflash2_engine"]["sliding_path"] == "context"
        assert at["runtime_path"]["path"] == "project"
        assert any("context route" in w for w in at["runtime_path"]["why"])
    below = _plan(*MUSE, "--max-seq-len", "2018", "--max-input-len", "2001")
    assert below["supported"]["trtllm_engine"] is True and below["trtllm_blockers"] == []
    assert below["engine_config"]["dflash2_engine"]["sliding_path"] == "generation"


def test_muse_glimmer_on_the_generation_path_is_refused_where_its_window_can_bind():
    gen = ("--set", "sliding_path=generation")
    at = _plan(*MUSE, *gen, "--max-seq-len", "2019", "--max-input-len", "2001")
    assert at["supported"]["trtllm_engine"] is False and at["supported"]["cpu_engine"] is True
    (msg,) = at["trtllm_blockers"]
    assert "the target's sliding layers (window 2048)" in msg and "max_seq_len 2019" in msg and FACTS_FILE in msg
    assert "--max-seq-len 2018 (the window never binds: exact)" in msg and "--backend cuda" in msg
    assert "--set sliding_path=context" in msg
    below = _plan(*MUSE, *gen, "--max-seq-len", "2018", "--max-input-len", "2001")
    assert below["supported"]["trtllm_engine"] is True and below["trtllm_blockers"] == []
    # the build config's 40960: the fix names the prompt limit too (32768 would not fit 2018)
    default = _plan(*MUSE, *gen)
    assert "--max-seq-len 2018 --max-input-len 2001 " in default["trtllm_blockers"][0]


def test_the_context_route_is_asked_of_a_target_with_sliding_layers_only():
    r = CliRunner().invoke(main, ["build", "--dry-run", "--json", "--backend", "trtllm", "--target", "tiny",
                                  "--set", "sliding_path=context"])
    assert r.exit_code != 0 and "--set: sliding_path" in r.output and "no sliding-window layers" in r.output
    assert _plan("--target", "tiny", "--set", "drafter_window=full", "--dtype", "float16")["engine_config"][
        "dflash2_engine"]["sliding_path"] == "generation"


def test_a_window_that_cannot_bind_is_passed_as_max_seq_len():
    net = load_network("cpu")
    below = _plan(*MUSE, "--max-seq-len", "2018", "--max-input-len", "2001")["engine_config"]
    assert set(layer_windows(net, below, 2018).tolist()) == {2018}        # uniform: no sliding layer to the plugin
    full = _plan(*MUSE)["engine_config"]
    assert set(layer_windows(net, full, 40960).tolist()) == {2048, 40960}  # the sliding layers keep theirs


@pytest.mark.parametrize("target,side", [("tiny-muse", "the target's"), ("tiny", "the drafter's")])
def test_a_window_no_max_seq_len_can_hide_offers_the_other_ways_only(target, side):
    # window 16: with K 15 (tiny-muse) or 7 (tiny) no engine that admits a prompt keeps every position within it
    # (the target's side on the generation path: on the context route it has no blocker)
    plan = _plan("--target", target, "--set", "sliding_path=generation") if target == "tiny-muse" else \
        _plan("--target", target)
    # tiny-muse's build config keeps its drafter's window too (drafter_window: model): one line per side
    assert len(plan["trtllm_blockers"]) == (2 if target == "tiny-muse" else 1)
    if target == "tiny-muse":
        # auto: the context route, but a window of 16 is not a multiple of the paged context FMHA's KV step, which one
        # runner text refuses: still refused, saying why; the drafter's side stays
        routed = _plan("--target", target)["trtllm_blockers"]
        assert len(routed) == 2 and "the drafter's sliding layers (window 16)" in routed[1]
        assert "take the context route" in routed[0] and "multiple of its KV step (" in routed[0]
        assert "sliding_path=context" not in routed[0] and "--backend cuda" in routed[0]
    (msg,) = [m for m in plan["trtllm_blockers"] if f"{side} sliding layers (window 16)" in m]
    assert "--backend cuda" in msg and "--max-seq-len" not in msg
    assert ("--set drafter_window=full" in msg) is (side == "the drafter's")
    ok = _plan("--target", "tiny", "--set", "drafter_window=full", "--dtype", "float16")
    assert ok["trtllm_blockers"] == [] and ok["supported"]["trtllm_engine"] is True


def test_the_refusal_follows_the_record(monkeypatch):
    """Were the record to say the plugin applies the window in speculative-decoding steps, nothing would be refused;
    were it to say the context part does not apply it either, the context route would not lift the refusal."""
    from dflash2_trt.engine.trtllm import windows

    gen = ("--set", "sliding_path=generation")
    assert _plan(*MUSE, *gen)["trtllm_blockers"] and _plan(*MUSE)["trtllm_blockers"] == []
    f = window_facts()
    patched = {**f, "spec_decoding_generation": {**f["spec_decoding_generation"], "applies_window": True}}
    monkeypatch.setattr(windows, "window_facts", lambda: patched)
    assert _plan(*MUSE, *gen)["trtllm_blockers"] == []
    no_route = {**f, "context_route": {**f["context_route"], "applies_window": False}}
    monkeypatch.setattr(windows, "window_facts", lambda: no_route)
    assert _plan(*MUSE)["trtllm_blockers"]


def test_the_context_route_record_says_what_the_route_relies_on():
    """The route's facts (facts/attention_window.yaml context_route), each from a named source, and the code held to
    them: the runtime's second set is what the record says the plugin needs (past = sequence_length - context_lengths,
    host_past_key_value_lengths = past + new, every request a context request)."""
    import torch

    from dflash2_trt.runtime.runtime import sliding_inputs

    f = window_facts()
    r = f["context_route"]
    for s in r["source"]:
        assert s in f["sources"], s
    assert r["past"] == "sequence_length - context_lengths" and r["host_past_key_value_lengths"] == "past + new tokens"
    assert r["kv_write_position"] == "past + i" and r["kv_read"] == "linear" and f["kv_blocks"]["write_position"] == \
        "absolute"
    assert r["generation_part_without_generation_requests"] == "skipped" and r["needs_paged_context_fmha"] is True
    assert r["executor_binds_second_set"] is False and r["applies_window"] is True
    seq, new = [40, 2070, 9], [40, 16, 1]
    feed = sliding_inputs(seq, new)
    assert feed["sliding_host_request_types"].tolist() == [0, 0, 0]
    assert feed["sliding_context_lengths"].tolist() == new == feed["sliding_host_context_lengths"].tolist()
    # the plugin's past is sequence_length - context_lengths; the key range past + new is the stock chunk value
    assert (torch.tensor(seq) - feed["sliding_context_lengths"]).tolist() == [0, 2054, 8]
    assert feed["sliding_host_past_key_value_lengths"].tolist() == seq
    # the windows the route takes on TensorRT-LLM (route_needs_window: a multiple of the head size's KV step)
    from dflash2_trt.engine.trtllm.windows import route_window_ok

    assert r["route_needs_window"] == "a multiple of the KV step of the layer's head size"
    assert r["kv_step_bf16"] == {"head_64": 256, "head_128": 128, "head_256": 64}
    assert r["sm90_paged_kv_kernel"] == "warp-specialized at every key count"
    assert set(r["sm90_bf16_q_paged_kv_masks"]["head_128"]) >= {"causal", "sliding_or_chunked_causal"}
    assert [route_window_ok(w, 128) for w in (2048, 512, 128, 384, 16, 1000, 4096)] == [True, True, True, True, False,
                                                                                        False, True]
    assert [route_window_ok(w, h) for w, h in ((128, 64), (256, 64), (64, 256), (192, 256), (96, 256))] == [
        False, True, True, True, False]
    # why the code does what it does, each a fact of the record: the baseline routes too (a generation kernel would read
    # a routed layer's linearly written cache cyclically); the graph sizing (the window applies above the key range's
    # bound); the runtime never detaches a block (the FMHA reads up to one tile below the window)
    assert f["kv_blocks"]["mmha_wraps"] is True and f["kv_blocks"]["write_position"] == "absolute"
    assert r["window_applied_when"] == "max(host_past_key_value_lengths) > window"
    assert r["blocks_below_window_read"] is True
    # a routed step's graph holds the plugin's context part: legal under capture given host_context_progress 0, which is
    # the value every runtime of this project binds (engine_io.yaml static_input_values)
    from dflash2_trt.trtllm.engine_io import CONTRACT
    from dflash2_trt.yaml_files import load_yaml_file

    assert r["context_part_capture_legal"] is True and "host_context_progress 0" in r["context_part_capture_needs"]
    assert load_yaml_file(CONTRACT)["static_input_values"]["host_context_progress"] == [0]
    # the engine is built with paged context FMHA, which the route needs (the plugin would not say so), for the
    # combined engine and its baseline alike
    from types import SimpleNamespace

    from dflash2_trt.engine.trtllm.command import trtllm_build_argv, trtllm_engine_config

    cfg = SimpleNamespace(block_size=16, max_batch_size=4, max_input_len=256, max_seq_len=512, max_num_tokens=1024,
                          tokens_per_block=32, dtype="bfloat16")
    for target_only in (False, True):
        argv = trtllm_build_argv(cfg, checkpoint_dir="ckpt", output_dir="out", target_only=target_only)
        assert argv[argv.index("--use_paged_context_fmha") + 1] == "enable"
        assert argv[argv.index("--context_fmha") + 1] == "enable"
        plugins = trtllm_engine_config({"dtype": "bfloat16"}, cfg, target_only=target_only)["build_config"][
            "plugin_config"]
        assert plugins["use_paged_context_fmha"] is True and plugins["paged_kv_cache"] is True


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
