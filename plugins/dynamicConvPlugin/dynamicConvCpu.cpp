/*
 * DFlash2DynamicConv: CPU build of the shared math (dynamicConvMath.h) and the validation
 * function, with a C ABI for ctypes. Built by dflash2_trt/trtllm/cpu/plugin_libs.py (g++
 * -ffp-contract=off) for the CPU engine backend and the tests; never part of
 * the plugin library. It runs the same element function the kernel's arithmetic mirrors.
 */
#include "dynamicConvMath.h"
#include "dynamicConvParams.h"

#include <cstdio>

using namespace dflash2;

namespace
{

void fillDescs(int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims, int64_t const* dims, TensorDesc* out)
{
    for (int32_t i = 0; i < nbInputs; ++i)
    {
        out[i].type = static_cast<DType>(dtypes[i]);
        out[i].nbDims = nbDims[i];
        for (int32_t d = 0; d < 8; ++d)
            out[i].dims[d] = dims[i * 8 + d];
    }
}

template <class T>
void runTyped(DynamicConvParams const& p, void const* x, void const* delta, void const* base, float const* residual,
    void* out)
{
    using S = typename T::Storage;
    auto const* xs = static_cast<S const*>(x);
    auto const* ds = static_cast<S const*>(delta);
    auto const* bs = static_cast<S const*>(base);
    for (int64_t t = 0; t < p.tokens; ++t)
    {
        for (int64_t c = 0; c < p.hidden; ++c)
        {
            float const y = dynamicConvElement<T>(xs, ds, bs, t, c, p.hidden, p.groups, p.attrs.kernelSize,
                p.attrs.groupSize, p.attrs.blockSize);
            int64_t const o = t * p.hidden + c;
            if (p.attrs.fuseResidual)
                static_cast<float*>(out)[o] = convResidual(residual[o], y);
            else
                static_cast<S*>(out)[o] = T::store(y);
        }
    }
}

} // namespace

extern "C"
{

//! attrs = {block_size, kernel_size, group_size, fuse_residual}; dims holds 8 slots per input.
int32_t df2_conv_validate(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, char* msg, int32_t msgLen)
{
    DynamicConvAttrs a{attrs[0], attrs[1], attrs[2], attrs[3]};
    TensorDesc descs[8];
    if (nbInputs < 0 || nbInputs > 8)
    {
        std::snprintf(msg, msgLen, "DFlash2DynamicConv: nbInputs=%d", nbInputs);
        return static_cast<int32_t>(Status::kINVALID);
    }
    fillDescs(nbInputs, dtypes, nbDims, dims, descs);
    return static_cast<int32_t>(validateDynamicConv(a, descs, nbInputs, nullptr, msg, msgLen));
}

//! Validates, then computes out on the CPU. residual may be null when fuse_residual is 0.
int32_t df2_conv_run(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, void const* x, void const* delta, void const* base, float const* residual, void* out,
    char* msg, int32_t msgLen)
{
    DynamicConvAttrs a{attrs[0], attrs[1], attrs[2], attrs[3]};
    TensorDesc descs[8];
    if (nbInputs < 0 || nbInputs > 8)
    {
        std::snprintf(msg, msgLen, "DFlash2DynamicConv: nbInputs=%d", nbInputs);
        return static_cast<int32_t>(Status::kINVALID);
    }
    fillDescs(nbInputs, dtypes, nbDims, dims, descs);
    DynamicConvParams p;
    Status s = validateDynamicConv(a, descs, nbInputs, &p, msg, msgLen);
    if (s != Status::kOK)
        return static_cast<int32_t>(s);
    switch (p.dataType)
    {
    case DType::kFLOAT16: runTyped<F16>(p, x, delta, base, residual, out); break;
    case DType::kBFLOAT16: runTyped<BF16>(p, x, delta, base, residual, out); break;
    default: runTyped<F32>(p, x, delta, base, residual, out); break;
    }
    return 0;
}

//! Scalar conversions exposed for the tests (fp16/bf16 rounding must match torch exactly).
uint16_t df2_float_to_half(float f) { return floatToHalfBits(f); }
float df2_half_to_float(uint16_t h) { return halfBitsToFloat(h); }
uint16_t df2_float_to_bf16(float f) { return floatToBf16Bits(f); }
float df2_exp(float x) { return expRn(x); }

} // extern "C"
