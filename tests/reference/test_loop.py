"""Speculative loop on both tiny targets: greedy output is token-identical to the target's own
greedy decoding (every selector mode, block sizes 4/8/16), the hybrid target's recurrent state is
restored correctly, stop tokens and max_new_tokens are honoured, sampling is reproducible."""

import warnings

import pytest
import torch

from dflash2_trt.reference.drafter import DFlash2Drafter
from dflash2_trt.reference.loop import is_hybrid, load_pair, speculative_generate, target_generate
from dflash2_trt.testing.tiny import tiny_pair

PROMPTS = [[5, 17, 33, 9, 100], [1, 2], [200, 3, 3, 3, 41, 77, 12, 8, 150, 64, 90]]
MAX_NEW = 24


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models: one thread is faster and avoids oversubscribing shared CI cores.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def pair(request):
    from transformers.utils import logging

    logging.set_verbosity_error()
    p = tiny_pair(request.param)
    target, drafter = load_pair(p.target_dir, p.drafter_dir)
    # longer than MAX_NEW so that forced drafts past the end are still the true continuation
    refs = {tuple(pr): target_generate(target, pr, MAX_NEW + 17) for pr in PROMPTS}
    return p, target, drafter, refs


def _drafter(p, bs):
    return DFlash2Drafter.from_pretrained(p.drafter_dir, block_size=bs)


@pytest.mark.parametrize("bs", [4, 8, 16])
@pytest.mark.parametrize("mode", ["greedy", "viterbi", "none"])
def test_greedy_lossless_every_mode(pair, bs, mode):
    p, target, _, refs = pair
    drafter = _drafter(p, bs)
    for pr in PROMPTS:
        r = speculative_generate(target, drafter, pr, max_new_tokens=MAX_NEW, selector=mode)
        assert r.output_ids == refs[tuple(pr)][:MAX_NEW], (p.family, bs, mode, pr)
        assert sum(min(a, MAX_NEW) for a in r.acceptance_lengths) + 1 >= MAX_NEW


@pytest.mark.parametrize("bs", [4, 8, 16])
def test_greedy_lossless_with_forced_acceptance(pair, bs):
    """Drafts forced to the target's true continuation, corrupted at a scheduled position (or not
    at all), so acceptance lengths bs, 1, 2, ... go through the commit / crop / replay paths."""
    p, target, _, refs = pair
    drafter = _drafter(p, bs)
    L = bs - 1
    for pi, pr in enumerate(PROMPTS):
        full = list(pr) + refs[tuple(pr)]
        ref = refs[tuple(pr)][:MAX_NEW]
        calls = []
        schedule = [L] + list(range(L))          # all accepted, then 0, 1, ... accepted

        def hook(start, draft):
            truth = torch.tensor(full[start + 1:start + 1 + L])
            cut = schedule[(len(calls) + pi) % len(schedule)]
            calls.append(start)
            if cut < L:
                truth[cut] = (truth[cut] + 1) % 256
            return truth[None]

        r = speculative_generate(target, drafter, pr, max_new_tokens=MAX_NEW, draft_hook=hook)
        assert r.output_ids == ref, (p.family, bs, pr)
        want = [schedule[(i + pi) % len(schedule)] + 1 for i in range(len(r.acceptance_lengths))]
        assert r.acceptance_lengths == want
        if is_hybrid(target):
            assert r.replay_passes == sum(1 for a in r.acceptance_lengths if a < bs)
        else:
            assert r.replay_passes == 0


