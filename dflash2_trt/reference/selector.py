"""DFlash2 pairwise path selector: top-k candidates, pairwise lattice, and the walks.

Shapes: B = batch, L = draft positions (block_size - 1), K = candidates per position (top-k),
V = vocab, R = selector rank.

Scores (docs/architecture.md §1)::

    S[b, l, p, c] = U[b, l, c] + sum_r A[pred(b, l, p), r] * Hp[b, l, r] * Bc[cand[b, l, c], r]

with ``U`` the transformed unary logits of the candidates, ``A`` the predecessor codebook,
``Bc`` the successor codebook, ``Hp = hidden_projection(h_l)`` (h_l = the drafter's final-normed
hidden state of draft position l, the same vector the LM head reads), and
``pred(b, 0, p) = anchor[b]`` (the last verified token, for EVERY row p) and
``pred(b, l, p) = cand[b, l-1, p]`` for l > 0.

Determinism contract (kernels are compared exactly on ids / paths):
- :func:`topk_candidates` orders candidates by descending score; equal scores are ordered by
  ascending token id (lower id first). ``torch.topk`` does not document a tie order, so this
  module uses a stable sort.
- greedy: left to right; at l = 0 the row of the anchor, then the row of the chosen
  predecessor; ``argmax`` with ties to the lower candidate index. ``q`` is one-hot.
- sample: ``p = softmax(S_row / T)`` over the K candidates (fp32); choose the smallest index c
  with ``cumsum(p)[c] > u`` (u in [0, 1) supplied by the caller); if none (rounding, u close to
  1), the last index with ``p > 0``. ``q = p`` (the proposal kept for rejection sampling).
- viterbi: max-plus DP over the same scores; at each backpointer ties go to the lower
  predecessor index, at the end to the lower final index. ``q`` is one-hot.
- none: each position's own top-1 (candidate index 0), i.e. plain DFlash. ``q`` one-hot.

Silent failure modes: using the same lattice row for every position (forgetting that the row
is the PREVIOUS choice), or feeding the pre-norm hidden to ``hidden_projection`` — both only
lower acceptance; nothing errors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "MODES",
    "transform_unary_logits",
    "topk_candidates",
    "pairwise_lattice",
    "walk_greedy",
    "walk_sample",
    "walk_viterbi",
    "walk_none",
    "walk",
    "Selection",
    "PairwiseSelector",
]

MODES = ("greedy", "viterbi", "sample", "none")

Walk = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def transform_unary_logits(logits: torch.Tensor, output_multiplier: float | None = None,
                           softcapping: float | None = None) -> torch.Tensor:
    """fp32 unary logits: ``float(logits) * output_multiplier`` then ``tanh(x/cap)*cap``.

    Both steps are optional (``None`` = absent). Both are monotonic, so the top-k SET is
    unchanged, but the scores (and so the lattice and sampling proposal) change.
    """
    x = logits.float()
    if output_multiplier is not None:
        x = x * float(output_multiplier)
    if softcapping is not None:
        if softcapping <= 0:
            raise ValueError(f"final_logit_softcapping must be > 0, got {softcapping}")
        x = torch.tanh(x / float(softcapping)) * float(softcapping)
    return x


def topk_candidates(unary: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of ``unary [..., V]``: (scores fp32 [..., k], ids int64 [..., k]).

    Order: descending score, ties by ascending token id (stable sort of the vocab order).
    NaN scores are rejected (their order would be undefined).
    """
    if k < 1 or k > unary.shape[-1]:
        raise ValueError(f"top_k={k} must be in [1, vocab={unary.shape[-1]}]")
    u = unary.float()
    if torch.isnan(u).any():
        raise ValueError("topk_candidates: NaN in unary logits")
    scores, ids = torch.sort(u, dim=-1, descending=True, stable=True)
    return scores[..., :k].contiguous(), ids[..., :k].contiguous()


