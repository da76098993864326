#include "pairwiseScanKernel.h"
#include "pairwiseScanKernelBody.h"

#include <cstdio>

namespace dflash2
{
namespace
{

constexpr int kScanMaxThreads = kScanMaxGroups * kScanGroupThreads; // 256

//! The device side of the body's executor (pairwiseScanKernelBody.h): this thread's call of each
//! phase, __syncthreads, and the cluster's barrier and distributed shared memory.
struct DeviceExec
{
    unsigned char* sm;
    int64_t b;
    int32_t rk;
    bool cluster; //!< ranks > 1 with the walk: rank 0's tables are written through the cluster

    DF2_HD int32_t rank() const { return rk; }
    DF2_HD int64_t row() const { return b; }
    DF2_HD unsigned char* smem() const { return sm; }

    template <class F>
    DF2_HD void forThreads(F&& f)
    {
#if defined(__CUDA_ARCH__)
        f(static_cast<int32_t>(threadIdx.x));
#endif
    }

    DF2_HD void sync()
    {
#if defined(__CUDA_ARCH__)
        __syncthreads();
#endif
    }

    //! Matches the relaxed arrive at the kernel's start: every CTA of the cluster has started,
    //! so rank 0's shared memory may be written.
    DF2_HD void clusterWaitStarted()
    {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (cluster)
            __cluster_barrier_wait();
#endif
    }

    DF2_HD ScanRowSmem* rank0()
    {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (cluster && rk != 0)
            return static_cast<ScanRowSmem*>(__cluster_map_shared_rank(static_cast<void*>(sm), 0));
#endif
        return reinterpret_cast<ScanRowSmem*>(sm);
    }

    //! Release this CTA's writes (its own and into rank 0), acquire everyone's.
    DF2_HD void clusterSync()
    {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 900
        if (cluster)
        {
            __cluster_barrier_arrive();
            __cluster_barrier_wait();
            return;
        }
#endif
        __syncthreads();
#endif
    }
};

//! One batch row per cluster of a.plan.ranks CTAs (pairwiseScanBlock). Dynamic shared memory:
//! ScanRowSmem, the slots' Hh rows and the groups' staging (scanPlanFor).
//!
//! Published workload (B 64, L 7, K 16, R 256, bf16 codebooks of V 248320 rows), per call:
//!   bytes  codebook rows gathered: 64 x (97 A + 112 Bc) x 512 B = 6.85 MB (L2-resident when the
//!          same ids repeat, DRAM when cold) + Hh 229 KB + ids/unary 229 KB + lattice workspace
//!          written 459 KB + q 29 KB + ids 2 KB
//!   FLOPs  64 x 6 slices x 16 x 16 x 256 fma (+ the l = 0 slice: 16 x 256) = 25.4 M fma = 50.9 MFLOP
//!          (the CPU build and the reference compute 16 identical rows at l = 0: 58.7 MFLOP)
//!   launch 64 clusters of 2 CTAs (rank 0: slices 0 2 4 6, rank 1: 1 3 5) x 256 threads (4 warp
//!          pairs), 172 KB dynamic shared memory each: one CTA per SM on 128 of 132 SMs.
template <class T>
__global__ void __launch_bounds__(kScanMaxThreads) pairwiseScanKernel(ScanArgs<typename T::Storage> const a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    int32_t const ranks = a.plan.ranks;
    int32_t rank = 0;
#if __CUDA_ARCH__ >= 900
    if (ranks > 1)
        rank = static_cast<int32_t>(__clusterRelativeBlockRank());
#endif
    int64_t const b = blockIdx.x / static_cast<unsigned>(ranks);
    DeviceExec ex{smem, b, rank, ranks > 1 && a.walk != 0};
#if __CUDA_ARCH__ >= 900
    if (ex.cluster)
        __cluster_barrier_arrive_relaxed();
#endif
    pairwiseScanBlock<T>(a, ex);
}

//! Walk only over a given lattice: one CTA per batch row, the same rows/walk phases.
__global__ void __launch_bounds__(kScanWalkThreads) pairwiseWalkKernel(ScanArgs<float> const a)
{
    __shared__ ScanRowSmem sm;
    DeviceExec ex{reinterpret_cast<unsigned char*>(&sm), static_cast<int64_t>(blockIdx.x), 0, false};
    pairwiseWalkBlock(a, ex);
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
        std::snprintf(msg, msgLen,
            "DFlash2PairwiseScan: launch with unresolved or invalid dims (B=%lld L=%d K=%d R=%d)",
            static_cast<long long>(p.batch), p.length, p.topK, p.rank);
        return false;
    }
    return true;
}

struct DeviceLimits
{
    int32_t smCount{1};
    bool clusterLaunch{false};
    size_t smemOptin{48 * 1024};
};

cudaError_t deviceLimits(DeviceLimits* d)
{
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    int v = 0;
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    d->smCount = v;
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, dev);
    d->clusterLaunch = v != 0;
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    d->smemOptin = static_cast<size_t>(v);
    return err;
}

