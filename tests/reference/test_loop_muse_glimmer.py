"""Greedy losslessness on a tiny random Muse Glimmer target (built here with transformers):
sliding-window attention layers (window 8, shorter than the sequence) whose cache must be cropped
after verification, NoPE full-attention layer, a normed target embedding that the drafter must
bypass, and a drafter with output_multiplier + final_logit_softcapping."""

import json
import warnings

import pytest
import torch

from dflash2_trt.config import DFlash2Config
from dflash2_trt.reference.drafter import DFlash2Drafter
from dflash2_trt.reference.loop import load_target, speculative_generate, target_generate
from dflash2_trt.testing.tiny import tiny_drafter_config

MAX_NEW = 24


@pytest.fixture(scope="module")
def muse_pair(tmp_path_factory):
    from transformers.models.muse_glimmer import configuration_muse_glimmer as mg
    from transformers.models.muse_glimmer import modeling_muse_glimmer as mm
    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    text = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                max_position_embeddings=512, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
                eos_token_id=2, pad_token_id=0, bos_token_id=1)
    vision = dict(patch_size=4, pos_emb_height=4, pos_emb_width=4, num_attention_heads=2,
                  num_hidden_layers=1, hidden_size=32, intermediate_size=64)
    torch.manual_seed(0)
    model = mm.MuseGlimmerForConditionalGeneration(
        mg.MuseGlimmerConfig(text_config=text, vision_config=vision, tie_word_embeddings=False))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "visual" not in n and "vision" not in n and p.dim() == 2:
                p.normal_(0.0, (1.0 if n.endswith(("embed_tokens.weight", "lm_head.weight")) else p.shape[1] ** -0.5))
    d = tmp_path_factory.mktemp("muse") / "target"
    model.save_pretrained(d)
    target = load_target(d, dtype=torch.float32)   # exercises the image-text-to-text fallback
    cfgd = tiny_drafter_config("qwen3")
    cfgd.pop("tiny_family")
    cfgd["dflash_config"].update(output_multiplier=0.2, final_logit_softcapping=20.0)
    drafter = DFlash2Drafter(DFlash2Config.from_hugging_face(cfgd)).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in drafter.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5 if p.dim() == 2 else 0.1)
                    + (1.0 if n.endswith("norm.weight") else 0.0))
    return target, drafter


@pytest.mark.parametrize("forced", [False, True])
def test_muse_glimmer_greedy_lossless(muse_pair, forced):
    target, drafter = muse_pair
    assert type(target).__name__ == "MuseGlimmerForConditionalGeneration"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for pi, pr in enumerate([[5, 17, 33, 9, 100], [7, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]):
            ref = target_generate(target, pr, MAX_NEW + 17)
            full = list(pr) + ref
            L = drafter.cfg.block_size - 1
            schedule = [L] + list(range(L))
            calls = []

            def hook(start, draft):
                truth = torch.tensor(full[start + 1:start + 1 + L])
                cut = schedule[(len(calls) + pi) % len(schedule)]
                calls.append(start)
                if cut < L:
                    truth[cut] = (truth[cut] + 1) % 256
                return truth[None]

            r = speculative_generate(target, drafter, pr, max_new_tokens=MAX_NEW,
                                     draft_hook=hook if forced else None)
            assert r.output_ids == ref[:MAX_NEW]
            if forced:
                want = [schedule[(i + pi) % len(schedule)] + 1 for i in range(len(r.acceptance_lengths))]
                assert r.acceptance_lengths == want and max(want) > 3
    finally:
        torch.set_num_threads(n)


def test_sliding_window_cache_needs_recording(muse_pair, monkeypatch):
    """Control: without past recording, the sliding-window cache layers have already dropped keys
    beyond the window when verification asks for a crop (so the recording above is load-bearing)."""
    import dflash2_trt.reference.loop as loop

    target, drafter = muse_pair
    orig = loop._new_cache
    monkeypatch.setattr(loop, "_new_cache", lambda t, record=True: orig(t, record=False))
    with pytest.raises(RuntimeError, match="past"):
        speculative_generate(target, drafter, [5, 17, 33, 9, 100, 1, 2, 3, 4], max_new_tokens=MAX_NEW)
