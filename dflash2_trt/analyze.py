"""``dflash2-trt analyze``: how well a drafter knows its target's continuations, and how much of
that a selector turns into accepted tokens.

Data. For every prompt the target decodes its own greedy continuation (``max_new_tokens``).
Every position ``s`` of that continuation with ``block_size - 1`` further tokens after it becomes
an *anchor*: exactly the state of a speculative cycle whose last emitted token is ``seq[s]``. The
drafter sees the target's taps of ``seq[:s]`` (its incremental KV cache grows one position per
anchor) and the block ``[seq[s], MASK...]``; the labels of draft position ``l = 1..L`` are
``seq[s + l]``, the target's own greedy tokens. Per anchor the top-``max(k)`` candidates (sorted,
ties to the lower id, so the top-k of every smaller k is a prefix) and the selector's projected
hidden states are kept; every method below is computed from the same records.

Methods. Each marks, per anchor and draft position, a *hit*:

* ``top1``         -- the position's own top candidate equals the label (plain DFlash).
* ``greedy@k``     -- the selector's left-to-right greedy walk over the top-k candidates.
* ``viterbi@k``    -- the selector's global max-plus walk over the top-k candidates.
* ``oracle@k``     -- the label is among the top-k candidates (a perfect chooser).

The accepted prefix of an anchor is its number of leading hits ``n``; a greedy verification pass
then emits ``n + 1`` tokens (the target's own token included), so the *direct* acceptance length
is ``1 + mean(n)``. The *conditional recall* of position ``l`` is
``#(n >= l) / #(n >= l - 1)`` (the hit rate at ``l`` among anchors whose earlier positions were
all hits); the *implied* acceptance is ``1 + sum_l prod_{j <= l} r_j``, the article's way of
turning a recall table into acceptance. On the same data the product telescopes to
``#(n >= l) / N``, so implied == direct (tested).

Orderings the definitions force (and the tests check), per anchor and hence on average:

* ``oracle@k >= greedy@k, viterbi@k, top1`` -- any selector picks among the top-k, so a selector
  hit implies an oracle hit at every position.
* ``oracle@k`` is non-decreasing in ``k``; ``oracle@1 == top1``; unconditional recall@k per
  position is non-decreasing in ``k``.
* For ``greedy@k`` walking with the true prefix, the conditional recall at ``l`` equals the hit
  rate of the selector row of the TRUE predecessor (teacher forcing): a left-to-right walk that
  has been right so far reads exactly that row.

NOT forced (reported, never assumed): ``greedy@k`` vs ``top1``; ``viterbi@k`` vs ``greedy@k``
(Viterbi maximises the total path score, not the accepted prefix); conditional recall at a
given position vs ``k``; ``greedy@k`` or ``viterbi@k`` vs ``k``.

Measured. Real speculative decoding (:func:`dflash2_trt.reference.loop.speculative_generate`,
temperature 0) per selector mode and k on the same prompts: mean tokens accepted per
verification pass, and a lossless check against the target's own greedy output. Implied and
measured numbers differ because the loop only visits the anchors its own acceptances lead to;
for each visited anchor the loop's acceptance equals the analysis' per-anchor ``n + 1`` (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from .errors import ConfigError, DFlash2Error
from .textfiles import json_loads, read_utf8
from .tokenizer import chat_label, chat_report

__all__ = [
    "AnchorData",
    "collect_anchors",
    "method_hits",
    "accepted_prefix",
    "recall_table",
    "implied_acceptance",
    "direct_acceptance",
    "measure_acceptance",
    "load_prompts",
    "default_prompts",
    "analyze_pair",
    "render",
    "parse_top_k",
]

DEFAULT_TOP_K = (4, 8, 16)


# ---------------------------------------------------------------------------------------------
# data collection
# ---------------------------------------------------------------------------------------------
@dataclass
class AnchorData:
    """Per-anchor records (N anchors, L draft positions, K = max top-k)."""

    anchors: torch.Tensor      # [N] int64, the last verified token of each anchor
    labels: torch.Tensor       # [N, L] int64, the target's greedy tokens after the anchor
    cand_ids: torch.Tensor     # [N, L, K] int64, sorted by descending unary score
    cand_scores: torch.Tensor  # [N, L, K] fp32 transformed unary logits
    proj_hidden: torch.Tensor  # [N, L, R] fp32 selector hidden projection
    prompt_index: torch.Tensor  # [N] int64, which prompt the anchor came from
    position: torch.Tensor     # [N] int64, absolute position of the anchor in its sequence
    continuations: list[list[int]]   # the target's greedy continuation per prompt

    @property
    def num_anchors(self) -> int:
        return int(self.anchors.shape[0])

    @property
    def draft_len(self) -> int:
        return int(self.labels.shape[1])

    @property
    def max_k(self) -> int:
        return int(self.cand_ids.shape[2])


@torch.no_grad()
def collect_anchors(target, drafter, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                    max_k: int) -> AnchorData:
    """Run the drafter at every anchor of the target's greedy continuations (see module doc)."""
    from .reference.drafter import extract_taps
    from .reference.loop import check_finite, target_generate
    from .reference.selector import topk_candidates

    cfg = drafter.cfg
    L = cfg.block_size - 1
    if max_new_tokens <= L:
        raise ConfigError(f"must exceed the {L} draft positions of block size {cfg.block_size}, got {max_new_tokens} "
                          f"(each anchor needs a full block of labels)", field="--max-new-tokens")
    if max_k > cfg.vocab_size:
        raise ConfigError(f"{max_k} exceeds the vocabulary ({cfg.vocab_size})", field="--top-k")
    dev = next(target.parameters()).device
    embed = target.get_input_embeddings()
    lm_head = target.get_output_embeddings()
    dt = next(drafter.parameters()).dtype
    sel = drafter.candidate_selector
    recs = {k: [] for k in ("anchors", "labels", "ids", "scores", "proj", "pi", "pos")}
    conts = []
    for pi, prompt in enumerate(prompts):
        cont = target_generate(target, prompt, max_new_tokens)
        conts.append(cont)
        seq = list(map(int, prompt)) + cont
        out = target(torch.tensor([seq], device=dev), output_hidden_states=True)
        taps = extract_taps(out.hidden_states, cfg.target_layer_ids).to(dt)
        cache = drafter.new_cache()
        for s in range(len(prompt), len(seq) - L):
            block = torch.full((1, cfg.block_size), cfg.mask_token_id, dtype=torch.long, device=dev)
            block[0, 0] = seq[s]
            emb = drafter.embed_block(block, embed).to(dt)
            hidden = drafter(emb, taps[:, cache.length:s], s, cache)[:, 1:]
            unary = drafter.unary_logits(hidden.to(lm_head.weight.dtype), lm_head)
            check_finite(unary, f"drafter logits (prompt {pi}, anchor at position {s})")
            scores, ids = topk_candidates(unary, max_k)
            recs["anchors"].append(seq[s])
            recs["labels"].append(seq[s + 1:s + 1 + L])
            recs["ids"].append(ids[0].cpu())
            recs["scores"].append(scores[0].cpu())
            recs["proj"].append(sel.hidden_projection(hidden)[0].float().cpu())
            recs["pi"].append(pi)
            recs["pos"].append(s)
    if not recs["anchors"]:
        raise DFlash2Error("no anchors: give at least one prompt")
    return AnchorData(
        anchors=torch.tensor(recs["anchors"], dtype=torch.long),
        labels=torch.tensor(recs["labels"], dtype=torch.long),
        cand_ids=torch.stack(recs["ids"]),
        cand_scores=torch.stack(recs["scores"]),
        proj_hidden=torch.stack(recs["proj"]),
        prompt_index=torch.tensor(recs["pi"], dtype=torch.long),
        position=torch.tensor(recs["pos"], dtype=torch.long),
        continuations=conts,
    )


