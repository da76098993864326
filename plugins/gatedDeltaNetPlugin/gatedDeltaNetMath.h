/*
 * DFlash2GatedDeltaNet: the per-element and per-column math shared by the CUDA kernels and the
 * CPU build. Every function here is called by both, with the same arguments in the same order,
 * so the GPU computes bit for bit what the CPU build computes (see common/df2Common.h: explicit
 * round-to-nearest operations, no compiler contraction).
 *
 * The operator is the Gated DeltaNet of Qwen3.5 (transformers' qwen3_5 modeling, with
 * use_qk_l2norm_in_kernel=True), per request, per value head h reading key head h / (Hv/Hk):
 *
 *   xc[t]   = round(silu(round(sum_j w[c, j] * x[t - (K-1) + j])))    causal depthwise conv,
 *             positions < 0 read the request's conv state (the K-1 previous raw inputs)
 *   q, k, v = split(xc[t]);  qh = l2norm(q) * Dk^-0.5;  kh = l2norm(k)        (fp32)
 *   beta    = round(sigmoid(b));  g = -exp(A_log) * softplus(a + dt_bias)      (fp32)
 *   S       = S * exp(g);  S += kh (beta (v - S^T kh))^T;  y = S^T qh         (per token)
 *
 * "round" is a rounding to the activation dtype, where transformers rounds (the conv and the
 * silu run in the model dtype there; beta = b.sigmoid() too). S is [Dk, Dv] fp32 per head.
 *
 * Two formulations of the same recurrence:
 *   - per token (gdnSliceDecayDot / gdnDelta / gdnSliceUpdate / gdnSliceDot): the reference, used
 *     for generation (verify) requests and for context requests when chunk_size = 0; the deferred
 *     commit folds a verify token's record into the state with gdnSliceFold (the same step's state
 *     update, from the delta the verify computed). Mirrors torch_recurrent_gated_delta_rule step for step, with the sums over
 *     Dk and the update as fused multiply-adds (4 operations per state value and token: decay,
 *     S^T k, S += k delta, S^T q; torch rounds each product and sums in its own order, which is
 *     where the two differ).
 *   - chunked (gdnChunk*): transformers' torch_chunk_gated_delta_rule (the UT transform: within a
 *     chunk, cumulative decays gam, the strictly lower system A, U = (I+A)^-1 (v beta),
 *     W = (I+A)^-1 (k beta exp(gam)), then v_new = U - W S, y = exp(gam) q S + (QK o decay) v_new,
 *     S = S exp(gam_last) + sum_s k_s exp(gam_last - gam_s) v_new_s). Sums are fused
 *     multiply-adds in index order (BLAS-like); a partial last chunk is exactly transformers'
 *     zero padding (padded tokens have g = 0, beta = 0, k = v = 0).
 *
 * Every column j of S evolves independently given (qh, kh, g, beta): a few CUDA lanes own one
 * column (its Dk values in registers, in slices, see gdnSplit) and the CPU build loops over
 * columns and slices, calling the same functions in the same order.
 *
 * Silent failure modes named here because nothing would crash:
 *   - value head h reads key head h / (Hv / Hk) (repeat_interleave), not h % Hk;
 *   - the conv state rows are oldest first (row K-2 is the newest raw input);
 *   - exp(g) is the decay, g <= 0: feeding softplus's argument or A_log itself gives garbage;
 *   - q is scaled by Dk^-0.5 AFTER the l2norm; forgetting it only blurs the output.
 */
#pragma once

#include "../common/df2Common.h"

// Loop unrolling hints for the device pass only (g++, also as nvcc's host compiler, rejects
// unknown pragmas under -Wall -Werror). A state slice s[kSlice] must stay in registers on the
// GPU: every loop over it is fully unrolled.
#if defined(__CUDA_ARCH__)
#define GDN_UNROLL _Pragma("unroll")
#define GDN_NO_UNROLL _Pragma("unroll 1")
#else
#define GDN_UNROLL
#define GDN_NO_UNROLL
#endif

