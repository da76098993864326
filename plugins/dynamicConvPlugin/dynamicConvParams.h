/*
 * DFlash2DynamicConv: parameters and validation. TensorRT never sees this file's types; the
 * glue translates TensorRT descriptors into TensorDesc and calls validateDynamicConv.
 */
#pragma once

#include "../common/df2Common.h"

namespace dflash2
{

//! The plugin's name: its creator's, and the prefix of its messages.
constexpr char const* kDynamicConvName = "DFlash2DynamicConv";

//! Plugin attributes (see dynamicConvPlugin.yaml; the names there are the field names).
struct DynamicConvAttrs
{
    int32_t blockSize{0};    //!< positions per draft block; tokens = n_blocks * blockSize
    int32_t kernelSize{0};   //!< taps K, 1..kMaxKernelSize, <= blockSize
    int32_t groupSize{0};    //!< channels sharing one correction value G; divides H
    int32_t fuseResidual{0}; //!< 1: input 3 is an fp32 residual, output = residual + y (fp32)
};

//! The attributes in the spec's order: the creator's fields, createPlugin, the serialised fields
//! and the CPU build's attribute array all read this table (common/df2Common.h).
inline constexpr Int32AttrField<DynamicConvAttrs> kDynamicConvFields[] = {
    {"block_size", &DynamicConvAttrs::blockSize, true},
    {"kernel_size", &DynamicConvAttrs::kernelSize, true},
    {"group_size", &DynamicConvAttrs::groupSize, true},
    {"fuse_residual", &DynamicConvAttrs::fuseResidual, false},
};

//! Everything a launcher needs, derived and checked by validateDynamicConv.
struct DynamicConvParams
{
    DynamicConvAttrs attrs;
    int64_t tokens{0};   //!< T (whole blocks packed end to end)
    int64_t hidden{0};   //!< H
    int64_t groups{0};   //!< H / G
    DType dataType{DType::kFLOAT16}; //!< dtype of x, delta and the base kernel
    DType outType{DType::kFLOAT16};  //!< dataType, or fp32 when the residual is fused
};

constexpr int32_t kDynamicConvMaxKernelSize = 4;
constexpr int32_t kDynamicConvMaxBlockSize = 64;
//! H must be a multiple of this so that every row starts on a 16-byte boundary (the kernel
//! uses 16-byte vector loads; a misaligned row would fault, not silently misbehave).
constexpr int32_t kDynamicConvHiddenMultiple = 8;

//! Checks the attributes alone (the plugin creator calls this before any shape is known).
Status validateDynamicConvAttrs(DynamicConvAttrs const& attrs, char* msg, size_t msgLen);

//! Input order: 0 x [T, H], 1 delta [T, K, H/G], 2 base kernel [K, H], 3 residual [T, H] fp32
//! (only when fuseResidual). Returns kOK and fills *params, or kINVALID with a message in msg
//! (always NUL-terminated when msgLen > 0). Dims of -1 are unknown and skipped.
Status validateDynamicConv(DynamicConvAttrs const& attrs, TensorDesc const* inputs, int32_t nbInputs,
    DynamicConvParams* params, char* msg, size_t msgLen);

//! Number of inputs for the given attributes (3, or 4 with the fused residual).
inline int32_t dynamicConvNbInputs(DynamicConvAttrs const& attrs)
{
    return attrs.fuseResidual ? 4 : 3;
}

} // namespace dflash2
