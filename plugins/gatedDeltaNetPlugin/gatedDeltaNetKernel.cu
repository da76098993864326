#include "gatedDeltaNetKernel.h"
#include "gatedDeltaNetMath.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

/*
 * Every kernel is a thin index mapping around one function of gatedDeltaNetMath.h, which the CPU
 * build (gatedDeltaNetCpu.cpp) calls in the same order, so the GPU computes bit for bit what the
 * CPU build computes. Row space: the packed tokens (request r owns rows [cu[r], cu[r+1])); the
 * commit's verify rows are the B x Kv rows of verify_qkv (request r owns rows [r Kv, r Kv + Kv)).
 * A state column (Dk fp32 values) lives in the registers of kGdnSplit lanes (kDk is a template
 * argument), for all the tokens of a call.
 *
 * Deferred commit (GdnSlotLayout, gatedDeltaNetParams.h): a slot holds the state as of the last fold
 * and the records of the last verify (delta, keys, decay) with a pending count. Every kernel that
 * reads a state (the per-token recurrence, the chunk scan) loads it once, folds the pending records
 * in (gdnSliceFold), proceeds, and writes it once. The verify writes its delta records; the conv
 * state kernel, which runs after every reader of the old records, writes the keys / decay records
 * and sets the pending counts to 0; the commit sets them to the accepted counts.
 *
 * The sequences: forward = prologue (conv + silu + q/k l2norm + gates, one launch), per-token
 * recurrence (generation requests; context requests when chunk_size = 0), chunk matrices / solve /
 * scan (context requests), conv state and records. Commit = the conv state kernel alone (conv state
 * of the accepted tokens, pending and committed counts). launchGdnConv / QkNorm / Gates remain as
 * separate stages with the same results (the fused prologue's parts, unfused).
 */

namespace dflash2
{
namespace
{

constexpr int kColumnThreads = 128; // recurrence / scan: 128 / kSplit state columns per block
constexpr int kElemThreads = 128;  // conv, norms, gates, conv state
constexpr int kMatrixThreads = 128;
constexpr int kSolveThreads = 64;

//! Request owning packed row `row` (< T): the last r with cu[r] <= row (empty requests skipped).
//! One lane's slice of a staged key / query vector (kSlice floats as float4s in shared memory) into registers.
template <int32_t kSlice>
__device__ __forceinline__ void gdnLoadSlice(float (&dst)[kSlice], float4 const* src)
{
GDN_UNROLL
    for (int32_t i4 = 0; i4 < kSlice / 4; ++i4)
    {
        float4 const v = src[i4];
        dst[4 * i4] = v.x;
        dst[4 * i4 + 1] = v.y;
        dst[4 * i4 + 2] = v.z;
        dst[4 * i4 + 3] = v.w;
    }
}

__device__ __forceinline__ int32_t requestOfRow(int32_t const* cu, int32_t batch, int64_t row)
{
    int32_t lo = 0;
    int32_t hi = batch;
    while (hi - lo > 1)
    {
        int32_t const mid = (lo + hi) >> 1;
        if (cu[mid] <= row)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

//! Where packed row `row` belongs: request r, position p, the request's first row.
struct RowInfo
{
    int32_t r;
    int32_t p;
    int64_t base;
};

__device__ __forceinline__ RowInfo rowInfo(int32_t const* cu, int32_t batch, int64_t row)
{
    RowInfo info;
    info.r = requestOfRow(cu, batch, row);
    info.base = cu[info.r];
    info.p = static_cast<int32_t>(row - info.base);
    return info;
}

//! Chunk `id` of the context requests in order: request r, chunk start c0 and length m.
__device__ __forceinline__ bool findChunk(int32_t const* cu, int32_t numContext, int32_t chunk, int64_t id, int32_t* r,
    int32_t* c0, int32_t* m)
{
    for (int32_t q = 0; q < numContext; ++q)
    {
        int32_t const len = cu[q + 1] - cu[q];
        int64_t const nch = (len + chunk - 1) / chunk;
        if (id < nch)
        {
            *r = q;
            *c0 = static_cast<int32_t>(id) * chunk;
            *m = min(chunk, len - *c0);
            return true;
        }
        id -= nch;
    }
    return false;
}

//! A context request whose initial state is zeros (zero_state input; null = none).
__device__ __forceinline__ bool zeroInit(int32_t const* zeroState, int32_t r, int32_t numContext)
{
    return zeroState != nullptr && r < numContext && zeroState[r] != 0;
}

struct Dims
{
    int32_t batch, numContext, hk, hv, dk, dv, kc, kv, chunk;
    int64_t convDim;
    // the rnn pool's slot (GdnSlotLayout): stride and offsets in floats
    int64_t slotFloats, offPending, offDelta, offKeys, offDecay;
};

Dims dimsOf(GatedDeltaNetParams const& p)
{
    auto const& a = p.attrs;
    GdnSlotLayout const l = gatedDeltaNetSlotLayout(a);
    return Dims{static_cast<int32_t>(p.batch), p.numContext, a.numKHeads, a.numVHeads, a.headKDim, a.headVDim,
        a.convKernel, a.maxVerifyTokens, a.chunkSize, p.convDim, l.floats, l.pending, l.delta, l.keys, l.decay};
}

//! The pending count of a slot (raw, gdnPendingCount clamps it).
__device__ __forceinline__ int32_t slotPendingRaw(float const* slot, Dims const& d)
{
    return *reinterpret_cast<int32_t const*>(slot + d.offPending);
}

// ------------------------------------------------------------------------------------ kernels
//! kVec consecutive storage elements moved as one access (8 bytes for 4 x 16-bit, 16 for 4 x fp32).
template <class S, int kVec>
struct alignas(sizeof(S) * kVec) StorageVec
{
    S v[kVec];
};

template <class S, int kVec>
__device__ __forceinline__ StorageVec<S, kVec> loadVec(S const* p)
{
    return *reinterpret_cast<StorageVec<S, kVec> const*>(p);
}

template <class S, int kVec>
__device__ __forceinline__ void storeVec(S* p, StorageVec<S, kVec> const& v)
{
    *reinterpret_cast<StorageVec<S, kVec>*>(p) = v;
}

//! Request owning packed row `row` (< T) for a whole warp at once: the number of k in [1, B) with
//! cu[k] <= row (== requestOfRow's answer, cu being non-decreasing), 32 entries per load + ballot.
__device__ __forceinline__ int32_t warpRequestOfRow(int32_t const* cu, int32_t batch, int64_t row)
{
    int32_t const lane = static_cast<int32_t>(threadIdx.x) & 31;
    int32_t r = 0;
    for (int32_t k0 = 1; k0 < batch; k0 += 32)
    {
        int32_t const k = k0 + lane;
        bool const le = k < batch && cu[k] <= row;
        r += __popc(__ballot_sync(0xffffffffu, le));
    }
    return r;
}

//! What one prologue launch produces.
struct PrologueParts
{
    bool norm;  //!< q/k l2norm into qh/kh (else the q/k channels' xc is written, for gdnQkNormKernel)
    bool gates; //!< g and beta
};

constexpr int kProThreads = 256;

//! Fused prologue, grid (rows, channel tiles of kProThreads * kVec channels): block =
//! one packed row (its request found once per warp, not per thread), thread =
//! kVec consecutive channels. Conv + silu of the tile (gdnConvTap / gdnSiluOfConv: the steps of
//! gdnConvSilu); the v channels go to xc; the q/k channels are l2-normalised into qh / kh
//! (gdnL2NormInv's steps: with four channels per thread a thread's channels are one group of
//! gdnSquaresGroup and the group sums of a key head, held by consecutive lanes of one warp, meet
//! in a butterfly = gdnL2NormInv's pairwise tree; with one channel per thread the tile goes
//! through shared memory and one thread per head calls gdnL2NormInv). A tile holds whole key
//! heads (tiles start at multiples of Dk). Generation rows also copy their raw
//! qkv into verify_qkv. Tile 0 computes the row's gates (gdnDecayLog, gdnBeta), once per (row,
//! value head).
template <class T, int kVec>
__global__ void __launch_bounds__(kProThreads) gdnPrologueKernel(typename T::Storage const* __restrict__ x,
    typename T::Storage const* __restrict__ w, typename T::Storage const* __restrict__ a,
    typename T::Storage const* __restrict__ b, float const* __restrict__ dtBias, float const* __restrict__ aLog,
    int32_t const* __restrict__ cu, int32_t const* __restrict__ slots, int32_t const* __restrict__ zeroState,
    typename T::Storage const* __restrict__ convPool, typename T::Storage* __restrict__ xc, float* __restrict__ qh,
    float* __restrict__ kh, float* __restrict__ gates, typename T::Storage* __restrict__ verifyQkv,
    float* __restrict__ verifyGates, Dims d, float scale, PrologueParts parts)
{
    using S = typename T::Storage;
    constexpr int32_t kTile = kProThreads * kVec;
    __shared__ S sXc[kVec == 1 ? kTile : 1];             // one channel per thread: the tile's q/k values
    __shared__ float sInv[kVec == 1 ? kTile / 16 : 1]; // and the inverse norms of its heads (Dk >= 16)
    int64_t const row = blockIdx.x;
    int64_t const C = d.convDim;
    int32_t const r = warpRequestOfRow(cu, d.batch, row);
    int64_t const base = cu[r];
    int32_t const p = static_cast<int32_t>(row - base);
    bool const gen = r >= d.numContext;
    int32_t const keep = d.kc - 1;
    S const* st = zeroInit(zeroState, r, d.numContext) ? nullptr : convPool + static_cast<int64_t>(slots[r]) * keep * C;
    int64_t const qkw = static_cast<int64_t>(d.hk) * d.dk;
    int64_t const qkEnd = 2 * qkw; // channels [0, qkEnd) are q and k, [qkEnd, C) v
    int64_t const t0 = static_cast<int64_t>(blockIdx.y) * kTile;
    int32_t const local = static_cast<int32_t>(threadIdx.x) * kVec;
    int64_t const c = t0 + local; // kVec channels c .. c + kVec - 1, all < C or all >= C (C % kVec == 0)
    StorageVec<S, kVec> out;      // xc of those channels
    if (c < C)
    {
        S taps[kGdnMaxConvKernel][kVec];
#pragma unroll
        for (int32_t j = 0; j < kGdnMaxConvKernel; ++j)
        {
            if (j < d.kc)
            {
                int32_t const pos = p - keep + j;
                StorageVec<S, kVec> t;
                if (pos >= 0)
                    t = loadVec<S, kVec>(x + (base + pos) * C + c);
                else if (st != nullptr)
                    t = loadVec<S, kVec>(st + static_cast<int64_t>(pos + keep) * C + c);
                else
                {
#pragma unroll
                    for (int v = 0; v < kVec; ++v)
                        t.v[v] = T::store(0.0f);
                }
#pragma unroll
                for (int v = 0; v < kVec; ++v)
                    taps[j][v] = t.v[v];
            }
        }
#pragma unroll
        for (int v = 0; v < kVec; ++v)
        {
            S const* wc = w + (c + v) * d.kc;
            float acc = 0.0f;
#pragma unroll
            for (int32_t j = 0; j < kGdnMaxConvKernel; ++j)
                if (j < d.kc)
                    acc = gdnConvTap(acc, T::load(wc[j]), T::load(taps[j][v]), j);
            out.v[v] = gdnSiluOfConv<T>(acc);
        }
        if (c >= qkEnd || !parts.norm)
            storeVec<S, kVec>(xc + row * C + c, out);
        else if constexpr (kVec == 1)
            sXc[local] = out.v[0];
        if (gen && p < d.kv)
        {
            StorageVec<S, kVec> raw; // tap kc - 1 is row p itself, read from x
#pragma unroll
            for (int v = 0; v < kVec; ++v)
                raw.v[v] = taps[0][v];
#pragma unroll
            for (int32_t j = 1; j < kGdnMaxConvKernel; ++j)
                if (j == d.kc - 1)
                {
#pragma unroll
                    for (int v = 0; v < kVec; ++v)
                        raw.v[v] = taps[j][v];
                }
            storeVec<S, kVec>(verifyQkv + (static_cast<int64_t>(r) * d.kv + p) * C + c, raw);
        }
    }
    if (parts.norm)
    {
        int64_t const hLo = t0;
        int64_t const hHi = (t0 + kTile) < qkEnd ? (t0 + kTile) : qkEnd;
        bool const mine = c >= hLo && c < hHi; // this thread's channels are q/k channels (c < C)
        bool const isK = c >= qkw;
        float* o = isK ? kh + row * qkw + (c - qkw) : qh + row * qkw + c;
        float const sc = isK ? 0.0f : scale;
        if (hLo < hHi) // block-uniform: every thread takes part in the shuffles / barriers
        {
            if constexpr (kVec == kGdnNormGroup)
            {
                float v[kGdnNormGroup];
#pragma unroll
                for (int i = 0; i < kGdnNormGroup; ++i)
                    v[i] = mine ? T::load(out.v[i]) : 0.0f;
                float sum = gdnSquaresGroup(v);
                // a head's Dk / 4 threads are consecutive lanes of one warp, aligned to their count
                for (int32_t off = 1; off < d.dk / kGdnNormGroup; off *= 2)
                    sum = addRn(sum, __shfl_xor_sync(0xffffffffu, sum, off));
                if (mine)
                {
                    float const inv = gdnL2NormInvOfSum(sum);
                    *reinterpret_cast<float4*>(o) = make_float4(gdnL2NormApply(v[0], inv, sc),
                        gdnL2NormApply(v[1], inv, sc), gdnL2NormApply(v[2], inv, sc), gdnL2NormApply(v[3], inv, sc));
                }
            }
            else
            {
                static_assert(kVec == 1, "the q/k norm takes four channels per thread or one");
                __syncthreads();
                int32_t const heads = static_cast<int32_t>((hHi - hLo) / d.dk);
                if (static_cast<int32_t>(threadIdx.x) < heads)
                    sInv[threadIdx.x]
                        = gdnL2NormInv<T>(sXc + (hLo - t0) + static_cast<int64_t>(threadIdx.x) * d.dk, d.dk);
                __syncthreads();
                if (mine)
                    *o = gdnL2NormApply(T::load(out.v[0]), sInv[(c - hLo) / d.dk], sc);
            }
        }
    }
    if (parts.gates && blockIdx.y == 0)
    {
        for (int32_t h = threadIdx.x; h < d.hv; h += kProThreads)
        {
            int64_t const e = row * d.hv + h;
            float const g = gdnDecayLog(T::load(a[e]), dtBias[h], aLog[h]);
            float const beta = gdnBeta<T>(b[e]);
            gates[row * 2 * d.hv + h] = g;
            gates[row * 2 * d.hv + d.hv + h] = beta;
            if (gen && p < d.kv)
            {
                float* vg = verifyGates + (static_cast<int64_t>(r) * d.kv + p) * 2 * d.hv;
                vg[h] = g;
                vg[d.hv + h] = beta;
            }
        }
    }
}

template <class T>
__global__ void __launch_bounds__(kElemThreads) gdnQkNormKernel(typename T::Storage const* __restrict__ xc,
    float* __restrict__ qh, float* __restrict__ kh, int64_t rows, Dims d, float scale)
{
    int64_t const total = rows * d.hk * 2;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * kElemThreads + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * kElemThreads)
    {
        int64_t const row = e / (d.hk * 2);
        int32_t const rem = static_cast<int32_t>(e - row * d.hk * 2);
        int32_t const g = rem / 2;
        bool const isK = (rem % 2) == 1;
        int64_t const col = (isK ? static_cast<int64_t>(d.hk) * d.dk : 0) + static_cast<int64_t>(g) * d.dk;
        float* out = (isK ? kh : qh) + (row * d.hk + g) * d.dk;
        gdnL2Normalize<T>(xc + row * d.convDim + col, out, d.dk, isK ? 0.0f : scale);
    }
}

template <class T>
__global__ void __launch_bounds__(kElemThreads) gdnGatesKernel(typename T::Storage const* __restrict__ a,
    typename T::Storage const* __restrict__ b, float const* __restrict__ dtBias, float const* __restrict__ aLog,
    int32_t const* __restrict__ cu, float* __restrict__ gates, float* __restrict__ verifyGates, int64_t rows, Dims d)
{
    int64_t const total = rows * d.hv;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * kElemThreads + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * kElemThreads)
    {
        int64_t const row = e / d.hv;
        int32_t const h = static_cast<int32_t>(e - row * d.hv);
        float const g = gdnDecayLog(T::load(a[e]), dtBias[h], aLog[h]);
        float const beta = gdnBeta<T>(b[e]);
        gates[row * 2 * d.hv + h] = g;
        gates[row * 2 * d.hv + d.hv + h] = beta;
        RowInfo const ri = rowInfo(cu, d.batch, row);
        if (ri.r >= d.numContext && ri.p < d.kv)
        {
            float* vg = verifyGates + (static_cast<int64_t>(ri.r) * d.kv + ri.p) * 2 * d.hv;
            vg[h] = g;
            vg[d.hv + h] = beta;
        }
    }
}

//! Lanes of one state column: kSplit consecutive lanes of a warp, slice = lane % kSplit.
template <int32_t kSplit>
struct ColumnLanes
{
    static constexpr int32_t kColumns = kColumnThreads / kSplit; //!< state columns per block
    int32_t col;   //!< column j within the head
    int32_t slice; //!< which Dk / kSplit values this lane holds
    unsigned mask; //!< the kSplit lanes of this column (they shuffle and sync among themselves)

