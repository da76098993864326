"""The engine's I/O in the EAGLE one-engine contract of ``engine_io.yaml`` (docs/architecture.md §3): every
input the network declares, with its dim ranges (:func:`declare_inputs`, the body of
``DFlash2ForCausalLM.prepare_inputs``), how a step's batch is packed (:func:`step_layout`), and the outputs
marked at the end of a step (:func:`mark_outputs`).

One engine step for a batch packed as [context requests..., generation requests...]; its outputs::

    outputs   accepted_tokens, num_accepted_tokens, accepted_paths = 0, next_draft_tokens
              (placeholders), next_draft_lens = K, next_draft_paths (the chain), logits
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .common import (AttentionParams, F, KeyValueCacheParams, RecurrentStateParams, SlidingParams, SpecDecodingParams,
                     api, dims)
from .kv_layout import hf_layer_types, sliding_context, total_kv_layers


def declare_inputs(config, K: int, recurrent: bool, max_batch_size: int, max_num_tokens: int, max_seq_len: int,
                   max_blocks_per_seq: int | None = None, num_kv_layers: int | None = None,
                   tokens_per_block: int | None = None) -> dict:
    """Every engine input, with dim ranges (names and shapes: ``engine_io.yaml``), as the keyword arguments of
    ``DFlash2ForCausalLM.forward``. ``recurrent``: the target has Gated DeltaNet layers (their state inputs)."""
    if max_blocks_per_seq is None:
        tpb = tokens_per_block or int((getattr(config, "dflash2_engine", None) or {}).get("tokens_per_block", 32))
        max_blocks_per_seq = -(-max_seq_len // tpb)
    bs = [[1, (max_batch_size + 1) // 2, max_batch_size]]
    nt = [[1, (max_num_tokens + 1) // 2, max_num_tokens]]
    nl = num_kv_layers or total_kv_layers(config)
    # dim_range as functional.Tensor reads it: {dimension: [one entry per optimization profile]}, an entry being
    # [min, opt, max] for a dynamic dimension and the size for a static one. ONE profile, as TensorRT-LLM's own
    # models build without multiple_profiles (a list [1, mid, max] would be three profiles of fixed sizes).
    T = api.input_tensor
    R = OrderedDict
    kvp = KeyValueCacheParams(
        host_past_key_value_lengths=T("host_past_key_value_lengths", "int32", [-1], R(batch_size=bs)),
        host_max_attention_window_sizes=T("host_max_attention_window_sizes", "int32", [nl], R(num_layers=[nl])),
        host_sink_token_length=T("host_sink_token_length", "int32", [1], R(scalar=[1])),
        kv_cache_block_offsets=T("kv_cache_block_offsets", "int32", [1, -1, 2, -1],
                                 R(num_pools=[1], batch_size=bs, kv=[2],
                                   max_blocks_per_seq=[[1, max_blocks_per_seq // 2 or 1, max_blocks_per_seq]])),
        host_kv_cache_block_offsets=T("host_kv_cache_block_offsets", "int32", [1, -1, 2, -1],
                                      R(num_pools=[1], batch_size=bs, kv=[2],
                                        max_blocks_per_seq=[[1, max_blocks_per_seq // 2 or 1, max_blocks_per_seq]])),
        host_kv_cache_pool_pointers=T("host_kv_cache_pool_pointers", "int64", [1, 2], R(num_pools=[1],
                                                                                         kv=[2])),
        host_kv_cache_pool_mapping=T("host_kv_cache_pool_mapping", "int32", [nl, 2], R(num_layers=[nl],
                                                                                        pool_and_layer=[2])),
        # beam search only; the plugin still takes it (use_cache): TensorRT-LLM's runtime binds it
        cache_indirection=T("cache_indirection", "int32", [-1, -1, -1],
                            R(batch_size_cache=bs, beam_width=[1],
                              max_seq_len=[[1, (max_seq_len + 1) // 2, max_seq_len]])))
    att = AttentionParams(
        sequence_length=T("sequence_length", "int32", [-1], R(batch_size=bs)),
        context_lengths=T("context_lengths", "int32", [-1], R(batch_size=bs)),
        host_context_lengths=T("host_context_lengths", "int32", [-1], R(batch_size=bs)),
        max_context_length=max_seq_len,
        host_request_types=T("host_request_types", "int32", [-1], R(batch_size=bs)),
        host_runtime_perf_knobs=T("host_runtime_perf_knobs", "int64", [16], R(perf_knob_size=[16])),
        host_context_progress=T("host_context_progress", "int64", [1], R(context_progress_size=[1])))
    gen = [[0, (max_batch_size + 1) // 2, max_batch_size]]            # generation requests: 0 in a context-only step
    gen_tok = [[0, (max_batch_size * (K + 1) + 1) // 2, max_batch_size * (K + 1)]]
    logits = [[1, (max_batch_size * (K + 1) + 1) // 2, max_batch_size * (K + 1)]]
    spec = SpecDecodingParams(
        spec_decoding_is_generation_length_variable=True, spec_decoding_max_generation_length=K + 1,
        spec_decoding_generation_lengths=T("spec_decoding_generation_lengths", "int32", [-1],
                                           R(gen_batch_size=gen)),
        spec_decoding_position_offsets=T("spec_decoding_position_offsets", "int32", [-1, K + 1],
                                         R(gen_batch_size=gen, spec_decoding_max_generation_length=[K + 1])),
        spec_decoding_packed_mask=T("spec_decoding_packed_mask", "int32", [-1, (K + 1 + 31) // 32],
                                    R(gen_num_tokens=gen_tok, spec_decoding_packed_mask_size=[(K + 32) // 32])),
        spec_decoding_use=T("spec_decoding_use", "int32", [1], R(spec_decoding_use_size=[1])))
    decl = {
        "input_ids": T("input_ids", "int32", [-1], R(num_tokens=nt)),
        "last_token_ids": T("last_token_ids", "int32", [-1], R(num_logits=logits)),
        "kv_cache_params": kvp,
        "attention_params": att,
        "spec_decoding_params": spec,
        "draft_lens": T("draft_lens", "int32", [-1], R(batch_size=bs)),
        "eagle_temperature": T("eagle_temperature", "float32", [-1], R(batch_size=bs)),
        # eagleBuffers.cpp reshape(): [numSequences, maxDecodingTokens]
        "rand_data_validation": T("rand_data_validation", "float32", [-1, K + 1],
                                  R(batch_size=bs, max_decoding_tokens=[K + 1])),
        "rand_data_sample": T("rand_data_sample", "float32", [-1], R(batch_size=bs)),
        # eagleBuffers.cpp reshape(): [numSequences], one entry per request (setupEagleNetHostBuffers)
        "host_gen_eagle_net_request_types": T("host_gen_eagle_net_request_types", "int32", [-1], R(batch_size=bs)),
        **(recurrent_inputs(config, bs) if recurrent else {}),
        **(sliding_inputs(bs) if sliding_context(config) else {}),
    }
    if config.mapping.tp_size > 1:
        # the custom all-reduce workspace, declared as TensorRT-LLM's own models declare it for tp > 1
        # (set_workspace_tensor): without it functional.allreduce falls back to NCCL_SYMMETRIC with no workspace
        # input, which allreducePlugin.cpp refuses (scripts/trtllm_conformance_lib/trtllm_build_steps.yaml)
        # one range per optimization profile, as many as the other inputs have
        decl["all_reduce_workspace"] = api.all_reduce_workspace(config.mapping, len(nt))
    return decl


def recurrent_inputs(config, bs) -> dict:
    """TensorRT-LLM's recurrent-state inputs (RecurrentGemma / Mamba convention): ``slot_mapping`` and one
    ``rnn_state_ptr_<L>`` / ``conv_state_ptr_<L>`` per Gated DeltaNet layer L (host int64 addresses)."""
    T, R = api.input_tensor, OrderedDict
    gdn = [i for i, t in enumerate(hf_layer_types(config)) if t == "linear_attention"]
    return {"recurrent_params": RecurrentStateParams(
        slot_mapping=T("slot_mapping", "int32", [-1], R(batch_size=bs)),
        rnn_state_ptr={i: T(f"rnn_state_ptr_{i}", "int64", [1], R(ptr=[1])) for i in gdn},
        conv_state_ptr={i: T(f"conv_state_ptr_{i}", "int64", [1], R(ptr=[1])) for i in gdn})}


def sliding_inputs(bs) -> dict:
    """The context route's second set of request inputs (:class:`.common.SlidingParams`; engine_io.yaml), which the
    project runtime binds (TensorRT-LLM's executor binds no input of these names: such an engine runs on the project
    runtime only)."""
    T, R = api.input_tensor, OrderedDict
    return {"sliding_params": SlidingParams(
        host_request_types=T("sliding_host_request_types", "int32", [-1], R(batch_size=bs)),
        context_lengths=T("sliding_context_lengths", "int32", [-1], R(batch_size=bs)),
        host_context_lengths=T("sliding_host_context_lengths", "int32", [-1], R(batch_size=bs)),
        host_past_key_value_lengths=T("sliding_host_past_key_value_lengths", "int32", [-1], R(batch_size=bs)))}


@dataclass
class StepLayout:
    """How the batch manager packs one step's tokens, as graph tensors: ``bs`` requests, ``is_gen [bs]`` (a
    generation request; the stock runtime's draft_lens is 0 for context requests, K otherwise), the exclusive
    token ``ends`` and ``starts [bs]`` (a context request: its chunk, context_lengths tokens; a generation request:
    [last token] + K draft slots), ``j = [[0..K]]``, and ``anchor_pos [bs]``: the absolute position of the next
    draft block's anchor (a generation request's last token sits at its committed length, sequence_length -
    (K+1); a context request's first new token right after its chunk)."""
    bs: object
    is_gen: object
    ends: object
    starts: object
    j: object
    anchor_pos: object


