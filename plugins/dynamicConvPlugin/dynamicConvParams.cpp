#include "dynamicConvParams.h"
#include "../common/df2Validation.h"

namespace dflash2
{
namespace
{

constexpr ParamFail fail{kDynamicConvName};

} // namespace

Status validateDynamicConvAttrs(DynamicConvAttrs const& a, char* msg, size_t msgLen)
{
    clearMessage(msg, msgLen);
    if (a.kernelSize < 1 || a.kernelSize > kDynamicConvMaxKernelSize)
        return fail(msg, msgLen, "kernel_size=%d outside [1, %d]", a.kernelSize, kDynamicConvMaxKernelSize);
    if (a.blockSize < 1 || a.blockSize > kDynamicConvMaxBlockSize)
        return fail(msg, msgLen, "block_size=%d outside [1, %d]", a.blockSize, kDynamicConvMaxBlockSize);
    if (a.kernelSize > a.blockSize)
        return fail(msg, msgLen, "kernel_size=%d exceeds block_size=%d", a.kernelSize, a.blockSize);
    if (a.groupSize < 1)
        return fail(msg, msgLen, "group_size=%d must be >= 1", a.groupSize);
    if (a.fuseResidual != 0 && a.fuseResidual != 1)
        return fail(msg, msgLen, "fuse_residual=%d must be 0 or 1", a.fuseResidual);
    return Status::kOK;
}

Status validateDynamicConv(DynamicConvAttrs const& a, TensorDesc const* in, int32_t nbInputs,
    DynamicConvParams* params, char* msg, size_t msgLen)
{
    Status const attrStatus = validateDynamicConvAttrs(a, msg, msgLen);
    if (attrStatus != Status::kOK)
        return attrStatus;
    int32_t const want = dynamicConvNbInputs(a);
    if (nbInputs != want)
        return fail(msg, msgLen, "expected %d inputs (fuse_residual=%d), got %d", want, a.fuseResidual, nbInputs);

    TensorDesc const& x = in[0];
    TensorDesc const& delta = in[1];
    TensorDesc const& base = in[2];
    if (!isFloatType(x.type))
        return fail(msg, msgLen, "input 0 (x) has dtype %s; supported: float16, bfloat16, float32",
            dtypeName(x.type));
    if (delta.type != x.type)
        return fail(msg, msgLen, "input 1 (delta) has dtype %s but x is %s; they must match",
            dtypeName(delta.type), dtypeName(x.type));
    if (base.type != x.type)
        return fail(msg, msgLen, "input 2 (base_kernel) has dtype %s but x is %s; they must match",
            dtypeName(base.type), dtypeName(x.type));
    if (x.nbDims != 2)
        return fail(msg, msgLen, "input 0 (x) must be 2-D [tokens, H], got %d dims", x.nbDims);
    if (delta.nbDims != 3)
        return fail(msg, msgLen, "input 1 (delta) must be 3-D [tokens, K, H/G], got %d dims", delta.nbDims);
    if (base.nbDims != 2)
        return fail(msg, msgLen, "input 2 (base_kernel) must be 2-D [K, H], got %d dims", base.nbDims);

    int64_t const tokens = x.dims[0];
    int64_t const hidden = x.dims[1];
    if (known(tokens) && tokens % a.blockSize != 0)
        return fail(msg, msgLen,
            "tokens=%lld is not a multiple of block_size=%d (inputs must be whole draft blocks packed "
            "end to end)",
            static_cast<long long>(tokens), a.blockSize);
    if (known(hidden))
    {
        if (hidden < 1 || hidden % kDynamicConvHiddenMultiple != 0)
            return fail(msg, msgLen, "H=%lld must be a positive multiple of %d", static_cast<long long>(hidden),
                kDynamicConvHiddenMultiple);
        if (hidden % a.groupSize != 0)
            return fail(msg, msgLen, "group_size=%d does not divide H=%lld", a.groupSize,
                static_cast<long long>(hidden));
    }
    if (known(delta.dims[0]) && known(tokens) && delta.dims[0] != tokens)
        return fail(msg, msgLen, "input 1 (delta) has %lld tokens but x has %lld",
            static_cast<long long>(delta.dims[0]), static_cast<long long>(tokens));
    if (known(delta.dims[1]) && delta.dims[1] != a.kernelSize)
        return fail(msg, msgLen, "input 1 (delta) dim 1 is %lld but kernel_size=%d",
            static_cast<long long>(delta.dims[1]), a.kernelSize);
    if (known(delta.dims[2]) && known(hidden) && delta.dims[2] * a.groupSize != hidden)
        return fail(msg, msgLen, "input 1 (delta) dim 2 is %lld but H/group_size = %lld",
            static_cast<long long>(delta.dims[2]), static_cast<long long>(hidden / a.groupSize));
    if (known(base.dims[0]) && base.dims[0] != a.kernelSize)
        return fail(msg, msgLen, "input 2 (base_kernel) dim 0 is %lld but kernel_size=%d",
            static_cast<long long>(base.dims[0]), a.kernelSize);
    if (known(base.dims[1]) && known(hidden) && base.dims[1] != hidden)
        return fail(msg, msgLen, "input 2 (base_kernel) dim 1 is %lld but H=%lld",
            static_cast<long long>(base.dims[1]), static_cast<long long>(hidden));
    if (a.fuseResidual)
    {
        TensorDesc const& res = in[3];
        if (res.type != DType::kFLOAT32)
            return fail(msg, msgLen, "input 3 (residual) has dtype %s; it must be float32", dtypeName(res.type));
        if (res.nbDims != 2)
            return fail(msg, msgLen, "input 3 (residual) must be 2-D [tokens, H], got %d dims", res.nbDims);
        for (int i = 0; i < 2; ++i)
        {
            if (known(res.dims[i]) && known(x.dims[i]) && res.dims[i] != x.dims[i])
                return fail(msg, msgLen, "input 3 (residual) dim %d is %lld but x has %lld", i,
                    static_cast<long long>(res.dims[i]), static_cast<long long>(x.dims[i]));
        }
    }
    if (params != nullptr)
    {
        params->attrs = a;
        params->tokens = tokens;
        params->hidden = hidden;
        params->groups = known(hidden) ? hidden / a.groupSize : -1;
        params->dataType = x.type;
        params->outType = a.fuseResidual ? DType::kFLOAT32 : x.type;
    }
    return Status::kOK;
}

} // namespace dflash2