# ---------------------------------------------------------------------------------------------
# hits, recall, acceptance
# ---------------------------------------------------------------------------------------------
def method_hits(data: AnchorData, method: str, k: int, selector=None) -> torch.Tensor:
    """Hits ``[N, L]`` (bool) of ``method`` in {top1, greedy, viterbi, oracle} at width ``k``.

    ``selector`` (the drafter's ``candidate_selector``) is needed for greedy / viterbi."""
    from .reference.selector import pairwise_lattice, walk_greedy, walk_viterbi

    if not 1 <= k <= data.max_k:
        raise DFlash2Error(f"k={k} outside the collected candidates (1..{data.max_k})")
    ids = data.cand_ids[..., :k]
    if method == "top1":
        return ids[..., 0] == data.labels
    if method == "oracle":
        return (ids == data.labels[..., None]).any(-1)
    if method in ("greedy", "viterbi"):
        if selector is None:
            raise ValueError(f"method {method!r} needs the drafter's candidate_selector")
        lat = pairwise_lattice(ids, data.cand_scores[..., :k], data.proj_hidden, data.anchors,
                               selector.predecessor_codebook.detach().cpu(),
                               selector.successor_codebook.detach().cpu())
        walk = walk_greedy if method == "greedy" else walk_viterbi
        _, tokens, _ = walk(lat, ids)
        return tokens == data.labels
    raise ValueError(f"unknown method {method!r}")


