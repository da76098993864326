/*
 * DFlash2DynamicConv: the kernel's per-thread body as a __host__ __device__ function. The CUDA
 * kernel (dynamicConvKernel.cu) calls it once per (column vector, token strip); the host
 * emulation test (tests/plugins/kernel_emulation.cpp) calls it for every pair on the CPU, so the
 * kernel's indexing (strips, the block-boundary rule, tails, 16-byte alignment) is checked bit for
 * bit against the CPU build without a GPU. Arithmetic: only dynamicConvMath.h's functions, in the
 * CPU build's order (dynamicConvElement).
 *
 * One thread = one 16-byte vector of channels (N = 8 fp16/bf16 or 4 fp32) x one strip of up to
 * kTok consecutive tokens of ONE draft block (strips never cross a block boundary). All loads of
 * the strip (x, the previous taps' x that lie inside the block, delta, residual) are issued before
 * the first use; tap j of token i reads x[i - j] from registers (the strip's own tokens, or the
 * K-1 tokens before the strip when the strip starts inside a block). A tap that would cross the
 * block boundary is skipped, exactly as the CPU build's loop breaks (a zero x would not do: -0 + +0
 * and inf * 0 differ in the last bit). Index math is 32-bit except one 64-bit row offset per strip.
 */
#pragma once

#include "dynamicConvMath.h"
#include "dynamicConvParams.h"

#if !defined(__CUDA_ARCH__)
#include <cassert>
#endif

// nvcc also compiles the __host__ __device__ body for the host, where g++ does not know the pragma.
#if defined(__CUDA_ARCH__)
#define DF2_CONV_UNROLL _Pragma("unroll")
#else
#define DF2_CONV_UNROLL
#endif

