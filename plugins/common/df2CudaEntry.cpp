/*
 * The plugins' CUDA kernels behind a C ABI, for callers without TensorRT: the project's cuda engine
 * backend (dflash2_trt/trtllm/cuda/plugin_lib.py, ctypes) and scripts/gpu_check. Each df2_cuda_<p>_enqueue does
 * what the plugin's IPluginV3 enqueue does with the same inputs (<p>Plugin.cpp): the shape validation of
 * <p>Params.cpp on the descriptors, the host-side request checks where the plugin has host inputs, then the
 * same launcher on the caller's stream. Input and output pointers are what TensorRT hands enqueue: device
 * addresses, except the inputs the plugin's spec puts in host memory (the Gated DeltaNet's host_request_types
 * and its two int64 state-pool addresses). Nothing here allocates, copies or synchronises, so a call can be
 * captured in a CUDA graph. Built by nvcc with the kernels and the Params files into one shared library
 * (static cudart); never part of libdflash2_plugins.so.
 */
#include "../dynamicConvPlugin/dynamicConvKernel.h"
#include "../gatedDeltaNetPlugin/gatedDeltaNetKernel.h"
#include "../pairwiseScanPlugin/pairwiseScanKernel.h"
#include "df2Validation.h"

#include <cuda_runtime_api.h>

using namespace dflash2;

namespace
{

//! One descriptor array size for every plugin (the largest input count, the Gated DeltaNet's): one
//! instantiation of descsFromArrays, which rejects a larger nbInputs itself.
constexpr size_t kMaxDescs = kGdnMaxNbInputs;

cudaStream_t asStream(int64_t s)
{
    return reinterpret_cast<cudaStream_t>(static_cast<intptr_t>(s));
}

int32_t code(Status s)
{
    return static_cast<int32_t>(s);
}

//! The C ABI's message length as the validation functions take it (a negative one writes nothing).
size_t mlen(int32_t n)
{
    return n > 0 ? static_cast<size_t>(n) : 0;
}

//! Scan: descriptors + params, as PairwiseScanPlugin's configurePlugin validates them.
Status scanParams(int32_t mode, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims, int64_t const* dims,
    PairwiseScanParams* p, char* msg, size_t msgLen)
{
    constexpr ParamFail fail{kPairwiseScanName};
    TensorDesc descs[kMaxDescs];
    if (nbInputs != kScanNbInputs)
        return fail(msg, msgLen, "nbInputs=%d", nbInputs);
    if (descsFromArrays(fail, nbInputs, dtypes, nbDims, dims, descs, msg, msgLen) != Status::kOK)
        return Status::kINVALID;
    return validatePairwiseScan(PairwiseScanAttrs{mode}, descs, nbInputs, p, msg, msgLen);
}

//! GDN: descriptors + params (shapes, then the host request types), as GatedDeltaNetPlugin's
//! configurePlugin + enqueue validate them.
Status gdnParams(int32_t const* attrValues, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, void const* const* inputs, GatedDeltaNetParams* p, char* msg, size_t msgLen)
{
    constexpr ParamFail fail{kGatedDeltaNetName};
    GatedDeltaNetAttrs const a = attrsFromValues(kGatedDeltaNetFields, attrValues);
    TensorDesc descs[kMaxDescs];
    if (descsFromArrays(fail, nbInputs, dtypes, nbDims, dims, descs, msg, msgLen) != Status::kOK)
        return Status::kINVALID;
    Status s = validateGatedDeltaNet(a, descs, nbInputs, p, msg, msgLen);
    if (s != Status::kOK)
        return s;
    bool const commit = a.mode == static_cast<int32_t>(GdnMode::kCOMMIT);
    auto const* types = static_cast<int32_t const*>(inputs == nullptr ? nullptr : inputs[commit ? 6 : 8]);
    if (types == nullptr)
        return fail(msg, msgLen, "host_request_types is null");
    return validateGatedDeltaNetBatch(p, types, nullptr, nullptr, 0, nullptr, msg, msgLen);
}

} // namespace

