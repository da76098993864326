/*
 * DFlash2DynamicConv: launcher (the only entry point into the CUDA code for the glue).
 */
#pragma once

#include "dynamicConvParams.h"

#include <cuda_runtime_api.h>

namespace dflash2
{

//! y = dynamic_conv(x, delta, base) (+ residual). Pointers are device pointers, 16-byte aligned
//! (TensorRT's allocations are); params must come from validateDynamicConv with concrete dims.
//! residual is read only when params.attrs.fuseResidual. Returns kOK, kINVALID (message in msg)
//! or kCUDA_ERROR (launch error text in msg). Enqueues on stream; does not synchronise.
Status launchDynamicConv(DynamicConvParams const& params, void const* x, void const* delta, void const* base,
    float const* residual, void* out, cudaStream_t stream, char* msg, size_t msgLen);

} // namespace dflash2