def accepted_prefix(hits: torch.Tensor) -> torch.Tensor:
    """Leading hits per anchor ``[N]`` (drafts a greedy verification would accept)."""
    return hits.long().cumprod(dim=-1).sum(dim=-1)


def recall_table(hits: torch.Tensor) -> dict[str, list]:
    """Per draft position l = 1..L: conditional recall ``#(n >= l) / #(n >= l-1)`` (None where
    no anchor survived to l-1), the counts behind it, and the unconditional hit rate."""
    n = accepted_prefix(hits)
    total = hits.shape[0]
    cond, reached, survived = [], [], []
    for l in range(1, hits.shape[1] + 1):
        den = int((n >= l - 1).sum())
        num = int((n >= l).sum())
        reached.append(den)
        survived.append(num)
        cond.append(num / den if den else None)
    uncond = hits.double().mean(0).tolist() if total else [None] * hits.shape[1]
    return {"conditional": cond, "reached": reached, "hits": survived, "unconditional": uncond}


def implied_acceptance(conditional: Sequence[float | None]) -> float:
    """``1 + sum_l prod_{j <= l} r_j`` from a conditional recall column (None = unreached = 0)."""
    total, prod = 1.0, 1.0
    for r in conditional:
        prod *= 0.0 if r is None else float(r)
        total += prod
    return total


def direct_acceptance(hits: torch.Tensor) -> float:
    """``1 + mean(leading hits)`` computed per anchor, without the recall table."""
    return 1.0 + float(accepted_prefix(hits).double().mean()) if hits.shape[0] else float("nan")