def pairwise_lattice(cand_ids: torch.Tensor, unary: torch.Tensor, proj_hidden: torch.Tensor,
                     anchor: torch.Tensor, pred_codebook: torch.Tensor,
                     succ_codebook: torch.Tensor) -> torch.Tensor:
    """Lattice ``S [B, L, K(prev), K(cur)]`` in fp32 (see module docstring)."""
    b, l, k = cand_ids.shape
    if unary.shape != (b, l, k):
        raise ValueError(f"unary {tuple(unary.shape)} != cand_ids {tuple(cand_ids.shape)}")
    if proj_hidden.shape[:2] != (b, l) or anchor.shape != (b,):
        raise ValueError(
            f"proj_hidden {tuple(proj_hidden.shape)} / anchor {tuple(anchor.shape)} do not fit B={b}, L={l}")
    pred_ids = torch.cat([anchor.view(b, 1, 1).expand(b, 1, k), cand_ids[:, :-1]], dim=1)
    a = pred_codebook.float()[pred_ids]                         # [B, L, K, R]
    s = succ_codebook.float()[cand_ids]                         # [B, L, K, R]
    ctx = a * proj_hidden.float()[:, :, None, :]                # [B, L, K, R]
    pair = torch.einsum("blpr,blcr->blpc", ctx, s)
    return unary.float()[:, :, None, :] + pair


