/*
 * DFlash2DynamicConv: CPU build of the shared math (dynamicConvMath.h) and the validation
 * function, with a C ABI for ctypes. Built by dflash2_trt/trtllm/cpu/plugin_libs.py (g++
 * -ffp-contract=off) for the CPU engine backend and the tests; never part of
 * the plugin library. It runs the same element function the kernel's arithmetic mirrors.
 */
#include "dynamicConvMath.h"
#include "dynamicConvParams.h"
#include "../common/df2Validation.h"


using namespace dflash2;

namespace
{

constexpr ParamFail fail{kDynamicConvName};

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

//! attrs: the values in kDynamicConvFields' order (block_size, kernel_size, group_size,
//! fuse_residual); dims holds 8 slots per input.
int32_t df2_conv_validate(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, char* msg, int32_t msgLen)
{
    DynamicConvAttrs const a = attrsFromValues(kDynamicConvFields, attrs);
    TensorDesc descs[8];
    if (descsFromArrays(fail, nbInputs, dtypes, nbDims, dims, descs, msg, msgLen) != Status::kOK)
        return static_cast<int32_t>(Status::kINVALID);
    return static_cast<int32_t>(validateDynamicConv(a, descs, nbInputs, nullptr, msg, msgLen));
}

//! Validates, then computes out on the CPU. residual may be null when fuse_residual is 0.
int32_t df2_conv_run(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, void const* x, void const* delta, void const* base, float const* residual, void* out,
    char* msg, int32_t msgLen)
{
    DynamicConvAttrs const a = attrsFromValues(kDynamicConvFields, attrs);
    TensorDesc descs[8];
    if (descsFromArrays(fail, nbInputs, dtypes, nbDims, dims, descs, msg, msgLen) != Status::kOK)
        return static_cast<int32_t>(Status::kINVALID);
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
