"""The roofline projection against hand computations, the published shapes against the fixtures, the
acceptance it takes from a report, and its comparison with the article."""

from __future__ import annotations

import json
import math
import re

import pytest

from dflash2_trt.bench.projection import (ARTICLE, GPU, GPUS, DrafterShapes, TargetShapes, compare_with_article,
                                          drafter_pass, project, project_point, published_pair_shapes, target_pass,
                                          tau_from)
from dflash2_trt.errors import ConfigError

TOY_T = TargetShapes(name="toy", hidden_size=10, vocab_size=100, layer_params=1000, other_params=10,
                     lm_head_params=1000, layer_kinds=("attention", "linear", "sliding"), q_heads=2, kv_heads=1,
                     head_dim=4, window=8, linear_value_heads=2, linear_key_dim=3, linear_value_dim=5)
TOY_D = DrafterShapes(name="toy drafter", hidden_size=10, layer_params=200, fc_params=30, other_params=5,
                      num_layers=1, q_heads=2, kv_heads=1, head_dim=4, window=8, num_taps=3, target_hidden_size=10,
                      block_size=3, top_k=2, rank=4)
TOY_GPU = GPU("toy", "toy GPU", 1000.0, 100000.0, "test")      # 1000 B/s, 1e5 FLOP/s


def _times(comps):
    return {c["name"]: c["time_s"] for c in comps}


def test_autoregressive_step_by_hand():
    # B = 2 requests, 1 token each, context 20.
    # weights: (1000 + 10 + 1000) * 2 B + 2 embedding rows * 10 * 2 B = 4060 B -> 4.06 s; FLOPs 8000 -> 0.08 s
    # attention: per token 2 * 1 * 4 * 2 B = 16 B; full layer 2 * 20 * 16 + 2 * 16 = 672 B, sliding (8 of 20)
    #   2 * 8 * 16 + 32 = 288 B -> 0.96 s; FLOPs 4*20*2*4*2 + 4*8*2*4*2 = 1792 -> 0.018 s
    # recurrent: state 2 * 3 * 5 = 30 fp32, read + written per request: 2 * 2 * 30 * 4 = 480 B -> 0.48 s
    t = _times(target_pass(TOY_T, 2, 1, 20, TOY_GPU))
    assert t == pytest.approx({"target_weights": 4.06, "target_attention": 0.96, "target_recurrent": 0.48})


def test_speculative_step_by_hand():
    # K = 2, B = 2 -> T = 6 target tokens
    t = _times(target_pass(TOY_T, 2, 3, 20, TOY_GPU))
    # weights 4020 + 6 * 20 = 4140 B; attention 2*20*16 + 6*16 + 2*8*16 + 6*16 = 1088 B; recurrent (replay:
    # verify reads the state, the replay reads and writes it) 2 requests * 3 * 30 * 4 B = 720 B
    assert t == pytest.approx({"target_weights": 4.14, "target_attention": 1.088, "target_recurrent": 0.72})
    # intermediate states: one read + K + 1 = 3 writes -> 2 * 4 * 30 * 4 B = 960 B
    assert _times(target_pass(TOY_T, 2, 3, 20, TOY_GPU, recurrent="intermediate"))["target_recurrent"] == \
        pytest.approx(0.96)
    d = _times(drafter_pass(TOY_D, TOY_T, 2, 20, TOY_GPU))
    # drafter weights (200 + 30 + 5) * 2 + gathered codebook rows 2 * 2*K*top_k*rank * 2 B (= 128) + 6 * 20 = 718 B
    # drafter attention: window 8, per token 2*1*4*2 = 16 B: 2 * 8 * 16 + 2 * 6 * 16 = 448 B
    # lm_head re-read 2000 B -> 2.0 s; selector 2 * 2*K*top_k^2*rank = 128 FLOPs -> 0.00128 s
    assert d == pytest.approx({"drafter_weights": 0.718, "drafter_attention": 0.448, "drafter_lm_head": 2.0,
                               "selector": 0.00128})
    p = project_point(TOY_T, TOY_D, TOY_GPU, batch=2, context=20, tau=2.5)
    assert p["ar_step_s"] == pytest.approx(5.5)
    assert p["spec_step_s"] == pytest.approx(4.14 + 1.088 + 0.72 + 0.718 + 0.448 + 2.0 + 0.00128)
    assert p["speedup"] == pytest.approx(2.5 * 5.5 / 9.11528)
    assert p["ar_tokens_per_s"] == pytest.approx(2 / 5.5)
    assert p["spec_tokens_per_s"] == pytest.approx(2 * 2.5 / 9.11528)


