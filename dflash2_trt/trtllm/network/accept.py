"""The accept step, and the in-graph random numbers it and the selector draw.

    accept    greedy prefix match (T = 0) or rejection sampling with q (T > 0), per request

per request of the batch, over its K drafts and the target's K+1 logit rows (``reference/verify.py`` is the
plain-torch statement of both rules): :func:`accept` picks the rule by the request's temperature and returns
the number of accepted drafts n and the next token (the target's at position n, or a draw from the residual
distribution); :func:`accepted_tokens` lays them out as the runtime's ``accepted_tokens`` row
``[drafts[:n], next, 0...]``.

Random numbers come from :func:`counter_uniforms`, a counter-based generator in int64 graph math keyed by the
runtime's per-request uniforms (``rand_data_validation``, ``rand_data_sample``) and counted by absolute
positions, so a draw does not depend on how requests are batched. Relied on but unverified [I]: int64
elementwise math under TensorRT (every product stays below 2^63), TensorRT's top-k/argmax tie order (the
contract is lower id first).
"""

from __future__ import annotations

import numpy as np

from dflash2_trt.sampling import GREEDY_BELOW

from .common import F, dims, op_le

PRIME = 2**31 - 1


def counter_uniforms(key, counter):
    """Uniforms in [0, 1) from a counter-based generator: one value per (key, counter), int64 math only
    (an affine mix, then multiply / square-and-add rounds modulo the prime 2^31 - 1; every product stays
    below 2^63). ``key [B]`` int64 (per request and step), ``counter [B, N]`` int64 (absolute positions)."""
    x = (F.unsqueeze(key, 1) * 1103515245 + counter * _i64(2654435761) + 12345)
    x = x - F.floordiv(x, PRIME) * PRIME
    for add in (1442695041, 2147483587, 1013904223):
        x = x * 48271
        x = x - F.floordiv(x, PRIME) * PRIME
        x = x * x + add
        x = x - F.floordiv(x, PRIME) * PRIME
    return F.cast(F.floordiv(x, 256), "float32") * (1.0 / 2**23)   # 23 bits: exact in fp32, < 1


def _i64(v: int):
    """An int64 constant [1]: TensorRT-LLM turns a bare Python int into an int32 constant (int32_array), which a
    value beyond int32 overflows."""
    return F.constant(np.array([v], np.int64))


def inverse_cdf(probs, u, block: int = 512):
    """Smallest index whose cumulative mass exceeds ``u * total`` (fallback: the last index with mass);
    ``probs [N, V]`` fp32, ``u [N]``. The reference (``verify.sample_from_probs``) sums in fp64; one fp32
    cumsum over a 248k vocabulary rounds away increments below an ulp of the running total (a
    total-variation error of ~2e-3 per token), so this sums in two levels: block totals, then inside the
    chosen block, each an fp32 sum of at most ``block`` (or V / block) terms."""
    n, v = F.shape(probs, 0), F.shape(probs, 1)
    nb = F.floordiv(v + (block - 1), block)
    pad = nb * block - v
    padded = F.concat([probs, F.expand(F.constant(np.zeros((1, 1), np.float32)), F.concat([n, pad]))], dim=1)
    blocks = F.view(padded, F.concat([n, nb, block]))
    totals = F.sum(blocks, 2)                                                        # [N, nb]
    ctot = F.cumsum(totals, 1)
    thresh = F.view(F.unsqueeze(u, 1) * F.slice(ctot, F.concat([0, nb - 1]), F.concat([n, 1])), F.concat([n]))
    b = F.minimum(F.sum(F.cast(op_le(ctot, F.unsqueeze(thresh, 1)), "int32"), 1), nb - 1)   # block of the draw
    before = F.where(F.gt(b, 0), F.view(F.gather(ctot, 1, F.unsqueeze(F.maximum(b - 1, 0), 1)), F.concat([n])), 0.0)
    inner = F.view(F.gather(blocks, 1, F.expand(F.view(b, F.concat([n, 1, 1])), F.concat([n, 1, block]))),
                   F.concat([n, block]))
    cin = F.cumsum(inner, 1)
    # b is int64 (it meets shape() values, int64 in TensorRT 10); where() below never casts a Tensor operand, and
    # ISelectLayer refuses int64 against last_pos's int32, so the index is int32 here
    first = F.cast(b * block + F.sum(F.cast(op_le(cin, F.unsqueeze(thresh - before, 1)), "int32"), 1), "int32")
    ar = F.unsqueeze(F.arange(F.constant(np.array(0, np.int32)), v, "int32"), 0)
    last_pos = F.max(F.where(F.gt(probs, 0.0), ar, -1), 1)
    return F.where(F.lt(first, v), first, last_pos)



def leading_true(ok):
    """Number of leading True values per row of a bool ``[B, L]``."""
    miss = F.cumsum(1 - F.cast(ok, "int32"), 1)
    return F.sum(F.cast(F.eq(miss, 0), "int32"), 1)


def acceptance_uniforms(rand_data_validation, anchor_pos, j, bs):
    """``[bs, K+1]`` uniforms of the accept step: one uniform per request keys the counter-based generator (the
    runtime's first of its K+1), counted by the positions ``anchor_pos + 1..K+1``."""
    key_v = F.cast(F.view(F.slice(rand_data_validation, [0, 0], dims(bs, 1)), dims(bs)) * float(2**31), "int64")
    return counter_uniforms(key_v, F.cast(F.unsqueeze(anchor_pos, 1) + j + 1, "int64"))


