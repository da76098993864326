/*
 * DFlash2DynamicConv (version "1", namespace "dflash2"): TensorRT IPluginV3 glue. It translates
 * TensorRT's descriptors, calls validateDynamicConv and forwards to launchDynamicConv; all math
 * lives in dynamicConvMath.h / dynamicConvKernel.cu.
 */
#pragma once

#include "../common/df2PluginBase.h"
#include "../common/df2PluginUtils.h"
#include "dynamicConvParams.h"

#include <NvInferRuntime.h>

#include <string>
#include <vector>

namespace dflash2
{

constexpr char const* kDynamicConvName = "DFlash2DynamicConv";
constexpr char const* kDynamicConvVersion = "1";

//! Capabilities, clone, names, attachToContext and the serialisation collection: PluginV3Base.
class DynamicConvPlugin : public PluginV3Base<DynamicConvPlugin, DynamicConvAttrs, DynamicConvParams>
{
public:
    static constexpr char const* kName = kDynamicConvName;
    static constexpr char const* kVersion = kDynamicConvVersion;

    explicit DynamicConvPlugin(DynamicConvAttrs const& attrs);
    ~DynamicConvPlugin() override = default;

    //! The attributes an engine stores (getFieldsToSerialize), in the order of the spec YAML.
    void appendSerialFields(std::vector<nvinfer1::PluginField>& fields) noexcept;

    // IPluginV3OneBuild
    int32_t getNbOutputs() const noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
};

//! Names and the field list: PluginCreatorBase.
class DynamicConvPluginCreator : public PluginCreatorBase<DynamicConvPlugin>
{
public:
    DynamicConvPluginCreator();
    ~DynamicConvPluginCreator() override = default;

    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;
};

} // namespace dflash2