def test_hybrid_replay_is_needed(pair, monkeypatch):
    """Control: cropping only the attention layers of the hybrid target (leaving rejected tokens
    in the Gated DeltaNet recurrent/conv state) changes the output, so the lossless tests above
    really depend on the snapshot/replay path."""
    p, target, drafter, refs = pair
    if not is_hybrid(target):
        pytest.skip("attention-only target: crop is exact")
    from transformers.cache_utils import DynamicLayer

    import dflash2_trt.reference.loop as loop

    new_cache = loop._new_cache

    def crop_attention_only(cache, length):
        for layer in cache.layers:
            if isinstance(layer, DynamicLayer) and layer.get_seq_length() > length:
                layer.crop(length - layer.get_seq_length())
            elif hasattr(layer, "cumulative_length_linear"):
                # transformers >= 5.25 counts tokens in the Gated DeltaNet layers too, and the model
                # takes its positions from layer 0 (one of them): rewind the count, so that the state
                # is the only thing this control leaves wrong.
                layer.cumulative_length_linear.fill_(length)

    # The commit takes the crop branch; the cache stays the one the loop builds for a hybrid target
    # (nothing recorded: it is restored from a snapshot, never cropped). Letting the patched
    # is_hybrid reach _new_cache would make the Gated DeltaNet layers record too, which transformers
    # 5.25 cannot run (activate_past_recording() leaves recurrent_states_to_keep None).
    monkeypatch.setattr(loop, "is_hybrid", lambda t: False)
    monkeypatch.setattr(loop, "_new_cache", lambda t, record=True: new_cache(t, record=False))
    monkeypatch.setattr(loop, "_crop_to", crop_attention_only)
    pr = PROMPTS[0]
    full = list(pr) + refs[tuple(pr)]

    def hook(start, draft):  # first draft right, second wrong: 2 accepted-ish every cycle
        truth = torch.tensor(full[start + 1:start + 1 + draft.shape[1]])
        truth[1] = (truth[1] + 1) % 256
        return truth[None]

    r = speculative_generate(target, drafter, pr, max_new_tokens=MAX_NEW, draft_hook=hook)
    assert r.output_ids != refs[tuple(pr)][:MAX_NEW]


def test_stop_token_and_max_new_tokens(pair):
    p, target, drafter, refs = pair
    pr = PROMPTS[0]
    ref = refs[tuple(pr)][:MAX_NEW]
    stop = ref[5]
    first = ref.index(stop)
    r = speculative_generate(target, drafter, pr, max_new_tokens=MAX_NEW, stop_token_ids=[stop])
    assert r.output_ids == ref[:first + 1] and r.stop_reason == "stop_token"
    r = speculative_generate(target, drafter, pr, max_new_tokens=7)
    assert r.output_ids == ref[:7] and r.stop_reason == "max_new_tokens"
    r = speculative_generate(target, drafter, pr, max_new_tokens=1)
    assert r.output_ids == ref[:1] and r.target_passes == 1


def test_sampling_reproducible_and_valid(pair):
    p, target, drafter, _ = pair
    a = speculative_generate(target, drafter, PROMPTS[0], max_new_tokens=16, selector="sample",
                             temperature=0.9, seed=7)
    b = speculative_generate(target, drafter, PROMPTS[0], max_new_tokens=16, selector="sample",
                             temperature=0.9, seed=7)
    c = speculative_generate(target, drafter, PROMPTS[0], max_new_tokens=16, selector="sample",
                             temperature=0.9, seed=8)
    assert a.output_ids == b.output_ids and len(a.output_ids) == 16
    assert a.output_ids != c.output_ids
    assert all(0 <= t < 256 for t in a.output_ids)
    with pytest.raises(ValueError, match="temperature"):
        speculative_generate(target, drafter, PROMPTS[0], selector="sample", temperature=0.0)


def test_oracle_equals_transformers_generate(pair):
    """The losslessness oracle (target_generate, defined next to the loop it judges) equals
    transformers' own greedy generate, so the lossless tests above do not rest on loop.py alone."""
    p, target, _, refs = pair
    for pr in PROMPTS:
        hf = target.generate(torch.tensor([pr]), max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        assert hf[0, len(pr):].tolist() == refs[tuple(pr)][:MAX_NEW], (p.family, pr)
