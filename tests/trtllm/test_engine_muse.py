"""Muse Glimmer inside the engine (tiny-muse): sliding-window and NoPE full-attention target layers, sandwich norms,
weight-less q/k norm with qk_scale_factor, embedding norm on the target only, the target's logit softcap; block 16.

References: the target's own greedy decoding (transformers, via ``target_generate``) and the reference loop."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.engine.build import build_engine
from dflash2_trt.reference.loop import load_pair, speculative_generate, target_generate
from dflash2_trt.testing.engines import EngineCache, ReferenceRuns, run_prompts
from dflash2_trt.testing.law import chi2_pvalue, exact_triples

NEW = 40


@pytest.fixture(scope="module")
def pair():
    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    return trained_pair("muse_glimmer")


@pytest.fixture(scope="module")
def prompts(pair):
    ps = json.loads((pair.drafter_dir.parent / "prompts.json").read_text())["prompts"]
    out = [list(p) for p in ps[:12]]
    assert len(out) == 12 and len({len(p) for p in out}) >= 4
    return out


@pytest.fixture(scope="module")
def target(pair):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    t, _ = load_pair(pair.target_dir, pair.drafter_dir)
    yield t
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def engines(pair, tmp_path_factory):
    return EngineCache(pair, "tiny-muse", tmp_path_factory, verify=False)


@pytest.fixture(scope="module")
def references(pair, prompts, target):
    """eos ids -> (the target's greedy output of every prompt, the reference loop's runs by block size), each
    computed once for the module."""
    cache: dict = {}

    def get(eos):
        if eos not in cache:
            cache[eos] = ([target_generate(target, p, NEW, stop_token_ids=eos) for p in prompts],
                          ReferenceRuns(pair, prompts, NEW, eos))
        return cache[eos]
    return get


def _run(engine_dir, prompts, *, max_batch=4, temperature=0.0, seeds=None, new=NEW):
    return run_prompts(engine_dir, prompts, new=new, max_batch=max_batch, temperature=temperature, seeds=seeds)


@pytest.mark.parametrize("block,tp", [(16, 1), (8, 1), (8, 2)])
def test_muse_greedy_lossless_and_acceptance_equals_reference(prompts, references, engines, block, tp):
    eos = tuple(json.loads((engines(block, tp) / "engine.json").read_text())["eos_token_ids"])
    reqs, rt = _run(engines(block, tp), prompts)
    assert any(s["context"] and s["generation"] for s in rt.step_log)
    greedy, reference = references(eos)
    for r, ref, sp in zip(reqs, greedy, reference(block)):
        assert r.output_ids == ref, f"prompt {r.task_id}"
        assert r.acceptance_lengths == sp.acceptance_lengths, f"prompt {r.task_id}"


def test_the_target_window_is_real(prompts, target, engines, monkeypatch):
    """Control: the target's sliding-window layers without their window must change the outputs -- the window is
    really applied, and it reaches the layers through the runtime's per-layer host_max_attention_window_sizes
    (model.kv_layer_windows; the plugin reads it on the host, so the graph cannot make it)."""
    from dflash2_trt.trtllm.backend import load_network

    base, _ = _run(engines(16), prompts)
    net = load_network("cpu")
    orig = net.kv_layer_windows
    seen = []

    def uniform(config, drafter_window, max_seq_len):
        w = orig(config, drafter_window, max_seq_len)
        seen.append(len(set(w)) > 1)          # the real list mixes the sliding window and full layers
        return [max_seq_len] * len(w)

    monkeypatch.setattr(net, "kv_layer_windows", uniform)
    bad, _ = _run(engines(16), prompts)
    assert seen and all(seen)
    assert [r.output_ids for r in bad] != [r.output_ids for r in base]


def test_muse_sampling_joint_law(target, prompts, engines):
    T, runs = 1.0, 900
    cands = [p[:10] for p in prompts[:8]]
    prompt = max(cands, key=lambda pr: sum(1 for v in exact_triples(target, pr, T).values() if v * runs >= 5))
    exact = exact_triples(target, prompt, T)
    eng = engines(16, max_batch_size=64, max_seq_len=64, max_input_len=32, max_num_tokens=2048)
    reqs, _ = _run(eng, [prompt] * runs, max_batch=64, temperature=T, seeds=list(range(runs)), new=3)
    assert chi2_pvalue([tuple(r.output_ids) for r in reqs], exact) > 1e-3


def test_drafter_and_target_transforms_and_windows_stay_apart(pair, prompts, target, tmp_path):
    """The tiny pair's drafter and target share multiplier 0.5, softcap 20 and window 16, so a mix-up between the
    drafter's unary transform / window and the target's would go unseen. A copy of the drafter with its own
    (multiplier 1.3, softcap 7, window 6) must give the reference loop's exact acceptance with the same drafter —
    and still the target's greedy output."""
    import shutil

    d = tmp_path / "drafter"
    shutil.copytree(pair.drafter_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["dflash_config"].update(output_multiplier=1.3, final_logit_softcapping=7.0)
    cfg["sliding_window"] = 6
    (d / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "eng"
    build_engine(d, pair.target_dir, out, target_key="tiny-muse", overrides={"tokens_per_block": 16}, verify=False)
    eos = tuple(json.loads((out / "engine.json").read_text())["eos_token_ids"])
    reqs, _ = _run(out, prompts[:6])
    t, drafter = load_pair(pair.target_dir, d)
    assert drafter.cfg.output_multiplier == 1.3 and drafter.cfg.sliding_window == 6
    for r, p in zip(reqs, prompts[:6]):
        assert r.output_ids == target_generate(target, p, NEW, stop_token_ids=eos)
        assert r.acceptance_lengths == speculative_generate(t, drafter, p, max_new_tokens=NEW,
                                                            stop_token_ids=eos).acceptance_lengths
