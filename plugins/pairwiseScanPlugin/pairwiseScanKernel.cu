#include "pairwiseScanKernel.h"
#include "pairwiseScanMath.h"

#include <cstdio>

namespace dflash2
{
namespace
{

constexpr int kLatticeThreads = 128;   // 16 candidates x 8 row pairs
constexpr int kRowsPerThread = 2;
constexpr int kStageR = 256;           // rank elements staged per pass (R 256: one pass, all loads in flight)
constexpr int kStagePad = 4;           // row stride 260 floats: 16-byte aligned, float4 reads conflict-free
constexpr int kWalkWarps = 2;
constexpr unsigned kFull = 0xffffffffu;

static_assert(kLatticeThreads * kRowsPerThread >= kScanMaxTopK * kScanMaxTopK, "one thread per (row pair, candidate)");
static_assert(kStageR % 8 == 0 && kScanRankMultiple % 8 == 0, "16-byte vector staging");

template <class S>
struct alignas(16) Vec16
{
    S v[16 / sizeof(S)];
};

//! One block per (b, l). Stage: ctx rows (A[pred] * Hh) and successor rows for all K candidates,
//! kStageR rank elements per pass, with 16-byte loads all issued before the first use. Compute:
//! thread (c, row pair) keeps two accumulators and walks r in order with one fma per step, which
//! is the CPU build's order (pairwiseScanMath.h), so the lattice is bit-identical to it.
template <class T>
__global__ void __launch_bounds__(kLatticeThreads) pairwiseLatticeKernel(float const* __restrict__ unary,
    int32_t const* __restrict__ cand, typename T::Storage const* __restrict__ hidden,
    int32_t const* __restrict__ anchor, typename T::Storage const* __restrict__ predCb,
    typename T::Storage const* __restrict__ succCb, float* __restrict__ lattice, int32_t L, int32_t K, int32_t R,
    int64_t V)
{
    using S = typename T::Storage;
    constexpr int NV = 16 / sizeof(S); // elements per 16-byte vector
    __shared__ __align__(16) float sCtx[kScanMaxTopK][kStageR + kStagePad];
    __shared__ __align__(16) float sSucc[kScanMaxTopK][kStageR + kStagePad];
    __shared__ int32_t sPred[kScanMaxTopK];
    __shared__ int32_t sSuccId[kScanMaxTopK];

    int64_t const bl = blockIdx.x; // b * L + l
    int32_t const l = static_cast<int32_t>(bl % L);
    int64_t const b = bl / L;
    int32_t const tid = threadIdx.x;
    if (tid < K)
    {
        // l = 0: every predecessor row is the anchor's.
        sPred[tid] = (l == 0) ? anchor[b] : cand[(bl - 1) * K + tid];
        sSuccId[tid] = cand[bl * K + tid];
    }
    __syncthreads();

    int32_t const c = tid % kScanMaxTopK;
    int32_t const row0 = (tid / kScanMaxTopK) * kRowsPerThread;
    bool const active = c < K && row0 < K;
    bool const second = row0 + 1 < K;
    float acc0 = 0.0f;
    float acc1 = 0.0f;
    S const* hrow = hidden + bl * R;
    for (int32_t r0 = 0; r0 < R; r0 += kStageR)
    {
        int32_t const n = min(kStageR, R - r0); // multiple of 8 (validated R)
        int32_t const vecPerRow = n / NV;
        // table 0 = ctx rows, table 1 = successor rows; K rows each. Unrolled so that several
        // independent 16-byte gathers are in flight per thread (codebook rows are random HBM rows).
#pragma unroll 4
        for (int32_t e = tid; e < 2 * K * vecPerRow; e += kLatticeThreads)
        {
            int32_t const table = e / (K * vecPerRow);
            int32_t const rem = e - table * K * vecPerRow;
            int32_t const k = rem / vecPerRow;
            int32_t const rr = (rem - k * vecPerRow) * NV;
            int32_t const id = table == 0 ? sPred[k] : sSuccId[k];
            S const* cb = table == 0 ? predCb : succCb;
            Vec16<S> v;
            if (tokenInRange(id, V))
                v = *reinterpret_cast<Vec16<S> const*>(cb + static_cast<int64_t>(id) * R + r0 + rr);
            else
                for (int i = 0; i < NV; ++i)
                    v.v[i] = T::store(0.0f); // out-of-range id: a zero row, never an out-of-bounds read
            float* dst = table == 0 ? &sCtx[k][rr] : &sSucc[k][rr];
            if (table == 0)
            {
                Vec16<S> const h = *reinterpret_cast<Vec16<S> const*>(hrow + r0 + rr);
#pragma unroll
                for (int i = 0; i < NV; ++i)
                    dst[i] = latticeContext(T::load(v.v[i]), T::load(h.v[i]));
            }
            else
            {
#pragma unroll
                for (int i = 0; i < NV; ++i)
                    dst[i] = T::load(v.v[i]);
            }
        }
        __syncthreads();
        if (active)
        {
            float const* a0 = sCtx[row0];
            float const* a1 = sCtx[second ? row0 + 1 : row0];
            float const* sc = sSucc[c];
            for (int32_t rr = 0; rr < n; rr += 4)
            {
                float4 const s4 = *reinterpret_cast<float4 const*>(sc + rr);
                float4 const x4 = *reinterpret_cast<float4 const*>(a0 + rr);
                float4 const y4 = *reinterpret_cast<float4 const*>(a1 + rr);
                acc0 = latticeAccumulate(acc0, x4.x, s4.x);
                acc1 = latticeAccumulate(acc1, y4.x, s4.x);
                acc0 = latticeAccumulate(acc0, x4.y, s4.y);
                acc1 = latticeAccumulate(acc1, y4.y, s4.y);
                acc0 = latticeAccumulate(acc0, x4.z, s4.z);
                acc1 = latticeAccumulate(acc1, y4.z, s4.z);
                acc0 = latticeAccumulate(acc0, x4.w, s4.w);
                acc1 = latticeAccumulate(acc1, y4.w, s4.w);
            }
        }
        __syncthreads();
    }
    if (active)
    {
        float const u = unary[bl * K + c];
        lattice[(bl * K + row0) * K + c] = latticeScore(u, acc0);
        if (second)
            lattice[(bl * K + row0 + 1) * K + c] = latticeScore(u, acc1);
    }
}

__device__ __forceinline__ void warpArgmax(float& v, int32_t& i)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
    {
        float const ov = __shfl_xor_sync(kFull, v, off);
        int32_t const oi = __shfl_xor_sync(kFull, i, off);
        if (scanBetter(ov, oi, v, i))
        {
            v = ov;
            i = oi;
        }
    }
}

//! One warp per batch row; lane c owns candidate c. The row's whole lattice slice is first copied
//! to shared memory (all loads in flight at once) so that the L dependent steps never wait on
//! global memory. Sums and cumsums run on lane 0 in index order.
__global__ void __launch_bounds__(kWalkWarps * 32) pairwiseWalkKernel(float const* __restrict__ lattice,
    int32_t const* __restrict__ cand, float const* __restrict__ temperature, float const* __restrict__ uniforms,
    int32_t* __restrict__ ids, float* __restrict__ q, int64_t B, int32_t L, int32_t K, int32_t mode)
{
    __shared__ float sLat[kWalkWarps][kScanMaxLength * kScanMaxTopK * kScanMaxTopK];
    __shared__ float sVal[kWalkWarps][32];
    __shared__ int8_t sBack[kWalkWarps][kScanMaxLength * kScanMaxTopK];
    __shared__ int32_t sIdx[kWalkWarps][kScanMaxLength];

    int32_t const lane = threadIdx.x & 31;
    int32_t const w = threadIdx.x >> 5;
    int64_t const b = static_cast<int64_t>(blockIdx.x) * kWalkWarps + w;
    if (b >= B)
        return; // whole warp leaves together; only __syncwarp is used below
    float const* glat = lattice + b * L * K * K;
    float* lat = sLat[w];
    for (int32_t i = lane; i < L * K * K; i += 32)
        lat[i] = glat[i];
    __syncwarp();
    float* qb = q + b * L * K;
    bool const valid = lane < K;
    float const kNegInf = -__int_as_float(0x7f800000);

    if (mode == static_cast<int32_t>(ScanMode::kVITERBI))
    {
        if (valid)
            sVal[w][lane] = lat[lane];
        __syncwarp();
        for (int32_t l = 1; l < L; ++l)
        {
            float nb = 0.0f;
            int32_t bp = 0;
            if (valid)
                nb = viterbiRelax(sVal[w], lat + static_cast<int64_t>(l) * K * K, K, lane, &bp);
            __syncwarp();
            if (valid)
            {
                sVal[w][lane] = nb;
                sBack[w][l * K + lane] = static_cast<int8_t>(bp);
            }
            __syncwarp();
        }
        float v = valid ? sVal[w][lane] : kNegInf;
        int32_t i = valid ? lane : 0x7fffffff;
        warpArgmax(v, i);
        if (lane == 0)
        {
            int32_t arg = i;
            for (int32_t l = L - 1; l >= 0; --l)
            {
                sIdx[w][l] = arg;
                arg = sBack[w][l * K + arg];
            }
        }
        __syncwarp();
        for (int32_t l = 0; l < L; ++l)
        {
            int32_t const choice = sIdx[w][l];
            if (valid)
                qb[l * K + lane] = (lane == choice) ? 1.0f : 0.0f;
            if (lane == 0)
                ids[b * L + l] = cand[(b * L + l) * K + choice];
        }
        return;
    }

    float const temp = temperature[b];
    bool const sample = mode == static_cast<int32_t>(ScanMode::kSAMPLE) && temperatureUsable(temp);
    int32_t prev = 0;
    for (int32_t l = 0; l < L; ++l)
    {
        float const s = valid ? lat[(static_cast<int64_t>(l) * K + prev) * K + lane] : kNegInf;
        int32_t choice;
        if (sample)
        {
            float const z = valid ? softmaxLogit(s, temp) : kNegInf;
            float m = z;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
            {
                float const o = __shfl_xor_sync(kFull, m, off);
                m = o > m ? o : m;
            }
            float const e = valid ? softmaxExp(z, m) : 0.0f;
            sVal[w][lane] = e;
            __syncwarp();
            float sum = 0.0f;
            if (lane == 0)
                for (int32_t c = 0; c < K; ++c)
                    sum = addRn(sum, sVal[w][c]);
            sum = __shfl_sync(kFull, sum, 0);
            float const p = valid ? softmaxProb(e, sum) : 0.0f;
            __syncwarp();
            sVal[w][lane] = p;
            if (valid)
                qb[l * K + lane] = p;
            __syncwarp();
            choice = 0;
            if (lane == 0)
                choice = inverseCdf(sVal[w], K, uniforms[b * L + l]);
            choice = __shfl_sync(kFull, choice, 0);
            __syncwarp();
        }
        else
        {
            float v = s;
            int32_t i = valid ? lane : 0x7fffffff;
            warpArgmax(v, i);
            choice = i;
            if (valid)
                qb[l * K + lane] = (lane == choice) ? 1.0f : 0.0f;
        }
        if (lane == 0)
            ids[b * L + l] = cand[(b * L + l) * K + choice];
        prev = choice;
    }
}

Status cudaStatus(cudaError_t err, char const* what, char* msg, size_t msgLen)
{
    if (err == cudaSuccess)
        return Status::kOK;
    std::snprintf(msg, msgLen, "DFlash2PairwiseScan: %s launch failed: %s", what, cudaGetErrorString(err));
    return Status::kCUDA_ERROR;
}

bool aligned16(void const* ptr)
{
    return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0;
}

bool resolved(PairwiseScanParams const& p, char* msg, size_t msgLen)
{
    if (p.batch < 0 || p.length < 1 || p.topK < 1 || p.topK > kScanMaxTopK || p.length > kScanMaxLength
        || p.rank < 1 || p.rank > kScanMaxRank || p.vocab < 1)
    {
        std::snprintf(msg, msgLen, "DFlash2PairwiseScan: launch with unresolved or invalid dims (B=%lld L=%d K=%d R=%d)",
            static_cast<long long>(p.batch), p.length, p.topK, p.rank);
        return false;
    }
    return true;
}

} // namespace