namespace dflash2
{

//! Shape of one launch as the kernel body sees it (32-bit where the launcher checked it fits).
struct DynamicConvShape
{
    int64_t tokens{0};
    int32_t hidden{0};
    int32_t groups{0};       //!< H / G
    int32_t kernelSize{0};
    int32_t groupSize{0};
    int32_t blockSize{0};
    int32_t stripsPerBlock{0}; //!< ceil(blockSize / kTok)
    int32_t vecPerRow{0};      //!< H / N
    int32_t strips{0};         //!< number of blocks * stripsPerBlock
};

//! 16 bytes of storage as four 32-bit words (eight fp16/bf16 values, little-endian pairs, or four
//! fp32 values): the kernel keeps x in this form so that a vector costs four registers.
struct alignas(16) ConvRaw
{
    uint32_t w[4];
};

//! Element e of a 16-byte vector, converted with T::load (bit-identical to loading it alone).
template <class T>
DF2_HD float convElem(ConvRaw const& r, int e)
{
    if constexpr (sizeof(typename T::Storage) == 2)
        return T::load(static_cast<typename T::Storage>((r.w[e >> 1] >> (16 * (e & 1))) & 0xffffu));
    else
        return T::load(bitsFloat(r.w[e]));
}

//! The 16-byte vector of T::store(v[0..N)).
template <class T, int N>
DF2_HD ConvRaw convPack(float const (&v)[N])
{
    ConvRaw r;
    if constexpr (sizeof(typename T::Storage) == 2)
    {
        DF2_CONV_UNROLL
        for (int k = 0; k < 4; ++k)
            r.w[k] = static_cast<uint32_t>(T::store(v[2 * k])) | (static_cast<uint32_t>(T::store(v[2 * k + 1])) << 16);
    }
    else
    {
        DF2_CONV_UNROLL
        for (int k = 0; k < 4; ++k)
            r.w[k] = floatBits(T::store(v[k]));
    }
    return r;
}

//! Four fp32 values (the fused residual and output), 16-byte aligned like CUDA's float4.
struct alignas(16) ConvF4
{
    float x, y, z, w;
};

//! 16-byte loads and store. Device: one vector instruction each; the streamed inputs (x, delta,
//! residual) use ld.global.cg/.cs, which ptxas keeps ahead of the strip's first store (it may
//! sink read-only .nc loads down to their uses, and did), so every load of a strip is in flight
//! before the first result is computed. Host (the emulation test): the same bytes, and an
//! assertion that the address is 16-byte aligned (a misaligned vector access faults on the GPU).
DF2_HD ConvRaw convLoadX(void const* p)
{
#if defined(__CUDA_ARCH__)
    uint4 const v = __ldcg(static_cast<uint4 const*>(p));
    return ConvRaw{{v.x, v.y, v.z, v.w}};
#else
    assert((reinterpret_cast<uintptr_t>(p) & 15u) == 0 && "16-byte vector load misaligned");
    ConvRaw v;
    std::memcpy(&v, p, sizeof(v));
    return v;
#endif
}

DF2_HD ConvRaw convLoadBase(void const* p)
{
#if defined(__CUDA_ARCH__)
    uint4 const v = __ldg(static_cast<uint4 const*>(p));
    return ConvRaw{{v.x, v.y, v.z, v.w}};
#else
    return convLoadX(p);
#endif
}

DF2_HD ConvF4 convLoadResidual(float const* p)
{
#if defined(__CUDA_ARCH__)
    float4 const v = __ldcs(reinterpret_cast<float4 const*>(p));
    return ConvF4{v.x, v.y, v.z, v.w};
#else
    assert((reinterpret_cast<uintptr_t>(p) & 15u) == 0 && "16-byte vector load misaligned");
    ConvF4 v;
    std::memcpy(&v, p, sizeof(v));
    return v;
#endif
}

template <class S>
DF2_HD S convLoadDelta(S const* p)
{
#if defined(__CUDA_ARCH__)
    return __ldcg(p);
#else
    return *p;
#endif
}

template <class V>
DF2_HD void convStore16(void* p, V const& v)
{
#if defined(__CUDA_ARCH__)
    *static_cast<V*>(p) = v;
#else
    assert((reinterpret_cast<uintptr_t>(p) & 15u) == 0 && "16-byte vector store misaligned");
    std::memcpy(p, &v, sizeof(V));
#endif
}

//! kTaps > 0: the published shape. Exactly kTaps taps, every 16-byte vector inside one group
//! (G % N == 0: one delta value per token and tap) and whole strips (block_size % kTok == 0,
//! tokens % block_size == 0): the launcher guarantees all three, so nothing but the
//! block-boundary rule is tested per token. kTaps == 0: the generic path, 1 <= kernelSize <= 4
//! taps at run time, a group index per element (any G that divides H) and partial strips.
template <class T, bool kFuse, int kTaps, int kTok>
DF2_HD void dynamicConvStrip(typename T::Storage const* __restrict__ x, typename T::Storage const* __restrict__ delta,
    typename T::Storage const* __restrict__ base, float const* __restrict__ residual, void* __restrict__ out,
    DynamicConvShape const& sh, int32_t cv, int32_t strip)
{
    using S = typename T::Storage;
    constexpr int N = 16 / static_cast<int>(sizeof(S));
    constexpr bool kFixed = kTaps > 0;
    constexpr int kMaxTaps = kFixed ? kTaps : kDynamicConvMaxKernelSize;
    constexpr int kW = kMaxTaps - 1; // previous tokens a strip's first token may need

    int32_t const H = sh.hidden;
    int32_t const K = kFixed ? kTaps : sh.kernelSize;
    int32_t const blk = strip / sh.stripsPerBlock;
    int32_t const posStart = (strip - blk * sh.stripsPerBlock) * kTok; // position in the block of token 0
    int64_t const t0 = static_cast<int64_t>(blk) * sh.blockSize + posStart;
    int32_t len = kTok;
    if constexpr (!kFixed)
    {
        if (sh.blockSize - posStart < len)
            len = sh.blockSize - posStart;
        if (sh.tokens - t0 < len) // whole blocks only (validated); never touch a token past the last
            len = static_cast<int32_t>(sh.tokens - t0);
    }
    int32_t const c0 = cv * N;
    int32_t const g0 = c0 / sh.groupSize;

    S const* const xs = x + t0 * H + c0;
    S const* const ds = delta + t0 * K * sh.groups + g0;

    // ---- every load of the strip, before any use ------------------------------------------------
    // xw[kW + i] = x[t0 + i]; xw[kW - j] = x[t0 - j] when that token is inside the block.
    ConvRaw xw[kW + kTok];
    DF2_CONV_UNROLL
    for (int j = 1; j <= kW; ++j)
    {
        xw[kW - j] = ConvRaw{};
        if (j < K && j <= posStart)
            xw[kW - j] = convLoadX(xs - j * H);
    }
    DF2_CONV_UNROLL
    for (int i = 0; i < kTok; ++i)
    {
        if (kFixed || i < len)
            xw[kW + i] = convLoadX(xs + i * H);
        else
            xw[kW + i] = ConvRaw{};
    }
    // delta: the fixed path's one value per (token, tap); the generic path reads per element below.
    S dv[kFixed ? kTok : 1][kMaxTaps];
    DF2_CONV_UNROLL
    for (int i = 0; i < (kFixed ? kTok : 1); ++i)
        DF2_CONV_UNROLL
        for (int j = 0; j < kMaxTaps; ++j)
            dv[i][j] = kFixed ? convLoadDelta(ds + (i * K + j) * sh.groups) : S{};
    ConvF4 rv[kFuse ? kTok : 1][kFuse ? N / 4 : 1];
    if constexpr (kFuse)
    {
        float const* const rs = residual + t0 * H + c0;
        DF2_CONV_UNROLL
        for (int i = 0; i < kTok; ++i)
            DF2_CONV_UNROLL
            for (int q = 0; q < N / 4; ++q)
            {
                if (kFixed || i < len)
                    rv[i][q] = convLoadResidual(rs + i * H + 4 * q);
                else
                    rv[i][q] = ConvF4{0.0f, 0.0f, 0.0f, 0.0f};
            }
    }
    float bf[kMaxTaps][N]; // the base kernel, converted once per thread
    DF2_CONV_UNROLL
    for (int j = 0; j < kMaxTaps; ++j)
    {
        ConvRaw b{};
        if (j < K)
            b = convLoadBase(base + j * H + c0);
        DF2_CONV_UNROLL
        for (int e = 0; e < N; ++e)
        {
            bf[j][e] = convElem<T>(b, e);
#if defined(__CUDA_ARCH__)
            asm("" : "+f"(bf[j][e])); // keep the converted value: no re-conversion per token
#endif
        }
    }
    int32_t gOff[kFixed ? 1 : N]; // generic path: group of element e relative to g0
    DF2_CONV_UNROLL
    for (int e = 0; e < (kFixed ? 1 : N); ++e)
        gOff[e] = kFixed ? 0 : (c0 + e) / sh.groupSize - g0;

    // ---- compute and store: dynamicConvElement's operations in its order, tap by tap ------------
    DF2_CONV_UNROLL
    for (int i = 0; i < kTok; ++i)
    {
        if (!kFixed && i >= len)
            break;
        int32_t const pos = posStart + i;
        float acc[N];
        DF2_CONV_UNROLL
        for (int e = 0; e < N; ++e)
            acc[e] = 0.0f; // always overwritten by tap 0 (K >= 1, and tap 0 is inside every block)
        DF2_CONV_UNROLL
        for (int j = 0; j < kMaxTaps; ++j)
        {
            // Tap j is inside the block iff pos >= j; pos = posStart + i >= i, so only i < j needs
            // the run-time test. The CPU loop breaks at the first tap outside (later ones are
            // outside too). Fixed path: such a tap is computed and its result discarded by a select
            // (no branch, so its loads stay in flight with the others); generic path: a branch.
            bool const inBlock = i >= j || convTapInBlock(pos, j);
            if (!kFixed && (j >= K || !inBlock))
                break;
            ConvRaw const& xv = xw[kW + i - j];
            DF2_CONV_UNROLL
            for (int e = 0; e < N; ++e)
            {
                float const d = kFixed ? T::load(dv[kFixed ? i : 0][j])
                                       : T::load(convLoadDelta(ds + (i * K + j) * sh.groups + gOff[kFixed ? 0 : e]));
                float const coef = convCoefficient(bf[j][e], d);
                float const xf = convElem<T>(xv, e);
                if (j == 0)
                    acc[e] = convFirstTap(coef, xf);
                else
                {
                    float const next = convNextTap(acc[e], coef, xf);
                    acc[e] = inBlock ? next : acc[e];
                }
            }
        }
        if constexpr (kFuse)
        {
            float* const o = static_cast<float*>(out) + (t0 + i) * H + c0;
            DF2_CONV_UNROLL
            for (int q = 0; q < N / 4; ++q)
            {
                ConvF4 ov;
                ov.x = convResidual(rv[i][q].x, acc[4 * q + 0]);
                ov.y = convResidual(rv[i][q].y, acc[4 * q + 1]);
                ov.z = convResidual(rv[i][q].z, acc[4 * q + 2]);
                ov.w = convResidual(rv[i][q].w, acc[4 * q + 3]);
                convStore16(o + 4 * q, ov);
            }
        }
        else
        {
            convStore16(static_cast<S*>(out) + (t0 + i) * H + c0, convPack<T, N>(acc));
        }
    }
}

// ---- launch plan (host side of dynamicConvKernel.cu; the emulation test uses the same) ---------
// Tokens per thread (one strip): the published path holds its strip's x, delta (and residual)
// in registers, all loads in flight before the first use.
constexpr int kConvTokFixed = 8;      // K 2, unfused: 9 x vectors + 16 deltas in flight per thread
constexpr int kConvTokFixedFused = 4; // K 2, fused: the fp32 residual takes twice the registers per token
constexpr int kConvTokGeneric = 4;    // K <= 4, any G: per-element delta loads

//! The published path applies: two taps, every 16-byte vector of N channels inside one group,
//! and whole strips (block_size a multiple of the strip length, whole blocks).
inline bool dynamicConvFixedPath(DynamicConvParams const& p, int32_t N)
{
    auto const& a = p.attrs;
    int32_t const tok = a.fuseResidual ? kConvTokFixedFused : kConvTokFixed;
    return a.kernelSize == 2 && a.groupSize % N == 0 && a.blockSize % tok == 0 && p.tokens % a.blockSize == 0;
}

//! The body's view of a launch with kTok tokens per strip; every (cv < vecPerRow, strip < strips)
//! pair is one call of dynamicConvStrip.
inline DynamicConvShape dynamicConvShape(DynamicConvParams const& p, int32_t N, int32_t kTok)
{
    DynamicConvShape sh;
    sh.tokens = p.tokens;
    sh.hidden = static_cast<int32_t>(p.hidden);
    sh.groups = static_cast<int32_t>(p.groups);
    sh.kernelSize = p.attrs.kernelSize;
    sh.groupSize = p.attrs.groupSize;
    sh.blockSize = p.attrs.blockSize;
    sh.stripsPerBlock = (sh.blockSize + kTok - 1) / kTok;
    sh.vecPerRow = sh.hidden / N;
    int64_t const blocks = (p.tokens + sh.blockSize - 1) / sh.blockSize;
    sh.strips = static_cast<int32_t>(blocks * sh.stripsPerBlock); // < 2^31: checked by the launcher
    return sh;
}

} // namespace dflash2
