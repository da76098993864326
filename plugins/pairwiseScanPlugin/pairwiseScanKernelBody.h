/*
 * DFlash2PairwiseScan: the one-launch kernel's body as __host__ __device__ code. The CUDA kernels
 * (pairwiseScanKernel.cu) run pairwiseScanBlock / pairwiseWalkBlock with a device executor (one
 * call per thread, __syncthreads, the cluster barrier and distributed shared memory); the host
 * emulation test (tests/plugins/kernel_emulation.cpp) runs the same functions with a host executor
 * (every thread of a phase in turn, in both orders) and compares every output bit with the CPU
 * build. The phases and the barriers between them are written once, here.
 *
 * One batch row b = one cluster of `ranks` CTAs (a single CTA when ranks == 1). Rank q owns the
 * lattice slices l = q, q + ranks, q + 2 ranks, ... ("slots"). Per CTA:
 *   prologue  the row's candidate ids, unary, anchor (and in sample mode the temperature and the
 *             uniforms) and, as fp32, the hidden rows Hh[b, l] of its slots; every load at once.
 *   rounds    each warp pair ("group", 64 threads) takes one slot per round:
 *     stage   gathers the slot's predecessor rows A[pred] (x Hh[b, l] -> ctx, latticeContext) and
 *             successor rows Bc[cand[b, l, c]] into shared memory as fp32, 16 gathers in flight per
 *             thread (ids outside [0, V) read a zero row, as the CPU build does);
 *     compute the slot's K x K scores: a thread owns 2 predecessor rows x 2 candidates and runs the
 *             four sums over r in order with one latticeAccumulate (fma) per step, the CPU build's
 *             order, from 16-byte shared-memory reads. At l = 0 every row is the anchor's: one sum
 *             per candidate, written to all K rows (the CPU build's rows are bit-identical).
 *             The scores go to the CTA's lattice copy and, when given, to the lattice workspace.
 *   rows      greedy / sample: each row (l, p) of the slots -> its choice (greedyRowChoice, or
 *             sampleRowChoice with q = p), written into rank 0's shared memory (through the
 *             cluster's distributed shared memory); viterbi: the slices themselves go to rank 0.
 *   cluster barrier; ranks other than 0 are done.
 *   walk      rank 0: greedy / sample = L dependent reads of the choice table; viterbi = the
 *             max-plus relaxation (viterbiRelax per candidate, one barrier per step), then the
 *             final argmax and the backtrack; then ids and q.
 * Every reduction runs the CPU build's loop (pairwiseScanMath.h) in one thread, so the results are
 * bit-identical to it by construction; parallelism is only across independent sums and rows.
 */
#pragma once

#include "pairwiseScanMath.h"
#include "pairwiseScanParams.h"

#if !defined(__CUDA_ARCH__)
#include <cassert>
#endif

// nvcc also compiles the __host__ __device__ body for the host, where g++ does not know the pragma.
#if defined(__CUDA_ARCH__)
#define DF2_SCAN_UNROLL _Pragma("unroll")
#define DF2_SCAN_UNROLL_2 _Pragma("unroll 2")
#define DF2_SCAN_UNROLL_4 _Pragma("unroll 4")
#else
#define DF2_SCAN_UNROLL
#define DF2_SCAN_UNROLL_2
#define DF2_SCAN_UNROLL_4
#endif