    __device__ __forceinline__ explicit ColumnLanes(int32_t tile)
    {
        int32_t const t = static_cast<int32_t>(threadIdx.x);
        col = tile * kColumns + t / kSplit;
        slice = t % kSplit;
        int32_t const lane = t & 31;
        mask = (kSplit == 32 ? 0xffffffffu : ((1u << kSplit) - 1u)) << (lane - lane % kSplit);
    }

    //! Butterfly sum over the column's lanes: every lane gets gdnCombine<kSplit>'s value.
    __device__ __forceinline__ float combine(float v) const
    {
GDN_UNROLL
        for (int32_t off = 1; off < kSplit; off *= 2)
            v = addRn(v, __shfl_xor_sync(mask, v, off));
        return v;
    }
};

//! The per-token recurrence's tiling: a state column (Dk values) is split over kSplit lanes
//! (kGdnSplit, as the CPU build's slices); kLanes = 32 / kSplit lanes hold the same slice of
//! different columns, and every lane holds kRecCols columns. Lane = slice * kLanes + position:
//! a column's kSplit lanes are kLanes apart (the butterfly of combine), and the kLanes lanes of
//! one slice read the same k / q values from shared memory (a broadcast).
constexpr int kRecThreads = 128;
constexpr int kRecTokens = 16; //!< tokens staged in shared memory at a time

//! State columns per lane by default: two at Dk = 128 (independent sum chains, k / q loads shared; 64
//! state registers), one below (where two leave ptxas no room under 128 registers). At Dk = 128 one
//! column per lane is the other tiling (DFLASH2_GDN_RECURRENT_COLS=1, recurrentDk): the same
//! operations per column in the same order (so the same bits), half the registers for the state, more
//! blocks per SM to overlap one block's state loads with another's arithmetic.
template <int32_t kDk>
constexpr int32_t kRecDefaultCols = kDk == 128 ? 2 : 1;

template <int32_t kDk, int32_t kColsPerLane = kRecDefaultCols<kDk>>
struct RecTile
{
    static constexpr int32_t kCols = kColsPerLane;
    static_assert(kCols == 1 || (kCols == 2 && kDk == 128), "two columns per lane at Dk = 128 only");
    //! blocks per SM for __launch_bounds__: two columns need ~150 registers (3 blocks: <= 168;
    //! capped at 128 ptxas spills or sits on the edge), one column fits 128 (4 blocks)
    static constexpr int32_t kMinBlocks = kCols == 2 ? 3 : 4;
    static constexpr int32_t kSplit = kGdnSplit<kDk>;
    static constexpr int32_t kSlice = kDk / kSplit;
    static constexpr int32_t kLanes = 32 / kSplit;
    static constexpr int32_t kWarpCols = kCols * kLanes;
    static constexpr int32_t kBlockCols = (kRecThreads / 32) * kWarpCols;
    static_assert(kSlice % 4 == 0, "a slice is read from shared memory as float4");
    static_assert(kRecThreads % (kDk / 4) == 0 && (kBlockCols % kRecThreads == 0 || kRecThreads % kBlockCols == 0),
        "staging: whole rows per pass");

    //! Butterfly sum over the kSplit lanes of a column: every lane gets gdnCombine<kSplit>'s
    //! value (level 1 pairs slices l and l^1, level 2 l and l^2, ...; IEEE addition commutes).
    __device__ __forceinline__ static float combine(float v)
    {
GDN_UNROLL
        for (int32_t off = kLanes; off < 32; off *= 2)
            v = addRn(v, __shfl_xor_sync(0xffffffffu, v, off));
        return v;
    }
};

//! grid (B, Hv, ceil(Dv / kBlockCols)): value head blockIdx.y of request blockIdx.x, columns
//! [blockIdx.z kBlockCols, ...). Per column, the steps of recurrentColumn in gatedDeltaNetCpu.cpp
//! in its order: the fold of the slot's pending records (gdnSliceFold: keys, delta and decay of up to
//! kRecTokens records staged in shared memory at a time), then per token S *= exp(g) and S^T k
//! (gdnSliceDecayDot per slice, combined), delta (gdnDelta; a generation request's slice-0 lanes
//! store it as the token's record), S += k delta (gdnSliceUpdate), y = S^T q (gdnSliceDot,
//! combined). The state stays in registers from the one load to the one store (context requests: after
//! their tokens; generation requests whose slot had records to fold: the folded, committed state, before
//! the verify tokens, which leave the slot's state as it is); k, q (fp32 from the prologue), v (widened),
//! exp(g) and beta of up to kRecTokens tokens are staged in shared memory by the block, exp once per
//! (token, head). Every lane runs every step (columns past Dv compute on zeros and store nothing), so
//! the shuffles and barriers see full warps and blocks.
//! The prefetching kernel's state tile in shared memory: the tile's Dk rows x kBlockCols columns, row-major, the rows
//! of slice s shifted by s kLanes floats, so that a warp's reads of one row index i (kSplit slices x kLanes
//! consecutive columns) fall into 32 different banks; every 4-column chunk stays 16-byte aligned.
template <int32_t kDk, int32_t kColsPerLane>
struct RecStateTile
{
    using Tile = RecTile<kDk, kColsPerLane>;
    static constexpr int32_t kRowFloats = Tile::kBlockCols;
    static constexpr int32_t kFloats = kDk * kRowFloats + (Tile::kSplit - 1) * Tile::kLanes;
    static constexpr size_t kBytes = static_cast<size_t>(kFloats) * sizeof(float);
    static_assert(Tile::kLanes % 4 == 0 || Tile::kSplit == 1, "16-byte chunks stay aligned");

