#include "pairwiseScanKernel.h"
#include "pairwiseScanMath.h"

#include <cstdio>

namespace dflash2
{
namespace
{

constexpr int kLatticeThreads = 256; // >= kScanMaxTopK * kScanMaxTopK pairs
constexpr int kChunk = 64;           // rank elements staged in shared memory per pass
constexpr int kWalkWarps = 4;
constexpr unsigned kFull = 0xffffffffu;

static_assert(kLatticeThreads >= kScanMaxTopK * kScanMaxTopK, "one thread per (row, candidate) pair");

//! One block per (b, l): thread (row, c) accumulates its pair sequentially over r, so the
//! summation order is the CPU build's. Codebook rows are staged chunk by chunk in shared memory
//! (the +1 padding keeps the 16 candidate rows on distinct banks).
template <class T>
__global__ void __launch_bounds__(kLatticeThreads) pairwiseLatticeKernel(float const* __restrict__ unary,
    int32_t const* __restrict__ cand, typename T::Storage const* __restrict__ hidden,
    int32_t const* __restrict__ anchor, typename T::Storage const* __restrict__ predCb,
    typename T::Storage const* __restrict__ succCb, float* __restrict__ lattice, int32_t L, int32_t K, int32_t R,
    int64_t V)
{
    __shared__ float sCtx[kScanMaxTopK][kChunk + 1];
    __shared__ float sSucc[kScanMaxTopK][kChunk + 1];
    __shared__ int32_t sPred[kScanMaxTopK];
    __shared__ int32_t sSuccId[kScanMaxTopK];

    int64_t const bl = blockIdx.x; // b * L + l
    int32_t const l = static_cast<int32_t>(bl % L);
    int64_t const b = bl / L;
    int32_t const tid = threadIdx.x;
    if (tid < K)
    {
        sPred[tid] = (l == 0) ? anchor[b] : cand[(bl - 1) * K + tid];
        sSuccId[tid] = cand[bl * K + tid];
    }
    __syncthreads();

    int32_t const row = tid / K;
    int32_t const c = tid - row * K;
    bool const active = tid < K * K;
    float acc = 0.0f;
    for (int32_t r0 = 0; r0 < R; r0 += kChunk)
    {
        int32_t const n = min(kChunk, R - r0);
        for (int32_t e = tid; e < K * kChunk; e += kLatticeThreads)
        {
            int32_t const k = e / kChunk;
            int32_t const rr = e - k * kChunk;
            if (rr < n)
            {
                int32_t const r = r0 + rr;
                int32_t const pid = sPred[k];
                int32_t const sid = sSuccId[k];
                float const a = tokenInRange(pid, V) ? T::load(predCb[static_cast<int64_t>(pid) * R + r]) : 0.0f;
                sCtx[k][rr] = latticeContext(a, T::load(hidden[bl * R + r]));
                sSucc[k][rr] = tokenInRange(sid, V) ? T::load(succCb[static_cast<int64_t>(sid) * R + r]) : 0.0f;
            }
        }
        __syncthreads();
        if (active)
        {
            for (int32_t rr = 0; rr < n; ++rr)
                acc = latticeAccumulate(acc, sCtx[row][rr], sSucc[c][rr]);
        }
        __syncthreads();
    }
    if (active)
        lattice[(bl * K + row) * K + c] = latticeScore(unary[bl * K + c], acc);
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

//! One warp per batch row; lane c owns candidate c. Sums and cumsums run on lane 0 in index order.
__global__ void __launch_bounds__(kWalkWarps * 32) pairwiseWalkKernel(float const* __restrict__ lattice,
    int32_t const* __restrict__ cand, float const* __restrict__ temperature, float const* __restrict__ uniforms,
    int32_t* __restrict__ ids, float* __restrict__ q, int64_t B, int32_t L, int32_t K, int32_t mode)
{
    __shared__ float sVal[kWalkWarps][32];
    __shared__ int8_t sBack[kWalkWarps][kScanMaxLength * kScanMaxTopK];
    __shared__ int32_t sIdx[kWalkWarps][kScanMaxLength];

    int32_t const lane = threadIdx.x & 31;
    int32_t const w = threadIdx.x >> 5;
    int64_t const b = static_cast<int64_t>(blockIdx.x) * kWalkWarps + w;
    if (b >= B)
        return; // whole warp leaves together; only __syncwarp is used below
    float const* lat = lattice + b * L * K * K;
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
