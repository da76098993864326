"""Lossless speculative decoding with a DFlash2 drafter (batch size 1, plain PyTorch).

One cycle, with ``start`` = absolute position of the anchor (the last token the target emitted,
not yet run through the target)::

    drafter(new committed context taps, [anchor, MASK x (bs-1)]) -> hidden, unary logits
    selector (greedy | viterbi | sample | none)                      -> d_1..d_L, proposal q
    target([anchor, d_1..d_L])  (one pass, cache extended by bs)     -> logits, hidden states
    verify (greedy prefix / rejection sampling)                      -> n accepted + next token
    commit: anchor, d_1..d_n enter the target cache and the drafter context; next token = new anchor

Target cache after verification: attention-only targets are cropped to the committed length
(``DynamicCache.crop``). Hybrid targets (Qwen3.5 Gated DeltaNet layers) keep a recurrent and a
conv state that cannot be cropped: the cache is snapshot before verification and, unless every
draft was accepted, restored and the committed tokens are replayed (one extra target pass,
counted in ``replay_passes``). Forgetting this is silent: the recurrent state would then include
rejected tokens and greedy output would drift from the target's own. (transformers 5.25 can record a
hybrid cache's last recurrent states and crop it, ``activate_past_recording(recurrent_states_to_keep=bs)``;
5.24 cannot, so the snapshot stays the one path while the pins include 5.24.)

All randomness is drawn from one ``torch.Generator(seed)`` as uniforms, so a run is reproducible.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import torch

from .drafter import DFlash2Drafter, extract_taps
from .selector import MODES
from .verify import accept_greedy, accept_sampling, sample_from_probs, scatter_proposal, target_probs
from ..errors import CheckpointError, ConfigError, NumericsError
from ..transformers_support import require_supported_transformers

__all__ = ["GenerationResult", "speculative_generate", "target_generate", "load_target",
           "is_hybrid", "load_pair", "check_finite"]


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]                       # newly generated tokens (stop token included)
    acceptance_lengths: list[int] = field(default_factory=list)   # tokens accepted per verify pass (pre-cut)
    target_passes: int = 0                      # prefill + verification passes
    replay_passes: int = 0                      # hybrid-target state replays (not verification)
    drafter_passes: int = 0
    stop_reason: str = "max_new_tokens"
    selector: str = "greedy"
    temperature: float = 0.0
    block_size: int = 0

    @property
    def mean_acceptance_length(self) -> float:
        a = self.acceptance_lengths
        return sum(a) / len(a) if a else 0.0

    @property
    def histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(self.acceptance_lengths).items()))

    @property
    def tokens_per_target_pass(self) -> float:
        """Generated tokens per target forward pass (prefill, verification and replays)."""
        passes = self.target_passes + self.replay_passes
        return len(self.output_ids) / passes if passes else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mean_acceptance_length"] = self.mean_acceptance_length
        d["acceptance_histogram"] = {str(k): v for k, v in self.histogram.items()}
        d["tokens_per_target_pass"] = self.tokens_per_target_pass
        return d


def is_hybrid(target) -> bool:
    cfg = getattr(target.config, "text_config", target.config)
    return "linear_attention" in (getattr(cfg, "layer_types", None) or ())


def load_target(directory: str | Path, *, dtype: torch.dtype | None = None, device="cpu",
                check_values: bool | str = "auto", validated: bool = False):
    """The target's causal LM through transformers (text model + lm_head; vision towers of
    multimodal wrappers are not loaded).

    The directory first goes through :func:`dflash2_trt.loading.validate_target` (config, headers,
    inventory against transformers' meta-device model, NaN/Inf per ``check_values``) unless the
    caller already did that (``validated=True``): transformers would fill a missing tensor with
    random values without a word. Anything transformers still refuses is a one-line error.
    """
    require_supported_transformers("the target's reference decoding")
    import transformers

    if not validated:
        from ..loading import validate_target

        validate_target(directory, check_values=check_values)
    kw = dict(dtype=dtype or "auto", output_loading_info=True)
    try:
        try:
            model, info = transformers.AutoModelForCausalLM.from_pretrained(str(directory), **kw)
        except ValueError as exc:
            # Muse Glimmer is only registered as an image-text-to-text model (its wrapper).
            if "Unrecognized configuration class" not in str(exc):
                raise
            model, info = transformers.AutoModelForImageTextToText.from_pretrained(str(directory), **kw)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError, ImportError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CheckpointError(f"transformers could not load the target: {type(exc).__name__}: {first}",
                              file=directory) from exc
    missing = sorted(info.get("missing_keys") or ())
    if missing:   # the inventory should have caught these: never run with random weights
        raise CheckpointError(f"transformers found {len(missing)} tensor(s) missing and would use random "
                              f"values, e.g. {missing[:3]}", file=directory, tensor=missing[0])
    return model.to(device).eval()


def load_pair(target_dir, drafter_dir, *, block_size: int | None = None, dtype=None, device="cpu",
              check_values: bool | str = "auto", validated=None):
    """Load the target and the drafter, after :func:`dflash2_trt.loading.validate_pair` (configs,
    headers, inventories, values, pairing; the same checks and messages as ``inspect``).
    ``validated``: the :class:`~dflash2_trt.loading.ValidatedPair` when the caller already has it."""
    from ..loading import validate_pair

    if validated is None:
        validated = validate_pair(drafter_dir, target_dir, check_values=check_values)
    check_block_fits_target(validated.drafter, validated.target, block_size)
    target = load_target(target_dir, dtype=dtype, device=device, validated=True)
    drafter = DFlash2Drafter.from_pretrained(drafter_dir, block_size=block_size, dtype=dtype, device=device,
                                             target_hidden_size=validated.target.hidden_size)
    return target, drafter


def check_block_fits_target(dcfg, tcfg, block_size: int | None = None) -> None:
    """The block (the drafter's, or the ``--block-size`` override) must fit in the TARGET's positions too (the
    drafter's config checks its own): the target verifies the block at the block's positions. The drafter's own block
    is also a pairing problem (``config.pairing``), which ``validate_pair`` raises first; this says it for the
    override, which pairing does not see, in the option's name."""
    from ..config.drafter import max_block_size

    bs = dcfg.block_size if block_size is None else block_size
    limit = max_block_size(tcfg.max_position_embeddings)
    if bs > limit:
        where = {"field": "--block-size"} if block_size is not None else {"source": dcfg.source,
                                                                          "field": "dflash_config.block_size"}
        raise ConfigError(f"must be at most {limit} for this target, got {bs}: a block of {bs} positions after at "
                          f"least one prompt token does not fit in the target's max_position_embeddings="
                          f"{tcfg.max_position_embeddings} ({tcfg.source})", **where)


def check_finite(t: torch.Tensor, what: str) -> None:
    """NaN/Inf in logits or hidden states is an error, never a silently wrong token (argmax of
    NaN logits is token 0; sampling from them is garbage)."""
    if not bool(torch.isfinite(t).all()):
        n_nan, n_inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
        raise NumericsError(
            f"{what} are not finite ({n_nan} NaN, {n_inf} Inf of {t.numel()}): the weights passed the "
            "NaN/Inf checks, so the forward pass overflowed (or an unscanned weight is bad: "
            "`dflash2-trt inspect --check-values` scans them all)")


def _new_cache(target, record: bool = True):
    from transformers import DynamicCache

    cache = DynamicCache(config=target.config)
    if record and not is_hybrid(target) and hasattr(cache, "activate_past_recording"):
        # Sliding-window layers otherwise drop keys beyond the window as soon as they are written
        # and then refuse to crop; recording keeps them until the crop after verification.
        # (Hybrid targets are restored from a snapshot instead, never cropped. Never record on
        # their cache: transformers 5.25's activate_past_recording() would make the Gated DeltaNet
        # layers record too, with recurrent_states_to_keep None, which their multi-token forward
        # cannot take: min(None, seq_len).)
        cache.activate_past_recording()
    return cache


def _crop_to(cache, length: int) -> None:
    """Drop the cached tokens beyond ``length``. A negative argument means "remove that many"
    in every transformers 4.x/5.x (positive values changed meaning across versions)."""
    remove = cache.get_seq_length() - length
    if remove < 0:
        raise RuntimeError(f"target cache holds {cache.get_seq_length()} tokens, fewer than {length}")
    cache.crop(-remove)   # crop(0) also trims recorded sliding-window states back to the window
    if cache.get_seq_length() != length:
        raise RuntimeError(f"target cache holds {cache.get_seq_length()} tokens after crop, expected {length}")


def _first_token(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
    if temperature <= 0:
        return int(torch.argmax(logits))
    p = target_probs(logits, temperature)
    return int(sample_from_probs(p[None], torch.rand(1, generator=gen))[0])


def _emit(out: list[int], tokens: Iterable[int], max_new: int, stops: set[int]) -> str | None:
    for t in tokens:
        out.append(int(t))
        if int(t) in stops:
            return "stop_token"
        if len(out) >= max_new:
            return "max_new_tokens"
    return None


@torch.no_grad()
def target_generate(target, prompt_ids: Sequence[int], max_new_tokens: int, *,
                    temperature: float = 0.0, stop_token_ids: Iterable[int] = (),
                    seed: int = 0) -> list[int]:
    """The target's own autoregressive decoding, one token per pass (the losslessness oracle)."""
    dev = next(target.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    cache = _new_cache(target, record=False)   # plain decoding never crops
    out: list[int] = []
    stops = set(stop_token_ids)
    logits = target(torch.tensor([list(prompt_ids)], device=dev), cache=cache, use_cache=True).logits
    while True:
        check_finite(logits[0, -1], f"target logits (position {len(prompt_ids) + len(out) - 1})")
        tok = _first_token(logits[0, -1].cpu(), temperature, gen)
        if _emit(out, [tok], max_new_tokens, stops):
            return out
        logits = target(torch.tensor([[tok]], device=dev), cache=cache, use_cache=True).logits


@torch.no_grad()
def speculative_generate(target, drafter: DFlash2Drafter, prompt_ids: Sequence[int], *,
                         max_new_tokens: int = 64, selector: str = "greedy",
                         temperature: float = 0.0, top_k: int | None = None,
                         stop_token_ids: Iterable[int] = (), seed: int = 0,
                         draft_hook=None) -> GenerationResult:
    """Speculative decoding, token-identical to :func:`target_generate` when greedy
    (temperature 0) and distributed like it when sampling (temperature > 0).

    ``draft_hook(start, tokens) -> tokens`` (greedy only) may replace the drafted tokens
    ``[1, L]`` of the block anchored at ``start``; tests use it to force chosen acceptance
    patterns through the commit / crop / replay paths.
    """
    if selector not in MODES:
        raise ValueError(f"unknown selector {selector!r}; expected one of {', '.join(MODES)}")
    if selector == "sample" and temperature <= 0:
        raise ValueError("selector 'sample' needs temperature > 0 (use greedy or viterbi at T = 0)")
    if draft_hook is not None and temperature > 0:
        raise ValueError("draft_hook is only supported for greedy decoding (its q would be wrong)")
    # Note: greedy / viterbi / none at temperature > 0 propose deterministically (one-hot q);
    # rejection sampling stays lossless with such a proposal.
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if len(prompt_ids) < 1:
        raise ValueError("the prompt must hold at least one token")
    cfg = drafter.cfg
    bs = cfg.block_size
    L = bs - 1
    dev = next(target.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    embed = target.get_input_embeddings()
    lm_head = target.get_output_embeddings()
    hybrid = is_hybrid(target)
    stops = set(stop_token_ids)
    res = GenerationResult(list(map(int, prompt_ids)), [], selector=selector,
                           temperature=float(temperature), block_size=bs)

    # ---- prefill --------------------------------------------------------------------------
    cache = _new_cache(target)
    out = target(torch.tensor([res.prompt_ids], device=dev), cache=cache, use_cache=True,
                 output_hidden_states=True)
    res.target_passes += 1
    check_finite(out.logits[0, -1], "target logits of the prefill pass")
    new_taps = extract_taps(out.hidden_states, cfg.target_layer_ids)
    anchor = _first_token(out.logits[0, -1].cpu(), temperature, gen)
    start = len(res.prompt_ids)
    dcache = drafter.new_cache()
    reason = _emit(res.output_ids, [anchor], max_new_tokens, stops)

    while reason is None:
        # ---- draft ------------------------------------------------------------------------
        block = torch.full((1, bs), cfg.mask_token_id, dtype=torch.long, device=dev)
        block[0, 0] = anchor
        emb = drafter.embed_block(block, embed).to(next(drafter.parameters()).dtype)
        hidden = drafter(emb, new_taps.to(emb.dtype), start, dcache)[:, 1:]
        res.drafter_passes += 1
        unary = drafter.unary_logits(hidden.to(lm_head.weight.dtype), lm_head)
        check_finite(unary, f"drafter logits (block at position {start})")
        uniforms = torch.rand(1, L, generator=gen).to(dev) if temperature > 0 else None
        sel = drafter.candidate_selector(
            hidden, unary, block[:, 0], selector, top_k=top_k,
            temperature=temperature if temperature > 0 else None, uniforms=uniforms)
        draft = sel.tokens                                              # [1, L]
        if draft_hook is not None:
            draft = draft_hook(start, draft.clone()).to(device=dev, dtype=torch.long)
        block[0, 1:] = draft[0]

        # ---- verify -----------------------------------------------------------------------
        snapshot = copy.deepcopy(cache) if hybrid else None
        vout = target(block, cache=cache, use_cache=True, output_hidden_states=True)
        res.target_passes += 1
        logits = vout.logits.float()                                    # [1, bs, V]
        check_finite(logits, f"target logits of the verification pass at position {start}")
        if temperature <= 0:
            n_acc, nxt = accept_greedy(draft, logits)
        else:
            q_full = scatter_proposal(sel.cand_ids, sel.q, logits.shape[-1])
            p = target_probs(logits, temperature)
            n_acc, nxt = accept_sampling(draft, q_full, p,
                                         torch.rand(1, L, generator=gen).to(dev),
                                         torch.rand(1, generator=gen).to(dev))
        n = int(n_acc[0])
        res.acceptance_lengths.append(n + 1)
        committed = n + 1                       # anchor + n accepted drafts

        # ---- commit -----------------------------------------------------------------------
        if hybrid:
            if n < L:
                cache = snapshot
                target(block[:, :committed], cache=cache, use_cache=True)
                res.replay_passes += 1
        else:
            _crop_to(cache, start + committed)
        new_taps = extract_taps(vout.hidden_states, cfg.target_layer_ids)[:, :committed]
        start += committed
        anchor = int(nxt[0])
        reason = _emit(res.output_ids, [int(t) for t in draft[0, :n]] + [anchor],
                       max_new_tokens, stops)
    res.stop_reason = reason
    return res
