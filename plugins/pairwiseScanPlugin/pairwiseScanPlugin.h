/*
 * DFlash2PairwiseScan (version "1", namespace "dflash2"): TensorRT IPluginV3 glue. It translates
 * TensorRT's descriptors, calls validatePairwiseScan and forwards to launchPairwiseScan; all math
 * lives in pairwiseScanMath.h / pairwiseScanKernel.cu.
 */
#pragma once

#include "../common/df2PluginBase.h"
#include "pairwiseScanParams.h"

#include <NvInferRuntime.h>

namespace dflash2
{

constexpr char const* kPairwiseScanVersion = "1";

//! Capabilities, clone, names, attachToContext, serialisation, configurePlugin and onShapeChange:
//! PluginV3Base, from the attribute table and the validation of pairwiseScanParams.h.
class PairwiseScanPlugin : public PluginV3Base<PairwiseScanPlugin, PairwiseScanAttrs, PairwiseScanParams>
{
public:
    static constexpr char const* kName = kPairwiseScanName;
    static constexpr char const* kVersion = kPairwiseScanVersion;
    static constexpr auto& kFields = kPairwiseScanFields;
    static constexpr auto kValidateAttrs = validatePairwiseScanAttrs;
    static constexpr auto kValidate = validatePairwiseScan;
    static constexpr int32_t kMaxInputs = kScanNbInputs;

    explicit PairwiseScanPlugin(PairwiseScanAttrs const& attrs);
    ~PairwiseScanPlugin() override = default;

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
class PairwiseScanPluginCreator : public PluginCreatorBase<PairwiseScanPlugin>
{
};

} // namespace dflash2
