#include "gatedDeltaNetPlugin.h"
#include "gatedDeltaNetKernel.h"

using namespace nvinfer1;

namespace dflash2
{
namespace
{

bool isCommit(GatedDeltaNetAttrs const& a)
{
    return a.mode == static_cast<int32_t>(GdnMode::kCOMMIT);
}

// Input positions the glue reads on the host.
int32_t hostRequestTypesIndex(GatedDeltaNetAttrs const& a)
{
    return isCommit(a) ? 6 : 8;
}

int32_t rnnStatePtrIndex(GatedDeltaNetAttrs const& a)
{
    return isCommit(a) ? 7 : 9;
}

} // namespace

GatedDeltaNetPlugin::GatedDeltaNetPlugin(GatedDeltaNetAttrs const& attrs)
    : PluginV3Base(attrs)
{
    mParams.attrs = attrs;
}

int32_t GatedDeltaNetPlugin::getNbOutputs() const noexcept
{
    return gatedDeltaNetNbOutputs(mAttrs);
}

int32_t GatedDeltaNetPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    trace(kGatedDeltaNetName, "getOutputDataTypes");
    if (nbOutputs != gatedDeltaNetNbOutputs(mAttrs) || nbInputs != gatedDeltaNetNbInputs(mAttrs))
        return -1;
    if (isCommit(mAttrs))
    {
        outputTypes[0] = DataType::kINT32; // committed [B]
        return 0;
    }
    outputTypes[0] = inputTypes[0]; // y
    outputTypes[1] = inputTypes[0]; // verify_qkv
    outputTypes[2] = DataType::kFLOAT; // verify_gates
    return 0;
}

int32_t GatedDeltaNetPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /*shapeInputs*/, int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs,
    IExprBuilder& exprBuilder) noexcept
{
    trace(kGatedDeltaNetName, "getOutputShapes");
    if (nbOutputs != gatedDeltaNetNbOutputs(mAttrs) || nbInputs != gatedDeltaNetNbInputs(mAttrs))
        return -1;
    if (isCommit(mAttrs))
    {
        if (inputs[5].nbDims != 1)
            return -1;
        outputs[0] = inputs[5]; // committed [B], B from slot_mapping
        return 0;
    }
    if (inputs[0].nbDims != 2 || inputs[7].nbDims != 1)
        return -1;
    auto const* hvdv = exprBuilder.constant(static_cast<int64_t>(mAttrs.numVHeads) * mAttrs.headVDim);
    auto const* kv = exprBuilder.constant(mAttrs.maxVerifyTokens);
    auto const* c = exprBuilder.constant(gatedDeltaNetConvDim(mAttrs));
    outputs[0].nbDims = 2; // y [T, Hv Dv]
    outputs[0].d[0] = inputs[0].d[0];
    outputs[0].d[1] = hvdv;
    outputs[1].nbDims = 3; // verify_qkv [B, Kv, C]
    outputs[1].d[0] = inputs[7].d[0];
    outputs[1].d[1] = kv;
    outputs[1].d[2] = c;
    outputs[2].nbDims = 4; // verify_gates [B, Kv, 2, Hv]
    outputs[2].d[0] = inputs[7].d[0];
    outputs[2].d[1] = kv;
    outputs[2].d[2] = exprBuilder.constant(2);
    outputs[2].d[3] = exprBuilder.constant(mAttrs.numVHeads);
    return 0;
}

bool GatedDeltaNetPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t /*nbOutputs*/) noexcept
{
    traceDetail(kGatedDeltaNetName, "supportsFormatCombination", "pos=%d", pos);
    PluginTensorDesc const& d = inOut[pos].desc;
    if (d.format != TensorFormat::kLINEAR)
        return false;
    DataType const act = inOut[0].desc.type;
    if (isCommit(mAttrs))
    {
        switch (pos)
        {
        case 0: return isFloatType(d.type);                   // verify_qkv
        case 1: return d.type == DataType::kFLOAT;            // verify_gates
        case 2: return d.type == act;                         // conv_weight
        case 3:                                               // num_accepted
        case 4:                                               // cu_seqlens
        case 5:                                               // slot_mapping
        case 6: return d.type == DataType::kINT32;            // host_request_types
        case 7:
        case 8: return d.type == DataType::kINT64;            // state pointers
        default: return pos == nbInputs && d.type == DataType::kINT32; // committed
        }
    }
    if (pos >= nbInputs) // outputs: y, verify_qkv (activation dtype), verify_gates (fp32)
        return pos - nbInputs < 2 ? d.type == act : (pos - nbInputs == 2 && d.type == DataType::kFLOAT);
    switch (pos)
    {
    case 0: return isFloatType(d.type); // qkv
    case 1:                             // conv_weight
    case 2:                             // a
    case 3: return d.type == act;       // b
    case 4:
    case 5: return d.type == DataType::kFLOAT; // dt_bias, A_log
    case 6:
    case 7:
    case 8: return d.type == DataType::kINT32; // cu_seqlens, slot_mapping, host_request_types
    case 9:
    case 10: return d.type == DataType::kINT64; // state pointers
    case 11: return d.type == DataType::kINT32; // zero_state (zero_state_input = 1)
    default: return false;
    }
}

