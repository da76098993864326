"""Sliding-window layers on TensorRT-LLM: the target's take the context route where their window can bind; a
drafter's window that can bind is refused.

TensorRT-LLM's GPT attention plugin applies a layer's window (its ``host_max_attention_window_sizes`` entry) in the
context part of a call, but not in a generation part with speculative decoding, which every DFlash2 verify and draft
step is: that part runs only in XQA, and the TensorRT plugin leaves the op's spec-dec tree flag at its default, for
which XQA gets no window (``facts/attention_window.yaml``, read in TensorRT-LLM's sources, not run). A sliding layer
would attend to every key of its request there, which past the window is not the model. A window can bind where
``W < max_seq_len + 2K`` (positions can reach ``max_seq_len + 2K - 1``: trtllm-build adds 2K draft slots). There the
target's sliding layers take each step's new tokens as a context chunk (build setting ``sliding_path``: a verify block
is a causal chain; ``context_route`` in the record), and a drafter's window, whose draft block is bidirectional, is
refused. The cpu and cuda backends apply every window as a mask, on either path.
"""

from __future__ import annotations

import os
import re

from ..pretrained import resolve_sliding_path, target_sliding_layers, window_can_bind
from .runtime_rules import facts

FACTS_FILE = "engine/trtllm/facts/attention_window.yaml"
SM100_FACTS_FILE = "engine/trtllm/facts/spec_decoding_sm100.yaml"
ALLOW_SM100_ENV = "DFLASH2_TRTLLM_ALLOW_SM100"


def window_facts() -> dict:
    return facts("attention_window")


def binding_windows(t, d, *, max_seq_len: int, K: int, drafter_window: str) -> list[tuple[str, int]]:
    """``(side, window)`` for the target's sliding layers and (``drafter_window: model``) the drafter's smallest window,
    each where it can bind in an engine of ``max_seq_len`` with ``K`` draft tokens (``rule.window_can_bind``)."""
    out = []
    if target_sliding_layers(t.layer_types, t.sliding_window) and window_can_bind(t.sliding_window, max_seq_len, K):
        out.append(("target", int(t.sliding_window)))
    if drafter_window == "model":
        ws = [w for w in (d.layer_window(i) for i in range(d.num_hidden_layers)) if w]
        if ws and window_can_bind(min(ws), max_seq_len, K):
            out.append(("drafter", int(min(ws))))
    return out


def route_window_multiple(head_size: int) -> int:
    """The bf16 KV step of Hopper's paged context FMHA at ``head_size`` (``context_route.kv_step_bf16``: 256 up to
    head 64, 128 up to 128, 64 up to 256): one runner text refuses a sliding window that is not a multiple of it
    (``context_route.older_runner_window_multiple_of``)."""
    steps = sorted((int(k.split("_")[1]), int(v)) for k, v in window_facts()["context_route"]["kv_step_bf16"].items())
    return next((step for top, step in steps if int(head_size) <= top), steps[-1][1])


def route_window_ok(w: int, head_size: int) -> bool:
    """A window the context route takes on TensorRT-LLM whichever runner text 1.2 has (``context_route.
    route_needs_window``): a multiple of the paged context FMHA's KV step at the layer's head size. (On SM 90 every such
    call takes the warp-specialized kernel, whose sliding mask keeps exactly the window's keys:
    ``sm90_paged_kv_kernel``.)"""
    return int(w) % route_window_multiple(head_size) == 0


