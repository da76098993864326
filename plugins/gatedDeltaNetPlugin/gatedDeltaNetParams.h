/*
 * DFlash2GatedDeltaNet: attributes, parameters and validation (TensorRT-free). The glue
 * translates TensorRT descriptors into TensorDesc and calls these; so does the CPU build.
 */
#pragma once

#include "../common/df2Common.h"

namespace dflash2
{

//! The plugin's name: its creator's, and the prefix of its messages.
constexpr char const* kGatedDeltaNetName = "DFlash2GatedDeltaNet";

enum class GdnMode : int32_t
{
    kFORWARD = 0, //!< conv + gated delta rule over the packed tokens of a mixed batch
    kCOMMIT = 1,  //!< advance each generation request's committed state over its accepted tokens
};

inline char const* gdnModeName(GdnMode m)
{
    switch (m)
    {
    case GdnMode::kFORWARD: return "forward";
    case GdnMode::kCOMMIT: return "commit";
    }
    return "unknown";
}

//! Plugin attributes (see gatedDeltaNetPlugin.yaml; the names there are the field names).
struct GatedDeltaNetAttrs
{
    int32_t mode{0};            //!< GdnMode
    int32_t numKHeads{0};       //!< Hk (this rank's key heads)
    int32_t numVHeads{0};       //!< Hv (this rank's value heads), a multiple of Hk
    int32_t headKDim{0};        //!< Dk in {16, 32, 64, 128}
    int32_t headVDim{0};        //!< Dv
    int32_t convKernel{0};      //!< K taps of the causal conv; the conv state holds K-1 inputs
    int32_t maxVerifyTokens{0}; //!< Kv = K_draft + 1: verify tokens per generation request
    int32_t chunkSize{64};      //!< context requests: tokens per chunk; 0 = the per-token path
    int32_t zeroStateInput{0};  //!< forward: 1 adds input 11 zero_state [B] (first chunks start from zeros)
};

//! The attributes in the spec's order: the creator's fields, createPlugin, the serialised fields
//! and the CPU build's attribute array all read this table (common/df2Common.h).
inline constexpr Int32AttrField<GatedDeltaNetAttrs> kGatedDeltaNetFields[] = {
    {"mode", &GatedDeltaNetAttrs::mode, false},
    {"num_k_heads", &GatedDeltaNetAttrs::numKHeads, true},
    {"num_v_heads", &GatedDeltaNetAttrs::numVHeads, true},
    {"head_k_dim", &GatedDeltaNetAttrs::headKDim, true},
    {"head_v_dim", &GatedDeltaNetAttrs::headVDim, true},
    {"conv_kernel", &GatedDeltaNetAttrs::convKernel, true},
    {"max_verify_tokens", &GatedDeltaNetAttrs::maxVerifyTokens, true},
    {"chunk_size", &GatedDeltaNetAttrs::chunkSize, false},
    {"zero_state_input", &GatedDeltaNetAttrs::zeroStateInput, false},
};

constexpr int32_t kGdnNbAttrs = static_cast<int32_t>(sizeof(kGatedDeltaNetFields) / sizeof(kGatedDeltaNetFields[0]));

//! Everything a launcher needs, derived and checked by validateGatedDeltaNet (shapes) and
//! validateGatedDeltaNetBatch (the host-visible request data).
struct GatedDeltaNetParams
{
    GatedDeltaNetAttrs attrs;
    int64_t tokens{0};  //!< T packed tokens (forward; in commit the verify rows B * Kv)
    int64_t batch{0};   //!< B requests
    int64_t convDim{0}; //!< C = 2 Hk Dk + Hv Dv
    DType dataType{DType::kFLOAT16}; //!< activations, conv weight and conv state
    int32_t numContext{0};           //!< requests [0, numContext) are context requests
};

constexpr int32_t kGdnMaxHeads = 1024; //!< per rank, Hk and Hv (a grid dimension; C stays < 2^20)
constexpr int32_t kGdnMaxHeadVDim = 512;
constexpr int32_t kGdnMaxConvKernel = 8;
constexpr int32_t kGdnMaxVerifyTokens = 32;
constexpr int32_t kGdnMaxChunkSize = 64;

//! Request types (TensorRT-LLM's host_request_types).
constexpr int32_t kGdnRequestContext = 0;
constexpr int32_t kGdnRequestGeneration = 1;

//! Forward inputs: 0 qkv [T, C], 1 conv_weight [C, K], 2 a [T, Hv], 3 b [T, Hv] (activation
//! dtype), 4 dt_bias [Hv] fp32, 5 A_log [Hv] fp32, 6 cu_seqlens [B+1] int32, 7 slot_mapping [B]
//! int32, 8 host_request_types [B] int32 (host), 9 rnn_state_ptr [1] int64 (host),
//! 10 conv_state_ptr [1] int64 (host).
//! With zero_state_input = 1: 11 zero_state [B] int32 (device): a context request r with
//! zero_state[r] != 0 starts from zero recurrent and conv state (its slot's contents are neither
//! read nor kept); generation requests ignore it.
//! Outputs: 0 y [T, Hv Dv], 1 verify_qkv [B, Kv, C] (activation dtype), 2 verify_gates
//! [B, Kv, 2, Hv] fp32.
constexpr int32_t kGdnFwdNbInputs = 11;
constexpr int32_t kGdnMaxNbInputs = 12;
constexpr int32_t kGdnFwdNbOutputs = 3;
//! Commit inputs: 0 verify_qkv [B, Kv, C], 1 verify_gates [B, Kv, 2, Hv] fp32, 2 conv_weight
//! [C, K], 3 num_accepted [B] int32, 4 cu_seqlens [B+1] int32, 5 slot_mapping [B] int32,
//! 6 host_request_types [B] int32 (host), 7 rnn_state_ptr, 8 conv_state_ptr [1] int64 (host).
//! Output: 0 committed [B] int32.
constexpr int32_t kGdnCommitNbInputs = 9;
constexpr int32_t kGdnCommitNbOutputs = 1;

//! The commit ignores zero_state_input (its requests continue from their committed state).
inline int32_t gatedDeltaNetNbInputs(GatedDeltaNetAttrs const& a)
{
    return a.mode == static_cast<int32_t>(GdnMode::kCOMMIT) ? kGdnCommitNbInputs
                                                             : kGdnFwdNbInputs + (a.zeroStateInput ? 1 : 0);
}

inline int32_t gatedDeltaNetNbOutputs(GatedDeltaNetAttrs const& a)
{
    return a.mode == static_cast<int32_t>(GdnMode::kCOMMIT) ? kGdnCommitNbOutputs : kGdnFwdNbOutputs;
}

//! Input names in order for the attributes' mode (for messages and the glue).
char const* gatedDeltaNetInputName(GatedDeltaNetAttrs const& a, int32_t index);

inline int64_t gatedDeltaNetConvDim(GatedDeltaNetAttrs const& a)
{
    return 2 * static_cast<int64_t>(a.numKHeads) * a.headKDim + static_cast<int64_t>(a.numVHeads) * a.headVDim;
}

//! Checks the attributes alone (the plugin creator calls this before any shape is known).
Status validateGatedDeltaNetAttrs(GatedDeltaNetAttrs const& attrs, char* msg, size_t msgLen);

//! Checks dtypes and shapes (dims of -1 are unknown and skipped). Fills *params (numContext
//! stays 0) when params is not null.
Status validateGatedDeltaNet(GatedDeltaNetAttrs const& attrs, TensorDesc const* inputs, int32_t nbInputs,
    GatedDeltaNetParams* params, char* msg, size_t msgLen);

//! Checks the request data and sets params->numContext. hostRequestTypes [B] is always given
//! (the plugin reads it on the host); cuSeqlens [B+1], slots [B] (with numSlots, the pool size)
//! and numAccepted [B] are checked when not null (the CPU build has them on the host). On the GPU
//! they stay on the device unchecked: the kernels clamp num_accepted and a slot's pending count,
//! but take cu_seqlens and the slots as the runtime made them (a bad one reads and writes out of
//! range). Rules: request types are 0 or 1 with
//! the context requests first; cu_seqlens starts at 0, never decreases and (forward) ends at T;
//! a generation request has at most Kv tokens; slots lie in [0, numSlots) and are distinct;
//! num_accepted of a generation request lies in [0, its token count].
Status validateGatedDeltaNetBatch(GatedDeltaNetParams* params, int32_t const* hostRequestTypes,
    int32_t const* cuSeqlens, int32_t const* slots, int64_t numSlots, int32_t const* numAccepted, char* msg,
    size_t msgLen);

//! One slot (row) of the recurrent-state pool, in floats from the slot's start. The runtime allocates
//! Hv x (Dk + recordRows) x Dv fp32 per slot (TensorRT-LLM's RnnStateManager row [rnn_hidden_size /
//! rnn_head_size, state_size, rnn_head_size] with state_size = Dk + recordRows) and never reads it; the
//! layout inside is the plugin's:
//!   state   [Hv, Dk, Dv]  the state as of the last fold
//!   pending int32 (+ 3 floats of padding): how many of the records below are accepted but not yet
//!           folded into state (0..Kv; read clamped to that range)
//!   delta   [Hv, Kv, Dv]  per verify token t: delta_t = (v_t - S_t^T k_t) beta_t of every state column
//!   keys    [Hk, Kv, Dk]  per verify token t: the l2-normalised k_t of every key head
//!   decay   [Hv, Kv]      per verify token t: exp(g_t) of every value head
//! The committed state is state folded over records 0 .. pending-1: per token, every state value
//! s = fma(k_t[i], delta_t[j], s * decay_t) (gdnSliceFold): bit for bit the per-token step the verify ran.
//! Each segment starts at a multiple of 4 floats from the slot's start.
struct GdnSlotLayout
{
    int64_t state{0};
    int64_t pending{0};
    int64_t delta{0};
    int64_t keys{0};
    int64_t decay{0};
    int64_t recordRows{0}; //!< rows of Hv x Dv floats the records take beyond the state (ceil)
    int64_t floats{0};     //!< the slot's size (the pool's slot stride): Hv (Dk + recordRows) Dv
};

inline GdnSlotLayout gatedDeltaNetSlotLayout(GatedDeltaNetAttrs const& a)
{
    auto pad4 = [](int64_t v) { return (v + 3) / 4 * 4; };
    int64_t const hk = a.numKHeads, hv = a.numVHeads, dk = a.headKDim, dv = a.headVDim, kv = a.maxVerifyTokens;
    GdnSlotLayout l;
    l.state = 0;
    l.pending = pad4(hv * dk * dv);
    l.delta = l.pending + 4;
    l.keys = l.delta + pad4(hv * kv * dv);
    l.decay = l.keys + pad4(hk * kv * dk);
    int64_t const end = l.decay + pad4(hv * kv);
    int64_t const row = hv * dv;
    l.recordRows = row > 0 ? (end - hv * dk * dv + row - 1) / row : 0;
    l.floats = hv * (dk + l.recordRows) * dv;
    return l;
}

//! The pending count as the kernels read it: clamped to [0, Kv] (a slot never written holds garbage, and
//! only a zero_state context request, which reads no records, may meet one).
DF2_HD int32_t gdnPendingCount(int32_t raw, int32_t maxVerify)
{
    return raw < 0 ? 0 : (raw > maxVerify ? maxVerify : raw);
}

//! Bytes of device workspace the launchers need for these dims (tokens/batch at their maxima).
size_t gatedDeltaNetWorkspaceSize(GatedDeltaNetParams const& params);

//! Workspace carve-up (byte offsets, each segment 256-byte aligned). Forward: xc [T, C]
//! (activation dtype), qh/kh [T, Hk Dk], gates [T, 2, Hv], and for chunk_size > 0 gam [T, Hv],
//! A/QK [T, Hv, chunk], U [T, Hv, Dv], W [T, Hv, Dk] (fp32). Commit: none (it sets the pending
//! counts and shifts the conv state; the next forward folds the records).
struct GatedDeltaNetWorkspace
{
    size_t xc{0}, qh{0}, kh{0}, gates{0}, gam{0}, a{0}, qk{0}, u{0}, w{0};
    size_t total{0};
};

GatedDeltaNetWorkspace gatedDeltaNetWorkspaceLayout(GatedDeltaNetParams const& params);

} // namespace dflash2
