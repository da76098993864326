"""Memory as TensorRT-LLM's runtimes hand it to an engine: never zeroed (the KV pool is ``torch.empty``, facts
``kv_pool.allocation``; the state slots too, facts ``recurrent_state``; the C++ runtime's buffers come from its
allocator), blocks and slots holding earlier requests' values, rejected drafts' K/V left behind. The engine may
depend only on what is live. Before EVERY step of a session over the CPU stand-in of TensorRT, everything else is
overwritten with NaN:

- the KV pool, except the committed positions of the step's generation requests (a context request is a whole
  prompt here, so it owns no live position before its step);
- the state slots: every slot no generation request of the step uses (unused slots and context requests' slots,
  which ``zero_state`` must keep out), and in a generation request's slot the records past its pending count, the
  count's padding and the slot's tail (the state, the count and the records below it are live);
- every byte of the session's persistent input and output buffers (0xFF) before the feed is copied in, and of each
  buffer the step makes;

and the stand-in's topk, which refuses a NaN, orders one as -inf or +inf and returns it, as TensorRT's TopK would.
The tokens and per-step acceptance must be the clean session's, greedy and sampled, for the three pairs. Controls:
one live K/V position, one live record, or a ``zero_state`` the Gated DeltaNet ignores, and the run changes.

It holds the fault the first NaN runs found (2026-12-06; they poisoned the pool once, at open): the stand-in's
attention weighted V past a sequence's length by the mask's 0, which a NaN there survives (trtllm/cpu/attention.py
read_batch); with that fault back, six of its cases fail."""

from __future__ import annotations

import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.runtime import Request, Runtime
from dflash2_trt.testing.engines import EngineCache, shipped_prompts, standin_session
from dflash2_trt.trtllm.cpu import functional as F
from dflash2_trt.trtllm.gdn_slot import engine_slot_layout

NAN = float("nan")
PAIRS = {"tiny": "qwen3", "tiny-hybrid": "qwen3_5", "tiny-muse": "muse_glimmer"}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    caches = {key: EngineCache(trained_pair(fam), key, tmp_path_factory, verify=False) for key, fam in PAIRS.items()}
    return lambda key: caches[key](4)


def _run(sess, key, temperature, mixed=True):
    prompts = shipped_prompts(trained_pair(PAIRS[key]), 6)
    reqs = [Request(list(p), 16, seed=i, temperature=temperature, stop_token_ids=(2,), task_id=i)
            for i, p in enumerate(prompts)]
    rt = Runtime(sess, max_batch_size=3)
    rt.generate(reqs)
    assert not mixed or any(s["context"] and s["generation"] for s in rt.step_log)       # mixed steps ran
    return [r.output_ids for r in reqs], [r.acceptance_lengths for r in reqs]


def _topk_passing_nan(nan_as):
    def topk(input, k, dim, largest=True, prefer_plugin=True):
        x = F.raw(input)
        _, idx = torch.sort(torch.nan_to_num(x, nan=nan_as), dim=dim, descending=largest, stable=True)
        idx = idx.narrow(dim, 0, k)
        return F.wrap(torch.gather(x, dim, idx).contiguous()), F.wrap(idx.to(torch.int32).contiguous())
    return topk


