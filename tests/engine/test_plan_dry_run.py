"""``build --dry-run``: the plan from config-only directories, and its memory figures against a hand
computation from the published Qwen3.8-27B configs (read here as plain JSON, not through the project)."""

from __future__ import annotations

import json
import math
import os
import re
import sys

import pytest
from click.testing import CliRunner

from dflash2_trt.cli import main
from dflash2_trt.testing.fixtures import QWEN_DRAFTER, QWEN_TARGET

GIB = 1 << 30


def _cli(*args):
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


def _plan(*args):
    code, text = _cli("build", "--dry-run", "--json", *args)
    assert code == 0, text
    return json.loads(text)


def _qwen(*args):
    """The TensorRT-LLM plan of the published pair (by name: the suite's $DFLASH2_TRT_BACKEND=cpu is what --backend
    auto plans, as the build would build it)."""
    return _plan("--target", "qwen3.8-27b", "--drafter", str(QWEN_DRAFTER), "--target-dir", str(QWEN_TARGET),
                 "--backend", "trtllm", *args)


def _hand_weights(tp: int) -> dict:
    """Per-rank parameter count of the combined checkpoint, from the published configs: every tensor the target
    (Qwen3.5 hybrid: gated full attention + Gated DeltaNet) and the drafter hold, TP-split as TensorRT-LLM does
    (vocab/heads/intermediate split, norms/conv/selector replicated). A_log and dt_bias are counted in bf16
    (config-only directories carry no stored dtype)."""
    t = json.loads((QWEN_TARGET / "config.json").read_text())["text_config"]
    d = json.loads((QWEN_DRAFTER / "config.json").read_text())
    H, V, I = t["hidden_size"], t["vocab_size"], t["intermediate_size"]
    nh, nkv, hd = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    nk, nv, dk, dv, ck = (t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"],
                          t["linear_value_head_dim"], t["linear_conv_kernel_dim"])
    kv_l = max(1, nkv // tp)
    full = (nh // tp) * hd * H * 2 + 2 * kv_l * hd * H + H * (nh // tp) * hd + 2 * hd   # q + gate, k, v, o, q/k norm
    lin = ((2 * nk // tp * dk + nv // tp * dv) * H + (2 * nk // tp * dk + nv // tp * dv) * ck  # qkv, conv1d
           + (nv // tp) * dv * H + 2 * (nv // tp) * H + 2 * (nv // tp) + dv + H * (nv // tp) * dv)  # z, b/a, dt/A, norm, out
    per_layer = 2 * H + 3 * H * I // tp
    n_full = t["layer_types"].count("full_attention")
    n_lin = t["layer_types"].count("linear_attention")
    target = 2 * V // tp * H + H + n_full * (per_layer + full) + n_lin * (per_layer + lin)
    Hd, Id, Ld = d["hidden_size"], d["intermediate_size"], d["num_hidden_layers"]
    dh, dkv, ddim = d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"]
    dc = d["dflash_config"]
    taps, kern, grp, rank = (len(dc["target_layer_ids"]), dc["conv_kernel_size"], dc["conv_group_size"],
                             dc["selector_rank"])
    conv = 2 * (2 * kern * Hd + (2 * kern * Hd // grp) * Hd)        # attention_conv + mlp_conv: base + projection
    layer = (2 * Hd + (dh // tp) * ddim * Hd + 2 * (dkv // tp) * ddim * Hd + Hd * (dh // tp) * ddim + 2 * ddim
             + 3 * Hd * Id // tp + conv)
    drafter = Hd // tp * taps * H + 2 * Hd + Ld * layer + 2 * V * rank + rank * Hd
    return {"target": 2 * target, "drafter": 2 * drafter, "total": 2 * (target + drafter)}


def _hand_sizing(tp: int, gpu_gib: float, *, mbs=64, mnt=8192, seq=40960, block=8, tpb=32, frac=0.9):
    t = json.loads((QWEN_TARGET / "config.json").read_text())["text_config"]
    d = json.loads((QWEN_DRAFTER / "config.json").read_text())
    K = block - 1
    kv_token = (t["layer_types"].count("full_attention") + d["num_hidden_layers"]) * 2 * max(1, 4 // tp) * 256 * 2
    kv_request = math.ceil((seq + 2 * K) / tpb) * tpb * kv_token
    nv, nk = 48 // tp, 16 // tp
    # a slot: the fp32 state and the deferred commit's records (pending count + delta, keys, decay of the K+1 verify
    # tokens), rounded up to whole rows of nv x 128 floats
    rows = -(-(4 + block * (nv * 128 + nk * 128 + nv)) // (nv * 128))
    assert rows == 11
    recurrent = 48 * (nv * (128 + rows) * 128 * 4 + 3 * (2 * nk * 128 + nv * 128) * 2)
    act = mbs * (K + 1) * 248320 * 4 + mnt * 3 * (17408 // tp) * 2 + mnt * 5 * 5120 * 2
    w = _hand_weights(tp)["total"]
    budget = math.floor((int(gpu_gib * GIB) - w - act - GIB) * frac)
    return {"kv_token": kv_token, "kv_request": kv_request, "recurrent": recurrent, "act": act, "budget": budget,
            "fit": budget // (kv_request + recurrent)}


def test_qwen_plan_memory_figures_match_a_hand_computation():
    plan = _qwen()
    z = plan["sizing"]
    w = _hand_weights(1)
    assert z["weights_per_rank"] == [w]
    assert 53 * GIB < w["total"] < 54 * GIB          # ~28.8 B parameters in bf16
    h = _hand_sizing(1, 140.4)                        # the default: an H200's 143771 MiB
    assert z["kv"]["bytes_per_token"] == h["kv_token"] == 86016   # (16 full + 5 drafter) x 2 x 4 x 256 x 2
    assert z["kv"]["pool_layers"] == {"target": 16, "drafter": 5}
    assert z["extra_slots_per_request"] == 14 and z["engine_max_seq_len"] == 40974
    assert z["kv_bytes_per_request"] == h["kv_request"]
    assert z["recurrent_state_bytes_per_request"] == h["recurrent"]
    assert z["activations_estimate"]["total"] == h["act"]
    assert z["kv_budget"] == h["budget"] and z["max_batch_that_fits"] == h["fit"] == 21
    assert z["fits"] is False                         # max_batch_size 64 at the full 40960 context does not
    # ... but 64 at once up to a length: whole 32-token blocks of the budget's 64th, less the state, less 14 slots
    per_request = h["budget"] // 64 - h["recurrent"]
    assert z["full_batch_max_len"] == per_request // (32 * 86016) * 32 - 14
    assert 64 * (h["recurrent"] + -(-(z["full_batch_max_len"] + 14) // 32) * 32 * 86016) <= h["budget"]
    assert 64 * (h["recurrent"] + (-(-(z["full_batch_max_len"] + 14) // 32) + 1) * 32 * 86016) > h["budget"]


def test_gpu_md_quotes_the_qwen_plan():
    """docs/gpu.md's account of the qwen3.8-27b dry run gives the figures the plan prints (its recurrent state per
    request said 146.8 MiB, the figure before the deferred commit's records; the plan says 159.19 MiB)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "gpu.md").read_text(encoding="utf-8")
    quote = " ".join(doc.split("It prints the trtllm-build command and, for one H200", 1)[1].split("`--json` adds")[0]
                     .split())
    code, text = _cli("build", "--dry-run", "--target", "qwen3.8-27b", "--drafter", str(QWEN_DRAFTER), "--target-dir",
                      str(QWEN_TARGET), "--backend", "trtllm")
    assert code == 0, text
    sizes = re.findall(r"\b[\d,.]+ (?:GiB|MiB|B)\b", quote)
    assert len(sizes) >= 6, quote
    for size in sizes:
        assert size in text, f"docs/gpu.md quotes {size}; the plan prints no such figure"
    for said, printed in ((r"(\d+) extra slots", "extra slots per request: {}"),
                          (r"so (\d+) requests at full length", "largest batch at max_seq_len: {} "),
                          (r"(\d+) layers \((\d+) target \+ (\d+) EAGLE-net\), (\d+) attention \(KV pool\) / (\d+) recurrent",
                           "{} layers ({} target + {} EAGLE-net): {} attention (KV pool) / {} recurrent")):
        m = re.search(said, quote)
        assert m and printed.format(*m.groups()) in text, (said, printed)


def test_qwen_plan_tp2_and_gpu_memory():
    z = _qwen("--tp-size", "2", "--gpu-memory-gib", "80")["sizing"]
    w = _hand_weights(2)
    assert z["weights_per_rank"] == [w, w]
    h = _hand_sizing(2, 80)
    assert z["kv"]["bytes_per_token"] == h["kv_token"] == 43008
    assert z["recurrent_state_bytes_per_request"] == h["recurrent"]
    assert z["max_batch_that_fits"] == h["fit"]
    small = _qwen("--gpu-memory-gib", "40")["sizing"]      # weights alone exceed 40 GiB
    assert small["kv_budget"] == 0 and small["max_batch_that_fits"] == 0
    # the text says the weights do not fit, not a negative free memory
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    text = CliRunner().invoke(main, ["build", "--target", "qwen3.8-27b", "--dry-run", "--gpu-memory-gib", "40"]).output
    line = next(ln for ln in text.splitlines() if "KV budget" in ln)
    assert "KV budget: none: the weights, activations and reserve alone need" in line, line
    assert not re.search(r" -\d", line), line                 # no negative free memory
    assert line.endswith("the engine would not load on such a GPU (raise --tp-size, or plan another GPU with "
                         "--gpu-memory-gib)"), line
    # a max_batch_size that no length lets run at once (the state alone, 159 MiB a request): said so, not "up to 0"
    r = CliRunner().invoke(main, ["build", "--target", "qwen3.8-27b", "--dry-run", "--backend", "trtllm",
                                  "--gpu-memory-gib", "66", "--max-seq-len", "2048", "--max-input-len", "1024",
                                  "--max-batch-size", "512", "--json"])
    z = json.loads(r.stdout)["sizing"]
    one = 32 * 86016 + z["recurrent_state_bytes_per_request"]    # 1 + 1 tokens and 14 extra slots: one 32-token block
    assert z["full_batch_max_len"] == 0 and z["most_requests_at_once"] == z["kv_budget"] // one
    assert z["max_batch_that_fits"] <= z["most_requests_at_once"] < 512
    text = CliRunner().invoke(main, ["build", "--target", "qwen3.8-27b", "--dry-run", "--backend", "trtllm",
                                     "--gpu-memory-gib", "66", "--max-seq-len", "2048", "--max-input-len", "1024",
                                     "--max-batch-size", "512"]).output
    assert (f"(max_batch_size 512 does NOT fit at any length: at most {z['most_requests_at_once']} requests run at "
            f"once, however short; the rest wait for KV blocks: lower --max-batch-size)") in text, text
    text = CliRunner().invoke(main, ["build", "--target", "qwen3.8-27b", "--dry-run", "--gpu-memory-gib", "58"]).output
    assert "largest batch at max_seq_len: 0 (not one request of max_seq_len 40960 fits the KV budget: lower " \
           "--max-seq-len or raise --tp-size)" in text, text


def test_qwen_plan_is_honest_about_support(monkeypatch):
    """What is supported comes from the network file itself: with no engine network for the hybrid family the plan
    says so (and names the issue), with one it does not; a pool layout that does not fit (tp 8: the target's
    duplicated 1 x 256 KV heads against the drafter's 1 x 128) is a blocker either way."""
    from dflash2_trt.trtllm.backend import load_network

    net = load_network("cpu")
    monkeypatch.setattr(net, "TARGET_FAMILIES", {k: v for k, v in net.TARGET_FAMILIES.items() if k != "qwen3_5"})
    plan = _qwen()
    assert plan["supported"]["cpu_engine"] is False and plan["supported"]["trtllm_engine"] is False
    assert any("no engine network yet" in b and "issue 15" in b for b in plan["blockers"])
    assert plan["supported"]["stages"][:4] == ["inspect", "generate", "analyze", "convert"]
    code, text = _cli("build", "--dry-run", "--target", "qwen3.8-27b", "--drafter", str(QWEN_DRAFTER),
                      "--target-dir", str(QWEN_TARGET), "--backend", "trtllm")
    assert code == 0, text
    assert "largest batch at max_seq_len: 21 (max_batch_size 64 does NOT fit at that length: a request starts only " \
           "with KV blocks for its whole length, so longer ones wait, none is refused; all 64 run at once up to " in text
    assert "tensorrt_llm (TensorRT-LLM 1.2.x): install it in an environment of its own and pass its Python " \
           "(--trtllm-python PY or $DFLASH2_TRTLLM_PYTHON; README)" in text or "TensorRT-LLM 1.2.x) in " in text
    for needle in ("KV cache per token: 86,016 B", "extra slots per request: 14", "largest batch at max_seq_len: 21",
                   "weights: 53.", "recurrent state per request", "blocked: target family 'qwen3_5'",
                   "--max_draft_len 7"):
        assert needle in text, needle
    assert not any("float32" in w for w in plan["warnings"])          # bfloat16
    assert any("69 pool layers" in w for w in plan["warnings"])         # 64 + 5 under TensorRT-LLM's layer names
    monkeypatch.undo()
    plan = _qwen("--tp-size", "8")
    assert any("does not fit the target's pool layout" in b for b in plan["blockers"])
    assert plan["supported"]["cpu_engine"] is False


def test_tiny_trtllm_dry_run_command():
    from dflash2_trt.trtllm.backend import MODEL_FILE

    plan = _plan("--target", "tiny", "--backend", "trtllm", "--output", "tiny-engine")
    argv = plan["trtllm_build"]["argv"]
    # trtllm-build through the entry point that registers the DFlash2 architectures in MODEL_MAP first
    assert argv[0] == sys.executable and argv[1:3] == ["-m", "dflash2_trt.trtllm.register"]
    argv = argv[2:]
    flags = dict(zip(argv[1::2], argv[2::2]))
    assert flags["--model_cls_file"] == str(MODEL_FILE) and flags["--model_cls_name"] == "DFlash2ForCausalLM"
    assert flags["--speculative_decoding_mode"] == "eagle" and flags["--max_draft_len"] == "7"
    assert flags["--workers"] == "1" and flags["--tokens_per_block"] == "32" and flags["--kv_cache_type"] == "paged"
    assert flags["--max_batch_size"] == "4" and flags["--max_seq_len"] == "512" and flags["--max_num_tokens"] == "1024"
    assert flags["--checkpoint_dir"] == "tiny-engine/build-checkpoint" and flags["--output_dir"] == "tiny-engine"
    assert plan["trtllm_build"]["env"]["DFLASH2_TRT_BACKEND"] == "trtllm"
    assert plan["eagle_choices"] == [[0] * i for i in range(1, 8)]
    assert [s["step"] for s in plan["steps"]] == ["validate", "convert", "plugins", "engine", "verify"]
    engine_step = plan["steps"][3]["what"]      # every file the build writes for trtllm-bench (test_trtllm_branch.py)
    assert all(f in engine_step for f in ("extra_llm_api_options.yaml", "sampler_options.yaml")), engine_step
    assert plan["verify"] is True                          # small target: on by default
    code, text = _cli("build", "--target", "tiny", "--backend", "trtllm", "--dry-run")
    assert code == 0 and "--model_cls_file" in text and "--speculative_decoding_mode eagle" in text
    assert "--max_draft_len 7" in text


def test_dry_run_settings_flow_into_the_command():
    plan = _plan("--target", "tiny", "--backend", "trtllm", "--block-size", "4", "--set", "tokens_per_block=64",
                 "--set", "max_batch_size=2", "--set", "drafter_window=full")
    flags = dict(zip(plan["trtllm_build"]["argv"][1::2], plan["trtllm_build"]["argv"][2::2]))
    assert flags["--max_draft_len"] == "3" and flags["--tokens_per_block"] == "64" and flags["--max_batch_size"] == "2"
    assert plan["trtllm_blockers"] == [] and plan["supported"]["trtllm_engine"] is True
    assert plan["sizing"]["extra_slots_per_request"] == 6
    # the default drafter_window 'model' of a sliding-window drafter is refused for TensorRT-LLM, with the fix named
    plan = _plan("--target", "tiny", "--backend", "trtllm")
    assert plan["supported"]["cpu_engine"] is True and plan["supported"]["trtllm_engine"] is False
    assert "drafter_window=full" in plan["trtllm_blockers"][0]
    assert any("dtype float32" in w for w in plan["warnings"]) and not any("pool layers" in w for w in plan["warnings"])


def test_cpu_dry_run_has_no_trtllm_command():
    plan = _plan("--target", "tiny", "--backend", "cpu")
    assert plan["backend"] == "cpu" and plan["trtllm_build"] is None
    assert [s["step"] for s in plan["steps"]] == ["validate", "convert", "engine", "verify"]


@pytest.mark.parametrize("args,needle", [
    (["--gpu-memory-gib", "0"], "--gpu-memory-gib: must be a positive number"),
    (["--set", "nope=1"], "--set: nope: unknown key"),
    (["--tp-size", "8"], "not divisible by --tp-size 8"),
])
def test_dry_run_bad_input(args, needle):
    code, text = _cli("build", "--target", "tiny", "--dry-run", *args)
    assert code == 1 and needle in text and len(text.strip().splitlines()) == 1, text


# ------------------------------------------------------------------------------------------------ the disk check
class _Usage:
    """``shutil.disk_usage`` reporting ``free`` bytes everywhere."""

    def __init__(self, free: int):
        self.free = free

    def __call__(self, path):
        import collections

        return collections.namedtuple("usage", "total used free")(self.free * 2, self.free, self.free)


def test_the_plan_says_what_the_build_writes_and_where(tmp_path, monkeypatch):
    """The dry run's disk check: the converted checkpoint beside the engine and the engines (the same weights: every
    rank's tensors, the hand count above) on the output's file system, with 10% headroom; a kept checkpoint directory
    counts as reused when it matches this build (the build's own check, here made to say so), in full when not (the
    build refuses it; --reconvert writes it again)."""
    import shutil

    from dflash2_trt.engine import plan as plan_mod

    monkeypatch.setattr(shutil, "disk_usage", _Usage(500 * GIB))
    out = tmp_path / "qwen-engine"
    plan = _qwen("--output", str(out), "--tp-size", "2")
    total = sum(r["total"] for r in plan["sizing"]["weights_per_rank"])
    (g,) = plan["disk"]
    assert [(it["what"], it["path"], it["bytes"], it["reused"]) for it in g["items"]] == [
        ("checkpoint", str(tmp_path / "qwen-engine.checkpoint"), total, False), ("engines", str(out), total, False)]
    assert g["need"] == int(2 * total * 1.10) and g["fits"] and g["anchor"] == str(tmp_path)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    from dflash2_trt.convert.schema import FORMAT

    (ckpt / "manifest.json").write_text(json.dumps({"format": FORMAT}))   # a checkpoint's, whatever else it says
    plan = _qwen("--output", str(out), "--tp-size", "2", "--checkpoint-dir", str(ckpt))
    (g,) = plan["disk"]
    assert plan["checkpoint"]["state"] == "mismatch" and plan["checkpoint"]["why"].startswith("schema_version: None")
    assert [it["reused"] for it in g["items"]] == [False, False] and g["need"] == int(2 * total * 1.10)
    with monkeypatch.context() as m:
        m.setattr(plan_mod, "checkpoint_problems", lambda *a, **k: [])     # as if it matched
        (g,) = _qwen("--output", str(out), "--tp-size", "2", "--checkpoint-dir", str(ckpt))["disk"]
    assert [it["reused"] for it in g["items"]] == [True, False] and g["need"] == int(total * 1.10)
    monkeypatch.setattr(shutil, "disk_usage", _Usage(10 * GIB))
    code, text = _cli("build", "--dry-run", "--target", "qwen3.8-27b", "--drafter", str(QWEN_DRAFTER), "--target-dir",
                      str(QWEN_TARGET), "--output", str(out), "--backend", "trtllm")
    assert code == 0 and "-- NOT ENOUGH: the build will refuse" in text and "10.00 GiB free" in text, text


def test_a_build_without_room_refuses_before_anything_is_written(tmp_path, monkeypatch):
    """One line naming the sizes, the place and what is free; nothing written; --no-disk-check builds anyway."""
    import shutil

    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.build import build_engine
    from dflash2_trt.errors import ConfigError

    pair = trained_pair("qwen3")
    monkeypatch.setattr(shutil, "disk_usage", _Usage(1024))
    out = tmp_path / "engine"
    with pytest.raises(ConfigError, match=r"^--output: the build needs about .* free on the file system of "
                                          rf"{tmp_path} \(checkpoint .* at {out}/checkpoint; 10% headroom\), 1.00 KiB "
                                          r"is available: free space there, or pass --no-disk-check$"):
        build_engine(pair.drafter_dir, pair.target_dir, out, target_key="tiny")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    # the TensorRT-LLM backend: the checkpoint beside the engines, and the advice to move it (before any toolchain
    # is looked for)
    with pytest.raises(ConfigError, match=rf"^--output: .* \(checkpoint .* at {out}.checkpoint; engines .* at {out}; "
                                          r"10% headroom\), 1.00 KiB is available: free space there, put the "
                                          r"checkpoint on another disk with --checkpoint-dir, or pass --no-disk-check$"):
        build_engine(pair.drafter_dir, pair.target_dir, out, target_key="tiny", backend="trtllm",
                     overrides={"drafter_window": "full"})
    assert list(tmp_path.iterdir()) == []
    (out / "x").mkdir(parents=True)          # an output the build refuses anyway: that refusal comes first
    from dflash2_trt.checkpoint.writer import OutputDirError

    with pytest.raises(OutputDirError):
        build_engine(pair.drafter_dir, pair.target_dir, out, target_key="tiny")
    (out / "x").rmdir()
    out.rmdir()
    code, text = _cli("build", "--target", "tiny", "--output", str(out), "--no-verify")
    assert code != 0 and text.count("\n") == 1 and text.startswith("error: --output: the build needs about"), text
    res = build_engine(pair.drafter_dir, pair.target_dir, out, target_key="tiny", disk_check=False)
    assert (out / "engine.json").is_file() and res.manifest["backend"] == "cpu"


def test_a_place_that_cannot_be_written_is_not_reported_as_full(tmp_path):
    """`build --output /proc/x` said "0 B is available: free space there" (/proc shows no free space); the reason is
    that nothing can be written there (a new user's review)."""
    code, text = _cli("build", "--target", "tiny", "--backend", "cpu", "--output", "/proc/dflash2-x", "--no-verify")
    assert code == 1 and text.startswith("error: --output: cannot write in /proc: ") and text.count("\n") == 1, text
    assert not os.path.exists("/proc/dflash2-x")
    code, text = _cli("build", "--target", "tiny", "--backend", "cpu", "--output", "/proc/dflash2-x", "--dry-run")
    assert code == 0 and "/proc, 0 B free -- CANNOT WRITE THERE (" in text, text      # the dry run says the same


def test_a_full_disk_is_still_called_full(tmp_path, monkeypatch):
    """A full ext4 fails the probe's mkdir with ENOSPC: that is the free-space case, whose message (the sizes and
    what to do) applies, not "cannot write" (a review of the probe)."""
    import errno
    import shutil

    from dflash2_trt.engine import plan as plan_mod

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(shutil, "disk_usage", _Usage(0))
    monkeypatch.setattr(plan_mod.tempfile, "TemporaryDirectory", full)
    code, text = _cli("build", "--target", "tiny", "--backend", "cpu", "--output", str(tmp_path / "e"), "--no-verify")
    assert code == 1 and text.startswith("error: --output: the build needs about ") and \
        text.endswith("0 B is available: free space there, or pass --no-disk-check\n"), text
    monkeypatch.setattr(plan_mod.tempfile, "TemporaryDirectory", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.EROFS, "Read-only file system")))
    code, text = _cli("build", "--target", "tiny", "--backend", "cpu", "--output", str(tmp_path / "e"), "--no-verify")
    assert code == 1 and text == f"error: --output: cannot write in {tmp_path}: Read-only file system\n", text


def test_what_a_rewrite_or_a_copy_costs(tmp_path, monkeypatch):
    """--reconvert rewrites a kept checkpoint that does not match (a new one beside the old until the swap): counted in
    full; one that matches is reused (the build's ensure_checkpoint), but with --reconvert still counted in full (the
    build's re-hash, which a dry run skips, may find a file changed in place and convert again). A cpu engine holds its
    --checkpoint-dir's files as hard links on the same file system (nothing more) and as copies across (the whole
    checkpoint again, on the output's file system)."""
    from dflash2_trt.engine import plan as plan_mod
    from dflash2_trt.engine.plan import disk_needs, prepare

    p = prepare(QWEN_DRAFTER, QWEN_TARGET, target_key="qwen3.8-27b")
    ckpt, out = tmp_path / "ckpt", tmp_path / "engine"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text("{}")
    redo = disk_needs(p, backend="trtllm", output=out, checkpoint_dir=ckpt, reconvert=True)
    assert [(it["reused"], it.get("state")) for it in redo] == [(False, "replaced"), (False, None)]
    monkeypatch.setattr(plan_mod, "checkpoint_problems", lambda *a, **k: [])     # as if it matched
    keep = disk_needs(p, backend="trtllm", output=out, checkpoint_dir=ckpt)
    kept = disk_needs(p, backend="trtllm", output=out, checkpoint_dir=ckpt, reconvert=True)
    assert [it["reused"] for it in keep] == [True, False]
    # with --reconvert the build's re-hash may still find a file changed in place and write it again: in full
    assert [(it["reused"], it.get("state")) for it in kept] == [(False, "reused"), (False, None)]
    same = disk_needs(p, backend="cpu", output=out, checkpoint_dir=ckpt)
    assert [(it["what"], it["reused"]) for it in same] == [("checkpoint", True),
                                                           ("checkpoint files in the engine (hard links)", True)]
    real = plan_mod._device
    monkeypatch.setattr(plan_mod, "_device", lambda path: "other" if str(path).startswith(str(ckpt)) else real(path))
    ckpt_inner = ckpt / "sub"
    across = disk_needs(p, backend="cpu", output=out, checkpoint_dir=ckpt_inner)
    assert [(it["what"], it["reused"], it["anchor"]) for it in across] == [
        ("checkpoint", False, str(ckpt)), ("checkpoint files in the engine (copies)", False, str(tmp_path))]


def test_the_dry_run_refuses_a_checkpoint_dir_the_build_would_refuse(tmp_path):
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "notes.txt").write_text("mine")
    for backend in ("cpu", "trtllm"):
        r = CliRunner().invoke(main, ["build", "--target", "tiny", "--backend", backend, "--dry-run",
                                      "--checkpoint-dir", str(docs), "--output", str(tmp_path / "e")])
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 1 and "not empty and not a dflash2-trt checkpoint" in lines[-1], r.output
    assert [p.name for p in docs.iterdir()] == ["notes.txt"]


# ------------------------------------------------------------------------- the dry run says what the build does
def _run(*args, env=None):
    r = CliRunner().invoke(main, list(args), env=env)
    return r.exit_code, r.output


@pytest.mark.parametrize("value,planned", [("cpu", "cpu"), ("cuda", "cuda"), ("trtllm", "trtllm"),
                                           ("auto", "trtllm"), (None, "trtllm")])
def test_backend_auto_plans_what_the_variable_names(value, planned):
    """$DFLASH2_TRT_BACKEND is what --backend auto resolves to before the auto rule (the build's own resolve): the
    dry run plans that backend; where it leaves the choice to the auto rule, the dry run plans TensorRT-LLM. A named
    --backend wins over the variable, as in the build."""
    plan = json.loads(_run("build", "--target", "tiny", "--dry-run", "--json",
                           env={"DFLASH2_TRT_BACKEND": value})[1])
    assert plan["backend"] == planned
    assert (plan["trtllm_build"] is None) == (planned != "trtllm")
    code, text = _run("build", "--target", "tiny", "--dry-run", env={"DFLASH2_TRT_BACKEND": value})
    assert code == 0 and text.startswith(f"plan: build tiny (qwen3) -> ENGINE_DIR [{planned} backend]"), text
    for named in ("cpu", "trtllm"):
        plan = json.loads(_run("build", "--target", "tiny", "--dry-run", "--json", "--backend", named,
                               env={"DFLASH2_TRT_BACKEND": value})[1])
        assert plan["backend"] == named


def test_an_unknown_backend_variable_is_the_builds_error(tmp_path):
    """DFLASH2_TRT_BACKEND=gpu: the dry run stops with the build's own error line (it planned a TensorRT-LLM build)."""
    env = {"DFLASH2_TRT_BACKEND": "gpu"}
    build = _run("build", "--target", "tiny", "--output", str(tmp_path / "e"), env=env)
    dry = _run("build", "--target", "tiny", "--dry-run", env=env)
    assert build[0] == dry[0] == 1 and not (tmp_path / "e").exists()
    assert dry[1] == build[1] == "error: DFLASH2_TRT_BACKEND: unknown backend 'gpu'; expected auto, cpu, cuda, trtllm\n"


def test_a_verify_pool_the_build_refuses_is_refused_by_the_dry_run(tmp_path):
    """num_kv_blocks too small for the verify gate's requests: the cpu (and cuda) build refuses it before converting,
    and the dry run with the same error line; --no-verify, or the TensorRT-LLM backend (no such pool), plans it."""
    args = ("build", "--target", "tiny", "--set", "num_kv_blocks=1")
    for backend in ("cpu", "cuda"):
        code, text = _run(*args, "--backend", backend, "--dry-run")
        assert code == 1 and text.startswith("error: num_kv_blocks: 1 KV block(s) of 32 tokens cannot hold the "
                                             "verify gate's longest request") and text.count("\n") == 1, text
    build = _run(*args, "--backend", "cpu", "--output", str(tmp_path / "e"))
    assert build == (1, _run(*args, "--backend", "cpu", "--dry-run")[1]) and not (tmp_path / "e").exists()
    code, text = _run(*args, "--backend", "cpu", "--dry-run", "--no-verify")
    assert code == 0 and "[off]" in text, text
    assert _run(*args[:-1], "num_kv_blocks=2", "--backend", "cpu", "--dry-run")[0] == 0
    assert _run(*args, "--backend", "trtllm", "--dry-run")[0] == 0


@pytest.fixture(scope="module")
def _kept(tmp_path_factory):
    """A checkpoint of the tiny pair as a tp 1 build keeps it (the build's own ensure_checkpoint)."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.checkpoint import ensure_checkpoint
    from dflash2_trt.engine.plan import prepare

    pair = trained_pair("qwen3")
    ckpt = tmp_path_factory.mktemp("kept") / "e1.checkpoint"
    res = ensure_checkpoint(prepare(pair.drafter_dir, pair.target_dir, target_key="tiny"), ckpt)
    assert res["reused"] is False and (ckpt / "manifest.json").is_file()
    return ckpt


def _convert_step(plan: dict) -> str:
    return next(st["what"] for st in plan["steps"] if st["step"] == "convert")


def test_a_kept_checkpoint_is_checked_as_the_build_checks_it(_kept, monkeypatch):
    """OUTPUT.checkpoint kept from a tp 1 build: the tp 1 plan reuses it (and counts nothing for it on the disk);
    a tp 2 plan says the build will refuse it, with the build's own reason (the real build's error line), and
    counts it in full; with --reconvert it is replaced; and only the checks before the content re-hash run (the
    build's checkpoint_problems, stopped there; a 27B checkpoint is 54 GB to hash)."""
    from dflash2_trt.engine import checkpoint as ck_mod

    out = _kept.parent / "e1"
    base = ("--target", "tiny", "--backend", "trtllm", "--output", str(out), "--set", "drafter_window=full")

    def hashing(*a, **k):
        raise AssertionError("the dry run re-hashed a checkpoint file")

    with monkeypatch.context() as m:
        m.setattr(ck_mod, "sha256_file", hashing)
        plan = _plan(*base)
        code, text = _run("build", *base, "--dry-run")
    assert plan["checkpoint"] == {"path": str(_kept), "state": "reused", "why": None}
    assert _convert_step(plan).startswith(f"checkpoint at {_kept}: reused (its manifest matches this build")
    assert "re-hashes every file before reusing it, a dry run does not" in _convert_step(plan)
    (g,) = plan["disk"]
    assert [it["reused"] for it in g["items"]] == [True, False]
    assert code == 0 and f"MiB (reused) at {_kept}, engines" in text, text

    plan = _plan(*base, "--tp-size", "2", "--no-verify")
    why = "tp_size: 1, this build needs 2"
    assert plan["checkpoint"] == {"path": str(_kept), "state": "mismatch", "why": why}
    assert _convert_step(plan) == (f"checkpoint at {_kept}: exists and does NOT match this build: {why}: the build "
                                   f"will refuse; pass --reconvert to replace it, or another --checkpoint-dir")
    (g,) = plan["disk"]
    assert [it["reused"] for it in g["items"]] == [False, False]
    text = _run("build", *base, "--tp-size", "2", "--no-verify", "--dry-run")[1]
    assert "(does not match this build: the build will refuse without --reconvert)" in text and "(reused)" not in text
    code, build = _run("build", *base, "--tp-size", "2", "--no-verify")   # the build itself: refused, that reason
    assert code == 1 and build.splitlines()[-1] == (f"error: {_kept}/manifest.json: exists and does not match this "
                                                    f"build: {why}; pass --reconvert to replace it, or another "
                                                    f"--checkpoint-dir"), build

    plan = _plan(*base, "--tp-size", "2", "--no-verify", "--reconvert")
    assert plan["checkpoint"]["state"] == "replaced"
    assert _convert_step(plan) == f"checkpoint at {_kept}: exists and does not match this build ({why}): replaced " \
                                  f"(--reconvert)"
    (g,) = plan["disk"]
    assert [it["reused"] for it in g["items"]] == [False, False] and g["need"] == int(2 * g["items"][1]["bytes"] * 1.1)
    text = _run("build", *base, "--tp-size", "2", "--no-verify", "--reconvert", "--dry-run")[1]
    assert "(replaced: --reconvert)" in text, text
    # a matching one is reused with --reconvert too (it replaces only one that does not match), and nothing is
    # written where none is kept yet
    assert _plan(*base, "--reconvert")["checkpoint"]["state"] == "reused"
    plan = _plan(*base[:-4], "--output", str(out) + "-new", *base[-2:])
    assert plan["checkpoint"]["state"] == "written" and "written (nothing there yet)" in _convert_step(plan)


def test_a_cpu_builds_checkpoint_dir_is_checked_too(_kept):
    """A cpu build links its --checkpoint-dir's files: reused when it matches, refused (said so) when not."""
    base = ("--target", "tiny", "--backend", "cpu", "--checkpoint-dir", str(_kept), "--no-verify")
    plan = _plan(*base)
    assert plan["checkpoint"]["state"] == "reused"
    assert _convert_step(plan).startswith(f"checkpoint into ENGINE_DIR/checkpoint, linked from {_kept}: reused (")
    plan = _plan(*base, "--dtype", "bfloat16")
    assert plan["checkpoint"] == {"path": str(_kept), "state": "mismatch",
                                  "why": "dtype: 'float32', this build needs 'bfloat16'"}
    assert "does NOT match this build: dtype: 'float32', this build needs 'bfloat16': the build will refuse" \
        in _convert_step(plan)
    assert _plan(*base, "--dtype", "bfloat16", "--reconvert")["checkpoint"]["state"] == "replaced"


def test_a_dry_run_checks_only_the_checkpoint_place_the_build_uses(tmp_path, monkeypatch):
    """With DFLASH2_TRT_BACKEND=cpu, `--backend auto --dry-run` plans a cpu build, which keeps no OUTPUT.checkpoint;
    the dry run still refused a foreign directory there that the real build never touches (the session's
    reviewer)."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    foreign = tmp_path / "X.checkpoint"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    monkeypatch.setenv("DFLASH2_TRT_BACKEND", "cpu")
    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--output", str(tmp_path / "X"), "--dry-run"])
    assert r.exit_code == 0 and "[cpu backend]" in r.output, r.output
    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--backend", "trtllm", "--output", str(tmp_path / "X"),
                                  "--dry-run"])
    assert r.exit_code == 1 and "not empty and not a dflash2-trt checkpoint" in r.output, r.output
