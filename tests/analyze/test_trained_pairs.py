"""The trained tiny pairs shipped in dflash2_trt/assets: strict loading, lossless speculative
decoding WITH multi-token acceptance, the acceptance the card promises, the registry keys, and
the analysis checked against the real speculative loop. Nothing here retrains."""

import json
import warnings

import pytest
import torch
from click.testing import CliRunner

from dflash2_trt.analyze import (
    accepted_prefix,
    collect_anchors,
    direct_acceptance,
    implied_acceptance,
    load_prompts,
    measure_acceptance,
    method_hits,
    recall_table,
)
from dflash2_trt.assets import trained_card, trained_pair
from dflash2_trt.config import TargetConfig
from dflash2_trt.reference.drafter import DFlash2Drafter
from dflash2_trt.reference.loop import is_hybrid, load_pair, speculative_generate, target_generate
from dflash2_trt.testing.tiny import tiny_pair

MIN_ACCEPTANCE = 2.5      # issue 5: greedy, block 8, each shipped pair


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def trained(request):
    from transformers.utils import logging

    logging.set_verbosity_error()
    p = trained_pair(request.param)
    target, drafter = load_pair(p.target_dir, p.drafter_dir)
    prompts = load_prompts(p.drafter_dir.parent / "prompts.json")
    return p, target, drafter, prompts


def test_shipped_pair_has_the_tiny_architecture(trained):
    """Same target architecture as the seeded random tiny pair (only the weights differ), so
    every tiny-based path (convert, inspect, engines) applies to the trained pair too."""
    p, target, drafter, _ = trained
    rnd = tiny_pair(p.family)
    assert TargetConfig.from_hugging_face(p.target_dir / "config.json").numerics() == \
        TargetConfig.from_hugging_face(rnd.target_dir / "config.json").numerics()
    assert json.loads((p.drafter_dir / "config.json").read_text()) == \
        json.loads((rnd.drafter_dir / "config.json").read_text())
    assert drafter.block_size == 8
    assert all(t.dtype == torch.float32 for t in drafter.state_dict().values())


def test_card_matches_the_checkpoints(trained):
    p, target, drafter, prompts = trained
    card = trained_card(p.family)
    assert card["family"] == p.family and card["block_size"] == 8
    # the card's greedy-selector number is reproduced by a fresh measurement on its prompts
    m = measure_acceptance(target, drafter, prompts, max_new_tokens=64, selector="greedy")
    assert m["lossless"]
    assert m["mean_acceptance_length"] == pytest.approx(
        card["measured_greedy_decoding"]["greedy"]["mean_acceptance_length"], abs=1e-9)
    assert m["mean_acceptance_length"] >= MIN_ACCEPTANCE
    for mode in ("none", "greedy", "viterbi"):
        assert card["measured_greedy_decoding"][mode]["lossless"] is True
        assert card["measured_greedy_decoding"][mode]["mean_acceptance_length"] >= MIN_ACCEPTANCE


@pytest.mark.parametrize("mode", ["none", "greedy", "viterbi"])
def test_lossless_with_multi_token_acceptance(trained, mode):
    p, target, drafter, prompts = trained
    lengths = []
    for pr in prompts[:6]:
        ref = target_generate(target, pr, 40)
        r = speculative_generate(target, drafter, pr, max_new_tokens=40, selector=mode)
        assert r.output_ids == ref, (p.family, mode, pr)
        if is_hybrid(target):
            assert r.replay_passes == sum(1 for a in r.acceptance_lengths if a < drafter.block_size)
        lengths += r.acceptance_lengths
    # the point of the trained pair: multi-token acceptance really happens, often
    assert max(lengths) >= drafter.block_size - 1
    assert sum(1 for a in lengths if a > 1) >= len(lengths) / 3


