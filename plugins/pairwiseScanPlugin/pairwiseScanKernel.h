/*
 * DFlash2PairwiseScan: launchers. The plugin's enqueue is ONE launch (launchPairwiseScan: lattice
 * and walk per batch row in one thread-block cluster); the lattice alone and the walk alone stay
 * available as separate entry points (checks, and a lattice computed elsewhere).
 */
#pragma once

#include "pairwiseScanParams.h"

#include <cuda_runtime_api.h>

namespace dflash2
{

//! lattice [B, L, K, K] fp32 = unary + pairwise scores (pairwiseScanMath.h), without the walk.
Status launchPairwiseLattice(PairwiseScanParams const& params, float const* unary, int32_t const* cand,
    void const* hidden, int32_t const* anchor, void const* predCodebook, void const* succCodebook, float* lattice,
    cudaStream_t stream, char* msg, size_t msgLen);

//! Walk over a given lattice [B, L, K, K]: ids [B, L] int32 token ids, q [B, L, K] fp32.
Status launchPairwiseWalk(PairwiseScanParams const& params, float const* lattice, int32_t const* cand,
    float const* temperature, float const* uniforms, int32_t* ids, float* q, cudaStream_t stream, char* msg,
    size_t msgLen);

//! The plugin's enqueue: lattice into workspace (pairwiseScanWorkspaceSize bytes), then walk.
Status launchPairwiseScan(PairwiseScanParams const& params, float const* unary, int32_t const* cand,
    void const* hidden, int32_t const* anchor, void const* predCodebook, void const* succCodebook,
    float const* temperature, float const* uniforms, void* workspace, int32_t* ids, float* q, cudaStream_t stream,
    char* msg, size_t msgLen);

//! launchPairwiseScan with the CTAs per request row forced (1, 2, 4 or 8; 0 = the launcher's choice): checks only.
Status launchPairwiseScanRanks(PairwiseScanParams const& params, float const* unary, int32_t const* cand,
    void const* hidden, int32_t const* anchor, void const* predCodebook, void const* succCodebook,
    float const* temperature, float const* uniforms, void* workspace, int32_t* ids, float* q, int32_t ranks,
    cudaStream_t stream, char* msg, size_t msgLen);

} // namespace dflash2
