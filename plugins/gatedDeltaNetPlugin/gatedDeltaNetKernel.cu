#include "gatedDeltaNetKernel.h"
#include "gatedDeltaNetMath.h"

#include <cstdio>

/*
 * Every kernel is a thin index mapping around one function of gatedDeltaNetMath.h, which the CPU
 * build (gatedDeltaNetCpu.cpp) calls in the same order, so the GPU computes bit for bit what the
 * CPU build computes. Row spaces: forward = the packed tokens (request r owns rows
 * [cu[r], cu[r+1])); commit = the B x Kv verify rows (request r owns rows [r Kv, r Kv + Kv)).
 * A state column (Dk fp32 values) lives in one thread's registers (kDk is a template argument).
 */

namespace dflash2
{
namespace
{

constexpr int kColumnThreads = 128; // recurrence / scan: 128 / kSplit state columns per block
constexpr int kElemThreads = 128;  // conv, norms, gates, conv state
constexpr int kMatrixThreads = 128;
constexpr int kSolveThreads = 64;
constexpr int64_t kMaxGridY = 65535;

//! Request owning packed row `row` (< T): the last r with cu[r] <= row (empty requests skipped).
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

//! Where row `row` of the call's row space belongs: request r, position p, the request's first
//! row, and whether a stage must process it (commit: only the rows to commit).
struct RowInfo
{
    int32_t r;
    int32_t p;
    int64_t base;
    bool active;
};

__device__ __forceinline__ RowInfo rowInfo(bool commit, int32_t const* cu, int32_t const* numAccepted, int32_t batch,
    int32_t numContext, int32_t kv, int64_t row)
{
    RowInfo info;
    if (commit)
    {
        info.r = static_cast<int32_t>(row / kv);
        info.p = static_cast<int32_t>(row - static_cast<int64_t>(info.r) * kv);
        info.base = static_cast<int64_t>(info.r) * kv;
        info.active = info.r >= numContext
            && info.p < gdnCommitCount(numAccepted[info.r], cu[info.r + 1] - cu[info.r], kv);
    }
    else
    {
        info.r = requestOfRow(cu, batch, row);
        info.base = cu[info.r];
        info.p = static_cast<int32_t>(row - info.base);
        info.active = true;
    }
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
};

Dims dimsOf(GatedDeltaNetParams const& p)
{
    auto const& a = p.attrs;
    return Dims{static_cast<int32_t>(p.batch), p.numContext, a.numKHeads, a.numVHeads, a.headKDim, a.headVDim,
        a.convKernel, a.maxVerifyTokens, a.chunkSize, p.convDim};
}

// ------------------------------------------------------------------------------------ kernels
template <class T>
__global__ void __launch_bounds__(kElemThreads) gdnConvKernel(typename T::Storage const* __restrict__ x,
    typename T::Storage const* __restrict__ w, int32_t const* __restrict__ cu, int32_t const* __restrict__ slots,
    int32_t const* __restrict__ numAccepted, int32_t const* __restrict__ zeroState,
    typename T::Storage const* __restrict__ convPool, typename T::Storage* __restrict__ xc,
    typename T::Storage* __restrict__ verifyQkv, int64_t rows, Dims d, int64_t cLo, bool commit)
{
    using S = typename T::Storage;
    int64_t const c = cLo + static_cast<int64_t>(blockIdx.x) * kElemThreads + threadIdx.x;
    if (c >= d.convDim)
        return;
    int64_t const C = d.convDim;
    int64_t const keep = d.kc - 1;
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y)
    {
        RowInfo const ri = rowInfo(commit, cu, numAccepted, d.batch, d.numContext, d.kv, row);
        if (!ri.active)
            continue;
        S const* st = zeroInit(zeroState, ri.r, d.numContext) ? nullptr
                                                              : convPool + static_cast<int64_t>(slots[ri.r]) * keep * C;
        xc[row * C + c] = gdnConvSilu<T>(x + ri.base * C, C, st, C, w, d.kc, ri.p, c);
        if (!commit && ri.r >= d.numContext && ri.p < d.kv)
            verifyQkv[(static_cast<int64_t>(ri.r) * d.kv + ri.p) * C + c] = x[row * C + c];
    }
}

template <class T>
__global__ void __launch_bounds__(kElemThreads) gdnQkNormKernel(typename T::Storage const* __restrict__ xc,
    int32_t const* __restrict__ cu, int32_t const* __restrict__ numAccepted, float* __restrict__ qh,
    float* __restrict__ kh, int64_t rows, Dims d, float scale, bool commit)
{
    int32_t const parts = commit ? 1 : 2; // commit: k only
    int64_t const total = rows * d.hk * parts;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * kElemThreads + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * kElemThreads)
    {
        int64_t const row = e / (d.hk * parts);
        int32_t const rem = static_cast<int32_t>(e - row * d.hk * parts);
        int32_t const g = rem / parts;
        bool const isK = commit || (rem % parts) == 1;
        RowInfo const ri = rowInfo(commit, cu, numAccepted, d.batch, d.numContext, d.kv, row);
        if (!ri.active)
            continue;
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
        RowInfo const ri = rowInfo(false, cu, nullptr, d.batch, d.numContext, d.kv, row);
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

//! grid (B, Hv, ceil(Dv / columns per block)); kSplit lanes = one state column of value head
//! blockIdx.y of request blockIdx.x (the steps of gdnRecurrentColumn in gatedDeltaNetCpu.cpp).
template <int32_t kDk>
__global__ void __launch_bounds__(kColumnThreads) gdnRecurrentKernel(float const* __restrict__ qh,
    float const* __restrict__ kh, void const* __restrict__ xc, float const* __restrict__ gates,
    int32_t const* __restrict__ cu, int32_t const* __restrict__ slots, int32_t const* __restrict__ numAccepted,
    int32_t const* __restrict__ zeroState, float* __restrict__ rnnPool, void* __restrict__ y, DType dtype, Dims d,
    bool commit)
{
    constexpr int32_t kSplit = kGdnSplit<kDk>;
    constexpr int32_t kSlice = kDk / kSplit;
    ColumnLanes<kSplit> const lanes(static_cast<int32_t>(blockIdx.z));
    int32_t const r = blockIdx.x;
    int32_t const h = blockIdx.y;
    int32_t const j = lanes.col;
    if (j >= d.dv)
        return; // all lanes of the column leave together
    bool const ctx = r < d.numContext;
    int32_t const len = cu[r + 1] - cu[r];
    int32_t n;
    int64_t base;
    bool write;
    if (commit)
    {
        if (ctx)
            return;
        n = gdnCommitCount(numAccepted[r], len, d.kv);
        base = static_cast<int64_t>(r) * d.kv;
        write = n > 0;
    }
    else
    {
        if (ctx && d.chunk > 0)
            return; // the chunked kernels handle it
        n = len;
        base = cu[r];
        write = ctx;
    }
    int32_t const kHead = h / (d.hv / d.hk);
    int64_t const qkw = static_cast<int64_t>(d.hk) * kDk;
    int32_t const off = lanes.slice * kSlice;
    float* st = rnnPool + (static_cast<int64_t>(slots[r]) * d.hv + h) * kDk * d.dv + static_cast<int64_t>(off) * d.dv + j;
    float const* kRow = kh + base * qkw + kHead * kDk + off;
    float const* qRow = qh + base * qkw + kHead * kDk + off;
    float const* gRow = gates + base * 2 * d.hv + h;
    int64_t const v0 = base * d.convDim + 2 * qkw + static_cast<int64_t>(h) * d.dv + j;
    int64_t const y0 = base * d.hv * d.dv + static_cast<int64_t>(h) * d.dv + j;
    int64_t const yStride = static_cast<int64_t>(d.hv) * d.dv;
    bool const zero = !commit && zeroInit(zeroState, r, d.numContext);
    float s[kSlice];
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
        s[i] = zero ? 0.0f : st[i * d.dv];
GDN_NO_UNROLL
    for (int32_t p = 0; p < n; ++p)
    {
        float const* kp = kRow + p * qkw;
        float const decay = expRn(gRow[p * 2 * d.hv]);
        float const beta = gRow[p * 2 * d.hv + d.hv];
        float const kv = lanes.combine(gdnSliceDecayDot<kSlice>(s, kp, decay));
        float const delta = gdnDelta(gdnLoad(dtype, xc, v0 + p * d.convDim), kv, beta);
        gdnSliceUpdate<kSlice>(s, kp, delta);
        if (!commit)
        {
            float const o = lanes.combine(gdnSliceDot<kSlice>(s, qRow + p * qkw));
            if (lanes.slice == 0)
                gdnStore(dtype, y, y0 + p * yStride, o);
        }
    }
    if (write)
    {
GDN_UNROLL
        for (int32_t i = 0; i < kSlice; ++i)
            st[i * d.dv] = s[i];
    }
}

//! grid (chunks, Hv): gam (thread 0, in order), then the A and QK entries of the chunk.
__global__ void __launch_bounds__(kMatrixThreads) gdnChunkMatricesKernel(float const* __restrict__ qh,
    float const* __restrict__ kh, float const* __restrict__ gates, int32_t const* __restrict__ cu,
    float* __restrict__ gam, float* __restrict__ amat, float* __restrict__ qk, Dims d)
{
    int32_t r, c0, m;
    if (!findChunk(cu, d.numContext, d.chunk, blockIdx.x, &r, &c0, &m))
        return;
    int32_t const h = blockIdx.y;
    int32_t const kHead = h / (d.hv / d.hk);
    int64_t const row0 = static_cast<int64_t>(cu[r]) + c0;
    int64_t const qkw = static_cast<int64_t>(d.hk) * d.dk;
    if (threadIdx.x == 0)
        gdnChunkCumDecay(gates + row0 * 2 * d.hv + h, 2 * d.hv, m, gam + row0 * d.hv + h, d.hv);
    __syncthreads();
    for (int32_t e = threadIdx.x; e < m * m; e += kMatrixThreads)
    {
        int32_t const pp = e / m;
        int32_t const s = e - pp * m;
        if (s > pp)
            continue;
        int64_t const rp = row0 + pp;
        int64_t const rs = row0 + s;
        float const gp = gam[rp * d.hv + h];
        float const gs = gam[rs * d.hv + h];
        float const* ks = kh + rs * qkw + static_cast<int64_t>(kHead) * d.dk;
        int64_t const at = (rp * d.hv + h) * d.chunk + s;
        qk[at] = gdnChunkQKEntry(qh + rp * qkw + static_cast<int64_t>(kHead) * d.dk, ks, gp, gs, d.dk);
        if (s < pp)
            amat[at] = gdnChunkAEntry(kh + rp * qkw + static_cast<int64_t>(kHead) * d.dk, ks,
                gates[rp * 2 * d.hv + d.hv + h], gp, gs, d.dk);
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

//! grid (numContext, Hv, ceil(Dv / columns per block)); kSplit lanes = one state column,
//! sequential over the request's chunks (the steps of chunkScanColumn in gatedDeltaNetCpu.cpp).
//! v_new of the current chunk lives in shared memory, written by the column's slice-0 lane.
//! Four blocks per SM: caps ptxas at 128 registers (its own choice on sm_100a, 80, spills at Dk 32).
template <int32_t kDk>
__global__ void __launch_bounds__(kColumnThreads, 4) gdnChunkScanKernel(float const* __restrict__ qh,
    float const* __restrict__ kh, float const* __restrict__ gam, float const* __restrict__ qk,
    float const* __restrict__ u, float const* __restrict__ w, int32_t const* __restrict__ cu,
    int32_t const* __restrict__ slots, int32_t const* __restrict__ zeroState, float* __restrict__ rnnPool,
    void* __restrict__ y, DType dtype, Dims d)
{
    constexpr int32_t kSplit = kGdnSplit<kDk>;
    constexpr int32_t kSlice = kDk / kSplit;
    constexpr int32_t kColumns = ColumnLanes<kSplit>::kColumns;
    __shared__ float sVnew[kGdnMaxChunkSize][kColumns];
    ColumnLanes<kSplit> const lanes(static_cast<int32_t>(blockIdx.z));
    int32_t const r = blockIdx.x;
    int32_t const h = blockIdx.y;
    int32_t const j = lanes.col;
    if (j >= d.dv)
        return;
    int32_t const lc = static_cast<int32_t>(threadIdx.x) / kSplit; // column within the block
    int32_t const kHead = h / (d.hv / d.hk);
    int64_t const base = cu[r];
    int32_t const n = cu[r + 1] - cu[r];
    int64_t const qkw = static_cast<int64_t>(d.hk) * kDk;
    int32_t const off = lanes.slice * kSlice;
    int64_t const hvdv = static_cast<int64_t>(d.hv) * d.dv;
    float* st = rnnPool + (static_cast<int64_t>(slots[r]) * d.hv + h) * kDk * d.dv + static_cast<int64_t>(off) * d.dv + j;
    float const* qRow = qh + base * qkw + kHead * kDk + off;
    float const* kRow = kh + base * qkw + kHead * kDk + off;
    float const* gRow = gam + base * d.hv + h;
    float const* qkRow = qk + (base * d.hv + h) * d.chunk;
    float const* uRow = u + (base * d.hv + h) * d.dv + j;
    float const* wRow = w + (base * d.hv + h) * kDk + off;
    int64_t const y0 = base * hvdv + static_cast<int64_t>(h) * d.dv + j;
    bool const zero = zeroInit(zeroState, r, d.numContext);
    float s[kSlice];
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
        s[i] = zero ? 0.0f : st[i * d.dv];
GDN_NO_UNROLL
    for (int32_t c0 = 0; c0 < n; c0 += d.chunk)
    {
        int32_t const m = min(d.chunk, n - c0);
GDN_NO_UNROLL
        for (int32_t p = 0; p < m; ++p)
        {
            float const ws = lanes.combine(gdnSliceFmaDot<kSlice>(s, wRow + (c0 + p) * static_cast<int64_t>(d.hv) * kDk));
            if (lanes.slice == 0)
                sVnew[p][lc] = subRn(uRow[(c0 + p) * hvdv], ws);
        }
        __syncwarp(lanes.mask);
GDN_NO_UNROLL
        for (int32_t p = 0; p < m; ++p)
        {
            float const e = expRn(gRow[(c0 + p) * d.hv]);
            float const inter = lanes.combine(gdnSliceDecayedDot<kSlice>(s, qRow + (c0 + p) * qkw, e));
            if (lanes.slice == 0)
            {
                float const intra = gdnChunkIntra(qkRow + (c0 + p) * static_cast<int64_t>(d.hv) * d.chunk, &sVnew[0][lc],
                    kColumns, p);
                gdnStore(dtype, y, y0 + (c0 + p) * hvdv, addRn(inter, intra));
            }
        }
        float const gl = gRow[(c0 + m - 1) * d.hv];
        gdnSliceScale<kSlice>(s, expRn(gl));
GDN_NO_UNROLL
        for (int32_t p = 0; p < m; ++p)
        {
            float const f = expRn(subRn(gl, gRow[(c0 + p) * d.hv]));
            gdnSliceChunkUpdate<kSlice>(s, kRow + (c0 + p) * qkw, f, sVnew[p][lc]);
        }
        __syncwarp(lanes.mask); // every lane has read sVnew before the next chunk overwrites it
    }
GDN_UNROLL
    for (int32_t i = 0; i < kSlice; ++i)
        st[i * d.dv] = s[i];
}

//! grid (B, ceil(C / 128)); thread = channel c of request blockIdx.x: the last K-1 raw inputs of
//! [old state, advanced tokens], all read before any is written (registers, fully unrolled).
template <class T>
__global__ void __launch_bounds__(kElemThreads) gdnConvStateKernel(typename T::Storage const* __restrict__ x,
    int32_t const* __restrict__ cu, int32_t const* __restrict__ slots, int32_t const* __restrict__ numAccepted,
    int32_t const* __restrict__ zeroState, typename T::Storage* __restrict__ convPool, int32_t* __restrict__ committed,
    Dims d, bool commit)
{
    using S = typename T::Storage;
    int32_t const r = blockIdx.x;
    int64_t const c = static_cast<int64_t>(blockIdx.y) * kElemThreads + threadIdx.x;
    bool const ctx = r < d.numContext;
    int32_t const len = cu[r + 1] - cu[r];
    int32_t n;
    int64_t base;
    if (commit)
    {
        n = ctx ? 0 : gdnCommitCount(numAccepted[r], len, d.kv);
        base = static_cast<int64_t>(r) * d.kv;
        if (blockIdx.y == 0 && threadIdx.x == 0)
            committed[r] = n;
    }
    else
    {
        n = ctx ? len : 0;
        base = cu[r];
    }
    int32_t const keep = d.kc - 1;
    if (n == 0 || c >= d.convDim || keep == 0)
        return;
    int64_t const C = d.convDim;
    S* st = convPool + static_cast<int64_t>(slots[r]) * keep * C;
    bool const zero = !commit && zeroInit(zeroState, r, d.numContext);
    S col[kGdnMaxConvKernel - 1];
#pragma unroll
    for (int32_t m = 0; m < kGdnMaxConvKernel - 1; ++m)
    {
        int32_t const pos = n - keep + m;
        if (m < keep)
            col[m] = pos >= 0 ? x[(base + pos) * C + c] : (zero ? T::store(0.0f) : st[static_cast<int64_t>(pos + keep) * C + c]);
    }
#pragma unroll
    for (int32_t m = 0; m < kGdnMaxConvKernel - 1; ++m)
        if (m < keep)
            st[static_cast<int64_t>(m) * C + c] = col[m];
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

unsigned gridY(int64_t rows)
{
    return static_cast<unsigned>(rows < kMaxGridY ? rows : kMaxGridY);
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

template <class T>
Status convTyped(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    using S = typename T::Storage;
    Dims const d = dimsOf(p);
    bool const commit = commitMode(p);
    int64_t const cLo = commit ? static_cast<int64_t>(d.hk) * d.dk : 0; // the commit reads no q
    int64_t const rows = p.tokens;
    if (rows == 0)
        return Status::kOK;
    Work const wk = carve(p, g.workspace);
    dim3 const grid(static_cast<unsigned>((d.convDim - cLo + kElemThreads - 1) / kElemThreads), gridY(rows));
    S const* x = static_cast<S const*>(commit ? g.verifyQkv : g.qkv);
    gdnConvKernel<T><<<grid, kElemThreads, 0, s>>>(x, static_cast<S const*>(g.convWeight), g.cuSeqlens, g.slots,
        g.numAccepted, commit ? nullptr : g.zeroState, static_cast<S const*>(g.convPool), static_cast<S*>(wk.xc), commit ? nullptr : static_cast<S*>(g.verifyQkv), rows, d, cLo, commit);
    return cudaStatus("conv kernel", msg, len);
}

template <class T>
Status qkNormTyped(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    Dims const d = dimsOf(p);
    bool const commit = commitMode(p);
    if (p.tokens == 0)
        return Status::kOK;
    Work const wk = carve(p, g.workspace);
    float const scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.dk)));
    int64_t const total = p.tokens * d.hk * (commit ? 1 : 2);
    gdnQkNormKernel<T><<<gridStride(total, kElemThreads), kElemThreads, 0, s>>>(
        static_cast<typename T::Storage const*>(wk.xc), g.cuSeqlens, g.numAccepted, wk.qh, wk.kh, p.tokens, d, scale,
        commit);
    return cudaStatus("q/k norm kernel", msg, len);
}

template <class T>
Status gatesTyped(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    using S = typename T::Storage;
    Dims const d = dimsOf(p);
    if (p.tokens == 0)
        return Status::kOK;
    Work const wk = carve(p, g.workspace);
    gdnGatesKernel<T><<<gridStride(p.tokens * d.hv, kElemThreads), kElemThreads, 0, s>>>(static_cast<S const*>(g.a),
        static_cast<S const*>(g.b), g.dtBias, g.aLog, g.cuSeqlens, wk.gates, g.verifyGates, p.tokens, d);
    return cudaStatus("gates kernel", msg, len);
}

template <int32_t kDk>
void recurrentDk(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, Work const& wk, Dims const& d, cudaStream_t s)
{
    bool const commit = commitMode(p);
    constexpr int32_t kColumns = ColumnLanes<kGdnSplit<kDk>>::kColumns;
    dim3 const grid(static_cast<unsigned>(d.batch), static_cast<unsigned>(d.hv),
        static_cast<unsigned>((d.dv + kColumns - 1) / kColumns));
    gdnRecurrentKernel<kDk><<<grid, kColumnThreads, 0, s>>>(wk.qh, wk.kh, wk.xc, commit ? g.verifyGates : wk.gates,
        g.cuSeqlens, g.slots, g.numAccepted, g.zeroState, g.rnnPool, g.y, p.dataType, d, commit);
}

Status recurrentStage(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
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
    constexpr int32_t kColumns = ColumnLanes<kGdnSplit<kDk>>::kColumns;
    dim3 const grid(static_cast<unsigned>(d.numContext), static_cast<unsigned>(d.hv),
        static_cast<unsigned>((d.dv + kColumns - 1) / kColumns));
    gdnChunkScanKernel<kDk><<<grid, kColumnThreads, 0, s>>>(wk.qh, wk.kh, wk.gam, wk.qk, wk.u, wk.w, g.cuSeqlens,
        g.slots, g.zeroState, g.rnnPool, g.y, p.dataType, d);
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
    if (d.batch == 0 || (!commit && d.numContext == 0))
        return Status::kOK;
    dim3 const grid(static_cast<unsigned>(d.batch), static_cast<unsigned>((d.convDim + kElemThreads - 1) / kElemThreads));
    S const* x = static_cast<S const*>(commit ? g.verifyQkv : g.qkv);
    gdnConvStateKernel<T><<<grid, kElemThreads, 0, s>>>(x, g.cuSeqlens, g.slots, g.numAccepted, g.zeroState,
        static_cast<S*>(g.convPool), g.committed, d, commit);
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
DF2_GDN_STAGE(QkNormStage, qkNormTyped)
DF2_GDN_STAGE(GatesStage, gatesTyped)
DF2_GDN_STAGE(ConvStateStage, convStateTyped)
#undef DF2_GDN_STAGE

} // namespace

Status launchGdnConv(GatedDeltaNetParams const& p, GdnLaunchArgs const& g, cudaStream_t s, char* msg, size_t len)
{
    return dispatch<ConvStage>(p, g, s, msg, len);
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
    Stage const stages[] = {launchGdnConv, launchGdnQkNorm, launchGdnGates, launchGdnRecurrent, launchGdnChunkMatrices,
        launchGdnChunkSolve, launchGdnChunkScan, launchGdnConvState};
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
    // The conv reads the committed conv state, so the conv state kernel runs last.
    Stage const stages[] = {launchGdnConv, launchGdnQkNorm, launchGdnRecurrent, launchGdnConvState};
    for (Stage st : stages)
    {
        Status const r = st(p, g, s, msg, len);
        if (r != Status::kOK)
            return r;
    }
    return Status::kOK;
}

} // namespace dflash2
