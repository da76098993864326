#include "dynamicConvPlugin.h"
#include "dynamicConvKernel.h"

using namespace nvinfer1;

namespace dflash2
{

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
    traceDetail(kDynamicConvName, "supportsFormatCombination", "pos=%d", pos);
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

size_t DynamicConvPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    trace(kDynamicConvName, "getWorkspaceSize", "bytes=0");
    return 0;
}

int32_t DynamicConvPlugin::enqueue(PluginTensorDesc const* /*inputDesc*/, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept
{
    char msg[512];
    float const* residual = mAttrs.fuseResidual ? static_cast<float const*>(inputs[3]) : nullptr;
    Status s = launchDynamicConv(mParams, inputs[0], inputs[1], inputs[2], residual, outputs[0], stream, msg, sizeof(msg));
    return enqueueResult(s, msg);
}

} // namespace dflash2
