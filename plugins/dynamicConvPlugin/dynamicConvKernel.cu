#include "dynamicConvKernel.h"
#include "dynamicConvMath.h"

#include <cstdio>

namespace dflash2
{
namespace
{

constexpr int kThreads = 128;      // 640 = 5 x 128 vectors per row at H 5120 (bf16): no idle lanes
constexpr int kMaxGridY = 65535;   // tokens beyond this are covered by the grid-stride loop

template <class S, int N>
struct alignas(16) Vec
{
    S v[N];
};

//! blockIdx.x * kThreads + threadIdx.x = one 16-byte vector of channels (8 fp16/bf16 or 4 fp32);
//! blockIdx.y = token (grid-stride). The grid shape avoids any 64-bit division per thread. The
//! previous K-1 tokens are re-read through L1/L2 (their own threads load them from DRAM), so DRAM
//! traffic stays x + delta + out (+ residual) once each.
template <class T, bool kFuse, int kTaps>
__global__ void __launch_bounds__(kThreads) dynamicConvKernel(typename T::Storage const* __restrict__ x,
    typename T::Storage const* __restrict__ delta, typename T::Storage const* __restrict__ base,
    float const* __restrict__ residual, void* __restrict__ out, int64_t tokens, int32_t hidden, int32_t groups,
    int32_t kernelSize, int32_t groupSize, int32_t blockSize)
{
    using S = typename T::Storage;
    constexpr int N = 16 / sizeof(S);
    int32_t const cv = static_cast<int32_t>(blockIdx.x) * kThreads + static_cast<int32_t>(threadIdx.x);
    if (cv * N >= hidden)
        return;
    int32_t const c0 = cv * N;
    int32_t const g0 = c0 / groupSize;
    int32_t const r0 = c0 - g0 * groupSize;

#pragma unroll 1
    for (int64_t t = blockIdx.y; t < tokens; t += gridDim.y)
    {
        int32_t const pos = static_cast<int32_t>(t % blockSize);
        float acc[N];
        // kTaps == 2 (the published drafters): both taps unrolled so their loads are in flight
        // together. kTaps == 0: runtime tap count, not unrolled (unrolling four taps lets nvcc
        // hoist every load and take ~120 registers on sm_100a; occupancy matters more here).
        int32_t const taps = kTaps > 0 ? kTaps : kernelSize;
#pragma unroll(kTaps > 0 ? kTaps : 1)
        for (int j = 0; j < taps; ++j)
        {
            if (!convTapInBlock(pos, j))
                break;
            Vec<S, N> const xv = *reinterpret_cast<Vec<S, N> const*>(x + (t - j) * hidden + c0);
            Vec<S, N> const bv = *reinterpret_cast<Vec<S, N> const*>(base + j * hidden + c0);
            S const* drow = delta + (t * kernelSize + j) * groups;
            int32_t g = g0;
            int32_t r = r0;
            float d = T::load(drow[g]);
#pragma unroll
            for (int i = 0; i < N; ++i)
            {
                if (i > 0 && r == 0)
                    d = T::load(drow[g]); // group changed inside this vector (G < N or unaligned)
                float const coef = convCoefficient(T::load(bv.v[i]), d);
                float const xf = T::load(xv.v[i]);
                acc[i] = (j == 0) ? convFirstTap(coef, xf) : convNextTap(acc[i], coef, xf);
                if (++r == groupSize)
                {
                    r = 0;
                    ++g;
                }
            }
        }

        if constexpr (kFuse)
        {
            float* o = static_cast<float*>(out) + t * hidden + c0;
            float const* res = residual + t * hidden + c0;
#pragma unroll
            for (int i = 0; i < N; i += 4)
            {
                float4 const rv = *reinterpret_cast<float4 const*>(res + i);
                float4 ov;
                ov.x = convResidual(rv.x, acc[i + 0]);
                ov.y = convResidual(rv.y, acc[i + 1]);
                ov.z = convResidual(rv.z, acc[i + 2]);
                ov.w = convResidual(rv.w, acc[i + 3]);
                *reinterpret_cast<float4*>(o + i) = ov;
            }
        }
        else
        {
            Vec<S, N> ov;
#pragma unroll
            for (int i = 0; i < N; ++i)
                ov.v[i] = T::store(acc[i]);
            *reinterpret_cast<Vec<S, N>*>(static_cast<S*>(out) + t * hidden + c0) = ov;
        }
    }
}

template <class T>
cudaError_t launchTyped(DynamicConvParams const& p, void const* x, void const* delta, void const* base,
    float const* residual, void* out, cudaStream_t stream)
{
    using S = typename T::Storage;
    constexpr int N = 16 / sizeof(S);
    int64_t const vecPerRow = p.hidden / N;
    if (p.tokens == 0 || vecPerRow == 0)
        return cudaSuccess;
    dim3 const grid(static_cast<unsigned>((vecPerRow + kThreads - 1) / kThreads),
        static_cast<unsigned>(p.tokens < kMaxGridY ? p.tokens : kMaxGridY));
    auto const hidden = static_cast<int32_t>(p.hidden);
    auto const groups = static_cast<int32_t>(p.groups);
    auto const* xs = static_cast<S const*>(x);
    auto const* ds = static_cast<S const*>(delta);
    auto const* bs = static_cast<S const*>(base);
    auto const& a = p.attrs;
    bool const two = a.kernelSize == 2;
    if (a.fuseResidual && two)
        dynamicConvKernel<T, true, 2><<<grid, kThreads, 0, stream>>>(
            xs, ds, bs, residual, out, p.tokens, hidden, groups, a.kernelSize, a.groupSize, a.blockSize);
    else if (a.fuseResidual)
        dynamicConvKernel<T, true, 0><<<grid, kThreads, 0, stream>>>(
            xs, ds, bs, residual, out, p.tokens, hidden, groups, a.kernelSize, a.groupSize, a.blockSize);
    else if (two)
        dynamicConvKernel<T, false, 2><<<grid, kThreads, 0, stream>>>(
            xs, ds, bs, residual, out, p.tokens, hidden, groups, a.kernelSize, a.groupSize, a.blockSize);
    else
        dynamicConvKernel<T, false, 0><<<grid, kThreads, 0, stream>>>(
            xs, ds, bs, residual, out, p.tokens, hidden, groups, a.kernelSize, a.groupSize, a.blockSize);
    return cudaGetLastError();
}

bool aligned16(void const* ptr)
{
    return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0;
}

} // namespace

Status launchDynamicConv(DynamicConvParams const& p, void const* x, void const* delta, void const* base,
    float const* residual, void* out, cudaStream_t stream, char* msg, size_t msgLen)
{
    if (p.tokens < 0 || p.hidden < 0 || p.hidden % kDynamicConvHiddenMultiple != 0)
    {
        std::snprintf(msg, msgLen, "DFlash2DynamicConv: launch with unresolved or invalid dims (T=%lld, H=%lld)",
            static_cast<long long>(p.tokens), static_cast<long long>(p.hidden));
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