    __device__ __forceinline__ static int32_t at(int32_t row, int32_t col)
    {
        return row * kRowFloats + (row / Tile::kSlice) * Tile::kLanes + col;
    }
};

//! 16 bytes global -> shared without registers (cp.async, L2 only), completed by gdnCopyWait; the host emulation
//! copies at once (alignment-checked, as the hardware requires 16-byte alignment on both sides).
__device__ __forceinline__ void gdnCopy16Async(float* dst, float const* src)
{
#if defined(__CUDA_ARCH__)
    unsigned const at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(src) : "memory");
#else
    *reinterpret_cast<float4*>(dst) = *reinterpret_cast<float4 const*>(src);
#endif
}

__device__ __forceinline__ void gdnCopyCommit()
{
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

//! This thread's cp.async copies have landed (the others' need a __syncthreads after every thread's wait).
__device__ __forceinline__ void gdnCopyWait()
{
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

//! One work item of the per-token recurrence: value head h of request r, column tile z (see gdnRecurrentKernel).
//! kFromSmem: the slot's state tile was copied into sState (RecStateTile layout) by the prefetching kernel, which
//! passes afterLoad (called by every thread once the state is in registers, also when the item reads none: it
//! starts the next item's copy into the same buffer); otherwise the state is loaded from the slot.
template <int32_t kDk, class T, int32_t kColsPerLane, bool kFromSmem, class AfterLoad>
__device__ __forceinline__ void gdnRecurrentItem(float const* __restrict__ qh, float const* __restrict__ kh,
    typename T::Storage const* __restrict__ xc, float const* __restrict__ gates, int32_t const* __restrict__ cu,
    int32_t const* __restrict__ slots, int32_t const* __restrict__ zeroState, float* __restrict__ rnnPool,
    typename T::Storage* __restrict__ y, Dims const& d, int32_t r, int32_t h, int32_t z, float const* sState,
    AfterLoad&& afterLoad)
{
    using S = typename T::Storage;
    using Tile = RecTile<kDk, kColsPerLane>;
    constexpr int32_t kRecCols = Tile::kCols;
    constexpr int32_t kSlice = Tile::kSlice;
    constexpr int32_t kQuads = kDk / 4;
    constexpr int32_t kSliceQuads = kSlice / 4;
    // k and q rows by slice, each slice padded by one float4 so that the kSplit slices a warp
    // reads at once (one address per slice) fall into different banks
    __shared__ float4 sK[kRecTokens][Tile::kSplit][kSliceQuads + 1];
    __shared__ float4 sQ[kRecTokens][Tile::kSplit][kSliceQuads + 1];
    __shared__ float sV[kRecTokens][Tile::kBlockCols];
    __shared__ float sD[kRecTokens][Tile::kBlockCols]; // the staged tokens' delta records
    __shared__ float sDecay[kRecTokens];
    __shared__ float sBeta[kRecTokens];

    bool const ctx = r < d.numContext;
    if (ctx && d.chunk > 0)
    {
        afterLoad();
        return; // the chunked kernels handle it
    }
    int32_t const n = cu[r + 1] - cu[r];
    int64_t const base = cu[r];
    bool const zero = zeroInit(zeroState, r, d.numContext);
    float* const slot = rnnPool + static_cast<int64_t>(slots[r]) * d.slotFloats;
    int32_t const pend = zero ? 0 : gdnPendingCount(slotPendingRaw(slot, d), d.kv);
    int32_t const nRec = ctx ? 0 : min(n, d.kv); // verify tokens that get records
    int32_t const tid = static_cast<int32_t>(threadIdx.x);
    int32_t const lane = tid & 31;
    int32_t const slice = lane / Tile::kLanes;
    int32_t const tileCol = z * Tile::kBlockCols;
    int32_t jl[kRecCols]; // columns within the block
    bool valid[kRecCols];
GDN_UNROLL
    for (int32_t q = 0; q < kRecCols; ++q)
    {
        jl[q] = (tid >> 5) * Tile::kWarpCols + q * Tile::kLanes + lane % Tile::kLanes;
        valid[q] = tileCol + jl[q] < d.dv;
    }
    int32_t const kHead = h / (d.hv / d.hk);
    int64_t const qkw = static_cast<int64_t>(d.hk) * kDk;
    int64_t const dv = d.dv;
    float* st = slot + static_cast<int64_t>(h) * kDk * dv + static_cast<int64_t>(slice) * kSlice * dv + tileCol;
    // the records of this head: the column tile's delta rows [Kv][Dv] (at a fixed offset from st), the key
    // head's keys [Kv][Dk], the decay [Kv]
    auto deltaFromState = [&]()
    {
        return d.offDelta + static_cast<int64_t>(h) * (d.kv - kDk) * dv - static_cast<int64_t>(slice) * kSlice * dv;
    };
    // staging assignments (fixed per thread)
    constexpr int32_t kKqStep = kRecThreads / kQuads;
    int32_t const kqQuad = tid % kQuads;
    int32_t const kqTok = tid / kQuads;
    int32_t const kqSlice = kqQuad / kSliceQuads;
    constexpr int32_t kVCols = Tile::kBlockCols < kRecThreads ? Tile::kBlockCols : kRecThreads;
    constexpr int32_t kVReps = Tile::kBlockCols / kVCols;
    constexpr int32_t kVStep = kRecThreads / kVCols;
    int32_t const vCol = tid % kVCols;
    int32_t const vTok = tid / kVCols;

    // column q of this lane is column 0 + q kLanes: one row pointer per state row, the columns at
    // compile-time offsets from it
    float s[kRecCols][kSlice];
    if constexpr (kFromSmem)
    {
        using Smem = RecStateTile<kDk, kColsPerLane>;
GDN_UNROLL
        for (int32_t i = 0; i < kSlice; ++i)
GDN_UNROLL
            for (int32_t q = 0; q < kRecCols; ++q)
            {
                // read, then select: a load under the condition became a branch per element on sm_90a (a reviewer's
                // SASS: ~1,090 instructions per item from the barrier to the state in registers, ~290 this way)
                float const v = sState[Smem::at(slice * kSlice + i, jl[q])]; // always inside the buffer
                s[q][i] = (zero || !valid[q]) ? 0.0f : v;
            }
    }
    else
    {
GDN_UNROLL
        for (int32_t i = 0; i < kSlice; ++i)
        {
            float const* row = st + i * dv + jl[0];
GDN_UNROLL
            for (int32_t q = 0; q < kRecCols; ++q)
                s[q][i] = (zero || !valid[q]) ? 0.0f : row[q * Tile::kLanes];
        }
    }
    afterLoad();

    // the fold of the pending records (the previous step's accepted tokens), staged as the tokens below
    if (pend > 0) // block-uniform
    {
        float const* recKeys = slot + d.offKeys + static_cast<int64_t>(kHead) * d.kv * kDk;
        float const* recDecay = slot + d.offDecay + static_cast<int64_t>(h) * d.kv;
        float const* recDelta = st + deltaFromState();
GDN_NO_UNROLL
        for (int32_t c0 = 0; c0 < pend; c0 += kRecTokens)
        {
            int32_t const m = min(kRecTokens, pend - c0);
            if (c0 > 0)
                __syncthreads();
            // keys: a slot is 4-byte aligned only, so scalar loads into the float4 staging
            for (int32_t t = kqTok; t < m; t += kKqStep)
            {
                float const* kp = recKeys + (c0 + t) * kDk + 4 * kqQuad;
                sK[t][kqSlice][kqQuad - kqSlice * kSliceQuads] = make_float4(kp[0], kp[1], kp[2], kp[3]);
            }
GDN_UNROLL
            for (int32_t u = 0; u < kVReps; ++u)
            {
                int32_t const jj = vCol + u * kRecThreads;
                bool const ok = tileCol + jj < d.dv;
                for (int32_t t = vTok; t < m; t += kVStep)
                    sV[t][jj] = ok ? recDelta[(c0 + t) * dv + jj] : 0.0f;
            }
            if (tid < m)
                sDecay[tid] = recDecay[c0 + tid];
            __syncthreads();
GDN_NO_UNROLL
            for (int32_t t = 0; t < m; ++t)
            {
                float const decay = sDecay[t];
                float kv[kSlice];
                gdnLoadSlice<kSlice>(kv, sK[t][slice]);
GDN_UNROLL
                for (int32_t q = 0; q < kRecCols; ++q)
                    gdnSliceFold<kSlice>(s[q], kv, decay, sV[t][jl[q]]);
            }
        }
        __syncthreads(); // every lane is done with the records before the tokens' staging
        if (!ctx) // a generation request's committed state: stored now, before its verify tokens advance it
        {
            float* sf = st; // opaque, as the final store's (no addresses kept from the loads)
            asm volatile("mov.b64 %0, %0;" : "+l"(sf));
GDN_UNROLL
            for (int32_t i = 0; i < kSlice; ++i)
            {
                float* row = sf + i * dv + jl[0];
GDN_UNROLL
                for (int32_t q = 0; q < kRecCols; ++q)
                    if (valid[q])
                        row[q * Tile::kLanes] = s[q][i];
            }
        }
    }

    float const* kSrc = kh + base * qkw + static_cast<int64_t>(kHead) * kDk;
    float const* qSrc = qh + base * qkw + static_cast<int64_t>(kHead) * kDk;
    float const* gSrc = gates + base * 2 * d.hv + h;
    S const* vSrc = xc + base * d.convDim + 2 * qkw + static_cast<int64_t>(h) * dv + tileCol;
    int64_t const yStride = static_cast<int64_t>(d.hv) * dv;
    // this lane's y of its first column at the current token (slice-0 lanes store)
    S* yAt = y + base * yStride + static_cast<int64_t>(h) * dv + tileCol + jl[0];

GDN_NO_UNROLL
    for (int32_t c0 = 0; c0 < n; c0 += kRecTokens)
    {
        int32_t const m = min(kRecTokens, n - c0);
        if (c0 > 0)
            __syncthreads(); // every lane is done with the previous tokens
        // k / q: thread = one float4 of a row (fixed), tokens kRecThreads / kQuads apart
        {
            int64_t const at = (c0 + kqTok) * qkw + 4 * kqQuad;
            float4 const* kp = reinterpret_cast<float4 const*>(kSrc + at);
            float4 const* qp = reinterpret_cast<float4 const*>(qSrc + at);
            int64_t const step = kKqStep * qkw / 4; // in float4
            for (int32_t t = kqTok; t < m; t += kKqStep, kp += step, qp += step)
            {
                sK[t][kqSlice][kqQuad - kqSlice * kSliceQuads] = *kp;
                sQ[t][kqSlice][kqQuad - kqSlice * kSliceQuads] = *qp;
            }
        }
        // v: thread = one column (or kVReps columns kRecThreads apart), tokens kVStep apart
GDN_UNROLL
        for (int32_t u = 0; u < kVReps; ++u)
        {
            int32_t const jj = vCol + u * kRecThreads;
            bool const ok = tileCol + jj < d.dv;
            S const* vp = vSrc + (c0 + vTok) * d.convDim + jj;
            for (int32_t t = vTok; t < m; t += kVStep, vp += kVStep * d.convDim)
                sV[t][jj] = ok ? T::load(*vp) : 0.0f;
        }
        if (tid < m)
        {
            float const* gt = gSrc + static_cast<int64_t>(c0 + tid) * 2 * d.hv;
            sDecay[tid] = expRn(gt[0]);
            sBeta[tid] = gt[d.hv];
        }
        __syncthreads();
GDN_NO_UNROLL
        for (int32_t t = 0; t < m; ++t)
        {
            float const decay = sDecay[t];
            float const beta = sBeta[t];
            float kv[kSlice];
            gdnLoadSlice<kSlice>(kv, sK[t][slice]);
            float part[kRecCols];
GDN_UNROLL
            for (int32_t q = 0; q < kRecCols; ++q)
                part[q] = gdnSliceDecayDot<kSlice>(s[q], kv, decay);
GDN_UNROLL
            for (int32_t q = 0; q < kRecCols; ++q)
            {
                part[q] = gdnDelta(sV[t][jl[q]], Tile::combine(part[q]), beta);
                if (slice == 0)
                    sD[t][jl[q]] = part[q];
            }
GDN_UNROLL
            for (int32_t q = 0; q < kRecCols; ++q)
                gdnSliceUpdate<kSlice>(s[q], kv, part[q]);
            float qv[kSlice];
            gdnLoadSlice<kSlice>(qv, sQ[t][slice]);
GDN_UNROLL
            for (int32_t q = 0; q < kRecCols; ++q)
            {
                float const yv = Tile::combine(gdnSliceDot<kSlice>(s[q], qv));
                if (slice == 0 && valid[q])
                    yAt[q * Tile::kLanes] = T::store(yv);
            }
            yAt += yStride;
        }
        int32_t const mRec = min(m, nRec - c0); // block-uniform
        if (mRec > 0)
        {
            // the staged tokens' delta records to the slot, thread = a column (as the v staging); the
            // address recomputed (opaque, as the state's below) rather than kept through the token loop
            __syncthreads();
            float* rec = st;
            asm volatile("mov.b64 %0, %0;" : "+l"(rec));
            rec += deltaFromState();
GDN_UNROLL
            for (int32_t u = 0; u < kVReps; ++u)
            {
                int32_t const jj = vCol + u * kRecThreads;
                if (tileCol + jj < d.dv)
                    for (int32_t t = vTok; t < mRec; t += kVStep)
                        rec[(c0 + t) * dv + jj] = sD[t][jj];
            }
        }
    }
    if (ctx) // the advanced state of a context request
    {
        // a fresh copy of the pointer, opaque to the compiler: the store addresses are recomputed
        // here rather than kept in registers from the loads through the whole token loop
        asm volatile("mov.b64 %0, %0;" : "+l"(st));
GDN_UNROLL
        for (int32_t i = 0; i < kSlice; ++i)
        {
            float* row = st + i * dv + jl[0];
GDN_UNROLL
            for (int32_t q = 0; q < kRecCols; ++q)
                if (valid[q])
                    row[q * Tile::kLanes] = s[q][i];
        }
    }
}

template <int32_t kDk, class T, int32_t kColsPerLane = kRecDefaultCols<kDk>>
__global__ void __launch_bounds__(kRecThreads, RecTile<kDk, kColsPerLane>::kMinBlocks) gdnRecurrentKernel(
    float const* __restrict__ qh, float const* __restrict__ kh, typename T::Storage const* __restrict__ xc,
    float const* __restrict__ gates, int32_t const* __restrict__ cu, int32_t const* __restrict__ slots,
    int32_t const* __restrict__ zeroState, float* __restrict__ rnnPool, typename T::Storage* __restrict__ y, Dims d)
{
    gdnRecurrentItem<kDk, T, kColsPerLane, false>(qh, kh, xc, gates, cu, slots, zeroState, rnnPool, y, d,
        static_cast<int32_t>(blockIdx.x), static_cast<int32_t>(blockIdx.y), static_cast<int32_t>(blockIdx.z), nullptr,
        [] {});
}

//! The recurrence's work items (request, value head, column tile; tile fastest, then head, then request) over a
//! grid of resident blocks (the launcher sizes it by the occupancy), each block taking every gridDim.x-th item. While
//! a block computes an item, the next item's state tile is on its way into shared memory (cp.async, 16-byte chunks,
//! one buffer: started after every thread has its state in registers), so one block's state loads overlap its own
//! arithmetic instead of waiting for other blocks to fill the gap. Items whose state is not read (chunked context
//! requests, zero_state) copy nothing. Needs Dv % 4 == 0 and a 16-byte aligned pool (the launcher falls back to
//! gdnRecurrentKernel otherwise); the same operations per column in the same order as gdnRecurrentKernel.
template <int32_t kDk, class T, int32_t kColsPerLane>
__global__ void __launch_bounds__(kRecThreads, RecTile<kDk, kColsPerLane>::kMinBlocks) gdnRecurrentPrefetchKernel(
    float const* __restrict__ qh, float const* __restrict__ kh, typename T::Storage const* __restrict__ xc,
    float const* __restrict__ gates, int32_t const* __restrict__ cu, int32_t const* __restrict__ slots,
    int32_t const* __restrict__ zeroState, float* __restrict__ rnnPool, typename T::Storage* __restrict__ y, Dims d)
{
    using Tile = RecTile<kDk, kColsPerLane>;
    using Smem = RecStateTile<kDk, kColsPerLane>;
    extern __shared__ __align__(16) unsigned char gdnStateSmem[];
    float* const sState = reinterpret_cast<float*>(gdnStateSmem);
    int32_t const tiles = (d.dv + Tile::kBlockCols - 1) / Tile::kBlockCols;
    int64_t const items = static_cast<int64_t>(d.batch) * d.hv * tiles;
    int32_t const tid = static_cast<int32_t>(threadIdx.x);
    constexpr int32_t kRowChunks = Tile::kBlockCols / 4;
    // start the copy of item's state tile (nothing where the item reads no state)
    auto issue = [&](int64_t item)
    {
        int32_t const z = static_cast<int32_t>(item % tiles);
        int32_t const h = static_cast<int32_t>((item / tiles) % d.hv);
        int32_t const r = static_cast<int32_t>(item / (static_cast<int64_t>(tiles) * d.hv));
        if ((r < d.numContext && d.chunk > 0) || zeroInit(zeroState, r, d.numContext))
            return;
        int32_t const tileCol = z * Tile::kBlockCols;
        float const* const head = rnnPool + static_cast<int64_t>(slots[r]) * d.slotFloats
            + static_cast<int64_t>(h) * kDk * d.dv + tileCol;
        // this thread's 4 columns of every kRowStep-th row: no division per chunk, the copies unrolled
        static_assert(kRecThreads % kRowChunks == 0 && (kDk * kRowChunks) % kRecThreads == 0, "whole rows per pass");
        constexpr int32_t kRowStep = kRecThreads / kRowChunks;
        int32_t const col = 4 * (tid % kRowChunks);
        int32_t const row0 = tid / kRowChunks;
        if (tileCol + col < d.dv) // Dv % 4 == 0: a 4-column chunk is all inside or all outside
        {
            float const* src = head + static_cast<int64_t>(row0) * d.dv + col;
            int64_t const step = static_cast<int64_t>(kRowStep) * d.dv;
GDN_UNROLL
            for (int32_t k = 0; k < kDk / kRowStep; ++k, src += step)
                gdnCopy16Async(sState + Smem::at(row0 + k * kRowStep, col), src);
        }
    };
    int64_t item = blockIdx.x;
    if (item < items)
        issue(item);
    gdnCopyCommit();
GDN_NO_UNROLL
    for (; item < items; item += gridDim.x)
    {
        int32_t const z = static_cast<int32_t>(item % tiles);
        int32_t const h = static_cast<int32_t>((item / tiles) % d.hv);
        int32_t const r = static_cast<int32_t>(item / (static_cast<int64_t>(tiles) * d.hv));
        gdnCopyWait();
        __syncthreads(); // every thread's chunks of this item's tile have landed
        int64_t const next = item + gridDim.x;
        gdnRecurrentItem<kDk, T, kColsPerLane, true>(qh, kh, xc, gates, cu, slots, zeroState, rnnPool, y, d, r, h, z,
            sState,
            [&]
            {
                __syncthreads(); // every thread has read the tile: the buffer is free for the next item's
                if (next < items)
                    issue(next);
                gdnCopyCommit();
            });
    }
}

//! Row stride of the chunk matrices kernel's staged kh rows, in float4s: Dk + 4 floats, an odd number of 16-byte
//! quads for every Dk in {16, 32, 64, 128}, so the 8 lanes of a quarter warp reading 8 consecutive rows hit 8
//! different bank quads (conflict-free 16-byte shared loads; 2-way where a quarter warp spans two rows p).
__host__ __device__ constexpr int32_t gdnMatrixRowQuads(int32_t dk)
{
    return dk / 4 + 1;
}

//! grid (chunks, Hv): gam (thread 0, in order); the chunk's kh rows, betas and decays staged in shared memory; then
//! the A and QK entries (s <= p) numbered row by row over the block's threads, so that a warp's lanes take
//! consecutive s of one or two rows p: its kh_s rows come from shared memory (see gdnMatrixRowQuads), kh_p and qh_p are
//! the same one or two rows for all lanes (broadcasts), and its stores are consecutive. One pass over i computes
//! both entries; each sum runs the same operations in the same order as gdnChunkQKEntry / gdnChunkAEntry (what
//! the CPU build calls), so the values are theirs bit for bit.
__global__ void __launch_bounds__(kMatrixThreads) gdnChunkMatricesKernel(float const* __restrict__ qh,
    float const* __restrict__ kh, float const* __restrict__ gates, int32_t const* __restrict__ cu,
    float* __restrict__ gam, float* __restrict__ amat, float* __restrict__ qk, Dims d)
{
    __shared__ float4 sK[kGdnMaxChunkSize * (128 / 4 + 1)];
    __shared__ float sGam[kGdnMaxChunkSize];
    __shared__ float sBeta[kGdnMaxChunkSize];
    int32_t r, c0, m;
    if (!findChunk(cu, d.numContext, d.chunk, blockIdx.x, &r, &c0, &m))
        return;
    int32_t const h = blockIdx.y;
    int32_t const tid = static_cast<int32_t>(threadIdx.x);
    int32_t const kHead = h / (d.hv / d.hk);
    int64_t const row0 = static_cast<int64_t>(cu[r]) + c0;
    int64_t const qkw = static_cast<int64_t>(d.hk) * d.dk;
    int32_t const quads = d.dk / 4;                 // float4s of a row (Dk is a multiple of 16)
    int32_t const stride = gdnMatrixRowQuads(d.dk);
    // the chunk's kh rows of this head: qh / kh rows start 16-byte aligned (the workspace is, and Hk Dk and
    // kHead Dk are multiples of 16 floats)
    float4 const* khq = reinterpret_cast<float4 const*>(kh + row0 * qkw + static_cast<int64_t>(kHead) * d.dk);
    for (int32_t e = tid; e < m * quads; e += kMatrixThreads)
    {
        int32_t const p = e / quads;
        int32_t const i4 = e - p * quads;
        sK[p * stride + i4] = khq[static_cast<int64_t>(p) * (qkw / 4) + i4];
    }
    if (tid < m)
        sBeta[tid] = gates[(row0 + tid) * 2 * d.hv + d.hv + h];
    if (tid == 0)
        gdnChunkCumDecay(gates + row0 * 2 * d.hv + h, 2 * d.hv, m, gam + row0 * d.hv + h, d.hv);
    __syncthreads();
    if (tid < m)
        sGam[tid] = gam[(row0 + tid) * d.hv + h];
    __syncthreads();
    // entry e = p (p + 1) / 2 + s, s <= p: this thread's first, then every kMatrixThreads-th
    int32_t pp = 0;
    int32_t s = tid;
    while (s > pp)
    {
        s -= pp + 1;
        ++pp;
    }
    while (pp < m)
    {
        float4 const* qp = reinterpret_cast<float4 const*>(qh + (row0 + pp) * qkw + static_cast<int64_t>(kHead) * d.dk);
        float4 const* kp = sK + pp * stride;
        float4 const* ks = sK + s * stride;
        float const betaP = sBeta[pp];
        float accQ = 0.0f;
        float accA = 0.0f;
        for (int32_t i4 = 0; i4 < quads; ++i4)
        {
            float4 const q4 = qp[i4];
            float4 const kp4 = kp[i4];
            float4 const ks4 = ks[i4];
            accQ = fmaRn(q4.x, ks4.x, accQ);
            accA = fmaRn(mulRn(kp4.x, betaP), ks4.x, accA);
            accQ = fmaRn(q4.y, ks4.y, accQ);
            accA = fmaRn(mulRn(kp4.y, betaP), ks4.y, accA);
            accQ = fmaRn(q4.z, ks4.z, accQ);
            accA = fmaRn(mulRn(kp4.z, betaP), ks4.z, accA);
            accQ = fmaRn(q4.w, ks4.w, accQ);
            accA = fmaRn(mulRn(kp4.w, betaP), ks4.w, accA);
        }
        float const decay = expRn(subRn(sGam[pp], sGam[s]));
        int64_t const at = ((row0 + pp) * d.hv + h) * d.chunk + s;
        qk[at] = mulRn(accQ, decay);
        if (s < pp)
            amat[at] = mulRn(accA, decay);
        s += kMatrixThreads;
        while (s > pp)
        {
            s -= pp + 1;
            ++pp;
        }
    }
}

//! grid (chunks, Hv, ceil((Dv + Dk) / 64)); thread = one column of U (col < Dv) or W.
__global__ void __launch_bounds__(kSolveThreads) gdnChunkSolveKernel(void const* __restrict__ xc, DType dtype,
    float const* __restrict__ kh, float const* __restrict__ gates, float const* __restrict__ gam,
    float const* __restrict__ amat, int32_t const* __restrict__ cu, float* __restrict__ u, float* __restrict__ w,
    Dims d)
{
    int32_t r, c0, m;
    if (!findChunk(cu, d.numContext, d.chunk, blockIdx.x, &r, &c0, &m))
        return;
    int32_t const h = blockIdx.y;
    int32_t const col = blockIdx.z * kSolveThreads + threadIdx.x;
    if (col >= d.dv + d.dk)
        return;
    int32_t const kHead = h / (d.hv / d.hk);
    int64_t const row0 = static_cast<int64_t>(cu[r]) + c0;
    int64_t const qkw = static_cast<int64_t>(d.hk) * d.dk;
    float* x;
    int64_t xs;
    if (col < d.dv)
    {
        x = u + (row0 * d.hv + h) * d.dv + col;
        xs = static_cast<int64_t>(d.hv) * d.dv;
        for (int32_t pp = 0; pp < m; ++pp)
            x[pp * xs] = gdnChunkRhsU(gdnLoad(dtype, xc, (row0 + pp) * d.convDim + 2 * qkw + static_cast<int64_t>(h) * d.dv + col),
                gates[(row0 + pp) * 2 * d.hv + d.hv + h]);
    }
    else
    {
        int32_t const i = col - d.dv;
        x = w + (row0 * d.hv + h) * d.dk + i;
        xs = static_cast<int64_t>(d.hv) * d.dk;
        for (int32_t pp = 0; pp < m; ++pp)
            x[pp * xs] = gdnChunkRhsW(kh[(row0 + pp) * qkw + static_cast<int64_t>(kHead) * d.dk + i],
                gates[(row0 + pp) * 2 * d.hv + d.hv + h], gam[(row0 + pp) * d.hv + h]);
    }
    gdnChunkSolveColumn(amat + (row0 * d.hv + h) * d.chunk, static_cast<int64_t>(d.hv) * d.chunk, m, x, xs);
}

//! The chunk scan's staged token rows: a row's kSplit slices kSlice + 4 floats apart (an odd number of 16-byte
//! quads at kSlice 32, one slice below), so the kSplit different slices a warp reads of one row fall in different
//! bank quads and the lanes of one slice share an address (16-byte shared loads without conflicts).
template <int32_t kDk>
struct ScanRows
{
    static constexpr int32_t kSplit = kGdnSplit<kDk>;
    static constexpr int32_t kSlice = kDk / kSplit;
    static constexpr int32_t kSliceQuads = kSlice / 4 + 1;
    static constexpr int32_t kRowQuads = kSplit * kSliceQuads;

    //! The m rows of a chunk, row p at src + p * rowStride (floats; 16-byte aligned rows), into dst (float4s), by
    //! every thread of the block (the caller's barriers order it).
    static __device__ __forceinline__ void stage(float4* dst, float const* src, int64_t rowStride, int32_t m)
    {
        constexpr int32_t kQuads = kDk / 4;
        for (int32_t e = static_cast<int32_t>(threadIdx.x); e < m * kQuads; e += kColumnThreads)
        {
            int32_t const p = e / kQuads;
            int32_t const q = e - p * kQuads;
            int32_t const slice = q / (kSlice / 4);
            float4 const* row = reinterpret_cast<float4 const*>(src + p * rowStride);
            dst[p * kRowQuads + slice * kSliceQuads + (q - slice * (kSlice / 4))] = row[q];
        }
    }
};

//! The chunk scan's shared memory (dynamic: 52.3 KB at Dk 128, over the 48 KB of static arrays), in bytes from its
//! 16-byte aligned start: the staged rows (ScanRows; after the y phase's inter sums, the chunk's QK rows in their
//! place), v_new [chunk][columns], the inter sums [chunk][columns] where a column has several lanes (kSplit > 1: the
//! intra sums then run on all of them, a token per lane in turn), the chunk's cumulative decays.
template <int32_t kDk>
struct ScanSmem
{
    using Rows = ScanRows<kDk>;
    static constexpr int32_t kColumns = ColumnLanes<Rows::kSplit>::kColumns;
    static constexpr bool kLanesIntra = Rows::kSplit > 1;
    //! staged QK rows: 65 floats apart, so the kSplit rows a warp reads at once fall in different banks
    static constexpr int32_t kQkStride = kGdnMaxChunkSize + 1;
    //! QK values each thread loads before storing them (a 64-token chunk: 32 per thread, four batches)
    static constexpr int32_t kQkBatch = 8;
    static constexpr size_t kRowsBytes = sizeof(float4) * kGdnMaxChunkSize * Rows::kRowQuads;
    static constexpr size_t kVnewOffset = kRowsBytes;
    static constexpr size_t kInterOffset = kVnewOffset + sizeof(float) * kGdnMaxChunkSize * kColumns;
    static constexpr size_t kGamOffset = kInterOffset + (kLanesIntra ? sizeof(float) * kGdnMaxChunkSize * kColumns : 0);
    static constexpr size_t kBytes = kGamOffset + sizeof(float) * kGdnMaxChunkSize;
    static_assert(!kLanesIntra || sizeof(float) * kGdnMaxChunkSize * kQkStride <= kRowsBytes,
        "the QK rows are staged in the rows' place");
};

//! grid (numContext, Hv, ceil(Dv / columns per block)); kSplit lanes = one state column,
//! sequential over the request's chunks (the steps of chunkScanColumn in gatedDeltaNetCpu.cpp),
//! from the slot's state folded over its pending records (read from the slot, gdnSliceFold).
//! Per chunk, the rows each phase reads (W for v_new, qh for y, kh for the update) are staged in
//! shared memory by the whole block (coalesced float4 loads; ScanRows), and a lane loads its slice
//! of a token's row from there into registers; with W, the chunk's decays and the tile's U rows
//! (v_new's place in shared memory) are staged too, and the column's slice-0 lane turns U into
//! v_new in place. y = inter + intra per token: at kSplit > 1 the token loop leaves each column's inter sum in shared
//! memory, the chunk's QK rows are staged in the rows' place, and the column's kSplit lanes take the intra sums a
//! token each in turn (the same sum over the same staged values in the same order: the same bits); before, the
//! slice-0 lane summed them inside the token loop from global memory while its column's other lanes waited (a
//! standalone harness on an H100 put those loads at 7 of the kernel's 16.9 ms for one 8192-token prompt; this form
//! is not yet measured). At kSplit 1 every lane is a column and sums its own, as before.
//! Columns past Dv run every step on zeros (U 0; records and state from column 0's
//! addresses, in range) with their lanes meeting the barriers and shuffles, and store nothing.
//! Four blocks per SM: caps ptxas at 128 registers (its own choice on sm_100a, 80, spills at Dk 32).
template <int32_t kDk>
__global__ void __launch_bounds__(kColumnThreads, 4) gdnChunkScanKernel(float const* __restrict__ qh,
    float const* __restrict__ kh, float const* __restrict__ gam, float const* __restrict__ qk,
    float const* __restrict__ u, float const* __restrict__ w, int32_t const* __restrict__ cu,
    int32_t const* __restrict__ slots, int32_t const* __restrict__ zeroState, float* __restrict__ rnnPool,
    void* __restrict__ y, DType dtype, Dims d)
{
    using Rows = ScanRows<kDk>;
    using Smem = ScanSmem<kDk>;
    constexpr int32_t kSplit = Rows::kSplit;
    constexpr int32_t kSlice = Rows::kSlice;
    constexpr int32_t kColumns = Smem::kColumns;
    constexpr int32_t kQkBatch = Smem::kQkBatch;
    extern __shared__ __align__(16) unsigned char gdnScanSmem[];
    float4* const sRows = reinterpret_cast<float4*>(gdnScanSmem);
    float* const sQk = reinterpret_cast<float*>(gdnScanSmem); // the QK rows, staged after the inter sums
    float(*const sVnew)[kColumns] = reinterpret_cast<float(*)[kColumns]>(gdnScanSmem + Smem::kVnewOffset);
    float(*const sInter)[kColumns] = reinterpret_cast<float(*)[kColumns]>(gdnScanSmem + Smem::kInterOffset);
    float* const sGam = reinterpret_cast<float*>(gdnScanSmem + Smem::kGamOffset); // the chunk's cumulative decays
    ColumnLanes<kSplit> const lanes(static_cast<int32_t>(blockIdx.z));
    int32_t const r = blockIdx.x;
    int32_t const h = blockIdx.y;
    int32_t const j = lanes.col;
    bool const active = j < d.dv; // uniform over a column's lanes; an idle column stores nothing
    int32_t const lc = static_cast<int32_t>(threadIdx.x) / kSplit; // column within the block
    int32_t const kHead = h / (d.hv / d.hk);
    int64_t const base = cu[r];
    int32_t const n = cu[r + 1] - cu[r];
    int64_t const qkw = static_cast<int64_t>(d.hk) * kDk;
    int32_t const off = lanes.slice * kSlice;
    int64_t const hvdv = static_cast<int64_t>(d.hv) * d.dv;
    int32_t const jc = active ? j : 0; // an inactive lane's addresses stay inside the head's rows
    float* const slot = rnnPool + static_cast<int64_t>(slots[r]) * d.slotFloats;
    float* st = slot + static_cast<int64_t>(h) * kDk * d.dv + static_cast<int64_t>(off) * d.dv + jc;
    float const* qRows = qh + base * qkw + kHead * kDk;
    float const* kRows = kh + base * qkw + kHead * kDk;
    float const* wRows = w + (base * d.hv + h) * kDk;
    float const* gRow = gam + base * d.hv + h;
    float const* qkRow = qk + (base * d.hv + h) * d.chunk;
    // the block's column tile of U (its rows [T, Hv, Dv])
    float const* uTile = u + (base * d.hv + h) * d.dv + static_cast<int64_t>(blockIdx.z) * kColumns;
    int64_t const y0 = base * hvdv + static_cast<int64_t>(h) * d.dv + jc;
    int32_t const mine = lanes.slice * Rows::kSliceQuads; // this lane's slice within a staged row (float4s)
    bool const zero = zeroInit(zeroState, r, d.numContext);
    float s[kSlice];
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
        s[i] = zero || !active ? 0.0f : st[i * d.dv];
    {
        int32_t const pend = zero ? 0 : gdnPendingCount(slotPendingRaw(slot, d), d.kv);
        float const* recKeys = slot + d.offKeys + static_cast<int64_t>(kHead) * d.kv * kDk + off;
        float const* recDecay = slot + d.offDecay + static_cast<int64_t>(h) * d.kv;
        float const* recDelta = slot + d.offDelta + static_cast<int64_t>(h) * d.kv * d.dv + jc;
GDN_NO_UNROLL
        for (int32_t t = 0; t < pend; ++t)
            gdnSliceFold<kSlice>(s, recKeys + t * kDk, recDecay[t], recDelta[t * d.dv]);
    }
    float row[kSlice];
GDN_NO_UNROLL
    for (int32_t c0 = 0; c0 < n; c0 += d.chunk)
    {
        int32_t const m = min(d.chunk, n - c0);
        Rows::stage(sRows, wRows + c0 * static_cast<int64_t>(d.hv) * kDk, static_cast<int64_t>(d.hv) * kDk, m);
        // with W: the chunk's decays, and its U rows of this tile into v_new's place (phase 1 subtracts in place;
        // columns past Dv get 0): no global load left inside the token loops but the intra sums' qk rows
        for (int32_t e = static_cast<int32_t>(threadIdx.x); e < m; e += kColumnThreads)
            sGam[e] = gRow[(c0 + e) * d.hv];
        for (int32_t e = static_cast<int32_t>(threadIdx.x); e < m * kColumns; e += kColumnThreads)
        {
            int32_t const pp = e / kColumns;
            int32_t const cc = e - pp * kColumns;
            bool const inside = static_cast<int32_t>(blockIdx.z) * kColumns + cc < d.dv;
            sVnew[pp][cc] = inside ? uTile[(c0 + pp) * hvdv + cc] : 0.0f;
        }
        __syncthreads();
GDN_NO_UNROLL
        for (int32_t p = 0; p < m; ++p)
        {
            gdnLoadSlice<kSlice>(row, sRows + p * Rows::kRowQuads + mine);
            float const ws = lanes.combine(gdnSliceFmaDot<kSlice>(s, row));
            if (lanes.slice == 0)
                sVnew[p][lc] = subRn(sVnew[p][lc], ws);
        }
        __syncthreads(); // W read by every lane; U turned into v_new
        Rows::stage(sRows, qRows + c0 * qkw, qkw, m);
        __syncthreads();
GDN_NO_UNROLL
        for (int32_t p = 0; p < m; ++p)
        {
            float const e = expRn(sGam[p]);
            gdnLoadSlice<kSlice>(row, sRows + p * Rows::kRowQuads + mine);
            float const inter = lanes.combine(gdnSliceDecayedDot<kSlice>(s, row, e));
            if constexpr (Smem::kLanesIntra)
            {
                if (lanes.slice == 0)
                    sInter[p][lc] = inter;
            }
            else if (active)
            {
                float const intra = gdnChunkIntra(qkRow + (c0 + p) * static_cast<int64_t>(d.hv) * d.chunk,
                    &sVnew[0][lc], kColumns, p);
                gdnStore(dtype, y, y0 + (c0 + p) * hvdv, addRn(inter, intra));
            }
        }
        __syncthreads(); // q read by every lane
        if constexpr (Smem::kLanesIntra)
        {
            // the chunk's QK rows (the lower triangle the sums read) in the rows' place, kQkBatch loads in flight per
            // thread before their stores, then a token per lane
            for (int32_t e0 = static_cast<int32_t>(threadIdx.x); e0 < m * m; e0 += kColumnThreads * kQkBatch)
            {
                float v[kQkBatch];
                int32_t at[kQkBatch];
GDN_UNROLL
                for (int32_t b = 0; b < kQkBatch; ++b)
                {
                    int32_t const e = e0 + b * kColumnThreads;
                    int32_t const pp = e / m;
                    int32_t const t = e - pp * m;
                    at[b] = e < m * m && t <= pp ? pp * Smem::kQkStride + t : -1;
                    v[b] = at[b] >= 0 ? qkRow[(c0 + pp) * static_cast<int64_t>(d.hv) * d.chunk + t] : 0.0f;
                }
GDN_UNROLL
                for (int32_t b = 0; b < kQkBatch; ++b)
                    if (at[b] >= 0)
                        sQk[at[b]] = v[b];
            }
            __syncthreads();
            if (active)
            {
GDN_NO_UNROLL
                for (int32_t p = lanes.slice; p < m; p += kSplit)
                {
                    float const intra = gdnChunkIntra(sQk + p * Smem::kQkStride, &sVnew[0][lc], kColumns, p);
                    gdnStore(dtype, y, y0 + (c0 + p) * hvdv, addRn(sInter[p][lc], intra));
                }
            }
            __syncthreads(); // QK read by every lane before the k rows take its place
        }
        Rows::stage(sRows, kRows + c0 * qkw, qkw, m);
        __syncthreads();
        float const gl = sGam[m - 1];
        gdnSliceScale<kSlice>(s, expRn(gl));
GDN_NO_UNROLL
        for (int32_t p = 0; p < m; ++p)
        {
            float const f = expRn(subRn(gl, sGam[p]));
            gdnLoadSlice<kSlice>(row, sRows + p * Rows::kRowQuads + mine);
            gdnSliceChunkUpdate<kSlice>(s, row, f, sVnew[p][lc]);
        }
        __syncthreads(); // k and v_new read by every lane before the next chunk restages / rewrites them
    }
    if (active)
    {
GDN_UNROLL
        for (int32_t i = 0; i < kSlice; ++i)
            st[i * d.dv] = s[i];
    }
}

//! grid (B, ceil(C / (128 kVec))), after every reader of the slots' old records. Thread = channels
//! c .. c + kVec - 1 of request blockIdx.x: the conv state, the last K-1 raw inputs of [old state,
//! advanced tokens] (forward: context requests over their tokens; commit: generation requests over
//! their accepted tokens), all read before any is written (registers, fully unrolled). Forward:
//! generation requests' keys (kh) and decay (exp g) records of their verify tokens, spread over the
//! request's blocks, and every request's pending count 0 (its records are folded). Commit: pending =
//! the accepted count (gdnCommitCount) and the committed output.
template <class T, int kVec>
__global__ void __launch_bounds__(kElemThreads) gdnConvStateKernel(typename T::Storage const* __restrict__ x,
    int32_t const* __restrict__ cu, int32_t const* __restrict__ slots, int32_t const* __restrict__ numAccepted,
    int32_t const* __restrict__ zeroState, float const* __restrict__ kh, float const* __restrict__ gates,
    float* __restrict__ rnnPool, typename T::Storage* __restrict__ convPool, int32_t* __restrict__ committed, Dims d,
    bool commit)
{
    using S = typename T::Storage;
    int32_t const r = blockIdx.x;
    int64_t const c = (static_cast<int64_t>(blockIdx.y) * kElemThreads + threadIdx.x) * kVec;
    bool const ctx = r < d.numContext;
    int32_t const len = cu[r + 1] - cu[r];
    float* const slot = rnnPool + static_cast<int64_t>(slots[r]) * d.slotFloats;
    int32_t n;
    int64_t base;
    if (commit)
    {
        n = ctx ? 0 : gdnCommitCount(numAccepted[r], len, d.kv);
        base = static_cast<int64_t>(r) * d.kv;
        if (blockIdx.y == 0 && threadIdx.x == 0)
        {
            committed[r] = n;
            if (!ctx)
                *reinterpret_cast<int32_t*>(slot + d.offPending) = n;
        }
    }
    else
    {
        n = ctx ? len : 0;
        base = cu[r];
        if (blockIdx.y == 0 && threadIdx.x == 0)
            *reinterpret_cast<int32_t*>(slot + d.offPending) = 0;
        if (!ctx)
        {
            int32_t const nRec = min(len, d.kv);
            int64_t const qkw = static_cast<int64_t>(d.hk) * d.dk;
            int64_t const stride = static_cast<int64_t>(gridDim.y) * kElemThreads;
            int64_t const first = static_cast<int64_t>(blockIdx.y) * kElemThreads + threadIdx.x;
            for (int64_t e = first; e < nRec * qkw; e += stride) // keys [Hk][Kv][Dk] from kh rows [Hk Dk]
            {
                int64_t const t = e / qkw;
                int64_t const gi = e - t * qkw;
                int64_t const g = gi / d.dk;
                slot[d.offKeys + (g * d.kv + t) * d.dk + (gi - g * d.dk)] = kh[(base + t) * qkw + gi];
            }
            for (int64_t e = first; e < static_cast<int64_t>(nRec) * d.hv; e += stride) // decay [Hv][Kv]
            {
                int64_t const t = e / d.hv;
                int64_t const hh = e - t * d.hv;
                slot[d.offDecay + hh * d.kv + t] = expRn(gates[(base + t) * 2 * d.hv + hh]);
            }
        }
    }
    int32_t const keep = d.kc - 1;
    bool const zero = !commit && zeroInit(zeroState, r, d.numContext);
    // a zero_state context request overwrites its slot even with no tokens (zeros), as the CPU build
    if ((n == 0 && !zero) || c >= d.convDim || keep == 0)
        return;
    int64_t const C = d.convDim;
    S* st = convPool + static_cast<int64_t>(slots[r]) * keep * C;
    StorageVec<S, kVec> col[kGdnMaxConvKernel - 1];
#pragma unroll
    for (int32_t m = 0; m < kGdnMaxConvKernel - 1; ++m)
    {
        int32_t const pos = n - keep + m;
        if (m < keep)
        {
            if (pos >= 0)
                col[m] = loadVec<S, kVec>(x + (base + pos) * C + c);
            else if (!zero)
                col[m] = loadVec<S, kVec>(st + static_cast<int64_t>(pos + keep) * C + c);
            else
            {
#pragma unroll
                for (int v = 0; v < kVec; ++v)
                    col[m].v[v] = T::store(0.0f);
            }
        }
    }
#pragma unroll
    for (int32_t m = 0; m < kGdnMaxConvKernel - 1; ++m)
        if (m < keep)
            storeVec<S, kVec>(st + static_cast<int64_t>(m) * C + c, col[m]);
}

// ---------------------------------------------------------------------------------- launching
Status cudaStatus(char const* what, char* msg, size_t msgLen)
{
    cudaError_t const err = cudaGetLastError();
    if (err == cudaSuccess)
        return Status::kOK;
    std::snprintf(msg, msgLen, "DFlash2GatedDeltaNet: %s launch failed: %s", what, cudaGetErrorString(err));
    return Status::kCUDA_ERROR;
}

bool resolved(GatedDeltaNetParams const& p, char* msg, size_t msgLen)
{
    if (p.tokens < 0 || p.batch < 0 || p.convDim <= 0 || p.numContext < 0 || p.numContext > p.batch
        || p.batch > 0x7fffffff)
    {
        std::snprintf(msg, msgLen, "DFlash2GatedDeltaNet: launch with unresolved or invalid dims (T=%lld, B=%lld)",
            static_cast<long long>(p.tokens), static_cast<long long>(p.batch));
        return false;
    }
    return true;
}

struct Work
{
    void* xc; //!< [rows, C] in the activation dtype
    float *qh, *kh, *gates, *gam, *a, *qk, *u, *w;
};

Work carve(GatedDeltaNetParams const& p, void* ws)
{
    GatedDeltaNetWorkspace const l = gatedDeltaNetWorkspaceLayout(p);
    auto* base = static_cast<unsigned char*>(ws);
    auto f = [&](size_t off) { return reinterpret_cast<float*>(base + off); };
    return Work{base + l.xc, f(l.qh), f(l.kh), f(l.gates), f(l.gam), f(l.a), f(l.qk), f(l.u), f(l.w)};
}

unsigned gridStride(int64_t total, int threads)
{
    int64_t const blocks = (total + threads - 1) / threads;
    return static_cast<unsigned>(blocks < 65536 * 8 ? blocks : 65536 * 8);
}

bool commitMode(GatedDeltaNetParams const& p)
{
    return p.attrs.mode == static_cast<int32_t>(GdnMode::kCOMMIT);
}

//! True when every pointer is aligned for kVec-element accesses of S (null pointers are unused).
template <class S>
bool vecAligned(int kVec, std::initializer_list<void const*> ptrs)
{
    for (void const* q : ptrs)
        if (q != nullptr && reinterpret_cast<uintptr_t>(q) % (kVec * sizeof(S)) != 0)
            return false;
    return true;
}

//! The stages below the fused sequences are forward stages: the commit runs the conv state kernel alone.
Status forwardOnly(GatedDeltaNetParams const& p, char const* what, char* msg, size_t len)
{
    if (!commitMode(p))
        return Status::kOK;
    std::snprintf(msg, len, "DFlash2GatedDeltaNet: %s: a forward stage, launched with mode=commit", what);
    return Status::kINVALID;
}

//! The prologue kernel over the packed rows: conv + silu, and (parts.norm) the q/k l2norm,
//! (parts.gates) the gates. Four channels per thread when C and the pointers allow it.
template <class T>
Status prologueTyped(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, PrologueParts parts,
    char const* what, char* msg, size_t len)
{
    using S = typename T::Storage;
    Status const mode = forwardOnly(p, what, msg, len);
    if (mode != Status::kOK)
        return mode;
    Dims const d = dimsOf(p);
    int64_t const rows = p.tokens;
    if (rows == 0)
        return Status::kOK;
    if (rows > 0x7fffffff)
    {
        std::snprintf(msg, len, "DFlash2GatedDeltaNet: %s: %lld rows exceed the grid", what,
            static_cast<long long>(rows));
        return Status::kINVALID;
    }
    Work const wk = carve(p, g.workspace);
    S const* x = static_cast<S const*>(g.qkv);
    S* vq = static_cast<S*>(g.verifyQkv);
    float const scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.dk)));
    bool const vec4 = d.convDim % 4 == 0 && vecAligned<S>(4, {x, d.kc > 1 ? g.convPool : nullptr, wk.xc, vq});
    int const tile = kProThreads * (vec4 ? 4 : 1);
    dim3 const grid(static_cast<unsigned>(rows), static_cast<unsigned>((d.convDim + tile - 1) / tile));
    auto const kernel = vec4 ? gdnPrologueKernel<T, 4> : gdnPrologueKernel<T, 1>;
    kernel<<<grid, kProThreads, 0, s>>>(x, static_cast<S const*>(g.convWeight), static_cast<S const*>(g.a),
        static_cast<S const*>(g.b), g.dtBias, g.aLog, g.cuSeqlens, g.slots, g.zeroState,
        static_cast<S const*>(g.convPool), static_cast<S*>(wk.xc), wk.qh, wk.kh, wk.gates, vq, g.verifyGates, d, scale,
        parts);
    return cudaStatus(what, msg, len);
}

