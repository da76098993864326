"""A drafter whose K/V per token are wider than the target's pool slot (the published Muse Glimmer 30B pair: drafter
8 x 128 against a 2 x 128 target) spreads its KV heads over several consecutive pool layers. Checked on a seeded
dense pair whose drafter has 4 KV heads against the tiny target's 2 (split 2), at tp 1 and 2."""

from __future__ import annotations

import warnings

import pytest

from dflash2_trt.assets import trained_pair
from dflash2_trt.engine.build import build_engine
from dflash2_trt.reference.loop import load_pair, speculative_generate, target_generate
from dflash2_trt.testing.engines import run_prompts, shipped_prompts

NEW = 24


@pytest.fixture(scope="module")
def wide_drafter(tmp_path_factory):
    """The trained tiny drafter with its 2 KV heads duplicated into 4 ([k0, k0, k1, k1]): with 4 query heads over
    4 KV heads, query head h reads KV head h — the same function as the original (h // 2 of 2), so acceptance stays
    the trained drafter's (high), and a misplaced KV head group would show."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    src = trained_pair("qwen3").drafter_dir
    d = tmp_path_factory.mktemp("wide") / "drafter"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    hd, nkv = cfg["head_dim"], cfg["num_key_value_heads"]
    assert (nkv, cfg["num_attention_heads"]) == (2, 4)
    cfg["num_key_value_heads"] = 4
    (d / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(d / "model.safetensors"))
    for name in list(sd):
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            heads = sd[name].view(nkv, hd, -1)
            sd[name] = torch.cat([heads[0], heads[0], heads[1], heads[1]], dim=0).contiguous()
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


@pytest.mark.parametrize("tp", [1, 2])
def test_wide_drafter_kv_spreads_over_pool_layers(wide_drafter, tmp_path, tp):
    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    target_dir = trained_pair("qwen3").target_dir
    out = tmp_path / "eng"
    build_engine(wide_drafter, target_dir, out, tp_size=tp, overrides={"tokens_per_block": 16}, verify=False)
    from dflash2_trt.engine.standin.engine import open_standin_engine

    eng, _ = open_standin_engine(out)
    assert eng.num_layers == 4 + 2 * 2          # 4 target attention layers + 2 drafter layers x split 2
    eng.close()
    prompts = shipped_prompts(trained_pair("qwen3"), 6)
    reqs, _ = run_prompts(out, prompts, new=NEW)
    target, drafter = load_pair(target_dir, wide_drafter)
    assert sum(map(sum, (r.acceptance_lengths for r in reqs))) / sum(len(r.acceptance_lengths) for r in reqs) > 2
    for r, p in zip(reqs, prompts):
        assert r.output_ids == target_generate(target, p, NEW, stop_token_ids=(2,))
        assert r.acceptance_lengths == speculative_generate(target, drafter, p, max_new_tokens=NEW,
                                                            stop_token_ids=(2,)).acceptance_lengths