def _poison_kv(sess, inputs, live_too):
    pool, layers, tpb = sess.pools[0], sess.num_layers, sess.tokens_per_block
    keep = torch.zeros(pool.shape[0], tpb, dtype=torch.bool)                  # [block, slot in block]
    offsets = inputs["kv_cache_block_offsets"][0]                             # [bs, 2, max_blocks], K at block*2L
    past, kinds = inputs["host_past_key_value_lengths"], inputs["host_request_types"]
    for r in range(offsets.shape[0]):
        if int(kinds[r]) != 1:
            continue
        for p in range(int(past[r]) - (1 if live_too else 0)):               # control: the last committed one too
            keep[int(offsets[r, 0, p // tpb]) // (2 * layers), p % tpb] = True
    kept = pool.clone()
    pool.fill_(NAN)
    mask = keep[:, None, None, None, :, None].expand_as(pool)
    pool[mask] = kept[mask]


def _poison_state(sess, inputs, live_too):
    lay = engine_slot_layout(sess.config)
    hv, hk, kv, dk, dv = lay.num_v_heads, lay.num_k_heads, lay.max_verify_tokens, lay.head_k_dim, lay.head_v_dim
    kinds, slots = inputs["host_request_types"], inputs["slot_mapping"]
    generating = {int(slots[r]) for r in range(len(slots)) if int(kinds[r]) == 1}
    for layer, rnn in sess.rnn_states.items():
        flat, conv = rnn.view(rnn.shape[0], -1), sess.conv_states[layer]
        for s in range(rnn.shape[0]):
            if s not in generating:
                flat[s].fill_(NAN)
                conv[s].fill_(NAN)
                continue
            n = max(0, min(int(flat[s, lay.pending:lay.pending + 1].view(torch.int32)[0]), kv))
            flat[s, lay.pending + 1:lay.pending + 4] = NAN
            delta = flat[s, lay.delta:lay.delta + hv * kv * dv].view(hv, kv, dv)
            if live_too and n > 0:                                             # control: a live record too
                delta[:, 0] = NAN
            delta[:, n:] = NAN
            flat[s, lay.keys:lay.keys + hk * kv * dk].view(hk, kv, dk)[:, n:] = NAN
            flat[s, lay.decay:lay.decay + hv * kv].view(hv, kv)[:, n:] = NAN
            flat[s, lay.decay + hv * kv:] = NAN


def _poisoned(sess, control=None):
    step, make_buffer = sess.step, sess._buffer

    def fresh_buffer(name, nbytes, device, pin):    # a buffer made during a step starts as garbage too
        made = name not in sess._buffers or sess._buffers[name].capacity < nbytes
        buf = make_buffer(name, nbytes, device, pin)
        if made:
            buf._raw.fill_(0xFF)
        return buf

    def poisoned_step(inputs):
        _poison_kv(sess, inputs, control == "live kv")
        if sess.recurrent:
            _poison_state(sess, inputs, control == "live record")
        for buf in sess._buffers.values():
            buf._raw.fill_(0xFF)
        return step(inputs)

    sess.step, sess._buffer = poisoned_step, fresh_buffer
    sess.reset_slot = lambda slot: None          # TensorRT-LLM's runtimes never zero a slot
    return sess


@pytest.mark.parametrize("key,temperature,nan_as", [
    ("tiny", 0.0, float("-inf")), ("tiny", 0.8, float("inf")),
    ("tiny-hybrid", 0.0, float("inf")), ("tiny-hybrid", 0.8, float("-inf")),
    ("tiny-muse", 0.0, float("-inf")), ("tiny-muse", 0.8, float("inf"))])
def test_only_live_memory_reaches_the_tokens(engines, monkeypatch, key, temperature, nan_as):
    want = _run(standin_session(engines(key)), key, temperature)
    monkeypatch.setattr(F, "topk", _topk_passing_nan(nan_as))
    assert _run(_poisoned(standin_session(engines(key))), key, temperature) == want


def test_only_live_memory_with_generation_steps_replayed_from_graphs(engines, monkeypatch):
    """The same with the generation steps replayed from (simulated) CUDA graphs: their inputs are the buffers
    poisoned before each step."""
    want = _run(standin_session(engines("tiny-hybrid")), "tiny-hybrid", 0.8)
    monkeypatch.setattr(F, "topk", _topk_passing_nan(float("-inf")))
    sess = _poisoned(standin_session(engines("tiny-hybrid"), simulate_graphs=True))
    assert _run(sess, "tiny-hybrid", 0.8) == want
    assert sess.graphs.report()["replayed"] > 0


@pytest.mark.parametrize("key,control", [("tiny", "live kv"), ("tiny-hybrid", "live record"),
                                         ("tiny-hybrid", "zero_state ignored")])
def test_the_poison_bites(engines, monkeypatch, key, control):
    from dflash2_trt.trtllm.plugin_layers import CpuPlugins

    want = _run(standin_session(engines(key)), key, 0.0)
    monkeypatch.setattr(F, "topk", _topk_passing_nan(float("-inf")))
    if control == "zero_state ignored":
        orig = CpuPlugins.gated_delta_net
        monkeypatch.setattr(CpuPlugins, "gated_delta_net",
                            lambda self, *a, zero_state=None, **kw: orig(self, *a, **kw))
    try:
        got = _run(_poisoned(standin_session(engines(key)), control), key, 0.0, mixed=False)
    except (ValueError, RuntimeError):           # NaN reached something that refuses it: changed, too
        return
    assert got != want