//! CTAs per batch row: a power of two <= 8 and <= L with B x ranks <= the SM count (every row's
//! slices spread over SMs while all rows still fit in one wave), 1 without cluster launch.
int32_t autoRanks(PairwiseScanParams const& p, DeviceLimits const& d)
{
    if (!d.clusterLaunch)
        return 1;
    int64_t const target = p.batch > 0 ? d.smCount / p.batch : 1;
    int32_t ranks = 1;
    while (ranks * 2 <= kScanMaxRanks && ranks * 2 <= p.length && ranks * 2 <= target)
        ranks *= 2;
    return ranks;
}

struct ScanPointers
{
    float const* unary;
    int32_t const* cand;
    void const* hidden;
    int32_t const* anchor;
    void const* predCb;
    void const* succCb;
    float const* temperature;
    float const* uniforms;
    float* lattice;
    int32_t* ids;
    float* q;
};

//! The kernel's dynamic shared memory may go up to the device's opt-in maximum: set to that cap
//! (not to this launch's size), so that concurrent enqueues with other shapes cannot lower it
//! under one another's launch.
template <class T>
cudaError_t launchFused(PairwiseScanParams const& p, ScanPointers const& ptr, ScanPlan const& plan, bool walk,
    size_t smemCap, cudaStream_t stream)
{
    using S = typename T::Storage;
    ScanArgs<S> args;
    args.unary = ptr.unary;
    args.cand = ptr.cand;
    args.hidden = static_cast<S const*>(ptr.hidden);
    args.anchor = ptr.anchor;
    args.predCb = static_cast<S const*>(ptr.predCb);
    args.succCb = static_cast<S const*>(ptr.succCb);
    args.temperature = ptr.temperature;
    args.uniforms = ptr.uniforms;
    args.lattice = ptr.lattice;
    args.ids = ptr.ids;
    args.q = ptr.q;
    args.vocab = p.vocab;
    args.L = p.length;
    args.K = p.topK;
    args.R = p.rank;
    args.mode = static_cast<int32_t>(p.mode);
    args.walk = walk ? 1 : 0;
    args.plan = plan;
    auto kernel = pairwiseScanKernel<T>;
    cudaError_t err
        = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smemCap));
    if (err != cudaSuccess)
        return err;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(p.batch * plan.ranks));
    cfg.blockDim = dim3(static_cast<unsigned>(plan.threads));
    cfg.dynamicSmemBytes = plan.smemBytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    if (plan.ranks > 1)
    {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = static_cast<unsigned>(plan.ranks);
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, kernel, args);
}