Status launchPairwiseLattice(PairwiseScanParams const& p, float const* unary, int32_t const* cand, void const* hidden,
    int32_t const* anchor, void const* predCb, void const* succCb, float* lattice, cudaStream_t stream, char* msg,
    size_t msgLen)
{
    if (!resolved(p, msg, msgLen))
        return Status::kINVALID;
    if (p.rank % kScanRankMultiple != 0 || !aligned16(hidden) || !aligned16(predCb) || !aligned16(succCb))
    {
        std::snprintf(msg, msgLen,
            "DFlash2PairwiseScan: proj_hidden and both codebooks must be 16-byte aligned with R %% %d == 0 (R=%d)",
            kScanRankMultiple, p.rank);
        return Status::kINVALID;
    }
    if (p.batch == 0)
        return Status::kOK;
    dim3 const grid(static_cast<unsigned>(p.batch * p.length));
#define DF2_LAUNCH_LATTICE(T)                                                                                          \
    pairwiseLatticeKernel<T><<<grid, kLatticeThreads, 0, stream>>>(unary, cand,                                        \
        static_cast<T::Storage const*>(hidden), anchor, static_cast<T::Storage const*>(predCb),                         \
        static_cast<T::Storage const*>(succCb), lattice, p.length, p.topK, p.rank, p.vocab)
    switch (p.dataType)
    {
    case DType::kFLOAT16: DF2_LAUNCH_LATTICE(F16); break;
    case DType::kBFLOAT16: DF2_LAUNCH_LATTICE(BF16); break;
    case DType::kFLOAT32: DF2_LAUNCH_LATTICE(F32); break;
    default:
        std::snprintf(msg, msgLen, "DFlash2PairwiseScan: unsupported dtype %s", dtypeName(p.dataType));
        return Status::kINVALID;
    }
#undef DF2_LAUNCH_LATTICE
    return cudaStatus(cudaGetLastError(), "lattice kernel", msg, msgLen);
}