extern "C"
{

int32_t df2_cuda_scan_enqueue_ranks(int32_t ranks, int32_t mode, int32_t nbInputs, int32_t const* dtypes,
    int32_t const* nbDims, int64_t const* dims, void const* const* inputs, void* workspace, int32_t* ids, float* q,
    int64_t stream, char* msg, int32_t msgLen);

//! The number of CUDA devices this library's runtime sees (0 when none or no driver); *err gets the
//! CUDA error code (0 = success).
int32_t df2_cuda_device_count(int32_t* err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (err != nullptr)
        *err = static_cast<int32_t>(e);
    return e == cudaSuccess ? n : 0;
}

//! DFlash2DynamicConv: attrs (block_size, kernel_size, group_size, fuse_residual); inputs x, delta, base
//! [, residual] as the plugin's; out as its output.
int32_t df2_cuda_conv_enqueue(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, void const* const* inputs, void* out, int64_t stream, char* msg, int32_t msgLen)
{
    constexpr ParamFail fail{kDynamicConvName};
    DynamicConvAttrs const a = attrsFromValues(kDynamicConvFields, attrs);
    TensorDesc descs[kMaxDescs];
    if (descsFromArrays(fail, nbInputs, dtypes, nbDims, dims, descs, msg, mlen(msgLen)) != Status::kOK)
        return code(Status::kINVALID);
    DynamicConvParams p;
    Status s = validateDynamicConv(a, descs, nbInputs, &p, msg, mlen(msgLen));
    if (s != Status::kOK)
        return code(s);
    float const* residual = a.fuseResidual ? static_cast<float const*>(inputs[3]) : nullptr;
    return code(launchDynamicConv(p, inputs[0], inputs[1], inputs[2], residual, out, asStream(stream), msg, mlen(msgLen)));
}

//! DFlash2PairwiseScan: the workspace bytes the plugin asks for (the lattice).
int32_t df2_cuda_scan_workspace(int32_t mode, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, int64_t* bytes, char* msg, int32_t msgLen)
{
    PairwiseScanParams p;
    Status s = scanParams(mode, nbInputs, dtypes, nbDims, dims, &p, msg, mlen(msgLen));
    if (s == Status::kOK)
        *bytes = static_cast<int64_t>(pairwiseScanWorkspaceSize(p));
    return code(s);
}

//! DFlash2PairwiseScan: inputs unary, cand, hidden, anchor, pred_codebook, succ_codebook, temperature,
//! uniforms; outputs ids [B, L] int32, q [B, L, K] fp32; workspace of df2_cuda_scan_workspace bytes.
int32_t df2_cuda_scan_enqueue(int32_t mode, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, void const* const* inputs, void* workspace, int32_t* ids, float* q, int64_t stream,
    char* msg, int32_t msgLen)
{
    return df2_cuda_scan_enqueue_ranks(0, mode, nbInputs, dtypes, nbDims, dims, inputs, workspace, ids, q, stream,
        msg, mlen(msgLen));
}

//! df2_cuda_scan_enqueue with the CTAs per request row forced (ranks 1, 2, 4, 8; 0 = the launcher's choice):
//! the GPU check's way to tell a cluster-path problem from a kernel one.
int32_t df2_cuda_scan_enqueue_ranks(int32_t ranks, int32_t mode, int32_t nbInputs, int32_t const* dtypes,
    int32_t const* nbDims, int64_t const* dims, void const* const* inputs, void* workspace, int32_t* ids, float* q,
    int64_t stream, char* msg, int32_t msgLen)
{
    PairwiseScanParams p;
    Status s = scanParams(mode, nbInputs, dtypes, nbDims, dims, &p, msg, mlen(msgLen));
    if (s != Status::kOK)
        return code(s);
    return code(launchPairwiseScanRanks(p, static_cast<float const*>(inputs[0]),
        static_cast<int32_t const*>(inputs[1]), inputs[2], static_cast<int32_t const*>(inputs[3]), inputs[4],
        inputs[5], static_cast<float const*>(inputs[6]), static_cast<float const*>(inputs[7]), workspace, ids, q,
        ranks, asStream(stream), msg, mlen(msgLen)));
}

//! The walk kernel alone over a given lattice [B, L, K, K] fp32 (checks of the walk on a reference lattice).
int32_t df2_cuda_scan_walk(int32_t mode, int64_t batch, int32_t length, int32_t topK, float const* lattice,
    int32_t const* cand, float const* temperature, float const* uniforms, int32_t* ids, float* q, int64_t stream,
    char* msg, int32_t msgLen)
{
    constexpr ParamFail fail{kPairwiseScanName};
    if (mode < 0 || mode > 2 || batch < 1 || length < 1 || topK < 1)
        return code(fail(msg, mlen(msgLen), "walk: mode=%d, B=%lld, L=%d, K=%d (mode 0-2, sizes >= 1)", mode,
            static_cast<long long>(batch), length, topK));
    PairwiseScanParams p;
    p.mode = static_cast<ScanMode>(mode);
    p.batch = batch;
    p.length = length;
    p.topK = topK;
    p.rank = 8;
    p.vocab = 1;
    return code(launchPairwiseWalk(p, lattice, cand, temperature, uniforms, ids, q, asStream(stream), msg, mlen(msgLen)));
}

//! DFlash2GatedDeltaNet: the workspace bytes (gatedDeltaNetWorkspaceSize) for these inputs; inputs as for
//! enqueue (host_request_types is read).
int32_t df2_cuda_gdn_workspace(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, void const* const* inputs, int64_t* bytes, char* msg, int32_t msgLen)
{
    GatedDeltaNetParams p;
    Status s = gdnParams(attrs, nbInputs, dtypes, nbDims, dims, inputs, &p, msg, mlen(msgLen));
    if (s == Status::kOK)
        *bytes = static_cast<int64_t>(gatedDeltaNetWorkspaceSize(p));
    return code(s);
}

//! DFlash2GatedDeltaNet forward (mode 0) or commit (mode 1): GatedDeltaNetPlugin::enqueue with the plugin's
//! inputs (host_request_types and the two int64 pool addresses in host memory), outputs and a workspace of
//! df2_cuda_gdn_workspace bytes, 256-byte aligned.
int32_t df2_cuda_gdn_enqueue(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, void const* const* inputs, void* const* outputs, void* workspace, int64_t stream, char* msg,
    int32_t msgLen)
{
    constexpr ParamFail fail{kGatedDeltaNetName};
    GatedDeltaNetParams p;
    Status s = gdnParams(attrs, nbInputs, dtypes, nbDims, dims, inputs, &p, msg, mlen(msgLen));
    if (s != Status::kOK)
        return code(s);
    bool const commit = p.attrs.mode == static_cast<int32_t>(GdnMode::kCOMMIT);
    int32_t const ptrAt = commit ? 7 : 9;
    int64_t const rnnPtr = *static_cast<int64_t const*>(inputs[ptrAt]);
    int64_t const convPtr = *static_cast<int64_t const*>(inputs[ptrAt + 1]);
    if (rnnPtr == 0 || (convPtr == 0 && p.attrs.convKernel > 1))
        return code(fail(msg, mlen(msgLen), "rnn_state_ptr or conv_state_ptr is null"));
    if ((reinterpret_cast<uintptr_t>(workspace) & 255u) != 0)
        return code(fail(msg, mlen(msgLen), "workspace is not 256-byte aligned"));
    GdnLaunchArgs g;
    g.rnnPool = reinterpret_cast<float*>(rnnPtr);
    g.convPool = reinterpret_cast<void*>(convPtr);
    g.workspace = workspace;
    if (commit)
    {
        g.verifyQkv = const_cast<void*>(inputs[0]);
        g.verifyGates = static_cast<float*>(const_cast<void*>(inputs[1]));
        g.convWeight = inputs[2];
        g.numAccepted = static_cast<int32_t const*>(inputs[3]);
        g.cuSeqlens = static_cast<int32_t const*>(inputs[4]);
        g.slots = static_cast<int32_t const*>(inputs[5]);
        g.committed = static_cast<int32_t*>(outputs[0]);
        return code(launchGatedDeltaNetCommit(p, g, asStream(stream), msg, mlen(msgLen)));
    }
    g.qkv = inputs[0];
    g.convWeight = inputs[1];
    g.a = inputs[2];
    g.b = inputs[3];
    g.dtBias = static_cast<float const*>(inputs[4]);
    g.aLog = static_cast<float const*>(inputs[5]);
    g.cuSeqlens = static_cast<int32_t const*>(inputs[6]);
    g.slots = static_cast<int32_t const*>(inputs[7]);
    g.zeroState = p.attrs.zeroStateInput ? static_cast<int32_t const*>(inputs[11]) : nullptr;
    g.y = outputs[0];
    g.verifyQkv = outputs[1];
    g.verifyGates = static_cast<float*>(outputs[2]);
    return code(launchGatedDeltaNetForward(p, g, asStream(stream), msg, mlen(msgLen)));
}

//! The last CUDA error of this library's runtime (cudaGetLastError: clears it), as text; 0 when none.
int32_t df2_cuda_last_error(char* msg, int32_t msgLen)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess && msg != nullptr && msgLen > 0)
        std::snprintf(msg, static_cast<size_t>(msgLen), "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    return static_cast<int32_t>(e);
}

} // extern "C"
