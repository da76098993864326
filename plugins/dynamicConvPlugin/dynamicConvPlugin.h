/*
 * DFlash2DynamicConv (version "1", namespace "dflash2"): TensorRT IPluginV3 glue. It translates
 * TensorRT's descriptors, calls validateDynamicConv and forwards to launchDynamicConv; all math
 * lives in dynamicConvMath.h / dynamicConvKernel.cu.
 */
#pragma once

#include "../common/df2PluginBase.h"
#include "dynamicConvParams.h"

#include <NvInferRuntime.h>

namespace dflash2
{

constexpr char const* kDynamicConvVersion = "1";

//! Capabilities, clone, names, attachToContext, serialisation, configurePlugin and onShapeChange:
//! PluginV3Base, from the attribute table and the validation of dynamicConvParams.h.
class DynamicConvPlugin : public PluginV3Base<DynamicConvPlugin, DynamicConvAttrs, DynamicConvParams>
{
public:
    static constexpr char const* kName = kDynamicConvName;
    static constexpr char const* kVersion = kDynamicConvVersion;
    static constexpr auto& kFields = kDynamicConvFields;
    static constexpr auto kValidateAttrs = validateDynamicConvAttrs;
    static constexpr auto kValidate = validateDynamicConv;
    static constexpr int32_t kMaxInputs = 4; // with the fused residual

    explicit DynamicConvPlugin(DynamicConvAttrs const& attrs);
    ~DynamicConvPlugin() override = default;

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
class DynamicConvPluginCreator : public PluginCreatorBase<DynamicConvPlugin>
{
};

} // namespace dflash2
