#include "pairwiseScanParams.h"
#include "../common/df2Validation.h"

namespace dflash2
{
namespace
{

constexpr ParamFail fail{kPairwiseScanName};

char const* const kNames[kScanNbInputs] = {"unary", "cand_ids", "proj_hidden", "anchor", "pred_codebook",
    "succ_codebook", "temperature", "uniforms"};

} // namespace

Status validatePairwiseScanAttrs(PairwiseScanAttrs const& a, char* msg, size_t msgLen)
{
    clearMessage(msg, msgLen);
    if (a.mode < 0 || a.mode > 2)
        return fail(msg, msgLen, "mode=%d; expected 0 (greedy), 1 (sample) or 2 (viterbi)", a.mode);
    return Status::kOK;
}

Status validatePairwiseScan(PairwiseScanAttrs const& a, TensorDesc const* in, int32_t nbInputs,
    PairwiseScanParams* params, char* msg, size_t msgLen)
{
    Status const attrStatus = validatePairwiseScanAttrs(a, msg, msgLen);
    if (attrStatus != Status::kOK)
        return attrStatus;
    if (nbInputs != kScanNbInputs)
        return fail(msg, msgLen, "expected %d inputs, got %d", kScanNbInputs, nbInputs);

    // dtypes
    DType const dataType = in[2].type;
    if (!isFloatType(dataType))
        return fail(msg, msgLen, "input 2 (proj_hidden) has dtype %s; supported: float32, float16, bfloat16",
            dtypeName(dataType));
    DType const want[kScanNbInputs] = {DType::kFLOAT32, DType::kINT32, dataType, DType::kINT32, dataType, dataType,
        DType::kFLOAT32, DType::kFLOAT32};
    int32_t const wantDims[kScanNbInputs] = {3, 3, 3, 1, 2, 2, 1, 2};
    Status const typeStatus = checkTypesAndRanks(fail, in, kScanNbInputs, kNames, want, wantDims, msg, msgLen);
    if (typeStatus != Status::kOK)
        return typeStatus;

    int64_t const B = in[0].dims[0];
    int64_t const L = in[0].dims[1];
    int64_t const K = in[0].dims[2];
    int64_t const R = in[2].dims[2];
    int64_t const V = in[4].dims[0];
    if (known(K) && (K < 1 || K > kScanMaxTopK))
        return fail(msg, msgLen, "K=%lld candidates per position outside [1, %d]", static_cast<long long>(K),
            kScanMaxTopK);
    if (known(L) && (L < 1 || L > kScanMaxLength))
        return fail(msg, msgLen, "L=%lld draft positions outside [1, %d]", static_cast<long long>(L), kScanMaxLength);
    if (known(R) && (R < kScanRankMultiple || R > kScanMaxRank || R % kScanRankMultiple != 0))
        return fail(msg, msgLen, "rank R=%lld not supported: must be a multiple of %d in [%d, %d]",
            static_cast<long long>(R), kScanRankMultiple, kScanRankMultiple, kScanMaxRank);
    if (known(V) && V < 1)
        return fail(msg, msgLen, "codebook has V=%lld rows", static_cast<long long>(V));

    // shapes: every dim that names B, L, K, R or V must agree with the first tensor naming it.
    DimRule const rules[] = {{1, 0, B, "B"}, {1, 1, L, "L"}, {1, 2, K, "K"}, {2, 0, B, "B"}, {2, 1, L, "L"},
        {3, 0, B, "B"}, {4, 1, R, "R"}, {5, 0, V, "V"}, {5, 1, R, "R"}, {6, 0, B, "B"}, {7, 0, B, "B"},
        {7, 1, L, "L"}};
    Status const dimStatus = checkDims(fail, in, kNames, rules, msg, msgLen);
    if (dimStatus != Status::kOK)
        return dimStatus;
    if (params != nullptr)
    {
        params->mode = static_cast<ScanMode>(a.mode);
        params->batch = B;
        params->length = static_cast<int32_t>(L);
        params->topK = static_cast<int32_t>(K);
        params->rank = static_cast<int32_t>(R);
        params->vocab = V;
        params->dataType = dataType;
    }
    return Status::kOK;
}

} // namespace dflash2
