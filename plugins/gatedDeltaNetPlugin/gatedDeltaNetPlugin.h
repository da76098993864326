/*
 * DFlash2GatedDeltaNet (version "1", namespace "dflash2"): TensorRT IPluginV3 glue. It translates
 * TensorRT's descriptors, calls validateGatedDeltaNet / validateGatedDeltaNetBatch and forwards to
 * launchGatedDeltaNetForward / launchGatedDeltaNetCommit; all math lives in gatedDeltaNetMath.h /
 * gatedDeltaNetKernel.cu. host_request_types, rnn_state_ptr and conv_state_ptr are host tensors
 * (read in enqueue), the state pools behind the pointers are device memory the runtime owns.
 */
#pragma once

#include "../common/df2PluginBase.h"
#include "gatedDeltaNetParams.h"

#include <NvInferRuntime.h>

namespace dflash2
{

constexpr char const* kGatedDeltaNetVersion = "1";

//! Capabilities, clone, names, attachToContext, serialisation, configurePlugin and onShapeChange:
//! PluginV3Base, from the attribute table and the validation of gatedDeltaNetParams.h.
class GatedDeltaNetPlugin : public PluginV3Base<GatedDeltaNetPlugin, GatedDeltaNetAttrs, GatedDeltaNetParams>
{
public:
    static constexpr char const* kName = kGatedDeltaNetName;
    static constexpr char const* kVersion = kGatedDeltaNetVersion;
    static constexpr auto& kFields = kGatedDeltaNetFields;
    static constexpr auto kValidateAttrs = validateGatedDeltaNetAttrs;
    static constexpr auto kValidate = validateGatedDeltaNet;
    static constexpr int32_t kMaxInputs = kGdnMaxNbInputs;

    explicit GatedDeltaNetPlugin(GatedDeltaNetAttrs const& attrs);
    ~GatedDeltaNetPlugin() override = default;

    // IPluginV3OneBuild
    int32_t getNbOutputs() const noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
};

//! Names, the field list and createPlugin: PluginCreatorBase.
class GatedDeltaNetPluginCreator : public PluginCreatorBase<GatedDeltaNetPlugin>
{
};

} // namespace dflash2