def test_compute_bound_efficiencies_and_overhead():
    slow = GPU("slow", "slow", 1000.0, 1000.0, "test")          # 1000 FLOP/s: the weights GEMM is compute-bound
    w = target_pass(TOY_T, 2, 1, 20, slow)[0]
    assert w["bound"] == "compute" and w["time_s"] == pytest.approx(8.0)
    assert target_pass(TOY_T, 2, 1, 20, TOY_GPU)[0]["bound"] == "memory"
    half = _times(target_pass(TOY_T, 2, 1, 20, TOY_GPU, bw_eff=0.5))
    assert half["target_weights"] == pytest.approx(8.12)        # memory time doubles
    assert _times(target_pass(TOY_T, 2, 1, 20, slow, fl_eff=0.5))["target_weights"] == pytest.approx(16.0)
    p0 = project_point(TOY_T, TOY_D, TOY_GPU, batch=2, context=20, tau=2.5)
    p1 = project_point(TOY_T, TOY_D, TOY_GPU, batch=2, context=20, tau=2.5, step_overhead_s=1.0)
    assert p1["ar_step_s"] == pytest.approx(p0["ar_step_s"] + 1) and p1["spec_step_s"] == pytest.approx(
        p0["spec_step_s"] + 1)


def test_tau_from_a_report_histogram_truncates_to_the_projected_drafts():
    rep = {"draft_len": 3, "runs": [{"speculative": {"acceptance": {"histogram": {"1": 2, "4": 2}}}},
                                    {"speculative": {"acceptance": {"histogram": {"2": 1}}}}]}
    tau, info = tau_from(report=rep, draft_len=3)
    assert tau == pytest.approx((2 + 8 + 2) / 5) and info["steps"] == 5 and info["kind"] == "measured"
    tau2, info2 = tau_from(report=rep, draft_len=2)                  # min(n, 3): (2 + 6 + 2) / 5
    assert tau2 == pytest.approx(2.0)
    # said, not silent: the report's own mean (2.4) is not the tau used
    from dflash2_trt.bench.projection import emitted_note

    assert "truncated_to" not in info and emitted_note(info) is None
    assert info2["truncated_to"] == 3 and info2["report_mean"] == pytest.approx(2.4)
    note = emitted_note(info2)
    assert "measured 3 drafts per step, this drafter has 2" in note and "E[min(n, 3)] = 2.00" in note \
        and "own mean is 2.40" in note
    with pytest.raises(ConfigError, match="measured 3 drafts"):
        tau_from(report=rep, draft_len=7)
    with pytest.raises(ConfigError, match="exactly one"):
        tau_from(draft_len=3)
    with pytest.raises(ConfigError, match=r"\[1, 4\]"):
        tau_from(acceptance=4.5, draft_len=3)
    with pytest.raises(ConfigError, match="not a bench report"):
        tau_from(report={"runs": [{}]}, draft_len=3)


def test_a_report_of_short_outputs_says_its_requests_emitted_less_than_tau():
    """tau is the acceptance length (what long outputs reach); a report whose requests were short emitted fewer per
    step (cut last steps): the projection keeps tau and says what the report emitted, in the JSON and the table."""
    from dflash2_trt.bench.projection import emitted_note, render

    rep = {"draft_len": 3, "runs": [{"speculative": {"acceptance": {"histogram": {"4": 2}, "steps": 2,
                                                                    "emitted_mean": 2.5}}},
                                    {"speculative": {"acceptance": {"histogram": {"4": 2}, "steps": 2,
                                                                    "emitted_mean": 3.5}}}]}
    tau, info = tau_from(report=rep, draft_len=3)
    assert tau == 4.0 and info["report_emitted_mean"] == pytest.approx(3.0)
    assert "emitted 3.00 tokens per generation step" in emitted_note(info)
    t, d = published_pair_shapes("qwen3.8-27b")
    doc = project(t, d, [GPUS["h200"]], concurrency=[1], context=1024, tau=tau, acceptance_info=info)
    assert "emitted 3.00 tokens per generation step" in render(doc)
    for e in (3.95, None):                     # within 2%, or a TensorRT-LLM tool's report (no emitted_mean): no line
        rep["runs"][0]["speculative"]["acceptance"]["emitted_mean"] = e
        rep["runs"][1]["speculative"]["acceptance"]["emitted_mean"] = e
        _, info = tau_from(report=rep, draft_len=3)
        assert emitted_note(info) is None


