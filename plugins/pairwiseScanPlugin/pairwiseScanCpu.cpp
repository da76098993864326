/*
 * DFlash2PairwiseScan: CPU build of the shared math (pairwiseScanMath.h) and the validation
 * function, with a C ABI for ctypes. Built by dflash2_trt/trtllm/cpu/plugin_libs.py (g++
 * -ffp-contract=off) for the CPU engine backend and the tests; never part of
 * the plugin library. Loops are ordered exactly as the CUDA kernels' reductions.
 */
#include "pairwiseScanMath.h"
#include "pairwiseScanParams.h"
#include "../common/df2Validation.h"

#include <vector>

using namespace dflash2;

namespace
{

constexpr ParamFail fail{kPairwiseScanName};

template <class T>
void latticeTyped(PairwiseScanParams const& p, float const* unary, int32_t const* cand, void const* hidden,
    int32_t const* anchor, void const* predCb, void const* succCb, float* lattice)
{
    using S = typename T::Storage;
    auto const* H = static_cast<S const*>(hidden);
    auto const* A = static_cast<S const*>(predCb);
    auto const* Bc = static_cast<S const*>(succCb);
    int32_t const L = p.length, K = p.topK, R = p.rank;
    std::vector<float> ctx(R);
    for (int64_t b = 0; b < p.batch; ++b)
    {
        for (int32_t l = 0; l < L; ++l)
        {
            int64_t const bl = b * L + l;
            for (int32_t row = 0; row < K; ++row)
            {
                int32_t const pred = (l == 0) ? anchor[b] : cand[(bl - 1) * K + row];
                bool const predOk = tokenInRange(pred, p.vocab);
                for (int32_t r = 0; r < R; ++r)
                {
                    float const a = predOk ? T::load(A[static_cast<int64_t>(pred) * R + r]) : 0.0f;
                    ctx[r] = latticeContext(a, T::load(H[bl * R + r]));
                }
                for (int32_t c = 0; c < K; ++c)
                {
                    int32_t const succ = cand[bl * K + c];
                    bool const succOk = tokenInRange(succ, p.vocab);
                    float acc = 0.0f;
                    for (int32_t r = 0; r < R; ++r)
                    {
                        float const bv = succOk ? T::load(Bc[static_cast<int64_t>(succ) * R + r]) : 0.0f;
                        acc = latticeAccumulate(acc, ctx[r], bv);
                    }
                    lattice[(bl * K + row) * K + c] = latticeScore(unary[bl * K + c], acc);
                }
            }
        }
    }
}

//! One batch row's walk over lat [L][K][K]. Writes idx [L], q [L][K].
void walkRow(ScanMode mode, int32_t L, int32_t K, float const* lat, float temperature, float const* u,
    int32_t* idx, float* q)
{
    for (int32_t i = 0; i < L * K; ++i)
        q[i] = 0.0f;
    if (mode == ScanMode::kVITERBI)
    {
        std::vector<float> best(K), next(K);
        std::vector<int32_t> bp(static_cast<size_t>(L) * K, 0);
        for (int32_t c = 0; c < K; ++c)
            best[c] = lat[c]; // l = 0, row 0 (the anchor's row)
        for (int32_t l = 1; l < L; ++l)
        {
            for (int32_t c = 0; c < K; ++c)
                next[c] = viterbiRelax<kScanMaxTopK>(
                    best.data(), lat + static_cast<int64_t>(l) * K * K, K, c, &bp[l * K + c]);
            best.swap(next);
        }
        int32_t arg = greedyRowChoice<kScanMaxTopK>(best.data(), K);
        for (int32_t l = L - 1; l >= 0; --l)
        {
            idx[l] = arg;
            q[l * K + arg] = 1.0f;
            arg = bp[l * K + arg];
        }
        return;
    }
    int32_t prev = 0;
    for (int32_t l = 0; l < L; ++l)
    {
        float const* row = lat + (static_cast<int64_t>(l) * K + prev) * K;
        int32_t choice = 0;
        if (mode == ScanMode::kSAMPLE && temperatureUsable(temperature))
        {
            choice = sampleRowChoice<kScanMaxTopK>(row, K, temperature, u[l], q + l * K);
        }
        else
        {
            choice = greedyRowChoice<kScanMaxTopK>(row, K);
            q[l * K + choice] = 1.0f;
        }
        idx[l] = choice;
        prev = choice;
    }
}

} // namespace

