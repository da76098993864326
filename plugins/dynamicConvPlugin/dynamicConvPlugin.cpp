#include "dynamicConvPlugin.h"
#include "dynamicConvKernel.h"

#include <cstdio>
#include <new>

using namespace nvinfer1;

namespace dflash2
{

// Attribute names: keep in sync with dynamicConvPlugin.yaml (tests/plugins checks both ways).
namespace
{
constexpr char const* kBlockSize = "block_size";
constexpr char const* kKernelSize = "kernel_size";
constexpr char const* kGroupSize = "group_size";
constexpr char const* kFuseResidual = "fuse_residual";
} // namespace

DynamicConvPlugin::DynamicConvPlugin(DynamicConvAttrs const& attrs)
    : PluginV3Base(attrs)
{
    mParams.attrs = attrs;
}

int32_t DynamicConvPlugin::getNbOutputs() const noexcept
{
    return 1;
}

int32_t DynamicConvPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    trace(kDynamicConvName, "getOutputDataTypes");
    if (nbOutputs != 1 || nbInputs < 1)
        return -1;
    outputTypes[0] = mAttrs.fuseResidual ? DataType::kFLOAT : inputTypes[0];
    return 0;
}

int32_t DynamicConvPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& /*exprBuilder*/) noexcept
{
    trace(kDynamicConvName, "getOutputShapes");
    if (nbOutputs != 1 || nbInputs != dynamicConvNbInputs(mAttrs) || inputs[0].nbDims != 2)
        return -1;
    outputs[0] = inputs[0]; // [tokens, H]
    return 0;
}

bool DynamicConvPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t /*nbOutputs*/) noexcept
{
    if (traceEnabled())
    {
        char detail[32];
        std::snprintf(detail, sizeof(detail), "pos=%d", pos);
        trace(kDynamicConvName, "supportsFormatCombination", detail);
    }
    PluginTensorDesc const& d = inOut[pos].desc;
    if (d.format != TensorFormat::kLINEAR)
        return false;
    DataType const x = inOut[0].desc.type;
    if (pos == 0)
        return x == DataType::kHALF || x == DataType::kBF16 || x == DataType::kFLOAT;
    if (pos == 1 || pos == 2)
        return d.type == x;
    if (pos == 3 && mAttrs.fuseResidual && pos < nbInputs)
        return d.type == DataType::kFLOAT;
    // the output
    return d.type == (mAttrs.fuseResidual ? DataType::kFLOAT : x);
}

int32_t DynamicConvPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* /*out*/, int32_t /*nbOutputs*/) noexcept
{
    trace(kDynamicConvName, "configurePlugin");
    TensorDesc descs[4];
    if (nbInputs > 4)
        return -1;
    for (int32_t i = 0; i < nbInputs; ++i)
        descs[i] = toDesc(in[i].desc.type, in[i].desc.dims); // -1 dims are skipped by the validation
    char msg[512];
    if (validateDynamicConv(mAttrs, descs, nbInputs, nullptr, msg, sizeof(msg)) != Status::kOK)
    {
        reportError("configurePlugin", msg);
        return -1;
    }
    return 0;
}

size_t DynamicConvPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    trace(kDynamicConvName, "getWorkspaceSize", "bytes=0");
    return 0;
}

int32_t DynamicConvPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* /*out*/, int32_t /*nbOutputs*/) noexcept
{
    TensorDesc descs[4];
    if (nbInputs > 4)
        return -1;
    for (int32_t i = 0; i < nbInputs; ++i)
        descs[i] = toDesc(in[i].type, in[i].dims);
    char msg[512];
    if (validateDynamicConv(mAttrs, descs, nbInputs, &mParams, msg, sizeof(msg)) != Status::kOK)
    {
        reportError("onShapeChange", msg);
        return -1;
    }
    return 0;
}

int32_t DynamicConvPlugin::enqueue(PluginTensorDesc const* /*inputDesc*/, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept
{
    char msg[512];
    float const* residual = mAttrs.fuseResidual ? static_cast<float const*>(inputs[3]) : nullptr;
    Status s = launchDynamicConv(mParams, inputs[0], inputs[1], inputs[2], residual, outputs[0], stream, msg, sizeof(msg));
    if (s != Status::kOK)
    {
        reportError("enqueue", msg);
        return -1;
    }
    return 0;
}

void DynamicConvPlugin::appendSerialFields(std::vector<PluginField>& fields) noexcept
{
    fields.emplace_back(kBlockSize, &mAttrs.blockSize, PluginFieldType::kINT32, 1);
    fields.emplace_back(kKernelSize, &mAttrs.kernelSize, PluginFieldType::kINT32, 1);
    fields.emplace_back(kGroupSize, &mAttrs.groupSize, PluginFieldType::kINT32, 1);
    fields.emplace_back(kFuseResidual, &mAttrs.fuseResidual, PluginFieldType::kINT32, 1);
}

DynamicConvPluginCreator::DynamicConvPluginCreator()
{
    addField(kBlockSize, PluginFieldType::kINT32);
    addField(kKernelSize, PluginFieldType::kINT32);
    addField(kGroupSize, PluginFieldType::kINT32);
    addField(kFuseResidual, PluginFieldType::kINT32);
}

IPluginV3* DynamicConvPluginCreator::createPlugin(
    char const* /*name*/, PluginFieldCollection const* fc, TensorRTPhase /*phase*/) noexcept
{
    DynamicConvAttrs a;
    Int32Attr attrs[] = {{kBlockSize, &a.blockSize, true}, {kKernelSize, &a.kernelSize, true},
        {kGroupSize, &a.groupSize, true}, {kFuseResidual, &a.fuseResidual, false}};
    if (!parseInt32Attrs(kDynamicConvName, fc, attrs, 4))
        return nullptr;
    char msg[512];
    if (validateDynamicConvAttrs(a, msg, sizeof(msg)) != Status::kOK)
    {
        reportError("createPlugin", msg);
        return nullptr;
    }
    return new (std::nothrow) DynamicConvPlugin(a);
}

// Static registration: loading the library (LD_PRELOAD / ctypes / dlopen) registers the creator;
// Triton's TensorRT-LLM backend calls no init function. DFLASH2_NO_STATIC_REGISTRATION exists only
// for the glue test harness, which runs without libnvinfer.
#ifndef DFLASH2_NO_STATIC_REGISTRATION
REGISTER_TENSORRT_PLUGIN(DynamicConvPluginCreator);
#endif

} // namespace dflash2