template <class T>
Status convTyped(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return prologueTyped<T>(p, g, s, PrologueParts{false, false}, "conv kernel", msg, len);
}

template <class T>
Status fusedPrologueTyped(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return prologueTyped<T>(p, g, s, PrologueParts{true, true}, "prologue kernel", msg, len);
}

template <class T>
Status qkNormTyped(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    Status const mode = forwardOnly(p, "q/k norm kernel", msg, len);
    if (mode != Status::kOK)
        return mode;
    Dims const d = dimsOf(p);
    if (p.tokens == 0)
        return Status::kOK;
    Work const wk = carve(p, g.workspace);
    float const scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.dk)));
    int64_t const total = p.tokens * d.hk * 2;
    gdnQkNormKernel<T><<<gridStride(total, kElemThreads), kElemThreads, 0, s>>>(
        static_cast<typename T::Storage const*>(wk.xc), wk.qh, wk.kh, p.tokens, d, scale);
    return cudaStatus("q/k norm kernel", msg, len);
}

template <class T>
Status gatesTyped(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    using S = typename T::Storage;
    Status const mode = forwardOnly(p, "gates kernel", msg, len);
    if (mode != Status::kOK)
        return mode;
    Dims const d = dimsOf(p);
    if (p.tokens == 0)
        return Status::kOK;
    Work const wk = carve(p, g.workspace);
    gdnGatesKernel<T><<<gridStride(p.tokens * d.hv, kElemThreads), kElemThreads, 0, s>>>(static_cast<S const*>(g.a),
        static_cast<S const*>(g.b), g.dtBias, g.aLog, g.cuSeqlens, wk.gates, g.verifyGates, p.tokens, d);
    return cudaStatus("gates kernel", msg, len);
}

