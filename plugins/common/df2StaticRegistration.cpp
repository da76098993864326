/*
 * Static registration of the three creators, the entry of libdflash2_plugins.so: loading the library
 * (LD_PRELOAD / ctypes / dlopen) registers them, as Triton's TensorRT-LLM backend calls no init
 * function. Only that variant contains this file: libdflash2_plugins_dynamic.so has the loadLibrary
 * entry points instead (common/df2LibraryEntry.cpp), and loadLibrary fails on a creator that is
 * already registered; the glue harness (tests/plugins) links neither, as it runs without libnvinfer.
 */
#include "dynamicConvPlugin/dynamicConvPlugin.h"
#include "gatedDeltaNetPlugin/gatedDeltaNetPlugin.h"
#include "pairwiseScanPlugin/pairwiseScanPlugin.h"

#include <NvInferRuntime.h>

namespace dflash2
{

REGISTER_TENSORRT_PLUGIN(DynamicConvPluginCreator);
REGISTER_TENSORRT_PLUGIN(PairwiseScanPluginCreator);
REGISTER_TENSORRT_PLUGIN(GatedDeltaNetPluginCreator);

} // namespace dflash2