namespace dflash2
{

constexpr float kGdnL2NormEps = 1e-6f;        //!< transformers' l2norm eps (FLA's)
constexpr float kGdnSoftplusThreshold = 20.0f; //!< F.softplus: x above it returns x

//! Correctly rounded sqrt (IEEE on both sides: __fsqrt_rn, and sqrtf on the host).
DF2_HD float sqrtRn(float x)
{
#if defined(__CUDA_ARCH__)
    return __fsqrt_rn(x);
#else
    return std::sqrt(x);
#endif
}

//! Natural log of a finite x >= 1 (all this file needs), from mulRn/addRn/divRn only:
//! x = 2^e m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh((m-1)/(m+1)) by its odd series.
//! Relative error < 2 ulp.
DF2_HD float gdnLogRn(float x)
{
    uint32_t const bits = floatBits(x);
    int32_t e = static_cast<int32_t>((bits >> 23) & 0xffu) - 127;
    float m = bitsFloat((bits & 0x7fffffu) | 0x3f800000u); // [1, 2)
    if (m > 1.41421356f)
    {
        m = mulRn(m, 0.5f); // exact
        e += 1;
    }
    float const f = divRn(subRn(m, 1.0f), addRn(m, 1.0f)); // |f| <= 0.1716
    float const f2 = mulRn(f, f);
    float p = 7.69230769e-2f;                // 1/13
    p = addRn(mulRn(p, f2), 9.09090909e-2f); // 1/11
    p = addRn(mulRn(p, f2), 1.11111111e-1f); // 1/9
    p = addRn(mulRn(p, f2), 1.42857143e-1f); // 1/7
    p = addRn(mulRn(p, f2), 2.0e-1f);        // 1/5
    p = addRn(mulRn(p, f2), 3.33333333e-1f); // 1/3
    p = addRn(mulRn(p, f2), 1.0f);
    float const r = mulRn(mulRn(2.0f, f), p);
    float const kLn2Hi = 0.693145751953125f; // 16 significant bits: e * kLn2Hi is exact
    float const kLn2Lo = 1.42860682030941723212e-6f;
    float const ef = static_cast<float>(e);
    return addRn(mulRn(ef, kLn2Hi), addRn(mulRn(ef, kLn2Lo), r));
}

//! log(1 + e) for e >= 0 (Goldberg: log(u) * e / (u - 1) with u = 1 + e rounded; u - 1 is exact).
DF2_HD float gdnLog1pRn(float e)
{
    float const u = addRn(1.0f, e);
    if (u == 1.0f)
        return e;
    return mulRn(gdnLogRn(u), divRn(e, subRn(u, 1.0f)));
}

//! F.softplus(x) with beta = 1, threshold = 20.
DF2_HD float gdnSoftplus(float x)
{
    return x > kGdnSoftplusThreshold ? x : gdnLog1pRn(expRn(x));
}

DF2_HD float gdnSigmoid(float x)
{
    return divRn(1.0f, addRn(1.0f, expRn(-x)));
}

DF2_HD float gdnSilu(float x)
{
    return divRn(x, addRn(1.0f, expRn(-x)));
}

//! g = -exp(A_log) * softplus(a + dt_bias), all fp32 (transformers: a.float() + dt_bias).
DF2_HD float gdnDecayLog(float a, float dtBias, float aLog)
{
    return mulRn(-expRn(aLog), gdnSoftplus(addRn(a, dtBias)));
}

//! beta = b.sigmoid() in the activation dtype, widened to fp32.
template <class T>
DF2_HD float gdnBeta(typename T::Storage b)
{
    return T::load(T::store(gdnSigmoid(T::load(b))));
}

//! Causal depthwise conv of channel c at request position p, fp32, taps oldest first:
//! sum_j w[c, j] * x[p - (K-1) + j]; positions < 0 read the conv state [K-1, C] (row m holds
//! position m - (K-1)), or zeros when state is null (a sequence's first chunk: transformers'
//! zero padding). x points at the request's row 0; rows are rowStride elements apart.
//! Tap j of the conv sum (taps in order, oldest first): tap 0's product starts the sum.
DF2_HD float gdnConvTap(float acc, float w, float x, int32_t j)
{
    float const prod = mulRn(w, x);
    return (j == 0) ? prod : addRn(acc, prod);
}

template <class T>
DF2_HD float gdnConvRaw(typename T::Storage const* x, int64_t rowStride, typename T::Storage const* state,
    int64_t convDim, typename T::Storage const* w, int32_t kc, int32_t p, int64_t c)
{
    float acc = 0.0f;
    for (int32_t j = 0; j < kc; ++j)
    {
        int32_t const pos = p - (kc - 1) + j;
        float const xv = pos >= 0 ? T::load(x[static_cast<int64_t>(pos) * rowStride + c])
            : (state != nullptr ? T::load(state[static_cast<int64_t>(pos + kc - 1) * convDim + c]) : 0.0f);
        acc = gdnConvTap(acc, T::load(w[c * kc + j]), xv, j);
    }
    return acc;
}

//! xc = round(silu(round(conv))) from the fp32 conv sum: transformers runs F.conv1d and the silu
//! in the model dtype.
template <class T>
DF2_HD typename T::Storage gdnSiluOfConv(float conv)
{
    return T::store(gdnSilu(T::load(T::store(conv))));
}

template <class T>
DF2_HD typename T::Storage gdnConvSilu(typename T::Storage const* x, int64_t rowStride,
    typename T::Storage const* state, int64_t convDim, typename T::Storage const* w, int32_t kc, int32_t p, int64_t c)
{
    return gdnSiluOfConv<T>(gdnConvRaw<T>(x, rowStride, state, convDim, w, kc, p, c));
}

//! The l2norm's sum of squares is taken in groups of kGdnNormGroup consecutive values (fused
//! multiply-adds in index order, from 0), and the Dk / kGdnNormGroup group sums are combined by
//! the pairwise tree of gdnCombine: ((g0 + g1) + (g2 + g3)) + ... On the GPU a thread holds one
//! group (four channels) and the tree is a butterfly of shuffles over the head's threads.
constexpr int32_t kGdnNormGroup = 4;

//! One group's sum of squares (v: kGdnNormGroup values, widened).
DF2_HD float gdnSquaresGroup(float const* v)
{
    float acc = 0.0f;
GDN_UNROLL
    for (int32_t i = 0; i < kGdnNormGroup; ++i)
        acc = fmaRn(v[i], v[i], acc);
    return acc;
}

//! 1 / sqrt(sum + eps) from the combined sum of squares.
DF2_HD float gdnL2NormInvOfSum(float sum)
{
    return divRn(1.0f, sqrtRn(addRn(sum, kGdnL2NormEps)));
}

//! l2norm, first part: 1 / sqrt(sum x^2 + eps) over kDk values (kDk / kGdnNormGroup groups,
//! combined pairwise; the loops are unrolled so that the group sums stay in registers).
template <int32_t kDk, class T>
DF2_HD float gdnL2NormInvDk(typename T::Storage const* in)
{
    constexpr int32_t kGroups = kDk / kGdnNormGroup;
    float part[kGroups];
GDN_UNROLL
    for (int32_t l = 0; l < kGroups; ++l)
    {
        float v[kGdnNormGroup];
GDN_UNROLL
        for (int32_t i = 0; i < kGdnNormGroup; ++i)
            v[i] = T::load(in[l * kGdnNormGroup + i]);
        part[l] = gdnSquaresGroup(v);
    }
GDN_UNROLL
    for (int32_t off = 1; off < kGroups; off *= 2)
    {
GDN_UNROLL
        for (int32_t l = 0; l + off < kGroups; l += 2 * off)
            part[l] = addRn(part[l], part[l + off]);
    }
    return gdnL2NormInvOfSum(part[0]);
}

//! The same for a runtime dk in {16, 32, 64, 128}.
template <class T>
DF2_HD float gdnL2NormInv(typename T::Storage const* in, int32_t dk)
{
    switch (dk)
    {
    case 16: return gdnL2NormInvDk<16, T>(in);
    case 32: return gdnL2NormInvDk<32, T>(in);
    case 64: return gdnL2NormInvDk<64, T>(in);
    default: return gdnL2NormInvDk<128, T>(in);
    }
}

//! l2norm, second part, per value: x * inv (* scale when scale != 0).
DF2_HD float gdnL2NormApply(float x, float inv, float scale)
{
    float const v = mulRn(x, inv);
    return scale != 0.0f ? mulRn(v, scale) : v;
}

//! out = l2norm(in) (* scale when scale != 0): x * (1 / sqrt(sum x^2 + eps)), the sum in index
//! order; the q scale Dk^-0.5 is a separate multiply, as in transformers.
template <class T>
DF2_HD void gdnL2Normalize(typename T::Storage const* in, float* out, int32_t dk, float scale)
{
    float const inv = gdnL2NormInv<T>(in, dk);
    for (int32_t i = 0; i < dk; ++i)
        out[i] = gdnL2NormApply(T::load(in[i]), inv, scale);
}

//! Number of tokens a commit advances request r over: num_accepted clamped to [0, min(tokens, Kv)].
DF2_HD int32_t gdnCommitCount(int32_t numAccepted, int32_t tokens, int32_t maxVerify)
{
    int32_t const cap = tokens < maxVerify ? tokens : maxVerify;
    int32_t const n = numAccepted < cap ? numAccepted : cap;
    return n > 0 ? n : 0;
}

// ---------------------------------------------------------------------------------------------
// State columns in slices. Column j of S (Dk values) is held by kSplit = kGdnSplit<Dk> lanes of
// kSlice = Dk / kSplit values each (GPU: consecutive lanes of one warp; CPU: a loop). A sum over
// Dk is computed per slice in index order, then the kSplit partial sums are combined by the
// pairwise tree of gdnCombine, which is exactly what a butterfly of __shfl_xor_sync additions
// leaves in every lane (IEEE addition commutes). Slices of 32 keep a thread's state, k and q
// values in registers for Dk = 128 (one 128-value column per thread spills).
// ---------------------------------------------------------------------------------------------
template <int32_t kDk>
constexpr int32_t kGdnSplit = kDk > 32 ? kDk / 32 : 1;

constexpr int32_t kGdnMaxSplit = 4;

//! ((p0 + p1) + (p2 + p3)) for kSplit = 4, p0 + p1 for 2, p0 for 1.
template <int32_t kSplit>
DF2_HD float gdnCombine(float const* partial)
{
    float a[kSplit];
GDN_UNROLL
    for (int32_t l = 0; l < kSplit; ++l)
        a[l] = partial[l];
GDN_UNROLL
    for (int32_t off = 1; off < kSplit; off *= 2)
    {
GDN_UNROLL
        for (int32_t l = 0; l + off < kSplit; l += 2 * off)
            a[l] = addRn(a[l], a[l + off]);
    }
    return a[0];
}

//! Element access by runtime dtype (the column kernels are instantiated per Dk only).
DF2_HD float gdnLoad(DType t, void const* base, int64_t i)
{
    if (t == DType::kFLOAT16)
        return F16::load(static_cast<uint16_t const*>(base)[i]);
    if (t == DType::kBFLOAT16)
        return BF16::load(static_cast<uint16_t const*>(base)[i]);
    return static_cast<float const*>(base)[i];
}

DF2_HD void gdnStore(DType t, void* base, int64_t i, float v)
{
    if (t == DType::kFLOAT16)
        static_cast<uint16_t*>(base)[i] = F16::store(v);
    else if (t == DType::kBFLOAT16)
        static_cast<uint16_t*>(base)[i] = BF16::store(v);
    else
        static_cast<float*>(base)[i] = v;
}

//! Per-token step, first half, on one slice: S *= exp(g); returns the slice's part of S^T k
//! (fused multiply-adds in index order, as the chunked formulation's sums).
template <int32_t kSlice>
DF2_HD float gdnSliceDecayDot(float* s, float const* k, float decay)
{
    float acc = 0.0f;
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
    {
        s[i] = mulRn(s[i], decay);
        acc = fmaRn(s[i], k[i], acc);
    }
    return acc;
}

//! delta = (v - S^T k) beta, from the combined S^T k.
DF2_HD float gdnDelta(float v, float kv, float beta)
{
    return mulRn(subRn(v, kv), beta);
}

//! Per-token step, second half, on one slice: S += k delta (one fused multiply-add per value).
template <int32_t kSlice>
DF2_HD void gdnSliceUpdate(float* s, float const* k, float delta)
{
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
        s[i] = fmaRn(k[i], delta, s[i]);
}

//! The deferred commit's fold of one verify record into one slice: S = S * exp(g); S += k delta, i.e.
//! gdnSliceDecayDot's state update followed by gdnSliceUpdate, the operations (and the roundings) of the
//! per-token step that produced delta, without the S^T k the record already holds.
template <int32_t kSlice>
DF2_HD void gdnSliceFold(float* s, float const* k, float decay, float delta)
{
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
        s[i] = fmaRn(k[i], delta, mulRn(s[i], decay));
}

//! The slice's part of S^T q (fused multiply-adds in index order).
template <int32_t kSlice>
DF2_HD float gdnSliceDot(float const* s, float const* q)
{
    float acc = 0.0f;
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
        acc = fmaRn(s[i], q[i], acc);
    return acc;
}

// ---------------------------------------------------------------------------------------------
// Chunked formulation. Per-token workspace rows (one per token and value head):
//   gam [Hv]          cumulative log decay inside the token's chunk
//   A   [Hv][chunk]   row p: A[p][s] for s < p (strictly lower UT system)
//   QK  [Hv][chunk]   row p: (qh_p . kh_s) exp(gam_p - gam_s) for s <= p
//   U   [Hv][Dv]      (I + A)^-1 (v beta), overwritten by v_new = U - W S in the scan
//   W   [Hv][Dk]      (I + A)^-1 (kh beta exp(gam))
// ---------------------------------------------------------------------------------------------

//! gam[p] = g[0] + ... + g[p] in index order (torch.cumsum) for the m tokens of one chunk.
DF2_HD void gdnChunkCumDecay(float const* g, int64_t gateStride, int32_t m, float* gam, int64_t gamStride)
{
    float acc = 0.0f;
    for (int32_t p = 0; p < m; ++p)
    {
        acc = addRn(acc, g[p * gateStride]);
        gam[p * gamStride] = acc;
    }
}

//! A[p][s] (s < p) = ((kh_p beta_p) . kh_s) * exp(gam_p - gam_s)   (transformers' ut_system).
DF2_HD float gdnChunkAEntry(float const* kp, float const* ks, float betaP, float gamP, float gamS, int32_t dk)
{
    float acc = 0.0f;
    for (int32_t i = 0; i < dk; ++i)
        acc = fmaRn(mulRn(kp[i], betaP), ks[i], acc);
    return mulRn(acc, expRn(subRn(gamP, gamS)));
}

//! QK[p][s] (s <= p) = (qh_p . kh_s) * exp(gam_p - gam_s)   (transformers' intra_chunk_attn).
DF2_HD float gdnChunkQKEntry(float const* qp, float const* ks, float gamP, float gamS, int32_t dk)
{
    float acc = 0.0f;
    for (int32_t i = 0; i < dk; ++i)
        acc = fmaRn(qp[i], ks[i], acc);
    return mulRn(acc, expRn(subRn(gamP, gamS)));
}

//! Right-hand sides of the UT solve for one chunk row: v beta (U columns) and kh beta exp(gam)
//! (W columns), as transformers forms v_beta and decayed_k_beta.
DF2_HD float gdnChunkRhsU(float v, float beta)
{
    return mulRn(v, beta);
}

DF2_HD float gdnChunkRhsW(float k, float beta, float gam)
{
    return mulRn(mulRn(k, beta), expRn(gam));
}

//! In place forward substitution of one column x (its m chunk rows hold the right-hand side):
//! x[p] = x[p] - sum_{s<p} A[p][s] x[s]  ((I + A) x = rhs, unit diagonal).
DF2_HD void gdnChunkSolveColumn(float const* a, int64_t aStride, int32_t m, float* x, int64_t xStride)
{
    for (int32_t p = 1; p < m; ++p)
    {
        float const* ap = a + p * aStride;
        float acc = 0.0f;
        for (int32_t s = 0; s < p; ++s)
            acc = fmaRn(ap[s], x[s * xStride], acc);
        x[p * xStride] = subRn(x[p * xStride], acc);
    }
}

// Chunked scan, per chunk of m tokens and one state column (slices as above):
//   v_new[p] = U[p] - sum_i W[p][i] S[i]                       (gdnSliceFmaDot, combined)
//   y[p]     = sum_i (qh[p][i] exp(gam[p])) S[i]               (gdnSliceDecayedDot, combined)
//              + sum_{t<=p} QK[p][t] v_new[t]                  (gdnChunkIntra)
//   S        = S exp(gam_last), then S += (kh[p] exp(gam_last - gam[p])) v_new[p] for p in order
//                                                              (gdnSliceScale, gdnSliceChunkUpdate)
// S is read at the chunk start for v_new and y; the update is accumulated into the decayed state.

//! The slice's part of w . S (fused multiply-adds in index order).
template <int32_t kSlice>
DF2_HD float gdnSliceFmaDot(float const* s, float const* w)
{
    float acc = 0.0f;
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
        acc = fmaRn(w[i], s[i], acc);
    return acc;
}

//! The slice's part of (q exp(gam)) . S.
template <int32_t kSlice>
DF2_HD float gdnSliceDecayedDot(float const* s, float const* q, float e)
{
    float acc = 0.0f;
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
        acc = fmaRn(mulRn(q[i], e), s[i], acc);
    return acc;
}

//! sum_{t<=p} QK[p][t] v_new[t] (vnew[t] at vnew[t * vStride]).
DF2_HD float gdnChunkIntra(float const* qkp, float const* vnew, int64_t vStride, int32_t p)
{
    float acc = 0.0f;
    for (int32_t t = 0; t <= p; ++t)
        acc = fmaRn(qkp[t], vnew[t * vStride], acc);
    return acc;
}

template <int32_t kSlice>
DF2_HD void gdnSliceScale(float* s, float d)
{
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
        s[i] = mulRn(s[i], d);
}

//! S += (k exp(gam_last - gam_p)) v_new[p] on one slice (f = exp(gam_last - gam_p)).
template <int32_t kSlice>
DF2_HD void gdnSliceChunkUpdate(float* s, float const* k, float f, float vn)
{
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
        s[i] = fmaRn(mulRn(k[i], f), vn, s[i]);
}

} // namespace dflash2