//! The prefetching kernel's grid: its resident blocks (occupancy x SMs, at most the items), or 0 where it cannot run
//! (the pool or Dv not 16-byte granular, a CUDA query failing, no block fitting).
template <class Kernel>
int64_t prefetchGrid(Kernel kernel, size_t smemBytes, Dims const& d, int32_t blockCols, void const* pool)
{
    if (d.dv % 4 != 0 || (reinterpret_cast<uintptr_t>(pool) & 15u) != 0)
        return 0;
    int dev = 0, sms = 0, perSm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess
        || cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smemBytes))
            != cudaSuccess
        || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernel, kRecThreads, smemBytes) != cudaSuccess)
    {
        (void) cudaGetLastError(); // a refused query is a fallback, not this launch's error
        return 0;
    }
    int64_t const items = static_cast<int64_t>(d.batch) * d.hv * ((d.dv + blockCols - 1) / blockCols);
    int64_t const resident = static_cast<int64_t>(perSm) * sms;
    return resident < items ? resident : items;
}

//! DFLASH2_GDN_RECURRENT_PREFETCH=1 picks the prefetching persistent kernel at Dk 128 (an experiment for the GPU
//! checks: the same bits), anything else the one-item-per-block kernel. Read at each launch.
bool recurrentPrefetch()
{
    char const* v = std::getenv("DFLASH2_GDN_RECURRENT_PREFETCH");
    return v != nullptr && v[0] == '1' && v[1] == '\0';
}

