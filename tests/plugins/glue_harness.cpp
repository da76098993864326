// Exercises the IPluginV3 glue without TensorRT's library: compiled against TensorRT headers without
// common/df2StaticRegistration.cpp (there is no libnvinfer to register with), linked with the real
// kernels and libcudart. Run by tests/plugins/test_plugin_build.py when DFLASH2_TRT_INCLUDE is set.
// Prints one line per check; exit status = number of failed checks.
#include "dynamicConvPlugin/dynamicConvPlugin.h"
#include "gatedDeltaNetPlugin/gatedDeltaNetPlugin.h"
#include "pairwiseScanPlugin/pairwiseScanPlugin.h"

#include <cstdio>

// common/df2LibraryEntry.cpp (the loadLibrary entry points), linked into this harness.
extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);
#include <cstring>
#include <memory>
#include <vector>

using namespace nvinfer1;
using namespace dflash2;

namespace
{

int gFailures = 0;

void check(bool ok, char const* what)
{
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    if (!ok)
        ++gFailures;
}

struct Fields
{
    std::vector<int32_t> values;
    std::vector<PluginField> fields;
    PluginFieldCollection fc{};

    Fields(std::vector<std::pair<char const*, int32_t>> const& kv, PluginFieldType type = PluginFieldType::kINT32)
    {
        values.reserve(kv.size());
        for (auto const& p : kv)
            values.push_back(p.second);
        for (size_t i = 0; i < kv.size(); ++i)
            fields.emplace_back(kv[i].first, &values[i], type, 1);
        fc.nbFields = static_cast<int32_t>(fields.size());
        fc.fields = fields.data();
    }
};

Dims dims(std::vector<int64_t> const& d)
{
    Dims out{};
    out.nbDims = static_cast<int32_t>(d.size());
    for (size_t i = 0; i < d.size(); ++i)
        out.d[i] = d[i];
    return out;
}

DynamicPluginTensorDesc dyn(DataType t, std::vector<int64_t> const& d, std::vector<int64_t> const& maxD = {})
{
    DynamicPluginTensorDesc x{};
    x.desc.type = t;
    x.desc.format = TensorFormat::kLINEAR;
    x.desc.dims = dims(d);
    x.min = dims(d);
    x.opt = dims(d);
    x.max = dims(maxD.empty() ? d : maxD);
    return x;
}

template <class P>
std::unique_ptr<IPluginV3> own(P* p)
{
    return std::unique_ptr<IPluginV3>(p);
}

void testConv()
{
    DynamicConvPluginCreator creator;
    check(std::strcmp(creator.getPluginName(), "DFlash2DynamicConv") == 0, "conv creator name");
    check(std::strcmp(creator.getPluginVersion(), "1") == 0, "conv creator version");
    check(std::strcmp(creator.getPluginNamespace(), "dflash2") == 0, "conv creator namespace");
    check(creator.getFieldNames()->nbFields == 4, "conv creator announces 4 fields");

    Fields good({{"block_size", 16}, {"kernel_size", 2}, {"group_size", 16}});
    auto plugin = own(creator.createPlugin("conv", &good.fc, TensorRTPhase::kBUILD));
    check(plugin != nullptr, "conv createPlugin with required fields");
    if (!plugin)
        return;
    Fields unknown({{"block_size", 16}, {"kernel_size", 2}, {"group_size", 16}, {"kernal_size", 2}});
    check(own(creator.createPlugin("c", &unknown.fc, TensorRTPhase::kBUILD)) == nullptr, "conv rejects unknown field");
    Fields missing({{"block_size", 16}, {"group_size", 16}});
    check(own(creator.createPlugin("c", &missing.fc, TensorRTPhase::kBUILD)) == nullptr, "conv rejects missing field");
    Fields bigK({{"block_size", 16}, {"kernel_size", 5}, {"group_size", 16}});
    check(own(creator.createPlugin("c", &bigK.fc, TensorRTPhase::kBUILD)) == nullptr, "conv rejects kernel_size 5");
    Fields wrongType({{"block_size", 16}, {"kernel_size", 2}, {"group_size", 16}}, PluginFieldType::kFLOAT32);
    check(own(creator.createPlugin("c", &wrongType.fc, TensorRTPhase::kBUILD)) == nullptr, "conv rejects float fields");

    auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    check(core && build && rt, "conv exposes core/build/runtime capabilities");
    check(std::strcmp(core->getPluginName(), "DFlash2DynamicConv") == 0, "conv plugin name");
    check(build->getNbOutputs() == 1, "conv has one output");
    DataType in[3] = {DataType::kBF16, DataType::kBF16, DataType::kBF16};
    DataType out[1];
    check(build->getOutputDataTypes(out, 1, in, 3) == 0 && out[0] == DataType::kBF16, "conv output dtype = x dtype");

    std::vector<DynamicPluginTensorDesc> io = {dyn(DataType::kBF16, {-1, 5120}), dyn(DataType::kBF16, {-1, 2, 320}),
        dyn(DataType::kBF16, {2, 5120}), dyn(DataType::kBF16, {-1, 5120})};
    bool formats = true;
    for (int pos = 0; pos < 4; ++pos)
        formats = formats && build->supportsFormatCombination(pos, io.data(), 3, 1);
    check(formats, "conv supports bf16 linear everywhere");
    io[1].desc.type = DataType::kHALF;
    check(!build->supportsFormatCombination(1, io.data(), 3, 1), "conv rejects delta dtype != x dtype");
    io[1].desc.type = DataType::kBF16;
    io[3].desc.type = DataType::kFLOAT;
    check(!build->supportsFormatCombination(3, io.data(), 3, 1), "conv rejects fp32 output when unfused");
    io[3].desc.type = DataType::kBF16;
    check(build->configurePlugin(io.data(), 3, io.data() + 3, 1) == 0, "conv configurePlugin with dynamic tokens");
    std::vector<DynamicPluginTensorDesc> bad = {dyn(DataType::kBF16, {17, 5120}), dyn(DataType::kBF16, {17, 2, 320}),
        dyn(DataType::kBF16, {2, 5120})};
    std::printf("(expected error follows)\n");
    check(build->configurePlugin(bad.data(), 3, io.data() + 3, 1) != 0, "conv configurePlugin rejects 17 tokens");

    // serialisation round trip
    PluginFieldCollection const* ser = rt->getFieldsToSerialize();
    auto again = own(creator.createPlugin("conv", ser, TensorRTPhase::kRUNTIME));
    check(again != nullptr, "conv recreated from its serialised fields");
    if (again)
    {
        auto* rt2 = static_cast<IPluginV3OneRuntime*>(again->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
        PluginFieldCollection const* ser2 = rt2->getFieldsToSerialize();
        bool same = ser2->nbFields == ser->nbFields;
        for (int i = 0; same && i < ser->nbFields; ++i)
            same = std::strcmp(ser->fields[i].name, ser2->fields[i].name) == 0
                && *static_cast<int32_t const*>(ser->fields[i].data) == *static_cast<int32_t const*>(ser2->fields[i].data);
        check(same, "conv serialised fields round-trip");
    }

    // fused variant: 4 inputs, fp32 output
    Fields fused({{"block_size", 16}, {"kernel_size", 2}, {"group_size", 16}, {"fuse_residual", 1}});
    auto fp = own(creator.createPlugin("convf", &fused.fc, TensorRTPhase::kBUILD));
    check(fp != nullptr, "conv fused createPlugin");
    if (fp)
    {
        auto* b2 = static_cast<IPluginV3OneBuild*>(fp->getCapabilityInterface(PluginCapabilityType::kBUILD));
        DataType in4[4] = {DataType::kHALF, DataType::kHALF, DataType::kHALF, DataType::kFLOAT};
        check(b2->getOutputDataTypes(out, 1, in4, 4) == 0 && out[0] == DataType::kFLOAT, "fused conv outputs fp32");
    }

    // runtime: concrete shapes, then enqueue (no GPU here: must fail cleanly, not crash)
    PluginTensorDesc rin[3] = {io[0].desc, io[1].desc, io[2].desc};
    rin[0].dims = dims({32, 5120});
    rin[1].dims = dims({32, 2, 320});
    check(rt->onShapeChange(rin, 3, &io[3].desc, 1) == 0, "conv onShapeChange with concrete shapes");
    int deviceCount = 0;
    if (cudaGetDeviceCount(&deviceCount) != cudaSuccess || deviceCount == 0)
    {
        alignas(16) static uint16_t dummy[8];
        void const* ins[3] = {dummy, dummy, dummy};
        void* outs[1] = {dummy};
        std::printf("(expected error follows)\n");
        check(rt->enqueue(rin, &io[3].desc, ins, outs, nullptr, nullptr) != 0, "conv enqueue without a GPU fails cleanly");
    }
}

void testScan()
{
    PairwiseScanPluginCreator creator;
    check(std::strcmp(creator.getPluginName(), "DFlash2PairwiseScan") == 0, "scan creator name");
    check(creator.getFieldNames()->nbFields == 1, "scan creator announces 1 field");
    auto plugin = own(creator.createPlugin("scan", nullptr, TensorRTPhase::kBUILD));
    check(plugin != nullptr, "scan createPlugin with defaults (greedy)");
    Fields badMode({{"mode", 3}});
    check(own(creator.createPlugin("s", &badMode.fc, TensorRTPhase::kBUILD)) == nullptr, "scan rejects mode 3");
    if (!plugin)
        return;
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    check(build->getNbOutputs() == 2, "scan has two outputs");
    DataType in[8] = {DataType::kFLOAT, DataType::kINT32, DataType::kBF16, DataType::kINT32, DataType::kBF16,
        DataType::kBF16, DataType::kFLOAT, DataType::kFLOAT};
    DataType out[2];
    check(build->getOutputDataTypes(out, 2, in, 8) == 0 && out[0] == DataType::kINT32 && out[1] == DataType::kFLOAT,
        "scan outputs int32 ids and fp32 q");
    std::vector<DynamicPluginTensorDesc> io = {dyn(DataType::kFLOAT, {-1, 7, 16}, {64, 7, 16}),
        dyn(DataType::kINT32, {-1, 7, 16}), dyn(DataType::kBF16, {-1, 7, 256}), dyn(DataType::kINT32, {-1}),
        dyn(DataType::kBF16, {248320, 256}), dyn(DataType::kBF16, {248320, 256}), dyn(DataType::kFLOAT, {-1}),
        dyn(DataType::kFLOAT, {-1, 7}), dyn(DataType::kINT32, {-1, 7}), dyn(DataType::kFLOAT, {-1, 7, 16})};
    bool formats = true;
    for (int pos = 0; pos < 10; ++pos)
        formats = formats && build->supportsFormatCombination(pos, io.data(), 8, 2);
    check(formats, "scan supports its declared dtypes");
    io[4].desc.type = DataType::kHALF;
    check(!build->supportsFormatCombination(4, io.data(), 8, 2), "scan rejects codebook dtype != hidden dtype");
    io[4].desc.type = DataType::kBF16;
    check(build->configurePlugin(io.data(), 8, io.data() + 8, 2) == 0, "scan configurePlugin with dynamic batch");
    check(build->getWorkspaceSize(io.data(), 8, io.data() + 8, 2) == size_t(64) * 7 * 16 * 16 * 4,
        "scan workspace = B*L*K*K*4 at max batch");
    io[0].desc.dims = dims({-1, 7, 17});
    io[1].desc.dims = dims({-1, 7, 17});
    std::printf("(expected error follows)\n");
    check(build->configurePlugin(io.data(), 8, io.data() + 8, 2) != 0, "scan configurePlugin rejects K=17");
    auto* rt2 = rt;
    auto again = own(creator.createPlugin("scan", rt2->getFieldsToSerialize(), TensorRTPhase::kRUNTIME));
    check(again != nullptr, "scan recreated from its serialised fields");
}


void testGdn()
{
    GatedDeltaNetPluginCreator creator;
    check(std::strcmp(creator.getPluginName(), "DFlash2GatedDeltaNet") == 0, "gdn creator name");
    check(creator.getFieldNames()->nbFields == 9, "gdn creator announces 9 fields");
    std::vector<std::pair<char const*, int32_t>> req = {{"num_k_heads", 16}, {"num_v_heads", 48}, {"head_k_dim", 128},
        {"head_v_dim", 128}, {"conv_kernel", 4}, {"max_verify_tokens", 8}};
    Fields good(req);
    auto plugin = own(creator.createPlugin("gdn", &good.fc, TensorRTPhase::kBUILD));
    check(plugin != nullptr, "gdn createPlugin with required fields (mode forward, chunk 64)");
    auto missingReq = req;
    missingReq.pop_back();
    Fields missing(missingReq);
    check(own(creator.createPlugin("g", &missing.fc, TensorRTPhase::kBUILD)) == nullptr, "gdn rejects missing field");
    auto badDkReq = req;
    badDkReq[2].second = 96;
    Fields badDk(badDkReq);
    check(own(creator.createPlugin("g", &badDk.fc, TensorRTPhase::kBUILD)) == nullptr, "gdn rejects head_k_dim 96");
    if (!plugin)
        return;
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    check(build->getNbOutputs() == 3, "gdn forward has three outputs");
    int64_t const C = 2 * 16 * 128 + 48 * 128;
    DataType in[11] = {DataType::kBF16, DataType::kBF16, DataType::kBF16, DataType::kBF16, DataType::kFLOAT,
        DataType::kFLOAT, DataType::kINT32, DataType::kINT32, DataType::kINT32, DataType::kINT64, DataType::kINT64};
    DataType out[3];
    check(build->getOutputDataTypes(out, 3, in, 11) == 0 && out[0] == DataType::kBF16 && out[1] == DataType::kBF16
            && out[2] == DataType::kFLOAT,
        "gdn forward outputs y, verify_qkv in the activation dtype, verify_gates fp32");
    std::vector<DynamicPluginTensorDesc> io = {dyn(DataType::kBF16, {-1, C}, {8192, C}), dyn(DataType::kBF16, {C, 4}),
        dyn(DataType::kBF16, {-1, 48}), dyn(DataType::kBF16, {-1, 48}), dyn(DataType::kFLOAT, {48}),
        dyn(DataType::kFLOAT, {48}), dyn(DataType::kINT32, {-1}), dyn(DataType::kINT32, {-1}, {64}),
        dyn(DataType::kINT32, {-1}), dyn(DataType::kINT64, {1}), dyn(DataType::kINT64, {1}),
        dyn(DataType::kBF16, {-1, 48 * 128}), dyn(DataType::kBF16, {-1, 8, C}), dyn(DataType::kFLOAT, {-1, 8, 2, 48})};
    bool formats = true;
    for (int pos = 0; pos < 14; ++pos)
        formats = formats && build->supportsFormatCombination(pos, io.data(), 11, 3);
    check(formats, "gdn forward supports its declared dtypes");
    io[9].desc.type = DataType::kINT32;
    check(!build->supportsFormatCombination(9, io.data(), 11, 3), "gdn rejects an int32 state pointer");
    io[9].desc.type = DataType::kINT64;
    check(build->configurePlugin(io.data(), 11, io.data() + 11, 3) == 0, "gdn configurePlugin with dynamic T and B");
    GatedDeltaNetParams wp;
    wp.attrs = GatedDeltaNetAttrs{0, 16, 48, 128, 128, 4, 8, 64, 0};
    wp.tokens = 8192;
    wp.batch = 64;
    wp.convDim = C;
    wp.dataType = DType::kBFLOAT16;
    check(build->getWorkspaceSize(io.data(), 11, io.data() + 11, 3) == gatedDeltaNetWorkspaceSize(wp),
        "gdn workspace at max tokens = gatedDeltaNetWorkspaceSize");
    io[0].desc.dims = dims({-1, C + 8});
    std::printf("(expected error follows)\n");
    check(build->configurePlugin(io.data(), 11, io.data() + 11, 3) != 0, "gdn configurePlugin rejects a wrong C");
    io[0].desc.dims = dims({-1, C});
    auto again = own(creator.createPlugin("gdn", rt->getFieldsToSerialize(), TensorRTPhase::kRUNTIME));
    check(again != nullptr, "gdn recreated from its serialised fields");

    // zero_state_input = 1: a 12th input, int32 [B]; the outputs follow it
    auto zsReq = req;
    zsReq.push_back({"zero_state_input", 1});
    Fields zsFields(zsReq);
    auto zp = own(creator.createPlugin("gdnz", &zsFields.fc, TensorRTPhase::kBUILD));
    check(zp != nullptr, "gdn createPlugin with zero_state_input");
    if (zp)
    {
        auto* zb = static_cast<IPluginV3OneBuild*>(zp->getCapabilityInterface(PluginCapabilityType::kBUILD));
        std::vector<DynamicPluginTensorDesc> zio(io.begin(), io.begin() + 11);
        zio.push_back(dyn(DataType::kINT32, {-1}));
        zio.insert(zio.end(), io.begin() + 11, io.end());
        bool zf = true;
        for (int pos = 0; pos < 15; ++pos)
            zf = zf && zb->supportsFormatCombination(pos, zio.data(), 12, 3);
        check(zf, "gdn with zero_state supports its declared dtypes (outputs after input 11)");
        check(zb->configurePlugin(zio.data(), 12, zio.data() + 12, 3) == 0, "gdn with zero_state configurePlugin");
        std::printf("(expected error follows)\n");
        check(zb->configurePlugin(io.data(), 11, io.data() + 11, 3) != 0, "gdn with zero_state needs 12 inputs");
    }

    // runtime: concrete shapes; request kinds are read on the host in enqueue
    PluginTensorDesc rin[11];
    for (int i = 0; i < 11; ++i)
        rin[i] = io[i].desc;
    rin[0].dims = dims({10, C});
    rin[2].dims = dims({10, 48});
    rin[3].dims = dims({10, 48});
    rin[6].dims = dims({3});
    rin[7].dims = dims({2});
    rin[8].dims = dims({2});
    check(rt->onShapeChange(rin, 11, &io[11].desc, 3) == 0, "gdn onShapeChange with concrete shapes");
    static int32_t types[2] = {1, 0}; // a context request after a generation request
    static int64_t fakePool = 0x1000;
    static int64_t nullPool = 0;
    alignas(16) static uint16_t dummy[8];
    void const* ins[11] = {dummy, dummy, dummy, dummy, dummy, dummy, dummy, dummy, types, &fakePool, &fakePool};
    void* outs[3] = {dummy, dummy, dummy};
    std::printf("(expected error follows)\n");
    check(rt->enqueue(rin, &io[11].desc, ins, outs, nullptr, nullptr) != 0, "gdn enqueue rejects context after generation");
    types[0] = 0;
    types[1] = 1;
    ins[9] = &nullPool;
    std::printf("(expected error follows)\n");
    check(rt->enqueue(rin, &io[11].desc, ins, outs, nullptr, nullptr) == 0, "gdn enqueue with a null pool is a no-op");
    ins[9] = &fakePool;
    int deviceCount = 0;
    if (cudaGetDeviceCount(&deviceCount) != cudaSuccess || deviceCount == 0)
    {
        std::printf("(expected error follows)\n");
        check(rt->enqueue(rin, &io[11].desc, ins, outs, nullptr, nullptr) != 0, "gdn enqueue without a GPU fails cleanly");
    }

    // commit: one int32 output [B]
    auto commitReq = req;
    commitReq.push_back({"mode", 1});
    Fields commitFields(commitReq);
    auto cp = own(creator.createPlugin("gdnc", &commitFields.fc, TensorRTPhase::kBUILD));
    check(cp != nullptr, "gdn commit createPlugin");
    if (cp)
    {
        auto* b2 = static_cast<IPluginV3OneBuild*>(cp->getCapabilityInterface(PluginCapabilityType::kBUILD));
        check(b2->getNbOutputs() == 1, "gdn commit has one output");
        DataType cin[9] = {DataType::kHALF, DataType::kFLOAT, DataType::kHALF, DataType::kINT32, DataType::kINT32,
            DataType::kINT32, DataType::kINT32, DataType::kINT64, DataType::kINT64};
        check(b2->getOutputDataTypes(out, 1, cin, 9) == 0 && out[0] == DataType::kINT32, "gdn commit outputs int32");
        std::vector<DynamicPluginTensorDesc> cio = {dyn(DataType::kHALF, {-1, 8, C}, {64, 8, C}),
            dyn(DataType::kFLOAT, {-1, 8, 2, 48}), dyn(DataType::kHALF, {C, 4}), dyn(DataType::kINT32, {-1}),
            dyn(DataType::kINT32, {-1}), dyn(DataType::kINT32, {-1}), dyn(DataType::kINT32, {-1}),
            dyn(DataType::kINT64, {1}), dyn(DataType::kINT64, {1}), dyn(DataType::kINT32, {-1})};
        bool cf = true;
        for (int pos = 0; pos < 10; ++pos)
            cf = cf && b2->supportsFormatCombination(pos, cio.data(), 9, 1);
        check(cf, "gdn commit supports its declared dtypes");
        check(b2->configurePlugin(cio.data(), 9, cio.data() + 9, 1) == 0, "gdn commit configurePlugin");
        wp.attrs.mode = 1;
        wp.tokens = 64 * 8;
        wp.dataType = DType::kFLOAT16;
        check(b2->getWorkspaceSize(cio.data(), 9, cio.data() + 9, 1) == gatedDeltaNetWorkspaceSize(wp),
            "gdn commit workspace covers B x Kv verify rows");
    }
}

} // namespace

void testLibraryEntry()
{
    int32_t n = -1;
    IPluginCreatorInterface* const* creators = getCreators(n);
    check(n == 3 && creators != nullptr, "getCreators returns the three creators");
    if (n != 3 || creators == nullptr)
        return;
    char const* expected[] = {"DFlash2DynamicConv", "DFlash2PairwiseScan", "DFlash2GatedDeltaNet"};
    for (int32_t i = 0; i < 3; ++i)
    {
        auto* c = creators[i];
        check(c != nullptr && std::strcmp(c->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0,
            "getCreators entry is an IPluginCreatorV3One");
        auto* v3 = static_cast<IPluginCreatorV3One*>(c);
        check(std::strcmp(v3->getPluginName(), expected[i]) == 0 && std::strcmp(v3->getPluginVersion(), "1") == 0
                && std::strcmp(v3->getPluginNamespace(), "dflash2") == 0,
            "getCreators entry has the spec's name/version/namespace");
    }
    int32_t n2 = 0;
    check(getCreators(n2) == creators && n2 == 3, "getCreators is stable across calls");
}

int main()
{
    testConv();
    testScan();
    testGdn();
    testLibraryEntry();
    std::printf("%d failure(s)\n", gFailures);
    return gFailures;
}
