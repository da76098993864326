"""The shipped trained tiny Muse Glimmer pair (``tiny-muse``): the layout the engine work relies on
(drafter KV = target KV per layer; at least one sliding-window and one NoPE full-attention layer),
strict loading, lossless greedy decoding with multi-token acceptance at block 16 and 8, the card's
number reproduced, the registry entry and the CLI. Nothing here retrains."""

import json
import warnings

import pytest
import torch
from click.testing import CliRunner

from dflash2_trt.analyze import load_prompts, measure_acceptance
from dflash2_trt.assets import trained_card, trained_pair
from dflash2_trt.config import DFlash2Config, TargetConfig
from dflash2_trt.reference.drafter import DFlash2Drafter
from dflash2_trt.reference.loop import load_pair, speculative_generate, target_generate
from dflash2_trt.testing.tiny import tiny_pair

MIN_ACCEPTANCE = 3.0      # greedy selector, block 16, the card's prompts (measured 4.9; see the card)
MAX_FILE_BYTES = 2 << 20  # each shipped safetensors


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def muse():
    from transformers.utils import logging

    logging.set_verbosity_error()
    p = trained_pair("muse_glimmer")
    target, drafter = load_pair(p.target_dir, p.drafter_dir)
    return p, target, drafter, load_prompts(p.drafter_dir.parent / "prompts.json")


def test_layout_the_engine_relies_on(muse):
    p, target, drafter, _ = muse
    t = TargetConfig.from_hugging_face(p.target_dir)
    d = DFlash2Config.from_hugging_face(p.drafter_dir)
    assert type(target).__name__ == "MuseGlimmerForConditionalGeneration"
    # the drafter's K/V per layer is the target's (fits the target's paged pool as is)
    assert (d.num_key_value_heads, d.head_dim) == (t.num_key_value_heads, t.head_dim) == (2, 16)
    kinds = list(zip(t.layer_types, t.layer_rope_theta))
    assert ("sliding_attention", t.rope_theta) in kinds and ("full_attention", 0.0) in kinds
    assert t.sliding_window == 16 and d.block_size == 16
    assert (d.output_multiplier, d.final_logit_softcapping) == (t.output_multiplier, t.final_logit_softcapping)
    assert t.num_attention_heads == 8 and t.intermediate_size % 8 == 0   # every --tp-size up to 8 splits it
    # same architecture as the seeded random tiny pair (only the weights differ)
    rnd = tiny_pair("muse_glimmer")
    assert t.numerics() == TargetConfig.from_hugging_face(rnd.target_dir).numerics()
    assert json.loads((p.drafter_dir / "config.json").read_text()) == \
        json.loads((rnd.drafter_dir / "config.json").read_text())
    for f in (p.target_dir / "model.safetensors", p.drafter_dir / "model.safetensors"):
        assert f.stat().st_size < MAX_FILE_BYTES, f
    assert all(v.dtype == torch.float32 for v in drafter.state_dict().values())


def test_card_matches_the_checkpoints(muse):
    p, target, drafter, prompts = muse
    card = trained_card("muse_glimmer")
    assert card["family"] == "muse_glimmer" and card["block_size"] == 16
    m = measure_acceptance(target, drafter, prompts, max_new_tokens=64, selector="greedy")
    assert m["lossless"]
    assert m["mean_acceptance_length"] == pytest.approx(
        card["measured_greedy_decoding"]["greedy"]["mean_acceptance_length"], abs=1e-9)
    assert m["mean_acceptance_length"] >= MIN_ACCEPTANCE
    assert all(card["measured_greedy_decoding"][mode]["lossless"] is True for mode in ("none", "greedy", "viterbi"))


@pytest.mark.parametrize("bs", [16, 8])
def test_lossless_with_multi_token_acceptance(muse, bs):
    p, target, _, prompts = muse
    drafter = DFlash2Drafter.from_pretrained(p.drafter_dir, block_size=bs)
    lengths = []
    for pr in prompts[:4]:
        r = speculative_generate(target, drafter, pr, max_new_tokens=40, selector="greedy")
        assert r.output_ids == target_generate(target, pr, 40), (bs, pr)
        lengths += r.acceptance_lengths
    assert max(lengths) >= bs - 1 and sum(1 for a in lengths if a > 1) >= len(lengths) / 2


def test_registry_and_cli(muse):
    from dflash2_trt.cli import main
    from dflash2_trt.targets import get_target, resolve_dirs

    p, target, _, prompts = muse
    e = get_target("tiny-muse")
    assert resolve_dirs(e) == (p.drafter_dir, p.target_dir) and e.block_size == 16
    assert e.family == "muse_glimmer" and "convert" in e.supported
    pr = prompts[1]
    res = CliRunner().invoke(main, ["generate", "--target", "tiny-muse", "--prompt-ids", ",".join(map(str, pr)),
                                    "--max-new-tokens", "32", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["output_ids"] == target_generate(target, pr, 32)
    res = CliRunner().invoke(main, ["inspect", "--target", "tiny-muse", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ok"] is True