def window_blockers(t, d, cfg) -> list[str]:
    """One line per side whose window can bind: why TensorRT-LLM's engine would not be exact, and the ways out (a
    max_seq_len at which no window binds, ``drafter_window=full`` for the drafter, ``sliding_path=context`` for the
    target, the cuda backend). None where the record says the plugin applies the window in speculative-decoding steps;
    none for the target's side where its sliding layers take the context route (``context_route``)."""
    f = window_facts()
    if f["spec_decoding_generation"]["applies_window"]:
        return []
    K, block = cfg.block_size - 1, cfg.block_size
    path = resolve_sliding_path({"layer_types": t.layer_types, "sliding_window": t.sliding_window}, cfg)
    # the target's sliding layers on the context route take no speculative-decoding generation part: the context part
    # applies their window (context_route)
    routed = path == "context" and f["context_route"]["applies_window"]
    binding = [(side, w) for side, w in binding_windows(t, d, max_seq_len=cfg.max_seq_len, K=K,
                                                        drafter_window=cfg.drafter_window)
               if not (side == "target" and routed and route_window_ok(w, t.head_dim))]
    if not binding:
        return []
    fix_seq = min(w for _, w in binding) - 2 * K     # the largest max_seq_len at which no window binds
    fix_input = fix_seq - 1 - block                  # the longest prompt such an engine admits (config/build.py)
    out = []
    for side, w in binding:
        ways = []
        small_route = side == "target" and routed      # on the route, but a window the route cannot take exactly
        if side == "drafter":
            ways.append("--set drafter_window=full (lossless; costs acceptance past the window only)")
        elif not small_route and route_window_ok(w, t.head_dim):
            ways.append("--set sliding_path=context (the sliding layers take each step's new tokens as a context "
                        "chunk, where the plugin applies the window; the engine then runs on the project runtime)")
        if fix_input >= 1:
            flags = f"--max-seq-len {fix_seq}" + (f" --max-input-len {fix_input}" if cfg.max_input_len > fix_input
                                                  else "")
            ways.append(f"{flags} (the window never binds: exact)")
        ways.append("--backend cuda")
        who = "the target's sliding layers" if side == "target" else \
            "drafter_window 'model': the drafter's sliding layers"
        if small_route:
            out.append(
                f"{who} (window {w}) take the context route, but TensorRT-LLM's paged context FMHA may refuse a "
                f"sliding window that is not a multiple of its KV step ({route_window_multiple(t.head_dim)} at head "
                f"{t.head_dim}; {FACTS_FILE} "
                f"context_route [read, not run]), and it can bind at max_seq_len {cfg.max_seq_len}. Use "
                + ", or ".join(ways))
            continue
        out.append(
            f"{who} (window {w}) can bind at max_seq_len {cfg.max_seq_len} (positions can reach max_seq_len + 2K - 1 "
            f"= {cfg.max_seq_len + 2 * K - 1}), and TensorRT-LLM's attention plugin does not apply a sliding window in "
            f"speculative-decoding steps ({FACTS_FILE} [read, not run]): the engine would not be exact. Use "
            + ", or ".join(ways))
    return out


def is_sm100_family(gpu_sm: str | None) -> bool:
    """Blackwell datacenter parts: ``sm_100a``, ``sm_103`` (TensorRT-LLM's isSM100Family)."""
    m = re.match(r"sm_(\d+)", gpu_sm or "")
    return bool(m) and 100 <= int(m[1]) < 110


def sm100_note() -> str:
    """Why a TensorRT-LLM engine's speculative steps have no attention kernel on Blackwell (the record's words)."""
    f = facts("spec_decoding_sm100")
    return (f"on Blackwell (SM 100 / 103) TensorRT-LLM 1.2's attention takes a TensorRT engine's speculative-decoding "
            f"steps only in TRTLLM-GEN, which refuses them in the revisions read, so the first verify step would stop "
            f"with \"{f['dispatcher']['error_without_xqa']}\" (NVIDIA skips its TensorRT EAGLE test of a ModelOpt "
            f"checkpoint from SM {f['tests']['tensorrt_eagle_skipped_from_sm']} until speculative decoding is supported; "
            f"{SM100_FACTS_FILE} [read, not run])")


def sm100_refusal(gpu_sm: str | None) -> str | None:
    """The build's refusal on a Blackwell GPU, unless ``DFLASH2_TRTLLM_ALLOW_SM100=1`` (or the record says such steps
    run there)."""
    if not is_sm100_family(gpu_sm) or os.environ.get(ALLOW_SM100_ENV) == "1" \
            or facts("spec_decoding_sm100")["tensorrt_engine_spec_decoding_on_sm100"]:
        return None
    return (f"this machine's GPU is {gpu_sm}: {sm100_note()}. Build with --backend cuda on Blackwell, or set "
            f"{ALLOW_SM100_ENV}=1 to build the TensorRT-LLM engine anyway (e.g. on a TensorRT-LLM that runs it)")