//! The one-launch lattice (+ walk) with ranks CTAs per row (0: automatic).
Status launchScan(PairwiseScanParams const& p, float const* unary, int32_t const* cand, void const* hidden,
    int32_t const* anchor, void const* predCb, void const* succCb, float const* temperature, float const* uniforms,
    float* lattice, int32_t* ids, float* q, bool walk, int32_t ranks, cudaStream_t stream, char* msg, size_t msgLen)
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
    DeviceLimits d;
    Status s = cudaStatus(deviceLimits(&d), "device query for the scan kernel", msg, msgLen);
    if (s != Status::kOK)
        return s;
    if (ranks == 0)
        ranks = autoRanks(p, d);
    if (ranks < 1 || ranks > kScanMaxRanks || (ranks & (ranks - 1)) != 0 || ranks > p.length
        || (ranks > 1 && !d.clusterLaunch) || p.batch * ranks > 0x7fffffffLL)
    {
        std::snprintf(msg, msgLen,
            "DFlash2PairwiseScan: %d CTAs per row not possible (L=%d, B=%lld, cluster launch %s)", ranks,
            p.length, static_cast<long long>(p.batch), d.clusterLaunch ? "yes" : "no");
        return Status::kINVALID;
    }
    int32_t const elemBytes = static_cast<int32_t>(dtypeSize(p.dataType));
    ScanPlan const plan = planPairwiseScan(p.length, p.topK, p.rank, elemBytes, ranks, d.smemOptin);
    if (plan.groups == 0)
    {
        std::snprintf(msg, msgLen,
            "DFlash2PairwiseScan: K=%d R=%d needs more shared memory than the device's %zu bytes", p.topK,
            p.rank, d.smemOptin);
        return Status::kINVALID;
    }
    ScanPointers const ptrs{unary, cand, hidden, anchor, predCb, succCb, temperature, uniforms, lattice, ids, q};
    cudaError_t err = cudaSuccess;
    switch (p.dataType)
    {
    case DType::kFLOAT16: err = launchFused<F16>(p, ptrs, plan, walk, d.smemOptin, stream); break;
    case DType::kBFLOAT16: err = launchFused<BF16>(p, ptrs, plan, walk, d.smemOptin, stream); break;
    case DType::kFLOAT32: err = launchFused<F32>(p, ptrs, plan, walk, d.smemOptin, stream); break;
    default:
        std::snprintf(msg, msgLen, "DFlash2PairwiseScan: unsupported dtype %s", dtypeName(p.dataType));
        return Status::kINVALID;
    }
    return cudaStatus(err, "scan kernel", msg, msgLen);
}

} // namespace

Status launchPairwiseLattice(PairwiseScanParams const& p, float const* unary, int32_t const* cand, void const* hidden,
    int32_t const* anchor, void const* predCb, void const* succCb, float* lattice, cudaStream_t stream, char* msg,
    size_t msgLen)
{
    return launchScan(p, unary, cand, hidden, anchor, predCb, succCb, nullptr, nullptr, lattice, nullptr, nullptr,
        false, 0, stream, msg, msgLen);
}

Status launchPairwiseWalk(PairwiseScanParams const& p, float const* lattice, int32_t const* cand,
    float const* temperature, float const* uniforms, int32_t* ids, float* q, cudaStream_t stream, char* msg,
    size_t msgLen)
{
    if (!resolved(p, msg, msgLen))
        return Status::kINVALID;
    if (p.batch == 0)
        return Status::kOK;
    ScanArgs<float> args;
    args.cand = cand;
    args.temperature = temperature;
    args.uniforms = uniforms;
    args.lattice = const_cast<float*>(lattice); // read only by the walk-only kernel
    args.ids = ids;
    args.q = q;
    args.L = p.length;
    args.K = p.topK;
    args.mode = static_cast<int32_t>(p.mode);
    args.plan.threads = kScanWalkThreads;
    args.plan.ranks = 1;
    pairwiseWalkKernel<<<static_cast<unsigned>(p.batch), kScanWalkThreads, 0, stream>>>(args);
    return cudaStatus(cudaGetLastError(), "walk kernel", msg, msgLen);
}

Status launchPairwiseScan(PairwiseScanParams const& p, float const* unary, int32_t const* cand, void const* hidden,
    int32_t const* anchor, void const* predCb, void const* succCb, float const* temperature, float const* uniforms,
    void* workspace, int32_t* ids, float* q, cudaStream_t stream, char* msg, size_t msgLen)
{
    return launchScan(p, unary, cand, hidden, anchor, predCb, succCb, temperature, uniforms,
        static_cast<float*>(workspace), ids, q, true, 0, stream, msg, msgLen);
}

Status launchPairwiseScanRanks(PairwiseScanParams const& p, float const* unary, int32_t const* cand,
    void const* hidden, int32_t const* anchor, void const* predCb, void const* succCb, float const* temperature,
    float const* uniforms, void* workspace, int32_t* ids, float* q, int32_t ranks, cudaStream_t stream, char* msg,
    size_t msgLen)
{
    return launchScan(p, unary, cand, hidden, anchor, predCb, succCb, temperature, uniforms,
        static_cast<float*>(workspace), ids, q, true, ranks, stream, msg, msgLen);
}

} // namespace dflash2
