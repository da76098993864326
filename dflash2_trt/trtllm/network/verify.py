"""The verify pass's inputs and outputs around the target transformer:

    verify    target over the request's tokens, drafts substituted at positions 1..K of every
              generation request (spec-decoding attention, chain mask from the runtime)

:func:`substitute_drafts` makes the target's input ids (the runtime fed placeholders in the K draft slots: the
drafts are made in this same step), :func:`logits_by_position` regroups the target's logit rows per request
and position for the accept step.
"""

from __future__ import annotations

import numpy as np

from .common import F, dims, op_le


def substitute_drafts(input_ids, drafts, step, K: int):
    """``input_ids`` with each generation request's K draft slots (its tokens 1..K) replaced by its drafts."""
    tok = F.arange(F.constant(np.array(0, np.int32)), F.shape(input_ids, 0), "int32")
    req = F.sum(F.cast(op_le(F.unsqueeze(step.ends, 0), F.unsqueeze(tok, 1)), "int32"), 1)  # request of each token
    off = tok - F.index_select(step.starts, 0, req)
    tok_gen = F.op_and(F.index_select(step.is_gen, 0, req), F.gt(off, 0))
    slot = F.maximum(off - 1, 0)
    sub = F.gather(F.index_select(drafts, 0, req), 1, F.unsqueeze(F.minimum(slot, K - 1), 1))
    return F.where(tok_gen, F.view(sub, [-1]), input_ids)   # [-1]: a static shape list


def logits_by_position(logits, step, K: int):
    """(``[bs, K+1, V]`` logits per request and position, V). The runtime's logits rows: last_token_ids is the
    inclusive scan of logits per request (a context request 1 at its last token, a generation request K+1); a
    context request's one row is repeated over the K+1 positions (it accepts no draft)."""
    bs, j = step.bs, step.j
    vocab = F.shape(logits, 1)
    per_req = F.where(step.is_gen, K + 1, 1)
    logit_start = F.cumsum(F.cast(per_req, "int32"), 0) - F.cast(per_req, "int32")
    rows = F.unsqueeze(logit_start, 1) + F.where(F.unsqueeze(step.is_gen, 1), j, j * 0)   # [bs, K+1]
    return F.view(F.index_select(logits, 0, F.view(rows, dims(bs * (K + 1)))), dims(bs, K + 1, vocab)), vocab