size_t GatedDeltaNetPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    if (nbInputs != gatedDeltaNetNbInputs(mAttrs) || inputs[0].max.nbDims < 1)
        return 0;
    GatedDeltaNetParams p;
    p.attrs = mAttrs;
    p.convDim = gatedDeltaNetConvDim(mAttrs);
    p.dataType = toDType(inputs[0].desc.type);
    if (isCommit(mAttrs))
    {
        p.batch = inputs[0].max.d[0];
        p.tokens = p.batch * mAttrs.maxVerifyTokens;
    }
    else
    {
        p.tokens = inputs[0].max.d[0];
        p.batch = inputs[7].max.d[0];
    }
    size_t const bytes = gatedDeltaNetWorkspaceSize(p);
    traceDetail(kGatedDeltaNetName, "getWorkspaceSize", "bytes=%zu", bytes);
    return bytes;
}

int32_t GatedDeltaNetPlugin::enqueue(PluginTensorDesc const* /*inputDesc*/, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    char msg[512];
    GatedDeltaNetParams p = mParams;
    // host_request_types is a host tensor: request kinds (and the context-first order) are known here.
    auto const* types = static_cast<int32_t const*>(inputs[hostRequestTypesIndex(mAttrs)]);
    if (validateGatedDeltaNetBatch(&p, types, nullptr, nullptr, 0, nullptr, msg, sizeof(msg)) != Status::kOK)
    {
        reportError("enqueue", msg);
        return -1;
    }
    int32_t const ptrAt = rnnStatePtrIndex(mAttrs);
    int64_t const rnnPtr = *static_cast<int64_t const*>(inputs[ptrAt]);
    int64_t const convPtr = *static_cast<int64_t const*>(inputs[ptrAt + 1]);
    if (rnnPtr == 0 || (convPtr == 0 && mAttrs.convKernel > 1))
    {
        // TensorRT may run a plugin with zero-filled inputs while it builds; a real call always
        // has both pools. Nothing is computed, so no pool is touched.
        reportError("enqueue", "DFlash2GatedDeltaNet: rnn_state_ptr or conv_state_ptr is null; nothing computed");
        return 0;
    }
    GdnLaunchArgs g;
    g.rnnPool = reinterpret_cast<float*>(rnnPtr);
    g.convPool = reinterpret_cast<void*>(convPtr);
    g.workspace = workspace;
    Status s;
    if (isCommit(mAttrs))
    {
        g.verifyQkv = const_cast<void*>(inputs[0]); // read only in commit
        g.verifyGates = static_cast<float*>(const_cast<void*>(inputs[1]));
        g.convWeight = inputs[2];
        g.numAccepted = static_cast<int32_t const*>(inputs[3]);
        g.cuSeqlens = static_cast<int32_t const*>(inputs[4]);
        g.slots = static_cast<int32_t const*>(inputs[5]);
        g.committed = static_cast<int32_t*>(outputs[0]);
        s = launchGatedDeltaNetCommit(p, g, stream, msg, sizeof(msg));
    }
    else
    {
        g.qkv = inputs[0];
        g.convWeight = inputs[1];
        g.a = inputs[2];
        g.b = inputs[3];
        g.dtBias = static_cast<float const*>(inputs[4]);
        g.aLog = static_cast<float const*>(inputs[5]);
        g.cuSeqlens = static_cast<int32_t const*>(inputs[6]);
        g.slots = static_cast<int32_t const*>(inputs[7]);
        g.zeroState = mAttrs.zeroStateInput ? static_cast<int32_t const*>(inputs[11]) : nullptr;
        g.y = outputs[0];
        g.verifyQkv = outputs[1];
        g.verifyGates = static_cast<float*>(outputs[2]);
        s = launchGatedDeltaNetForward(p, g, stream, msg, sizeof(msg));
    }
    return enqueueResult(s, msg);
}

} // namespace dflash2
