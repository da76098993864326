"""Sampling losslessness of the real speculative loop on the TRAINED pairs, where drafts are
really accepted several at a time (with the random pairs nearly every draft is rejected, so the
accept branch of rejection sampling is hardly exercised end to end).

The first three emitted tokens come from the prefill (t1) and the first verification cycle(s)
(t2, t3: accepted drafts, a correction from max(0, p - q), or the bonus). Their joint law must be
the target's own: P(t1) P(t2 | t1) P(t3 | t1, t2) at the same temperature, computed exactly here
by enumerating the likely prefixes. Chi-square over the likely triples (+ one bin for the rest),
fixed seeds, so the verdict is deterministic. A control with a broken acceptance rule (every
draft accepted) must be rejected by the same test on the same pair."""

import warnings

import pytest
import torch

import dflash2_trt.reference.loop as loop
from dflash2_trt.analyze import load_prompts
from dflash2_trt.assets import trained_pair
from dflash2_trt.reference.loop import load_pair, speculative_generate
from dflash2_trt.testing.law import chi2_pvalue, exact_triples

T = 1.0
# runs per pair, its control half as many: the control's p stays far below 1e-6 (measured with these seeds and
# prompts: qwen3 1.6e-9 at 300 runs, where it has the fewest likely triples; qwen3_5 3e-51 and muse_glimmer 6e-34 at
# 200) and the law is tested over 8 bins or more (qwen3 9, qwen3_5 9, muse_glimmer 8); 600 runs for each took ~13 s
# more of the suite
RUNS = {"qwen3": 600, "qwen3_5": 400, "muse_glimmer": 400}


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5", "muse_glimmer"])
def pair(request):
    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    p = trained_pair(request.param)
    target, drafter = load_pair(p.target_dir, p.drafter_dir)
    # The shipped prompt (first 8, cut to 10 tokens) whose continuation law is the least peaked:
    # most triples with >= 5 expected counts, so that the chi-square has something to test.
    prompts = [pr[:10] for pr in load_prompts(p.drafter_dir.parent / "prompts.json")[:8]]
    runs = RUNS[request.param]
    prompt = max(prompts, key=lambda pr: sum(1 for v in _exact_triples(target, pr).values() if v * runs >= 5))
    yield target, drafter, prompt, runs
    torch.set_num_threads(n)


def _exact_triples(target, prompt):
    return exact_triples(target, prompt, T)


def _chi2(samples, exact):
    return chi2_pvalue(samples, exact)


def _sample(target, drafter, prompt, runs):
    out, accepted = [], 0
    for s in range(runs):
        r = speculative_generate(target, drafter, prompt, max_new_tokens=3, selector="sample",
                                 temperature=T, seed=s)
        out.append(tuple(r.output_ids))
        accepted += r.acceptance_lengths[0] >= 2   # t2 was an accepted draft
    return out, accepted


def test_sampling_joint_law_matches_target(pair):
    target, drafter, prompt, runs = pair
    exact = _exact_triples(target, prompt)
    samples, accepted = _sample(target, drafter, prompt, runs)
    assert accepted >= runs // 4          # multi-token acceptance really happened
    assert _chi2(samples, exact) > 1e-3


def test_broken_acceptance_is_detected(pair, monkeypatch):
    target, drafter, prompt, runs = pair
    exact = _exact_triples(target, prompt)

    def accept_all(draft, q_full, p, u, fu):
        n = torch.full((draft.shape[0],), draft.shape[1], dtype=torch.long)
        return n, torch.argmax(p[:, -1], dim=-1)

    monkeypatch.setattr(loop, "accept_sampling", accept_all)
    samples, _ = _sample(target, drafter, prompt, runs // 2)
    assert _chi2(samples, exact) < 1e-6
