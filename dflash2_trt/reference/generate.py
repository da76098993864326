"""What ``dflash2-trt generate`` does: load a drafter + target pair, run the reference
speculative loop on a prompt, and report the output and the acceptance statistics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from ..errors import ConfigError, DFlash2Error

__all__ = ["check_positions", "parse_prompt_ids", "position_limit", "run_generate", "render_generation"]

from ..tokenizer import chat_label, chat_report, encode_text, find_tokenizer, refuse_chat_without_text


_ID = re.compile(r"[0-9]+", re.ASCII)
SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed takes less than 2**64; negatives wrap around


def parse_prompt_ids(text: str, vocab_size: int | None = None) -> list[int]:
    """``"1,2,3"`` -> ``[1, 2, 3]``, with a clear error for anything else.

    Strictly comma-separated base-10 non-negative integers, whitespace around an item allowed:
    Python's ``int()`` would also take ``1_0`` (10), ``+1`` or non-ASCII digits, and skipping empty
    items turned ``1,,2`` into ``[1, 2]`` — silently a different prompt.
    """
    if not text.strip():
        raise ConfigError("no token ids given", field="--prompt-ids")
    items = [t.strip() for t in text.split(",")]
    bad_items = [t for t in items if not _ID.fullmatch(t)]
    if bad_items:
        raise ConfigError(f"expected comma-separated non-negative base-10 integers, got {text!r} "
                          f"(bad item {bad_items[0]!r})", field="--prompt-ids")
    ids = [int(t) for t in items]
    bad = [i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)]
    if bad:
        raise ConfigError(f"token ids {bad} outside the vocabulary [0, {vocab_size})", field="--prompt-ids")
    return ids


def check_positions(prompt_len: int, max_new_tokens: int, limit: int, *, limit_source, field: str,
                    prompt_field: str, source=None) -> None:
    """Refuse a prompt, or prompt + ``max_new_tokens``, longer than the models' positions.

    Nothing would crash otherwise: RoPE extrapolates past max_position_embeddings and the output
    quietly degrades (and ``--max-new-tokens 10**9`` just runs until killed). The last verification
    block may reach up to ``block_size - 2`` positions further; the target is causal, so those
    positions only score tokens past the limit, which are cut, and the output is unaffected.
    """
    if prompt_len > limit:
        raise ConfigError(f"the prompt has {prompt_len} tokens, more than max_position_embeddings {limit} "
                          f"({limit_source})", source=source, field=prompt_field)
    if prompt_len + max_new_tokens > limit:
        raise ConfigError(f"prompt ({prompt_len} tokens) + {max_new_tokens} new tokens = "
                          f"{prompt_len + max_new_tokens} positions exceeds max_position_embeddings {limit} "
                          f"({limit_source}); at most {limit - prompt_len} new tokens fit", source=source,
                          field=field)


def position_limit(tcfg, dcfg) -> tuple[int, str]:
    """The positions a drafter + target pair can use, and which config sets the limit."""
    if dcfg is not None and dcfg.max_position_embeddings < tcfg.max_position_embeddings:
        return dcfg.max_position_embeddings, f"drafter {dcfg.source}"
    return tcfg.max_position_embeddings, f"target {tcfg.source}"


def run_generate(drafter_dir: str | Path, target_dir: str | Path, *, prompt_ids: str | None = None,
                 prompt: str | None = None, temperature: float = 0.0, selector: str | None = None,
                 max_new_tokens: int = 64, seed: int = 0, block_size: int | None = None,
                 top_k: int | None = None, stop_token_ids: Sequence[int] | None = None,
                 device: str = "cpu", chat=None) -> dict:
    """Run the reference speculative loop; returns a JSON-ready report. ``chat``: ``--prompt`` through the target's
    chat template first (:class:`~dflash2_trt.tokenizer.ChatFormat`)."""
    import torch

    from ..loading import validate_pair
    from .loop import load_pair, speculative_generate

    if (prompt_ids is None) == (prompt is None):
        raise DFlash2Error("give exactly one of --prompt-ids or --prompt")
    refuse_chat_without_text(chat, prompt is not None, "the prompt is token ids (--prompt-ids)")
    from ..sampling import GREEDY_BELOW, effective_temperature

    temperature = effective_temperature(temperature, "--temperature")   # NaN/inf/negative refused; < 1e-5: greedy
    selector = selector or ("sample" if temperature > 0 else "greedy")
    if selector == "sample" and temperature <= 0:
        raise ConfigError(f"selector 'sample' needs --temperature >= {GREEDY_BELOW:g} (smaller ones decode "
                          f"greedily)", field="--selector")
    if max_new_tokens < 1:
        raise ConfigError(f"must be >= 1, got {max_new_tokens}", field="--max-new-tokens")
    if not 0 <= seed <= SEED_MAX:  # torch raised a bare overflow traceback
        raise ConfigError(f"must be in [0, 2**63-1], got {seed}", field="--seed")
    target_dir, drafter_dir = Path(target_dir), Path(drafter_dir)
    # configs, headers, inventories, values, pairing: before the tokenizer or transformers sees a file
    checked = validate_pair(drafter_dir, target_dir)
    tcfg = checked.target
    if top_k is not None and not 1 <= top_k <= tcfg.vocab_size:
        raise ConfigError(f"must be in [1, vocab size {tcfg.vocab_size}], got {top_k}", field="--top-k")
    tok = None
    if prompt is not None:
        tok = find_tokenizer(target_dir, strict=True)   # files that do not load: said as such, not "none found"
        if tok is None:
            raise DFlash2Error(f"{target_dir}: no tokenizer found for --prompt text; pass token ids "
                               "with --prompt-ids 1,2,3 instead")
        ids = encode_text(tok, prompt, field="--prompt", chat=chat)
        if not ids:
            raise ConfigError("the prompt encodes to no tokens", field="--prompt")
    else:
        ids = parse_prompt_ids(prompt_ids, tcfg.vocab_size)
    limit, limit_source = position_limit(tcfg, checked.drafter)
    check_positions(len(ids), max_new_tokens, limit, limit_source=limit_source, field="--max-new-tokens",
                    prompt_field="--prompt" if prompt is not None else "--prompt-ids")
    torch.manual_seed(seed)
    target, drafter = load_pair(target_dir, drafter_dir, block_size=block_size, device=device, validated=checked)
    stops = tcfg.eos_token_ids if stop_token_ids is None else tuple(stop_token_ids)
    res = speculative_generate(target, drafter, ids, max_new_tokens=max_new_tokens,
                               selector=selector, temperature=temperature, top_k=top_k,
                               stop_token_ids=stops, seed=seed)
    out = res.to_dict()
    out.update(drafter_dir=str(drafter_dir), target_dir=str(target_dir), seed=seed,
               stop_token_ids=list(stops), target_family=tcfg.family)
    out.update(chat_report(chat))
    if tok is None and prompt is None:
        tok = find_tokenizer(target_dir)
    if tok is not None:
        out["output_text"] = tok.decode(res.output_ids)
    return out


def render_generation(r: dict) -> str:
    lines = [
        f"target: {r['target_dir']} ({r['target_family']})",
        f"drafter: {r['drafter_dir']}   block_size {r['block_size']}   selector {r['selector']}   "
        f"temperature {r['temperature']}   seed {r['seed']}",
        f"prompt ids: {r['prompt_ids']}",
        f"output ids: {r['output_ids']}",
    ]
    if r.get("chat_template"):
        lines.insert(2, f"prompt: the --prompt text as a user message through the target's "
                        f"{chat_label(r['chat_template'])}")
    if "output_text" in r:
        lines.append(f"output text: {r['output_text']!r}")
    hist = ", ".join(f"{k}: {v}" for k, v in r["acceptance_histogram"].items())
    lines += [
        f"stop reason: {r['stop_reason']}   new tokens: {len(r['output_ids'])}",
        f"acceptance length: mean {r['mean_acceptance_length']:.3f} over {len(r['acceptance_lengths'])} "
        f"verification passes   histogram {{{hist}}}",
        f"target passes: {r['target_passes']} (prefill + verification)   replays: {r['replay_passes']}   "
        f"tokens per target pass: {r['tokens_per_target_pass']:.3f}",
    ]
    return "\n".join(lines)