Status launchPairwiseWalk(PairwiseScanParams const& p, float const* lattice, int32_t const* cand,
    float const* temperature, float const* uniforms, int32_t* ids, float* q, cudaStream_t stream, char* msg,
    size_t msgLen)
{
    if (!resolved(p, msg, msgLen))
        return Status::kINVALID;
    if (p.batch == 0)
        return Status::kOK;
    dim3 const grid(static_cast<unsigned>((p.batch + kWalkWarps - 1) / kWalkWarps));
    pairwiseWalkKernel<<<grid, kWalkWarps * 32, 0, stream>>>(
        lattice, cand, temperature, uniforms, ids, q, p.batch, p.length, p.topK, static_cast<int32_t>(p.mode));
    return cudaStatus(cudaGetLastError(), "walk kernel", msg, msgLen);
}

Status launchPairwiseScan(PairwiseScanParams const& p, float const* unary, int32_t const* cand, void const* hidden,
    int32_t const* anchor, void const* predCb, void const* succCb, float const* temperature, float const* uniforms,
    void* workspace, int32_t* ids, float* q, cudaStream_t stream, char* msg, size_t msgLen)
{
    auto* lattice = static_cast<float*>(workspace);
    Status s = launchPairwiseLattice(p, unary, cand, hidden, anchor, predCb, succCb, lattice, stream, msg, msgLen);
    if (s != Status::kOK)
        return s;
    return launchPairwiseWalk(p, lattice, cand, temperature, uniforms, ids, q, stream, msg, msgLen);
}

} // namespace dflash2