@pytest.mark.parametrize("bs", [4, 16])
def test_lossless_other_block_sizes(trained, bs):
    p, target, _, prompts = trained
    drafter = DFlash2Drafter.from_pretrained(p.drafter_dir, block_size=bs)
    for pr in prompts[:3]:
        r = speculative_generate(target, drafter, pr, max_new_tokens=32, selector="greedy")
        assert r.output_ids == target_generate(target, pr, 32)
        assert max(r.acceptance_lengths) > 2


def test_analysis_per_anchor_equals_the_real_loop(trained):
    """At every anchor the real loop visits, its acceptance equals the analysis' leading hits
    + 1 for that anchor and method (the analysis replays exactly the loop's state)."""
    p, target, drafter, prompts = trained
    prompts = prompts[:4]
    max_new = 40
    data = collect_anchors(target, drafter, prompts, max_new_tokens=max_new, max_k=8)
    L = drafter.block_size - 1
    sel = drafter.candidate_selector
    checked = 0
    for mode, method in (("none", "top1"), ("greedy", "greedy"), ("viterbi", "viterbi")):
        n = accepted_prefix(method_hits(data, method, 1 if method == "top1" else 8, sel))
        where = {(int(pi), int(pos)): int(a) for pi, pos, a in zip(data.prompt_index, data.position, n)}
        for pi, pr in enumerate(prompts):
            r = speculative_generate(target, drafter, pr, max_new_tokens=max_new, selector=mode, top_k=8)
            s = len(pr)
            for acc in r.acceptance_lengths:
                if (pi, s) in where:          # anchors with a full block of labels
                    assert acc == where[(pi, s)] + 1, (p.family, mode, pi, s)
                    checked += 1
                s += acc
            assert s - len(pr) >= max_new - L
    assert checked >= 3 * len(prompts) * 2


def test_recall_table_orderings_on_trained_pair(trained):
    p, target, drafter, prompts = trained
    data = collect_anchors(target, drafter, prompts[:4], max_new_tokens=40, max_k=16)
    sel = drafter.candidate_selector
    top1 = method_hits(data, "top1", 1)
    assert implied_acceptance(recall_table(top1)["conditional"]) == pytest.approx(direct_acceptance(top1))
    prev = None
    for k in (4, 8, 16):
        o = method_hits(data, "oracle", k)
        for m in ("greedy", "viterbi"):
            h = method_hits(data, m, k, sel)
            assert implied_acceptance(recall_table(h)["conditional"]) == pytest.approx(direct_acceptance(h))
            assert bool((accepted_prefix(h) <= accepted_prefix(o)).all())
        if prev is not None:
            assert bool((accepted_prefix(prev) <= accepted_prefix(o)).all())
        prev = o
    assert bool((accepted_prefix(top1) <= accepted_prefix(prev)).all())


def test_registry_keys_use_the_shipped_pairs():
    from dflash2_trt.targets import get_target, resolve_dirs

    for key, fam in (("tiny", "qwen3"), ("tiny-hybrid", "qwen3_5")):
        d, t = resolve_dirs(get_target(key))
        p = trained_pair(fam)
        assert (d, t) == (p.drafter_dir, p.target_dir)