def test_published_shapes_match_the_fixtures():
    from dflash2_trt.testing.fixtures import QWEN_DRAFTER

    t, d = published_pair_shapes("qwen3.8-27b")
    assert t.layer_kinds.count("linear") == 48 and t.layer_kinds.count("attention") == 16
    assert (t.q_heads, t.kv_heads, t.head_dim, t.hidden_size) == (24, 4, 256, 5120)
    assert 26e9 < t.layer_params + t.other_params + 2 * t.lm_head_params < 28e9       # "27B" with its embedding
    inv = json.loads((QWEN_DRAFTER / "tensors.json").read_text())["tensors"]
    streamed = sum(math.prod(s) for n, s in inv.items() if "codebook" not in n)
    assert d.layer_params + d.fc_params + d.other_params == streamed                 # the drafter's own inventory
    assert d.block_size == 8 and d.top_k == 16 and d.rank == 256
    # the checkpoint's drafter has a 2048-token window, the published build attends to the whole context
    # (build_configs/qwen3.8-27b.yaml drafter_window: full): the projection prices the engine as it is built
    assert json.loads((QWEN_DRAFTER / "config.json").read_text())["sliding_window"] == 2048 and d.window is None
    m_t, m_d = published_pair_shapes("muse-glimmer-30b")
    assert m_d.block_size == 16 and m_t.layer_kinds.count("sliding") > 0 and "linear" not in m_t.layer_kinds


def test_projection_document_and_the_article_comparison():
    t, d = published_pair_shapes("qwen3.8-27b")
    doc = project(t, d, [GPUS["h200"], GPUS["b200"]], concurrency=[1, 32], context=1024, tau=4.80,
                  acceptance_info={"kind": "given", "mean": 4.8})
    assert doc["kind"].startswith("roofline model") and doc["draft_len"] == 7
    h200 = doc["gpus"][0]
    art = h200["article"]
    assert art["same_tau"] and art["article_tau"] == ARTICLE["dflash2_mean_acceptance"]
    p1, p32 = h200["points"]
    assert art["concurrency_32"]["projected_speedup"] == p32["speedup"]
    assert art["concurrency_32"]["article_speedup_range"] == [1.01, 1.45]
    assert art["concurrency_1"]["projected_speedup"] == p1["speedup"]
    # batching amortises the weights: the model's speedup cannot grow from 1 to 32 on the H200 (it turns
    # compute-bound first), and at concurrency 1 it is memory-bound: speedup ~ tau * W / (W + drafter)
    assert p32["speedup"] < p1["speedup"] < 4.80
    assert p1["components"]["speculative"][0]["bound"] == "memory"
    assert "article" not in doc["gpus"][1]                          # the article's table is an H200 one
    assert compare_with_article([p1], 3.3)["same_tau"] is False


@pytest.mark.parametrize("kw,field", [({"bw_eff": 0}, "--bandwidth-efficiency"),
                                      ({"fl_eff": 1.5}, "--compute-efficiency"),
                                      ({"context": 0}, "--context-len"), ({"step_overhead_s": -1}, "--step-overhead-ms"),
                                      ({"recurrent": "none"}, "--recurrent-verify")])
def test_projection_refuses_bad_settings(kw, field):
    args = {"concurrency": [1], "context": 10, "tau": 2.0, "acceptance_info": {}} | kw
    with pytest.raises(ConfigError, match=field):
        project(TOY_T, TOY_D, [TOY_GPU], **args)


