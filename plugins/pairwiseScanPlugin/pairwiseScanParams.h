/*
 * DFlash2PairwiseScan: parameters and validation (TensorRT-free).
 */
#pragma once

#include "../common/df2Common.h"

namespace dflash2
{

//! The plugin's name: its creator's, and the prefix of its messages.
constexpr char const* kPairwiseScanName = "DFlash2PairwiseScan";

enum class ScanMode : int32_t
{
    kGREEDY = 0,  //!< published behaviour: left-to-right argmax, ties to the lower index
    kSAMPLE = 1,  //!< softmax(S/T) over the candidates, inverse CDF at u; q = p
    kVITERBI = 2, //!< global max-plus best path (an option beyond the published behaviour)
};

inline char const* scanModeName(ScanMode m)
{
    switch (m)
    {
    case ScanMode::kGREEDY: return "greedy";
    case ScanMode::kSAMPLE: return "sample";
    case ScanMode::kVITERBI: return "viterbi";
    }
    return "unknown";
}

struct PairwiseScanAttrs
{
    int32_t mode{0}; //!< ScanMode value (see pairwiseScanPlugin.yaml); greedy (the published behaviour) by default
};

//! The attributes in the spec's order (one table for the creator, createPlugin and serialisation).
inline constexpr Int32AttrField<PairwiseScanAttrs> kPairwiseScanFields[] = {
    {"mode", &PairwiseScanAttrs::mode, false},
};

struct PairwiseScanParams
{
    ScanMode mode{ScanMode::kGREEDY};
    int64_t batch{0};  //!< B
    int32_t length{0}; //!< L draft positions
    int32_t topK{0};   //!< K candidates per position
    int32_t rank{0};   //!< R selector rank
    int64_t vocab{0};  //!< V codebook rows
    DType dataType{DType::kFLOAT16}; //!< dtype of the projected hidden and both codebooks
};

constexpr int32_t kScanMaxTopK = 16;
constexpr int32_t kScanMaxLength = 15;
constexpr int32_t kScanMaxRank = 512;
constexpr int32_t kScanRankMultiple = 8;

//! Checks the attributes alone (the plugin creator calls this before any shape is known).
Status validatePairwiseScanAttrs(PairwiseScanAttrs const& attrs, char* msg, size_t msgLen);

//! Input order: 0 unary [B,L,K] fp32, 1 cand ids [B,L,K] int32, 2 projected hidden [B,L,R],
//! 3 anchor [B] int32, 4 predecessor codebook [V,R], 5 successor codebook [V,R],
//! 6 temperature [B] fp32, 7 uniforms [B,L] fp32. Inputs 2, 4, 5 share one dtype
//! (float32/float16/bfloat16). Dims of -1 are unknown and skipped.
constexpr int32_t kScanNbInputs = 8;
constexpr int32_t kScanNbOutputs = 2;

Status validatePairwiseScan(PairwiseScanAttrs const& attrs, TensorDesc const* inputs, int32_t nbInputs,
    PairwiseScanParams* params, char* msg, size_t msgLen);

//! Bytes of device workspace the launcher needs (the [B, L, K, K] fp32 lattice).
inline size_t pairwiseScanWorkspaceSize(PairwiseScanParams const& p)
{
    return static_cast<size_t>(p.batch) * p.length * p.topK * p.topK * sizeof(float);
}

} // namespace dflash2