def step_layout(attention_params, draft_lens, K: int) -> StepLayout:
    att = attention_params
    bs = F.shape(att.sequence_length, 0)
    is_gen = F.gt(draft_lens, 0)                       # the stock runtime: 0 for context requests, K otherwise
    # Tokens per request as the batch manager packs them: a context request its chunk (context_lengths), a
    # generation request [last token] + K draft slots.
    n_tok = F.where(is_gen, K + 1, att.context_lengths)
    ends = F.cumsum(F.cast(n_tok, "int32"), 0)                                 # exclusive ends
    starts = ends - F.cast(n_tok, "int32")
    j = F.unsqueeze(F.arange(0, K + 1, "int32"), 0)                          # [1, K+1]
    # Absolute position of the next draft block's anchor: a generation request's last token sits at its
    # committed length (sequence_length - (K+1)); a context request's first new token right after its chunk.
    anchor_pos = F.where(is_gen, att.sequence_length - (K + 1), att.sequence_length)
    return StepLayout(bs, is_gen, ends, starts, j, anchor_pos)


def mark_outputs(accepted, num_accepted, logits, bs, K: int, mask_token_id: int) -> None:
    """The step's outputs under the runtime's names: ``accepted_tokens [bs, K+1]``, ``num_accepted_tokens`` (the
    accepted drafts and the next token: n + 1), ``accepted_paths`` = 0 and ``next_draft_paths`` the chain (one path),
    ``next_draft_tokens`` placeholders (the next step drafts in the graph), ``next_draft_lens`` = K, ``logits``."""
    zero = F.expand(F.constant(np.zeros(1, np.int32)), dims(bs))
    chain = np.full((1, K + 1, K + 1), -1, np.int32)
    chain[0, 0] = np.arange(K + 1)
    api.mark_output(accepted, "accepted_tokens", "int32")
    api.mark_output(num_accepted, "num_accepted_tokens", "int32")
    api.mark_output(zero, "accepted_paths", "int32")
    api.mark_output(F.expand(F.constant(np.full((1, K), mask_token_id, np.int32)), dims(bs, K)),
                    "next_draft_tokens", "int32")
    api.mark_output(zero + K, "next_draft_lens", "int32")
    api.mark_output(F.expand(F.constant(chain), dims(bs, K + 1, K + 1)), "next_draft_paths", "int32")
    api.mark_output(logits, "logits", "float32")