namespace dflash2
{

constexpr int32_t kScanGroupThreads = 64; //!< one warp pair per lattice slice: 16 x 16 scores, 2 x 2 per thread
constexpr int32_t kScanMaxGroups = 4;     //!< warp pairs per CTA (256 threads: up to 255 registers each)
constexpr int32_t kScanMaxRanks = 8;      //!< CTAs per batch row (portable cluster size)
constexpr int32_t kScanRowPad = 4;        //!< staged rows are R + 4 floats apart: conflict-free 16-byte reads
constexpr int32_t kScanGatherChunk = 16;  //!< 16-byte gathers in flight per thread while staging
constexpr int32_t kScanWalkThreads = 256; //!< walk-only kernel: one CTA per batch row

//! What every CTA of a row keeps in shared memory (rank 0's copy is the one the walk reads).
struct alignas(16) ScanRowSmem
{
    float lat[kScanMaxLength * kScanMaxTopK * kScanMaxTopK]; //!< [l][p][c] scores of this CTA's slots
    float q[kScanMaxLength * kScanMaxTopK * kScanMaxTopK];   //!< sample: softmax of every row
    int32_t tok[1 + kScanMaxLength * kScanMaxTopK]; //!< [0] the anchor, [1 + l * K + c] cand[b, l, c]
    float unary[kScanMaxLength * kScanMaxTopK];
    int32_t choice[kScanMaxLength * kScanMaxTopK]; //!< greedy / sample: the choice of every row (l, p)
    int32_t back[kScanMaxLength * kScanMaxTopK];   //!< viterbi backpointers [l][c]
    float best[2][kScanMaxTopK];                   //!< viterbi: best path scores, double-buffered
    float u[kScanMaxLength + 1];
    int32_t idx[kScanMaxLength + 1]; //!< the walk's candidate index per position
    float temperature;
    int32_t sampleRows; //!< 1: sample mode with a usable temperature (rows are softmax-sampled)
};

//! A launch's geometry, decided by planPairwiseScan (the launcher and the emulation use it alike).
struct ScanPlan
{
    int32_t ranks{1};     //!< CTAs per batch row (a cluster when > 1): 1, 2, 4 or 8
    int32_t rankShift{0}; //!< log2(ranks)
    int32_t groups{1};    //!< warp pairs per CTA
    int32_t threads{64};  //!< groups * 64
    int32_t slotsMax{1};  //!< slices of rank 0 (the most of any rank): ceil(L / ranks)
    int32_t rowStride{0}; //!< R + kScanRowPad floats
    int32_t vecMagic{0};  //!< ceil(2^20 / (R / N)): q / (R / N) == (q * vecMagic) >> 20 for q < 4096
    size_t hOffset{0};    //!< byte offsets in the dynamic shared memory: fp32 Hh rows [slotsMax][R]
    size_t stageOffset{0}; //!< staging: groups x (ctx [K][rowStride], succ [K][rowStride]) fp32
    size_t smemBytes{0};
};

//! Bytes of shared memory for the given ranks and groups.
inline ScanPlan scanPlanFor(int32_t L, int32_t K, int32_t R, int32_t elemBytes, int32_t ranks, int32_t groups)
{
    ScanPlan p;
    p.ranks = ranks;
    while ((1 << p.rankShift) < ranks)
        ++p.rankShift;
    p.slotsMax = (L + ranks - 1) / ranks;
    p.groups = groups;
    p.threads = groups * kScanGroupThreads;
    p.rowStride = R + kScanRowPad;
    int32_t const vpr = R / (16 / elemBytes);
    p.vecMagic = ((1 << 20) + vpr - 1) / vpr;
    p.hOffset = sizeof(ScanRowSmem);
    p.stageOffset = p.hOffset + static_cast<size_t>(p.slotsMax) * R * sizeof(float);
    p.smemBytes = p.stageOffset + static_cast<size_t>(groups) * 2 * K * p.rowStride * sizeof(float);
    return p;
}

//! The launch plan: `ranks` CTAs per row (a power of two <= 8 and <= L, chosen by the launcher
//! from the SM count and the batch), then as many warp pairs as rank 0 has slots, at most 8 and
//! at most what fits in smemLimit bytes. groups == 0 in the result: it does not fit.
inline ScanPlan planPairwiseScan(int32_t L, int32_t K, int32_t R, int32_t elemBytes, int32_t ranks, size_t smemLimit)
{
    ScanPlan p = scanPlanFor(L, K, R, elemBytes, ranks, 1);
    int32_t groups = p.slotsMax < kScanMaxGroups ? p.slotsMax : kScanMaxGroups;
    while (groups > 0 && scanPlanFor(L, K, R, elemBytes, ranks, groups).smemBytes > smemLimit)
        --groups;
    if (groups == 0)
    {
        p.groups = 0;
        return p;
    }
    return scanPlanFor(L, K, R, elemBytes, ranks, groups);
}

//! Arguments of one launch (device pointers; lattice may be null, ids/q unused without the walk).
template <class S>
struct ScanArgs
{
    float const* unary{nullptr};
    int32_t const* cand{nullptr};
    S const* hidden{nullptr};
    int32_t const* anchor{nullptr};
    S const* predCb{nullptr};
    S const* succCb{nullptr};
    float const* temperature{nullptr};
    float const* uniforms{nullptr};
    float* lattice{nullptr}; //!< [B, L, K, K] output (workspace) or input (walk-only), or null
    int32_t* ids{nullptr};
    float* q{nullptr};
    int64_t vocab{0};
    int32_t L{0};
    int32_t K{0};
    int32_t R{0};
    int32_t mode{0};
    int32_t walk{1}; //!< 0: lattice only (launchPairwiseLattice)
    ScanPlan plan;
};

// ---------------------------------------------------------------------------------------------
// 16-byte accesses (device: one vector instruction; host: the same bytes + an alignment check)
// ---------------------------------------------------------------------------------------------
struct alignas(16) ScanRaw
{
    uint32_t w[4];
};

struct alignas(16) ScanF4
{
    float x, y, z, w;
};

template <class V>
DF2_HD V scanLoad16(void const* p)
{
#if defined(__CUDA_ARCH__)
    return *static_cast<V const*>(p);
#else
    assert((reinterpret_cast<uintptr_t>(p) & 15u) == 0 && "16-byte vector access misaligned");
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
#endif
}

//! Four floats to a 16-byte aligned address (device: float4, so that one st.v4 is emitted even
//! where the values come from different branches).
DF2_HD void scanStoreF4(float* p, float x, float y, float z, float w)
{
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<float4*>(p) = make_float4(x, y, z, w);
#else
    assert((reinterpret_cast<uintptr_t>(p) & 15u) == 0 && "16-byte vector access misaligned");
    float const v[4] = {x, y, z, w};
    std::memcpy(p, v, sizeof(v));
#endif
}

//! Element e of a 16-byte vector of storage values, converted with T::load.
template <class T>
DF2_HD float scanElem(ScanRaw const& r, int e)
{
    if constexpr (sizeof(typename T::Storage) == 2)
        return T::load(static_cast<typename T::Storage>((r.w[e >> 1] >> (16 * (e & 1))) & 0xffffu));
    else
        return T::load(bitsFloat(r.w[e]));
}

//! q / (R / N) for 0 <= q < 4096 (q * vpr < 2^19 keeps the rounding error below one step).
DF2_HD int32_t scanDivVec(int32_t q, int32_t magic)
{
#if !defined(__CUDA_ARCH__)
    assert(q >= 0 && q < 4096);
#endif
    return static_cast<int32_t>((static_cast<uint32_t>(q) * static_cast<uint32_t>(magic)) >> 20);
}

DF2_HD ScanRowSmem& scanRowSmem(unsigned char* smem)
{
    return *reinterpret_cast<ScanRowSmem*>(smem);
}

//! Slots (slices) of `rank`: l = rank, rank + ranks, ... < L (ranks = 1 << plan.rankShift).
DF2_HD int32_t scanSlots(int32_t L, ScanPlan const& plan, int32_t rank)
{
    return rank < L ? (L - rank + plan.ranks - 1) >> plan.rankShift : 0;
}

// ---------------------------------------------------------------------------------------------
// Phases (one call per thread; the driver below puts the barriers between them)
// ---------------------------------------------------------------------------------------------
template <class T>
DF2_HD void scanPrologue(ScanArgs<typename T::Storage> const& a, int64_t b, int32_t rank, int32_t tid,
    unsigned char* smem)
{
    constexpr int NV = 16 / static_cast<int>(sizeof(typename T::Storage));
    ScanRowSmem& sm = scanRowSmem(smem);
    int32_t const LK = a.L * a.K;
    int32_t const nt = a.plan.threads;
    for (int32_t i = tid; i < LK; i += nt)
    {
        sm.tok[1 + i] = a.cand[b * LK + i];
        sm.unary[i] = a.unary[b * LK + i];
    }
    // temperature and uniforms are read only by the walk (lattice only: they may be null)
    bool const sample = a.walk && a.mode == static_cast<int32_t>(ScanMode::kSAMPLE);
    if (tid == 0)
    {
        sm.tok[0] = a.anchor[b];
        float const t = sample ? a.temperature[b] : 0.0f;
        sm.temperature = t;
        sm.sampleRows = (sample && temperatureUsable(t)) ? 1 : 0;
    }
    if (sample)
        for (int32_t i = tid; i < a.L; i += nt)
            sm.u[i] = a.uniforms[b * a.L + i];
    // Hh rows of this CTA's slots, as fp32
    int32_t const vpr = a.R / NV;
    int32_t const items = scanSlots(a.L, a.plan, rank) * vpr;
    float* const sH = reinterpret_cast<float*>(smem + a.plan.hOffset);
    for (int32_t it = tid; it < items; it += nt)
    {
        int32_t const slot = scanDivVec(it, a.plan.vecMagic);
        int32_t const v = it - slot * vpr;
        int32_t const l = rank + slot * a.plan.ranks;
        ScanRaw const h = scanLoad16<ScanRaw>(a.hidden + ((b * a.L + l) * a.R + v * NV));
        float hf[NV];
        DF2_SCAN_UNROLL
        for (int e = 0; e < NV; ++e)
            hf[e] = scanElem<T>(h, e);
        DF2_SCAN_UNROLL
        for (int e = 0; e < NV; e += 4)
            scanStoreF4(sH + slot * a.R + v * NV + e, hf[e], hf[e + 1], hf[e + 2], hf[e + 3]);
    }
}

//! Staging of slot s = round * groups + group: ctx rows (1 at l = 0, else K) and K successor rows,
//! gathered and converted to fp32. A lane pair (lanes i and i + 16 of a warp) takes 32 vectors of
//! one row (512 B: one bf16 row at R = 256), lane half h the vectors 2k + h: each load instruction
//! reads whole 32-byte sectors, a thread needs one token id and its 16 loads are in flight
//! together at immediate offsets. Consecutive lanes take consecutive rows, so the fp32 stores
//! (row stride R + 4 floats) are conflict-free.
template <class T>
DF2_HD void scanStage(ScanArgs<typename T::Storage> const& a, int32_t rank, int32_t tid, unsigned char* smem,
    int32_t round)
{
    using S = typename T::Storage;
    constexpr int NV = 16 / static_cast<int>(sizeof(S));
    constexpr int kPairs = kScanGroupThreads / 2; // lane pairs per group
    ScanRowSmem const& sm = scanRowSmem(smem);
    int32_t const g = tid / kScanGroupThreads;
    int32_t const gl = tid - g * kScanGroupThreads;
    int32_t const s = round * a.plan.groups + g;
    if (s >= scanSlots(a.L, a.plan, rank))
        return;
    int32_t const K = a.K;
    int32_t const l = rank + s * a.plan.ranks;
    int32_t const ctxRows = l == 0 ? 1 : K;
    int32_t const rows = ctxRows + K;
    int32_t const vpr = a.R / NV;
    int32_t const segs = (vpr + 2 * kScanGatherChunk - 1) / (2 * kScanGatherChunk);
    int32_t const runs = rows * segs;
    int32_t const rs = a.plan.rowStride;
    float* const ctx = reinterpret_cast<float*>(smem + a.plan.stageOffset) + static_cast<size_t>(g) * 2 * K * rs;
    float* const succ = ctx + K * rs;
    float const* const sH = reinterpret_cast<float const*>(smem + a.plan.hOffset) + s * a.R;
    int32_t const lane = gl & 31;
    int32_t const h = lane >> 4;
    for (int32_t pr = (gl >> 5) * (kPairs / 2) + (lane & 15); pr < runs; pr += kPairs)
    {
        int32_t const seg = pr / rows;
        int32_t const row = pr - seg * rows;
        // row r of the slot is token tok[l == 0 ? r : (l - 1) K + r + 1]: the anchor at l = 0,
        // cand[b, l - 1, r] for the ctx rows, cand[b, l, r - K] for the successor rows
        int32_t const id = sm.tok[l == 0 ? row : (l - 1) * K + row + 1];
        // an id outside [0, V) reads a zero row, as in the CPU build: its loads are predicated off
        // (the address stays inside row 0) and the zeros are converted like any row
        bool const use = tokenInRange(id, a.vocab);
        S const* const cb = row < ctxRows ? a.predCb : a.succCb;
        int32_t const v0 = seg * 2 * kScanGatherChunk + h;
        size_t const rowId = use ? static_cast<uint32_t>(id) : 0u;
        S const* const src = cb + (rowId * static_cast<uint32_t>(a.R) + static_cast<uint32_t>(v0 * NV));
        ScanRaw buf[kScanGatherChunk];
        DF2_SCAN_UNROLL
        for (int k = 0; k < kScanGatherChunk; ++k) // every gather of the run before any use
        {
            buf[k] = ScanRaw{};
            if (use && v0 + 2 * k < vpr)
                buf[k] = scanLoad16<ScanRaw>(src + 2 * k * NV);
        }
        float* const dstRow = row < ctxRows ? ctx + row * rs : succ + (row - ctxRows) * rs;
        DF2_SCAN_UNROLL
        for (int k = 0; k < kScanGatherChunk; ++k)
        {
            int32_t const v = v0 + 2 * k;
            if (v >= vpr)
                break;
            float f[NV];
            if (row < ctxRows)
            {
                DF2_SCAN_UNROLL
                for (int e = 0; e < NV; e += 4)
                {
                    ScanF4 const hv = scanLoad16<ScanF4>(sH + v * NV + e);
                    f[e + 0] = latticeContext(scanElem<T>(buf[k], e + 0), hv.x);
                    f[e + 1] = latticeContext(scanElem<T>(buf[k], e + 1), hv.y);
                    f[e + 2] = latticeContext(scanElem<T>(buf[k], e + 2), hv.z);
                    f[e + 3] = latticeContext(scanElem<T>(buf[k], e + 3), hv.w);
                }
            }
            else
            {
                DF2_SCAN_UNROLL
                for (int e = 0; e < NV; ++e)
                    f[e] = scanElem<T>(buf[k], e);
            }
            DF2_SCAN_UNROLL
            for (int e = 0; e < NV; e += 4)
                scanStoreF4(dstRow + v * NV + e, f[e], f[e + 1], f[e + 2], f[e + 3]);
        }
    }
}

//! The scores of slot s = round * groups + group from its staged rows.
template <class S>
DF2_HD void scanCompute(ScanArgs<S> const& a, int64_t b, int32_t rank, int32_t tid, unsigned char* smem,
    int32_t round)
{
    ScanRowSmem& sm = scanRowSmem(smem);
    int32_t const g = tid / kScanGroupThreads;
    int32_t const gl = tid - g * kScanGroupThreads;
    int32_t const s = round * a.plan.groups + g;
    if (s >= scanSlots(a.L, a.plan, rank))
        return;
    int32_t const K = a.K;
    int32_t const R = a.R;
    int32_t const l = rank + s * a.plan.ranks;
    int32_t const rs = a.plan.rowStride;
    float const* const ctx
        = reinterpret_cast<float const*>(smem + a.plan.stageOffset) + static_cast<size_t>(g) * 2 * K * rs;
    float const* const succ = ctx + K * rs;
    float* const lat = sm.lat + l * K * K;
    float* const glat = a.lattice != nullptr ? a.lattice + (b * a.L + l) * K * K : nullptr;
    if (l == 0)
    {
        // every predecessor row is the anchor's: one sum per candidate, copied to all K rows
        if (gl >= K)
            return;
        int32_t const c = gl;
        float const* const sc = succ + c * rs;
        float acc = 0.0f;
        DF2_SCAN_UNROLL_2
        for (int32_t r = 0; r < R; r += 4)
        {
            ScanF4 const x = scanLoad16<ScanF4>(ctx + r);
            ScanF4 const y = scanLoad16<ScanF4>(sc + r);
            acc = latticeAccumulate(acc, x.x, y.x);
            acc = latticeAccumulate(acc, x.y, y.y);
            acc = latticeAccumulate(acc, x.z, y.z);
            acc = latticeAccumulate(acc, x.w, y.w);
        }
        float const score = latticeScore(sm.unary[c], acc);
        for (int32_t p = 0; p < K; ++p)
        {
            lat[p * K + c] = score;
            if (glat != nullptr)
                glat[p * K + c] = score;
        }
        return;
    }
    // rows p0 = pg, p1 = pg + 8; candidates c0 = cg, c1 = cg + 8. In a warp the 4 row-groups and
    // the 8 candidate-groups are consecutive rows: with the R + 4 stride every 16-byte read is
    // one conflict-free wavefront. Rows past K-1 read row K-1 and are not written.
    int32_t const lane = gl & 31;
    int32_t const pg = (gl >> 5) * 4 + (lane >> 3);
    int32_t const cg = lane & 7;
    int32_t const p0 = pg, p1 = pg + 8, c0 = cg, c1 = cg + 8;
    int32_t const km = K - 1;
    float const* a0 = ctx + (p0 < K ? p0 : km) * rs;
    float const* a1 = ctx + (p1 < K ? p1 : km) * rs;
    float const* b0 = succ + (c0 < K ? c0 : km) * rs;
    float const* b1 = succ + (c1 < K ? c1 : km) * rs;
    float acc00 = 0.0f, acc01 = 0.0f, acc10 = 0.0f, acc11 = 0.0f;
    DF2_SCAN_UNROLL_4
    for (int32_t r = 0; r < R; r += 4, a0 += 4, a1 += 4, b0 += 4, b1 += 4)
    {
        ScanF4 const x0 = scanLoad16<ScanF4>(a0);
        ScanF4 const x1 = scanLoad16<ScanF4>(a1);
        ScanF4 const y0 = scanLoad16<ScanF4>(b0);
        ScanF4 const y1 = scanLoad16<ScanF4>(b1);
        acc00 = latticeAccumulate(acc00, x0.x, y0.x);
        acc01 = latticeAccumulate(acc01, x0.x, y1.x);
        acc10 = latticeAccumulate(acc10, x1.x, y0.x);
        acc11 = latticeAccumulate(acc11, x1.x, y1.x);
        acc00 = latticeAccumulate(acc00, x0.y, y0.y);
        acc01 = latticeAccumulate(acc01, x0.y, y1.y);
        acc10 = latticeAccumulate(acc10, x1.y, y0.y);
        acc11 = latticeAccumulate(acc11, x1.y, y1.y);
        acc00 = latticeAccumulate(acc00, x0.z, y0.z);
        acc01 = latticeAccumulate(acc01, x0.z, y1.z);
        acc10 = latticeAccumulate(acc10, x1.z, y0.z);
        acc11 = latticeAccumulate(acc11, x1.z, y1.z);
        acc00 = latticeAccumulate(acc00, x0.w, y0.w);
        acc01 = latticeAccumulate(acc01, x0.w, y1.w);
        acc10 = latticeAccumulate(acc10, x1.w, y0.w);
        acc11 = latticeAccumulate(acc11, x1.w, y1.w);
    }
    float const accs[2][2] = {{acc00, acc01}, {acc10, acc11}};
    int32_t const ps[2] = {p0, p1};
    int32_t const cs[2] = {c0, c1};
    DF2_SCAN_UNROLL
    for (int i = 0; i < 2; ++i)
        DF2_SCAN_UNROLL
        for (int j = 0; j < 2; ++j)
            if (ps[i] < K && cs[j] < K)
            {
                float const score = latticeScore(sm.unary[l * K + cs[j]], accs[i][j]);
                lat[ps[i] * K + cs[j]] = score;
                if (glat != nullptr)
                    glat[ps[i] * K + cs[j]] = score;
            }
}

//! greedy / sample: the choice (and sample's q row) of every row of this CTA's slots, into
//! rank 0's tables `dst` (this CTA's own when rank == 0); viterbi: this CTA's slices into dst's
//! lattice (rank 0 already has its own).
template <class S>
DF2_HD void scanRows(ScanArgs<S> const& a, int32_t rank, int32_t tid, unsigned char* smem, ScanRowSmem* dst)
{
    ScanRowSmem& sm = scanRowSmem(smem);
    int32_t const K = a.K;
    int32_t const ranks = a.plan.ranks;
    int32_t const slots = scanSlots(a.L, a.plan, rank);
    int32_t const nt = a.plan.threads;
    if (a.mode == static_cast<int32_t>(ScanMode::kVITERBI))
    {
        if (rank == 0)
            return;
        int32_t const KK = K * K;
        for (int32_t i = tid; i < slots * KK; i += nt)
        {
            int32_t const s = i / KK;
            int32_t const o = (rank + s * ranks) * KK + (i - s * KK);
            dst->lat[o] = sm.lat[o];
        }
        return;
    }
    for (int32_t t = tid; t < slots * K; t += nt)
    {
        int32_t const s = t / K;
        int32_t const p = t - s * K;
        int32_t const l = rank + s * ranks;
        if (l == 0 && p != 0)
            continue; // the walk starts from row 0 of position 0
        int32_t const r = l * K + p;
        float const* const row = sm.lat + r * K;
        int32_t choice;
        if (sm.sampleRows)
        {
            float* const qrow = sm.q + r * K;
            choice = sampleRowChoice<kScanMaxTopK>(row, K, sm.temperature, sm.u[l], qrow);
            if (rank != 0)
                for (int32_t c = 0; c < K; ++c)
                    dst->q[r * K + c] = qrow[c];
        }
        else
        {
            choice = greedyRowChoice<kScanMaxTopK>(row, K);
        }
        dst->choice[r] = choice;
    }
}

//! Rank 0, viterbi: best[0] = the anchor's row of position 0.
template <class S>
DF2_HD void scanViterbiInit(ScanArgs<S> const& a, int32_t tid, unsigned char* smem)
{
    ScanRowSmem& sm = scanRowSmem(smem);
    if (tid < a.K)
        sm.best[0][tid] = sm.lat[tid];
}

//! Rank 0, viterbi step l >= 1: candidate c = tid relaxes over the predecessors (viterbiRelax).
template <class S>
DF2_HD void scanViterbiStep(ScanArgs<S> const& a, int32_t tid, unsigned char* smem, int32_t l)
{
    ScanRowSmem& sm = scanRowSmem(smem);
    int32_t const K = a.K;
    if (tid >= K)
        return;
    int32_t bp = 0;
    float const v = viterbiRelax<kScanMaxTopK>(sm.best[(l - 1) & 1], sm.lat + l * K * K, K, tid, &bp);
    sm.best[l & 1][tid] = v;
    sm.back[l * K + tid] = bp;
}

//! Rank 0, thread 0: the walk's candidate index per position.
template <class S>
DF2_HD void scanWalk(ScanArgs<S> const& a, int32_t tid, unsigned char* smem)
{
    if (tid != 0)
        return;
    ScanRowSmem& sm = scanRowSmem(smem);
    int32_t const K = a.K;
    if (a.mode == static_cast<int32_t>(ScanMode::kVITERBI))
    {
        int32_t arg = greedyRowChoice<kScanMaxTopK>(sm.best[(a.L - 1) & 1], K);
        for (int32_t l = a.L - 1; l >= 0; --l)
        {
            sm.idx[l] = arg;
            if (l > 0)
                arg = sm.back[l * K + arg];
        }
        return;
    }
    int32_t prev = 0;
    for (int32_t l = 0; l < a.L; ++l)
    {
        prev = sm.choice[l * K + prev];
        sm.idx[l] = prev;
    }
}

//! Rank 0: ids [b, l] and q [b, l, :] (sample with a usable temperature: the chosen row's softmax;
//! otherwise one-hot).
template <class S>
DF2_HD void scanOutput(ScanArgs<S> const& a, int64_t b, int32_t tid, unsigned char* smem)
{
    ScanRowSmem const& sm = scanRowSmem(smem);
    int32_t const K = a.K;
    int32_t const nt = a.plan.threads;
    bool const soft = a.mode == static_cast<int32_t>(ScanMode::kSAMPLE) && sm.sampleRows;
    for (int32_t i = tid; i < a.L * K; i += nt)
    {
        int32_t const l = i / K;
        int32_t const c = i - l * K;
        float v;
        if (soft)
        {
            int32_t const prev = l == 0 ? 0 : sm.idx[l - 1];
            v = sm.q[(l * K + prev) * K + c];
        }
        else
        {
            v = c == sm.idx[l] ? 1.0f : 0.0f;
        }
        a.q[b * a.L * K + i] = v;
    }
    for (int32_t l = tid; l < a.L; l += nt)
        a.ids[b * a.L + l] = sm.tok[1 + l * K + sm.idx[l]];
}

//! Rank 0's walk after the rows (both kernels): viterbi relaxation, the walk, the outputs.
template <class S, class Exec>
DF2_HD void scanFinish(ScanArgs<S> const& a, int64_t b, unsigned char* smem, Exec& ex)
{
    if (a.mode == static_cast<int32_t>(ScanMode::kVITERBI))
    {
        ex.forThreads([&](int32_t tid) { scanViterbiInit(a, tid, smem); });
        ex.sync();
        for (int32_t l = 1; l < a.L; ++l)
        {
            ex.forThreads([&](int32_t tid) { scanViterbiStep(a, tid, smem, l); });
            ex.sync();
        }
    }
    ex.forThreads([&](int32_t tid) { scanWalk(a, tid, smem); });
    ex.sync();
    ex.forThreads([&](int32_t tid) { scanOutput(a, b, tid, smem); });
}

// ---------------------------------------------------------------------------------------------
// Drivers: the phases of one CTA in order, with the barriers between them. Exec provides
//   rank(), row(), smem(), forThreads(f) (f(tid) for this thread / every thread), sync()
//   (the CTA barrier), clusterWaitStarted() (before the first write into rank 0's shared
//   memory), rank0() (rank 0's ScanRowSmem, through the cluster when rank != 0) and
//   clusterSync() (the cluster barrier with release/acquire; the CTA barrier when ranks == 1).
// ---------------------------------------------------------------------------------------------
template <class T, class Exec>
DF2_HD void pairwiseScanBlock(ScanArgs<typename T::Storage> const& a, Exec& ex)
{
    int32_t const rank = ex.rank();
    int64_t const b = ex.row();
    unsigned char* const smem = ex.smem();
    ex.forThreads([&](int32_t tid) { scanPrologue<T>(a, b, rank, tid, smem); });
    ex.sync();
    int32_t const slots = scanSlots(a.L, a.plan, rank);
    int32_t const rounds = (slots + a.plan.groups - 1) / a.plan.groups;
    for (int32_t round = 0; round < rounds; ++round)
    {
        ex.forThreads([&](int32_t tid) { scanStage<T>(a, rank, tid, smem, round); });
        ex.sync();
        ex.forThreads([&](int32_t tid) { scanCompute(a, b, rank, tid, smem, round); });
        ex.sync();
    }
    if (!a.walk)
        return;
    ex.clusterWaitStarted();
    ScanRowSmem* const dst = ex.rank0();
    ex.forThreads([&](int32_t tid) { scanRows(a, rank, tid, smem, dst); });
    ex.clusterSync();
    if (rank != 0)
        return;
    scanFinish(a, b, smem, ex);
}

//! Walk only, over a given lattice (launchPairwiseWalk): one CTA per row, ranks == 1.
template <class S>
DF2_HD void scanWalkPrologue(ScanArgs<S> const& a, int64_t b, int32_t tid, unsigned char* smem)
{
    ScanRowSmem& sm = scanRowSmem(smem);
    int32_t const LK = a.L * a.K;
    int32_t const nt = a.plan.threads;
    for (int32_t i = tid; i < LK; i += nt)
        sm.tok[1 + i] = a.cand[b * LK + i];
    for (int32_t i = tid; i < LK * a.K; i += nt)
        sm.lat[i] = a.lattice[b * LK * a.K + i];
    bool const sample = a.mode == static_cast<int32_t>(ScanMode::kSAMPLE);
    if (tid == 0)
    {
        float const t = sample ? a.temperature[b] : 0.0f;
        sm.temperature = t;
        sm.sampleRows = (sample && temperatureUsable(t)) ? 1 : 0;
    }
    if (sample)
        for (int32_t i = tid; i < a.L; i += nt)
            sm.u[i] = a.uniforms[b * a.L + i];
}

template <class S, class Exec>
DF2_HD void pairwiseWalkBlock(ScanArgs<S> const& a, Exec& ex)
{
    int64_t const b = ex.row();
    unsigned char* const smem = ex.smem();
    ex.forThreads([&](int32_t tid) { scanWalkPrologue(a, b, tid, smem); });
    ex.sync();
    ScanRowSmem* const dst = &scanRowSmem(smem);
    ex.forThreads([&](int32_t tid) { scanRows(a, 0, tid, smem, dst); });
    ex.sync();
    scanFinish(a, b, smem, ex);
}

} // namespace dflash2
