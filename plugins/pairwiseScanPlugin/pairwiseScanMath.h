/*
 * DFlash2PairwiseScan: per-element / per-step math shared by the CUDA kernels and the CPU build.
 *
 * Lattice (fp32), for batch b, position l, predecessor row p, candidate c:
 *   ctx[r]        = A[pred(l, p), r] * Hh[b, l, r]
 *   pair          = sum_{r = 0..R-1} ctx[r] * Bc[cand[b, l, c], r]      (sequential in r, each
 *                   step one fused multiply-add: acc = fma(ctx[r], Bc[..., r], acc))
 *   S[b, l, p, c] = unary[b, l, c] + pair
 * with pred(0, p) = anchor[b] for every p, pred(l, p) = cand[b, l-1, p] for l > 0.
 * A token id outside [0, V) reads a codebook row of zeros (its pairwise term is 0); the kernels
 * never read out of bounds. Nothing reports this: ids come from top-k of the same vocab.
 *
 * Walks (row(l) = S[b, l, prev(l), :], prev(0) = 0):
 *   greedy : c = first index of the maximum of row(l); q one-hot.
 *   sample : z = row / T; m = max z; e = exp(z - m); Z = e[0] + e[1] + ... (in index order);
 *            p = e / Z; c = smallest index with cumsum(p)[c] > u[b, l] (cumsum in index order),
 *            else the last index with p > 0, else 0; q = p. T <= 0 or T not finite: the step is
 *            greedy with one-hot q (the reference rejects T <= 0; a kernel cannot raise).
 *   viterbi: best[0][c] = S[0][0][c]; best[l][c] = max_p best[l-1][p] + S[l][p][c], backpointer =
 *            the first p reaching the max; final = first c of the max of best[L-1]; q one-hot.
 * Every reduction whose order can change the rounding (sum, cumsum) is sequential in index order
 * on both CPU and GPU; max/argmax reductions are order-free (ties resolved by index).
 */
#pragma once

#include "../common/df2Common.h"

namespace dflash2
{

DF2_HD bool tokenInRange(int32_t id, int64_t vocab)
{
    return id >= 0 && static_cast<int64_t>(id) < vocab;
}

DF2_HD float latticeContext(float a, float h)
{
    return mulRn(a, h);
}

DF2_HD float latticeAccumulate(float acc, float ctx, float b)
{
    return fmaRn(ctx, b, acc);
}

DF2_HD float latticeScore(float unary, float pair)
{
    return addRn(unary, pair);
}

//! true when (v, i) beats (best, bestIdx): larger value, or equal value at a lower index.
DF2_HD bool scanBetter(float v, int32_t i, float best, int32_t bestIdx)
{
    return v > best || (v == best && i < bestIdx);
}

DF2_HD bool temperatureUsable(float t)
{
    return t > 0.0f && t <= 3.0e38f; // rejects 0, negatives, NaN and inf
}

DF2_HD float softmaxLogit(float s, float temperature)
{
    return divRn(s, temperature);
}

DF2_HD float softmaxExp(float z, float maxZ)
{
    return expRn(subRn(z, maxZ));
}

DF2_HD float softmaxProb(float e, float sum)
{
    return divRn(e, sum);
}

//! Inverse CDF over p[0..K) (sequential cumsum). Returns the chosen index.
DF2_HD int32_t inverseCdf(float const* p, int32_t K, float u)
{
    float cum = 0.0f;
    int32_t lastPositive = -1;
    for (int32_t c = 0; c < K; ++c)
    {
        cum = addRn(cum, p[c]);
        if (cum > u)
            return c;
        if (p[c] > 0.0f)
            lastPositive = c;
    }
    return lastPositive >= 0 ? lastPositive : 0;
}

//! Viterbi relaxation for one candidate c: best over predecessors p of prev[p] + step[p*K + c].
DF2_HD float viterbiRelax(float const* prev, float const* step, int32_t K, int32_t c, int32_t* backpointer)
{
    float best = addRn(prev[0], step[c]);
    int32_t arg = 0;
    for (int32_t p = 1; p < K; ++p)
    {
        float const v = addRn(prev[p], step[p * K + c]);
        if (v > best)
        {
            best = v;
            arg = p;
        }
    }
    *backpointer = arg;
    return best;
}

//! Greedy choice over one lattice row: the first index of its maximum (scanBetter in index
//! order; a NaN never wins, and a NaN at index 0 is kept). Also the Viterbi walk's final argmax.
DF2_HD int32_t greedyRowChoice(float const* row, int32_t K)
{
    int32_t choice = 0;
    for (int32_t c = 1; c < K; ++c)
        if (scanBetter(row[c], c, row[choice], choice))
            choice = c;
    return choice;
}

//! Sampling step over one lattice row with a usable temperature: q[0..K) = softmax(row / T) (the
//! logits' max, then the exponentials and their sum in index order), then the inverse CDF at u.
//! q may alias nothing in row. Returns the chosen index.
DF2_HD int32_t sampleRowChoice(float const* row, int32_t K, float temperature, float u, float* q)
{
    float m = softmaxLogit(row[0], temperature);
    for (int32_t c = 1; c < K; ++c)
    {
        float const z = softmaxLogit(row[c], temperature);
        m = z > m ? z : m;
    }
    float sum = 0.0f;
    for (int32_t c = 0; c < K; ++c)
    {
        q[c] = softmaxExp(softmaxLogit(row[c], temperature), m); // e[c], turned into p[c] below
        sum = addRn(sum, q[c]);
    }
    for (int32_t c = 0; c < K; ++c)
        q[c] = softmaxProb(q[c], sum);
    return inverseCdf(q, K, u);
}

} // namespace dflash2
