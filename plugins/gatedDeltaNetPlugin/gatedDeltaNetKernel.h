/*
 * DFlash2GatedDeltaNet: launchers, one per kernel, plus the two sequences the plugin enqueues
 * (forward, commit). The glue only calls launchGatedDeltaNetForward / launchGatedDeltaNetCommit.
 */
#pragma once

#include "gatedDeltaNetParams.h"

#include <cuda_runtime_api.h>

namespace dflash2
{

//! Device pointers of one call (either mode); a field the mode does not use stays null.
struct GdnLaunchArgs
{
    // forward inputs
    void const* qkv{nullptr};        //!< [T, C]
    void const* a{nullptr};          //!< [T, Hv]
    void const* b{nullptr};          //!< [T, Hv]
    float const* dtBias{nullptr};    //!< [Hv]
    float const* aLog{nullptr};      //!< [Hv]
    int32_t const* zeroState{nullptr}; //!< [B] or null (zero_state_input = 0)
    // commit inputs
    int32_t const* numAccepted{nullptr}; //!< [B]
    // both
    void const* convWeight{nullptr};     //!< [C, K]
    int32_t const* cuSeqlens{nullptr};   //!< [B+1]
    int32_t const* slots{nullptr};       //!< [B]
    float* rnnPool{nullptr};             //!< [slots, Hv, Dk + E, Dv] fp32: state and records (GdnSlotLayout)
    void* convPool{nullptr};             //!< [slots, K-1, C]
    // forward outputs (verifyQkv is the commit's input; verifyGates too, no longer read by it)
    void* y{nullptr};                    //!< [T, Hv Dv]
    void* verifyQkv{nullptr};            //!< [B, Kv, C]
    float* verifyGates{nullptr};         //!< [B, Kv, 2, Hv]
    // commit output
    int32_t* committed{nullptr};         //!< [B]
    void* workspace{nullptr};            //!< gatedDeltaNetWorkspaceSize bytes, 256-byte aligned
};

//! Causal conv + silu into the workspace's xc (every packed row, and the raw verify rows of generation
//! requests into verifyQkv). This and the stages up to the chunk scan are forward stages (kINVALID in
//! commit mode).
Status launchGdnConv(GatedDeltaNetParams const& p, GdnLaunchArgs const& args, cudaStream_t stream, char* msg, size_t msgLen);
//! The fused prologue the two sequences run: conv + silu (xc: the v channels only), l2norm of q
//! (scaled) and k into qh / kh, and (forward) the gates; the raw verify rows and their gates of
//! generation requests into verifyQkv / verifyGates. Equivalent to launchGdnConv + launchGdnQkNorm +
//! launchGdnGates, in one launch.
Status launchGdnPrologue(GatedDeltaNetParams const& p, GdnLaunchArgs const& args, cudaStream_t stream, char* msg, size_t msgLen);
//! l2norm of q (scaled) and k per row and key head.
Status launchGdnQkNorm(GatedDeltaNetParams const& p, GdnLaunchArgs const& args, cudaStream_t stream, char* msg, size_t msgLen);
//! g and beta per row and value head (also into verifyGates for generation rows).
Status launchGdnGates(GatedDeltaNetParams const& p, GdnLaunchArgs const& args, cudaStream_t stream, char* msg, size_t msgLen);
//! Per-token recurrence from each slot's state folded over its pending records: generation requests
//! (verify: y, delta records, the folded state stored when it had records) and context requests when
//! chunk_size = 0.
Status launchGdnRecurrent(GatedDeltaNetParams const& p, GdnLaunchArgs const& args, cudaStream_t stream, char* msg, size_t msgLen);
//! Chunked context requests, step 1: cumulative decays, A and QK per chunk and value head.
Status launchGdnChunkMatrices(GatedDeltaNetParams const& p, GdnLaunchArgs const& args, cudaStream_t stream, char* msg, size_t msgLen);
//! Step 2: U and W by forward substitution, one column per thread.
Status launchGdnChunkSolve(GatedDeltaNetParams const& p, GdnLaunchArgs const& args, cudaStream_t stream, char* msg, size_t msgLen);
//! Step 3: the scan over a request's chunks (state in registers, folded first), y, and the final state.
Status launchGdnChunkScan(GatedDeltaNetParams const& p, GdnLaunchArgs const& args, cudaStream_t stream, char* msg, size_t msgLen);
//! After every reader of the old records. Forward: context requests' conv state, generation requests'
//! keys / decay records, every slot's pending count 0. Commit: generation requests' conv state over
//! their accepted tokens, pending = committed = the accepted count.
Status launchGdnConvState(GatedDeltaNetParams const& p, GdnLaunchArgs const& args, cudaStream_t stream, char* msg, size_t msgLen);

//! The forward (p.numContext from validateGatedDeltaNetBatch). Enqueues on stream; no sync.
Status launchGatedDeltaNetForward(GatedDeltaNetParams const& p, GdnLaunchArgs const& args, cudaStream_t stream, char* msg, size_t msgLen);
//! The commit (deferred: the pending counts and the conv state; the next forward folds the records).
Status launchGatedDeltaNetCommit(GatedDeltaNetParams const& p, GdnLaunchArgs const& args, cudaStream_t stream, char* msg, size_t msgLen);

} // namespace dflash2
