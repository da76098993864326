/*
 * The IPluginV3 boilerplate the three DFlash2 plugins share, in one place (TensorRT-LLM's plugins
 * share a base class for the same reason). Each plugin keeps only what is its own: its attributes
 * and params, output types and shapes, formats, configure/workspace, enqueue, and which attributes
 * it serialises; the creator keeps its field list and createPlugin.
 *
 * A plugin derives as  class P : public PluginV3Base<P, PAttrs, PParams>  and declares
 * static constexpr kName / kVersion and  void appendSerialFields(std::vector<PluginField>&) noexcept;
 * its constructor fills mParams from the attributes. Its creator derives from PluginCreatorBase<P>
 * and lists its fields with addField().
 */
#pragma once

#include "df2PluginUtils.h"

#include <NvInferRuntime.h>

#include <new>
#include <vector>

namespace dflash2
{

template <typename Derived, typename Attrs, typename Params>
class PluginV3Base : public nvinfer1::IPluginV3,
                     public nvinfer1::IPluginV3OneCore,
                     public nvinfer1::IPluginV3OneBuild,
                     public nvinfer1::IPluginV3OneRuntime
{
public:
    //! The derived constructor fills mParams from the attributes (each plugin's params differ).
    explicit PluginV3Base(Attrs const& attrs)
        : mAttrs(attrs)
    {
    }

    ~PluginV3Base() override = default;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override
    {
        switch (type)
        {
        case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
        case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
        case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
        }
        return nullptr;
    }

    //! A copy with the same attributes and the params configurePlugin / onShapeChange filled in.
    nvinfer1::IPluginV3* clone() noexcept override
    {
        trace(Derived::kName, "clone");
        auto* p = new (std::nothrow) Derived(mAttrs);
        if (p != nullptr)
            static_cast<PluginV3Base*>(p)->mParams = mParams;
        return p;
    }

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override
    {
        return Derived::kName;
    }

    char const* getPluginVersion() const noexcept override
    {
        return Derived::kVersion;
    }

    char const* getPluginNamespace() const noexcept override
    {
        return kPluginNamespace;
    }

    // IPluginV3OneRuntime: the plugins hold no per-context resources.
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* /*context*/) noexcept override
    {
        return clone();
    }

    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override
    {
        trace(Derived::kName, "getFieldsToSerialize");
        mSerialFields.clear();
        static_cast<Derived*>(this)->appendSerialFields(mSerialFields);
        mSerialCollection.nbFields = static_cast<int32_t>(mSerialFields.size());
        mSerialCollection.fields = mSerialFields.data();
        return &mSerialCollection;
    }

protected:
    Attrs mAttrs;
    Params mParams;

private:
    std::vector<nvinfer1::PluginField> mSerialFields;
    nvinfer1::PluginFieldCollection mSerialCollection{};
};

template <typename Plugin>
class PluginCreatorBase : public nvinfer1::IPluginCreatorV3One
{
public:
    ~PluginCreatorBase() override = default;

    char const* getPluginName() const noexcept override
    {
        return Plugin::kName;
    }

    char const* getPluginVersion() const noexcept override
    {
        return Plugin::kVersion;
    }

    char const* getPluginNamespace() const noexcept override
    {
        return kPluginNamespace;
    }

    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override
    {
        return &mCollection;
    }

protected:
    //! One attribute the creator accepts (name, type, element count), in the order of the spec YAML.
    void addField(char const* name, nvinfer1::PluginFieldType type, int32_t length = 1)
    {
        mFields.emplace_back(name, nullptr, type, length);
        mCollection.nbFields = static_cast<int32_t>(mFields.size());
        mCollection.fields = mFields.data();
    }

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mCollection{};
};

} // namespace dflash2
