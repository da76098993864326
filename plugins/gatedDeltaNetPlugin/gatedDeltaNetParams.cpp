#include "gatedDeltaNetParams.h"
#include "../common/df2Validation.h"

#include <vector>

namespace dflash2
{
namespace
{

constexpr ParamFail fail{kGatedDeltaNetName};

char const* const kFwdNames[kGdnMaxNbInputs] = {"qkv", "conv_weight", "a", "b", "dt_bias", "A_log", "cu_seqlens",
    "slot_mapping", "host_request_types", "rnn_state_ptr", "conv_state_ptr", "zero_state"};
char const* const kCommitNames[kGdnCommitNbInputs] = {"verify_qkv", "verify_gates", "conv_weight", "num_accepted",
    "cu_seqlens", "slot_mapping", "host_request_types", "rnn_state_ptr", "conv_state_ptr"};

size_t align256(size_t v)
{
    return (v + 255u) & ~static_cast<size_t>(255u);
}

} // namespace

char const* gatedDeltaNetInputName(GatedDeltaNetAttrs const& a, int32_t index)
{
    if (a.mode == static_cast<int32_t>(GdnMode::kCOMMIT))
        return (index >= 0 && index < kGdnCommitNbInputs) ? kCommitNames[index] : "?";
    return (index >= 0 && index < gatedDeltaNetNbInputs(a)) ? kFwdNames[index] : "?";
}

Status validateGatedDeltaNetAttrs(GatedDeltaNetAttrs const& a, char* msg, size_t msgLen)
{
    clearMessage(msg, msgLen);
    if (a.mode != 0 && a.mode != 1)
        return fail(msg, msgLen, "mode=%d; expected 0 (forward) or 1 (commit)", a.mode);
    if (a.numKHeads < 1 || a.numKHeads > kGdnMaxHeads)
        return fail(msg, msgLen, "num_k_heads=%d outside [1, %d]", a.numKHeads, kGdnMaxHeads);
    if (a.numVHeads < 1 || a.numVHeads > kGdnMaxHeads)
        return fail(msg, msgLen, "num_v_heads=%d outside [1, %d]", a.numVHeads, kGdnMaxHeads);
    if (a.numVHeads % a.numKHeads != 0)
        return fail(msg, msgLen,
            "num_v_heads=%d is not a multiple of num_k_heads=%d (each key head serves a group of value heads)",
            a.numVHeads, a.numKHeads);
    if (a.headKDim != 16 && a.headKDim != 32 && a.headKDim != 64 && a.headKDim != 128)
        return fail(msg, msgLen,
            "head_k_dim=%d not supported; expected 16, 32, 64 or 128 (a state column lives in registers)", a.headKDim);
    if (a.headVDim < 1 || a.headVDim > kGdnMaxHeadVDim)
        return fail(msg, msgLen, "head_v_dim=%d outside [1, %d]", a.headVDim, kGdnMaxHeadVDim);
    if (a.convKernel < 1 || a.convKernel > kGdnMaxConvKernel)
        return fail(msg, msgLen, "conv_kernel=%d outside [1, %d]", a.convKernel, kGdnMaxConvKernel);
    if (a.maxVerifyTokens < 1 || a.maxVerifyTokens > kGdnMaxVerifyTokens)
        return fail(msg, msgLen, "max_verify_tokens=%d outside [1, %d]", a.maxVerifyTokens, kGdnMaxVerifyTokens);
    if (a.chunkSize < 0 || a.chunkSize > kGdnMaxChunkSize)
        return fail(msg, msgLen, "chunk_size=%d outside [0, %d] (0 = per-token path)", a.chunkSize, kGdnMaxChunkSize);
    if (a.zeroStateInput != 0 && a.zeroStateInput != 1)
        return fail(msg, msgLen, "zero_state_input=%d must be 0 or 1", a.zeroStateInput);
    return Status::kOK;
}

Status validateGatedDeltaNet(GatedDeltaNetAttrs const& a, TensorDesc const* in, int32_t nbInputs,
    GatedDeltaNetParams* params, char* msg, size_t msgLen)
{
    Status const attrStatus = validateGatedDeltaNetAttrs(a, msg, msgLen);
    if (attrStatus != Status::kOK)
        return attrStatus;
    bool const commit = a.mode == static_cast<int32_t>(GdnMode::kCOMMIT);
    int32_t const want = gatedDeltaNetNbInputs(a);
    if (nbInputs != want)
    {
        if (commit)
            return fail(msg, msgLen, "expected %d inputs in commit mode, got %d", want, nbInputs);
        return fail(msg, msgLen, "expected %d inputs in forward mode with zero_state_input=%d, got %d", want,
            a.zeroStateInput, nbInputs);
    }
    char const* const* names = commit ? kCommitNames : kFwdNames;

    DType const dataType = in[0].type;
    if (!isFloatType(dataType))
        return fail(msg, msgLen, "input 0 (%s) has dtype %s; supported: float32, float16, bfloat16", names[0],
            dtypeName(dataType));
    // dtype and rank of every input
    DType const fwdTypes[kGdnMaxNbInputs] = {dataType, dataType, dataType, dataType, DType::kFLOAT32, DType::kFLOAT32,
        DType::kINT32, DType::kINT32, DType::kINT32, DType::kINT64, DType::kINT64, DType::kINT32};
    int32_t const fwdDims[kGdnMaxNbInputs] = {2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1};
    DType const commitTypes[kGdnCommitNbInputs] = {dataType, DType::kFLOAT32, dataType, DType::kINT32, DType::kINT32,
        DType::kINT32, DType::kINT32, DType::kINT64, DType::kINT64};
    int32_t const commitDims[kGdnCommitNbInputs] = {3, 4, 2, 1, 1, 1, 1, 1, 1};
    DType const* types = commit ? commitTypes : fwdTypes;
    int32_t const* ranks = commit ? commitDims : fwdDims;
    Status const typeStatus = checkTypesAndRanks(fail, in, nbInputs, names, types, ranks, msg, msgLen);
    if (typeStatus != Status::kOK)
        return typeStatus;

    int64_t const C = gatedDeltaNetConvDim(a);
    int64_t const hv = a.numVHeads;
    int64_t const kc = a.convKernel;
    int64_t tokens = -1;
    int64_t batch = -1;
    if (!commit)
    {
        tokens = in[0].dims[0];
        batch = in[7].dims[0]; // slot_mapping [B]
        int64_t const cu = in[6].dims[0];
        if (!known(batch) && known(cu))
            batch = cu - 1;
        DimRule const rules[] = {{0, 1, C, "2 Hk Dk + Hv Dv"}, {1, 0, C, "2 Hk Dk + Hv Dv"}, {1, 1, kc, "conv_kernel"},
            {2, 0, tokens, "T"}, {2, 1, hv, "num_v_heads"}, {3, 0, tokens, "T"}, {3, 1, hv, "num_v_heads"},
            {4, 0, hv, "num_v_heads"}, {5, 0, hv, "num_v_heads"}, {6, 0, known(batch) ? batch + 1 : -1, "B+1"},
            {8, 0, batch, "B"}, {9, 0, 1, "one pointer"}, {10, 0, 1, "one pointer"}, {11, 0, batch, "B"}};
        // the last rule is zero_state's, an input only with zero_state_input = 1
        int32_t const nbRules = static_cast<int32_t>(sizeof(rules) / sizeof(rules[0])) - (a.zeroStateInput ? 0 : 1);
        Status const s = checkDims(fail, in, names, rules, nbRules, msg, msgLen);
        if (s != Status::kOK)
            return s;
    }
    else
    {
        batch = in[0].dims[0];
        int64_t const kv = a.maxVerifyTokens;
        DimRule const rules[] = {{0, 1, kv, "max_verify_tokens"}, {0, 2, C, "2 Hk Dk + Hv Dv"}, {1, 0, batch, "B"},
            {1, 1, kv, "max_verify_tokens"}, {1, 2, 2, "2 (g, beta)"}, {1, 3, hv, "num_v_heads"},
            {2, 0, C, "2 Hk Dk + Hv Dv"}, {2, 1, kc, "conv_kernel"}, {3, 0, batch, "B"},
            {4, 0, known(batch) ? batch + 1 : -1, "B+1"}, {5, 0, batch, "B"}, {6, 0, batch, "B"},
            {7, 0, 1, "one pointer"}, {8, 0, 1, "one pointer"}};
        Status const s = checkDims(fail, in, names, rules, msg, msgLen);
        if (s != Status::kOK)
            return s;
        if (known(batch))
            tokens = batch * kv;
    }
    if (params != nullptr)
    {
        params->attrs = a;
        params->tokens = tokens;
        params->batch = batch;
        params->convDim = C;
        params->dataType = dataType;
        params->numContext = 0;
    }
    return Status::kOK;
}

Status validateGatedDeltaNetBatch(GatedDeltaNetParams* p, int32_t const* types, int32_t const* cu, int32_t const* slots,
    int64_t numSlots, int32_t const* numAccepted, char* msg, size_t msgLen)
{
    clearMessage(msg, msgLen);
    int64_t const B = p->batch;
    bool const commit = p->attrs.mode == static_cast<int32_t>(GdnMode::kCOMMIT);
    if (B < 0 || p->tokens < 0)
        return fail(msg, msgLen, "request data checked before the dims are known");
    int64_t numContext = 0;
    for (int64_t r = 0; r < B; ++r)
    {
        int32_t const t = types[r];
        if (t != kGdnRequestContext && t != kGdnRequestGeneration)
            return fail(msg, msgLen, "host_request_types[%lld]=%d; expected 0 (context) or 1 (generation)",
                static_cast<long long>(r), t);
        if (t == kGdnRequestContext)
        {
            if (numContext != r)
                return fail(msg, msgLen,
                    "host_request_types[%lld] is a context request after a generation request (TensorRT-LLM's order: "
                    "context requests first)",
                    static_cast<long long>(r));
            ++numContext;
        }
    }
    if (cu != nullptr)
    {
        if (B >= 0 && cu[0] != 0)
            return fail(msg, msgLen, "cu_seqlens[0]=%d must be 0", cu[0]);
        for (int64_t r = 0; r < B; ++r)
        {
            int64_t const len = static_cast<int64_t>(cu[r + 1]) - cu[r];
            if (len < 0)
                return fail(msg, msgLen, "cu_seqlens decreases at request %lld (%d -> %d)", static_cast<long long>(r),
                    cu[r], cu[r + 1]);
            if (r >= numContext && len > p->attrs.maxVerifyTokens)
                return fail(msg, msgLen, "generation request %lld has %lld tokens, more than max_verify_tokens=%d",
                    static_cast<long long>(r), static_cast<long long>(len), p->attrs.maxVerifyTokens);
            if (numAccepted != nullptr && r >= numContext && (numAccepted[r] < 0 || numAccepted[r] > len))
                return fail(msg, msgLen, "num_accepted[%lld]=%d outside [0, %lld] (the request's verify tokens)",
                    static_cast<long long>(r), numAccepted[r], static_cast<long long>(len));
        }
        if (!commit && cu[B] != p->tokens)
            return fail(msg, msgLen, "cu_seqlens[B]=%d but the packed inputs have T=%lld tokens", cu[B],
                static_cast<long long>(p->tokens));
    }
    if (slots != nullptr)
    {
        std::vector<int64_t> owner(static_cast<size_t>(numSlots > 0 ? numSlots : 0), -1);
        for (int64_t r = 0; r < B; ++r)
        {
            int32_t const s = slots[r];
            if (s < 0 || s >= numSlots)
                return fail(msg, msgLen, "slot_mapping[%lld]=%d outside the state pool's %lld slots",
                    static_cast<long long>(r), s, static_cast<long long>(numSlots));
            if (owner[static_cast<size_t>(s)] >= 0)
                return fail(msg, msgLen, "slot_mapping: requests %lld and %lld share slot %d",
                    static_cast<long long>(owner[static_cast<size_t>(s)]), static_cast<long long>(r), s);
            owner[static_cast<size_t>(s)] = r;
        }
    }
    p->numContext = static_cast<int32_t>(numContext);
    return Status::kOK;
}

GatedDeltaNetWorkspace gatedDeltaNetWorkspaceLayout(GatedDeltaNetParams const& p)
{
    GatedDeltaNetWorkspace w;
    auto const& a = p.attrs;
    if (a.mode == static_cast<int32_t>(GdnMode::kCOMMIT))
        return w; // the commit computes nothing but the pending count and the conv state
    size_t const rows = static_cast<size_t>(p.tokens > 0 ? p.tokens : 0);
    size_t const hk = static_cast<size_t>(a.numKHeads), hv = static_cast<size_t>(a.numVHeads);
    size_t const dk = static_cast<size_t>(a.headKDim), dv = static_cast<size_t>(a.headVDim);
    size_t off = 0;
    auto take = [&](size_t bytes)
    {
        size_t const at = off;
        off += align256(bytes);
        return at;
    };
    w.xc = take(rows * static_cast<size_t>(p.convDim) * dtypeSize(p.dataType));
    w.kh = take(rows * hk * dk * sizeof(float));
    w.qh = take(rows * hk * dk * sizeof(float));
    w.gates = take(rows * 2 * hv * sizeof(float));
    if (a.chunkSize > 0)
    {
        size_t const ch = static_cast<size_t>(a.chunkSize);
        w.gam = take(rows * hv * sizeof(float));
        w.a = take(rows * hv * ch * sizeof(float));
        w.qk = take(rows * hv * ch * sizeof(float));
        w.u = take(rows * hv * dv * sizeof(float));
        w.w = take(rows * hv * dk * sizeof(float));
    }
    w.total = off;
    return w;
}

size_t gatedDeltaNetWorkspaceSize(GatedDeltaNetParams const& p)
{
    return gatedDeltaNetWorkspaceLayout(p).total;
}

} // namespace dflash2