# ---------------------------------------------------------------------------------------------
# measured speculative decoding
# ---------------------------------------------------------------------------------------------
def measure_acceptance(target, drafter, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                       selector: str = "greedy", top_k: int | None = None,
                       references: Sequence[Sequence[int]] | None = None, temperature: float = 0.0,
                       seed: int = 0) -> dict:
    """Speculative decoding of every prompt: pooled mean acceptance length (tokens per
    verification pass) and tokens per target pass. At temperature 0, ``lossless`` says whether
    every output equals the target's own greedy decoding (``references``, computed when not
    given); when sampling it is None (losslessness is distributional, see tests/reference)."""
    from .reference.loop import speculative_generate, target_generate

    lengths, passes, produced = [], 0, 0
    lossless: bool | None = True if temperature <= 0 else None
    per_prompt = []
    for i, pr in enumerate(prompts):
        r = speculative_generate(target, drafter, pr, max_new_tokens=max_new_tokens, selector=selector,
                                 top_k=top_k, temperature=temperature, seed=seed + i)
        if lossless is not None:
            ref = list(references[i]) if references is not None else target_generate(target, pr, max_new_tokens)
            lossless &= r.output_ids == ref[:max_new_tokens]
        lengths += r.acceptance_lengths
        passes += r.target_passes + r.replay_passes
        produced += len(r.output_ids)
        per_prompt.append(r.acceptance_lengths)
    hist: dict[str, int] = {}
    for a in lengths:
        hist[str(a)] = hist.get(str(a), 0) + 1
    return {
        "selector": selector,
        "top_k": top_k or drafter.cfg.selector_top_k,
        "mean_acceptance_length": sum(lengths) / len(lengths) if lengths else float("nan"),
        "tokens_per_target_pass": produced / passes if passes else float("nan"),
        "cycles": len(lengths),
        "histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "temperature": float(temperature),
        "lossless": lossless,
        "per_prompt_acceptance": per_prompt,
    }


# ---------------------------------------------------------------------------------------------
# prompts
# ---------------------------------------------------------------------------------------------
def load_prompts(path: str | Path, target_dir: str | Path | None = None, chat=None) -> list[list[int]]:
    """Prompts from ``path``: a JSON list (or ``{"prompts": [...]}``) or JSON lines; each prompt is
    a list of token ids, or a string tokenized with the target directory's tokenizer (``chat``: through its chat
    template first, :class:`~dflash2_trt.tokenizer.ChatFormat`; a file of token ids only is then refused)."""
    items = load_prompt_items(path, target_dir, chat)
    from .tokenizer import refuse_chat_without_text

    refuse_chat_without_text(chat, any(text for _, text in items), f"{path} holds token-id lists only")
    return [ids for ids, _ in items]


def load_prompt_items(path: str | Path, target_dir: str | Path | None = None, chat=None) -> list[tuple[list[int], bool]]:
    """:func:`load_prompts`' prompts, each with whether it was text (and so, with ``chat``, rendered by the template):
    for a caller that keeps only some of them and must know what the kept ones are."""
    path = Path(path)
    text = read_utf8(path, what="prompts", bom=True)
    try:
        data = json_loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and not isinstance(data.get("prompts"), list):   # {"prompts": 5}: its field, said so
        got = f"got {type(data['prompts']).__name__}" if "prompts" in data else "missing from the JSON object"
        raise ConfigError(f"must be a list of prompts (token id lists or strings), {got}", source=path,
                          field="prompts")
    try:
        items = data["prompts"] if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        items = []
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                items.append(json_loads(line))
            except ValueError:
                raise ConfigError(f"line {i + 1} is not JSON (a list of token ids or a string)",
                                  source=path, field="prompts") from None
    tok = None
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if tok is None:
                tok = _tokenizer(target_dir, path)
            from .tokenizer import encode_text

            ids = encode_text(tok, item, source=path, field=f"prompts[{i}]", chat=chat)
        elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            ids = item
        else:
            raise ConfigError(f"prompt {i} must be a list of token ids or a string", source=path,
                              field=f"prompts[{i}]")
        if not ids:
            raise ConfigError(f"prompt {i} is empty", source=path, field=f"prompts[{i}]")
        out.append(([int(t) for t in ids], isinstance(item, str)))
    if not out:
        raise ConfigError("no prompts", source=path, field="prompts")
    return out


def _tokenizer(target_dir, source):
    from .tokenizer import TOKENIZER_FILES, find_tokenizer

    if target_dir is None:
        raise ConfigError("text prompts need the target's tokenizer (no target directory)", source=source)
    tok = find_tokenizer(target_dir)
    if tok is None:
        raise ConfigError(f"text prompts need a tokenizer, and {target_dir} has no usable one "
                          f"({', '.join(TOKENIZER_FILES)}); give token-id lists", source=source)
    return tok


