#include "dynamicConvKernel.h"
#include "dynamicConvKernelBody.h"

#include <cstdio>

namespace dflash2
{
namespace
{

constexpr int kThreads = 128;    // per block: kThreads / colThreads strips x colThreads column vectors
constexpr int kMaxGridY = 65535; // strips beyond this are covered by the grid-stride loop
// Published path: 4 blocks of 128 threads per SM (<= 128 registers; ptxas's own choice spilled
// on sm_90a): 16 warps whose strips keep >= 176 B each in flight (x 9 x 16 B + delta 16 x 2 B),
// ~90 KB per SM, well above the ~35 KB that 4.8 TB/s x ~1 us of latency / 132 SMs needs.
constexpr int kMinBlocksFixed = 4;
constexpr int kMaxHidden = 1 << 24;                 // i * H, j * H, (i * K + j) * H / G stay in int32
constexpr int64_t kMaxStripBlocks = (1 << 30) / 64; // blocks * strips per block (<= 64) < 2^31

//! blockIdx.x * blockDim.x + threadIdx.x = one 16-byte vector of channels; blockIdx.y * blockDim.y
//! + threadIdx.y = one strip of a draft block's tokens (grid-stride). The body is
//! dynamicConvStrip (dynamicConvKernelBody.h). A warp never spans two strips (blockDim.x >= 32),
//! so every block-boundary test in the body is warp-uniform.
//!
//! Published workload (8192 tokens x H 5120 bf16, K 2, G 16, block 16), per call:
//!   bytes  x 83.9 MB + delta [T, 2, 320] 10.5 MB + base 20 KB + out 83.9 MB = 178.3 MB
//!          (fused: + residual fp32 167.8 MB, out fp32 167.8 MB instead: 430.0 MB)
//!   FLOPs  5 per element (2 coefficient adds, 2 multiplies, 1 tap add) = 210 MFLOP (fused +1: 252)
//!   launch grid (5, 1024) x block (128, 1): 640 column vectors x 1024 strips of 8 tokens
//!          (fused: grid (5, 2048), strips of 4 tokens); 4 blocks per SM.
//!   bound  178.3 MB / 4.8 TB/s = 37.1 us nominal (41.5 us at the measured 4.3 TB/s copy);
//!          fused 89.6 us (100 us).
template <class T, bool kFuse, int kTaps, int kTok>
__global__ void __launch_bounds__(kThreads, kTaps > 0 ? kMinBlocksFixed : 1) dynamicConvKernel(
    typename T::Storage const* __restrict__ x, typename T::Storage const* __restrict__ delta,
    typename T::Storage const* __restrict__ base, float const* __restrict__ residual, void* __restrict__ out,
    DynamicConvShape const sh)
{
    int32_t const cv = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
    if (cv >= sh.vecPerRow)
        return;
    int32_t const stride = static_cast<int32_t>(gridDim.y * blockDim.y);
#pragma unroll 1
    for (int32_t strip = static_cast<int32_t>(blockIdx.y * blockDim.y + threadIdx.y); strip < sh.strips;
         strip += stride)
        dynamicConvStrip<T, kFuse, kTaps, kTok>(x, delta, base, residual, out, sh, cv, strip);
}

template <class T, bool kFuse, int kTaps, int kTok>
cudaError_t launchShape(DynamicConvParams const& p, void const* x, void const* delta, void const* base,
    float const* residual, void* out, cudaStream_t stream)
{
    using S = typename T::Storage;
    constexpr int N = 16 / static_cast<int>(sizeof(S));
    DynamicConvShape const sh = dynamicConvShape(p, N, kTok);
    int32_t colThreads = 32;
    while (colThreads < kThreads && colThreads < sh.vecPerRow)
        colThreads *= 2;
    dim3 const block(static_cast<unsigned>(colThreads), static_cast<unsigned>(kThreads / colThreads));
    int64_t const gridY = (sh.strips + block.y - 1) / block.y;
    dim3 const grid(static_cast<unsigned>((sh.vecPerRow + colThreads - 1) / colThreads),
        static_cast<unsigned>(gridY < kMaxGridY ? gridY : kMaxGridY));
    dynamicConvKernel<T, kFuse, kTaps, kTok><<<grid, block, 0, stream>>>(static_cast<S const*>(x),
        static_cast<S const*>(delta), static_cast<S const*>(base), residual, out, sh);
    return cudaGetLastError();
}

template <class T>
cudaError_t launchTyped(DynamicConvParams const& p, void const* x, void const* delta, void const* base,
    float const* residual, void* out, cudaStream_t stream)
{
    constexpr int N = 16 / static_cast<int>(sizeof(typename T::Storage));
    if (p.tokens == 0 || p.hidden == 0)
        return cudaSuccess;
    bool const fixed = dynamicConvFixedPath(p, N);
    bool const fuse = p.attrs.fuseResidual != 0;
    if (fixed && fuse)
        return launchShape<T, true, 2, kConvTokFixedFused>(p, x, delta, base, residual, out, stream);
    if (fixed)
        return launchShape<T, false, 2, kConvTokFixed>(p, x, delta, base, residual, out, stream);
    if (fuse)
        return launchShape<T, true, 0, kConvTokGeneric>(p, x, delta, base, residual, out, stream);
    return launchShape<T, false, 0, kConvTokGeneric>(p, x, delta, base, residual, out, stream);
}

bool aligned16(void const* ptr)
{
    return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0;
}

} // namespace

Status launchDynamicConv(DynamicConvParams const& p, void const* x, void const* delta, void const* base,
    float const* residual, void* out, cudaStream_t stream, char* msg, size_t msgLen)
{
    if (p.tokens < 0 || p.hidden < 0 || p.hidden % kDynamicConvHiddenMultiple != 0 || p.attrs.blockSize < 1
        || p.attrs.kernelSize < 1 || p.attrs.kernelSize > kDynamicConvMaxKernelSize || p.attrs.groupSize < 1)
    {
        std::snprintf(msg, msgLen, "DFlash2DynamicConv: launch with unresolved or invalid dims (T=%lld, H=%lld)",
            static_cast<long long>(p.tokens), static_cast<long long>(p.hidden));
        return Status::kINVALID;
    }
    // 32-bit index math inside a strip (offsets up to ~70 rows of H) and a 32-bit strip count.
    if (p.hidden > kMaxHidden || p.tokens / p.attrs.blockSize + 1 > kMaxStripBlocks)
    {
        std::snprintf(msg, msgLen,
            "DFlash2DynamicConv: T=%lld x H=%lld too large for one launch (H <= %d, T / block_size < %lld)",
            static_cast<long long>(p.tokens), static_cast<long long>(p.hidden), kMaxHidden,
            static_cast<long long>(kMaxStripBlocks));
        return Status::kINVALID;
    }
    if (!aligned16(x) || !aligned16(base) || !aligned16(out) || (p.attrs.fuseResidual && !aligned16(residual)))
    {
        std::snprintf(msg, msgLen, "DFlash2DynamicConv: x, base_kernel, residual and output must be 16-byte aligned");
        return Status::kINVALID;
    }
    cudaError_t err = cudaSuccess;
    switch (p.dataType)
    {
    case DType::kFLOAT16: err = launchTyped<F16>(p, x, delta, base, residual, out, stream); break;
    case DType::kBFLOAT16: err = launchTyped<BF16>(p, x, delta, base, residual, out, stream); break;
    case DType::kFLOAT32: err = launchTyped<F32>(p, x, delta, base, residual, out, stream); break;
    default:
        std::snprintf(msg, msgLen, "DFlash2DynamicConv: unsupported dtype %s", dtypeName(p.dataType));
        return Status::kINVALID;
    }
    if (err != cudaSuccess)
    {
        std::snprintf(msg, msgLen, "DFlash2DynamicConv: kernel launch failed: %s", cudaGetErrorString(err));
        return Status::kCUDA_ERROR;
    }
    return Status::kOK;
}

} // namespace dflash2
