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

// The row functions below take a compile-time bound kMaxK >= K (kScanMaxTopK) and run their
// loops to it with a `c < K` guard: the GPU unrolls them into registers (no local memory), the
// CPU build runs the same operations in the same order.
#if defined(__CUDA_ARCH__)
#define DF2_SCAN_MATH_UNROLL _Pragma("unroll")
#else
#define DF2_SCAN_MATH_UNROLL
#endif

//! Inverse CDF over p[0..K) (sequential cumsum): the first c with cumsum(p)[c] > u, else the last
//! index with p > 0, else 0.
template <int kMaxK>
DF2_HD int32_t inverseCdf(float const* p, int32_t K, float u)
{
    float cum = 0.0f;
    int32_t lastPositive = -1;
    int32_t chosen = -1;
    DF2_SCAN_MATH_UNROLL
    for (int32_t c = 0; c < kMaxK; ++c)
    {
        if (c < K && chosen < 0)
        {
            cum = addRn(cum, p[c]);
            if (cum > u)
                chosen = c;
            else if (p[c] > 0.0f)
                lastPositive = c;
        }
    }
    if (chosen >= 0)
        return chosen;
    return lastPositive >= 0 ? lastPositive : 0;
}

//! Viterbi relaxation for one candidate c: best over predecessors p of prev[p] + step[p*K + c]
//! (the first p reaching it).
template <int kMaxK>
DF2_HD float viterbiRelax(float const* prev, float const* step, int32_t K, int32_t c, int32_t* backpointer)
{
    float best = addRn(prev[0], step[c]);
    int32_t arg = 0;
    DF2_SCAN_MATH_UNROLL
    for (int32_t p = 1; p < kMaxK; ++p)
    {
        if (p < K)
        {
            float const v = addRn(prev[p], step[p * K + c]);
            if (v > best)
            {
                best = v;
                arg = p;
            }
        }
    }
    *backpointer = arg;
    return best;
}

//! Greedy choice over one lattice row: the first index of its maximum (scanBetter in index
//! order; a NaN never wins, and a NaN at index 0 is kept). Also the Viterbi walk's final argmax.
template <int kMaxK>
DF2_HD int32_t greedyRowChoice(float const* row, int32_t K)
{
    int32_t choice = 0;
    float best = row[0];
    DF2_SCAN_MATH_UNROLL
    for (int32_t c = 1; c < kMaxK; ++c)
    {
        if (c < K)
        {
            float const v = row[c];
            if (scanBetter(v, c, best, choice))
            {
                choice = c;
                best = v;
            }
        }
    }
    return choice;
}

//! Sampling step over one lattice row with a usable temperature: z = row / T, m = max z (z[0],
//! then z[c] > m in index order), e = exp(z - m), their sum in index order, q[0..K) = p = e / sum,
//! then the inverse CDF at u over p. Returns the chosen index.
template <int kMaxK>
DF2_HD int32_t sampleRowChoice(float const* row, int32_t K, float temperature, float u, float* q)
{
    float v[kMaxK]; // z, then e, then p
    DF2_SCAN_MATH_UNROLL
    for (int32_t c = 0; c < kMaxK; ++c)
        v[c] = c < K ? softmaxLogit(row[c], temperature) : 0.0f;
    float m = v[0];
    DF2_SCAN_MATH_UNROLL
    for (int32_t c = 1; c < kMaxK; ++c)
        if (c < K)
            m = v[c] > m ? v[c] : m;
    float sum = 0.0f;
    DF2_SCAN_MATH_UNROLL
    for (int32_t c = 0; c < kMaxK; ++c)
        if (c < K)
        {
            v[c] = softmaxExp(v[c], m);
            sum = addRn(sum, v[c]);
        }
    DF2_SCAN_MATH_UNROLL
    for (int32_t c = 0; c < kMaxK; ++c)
        if (c < K)
        {
            v[c] = softmaxProb(v[c], sum);
            q[c] = v[c];
        }
    return inverseCdf<kMaxK>(v, K, u);
}

} // namespace dflash2
