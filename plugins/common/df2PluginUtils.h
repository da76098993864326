/*
 * Helpers for the TensorRT glue only (includes NvInfer headers). Kernels, validation and the CPU
 * build never include this file.
 */
#pragma once

#include "df2Common.h"

#include <NvInferRuntime.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace dflash2
{

constexpr char const* kPluginNamespace = "dflash2";

//! nvinfer1::DataType -> DType. Types the plugins do not know map to a value that every
//! validation function rejects with "unknown" in its message.
inline DType toDType(nvinfer1::DataType t)
{
    switch (t)
    {
    case nvinfer1::DataType::kFLOAT: return DType::kFLOAT32;
    case nvinfer1::DataType::kHALF: return DType::kFLOAT16;
    case nvinfer1::DataType::kBF16: return DType::kBFLOAT16;
    case nvinfer1::DataType::kINT32: return DType::kINT32;
    case nvinfer1::DataType::kINT64: return DType::kINT64;
    default: return static_cast<DType>(99);
    }
}

//! The activation dtypes every plugin accepts (as TensorRT names them): float32, float16, bfloat16.
inline bool isFloatType(nvinfer1::DataType t)
{
    return t == nvinfer1::DataType::kFLOAT || t == nvinfer1::DataType::kHALF || t == nvinfer1::DataType::kBF16;
}

inline nvinfer1::DataType toTrt(DType t)
{
    switch (t)
    {
    case DType::kFLOAT16: return nvinfer1::DataType::kHALF;
    case DType::kBFLOAT16: return nvinfer1::DataType::kBF16;
    case DType::kINT32: return nvinfer1::DataType::kINT32;
    case DType::kINT64: return nvinfer1::DataType::kINT64;
    case DType::kFLOAT32: break;
    }
    return nvinfer1::DataType::kFLOAT;
}

inline TensorDesc toDesc(nvinfer1::DataType type, nvinfer1::Dims const& dims)
{
    TensorDesc d;
    d.type = toDType(type);
    d.nbDims = dims.nbDims;
    for (int32_t i = 0; i < dims.nbDims && i < 8; ++i)
        d.dims[i] = dims.d[i];
    return d;
}

//! Plugins report errors on stderr with their name; TensorRT then fails the build/enqueue
//! because the call returned an error code (there is no exception path through the C ABI).
inline void reportError(char const* what, char const* msg)
{
    std::fprintf(stderr, "[dflash2 plugin] %s: %s\n", what, msg);
}

//! enqueue's return value for a launcher's status: 0, or -1 with the launcher's message reported.
inline int32_t enqueueResult(Status s, char const* msg)
{
    if (s == Status::kOK)
        return 0;
    reportError("enqueue", msg);
    return -1;
}

//! Build-time trace: with DFLASH2_PLUGIN_TRACE=1 in the environment (read once), each build-time
//! method of the glue prints one line on stderr, "[dflash2 plugin] trace <plugin>::<method> <detail>".
//! Off by default. A builder that runs no kernels (TensorRT-RTX on a CPU machine) shows with it that
//! it called them; dflash2_trt.onnx.rtx and tests/onnx read these lines.
inline bool traceEnabled()
{
    static bool const enabled = []
    {
        char const* v = std::getenv("DFLASH2_PLUGIN_TRACE");
        return v != nullptr && v[0] == '1' && v[1] == '\0';
    }();
    return enabled;
}

inline void trace(char const* plugin, char const* method, char const* detail = "")
{
    if (traceEnabled())
        std::fprintf(stderr, "[dflash2 plugin] trace %s::%s%s%s\n", plugin, method, detail[0] ? " " : "", detail);
}

//! trace() with a printf-formatted detail ("pos=%d", "bytes=%zu"), formatted only when tracing is on.
__attribute__((format(printf, 3, 4))) inline void traceDetail(
    char const* plugin, char const* method, char const* fmt, ...)
{
    if (!traceEnabled())
        return;
    char detail[64];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(detail, sizeof(detail), fmt, args);
    va_end(args);
    trace(plugin, method, detail);
}

//! Reads one int32 attribute value; false when the field has another type or length.
inline bool readInt32Field(nvinfer1::PluginField const& f, int32_t* value)
{
    if (f.data == nullptr || f.length != 1)
        return false;
    if (f.type == nvinfer1::PluginFieldType::kINT32)
    {
        std::memcpy(value, f.data, sizeof(int32_t));
        return true;
    }
    return false;
}

//! Fills *attrs from fc through the plugin's attribute table. Unknown names, wrong types and
//! missing required fields are errors (a misspelled attribute silently falling back to a default
//! would build a wrong engine); fields not given keep *attrs' values.
template <typename Attrs, size_t N>
bool parseInt32Fields(char const* plugin, nvinfer1::PluginFieldCollection const* fc,
    Int32AttrField<Attrs> const (&table)[N], Attrs* attrs)
{
    bool seen[N] = {};
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
    {
        nvinfer1::PluginField const& f = fc->fields[i];
        size_t k = 0;
        while (k < N && std::strcmp(f.name, table[k].name) != 0)
            ++k;
        if (k == N)
        {
            std::string msg = std::string("unknown attribute '") + f.name + "'";
            reportError(plugin, msg.c_str());
            return false;
        }
        if (!readInt32Field(f, &(attrs->*table[k].member)))
        {
            std::string msg = std::string("attribute '") + f.name + "' must be one int32 value";
            reportError(plugin, msg.c_str());
            return false;
        }
        seen[k] = true;
    }
    for (size_t k = 0; k < N; ++k)
    {
        if (table[k].required && !seen[k])
        {
            std::string msg = std::string("missing required attribute '") + table[k].name + "'";
            reportError(plugin, msg.c_str());
            return false;
        }
    }
    return true;
}

} // namespace dflash2