def _gather_tokens(cand_ids: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return cand_ids.gather(-1, idx.unsqueeze(-1)).squeeze(-1)


def _one_hot(idx: torch.Tensor, k: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(idx, k).float()


def walk_greedy(lattice: torch.Tensor, cand_ids: torch.Tensor) -> Walk:
    """Left-to-right greedy walk. Returns (cand_index [B, L], tokens [B, L], q one-hot [B, L, K])."""
    b, l, k, _ = lattice.shape
    prev = torch.zeros(b, dtype=torch.long, device=lattice.device)  # l=0: every row is the anchor
    out = []
    for pos in range(l):
        row = lattice[torch.arange(b, device=lattice.device), pos, prev]   # [B, K]
        prev = torch.argmax(row, dim=-1)   # torch.argmax returns the FIRST maximal index
        out.append(prev)
    idx = torch.stack(out, dim=1)
    return idx, _gather_tokens(cand_ids, idx), _one_hot(idx, k)


def _inverse_cdf(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Smallest index c with cumsum(p)[c] > u; fallback: last index with p > 0. p [N, K], u [N]."""
    k = p.shape[-1]
    cdf = torch.cumsum(p, dim=-1)
    hit = cdf > u.unsqueeze(-1)
    ar = torch.arange(k, device=p.device)
    first = torch.where(hit, ar, k).min(dim=-1).values
    last_pos = torch.where(p > 0, ar, -1).max(dim=-1).values
    return torch.where(first < k, first, last_pos)


def walk_sample(lattice: torch.Tensor, cand_ids: torch.Tensor, temperature: torch.Tensor,
                uniforms: torch.Tensor) -> Walk:
    """Sampling walk. temperature [B] (> 0), uniforms [B, L] in [0, 1).

    Returns (cand_index, tokens, q) with q [B, L, K] = softmax(S_row / T) in fp32.
    """
    b, l, k, _ = lattice.shape
    temperature = torch.as_tensor(temperature, dtype=torch.float32, device=lattice.device).reshape(-1)
    if temperature.numel() == 1 and b > 1:
        temperature = temperature.expand(b)
    if (temperature <= 0).any():
        raise ValueError("walk_sample: temperature must be > 0 (use greedy/viterbi for T = 0)")
    if uniforms.shape != (b, l):
        raise ValueError(f"walk_sample: uniforms must be [B={b}, L={l}], got {tuple(uniforms.shape)}")
    prev = torch.zeros(b, dtype=torch.long, device=lattice.device)
    idxs, qs = [], []
    for pos in range(l):
        row = lattice[torch.arange(b, device=lattice.device), pos, prev].float()
        p = torch.softmax(row / temperature[:, None], dim=-1)
        prev = _inverse_cdf(p, uniforms[:, pos].float())
        idxs.append(prev)
        qs.append(p)
    idx = torch.stack(idxs, dim=1)
    return idx, _gather_tokens(cand_ids, idx), torch.stack(qs, dim=1)


def walk_viterbi(lattice: torch.Tensor, cand_ids: torch.Tensor) -> Walk:
    """Global best path by max-plus DP (ties to lower indices). One-hot q."""
    b, l, k, _ = lattice.shape
    score = lattice[:, 0, 0, :].float()       # [B, K]; all rows at l=0 are the anchor's
    backs = []
    for pos in range(1, l):
        tot = score[:, :, None] + lattice[:, pos].float()   # [B, K(prev), K(cur)]
        score, bp = tot.max(dim=1)   # NOT documented tie order for max(dim): recompute below
        # Deterministic tie rule: lowest predecessor index achieving the max.
        ar = torch.arange(k, device=lattice.device)
        bp = torch.where(tot == score[:, None, :], ar[None, :, None], k).min(dim=1).values
        backs.append(bp)
    last = torch.argmax(score, dim=-1)
    path = [last]
    for bp in reversed(backs):
        last = bp.gather(1, last[:, None]).squeeze(1)
        path.append(last)
    idx = torch.stack(path[::-1], dim=1)
    return idx, _gather_tokens(cand_ids, idx), _one_hot(idx, k)


def walk_none(lattice: torch.Tensor, cand_ids: torch.Tensor) -> Walk:
    """Plain DFlash: each position's own top-1 (candidate index 0 of the sorted top-k)."""
    b, l, k = cand_ids.shape
    idx = torch.zeros(b, l, dtype=torch.long, device=cand_ids.device)
    return idx, cand_ids[..., 0].clone(), _one_hot(idx, k)


def walk(mode: str, lattice: torch.Tensor, cand_ids: torch.Tensor, *,
         temperature: torch.Tensor | None = None, uniforms: torch.Tensor | None = None) -> Walk:
    if mode == "greedy":
        return walk_greedy(lattice, cand_ids)
    if mode == "viterbi":
        return walk_viterbi(lattice, cand_ids)
    if mode == "none":
        return walk_none(lattice, cand_ids)
    if mode == "sample":
        if temperature is None or uniforms is None:
            raise ValueError("selector mode 'sample' needs temperature and uniforms")
        return walk_sample(lattice, cand_ids, temperature, uniforms)
    raise ValueError(f"unknown selector mode {mode!r}; expected one of {MODES}")


@dataclass(frozen=True)
class Selection:
    """Result of one selection over a draft block (batch B, L positions, K candidates)."""

    cand_ids: torch.Tensor     # [B, L, K] int64, descending unary score
    cand_scores: torch.Tensor  # [B, L, K] fp32 transformed unary logits
    lattice: torch.Tensor      # [B, L, K, K] fp32
    cand_index: torch.Tensor   # [B, L] int64
    tokens: torch.Tensor       # [B, L] int64
    q: torch.Tensor            # [B, L, K] fp32 proposal over the candidates


class PairwiseSelector(nn.Module):
    """``candidate_selector`` of the published checkpoint (predecessor/successor codebooks
    ``[V, R]`` and ``hidden_projection: Linear(H, R, bias=False)``)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    def forward(self, hidden: torch.Tensor, unary_logits: torch.Tensor, anchor: torch.Tensor,
                mode: str = "greedy", *, top_k: int | None = None,
                temperature: torch.Tensor | float | None = None,
                uniforms: torch.Tensor | None = None) -> Selection:
        """hidden [B, L, H] (final-normed drafter hidden), unary_logits [B, L, V] (already
        transformed by :func:`transform_unary_logits`), anchor [B]."""
        k = self.top_k if top_k is None else top_k   # 0 must reach topk_candidates' error
        scores, ids = topk_candidates(unary_logits, k)
        proj = self.hidden_projection(hidden)
        lat = pairwise_lattice(ids, scores, proj, anchor, self.predecessor_codebook,
                               self.successor_codebook)
        if temperature is not None and not torch.is_tensor(temperature):
            temperature = torch.full((hidden.shape[0],), float(temperature))
        idx, tok, q = walk(mode, lat, ids, temperature=temperature, uniforms=uniforms)
        return Selection(ids, scores, lat, idx, tok, q)
