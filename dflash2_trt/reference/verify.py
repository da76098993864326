"""Lossless verification of a drafted block (docs/architecture.md §1 "Lossless").

Shapes: B batch, L drafted tokens, V vocab. The target scored ``[anchor, d_1 .. d_L]`` in one
pass, so ``target_logits[:, i]`` is the target's distribution for the token AFTER position i,
i.e. the distribution that drafted token ``d_{i+1}`` must be checked against; the last row
(``i = L``) is the bonus distribution used when every draft is accepted.

Both functions return ``(num_accepted [B] int64, next_token [B] int64)``: the emitted tokens of
row b are ``draft[b, :num_accepted[b]]`` followed by ``next_token[b]`` (the target's correction at
the first rejection, or its bonus token when all L were accepted). Every pass therefore emits
between 1 and L + 1 tokens.

Randomness comes in as uniforms in [0, 1) so that a kernel can reproduce a run exactly.

Silent failure modes (tested by the sampling statistical test): comparing p and q at an
off-by-one position, building q from raw drafter logits instead of the selector's proposal, or
forgetting that q is zero outside the K candidates — each still emits plausible text but
changes the output distribution.
"""

from __future__ import annotations

import torch

__all__ = [
    "accept_greedy",
    "accept_sampling",
    "scatter_proposal",
    "target_probs",
    "sample_from_probs",
]


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 ``softmax(logits / T)``; T must be > 0."""
    if temperature <= 0:
        raise ValueError("target_probs: temperature must be > 0 (greedy uses accept_greedy)")
    return torch.softmax(logits.float() / float(temperature), dim=-1)


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from (possibly unnormalized) ``probs [N, V]`` with ``u [N]`` in [0, 1):
    the smallest index whose cumulative mass exceeds ``u * total``; fallback: the last index with
    positive mass (guards fp rounding when u is close to 1)."""
    v = probs.shape[-1]
    cdf = torch.cumsum(probs.double(), dim=-1)
    thresh = u.double() * cdf[..., -1]
    ar = torch.arange(v, device=probs.device)
    first = torch.where(cdf > thresh.unsqueeze(-1), ar, v).min(dim=-1).values
    last_pos = torch.where(probs > 0, ar, -1).max(dim=-1).values
    return torch.where(first < v, first, last_pos)


def scatter_proposal(cand_ids: torch.Tensor, q_cand: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Full-vocabulary proposal ``[B, L, V]`` from the selector's ``q [B, L, K]`` over candidates
    ``cand_ids [B, L, K]`` (distinct ids per position). Zero outside the candidates."""
    full = torch.zeros(*cand_ids.shape[:-1], vocab_size, dtype=torch.float32, device=q_cand.device)
    return full.scatter_add_(-1, cand_ids, q_cand.float())


def _first_false(ok: torch.Tensor) -> torch.Tensor:
    """Number of leading True values along the last dim."""
    return ok.long().cumprod(dim=-1).sum(dim=-1)


def accept_greedy(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Longest prefix of ``draft [B, L]`` equal to the target argmax, plus the target's token.

    ``target_logits [B, L+1, V]``; argmax ties go to the lower token id (torch.argmax returns the
    first maximal index), matching the target's own greedy decoding.
    """
    b, l = draft.shape
    if target_logits.shape[:2] != (b, l + 1):
        raise ValueError(
            f"accept_greedy: target_logits must be [B={b}, L+1={l + 1}, V], got {tuple(target_logits.shape)}")
    post = torch.argmax(target_logits, dim=-1)             # [B, L+1]
    n = _first_false(draft == post[:, :l])
    nxt = post.gather(1, n[:, None]).squeeze(1)
    return n, nxt


def accept_sampling(draft: torch.Tensor, q_full: torch.Tensor, p: torch.Tensor,
                    accept_uniforms: torch.Tensor, final_uniforms: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative rejection sampling (lossless for the target distribution ``p``).

    Args:
        draft: ``[B, L]`` drafted tokens (drawn from ``q_full``).
        q_full: ``[B, L, V]`` proposal the drafts were drawn from (see :func:`scatter_proposal`).
        p: ``[B, L+1, V]`` target probabilities (already tempered).
        accept_uniforms: ``[B, L]``; draft i is accepted iff ``u_i * q(d_i) < p(d_i)``, i.e. with
            probability min(1, p/q).
        final_uniforms: ``[B]``; draws the correction from normalize(max(0, p - q)) at the first
            rejection, or the bonus from ``p[L]`` when every draft was accepted.
    """
    b, l = draft.shape
    if q_full.shape[:2] != (b, l) or p.shape[:2] != (b, l + 1):
        raise ValueError(
            f"accept_sampling: shapes draft {tuple(draft.shape)}, q {tuple(q_full.shape)}, "
            f"p {tuple(p.shape)} do not fit")
    pd = p[:, :l].float().gather(-1, draft[..., None]).squeeze(-1)       # p(d_i)
    qd = q_full.float().gather(-1, draft[..., None]).squeeze(-1)         # q(d_i)
    ok = accept_uniforms.float() * qd < pd
    n = _first_false(ok)                                                 # [B]
    rows = torch.arange(b, device=draft.device)
    p_n = p.float()[rows, n]                                             # [B, V]
    q_pad = torch.cat([q_full.float(), torch.zeros_like(q_full[:, :1].float())], dim=1)
    q_n = q_pad[rows, n]                                                 # zero at the bonus row
    resid = torch.clamp(p_n - q_n, min=0.0)
    # All-accepted rows: q_n = 0 so resid = p (the bonus). A rejected row with p == q everywhere
    # has probability 0; fall back to p if rounding produced an all-zero residual.
    empty = resid.sum(-1) <= 0
    resid = torch.where(empty[:, None], p_n, resid)
    nxt = sample_from_probs(resid, final_uniforms)
    return n, nxt
