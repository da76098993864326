// Torch extension binding the plugin launchers directly (scripts/gpu_check.py builds it with
// torch.utils.cpp_extension.load together with the plugins' .cu/.cpp sources). The stream comes
// from Python as an integer (torch.cuda.current_stream().cuda_stream) so that this file needs
// only <torch/extension.h>, not the ATen CUDA headers.
#include <torch/extension.h>

#include "dynamicConvPlugin/dynamicConvKernel.h"
#include "gatedDeltaNetPlugin/gatedDeltaNetKernel.h"
#include "pairwiseScanPlugin/pairwiseScanKernel.h"

#include <string>
#include <vector>

namespace
{

dflash2::DType toDType(at::ScalarType t)
{
    switch (t)
    {
    case at::kFloat: return dflash2::DType::kFLOAT32;
    case at::kHalf: return dflash2::DType::kFLOAT16;
    case at::kBFloat16: return dflash2::DType::kBFLOAT16;
    case at::kInt: return dflash2::DType::kINT32;
    case at::kLong: return dflash2::DType::kINT64;
    default: return static_cast<dflash2::DType>(99);
    }
}

dflash2::TensorDesc desc(torch::Tensor const& t, bool onDevice = true)
{
    TORCH_CHECK((t.is_cuda() == onDevice) && t.is_contiguous(),
        onDevice ? "tensors must be contiguous CUDA tensors" : "host tensors must be contiguous CPU tensors");
    dflash2::TensorDesc d;
    d.type = toDType(t.scalar_type());
    d.nbDims = static_cast<int32_t>(t.dim());
    for (int64_t i = 0; i < t.dim() && i < 8; ++i)
        d.dims[i] = t.size(i);
    return d;
}

cudaStream_t asStream(int64_t s)
{
    return reinterpret_cast<cudaStream_t>(static_cast<intptr_t>(s));
}

torch::Tensor conv(torch::Tensor x, torch::Tensor delta, torch::Tensor base, c10::optional<torch::Tensor> residual,
    int64_t blockSize, int64_t groupSize, int64_t stream)
{
    dflash2::DynamicConvAttrs a;
    a.blockSize = static_cast<int32_t>(blockSize);
    a.kernelSize = static_cast<int32_t>(base.size(0));
    a.groupSize = static_cast<int32_t>(groupSize);
    a.fuseResidual = residual.has_value() ? 1 : 0;
    std::vector<dflash2::TensorDesc> descs = {desc(x), desc(delta), desc(base)};
    if (residual.has_value())
        descs.push_back(desc(*residual));
    char msg[512];
    dflash2::DynamicConvParams p;
    TORCH_CHECK(dflash2::validateDynamicConv(a, descs.data(), static_cast<int32_t>(descs.size()), &p, msg,
                    sizeof(msg)) == dflash2::Status::kOK,
        msg);
    auto out = torch::empty_like(x, x.options().dtype(residual.has_value() ? at::kFloat : x.scalar_type()));
    float const* res = residual.has_value() ? residual->data_ptr<float>() : nullptr;
    TORCH_CHECK(dflash2::launchDynamicConv(p, x.data_ptr(), delta.data_ptr(), base.data_ptr(), res, out.data_ptr(),
                    asStream(stream), msg, sizeof(msg)) == dflash2::Status::kOK,
        msg);
    return out;
}

dflash2::PairwiseScanParams scanParams(int64_t mode, std::vector<torch::Tensor> const& ins)
{
    std::vector<dflash2::TensorDesc> descs;
    for (auto const& t : ins)
        descs.push_back(desc(t));
    char msg[512];
    dflash2::PairwiseScanParams p;
    TORCH_CHECK(dflash2::validatePairwiseScan(dflash2::PairwiseScanAttrs{static_cast<int32_t>(mode)}, descs.data(),
                    static_cast<int32_t>(descs.size()), &p, msg, sizeof(msg)) == dflash2::Status::kOK,
        msg);
    return p;
}

//! Returns (path ids [B, L] int32, q [B, L, K], lattice [B, L, K, K]); the lattice is the
//! plugin's workspace, returned for checking.
std::vector<torch::Tensor> scan(int64_t mode, torch::Tensor unary, torch::Tensor cand, torch::Tensor hidden,
    torch::Tensor anchor, torch::Tensor predCb, torch::Tensor succCb, torch::Tensor temperature,
    torch::Tensor uniforms, int64_t stream)
{
    auto p = scanParams(mode, {unary, cand, hidden, anchor, predCb, succCb, temperature, uniforms});
    auto lattice = torch::empty({p.batch, p.length, p.topK, p.topK}, unary.options());
    auto ids = torch::empty({p.batch, p.length}, cand.options());
    auto q = torch::empty({p.batch, p.length, p.topK}, unary.options());
    char msg[512];
    TORCH_CHECK(dflash2::launchPairwiseScan(p, unary.data_ptr<float>(), cand.data_ptr<int32_t>(), hidden.data_ptr(),
                    anchor.data_ptr<int32_t>(), predCb.data_ptr(), succCb.data_ptr(), temperature.data_ptr<float>(),
                    uniforms.data_ptr<float>(), lattice.data_ptr(), ids.data_ptr<int32_t>(), q.data_ptr<float>(),
                    asStream(stream), msg, sizeof(msg)) == dflash2::Status::kOK,
        msg);
    return {ids, q, lattice};
}

//! Walk only, over a given lattice (to check the walk kernel on the reference's lattice).
std::vector<torch::Tensor> walk(int64_t mode, torch::Tensor lattice, torch::Tensor cand, torch::Tensor temperature,
    torch::Tensor uniforms, int64_t stream)
{
    TORCH_CHECK(lattice.is_cuda() && lattice.is_contiguous() && lattice.scalar_type() == at::kFloat && lattice.dim() == 4,
        "lattice must be a contiguous fp32 CUDA tensor [B, L, K, K]");
    dflash2::PairwiseScanParams p;
    p.mode = static_cast<dflash2::ScanMode>(mode);
    p.batch = lattice.size(0);
    p.length = static_cast<int32_t>(lattice.size(1));
    p.topK = static_cast<int32_t>(lattice.size(2));
    p.rank = 8;
    p.vocab = 1;
    auto ids = torch::empty({p.batch, p.length}, cand.options());
    auto q = torch::empty({p.batch, p.length, p.topK}, lattice.options());
    char msg[512];
    TORCH_CHECK(dflash2::launchPairwiseWalk(p, lattice.data_ptr<float>(), cand.data_ptr<int32_t>(),
                    temperature.data_ptr<float>(), uniforms.data_ptr<float>(), ids.data_ptr<int32_t>(),
                    q.data_ptr<float>(), asStream(stream), msg, sizeof(msg)) == dflash2::Status::kOK,
        msg);
    return {ids, q};
}

// ---- DFlash2GatedDeltaNet: what GatedDeltaNetPlugin::enqueue does, with torch tensors --------------------------
dflash2::GatedDeltaNetAttrs gdnAttrs(std::vector<int64_t> const& v)
{
    TORCH_CHECK(v.size() == static_cast<size_t>(dflash2::kGdnNbAttrs), "gdn attrs: expected 9 values");
    dflash2::GatedDeltaNetAttrs a;
    a.mode = static_cast<int32_t>(v[0]);
    a.numKHeads = static_cast<int32_t>(v[1]);
    a.numVHeads = static_cast<int32_t>(v[2]);
    a.headKDim = static_cast<int32_t>(v[3]);
    a.headVDim = static_cast<int32_t>(v[4]);
    a.convKernel = static_cast<int32_t>(v[5]);
    a.maxVerifyTokens = static_cast<int32_t>(v[6]);
    a.chunkSize = static_cast<int32_t>(v[7]);
    a.zeroStateInput = static_cast<int32_t>(v[8]);
    return a;
}

dflash2::TensorDesc hostPtrDesc()
{
    dflash2::TensorDesc d;
    d.type = dflash2::DType::kINT64;
    d.nbDims = 1;
    d.dims[0] = 1;
    return d;
}

//! Validates shapes (the pools' addresses are host int64 [1] inputs, as TensorRT-LLM passes them) and the host
//! request types, as the plugin does at enqueue; returns the params and a workspace of the plugin's size.
dflash2::GatedDeltaNetParams gdnParams(dflash2::GatedDeltaNetAttrs const& a, std::vector<dflash2::TensorDesc> descs,
    torch::Tensor const& hostTypes, torch::Tensor const& like, torch::Tensor* workspace)
{
    TORCH_CHECK(hostTypes.scalar_type() == at::kInt, "host_request_types must be int32");
    char msg[512];
    dflash2::GatedDeltaNetParams p;
    TORCH_CHECK(dflash2::validateGatedDeltaNet(a, descs.data(), static_cast<int32_t>(descs.size()), &p, msg,
                    sizeof(msg)) == dflash2::Status::kOK,
        msg);
    TORCH_CHECK(dflash2::validateGatedDeltaNetBatch(&p, hostTypes.data_ptr<int32_t>(), nullptr, nullptr, 0, nullptr,
                    msg, sizeof(msg)) == dflash2::Status::kOK,
        msg);
    *workspace = torch::empty({static_cast<int64_t>(dflash2::gatedDeltaNetWorkspaceSize(p)) + 256},
        like.options().dtype(at::kByte));
    return p;
}

void* aligned256(torch::Tensor& ws)
{
    auto const addr = reinterpret_cast<uintptr_t>(ws.data_ptr());
    return reinterpret_cast<void*>((addr + 255) & ~static_cast<uintptr_t>(255));
}

//! Forward over a packed mixed batch: returns (y [T, Hv Dv], verify_qkv [B, Kv, C], verify_gates [B, Kv, 2, Hv]);
//! rnnPool [slots, Hv, Dk, Dv] fp32 and convPool [slots, K-1, C] (CUDA) are updated in place.
std::vector<torch::Tensor> gdnForward(std::vector<int64_t> attrs, torch::Tensor qkv, torch::Tensor convWeight,
    torch::Tensor a, torch::Tensor b, torch::Tensor dtBias, torch::Tensor aLog, torch::Tensor cuSeqlens,
    torch::Tensor slots, torch::Tensor hostTypes, torch::Tensor rnnPool, torch::Tensor convPool,
    c10::optional<torch::Tensor> zeroState, int64_t stream)
{
    auto at = gdnAttrs(attrs);
    at.mode = 0;
    at.zeroStateInput = zeroState.has_value() ? 1 : 0;
    std::vector<dflash2::TensorDesc> descs = {desc(qkv), desc(convWeight), desc(a), desc(b), desc(dtBias), desc(aLog),
        desc(cuSeqlens), desc(slots), desc(hostTypes, false), hostPtrDesc(), hostPtrDesc()};
    if (zeroState.has_value())
        descs.push_back(desc(*zeroState));
    TORCH_CHECK(rnnPool.is_cuda() && rnnPool.is_contiguous() && rnnPool.scalar_type() == at::kFloat,
        "rnn pool must be a contiguous fp32 CUDA tensor");
    TORCH_CHECK(convPool.is_cuda() && convPool.is_contiguous() && convPool.scalar_type() == qkv.scalar_type(),
        "conv pool must be a contiguous CUDA tensor of the activation dtype");
    torch::Tensor ws;
    auto p = gdnParams(at, descs, hostTypes, qkv, &ws);
    auto y = torch::empty({p.tokens, static_cast<int64_t>(at.numVHeads) * at.headVDim}, qkv.options());
    auto vq = torch::zeros({p.batch, at.maxVerifyTokens, p.convDim}, qkv.options());
    auto vg = torch::zeros({p.batch, at.maxVerifyTokens, 2, at.numVHeads}, qkv.options().dtype(at::kFloat));
    dflash2::GdnLaunchArgs g;
    g.qkv = qkv.data_ptr();
    g.convWeight = convWeight.data_ptr();
    g.a = a.data_ptr();
    g.b = b.data_ptr();
    g.dtBias = dtBias.data_ptr<float>();
    g.aLog = aLog.data_ptr<float>();
    g.cuSeqlens = cuSeqlens.data_ptr<int32_t>();
    g.slots = slots.data_ptr<int32_t>();
    g.zeroState = zeroState.has_value() ? zeroState->data_ptr<int32_t>() : nullptr;
    g.rnnPool = rnnPool.data_ptr<float>();
    g.convPool = convPool.data_ptr();
    g.y = y.data_ptr();
    g.verifyQkv = vq.data_ptr();
    g.verifyGates = vg.data_ptr<float>();
    g.workspace = aligned256(ws);
    char msg[512];
    TORCH_CHECK(dflash2::launchGatedDeltaNetForward(p, g, asStream(stream), msg, sizeof(msg)) == dflash2::Status::kOK,
        msg);
    return {y, vq, vg};
}

//! Commit: advances each generation request's slot over its first num_accepted verify rows; returns committed [B].
torch::Tensor gdnCommit(std::vector<int64_t> attrs, torch::Tensor verifyQkv, torch::Tensor verifyGates,
    torch::Tensor convWeight, torch::Tensor numAccepted, torch::Tensor cuSeqlens, torch::Tensor slots,
    torch::Tensor hostTypes, torch::Tensor rnnPool, torch::Tensor convPool, int64_t stream)
{
    auto at = gdnAttrs(attrs);
    at.mode = 1;
    std::vector<dflash2::TensorDesc> descs = {desc(verifyQkv), desc(verifyGates), desc(convWeight), desc(numAccepted),
        desc(cuSeqlens), desc(slots), desc(hostTypes, false), hostPtrDesc(), hostPtrDesc()};
    torch::Tensor ws;
    auto p = gdnParams(at, descs, hostTypes, verifyQkv, &ws);
    auto committed = torch::zeros({p.batch}, slots.options());
    dflash2::GdnLaunchArgs g;
    g.verifyQkv = verifyQkv.data_ptr();
    g.verifyGates = verifyGates.data_ptr<float>();
    g.convWeight = convWeight.data_ptr();
    g.numAccepted = numAccepted.data_ptr<int32_t>();
    g.cuSeqlens = cuSeqlens.data_ptr<int32_t>();
    g.slots = slots.data_ptr<int32_t>();
    g.rnnPool = rnnPool.data_ptr<float>();
    g.convPool = convPool.data_ptr();
    g.committed = committed.data_ptr<int32_t>();
    g.workspace = aligned256(ws);
    char msg[512];
    TORCH_CHECK(dflash2::launchGatedDeltaNetCommit(p, g, asStream(stream), msg, sizeof(msg)) == dflash2::Status::kOK,
        msg);
    return committed;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("gdn_forward", &gdnForward, "DFlash2GatedDeltaNet forward (mode 0)");
    m.def("gdn_commit", &gdnCommit, "DFlash2GatedDeltaNet commit (mode 1)");
    m.def("conv", &conv, "DFlash2DynamicConv launcher");
    m.def("scan", &scan, "DFlash2PairwiseScan launcher (lattice + walk)");
    m.def("walk", &walk, "DFlash2PairwiseScan walk kernel only");
}