def default_prompts(drafter_dir: str | Path, vocab_size: int, mask_token_id: int, *, n: int = 8,
                    length: int = 16, seed: int = 0) -> tuple[list[list[int]], str]:
    """The built-in prompt set: ``prompts.json`` next to the drafter (the shipped tiny pairs have
    one: held-out text of the language their target was trained on); otherwise seeded random
    token ids (acceptance on random prompts says little about real text; give --prompts)."""
    shipped = Path(drafter_dir).parent / "prompts.json"
    if shipped.is_file():
        return load_prompts(shipped), str(shipped)
    g = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < n:
        p = torch.randint(0, vocab_size, (length,), generator=g).tolist()
        out.append([t if t != mask_token_id else (t + 1) % vocab_size for t in p])
    return out, f"random token ids (seed {seed}, {n} x {length})"


# ---------------------------------------------------------------------------------------------
# the whole analysis
# ---------------------------------------------------------------------------------------------
def analyze_pair(drafter_dir: str | Path, target_dir: str | Path, *, prompts_file: str | Path | None = None,
                 block_size: int | None = None, top_k: Sequence[int] = DEFAULT_TOP_K,
                 max_new_tokens: int = 64, max_prompts: int | None = None, measure: bool = True,
                 temperature: float = 0.0, chat=None) -> dict:
    """Recall tables, implied acceptance and measured acceptance for one drafter + target. ``chat``: text prompts
    through the target's chat template (:class:`~dflash2_trt.tokenizer.ChatFormat`).

    ``temperature > 0`` adds measured runs of the ``sample`` selector at that temperature
    (``sample@k``); the implied numbers are greedy-decoding quantities and have no sampled twin."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()          # weight-loading bars would interleave with --json
    try:
        return _analyze_pair(drafter_dir, target_dir, prompts_file=prompts_file, block_size=block_size,
                             top_k=top_k, max_new_tokens=max_new_tokens, max_prompts=max_prompts,
                             measure=measure, temperature=temperature, chat=chat)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _analyze_pair(drafter_dir, target_dir, *, prompts_file, block_size, top_k, max_new_tokens, max_prompts,
                  measure, temperature, chat=None) -> dict:
    from .reference.loop import load_pair

    ks = sorted(set(int(k) for k in top_k))
    if not ks or ks[0] < 1:
        raise ConfigError(f"values must be >= 1, got {list(top_k)}", field="--top-k")
    from .sampling import GREEDY_BELOW, effective_temperature

    if effective_temperature(temperature, "--temperature") == 0 and temperature > 0:
        # the sampled runs would silently be greedy ones (dflash2_trt/sampling.py)
        raise ConfigError(f"must be 0 (no sampled runs) or >= {GREEDY_BELOW:g}, got {temperature}",
                          field="--temperature")
    if temperature > 0 and not measure:
        # it only adds measured sampling runs: with --no-measure it changed nothing, silently (a new user's review)
        raise ConfigError("applies to the measured runs, which --no-measure skips", field="--temperature")
    if chat is not None and prompts_file is None:
        raise ConfigError("puts prompt text through the chat template, but the built-in prompt set is token ids: give "
                          "--prompts with text prompts", field="--chat")
    if max_prompts is not None and max_prompts < 1:
        # a negative value would silently slice prompts off the end (prompts[:-1])
        raise ConfigError(f"must be >= 1, got {max_prompts}", field="--max-prompts")
    # configs, headers, inventories, values, pairing (inspect's checks) before transformers sees a file
    target, drafter = load_pair(target_dir, drafter_dir, block_size=block_size)
    cfg = drafter.cfg
    if ks[-1] > cfg.vocab_size:
        raise ConfigError(f"{ks[-1]} exceeds the vocabulary ({cfg.vocab_size})", field="--top-k")
    if prompts_file is not None:
        items = load_prompt_items(prompts_file, target_dir, chat)[:max_prompts]
        from .tokenizer import refuse_chat_without_text

        refuse_chat_without_text(chat, any(text for _, text in items), f"the prompts used from {prompts_file} are "
                                 f"token-id lists only" + (" (--max-prompts)" if max_prompts is not None else ""))
        prompts, prompt_source = [ids for ids, _ in items], str(prompts_file)
    else:
        prompts, prompt_source = default_prompts(drafter_dir, cfg.vocab_size, cfg.mask_token_id)
    if max_prompts is not None:
        prompts = prompts[:max_prompts]
    from .config import TargetConfig
    from .reference.generate import check_positions, position_limit

    limit, limit_source = position_limit(TargetConfig.from_hugging_face(Path(target_dir) / "config.json"), cfg)
    for i, pr in enumerate(prompts):
        bad = [t for t in pr if not 0 <= t < cfg.vocab_size]
        if bad:   # the target's embedding would raise a bare IndexError
            raise ConfigError(f"token ids {bad[:5]} outside the vocabulary [0, {cfg.vocab_size})",
                              source=prompt_source, field=f"prompts[{i}]")
        check_positions(len(pr), max_new_tokens, limit, limit_source=limit_source, source=prompt_source,
                        field=f"prompts[{i}] + --max-new-tokens", prompt_field=f"prompts[{i}]")
    data = collect_anchors(target, drafter, prompts, max_new_tokens=max_new_tokens, max_k=ks[-1])
    sel = drafter.candidate_selector

    methods: dict[str, torch.Tensor] = {"top1": method_hits(data, "top1", 1)}
    for k in ks:
        for m in ("greedy", "viterbi", "oracle"):
            methods[f"{m}@{k}"] = method_hits(data, m, k, sel)
    tables = {name: recall_table(h) for name, h in methods.items()}
    implied = {name: implied_acceptance(t["conditional"]) for name, t in tables.items()}
    report = {
        "drafter_dir": str(Path(drafter_dir).resolve()),
        "target_dir": str(Path(target_dir).resolve()),
        "block_size": cfg.block_size,
        "draft_positions": cfg.block_size - 1,
        "top_k": ks,
        "selector_top_k": cfg.selector_top_k,
        "prompts": {"source": prompt_source, "count": len(prompts), "max_new_tokens": max_new_tokens,
                    **chat_report(chat)},
        "anchors": data.num_anchors,
        "recall": {name: t["conditional"] for name, t in tables.items()},
        "recall_unconditional": {name: t["unconditional"] for name, t in tables.items()},
        "recall_counts": {name: {"reached": t["reached"], "hits": t["hits"]} for name, t in tables.items()},
        "implied_acceptance": implied,
        "selector_gain": {f"greedy@{k}": implied[f"greedy@{k}"] - implied["top1"] for k in ks}
        | {f"viterbi@{k}": implied[f"viterbi@{k}"] - implied["top1"] for k in ks},
        "headroom_captured": {
            f"greedy@{k}": _share(implied[f"greedy@{k}"], implied["top1"], implied[f"oracle@{k}"])
            for k in ks},
    }
    if measure:
        refs = [c for c in data.continuations]
        runs = {"none": measure_acceptance(target, drafter, prompts, max_new_tokens=max_new_tokens,
                                           selector="none", references=refs)}
        for k in ks:
            for m in ("greedy", "viterbi"):
                runs[f"{m}@{k}"] = measure_acceptance(target, drafter, prompts, max_new_tokens=max_new_tokens,
                                                      selector=m, top_k=k, references=refs)
            if temperature > 0:
                runs[f"sample@{k}"] = measure_acceptance(target, drafter, prompts, max_new_tokens=max_new_tokens,
                                                         selector="sample", top_k=k, temperature=temperature)
        report["measured"] = {name: {key: r[key] for key in ("mean_acceptance_length", "tokens_per_target_pass",
                                                             "cycles", "histogram", "temperature", "lossless")}
                              for name, r in runs.items()}
    return report


def _share(value: float, low: float, high: float) -> float | None:
    return (value - low) / (high - low) if high - low > 1e-12 else None


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "   -  "
    return f"{100 * x:5.1f}%"


def _chat_suffix(prompts: dict) -> str:
    return f", {chat_label(prompts['chat_template'])}" if prompts.get("chat_template") else ""


def render(report: dict) -> str:
    """Human-readable tables of :func:`analyze_pair`'s report."""
    ks = report["top_k"]
    L = report["draft_positions"]
    lines = [
        f"drafter: {report['drafter_dir']}",
        f"target:  {report['target_dir']}",
        f"block size {report['block_size']} ({L} draft positions); {report['anchors']} anchors from "
        f"{report['prompts']['count']} prompts x {report['prompts']['max_new_tokens']} greedy tokens "
        f"({report['prompts']['source']}{_chat_suffix(report['prompts'])})",
        "",
        "Recall per draft position, conditional on every earlier position being right:",
    ]
    cols = ["top1"] + [f"oracle@{k}" for k in ks] + [f"greedy@{k}" for k in ks] + [f"viterbi@{k}" for k in ks]
    lines.append("  pos " + "".join(f"{c:>11s}" for c in cols))
    for l in range(L):
        lines.append(f"  {l + 1:3d} " + "".join(f"{_fmt(report['recall'][c][l]):>11s}" for c in cols))
    lines += ["", "Acceptance length (tokens per verification pass):",
              f"  {'method':12s} {'implied':>9s} {'measured':>9s}  lossless"]
    meas = report.get("measured", {})
    rows = [("top1", "none")] + [(f"greedy@{k}", f"greedy@{k}") for k in ks] + \
           [(f"viterbi@{k}", f"viterbi@{k}") for k in ks] + [(f"oracle@{k}", None) for k in ks]
    rows += [(name, name) for name in meas if name.startswith("sample@")]
    for name, mkey in rows:
        m = meas.get(mkey) if mkey else None
        mv = f"{m['mean_acceptance_length']:9.3f}" if m else f"{'-':>9s}"
        ll = "" if m is None else {True: "yes", False: "NO", None: f"(T={m['temperature']:g})"}[m["lossless"]]
        imp = report["implied_acceptance"].get(name)
        iv = f"{imp:9.3f}" if imp is not None else f"{'-':>9s}"
        lines.append(f"  {name:12s} {iv} {mv}  {ll}")
    lines += ["", "Selector gain over top-1 (implied) and share of the top-1 -> oracle headroom captured:"]
    for k in ks:
        share = report["headroom_captured"][f"greedy@{k}"]
        lines.append(f"  k={k:<3d} greedy {report['selector_gain'][f'greedy@{k}']:+.3f}  "
                     f"viterbi {report['selector_gain'][f'viterbi@{k}']:+.3f}  "
                     f"headroom captured by greedy: {'-' if share is None else f'{100 * share:.0f}%'}")
    return "\n".join(lines)


def parse_top_k(text: str) -> list[int]:
    """``"4,8,16"`` -> ``[4, 8, 16]`` (the ``--top-k`` option; an empty item or a repeat is refused, as
    ``--concurrency`` and ``--prompt-ids`` refuse theirs, not dropped)."""
    try:
        ks = [int(x) for x in str(text).split(",")]
    except ValueError:
        raise ConfigError(f"must be comma-separated integers, got {text!r}", field="--top-k") from None
    if not ks or min(ks) < 1:
        raise ConfigError(f"values must be >= 1, got {text!r}", field="--top-k")
    if len(set(ks)) != len(ks):
        raise ConfigError(f"a value is repeated in {text!r}", field="--top-k")
    return ks
