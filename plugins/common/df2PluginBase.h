/*
 * The IPluginV3 boilerplate the three DFlash2 plugins share, in one place (TensorRT-LLM's plugins
 * share a base class for the same reason). Each plugin keeps only what is its own: its attribute
 * table and validation (its Params.h/.cpp), its constructor (params from attributes), output
 * count, types and shapes, formats, workspace and enqueue.
 *
 * A plugin derives as  class P : public PluginV3Base<P, PAttrs, PParams>  and declares
 *   static constexpr char const* kName, kVersion;
 *   static constexpr auto& kFields = kPFields;         // Int32AttrField<PAttrs>[], the spec's order
 *   static constexpr auto kValidateAttrs = validatePAttrs;
 *   static constexpr auto kValidate = validateP;       // (attrs, descs, nbInputs, params*, msg, len)
 *   static constexpr int32_t kMaxInputs = ...;         // the most inputs any attribute set takes
 * From these the base serialises the attributes, validates the shapes in configurePlugin (params
 * not kept) and onShapeChange (params kept for enqueue), and the creator lists, parses and checks
 * the fields:  class PCreator : public PluginCreatorBase<P> {};
 */
#pragma once

#include "df2PluginUtils.h"

#include <NvInferRuntime.h>

#include <cstdio>
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
    using AttrsType = Attrs;

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

    //! Every attribute of the table, as createPlugin reads it back when the engine deserialises.
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override
    {
        trace(Derived::kName, "getFieldsToSerialize");
        mSerialFields.clear();
        for (auto const& f : Derived::kFields)
            mSerialFields.emplace_back(f.name, &(mAttrs.*f.member), nvinfer1::PluginFieldType::kINT32, 1);
        mSerialCollection.nbFields = static_cast<int32_t>(mSerialFields.size());
        mSerialCollection.fields = mSerialFields.data();
        return &mSerialCollection;
    }

    // IPluginV3OneBuild: build-time check of the (possibly -1) dims; the params are not kept.
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* /*out*/, int32_t /*nbOutputs*/) noexcept override
    {
        trace(Derived::kName, "configurePlugin");
        return validateShapes("configurePlugin", in, nbInputs, nullptr);
    }

    // IPluginV3OneRuntime: the concrete shapes of the coming enqueue calls; enqueue uses mParams.
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::PluginTensorDesc const* /*out*/, int32_t /*nbOutputs*/) noexcept override
    {
        return validateShapes("onShapeChange", in, nbInputs, &mParams);
    }

protected:
    Attrs mAttrs;
    Params mParams;

private:
    static nvinfer1::PluginTensorDesc const& descOf(nvinfer1::DynamicPluginTensorDesc const& d)
    {
        return d.desc;
    }

    static nvinfer1::PluginTensorDesc const& descOf(nvinfer1::PluginTensorDesc const& d)
    {
        return d;
    }

    //! TensorRT's descriptors -> TensorDesc, then the plugin's validation; a rejection is reported
    //! with the method's name and fails the call.
    template <typename Desc>
    int32_t validateShapes(char const* method, Desc const* in, int32_t nbInputs, Params* params) noexcept
    {
        char msg[512];
        if (nbInputs < 0 || nbInputs > Derived::kMaxInputs)
        {
            std::snprintf(msg, sizeof(msg), "%s: %d inputs; it takes at most %d", Derived::kName, nbInputs,
                Derived::kMaxInputs);
            reportError(method, msg);
            return -1;
        }
        TensorDesc descs[Derived::kMaxInputs];
        for (int32_t i = 0; i < nbInputs; ++i)
            descs[i] = toDesc(descOf(in[i]).type, descOf(in[i]).dims); // -1 dims are skipped by the validation
        if (Derived::kValidate(mAttrs, descs, nbInputs, params, msg, sizeof(msg)) != Status::kOK)
        {
            reportError(method, msg);
            return -1;
        }
        return 0;
    }

    std::vector<nvinfer1::PluginField> mSerialFields;
    nvinfer1::PluginFieldCollection mSerialCollection{};
};

template <typename Plugin>
class PluginCreatorBase : public nvinfer1::IPluginCreatorV3One
{
public:
    //! The plugin's attribute table, announced as int32 fields of one value, in the spec's order.
    PluginCreatorBase()
    {
        for (auto const& f : Plugin::kFields)
            mFields.emplace_back(f.name, nullptr, nvinfer1::PluginFieldType::kINT32, 1);
        mCollection.nbFields = static_cast<int32_t>(mFields.size());
        mCollection.fields = mFields.data();
    }

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

    //! The same path for a network's attributes and an engine's serialised ones: the fields
    //! through the table (parseInt32Fields), the attribute rules, then the plugin.
    nvinfer1::IPluginV3* createPlugin(char const* /*name*/, nvinfer1::PluginFieldCollection const* fc,
        nvinfer1::TensorRTPhase /*phase*/) noexcept override
    {
        typename Plugin::AttrsType a; // attributes not given keep the struct's defaults
        if (!parseInt32Fields(Plugin::kName, fc, Plugin::kFields, &a))
            return nullptr;
        char msg[512];
        if (Plugin::kValidateAttrs(a, msg, sizeof(msg)) != Status::kOK)
        {
            reportError("createPlugin", msg);
            return nullptr;
        }
        return new (std::nothrow) Plugin(a);
    }

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mCollection{};
};

} // namespace dflash2
