// DFlash2GatedDeltaNet's CUDA launchers (gatedDeltaNetKernel.cu, transformed by the test) on emulated
// threads (cuda_emu.h), behind the CPU build's C ABI (df2_gdn_*, as gatedDeltaNetCpu.cpp), so that
// GdnLib and scripts/gpu_check's gdn_compare drive them as they drive the GPU extension. As the
// plugin's enqueue: shapes validated, only host_request_types checked on the host (the kernels clamp
// num_accepted and pending counts and take cu_seqlens and slots as given), a workspace of gatedDeltaNetWorkspaceSize bytes holding garbage, the launch sequence
// launchGatedDeltaNetForward / launchGatedDeltaNetCommit.
#include "kernel_emu.cu" // gatedDeltaNetKernel.cu after the test's transform
#include "gatedDeltaNetMath.h"
#include "gatedDeltaNetParams.h"
#include "../common/df2Validation.h"

#ifndef GDN_EMU_WS_SHIFT
#define GDN_EMU_WS_SHIFT 0 // bytes past the 256-byte boundary (a test's misaligned workspace)
#endif

using namespace dflash2;

namespace
{
constexpr ParamFail fail{kGatedDeltaNetName};

int32_t run(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims, int64_t const* dims,
    void const* const* in, void* const* out, int32_t wantMode, char* msg, int32_t msgLen)
{
    GatedDeltaNetAttrs const a = attrsFromValues(kGatedDeltaNetFields, attrs);
    TensorDesc descs[16];
    if (descsFromArrays(fail, nbInputs, dtypes, nbDims, dims, descs, msg, msgLen) != Status::kOK)
        return 1;
    if (a.mode != wantMode)
        return static_cast<int32_t>(fail(msg, msgLen, "mode mismatch"));
    GatedDeltaNetParams p;
    Status s = validateGatedDeltaNet(a, descs, nbInputs, &p, msg, msgLen);
    if (s != Status::kOK)
        return static_cast<int32_t>(s);
    bool const commit = a.mode == 1;
    // as the plugin / ext.cpp on the GPU: only the host request types are checked on the host
    s = validateGatedDeltaNetBatch(&p, static_cast<int32_t const*>(in[commit ? 6 : 8]), nullptr, nullptr, 0, nullptr,
        msg, msgLen);
    if (s != Status::kOK)
        return static_cast<int32_t>(s);
    size_t const wsBytes = gatedDeltaNetWorkspaceSize(p) + 256 + GDN_EMU_WS_SHIFT;
    std::unique_ptr<unsigned char[]> ws(new unsigned char[wsBytes]);
    std::memset(ws.get(), 0xFF, wsBytes); // garbage, as a reused TensorRT workspace: NaN floats, -1 ints
    void* wsAligned = reinterpret_cast<void*>(
        ((reinterpret_cast<uintptr_t>(ws.get()) + 255) & ~uintptr_t(255)) + GDN_EMU_WS_SHIFT);
    GdnLaunchArgs g;
    if (!commit)
    {
        g.qkv = in[0];
        g.convWeight = in[1];
        g.a = in[2];
        g.b = in[3];
        g.dtBias = static_cast<float const*>(in[4]);
        g.aLog = static_cast<float const*>(in[5]);
        g.cuSeqlens = static_cast<int32_t const*>(in[6]);
        g.slots = static_cast<int32_t const*>(in[7]);
        g.rnnPool = reinterpret_cast<float*>(*static_cast<int64_t const*>(in[9]));
        g.convPool = reinterpret_cast<void*>(*static_cast<int64_t const*>(in[10]));
        g.zeroState = a.zeroStateInput ? static_cast<int32_t const*>(in[11]) : nullptr;
        g.y = out[0];
        g.verifyQkv = out[1];
        g.verifyGates = static_cast<float*>(out[2]);
        g.workspace = wsAligned;
        return static_cast<int32_t>(launchGatedDeltaNetForward(p, g, nullptr, msg, msgLen));
    }
    g.verifyQkv = const_cast<void*>(in[0]);
    g.verifyGates = static_cast<float*>(const_cast<void*>(in[1]));
    g.convWeight = in[2];
    g.numAccepted = static_cast<int32_t const*>(in[3]);
    g.cuSeqlens = static_cast<int32_t const*>(in[4]);
    g.slots = static_cast<int32_t const*>(in[5]);
    g.rnnPool = reinterpret_cast<float*>(*static_cast<int64_t const*>(in[7]));
    g.convPool = reinterpret_cast<void*>(*static_cast<int64_t const*>(in[8]));
    g.committed = static_cast<int32_t*>(out[0]);
    g.workspace = wsAligned;
    return static_cast<int32_t>(launchGatedDeltaNetCommit(p, g, nullptr, msg, msgLen));
}
} // namespace

extern "C"
{
int32_t df2_gdn_validate(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, char* msg, int32_t msgLen)
{
    TensorDesc descs[16];
    if (descsFromArrays(fail, nbInputs, dtypes, nbDims, dims, descs, msg, msgLen) != Status::kOK)
        return 1;
    return static_cast<int32_t>(
        validateGatedDeltaNet(attrsFromValues(kGatedDeltaNetFields, attrs), descs, nbInputs, nullptr, msg, msgLen));
}
int32_t df2_gdn_forward(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, void const* const* inputs, void* const* outputs, int64_t, char* msg, int32_t msgLen)
{
    return run(attrs, nbInputs, dtypes, nbDims, dims, inputs, outputs, 0, msg, msgLen);
}
int32_t df2_gdn_commit(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, void const* const* inputs, void* const* outputs, int64_t, char* msg, int32_t msgLen)
{
    return run(attrs, nbInputs, dtypes, nbDims, dims, inputs, outputs, 1, msg, msgLen);
}
float df2_gdn_softplus(float x) { return gdnSoftplus(x); }
float df2_gdn_sigmoid(float x) { return gdnSigmoid(x); }
float df2_gdn_silu(float x) { return gdnSilu(x); }
float df2_gdn_log(float x) { return gdnLogRn(x); }
long long df2_emu_blocks() { return emu::gBlocks; }
long long df2_emu_threads() { return emu::gThreads; }
}