template <int32_t kDk, int32_t kColsPerLane>
void recurrentTiled(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, Work const& wk, Dims const& d, cudaStream_t s)
{
    constexpr int32_t kCols = RecTile<kDk, kColsPerLane>::kBlockCols;
    constexpr size_t kStateBytes = RecStateTile<kDk, kColsPerLane>::kBytes;
    dim3 const grid(static_cast<unsigned>(d.batch), static_cast<unsigned>(d.hv),
        static_cast<unsigned>((d.dv + kCols - 1) / kCols));
    bool const prefetch = recurrentPrefetch();
    auto launch = [&](auto tag)
    {
        using T = decltype(tag);
        using S = typename T::Storage;
        // Dk 128 only (the published heads; below, ptxas spills the prefetching kernel on sm_100a)
        if constexpr (kDk == 128)
        {
            int64_t const blocks = prefetch
                ? prefetchGrid(gdnRecurrentPrefetchKernel<kDk, T, kColsPerLane>, kStateBytes, d, kCols, g.rnnPool)
                : 0;
            if (blocks > 0)
            {
                unsigned const n = static_cast<unsigned>(blocks);
                gdnRecurrentPrefetchKernel<kDk, T, kColsPerLane><<<n, kRecThreads, kStateBytes, s>>>(wk.qh, wk.kh,
                    static_cast<S const*>(wk.xc), wk.gates, g.cuSeqlens, g.slots, g.zeroState, g.rnnPool,
                    static_cast<S*>(g.y), d);
                return;
            }
        }
        gdnRecurrentKernel<kDk, T, kColsPerLane><<<grid, kRecThreads, 0, s>>>(wk.qh, wk.kh,
            static_cast<S const*>(wk.xc), wk.gates, g.cuSeqlens, g.slots, g.zeroState, g.rnnPool, static_cast<S*>(g.y),
            d);
    };
    switch (p.dataType)
    {
    case DType::kFLOAT16: launch(F16{}); break;
    case DType::kBFLOAT16: launch(BF16{}); break;
    default: launch(F32{}); break; // dtype checked by the stage
    }
}