def test_project_cli(tmp_path):
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["bench", "project", "--acceptance", "4.8", "--gpu", "h200", "--concurrency", "1,32",
                                  "--recurrent-verify", "intermediate", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "roofline model (not a measurement)" in r.output and "vs the article at concurrency 32" in r.output
    doc = json.loads(out.read_text())
    assert doc["recurrent_verify"] == "intermediate" and [p["concurrency"] for p in doc["gpus"][0]["points"]] == [1, 32]
    rep = tmp_path / "rep.json"
    rep.write_text(json.dumps({"draft_len": 7, "runs": [{"speculative": {"acceptance": {"histogram": {"3": 4}}}}]}))
    r = CliRunner().invoke(main, ["bench", "project", "--acceptance-from", str(rep), "--gpu", "b200"])
    assert r.exit_code == 0, r.output
    assert "tau = 3.00 tokens/step (measured)" in r.output
    for args, needle in ((["--acceptance", "4.8", "--acceptance-from", str(rep)], "exactly one"),
                         (["--acceptance", "9"], "--acceptance"), (["--acceptance", "4", "--gpu", "v100"], "unknown GPU"),
                         (["--acceptance", "4", "--gpu", "h200,H200"], "--gpu: a GPU is repeated in 'h200,H200'"),
                         (["--acceptance-from", str(tmp_path / "nope.json")], "cannot read"),
                         (["--acceptance", "4", "--target", "nope"], "unknown target")):
        r = CliRunner().invoke(main, ["bench", "project", *args])
        lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
        assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output


def test_project_says_which_concurrencies_the_kv_cache_holds(tmp_path):
    """The roofline prices any concurrency; beside it, how many requests of the context the combined engine's KV budget
    holds on each GPU, as `build --dry-run` sizes it (the same number the dry run gives at that max_seq_len), and the
    rows over it are marked (qwen3.8-27b at context 32768 on an H200: 27, so c32 and c64 are over)."""
    from dflash2_trt.testing.cli import cli

    out = tmp_path / "p.json"
    code, text = cli("bench", "project", "--acceptance", "4.8", "--concurrency", "1,27,28", "--context-len", "32768",
                     "--gpu", "h200,h100", "--json", str(out))
    assert code == 0, text
    h200, h100 = json.loads(out.read_text())["gpus"]
    assert h200["memory"]["gpu_memory_bytes"] == 143771 << 20 and h100["memory"]["gpu_memory_bytes"] == 81559 << 20
    assert [p["kv_fits"] for p in h200["points"]] == [True, True, False] and h200["memory"]["most_requests"] == 27
    assert [p["kv_fits"] for p in h100["points"]] == [True, False, False]
    assert re.search(r"\n\s+28 .*compute  \(KV cache over capacity\)\n", text)
    assert "27 requests at context 32,768" in text
    assert "concurrency 28 would not all fit at once" in text
    code, plan = cli("build", "--target", "qwen3.8-27b", "--dry-run", "--json", "--tp-size", "1", "--max-seq-len",
                     "32768", "--max-input-len", "16384", "--gpu-memory-gib", repr((143771 << 20) / 2 ** 30))
    z = json.loads(plan[plan.index("\n{") + 1:])["sizing"]
    assert z["max_batch_that_fits"] == 27
    assert z["kv_bytes_per_request"] + z["recurrent_state_bytes_per_request"] == h200["memory"]["bytes_per_request"]
    # at the documented context 1024 every default concurrency fits: no mark
    code, text = cli("bench", "project", "--acceptance", "4.8")
    assert code == 0 and "over capacity" not in text and "315 requests at context 1,024" in text, text


def test_project_json_replaces_its_own_projection_only(tmp_path):
    """`bench project --json F` overwrote any file without a word: it replaces a previous projection (roofline or
    measured costs) and refuses anything else (a `bench steps` report, an engine's manifest) in one line."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    out = tmp_path / "p.json"
    args = ["bench", "project", "--acceptance", "4.8", "--gpu", "h200", "--concurrency", "1", "--json", str(out)]
    out.write_text(json.dumps({"kind": "measured step costs (not a roofline model)", "old": True}))
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and f"wrote {out}" in r.output, r.output
    assert json.loads(out.read_text())["kind"] == "roofline model (not a measurement)"
    for doc, what in (({"format": "dflash2-trt bench steps"}, "a `bench steps` report"),
                      ({"format": "dflash2-trt engine"}, "a 'dflash2-trt engine' file"),
                      ([1, 2], "a JSON document that is not a bench report")):
        out.write_text(json.dumps(doc))
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and r.output.strip().splitlines() == [
            f"error: --json: {out} exists and is {what}, not a `bench project` projection (this command replaces "
            f"only its own); pass another path"], r.output
        assert json.loads(out.read_text()) == doc


@pytest.mark.parametrize("hist,needle", [
    ({"12": 4, "3": 1}, "step length '12' is not in [1, 8]"),       # K + 1 is 8: a step cannot emit 12
    ({"0": 4}, "step length '0' is not in [1, 8]"),
    ({"3": -2, "4": 5}, "the count must be a whole number >= 0, got -2"),
    ({"3": 1.5}, "the count must be a whole number >= 0, got 1.5"),
    ({"3": True}, "the count must be a whole number >= 0, got True"),
    ({"x": 1}, "step length 'x'"),
    ({"3.5": 1}, "step length '3.5'"),
    ([3, 4], "must be an object"),
    ({"3": 0}, "no generation steps"),
])
def test_report_histograms_are_validated(hist, needle):
    """Issue 21 item 9: a report whose histogram has a step length of 12 (K+1 is 8) and a negative count
    projected 24.95x; every entry is checked like an option."""
    rep = {"draft_len": 7, "runs": [{"speculative": {"acceptance": {"histogram": hist}}}]}
    with pytest.raises(ConfigError, match=re.escape(needle)):
        tau_from(report=rep, draft_len=7, report_source="rep.json")


@pytest.mark.parametrize("k", [0, -1, "7", 7.0, True, 10**6])
def test_report_draft_len_is_validated(k):
    rep = {"draft_len": k, "runs": [{"speculative": {"acceptance": {"histogram": {"1": 1}}}}]}
    with pytest.raises(ConfigError, match="draft_len: must be an integer"):
        tau_from(report=rep, draft_len=1, report_source="rep.json")


def test_project_cli_refuses_non_finite_and_absurd_values(tmp_path):
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    rep = tmp_path / "rep.json"
    rep.write_text(json.dumps({"draft_len": 7, "runs": [{"speculative": {"acceptance": {"histogram": {"12": 4,
                                                                                                    "3": -1}}}}]}))
    for args, needle in ((["--acceptance-from", str(rep)], "histogram: step length '12'"),
                         (["--acceptance", "4", "--step-overhead-ms", "nan"], "--step-overhead-ms"),
                         (["--acceptance", "4", "--step-overhead-ms", "inf"], "--step-overhead-ms"),
                         (["--acceptance", "4", "--step-overhead-ms", "5000"], "--step-overhead-ms"),
                         (["--acceptance", "4", "--bandwidth-efficiency", "nan"], "--bandwidth-efficiency"),
                         (["--acceptance", "nan"], "--acceptance"),
                         (["--acceptance", "4", "--context-len", "1000000000"], "max_position_embeddings")):
        r = CliRunner().invoke(main, ["bench", "project", *args])
        lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
        assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], \
            (args, r.output)
    r = CliRunner().invoke(main, ["bench", "project", "--acceptance", "4", "--context-len", "32768", "--gpu", "h200"])
    assert r.exit_code == 0, r.output


def test_default_context_fits_the_target():
    """`bench project --target tiny` (a 512-token target): the default context (1024) is cut to what the target
    takes instead of failing as if --context-len had been given; a --context-len that is given and too long is
    still refused, naming it."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    r = CliRunner().invoke(main, ["bench", "project", "--target", "tiny", "--acceptance", "3", "--gpu", "h200",
                                  "--concurrency", "1"])
    assert r.exit_code == 0 and "context 512 tokens" in r.output, r.output
    r = CliRunner().invoke(main, ["bench", "project", "--acceptance", "3", "--gpu", "h200", "--concurrency", "1"])
    assert r.exit_code == 0 and "context 1024 tokens" in r.output, r.output       # a long target: 1024 as before
    r = CliRunner().invoke(main, ["bench", "project", "--target", "tiny", "--acceptance", "3", "--context-len", "1024"])
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert r.exit_code == 1 and lines == [
        "error: --context-len: must be an integer in [1, 512] (the target's max_position_embeddings), got 1024"], r.output


