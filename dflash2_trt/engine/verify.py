"""The build's verify gate: a few fixed prompts through the built engine and through the target's own
greedy decoding (transformers, :func:`dflash2_trt.reference.loop.target_generate`); any token
difference fails the build (and the build then leaves nothing behind).

Greedy speculative decoding is lossless: the engine's output must equal the target's token for
token, stop tokens included. A difference means the engine (network, converter layout, plugins,
runtime bookkeeping) is wrong, however plausible its text looks, with one exception that rounding
forces: a tie. The engine's logits are float32 (``logits_dtype``), the reference's are the target's
own dtype, so where two tokens' bfloat16 logits are equal (or one step apart) the two argmaxes may
differ with both right (seen: token 171 at 9.846 against 138 at 9.814 in float32, both 9.875 in
bfloat16; transformers' argmax takes the lower id). :func:`check_against_target` therefore takes a
difference as a tie only where the target's own logits at that position (the shared prefix) put the
engine's token within :data:`TIE_STEPS` steps of the dtype of the target's token, then continues
the reference along the engine's token; more than :data:`MAX_TIES` ties in one prompt, or any other
difference, fails. Each tie is reported (``engine.json`` ``verify.ties``, the build's line).

Prompts: the trained tiny pairs' own held-out prompts (their drafters predict them, so multi-token
acceptance is exercised too), else :data:`N_PROMPTS` deterministic id sequences over the vocabulary
(special ids avoided). Each prompt is cut to the engine's ``max_input_len`` and the new tokens to
what ``max_seq_len`` leaves once the runtime's K + 1 draft slots are reserved.

This module is the gate's shared half (prompts, the reference decoding, the comparison); each backend runs
its engine on them: the stand-in backends (cpu, cuda) with the project's runtime (:mod:`.standin.verify`), the
TensorRT-LLM backend through TensorRT-LLM's C++ runner (:mod:`.trtllm.verify`, GPU machines).
"""

from __future__ import annotations

import contextlib
import json

from ..assets import ASSET_ROOT
from ..errors import ConfigError, DFlash2Error
from ..targets import get_target

AUTO_MAX_TARGET_BYTES = 2 << 30   # verify by default when the target's weights are at most this (the reference
                                  # decodes on this machine's CPU through transformers)
N_PROMPTS = 4
NEW_TOKENS = 24
TIE_STEPS = 2        # a tie: the engine's token within this many steps (ulps) of the dtype of the target's token
MAX_TIES = 2         # per prompt: more is not rounding


class VerifyError(DFlash2Error):
    """The engine's greedy output differs from the target's own."""


def fixed_prompts(target_key: str | None, vocab_size: int, avoid=(), n: int = N_PROMPTS) -> list[list[int]]:
    if target_key is not None:
        entry = get_target(target_key)
        if entry.tiny_family is not None:
            path = ASSET_ROOT / entry.tiny_family / "prompts.json"
            if path.is_file():
                prompts = json.loads(path.read_text())["prompts"]
                return [list(map(int, p)) for p in prompts[:n]]
    avoid = set(int(a) for a in avoid)
    out = []
    for i in range(n):
        length = 5 + 4 * i
        ids, j = [], 0
        while len(ids) < length:
            tok = (7919 * (i + 1) + 104729 * j + 31 * j * j) % vocab_size
            j += 1
            if tok not in avoid:
                ids.append(tok)
        out.append(ids)
    return out


def shape_prompts(prompts, max_input_len: int, max_seq_len: int, new: int,
                  slots: int = 0) -> tuple[list[list[int]], int]:
    """The prompts cut to ``max_input_len`` and the new tokens to what ``max_seq_len`` leaves (at least one).
    ``slots``: what the runtime reserves per request on top of prompt + new tokens (the project runtime: the K + 1
    draft slots, :meth:`~dflash2_trt.runtime.Runtime.check`), so that the gate's own requests are ones it admits."""
    usable = max_seq_len - slots
    prompts = [p[:max(1, min(max_input_len, usable - 1))] for p in prompts]
    new = max(1, min(new, usable - max(len(p) for p in prompts)))
    return prompts, new