//! State columns per lane at Dk = 128: DFLASH2_GDN_RECURRENT_COLS=1 picks one (an experiment for the GPU
//! checks: the same bits, another occupancy), anything else the default two. Read at each launch (a
//! getenv, not a CUDA call), so that one process can time both.
int32_t recurrentColsAt128()
{
    char const* v = std::getenv("DFLASH2_GDN_RECURRENT_COLS");
    return (v != nullptr && v[0] == '1' && v[1] == '\0') ? 1 : 2;
}

template <int32_t kDk>
void recurrentDk(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, Work const& wk, Dims const& d, cudaStream_t s)
{
    if constexpr (kDk == 128)
    {
        if (recurrentColsAt128() == 1)
        {
            recurrentTiled<kDk, 1>(p, g, wk, d, s);
            return;
        }
    }
    recurrentTiled<kDk, kRecDefaultCols<kDk>>(p, g, wk, d, s);
}

Status recurrentStage(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    Status const mode = forwardOnly(p, "recurrent kernel", msg, len);
    if (mode != Status::kOK)
        return mode;
    Dims const d = dimsOf(p);
    if (d.batch == 0)
        return Status::kOK;
    Work const wk = carve(p, g.workspace);
    switch (d.dk)
    {
    case 16: recurrentDk<16>(p, g, wk, d, s); break;
    case 32: recurrentDk<32>(p, g, wk, d, s); break;
    case 64: recurrentDk<64>(p, g, wk, d, s); break;
    default: recurrentDk<128>(p, g, wk, d, s); break;
    }
    return cudaStatus("recurrent kernel", msg, len);
}

