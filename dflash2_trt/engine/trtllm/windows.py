"""Sliding-window layers on TensorRT-LLM: where a window can bind, a TensorRT-LLM build is refused.

TensorRT-LLM's GPT attention plugin applies a layer's window (its ``host_max_attention_window_sizes`` entry) in the
context part of a call, but not in a generation part with speculative decoding, which every DFlash2 verify and draft
step is: that part runs only in XQA, and the TensorRT plugin leaves the op's spec-dec tree flag at its default, for
which XQA gets no window (``facts/attention_window.yaml``, read in TensorRT-LLM's sources, not run). A sliding layer
would attend to every key of its request there, which past the window is not the model. So an engine is exact on
TensorRT-LLM only where no layer's window can bind: ``W >= max_seq_len + 2K`` (positions reach ``max_seq_len + 2K -
1``: trtllm-build adds 2K draft slots). The cpu and cuda backends apply the window as a mask and are unaffected.
"""

from __future__ import annotations

from .runtime_rules import facts

FACTS_FILE = "engine/trtllm/facts/attention_window.yaml"


def window_facts() -> dict:
    return facts("attention_window")


def binding_windows(t, d, *, max_seq_len: int, K: int, drafter_window: str) -> list[tuple[str, int]]:
    """``(side, window)`` for the target's sliding layers and (``drafter_window: model``) the drafter's smallest window,
    each where it can bind in an engine of ``max_seq_len`` with ``K`` draft tokens (``rule.window_can_bind``)."""
    reach = int(max_seq_len) + 2 * int(K)
    out = []
    if t.sliding_window and "sliding_attention" in t.layer_types and int(t.sliding_window) < reach:
        out.append(("target", int(t.sliding_window)))
    if drafter_window == "model":
        ws = [w for w in (d.layer_window(i) for i in range(d.num_hidden_layers)) if w]
        if ws and min(ws) < reach:
            out.append(("drafter", int(min(ws))))
    return out


def window_blockers(t, d, cfg) -> list[str]:
    """One line per side whose window can bind (the reason TensorRT-LLM's engine would not be exact, and the ways
    out: a max_seq_len at which the window cannot bind, ``drafter_window=full`` for the drafter, the cuda backend)."""
    f = window_facts()
    assert f["spec_decoding_generation"]["applies_window"] is False and f["context"]["applies_window"] is True
    K, block = cfg.block_size - 1, cfg.block_size
    out = []
    for side, w in binding_windows(t, d, max_seq_len=cfg.max_seq_len, K=K, drafter_window=cfg.drafter_window):
        fix_seq = w - 2 * K                      # the largest max_seq_len at which w cannot bind
        fix_input = fix_seq - 1 - block          # the longest prompt such an engine admits (config/build.py)
        ways = []
        if side == "drafter":
            ways.append("--set drafter_window=full (lossless, costs acceptance past the window only)")
        if fix_input >= 1:
            flags = f"--max-seq-len {fix_seq}" + (f" --max-input-len {fix_input}" if cfg.max_input_len > fix_input
                                                  else "")
            ways.append(f"{flags} (the window then never binds: exact)")
        ways.append("--backend cuda (its attention applies the window)")
        who = ("the target's sliding layers" if side == "target" else "drafter_window 'model': the drafter's sliding "
               "layers")
        out.append(
            f"{who} (window {w}) can bind in an engine of max_seq_len {cfg.max_seq_len} (positions reach max_seq_len + "
            f"2K - 1 = {cfg.max_seq_len + 2 * K - 1}), and TensorRT-LLM's attention plugin applies no sliding window "
            f"in speculative-decoding generation steps (XQA takes them, without the window: the TensorRT plugin "
            f"leaves the op's spec-dec tree flag at its default; {FACTS_FILE} [read, not run]): past {w} tokens the "
            f"engine would not be the model. Use " + ", or ".join(ways))
    return out
