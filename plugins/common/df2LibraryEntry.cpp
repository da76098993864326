/*
 * Entry points of libdflash2_plugins_dynamic.so, the variant of the plugin library for
 * IPluginRegistry::loadLibrary: `trtexec --dynamicPlugins=...`, and engines that embed the library
 * (IBuilderConfig::setPluginsToSerialize) so that they deserialize without any preload.
 *
 * That variant does not contain common/df2StaticRegistration.cpp: loadLibrary fails when one of the
 * creators it gets from getCreators() is already registered, which a static registrar would have
 * done at dlopen. libdflash2_plugins.so (static registration, for LD_PRELOAD / ctypes / Triton)
 * does not contain this file.
 */
#include "dynamicConvPlugin/dynamicConvPlugin.h"
#include "gatedDeltaNetPlugin/gatedDeltaNetPlugin.h"
#include "pairwiseScanPlugin/pairwiseScanPlugin.h"

#include <NvInferRuntime.h>

#include <cstdint>

extern "C" void setLoggerFinder(nvinfer1::ILoggerFinder* /*finder*/)
{
    // The plugins report their errors on stderr (common/df2PluginUtils.h) and keep no logger.
}

extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static dflash2::DynamicConvPluginCreator convCreator;
    static dflash2::PairwiseScanPluginCreator scanCreator;
    static dflash2::GatedDeltaNetPluginCreator gdnCreator;
    static nvinfer1::IPluginCreatorInterface* const creators[] = {&convCreator, &scanCreator, &gdnCreator};
    nbCreators = static_cast<int32_t>(sizeof(creators) / sizeof(creators[0]));
    return creators;
}