def check_pool(prompts, new: int, K: int, tokens_per_block: int, num_blocks: int) -> None:
    """The verify gate's requests must fit a KV pool of ``num_blocks`` (a small ``num_kv_blocks``): else one
    ConfigError naming the setting, not "request 16 needs 2 KV blocks" about a request the user never sent."""
    need = max(-(-(len(p) + new + K + 1) // tokens_per_block) for p in prompts)
    if need > num_blocks:
        raise ConfigError(f"{num_blocks} KV block(s) of {tokens_per_block} tokens cannot hold the verify gate's "
                          f"longest request ({max(map(len, prompts))} prompt + {new} new + {K + 1} draft slots: "
                          f"{need} blocks); raise num_kv_blocks (0 = enough for max_batch_size requests) or build "
                          f"with --no-verify", field="num_kv_blocks")


def planned_check_pool(target_key, vocab_size: int, cfg, K: int, new: int = None) -> None:
    """:func:`check_pool` from the build settings alone, before anything is converted."""
    if not cfg.num_kv_blocks:
        return
    prompts = fixed_prompts(target_key, vocab_size)
    prompts, new = shape_prompts(prompts, cfg.max_input_len, cfg.max_seq_len, NEW_TOKENS if new is None else new,
                                 slots=K + 1)
    check_pool(prompts, new, K, cfg.tokens_per_block, cfg.num_kv_blocks)


def reference_outputs(target_dir, prompts, new: int, eos, dtype: str | None = None, device="cpu") -> list[list[int]]:
    """The target's own greedy decoding of ``prompts`` (transformers, on ``device``: the engine's own, so a cuda
    engine is held to the target on the same GPU), in the engine's dtype: lossless means equal to the target under
    the same weights; an engine cast to float16 is compared with the target cast to float16."""
    from ..reference.loop import target_generate

    with _quiet_transformers():
        target = _load_reference_target(target_dir, dtype, device)
        return [target_generate(target, p, new, stop_token_ids=eos) for p in prompts]


@contextlib.contextmanager
def _quiet_transformers():
    """The build prints its own progress: no "Loading weights" bar, and no "`causal_conv1d_update` is falling back to
    its reference PyTorch implementation" notes (transformers 5.25 says them at the first forward, not the load; on
    a CPU they are what the reference is meant to run: transformers' own torch code)."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _load_reference_target(target_dir, dtype: str | None, device):
    """The reference target (its callers hold transformers quiet over the load and the decoding)."""
    import torch

    from ..reference.loop import load_target

    return load_target(target_dir, check_values=False, dtype=getattr(torch, dtype) if dtype else None, device=device)


def dtype_step(dtype: str | None, x: float) -> float:
    """The spacing of ``dtype`` values at magnitude ``x`` (one ulp; float32 where the dtype is not named)."""
    import math

    import torch

    eps = torch.finfo(getattr(torch, str(dtype).replace("torch.", ""), torch.float32)).eps
    return eps * 2.0 ** math.floor(math.log2(max(abs(x), 2.0 ** -14)))


def check_against_target(target_dir, prompts, engine_outs, new: int, eos, dtype: str | None = None,
                         device="cpu") -> list[dict]:
    """The engine's greedy outputs against the target's own (module docstring): returns the ties, raises
    :class:`VerifyError` on any other difference (:func:`compare`'s line, with the target's logits where a tie was
    considered)."""
    with _quiet_transformers():
        return _check_against_target(target_dir, prompts, engine_outs, new, eos, dtype, device)


def _check_against_target(target_dir, prompts, engine_outs, new: int, eos, dtype, device) -> list[dict]:
    import torch

    from ..reference.loop import target_generate

    target = _load_reference_target(target_dir, dtype, device)
    dev = next(target.parameters()).device
    stops = set(eos)
    ties: list[dict] = []
    for i, (p, got) in enumerate(zip(prompts, engine_outs)):
        done = []          # the engine's tokens up to and including its last tie: the reference continues from there
        while True:
            ended = bool(done) and (done[-1] in stops or len(done) >= new)
            want = done + ([] if ended else target_generate(target, list(p) + done, new - len(done),
                                                             stop_token_ids=eos))
            if got == want:
                break
            pos, note = first_difference(got, want), ""
            if pos < min(len(got), len(want)):
                g, w = got[pos], want[pos]
                with torch.no_grad():
                    logits = target(torch.tensor([list(p) + got[:pos]], device=dev)).logits[0, -1].float().cpu()
                lg, lw = float(logits[g]), float(logits[w])
                step = dtype_step(dtype, lw)
                mine = sum(tie["prompt"] == i for tie in ties)
                if lw - lg <= TIE_STEPS * step and mine < MAX_TIES:
                    ties.append({"prompt": i, "position": pos, "engine_token": g, "target_token": w,
                                 "engine_logit": lg, "target_logit": lw, "dtype_step": step})
                    done = got[:pos + 1]
                    continue
                note = (f" (the target's logits there: {w} {lw:.4f}, {g} {lg:.4f}, {(lw - lg) / step:.1f} "
                        f"{dtype or 'float32'} steps apart" + (f"; {mine} ties already" if mine else "") + ")")
            raise VerifyError(difference_line(i, p, got, want) + note)
    return ties


def first_difference(got, want) -> int:
    """The first position where two outputs differ (the shorter one's length where one is a prefix of the other)."""
    return next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def difference_line(i: int, prompt, got, want) -> str:
    pos = first_difference(got, want)
    g = got[pos] if pos < len(got) else "(end)"
    w = want[pos] if pos < len(want) else "(end)"
    head = ",".join(map(str, prompt[:8])) + ("..." if len(prompt) > 8 else "")
    return (f"verify failed: prompt {i} ({head}): output token {pos} is {g} from the engine, {w} from the target's "
            f"own greedy decoding (transformers); the engine is not lossless, nothing was written")


def compare(engine_outs, ref_outs, prompts) -> None:
    for i, (got, want, p) in enumerate(zip(engine_outs, ref_outs, prompts)):
        if got != want:
            raise VerifyError(difference_line(i, p, got, want))