def test_cli_analyze_json():
    from dflash2_trt.cli import main

    res = CliRunner().invoke(main, ["analyze", "--target", "tiny", "--json", "--max-prompts", "2",
                                    "--max-new-tokens", "24", "--top-k", "4,16"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["top_k"] == [4, 16] and rep["draft_positions"] == 7
    for name in ("top1", "greedy@4", "viterbi@4", "oracle@4", "greedy@16", "viterbi@16", "oracle@16"):
        assert len(rep["recall"][name]) == 7
        assert name in rep["implied_acceptance"]
    imp = rep["implied_acceptance"]
    assert imp["oracle@16"] >= imp["oracle@4"] >= max(imp["greedy@4"], imp["viterbi@4"], imp["top1"])
    assert all(m["lossless"] for m in rep["measured"].values())
    assert set(rep["measured"]) == {"none", "greedy@4", "viterbi@4", "greedy@16", "viterbi@16"}


def test_cli_analyze_text_and_errors(tmp_path):
    from dflash2_trt.cli import main

    res = CliRunner().invoke(main, ["analyze", "--target", "tiny-hybrid", "--no-measure", "--max-prompts", "1",
                                    "--max-new-tokens", "16"])
    assert res.exit_code == 0, res.output
    assert "conditional on every earlier position" in res.output and "oracle@16" in res.output
    res = CliRunner().invoke(main, ["analyze", "--target", "tiny", "--top-k", "4,x"])
    assert res.exit_code == 1 and res.output.strip() == "error: --top-k: must be comma-separated integers, got '4,x'"
    for bad, needle in (("4,,8", "must be comma-separated integers, got '4,,8'"), ("8,4,4", "a value is repeated")):
        res = CliRunner().invoke(main, ["analyze", "--target", "tiny", "--top-k", bad])
        assert res.exit_code == 1 and res.output.strip() == f"error: --top-k: {needle}" + (
            " in '8,4,4'" if bad == "8,4,4" else ""), res.output
    for opt, val in (("--top-k", "0"), ("--max-prompts", "-1")):   # the option named once, as the user spelt it
        res = CliRunner().invoke(main, ["analyze", "--target", "tiny", opt, val])
        assert res.exit_code == 1 and res.output.startswith(f"error: {opt}: ") and res.output.count(opt) == 1, res.output
    bad = tmp_path / "p.json"
    bad.write_text("[[1, 2], \"text\"]")
    res = CliRunner().invoke(main, ["analyze", "--target", "tiny", "--prompts", str(bad), "--no-measure"])
    assert res.exit_code == 1 and "tokenizer" in res.output


def test_measured_sampling_runs(trained):
    """The sampling selector on the trained pair: reproducible per seed, reports no per-run
    lossless verdict (it is distributional), and still accepts several tokens per pass."""
    p, target, drafter, prompts = trained
    a = measure_acceptance(target, drafter, prompts[:3], max_new_tokens=32, selector="sample", temperature=0.7)
    b = measure_acceptance(target, drafter, prompts[:3], max_new_tokens=32, selector="sample", temperature=0.7)
    assert a == b and a["lossless"] is None and a["temperature"] == 0.7
    assert a["mean_acceptance_length"] >= 2.0


def test_cli_analyze_prompt_ids_outside_vocab(tmp_path):
    """Prompt token ids outside the target vocabulary are one clear line naming the prompt, not an
    IndexError traceback from the target's embedding."""
    from dflash2_trt.cli import main

    for ids in ([1, 2, 999], [1, -2, 3]):
        bad = tmp_path / "p.json"
        bad.write_text(json.dumps([[5, 6], ids]))
        res = CliRunner().invoke(main, ["analyze", "--target", "tiny", "--prompts", str(bad), "--no-measure",
                                        "--max-new-tokens", "10", "--top-k", "4"])
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.exception, res.output)
        assert "prompts[1]" in res.output and "vocab" in res.output, res.output


def test_cli_analyze_refuses_more_positions_than_the_target_has(tmp_path):
    """Each prompt + --max-new-tokens must fit the target's max_position_embeddings (512 on the
    tiny pairs): one line naming the prompt and the limit, not a silent run past the trained range."""
    from dflash2_trt.cli import main

    f = tmp_path / "p.json"
    for prompts, new in (([[5, 6], list(range(1, 201)) * 3], 10),       # prompt 1: 600 tokens
                         ([[5, 6], list(range(1, 201)) * 2 + [7] * 100], 13)):   # 500 + 13 > 512
        f.write_text(json.dumps(prompts))
        res = CliRunner().invoke(main, ["analyze", "--target", "tiny", "--prompts", str(f), "--no-measure",
                                        "--max-new-tokens", str(new), "--top-k", "4"])
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.exception, res.output)
        assert "prompts[1]" in res.output and "max_position_embeddings 512" in res.output, res.output
        assert res.output.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["analyze", "--target", "tiny", "--no-measure", "--max-new-tokens", str(10**9)])
    assert res.exit_code == 1 and "max_position_embeddings 512" in res.output, res.output
