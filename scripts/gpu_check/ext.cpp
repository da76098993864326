// Torch extension binding the plugin launchers directly (scripts/gpu_check.py builds it with
// torch.utils.cpp_extension.load together with the plugins' .cu/.cpp sources). The stream comes
// from Python as an integer (torch.cuda.current_stream().cuda_stream) so that this file needs
// only <torch/extension.h>, not the ATen CUDA headers.
#include <torch/extension.h>

#include "dynamicConvPlugin/dynamicConvKernel.h"
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
    default: return static_cast<dflash2::DType>(99);
    }
}

dflash2::TensorDesc desc(torch::Tensor const& t)
{
    TORCH_CHECK(t.is_cuda() && t.is_contiguous(), "tensors must be contiguous CUDA tensors");
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

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("conv", &conv, "DFlash2DynamicConv launcher");
    m.def("scan", &scan, "DFlash2PairwiseScan launcher (lattice + walk)");
    m.def("walk", &walk, "DFlash2PairwiseScan walk kernel only");
}