def test_bench_run_projection_context_is_cut_to_the_target():
    """`bench run --project`'s derived context (mean prompt + half the output) is cut the same way."""
    from dflash2_trt.bench.run import _projection_for

    tiny_k = published_pair_shapes("tiny")[1].block_size - 1
    report = {"draft_len": tiny_k, "settings": {"concurrency": [1]},
              "dataset": {"mean_input_len": 900.0, "mean_output_tokens": 64.0},
              "runs": [{"speculative": {"acceptance": {"histogram": {"3": 5}}}}]}
    assert _projection_for(report, ["h200"], "tiny", None)["context_len"] == 512
    assert _projection_for(report, ["h200"], "qwen3.8-27b", None)["context_len"] == 932


def test_a_target_without_a_published_drafter_is_refused_without_naming_a_missing_option(tmp_path):
    """bench project / bench steps / bench run --project-target qwen3-8b said "pass --drafter DIR": none of them
    takes --drafter. They read a published pair's shapes, and say so with the targets that have one."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    ds = tmp_path / "ds.jsonl"
    ds.write_text(json.dumps({"task_id": 0, "input_ids": [1, 2], "output_tokens": 4}) + "\n")
    for args, field in ((["bench", "project", "--target", "qwen3-8b", "--acceptance", "3"], "--target"),
                        (["bench", "steps", "--target", "qwen3-8b", "--backend", "cpu"], "--target"),
                        (["bench", "run", "--engine-dir", str(tmp_path), "--dataset", str(ds), "--project", "h200",
                          "--project-target", "qwen3-8b"], "--project-target")):
        r = CliRunner().invoke(main, args)
        lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
        assert r.exit_code == 1 and len(lines) == 1, r.output
        assert lines[0].startswith(f"error: {field}: target 'qwen3-8b' has no published drafter") \
            and "one of: qwen3.8-27b, muse-glimmer-30b" in lines[0] and "pass --drafter" not in lines[0], lines[0]


def test_recurrent_verify_on_a_target_without_recurrent_layers_is_refused():
    """Checked, not ignored: on a dense target the option changed nothing and was still recorded in the JSON."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    r = CliRunner().invoke(main, ["bench", "project", "--acceptance", "4", "--target", "tiny", "--recurrent-verify",
                                  "intermediate"])
    assert r.exit_code == 1 and "--recurrent-verify: applies to targets with Gated DeltaNet" in r.output, r.output
    r = CliRunner().invoke(main, ["bench", "project", "--acceptance", "4", "--target", "tiny-hybrid",
                                  "--recurrent-verify", "intermediate"])
    assert r.exit_code == 0 and "recurrent verify intermediate" in r.output, r.output


def test_an_acceptance_report_of_another_target_is_refused(tmp_path):
    """--costs-from refused a steps report of another target; --acceptance-from took a tiny pair's histogram and
    projected qwen3.8-27b with it as "measured", naming neither (a new user's review). Refused the same way, with the
    --acceptance that projects it deliberately; a report of the projected target (or naming none) is taken."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    rep = tmp_path / "rep.json"
    doc = {"target": "tiny", "draft_len": 15, "runs": [{"speculative": {"acceptance": {"histogram": {"5": 2}}}}]}
    rep.write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["bench", "project", "--acceptance-from", str(rep)])
    assert r.exit_code == 1 and r.output.strip() == (
        f"error: {rep}: target: measured 'tiny', not 'qwen3.8-27b': a drafter's acceptance is its own pair's "
        f"(--acceptance 5.00 projects this one's deliberately)"), r.output
    rep.write_text(json.dumps({**doc, "target": "qwen3.8-27b"}))
    r = CliRunner().invoke(main, ["bench", "project", "--acceptance-from", str(rep)])
    assert r.exit_code == 0 and "tau = 5.00 tokens/step (measured)" in r.output, r.output
