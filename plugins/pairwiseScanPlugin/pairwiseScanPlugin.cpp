#include "pairwiseScanPlugin.h"
#include "pairwiseScanKernel.h"

using namespace nvinfer1;

namespace dflash2
{

PairwiseScanPlugin::PairwiseScanPlugin(PairwiseScanAttrs const& attrs)
    : PluginV3Base(attrs)
{
    mParams.mode = static_cast<ScanMode>(attrs.mode);
}

int32_t PairwiseScanPlugin::getNbOutputs() const noexcept
{
    return kScanNbOutputs;
}

int32_t PairwiseScanPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* /*inputTypes*/, int32_t nbInputs) const noexcept
{
    trace(kPairwiseScanName, "getOutputDataTypes");
    if (nbOutputs != kScanNbOutputs || nbInputs != kScanNbInputs)
        return -1;
    outputTypes[0] = DataType::kINT32; // path token ids [B, L]
    outputTypes[1] = DataType::kFLOAT; // q [B, L, K]
    return 0;
}

int32_t PairwiseScanPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& /*exprBuilder*/) noexcept
{
    trace(kPairwiseScanName, "getOutputShapes");
    if (nbOutputs != kScanNbOutputs || nbInputs != kScanNbInputs || inputs[0].nbDims != 3)
        return -1;
    outputs[0].nbDims = 2;
    outputs[0].d[0] = inputs[0].d[0];
    outputs[0].d[1] = inputs[0].d[1];
    outputs[1] = inputs[0]; // [B, L, K]
    return 0;
}

bool PairwiseScanPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t /*nbInputs*/, int32_t /*nbOutputs*/) noexcept
{
    traceDetail(kPairwiseScanName, "supportsFormatCombination", "pos=%d", pos);
    PluginTensorDesc const& d = inOut[pos].desc;
    if (d.format != TensorFormat::kLINEAR)
        return false;
    switch (pos)
    {
    case 0: return d.type == DataType::kFLOAT;                   // unary
    case 1: return d.type == DataType::kINT32;                   // cand ids
    case 2: return isFloatType(d.type);                          // projected hidden
    case 3: return d.type == DataType::kINT32;                   // anchor
    case 4:
    case 5: return d.type == inOut[2].desc.type;                 // codebooks, hidden's dtype
    case 6:
    case 7: return d.type == DataType::kFLOAT;                   // temperature, uniforms
    case 8: return d.type == DataType::kINT32;                   // path ids
    case 9: return d.type == DataType::kFLOAT;                   // q
    default: return false;
    }
}

size_t PairwiseScanPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    if (nbInputs != kScanNbInputs || inputs[0].max.nbDims != 3)
        return 0;
    PairwiseScanParams p;
    p.batch = inputs[0].max.d[0];
    p.length = static_cast<int32_t>(inputs[0].max.d[1]);
    p.topK = static_cast<int32_t>(inputs[0].max.d[2]);
    size_t const bytes = pairwiseScanWorkspaceSize(p);
    traceDetail(kPairwiseScanName, "getWorkspaceSize", "bytes=%zu", bytes);
    return bytes;
}

int32_t PairwiseScanPlugin::enqueue(PluginTensorDesc const* /*inputDesc*/, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    char msg[512];
    Status s = launchPairwiseScan(mParams, static_cast<float const*>(inputs[0]), static_cast<int32_t const*>(inputs[1]),
        inputs[2], static_cast<int32_t const*>(inputs[3]), inputs[4], inputs[5], static_cast<float const*>(inputs[6]),
        static_cast<float const*>(inputs[7]), workspace, static_cast<int32_t*>(outputs[0]),
        static_cast<float*>(outputs[1]), stream, msg, sizeof(msg));
    return enqueueResult(s, msg);
}

} // namespace dflash2