int64_t maxChunks(GatedDeltaNetParams const& p)
{
    return (p.tokens + p.attrs.chunkSize - 1) / p.attrs.chunkSize + p.numContext;
}

Status matricesStage(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    Dims const d = dimsOf(p);
    if (d.numContext == 0 || p.tokens == 0 || d.chunk == 0)
        return Status::kOK;
    Work const wk = carve(p, g.workspace);
    dim3 const grid(static_cast<unsigned>(maxChunks(p)), static_cast<unsigned>(d.hv));
    gdnChunkMatricesKernel<<<grid, kMatrixThreads, 0, s>>>(wk.qh, wk.kh, wk.gates, g.cuSeqlens, wk.gam, wk.a, wk.qk, d);
    return cudaStatus("chunk matrices kernel", msg, len);
}

Status solveStage(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    Dims const d = dimsOf(p);
    if (d.numContext == 0 || p.tokens == 0 || d.chunk == 0)
        return Status::kOK;
    Work const wk = carve(p, g.workspace);
    dim3 const grid(static_cast<unsigned>(maxChunks(p)), static_cast<unsigned>(d.hv),
        static_cast<unsigned>((d.dv + d.dk + kSolveThreads - 1) / kSolveThreads));
    gdnChunkSolveKernel<<<grid, kSolveThreads, 0, s>>>(wk.xc, p.dataType, wk.kh, wk.gates, wk.gam, wk.a, g.cuSeqlens,
        wk.u, wk.w, d);
    return cudaStatus("chunk solve kernel", msg, len);
}

template <int32_t kDk>
void scanDk(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, Work const& wk, Dims const& d, cudaStream_t s)
{
    using Smem = ScanSmem<kDk>;
    constexpr int32_t kColumns = Smem::kColumns;
    dim3 const grid(static_cast<unsigned>(d.numContext), static_cast<unsigned>(d.hv),
        static_cast<unsigned>((d.dv + kColumns - 1) / kColumns));
    // over 48 KB of dynamic shared memory needs the opt-in (a refusal shows as the launch's error)
    if (cudaFuncSetAttribute(gdnChunkScanKernel<kDk>, cudaFuncAttributeMaxDynamicSharedMemorySize,
            static_cast<int>(Smem::kBytes))
        != cudaSuccess)
        return;
    gdnChunkScanKernel<kDk><<<grid, kColumnThreads, Smem::kBytes, s>>>(wk.qh, wk.kh, wk.gam, wk.qk, wk.u, wk.w,
        g.cuSeqlens, g.slots, g.zeroState, g.rnnPool, g.y, p.dataType, d);
}

Status scanStage(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    Dims const d = dimsOf(p);
    if (d.numContext == 0 || d.chunk == 0)
        return Status::kOK;
    Work const wk = carve(p, g.workspace);
    switch (d.dk)
    {
    case 16: scanDk<16>(p, g, wk, d, s); break;
    case 32: scanDk<32>(p, g, wk, d, s); break;
    case 64: scanDk<64>(p, g, wk, d, s); break;
    default: scanDk<128>(p, g, wk, d, s); break;
    }
    return cudaStatus("chunk scan kernel", msg, len);
}

template <class T>
Status convStateTyped(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    using S = typename T::Storage;
    Dims const d = dimsOf(p);
    bool const commit = commitMode(p);
    if (d.batch == 0)
        return Status::kOK;
    S const* x = static_cast<S const*>(commit ? g.verifyQkv : g.qkv);
    Work const wk = commit ? Work{} : carve(p, g.workspace);
    bool const vec4 = d.convDim % 4 == 0 && vecAligned<S>(4, {x, d.kc > 1 ? g.convPool : nullptr});
    int const per = kElemThreads * (vec4 ? 4 : 1);
    dim3 const grid(static_cast<unsigned>(d.batch), static_cast<unsigned>((d.convDim + per - 1) / per));
    auto const kernel = vec4 ? gdnConvStateKernel<T, 4> : gdnConvStateKernel<T, 1>;
    kernel<<<grid, kElemThreads, 0, s>>>(x, g.cuSeqlens, g.slots, g.numAccepted, g.zeroState, wk.kh, wk.gates,
        g.rnnPool, static_cast<S*>(g.convPool), g.committed, d, commit);
    return cudaStatus("conv state kernel", msg, len);
}

using Stage = Status (*)(GatedDeltaNetParams const&, GdnLaunchArgs const&, cudaStream_t, char*, size_t);

//! The stage for the params' dtype (or kINVALID with a message).
template <template <class> class F>
Status dispatch(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    if (!resolved(p, msg, len))
        return Status::kINVALID;
    switch (p.dataType)
    {
    case DType::kFLOAT32: return F<F32>::run(p, g, s, msg, len);
    case DType::kFLOAT16: return F<F16>::run(p, g, s, msg, len);
    case DType::kBFLOAT16: return F<BF16>::run(p, g, s, msg, len);
    default: break;
    }
    std::snprintf(msg, len, "DFlash2GatedDeltaNet: unsupported dtype %s", dtypeName(p.dataType));
    return Status::kINVALID;
}

//! A dtype-independent stage, with the same checks as dispatch.
Status checked(Stage st, GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    if (!resolved(p, msg, len))
        return Status::kINVALID;
    if (p.dataType != DType::kFLOAT32 && p.dataType != DType::kFLOAT16 && p.dataType != DType::kBFLOAT16)
    {
        std::snprintf(msg, len, "DFlash2GatedDeltaNet: unsupported dtype %s", dtypeName(p.dataType));
        return Status::kINVALID;
    }
    return st(p, g, s, msg, len);
}

#define DF2_GDN_STAGE(Name, fn)                                                                                        \
    template <class T>                                                                                                 \
    struct Name                                                                                                        \
    {                                                                                                                  \
        static Status run(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len) \
        {                                                                                                              \
            return fn<T>(p, g, s, msg, len);                                                                           \
        }                                                                                                              \
    };
DF2_GDN_STAGE(ConvStage, convTyped)
DF2_GDN_STAGE(PrologueStage, fusedPrologueTyped)
DF2_GDN_STAGE(QkNormStage, qkNormTyped)
DF2_GDN_STAGE(GatesStage, gatesTyped)
DF2_GDN_STAGE(ConvStateStage, convStateTyped)
#undef DF2_GDN_STAGE

} // namespace

Status launchGdnConv(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return dispatch<ConvStage>(p, g, s, msg, len);
}

Status launchGdnPrologue(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return dispatch<PrologueStage>(p, g, s, msg, len);
}

Status launchGdnQkNorm(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return dispatch<QkNormStage>(p, g, s, msg, len);
}

Status launchGdnGates(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return dispatch<GatesStage>(p, g, s, msg, len);
}

Status launchGdnRecurrent(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return checked(recurrentStage, p, g, s, msg, len);
}

Status launchGdnChunkMatrices(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return checked(matricesStage, p, g, s, msg, len);
}

Status launchGdnChunkSolve(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return checked(solveStage, p, g, s, msg, len);
}

Status launchGdnChunkScan(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return checked(scanStage, p, g, s, msg, len);
}

Status launchGdnConvState(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return dispatch<ConvStateStage>(p, g, s, msg, len);
}

Status launchGatedDeltaNetForward(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg,
    size_t len)
{
    if (commitMode(p))
    {
        std::snprintf(msg, len, "DFlash2GatedDeltaNet: forward launched with mode=commit");
        return Status::kINVALID;
    }
    // the prologue stores and the recurrence loads the workspace's qh / kh rows as float4 (every segment starts at a
    // multiple of 256 bytes from its base, gatedDeltaNetParams.cpp): a base off 16 bytes would fault, not err
    if ((reinterpret_cast<uintptr_t>(g.workspace) & 15u) != 0)
    {
        std::snprintf(msg, len, "DFlash2GatedDeltaNet: workspace %p is not 16-byte aligned", g.workspace);
        return Status::kINVALID;
    }
    Stage const stages[] = {launchGdnPrologue, launchGdnRecurrent, launchGdnChunkMatrices, launchGdnChunkSolve,
        launchGdnChunkScan, launchGdnConvState};
    for (Stage st : stages)
    {
        Status const r = st(p, g, s, msg, len);
        if (r != Status::kOK)
            return r;
    }
    return Status::kOK;
}

Status launchGatedDeltaNetCommit(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg,
    size_t len)
{
    if (!commitMode(p))
    {
        std::snprintf(msg, len, "DFlash2GatedDeltaNet: commit launched with mode=forward");
        return Status::kINVALID;
    }
    // Deferred: the pending counts (the next forward folds that many records) and the conv state.
    return launchGdnConvState(p, g, s, msg, len);
}

} // namespace dflash2