def decoding_temperature(eagle_temperature):
    """``[bs]`` fp32: the temperature the step decodes with, 0 (greedy) where the runtime's is below
    ``GREEDY_BELOW`` (1e-5, the rule of :mod:`dflash2_trt.sampling`). The engine applies it itself because
    TensorRT-LLM's runtime hands ``eagle_temperature`` over as the request set it: its EAGLE decoding layer
    refuses 0 (a temperature must lie in (0, FLT_MAX], engine_io.yaml ``request_temperature``), so greedy
    arrives as a small positive temperature (:data:`dflash2_trt.sampling.GREEDY_REQUEST_TEMPERATURE`), and a
    tiny one sampled as is would divide logits into inf."""
    t = F.cast(eagle_temperature, "float32")
    return F.where(F.lt(t, GREEDY_BELOW), 0.0, t)


def accept(logits3, drafts, q, cand, temperature, u, is_gen, bs, vocab, K):
    """(n accepted drafts [bs], next token [bs]) per request: greedy where T <= 0, rejection sampling
    with the selector's q where T > 0 (``reference/verify.py`` is the plain-torch statement of both).
    Context requests accept no draft: their token comes from row 0 (the last prompt position)."""
    gen_col = F.unsqueeze(is_gen, 1)
    n_g, next_g = greedy_accept(logits3, drafts, gen_col, bs, K)
    sampled = F.gt(temperature, 0.0)
    n_s, next_s = rejection_sample(logits3, drafts, q, cand, temperature, sampled, u, gen_col, bs, vocab, K)
    return F.where(sampled, n_s, n_g), F.where(sampled, next_s, next_g)


def greedy_accept(logits3, drafts, gen_col, bs, K):
    """T <= 0: the drafts accepted while each equals the target's argmax at its position; the next token is the
    target's argmax after them."""
    post = F.argmax(logits3, 2)                                                    # [bs, K+1]
    ok_g = F.op_and(F.eq(drafts, F.slice(post, [0, 0], dims(bs, K))), gen_col)
    n_g = leading_true(ok_g)
    next_g = F.view(F.gather(post, 1, F.unsqueeze(n_g, 1)), dims(bs))
    return n_g, next_g


def rejection_sample(logits3, drafts, q, cand, temperature, sampled, u, gen_col, bs, vocab, K):
    """T > 0: draft i is accepted while ``u_i * q(d_i) < p(d_i)`` (p = softmax(logits / T), q the selector's
    proposal scattered over the vocabulary); the next token is drawn from ``max(p - q, 0)`` at the first
    rejected position (p itself where that residual is empty, and after K accepted drafts) with the last
    uniform."""
    t_safe = F.where(sampled, temperature, 1.0)
    p = F.softmax(logits3 * F.unsqueeze(F.unsqueeze(F.div(1.0, t_safe), 1), 2), 2)   # [bs, K+1, V]
    # (F.div: TensorRT-LLM's Tensor has no __rtruediv__, so `1.0 / t` fails there)
    q_full = F.scatter(F.cast(F.expand(F.constant(np.zeros((1, 1, 1), np.float32)), dims(bs, K, vocab)), "float32"),
                       2, cand, q)
    q_full = F.where(F.unsqueeze(gen_col, 2), q_full, 0.0)   # context: no proposal (where: a NaN in a
    # discarded dummy draft must not leak as NaN * 0)
    d_idx = F.unsqueeze(drafts, 2)
    pd = F.view(F.gather(F.slice(p, [0, 0, 0], dims(bs, K, vocab)), 2, d_idx), dims(bs, K))
    qd = F.view(F.gather(q_full, 2, d_idx), dims(bs, K))
    u_acc = F.slice(u, [0, 0], dims(bs, K))
    u_fin = F.view(F.slice(u, [0, K], dims(bs, 1)), dims(bs))
    n_s = leading_true(F.op_and(F.lt(u_acc * qd, pd), gen_col))
    row = F.unsqueeze(F.unsqueeze(n_s, 1), 2) + F.expand(F.constant(np.zeros((1, 1, 1), np.int32)), dims(bs, 1, vocab))
    p_n = F.view(F.gather(p, 1, row), dims(bs, vocab))
    q_pad = F.concat([q_full, F.cast(F.expand(F.constant(np.zeros((1, 1, 1), np.float32)), dims(bs, 1, vocab)),
                                     "float32")], dim=1)
    q_n = F.view(F.gather(q_pad, 1, row), dims(bs, vocab))
    resid = F.maximum(p_n - q_n, 0.0)
    empty = op_le(F.sum(resid, 1), 0.0)
    resid = F.where(F.unsqueeze(empty, 1), p_n, resid)
    next_s = inverse_cdf(resid, u_fin)
    return n_s, next_s


def accepted_tokens(drafts, n, nxt, j, bs, K):
    """The runtime's ``accepted_tokens`` rows ``[bs, K+1]``: the n accepted drafts, the next token, zeros."""
    jj = F.expand(j, dims(bs, K + 1))
    padded = F.concat([drafts, F.expand(F.constant(np.zeros((1, 1), np.int32)), dims(bs, 1))], dim=1)
    return F.where(F.lt(jj, F.unsqueeze(n, 1)), padded,
                   F.where(F.eq(jj, F.unsqueeze(n, 1)), F.unsqueeze(nxt, 1) + jj * 0, jj * 0))