extern "C"
{

int32_t df2_scan_validate(int32_t mode, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, char* msg, int32_t msgLen)
{
    TensorDesc descs[8];
    if (descsFromArrays(fail, nbInputs, dtypes, nbDims, dims, descs, msg, msgLen) != Status::kOK)
        return static_cast<int32_t>(Status::kINVALID);
    return static_cast<int32_t>(validatePairwiseScan(PairwiseScanAttrs{mode}, descs, nbInputs, nullptr, msg, msgLen));
}

//! Full plugin computation on the CPU. lattice: [B, L, K, K] fp32 scratch that is also returned
//! for inspection; idx: [B, L] candidate indices; ids: [B, L] token ids; q: [B, L, K].
int32_t df2_scan_run(int32_t mode, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, float const* unary, int32_t const* cand, void const* hidden, int32_t const* anchor,
    void const* predCb, void const* succCb, float const* temperature, float const* uniforms, float* lattice,
    int32_t* idx, int32_t* ids, float* q, char* msg, int32_t msgLen)
{
    if (nbInputs != kScanNbInputs) // the outputs are sized for exactly these inputs
        return static_cast<int32_t>(fail(msg, msgLen, "nbInputs=%d", nbInputs));
    TensorDesc descs[kScanNbInputs];
    if (descsFromArrays(fail, nbInputs, dtypes, nbDims, dims, descs, msg, msgLen) != Status::kOK)
        return static_cast<int32_t>(Status::kINVALID);
    PairwiseScanParams p;
    Status s = validatePairwiseScan(PairwiseScanAttrs{mode}, descs, nbInputs, &p, msg, msgLen);
    if (s != Status::kOK)
        return static_cast<int32_t>(s);
    switch (p.dataType)
    {
    case DType::kFLOAT16: latticeTyped<F16>(p, unary, cand, hidden, anchor, predCb, succCb, lattice); break;
    case DType::kBFLOAT16: latticeTyped<BF16>(p, unary, cand, hidden, anchor, predCb, succCb, lattice); break;
    default: latticeTyped<F32>(p, unary, cand, hidden, anchor, predCb, succCb, lattice); break;
    }
    int32_t const L = p.length, K = p.topK;
    for (int64_t b = 0; b < p.batch; ++b)
    {
        walkRow(p.mode, L, K, lattice + b * L * K * K, temperature[b], uniforms + b * L, idx + b * L, q + b * L * K);
        for (int32_t l = 0; l < L; ++l)
            ids[b * L + l] = cand[(b * L + l) * K + idx[b * L + l]];
    }
    return 0;
}

//! Walk only, over a caller-supplied lattice [B, L, K, K] (to compare the walks against the
//! reference walks on the SAME lattice, independent of how the lattice sums were ordered).
int32_t df2_scan_walk(int32_t mode, int64_t B, int32_t L, int32_t K, float const* lattice, float const* temperature,
    float const* uniforms, int32_t* idx, float* q)
{
    if (mode < 0 || mode > 2 || K < 1 || K > kScanMaxTopK || L < 1 || L > kScanMaxLength)
        return static_cast<int32_t>(Status::kINVALID);
    for (int64_t b = 0; b < B; ++b)
        walkRow(static_cast<ScanMode>(mode), L, K, lattice + b * L * K * K, temperature[b], uniforms + b * L,
            idx + b * L, q + b * L * K);
    return 0;
}

} // extern "C"
