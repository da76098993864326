"""The engine network in TensorRT-LLM's shape: the combined DFlash2 engine (target + DFlash2 drafter + plugins +
in-engine acceptance, ONE step), and the target-only baseline.

Load it with :func:`dflash2_trt.trtllm.backend.load_network` (``load_network("cpu")`` / ``("trtllm")``), never
with a plain ``import``: every module takes its TensorRT-LLM names from ``api = backend.current()`` when it is
imported (:mod:`.common`), so the package is imported once PER BACKEND, as ``dflash2_trt_network_<backend>``
(its modules ``dflash2_trt_network_<backend>.drafter`` ...), while ``backend.using(<backend>)`` is active. This
``__init__`` imports every module eagerly, inside that window. ``trtllm-build --model_cls_file`` gets the class
through ``dflash2_trt/trtllm/model.py``, which loads this package for the current backend; the CPU backend
executes the same modules with the stand-in (:mod:`dflash2_trt.trtllm.backend`).

Modules, as TensorRT-LLM keeps one folder per model family and shared pieces in ``layers/``:

    common.py      the backend's names (api, F), the engine-parameter dataclasses, small graph utilities
    kv_layout.py   the paged KV pool's layout, the per-layer attention windows, the rotary tables
    layers.py      shared blocks: QK-norm attention, gated MLP, RMSNorm variants
    families/      one module per target family (qwen3, qwen3_5, muse_glimmer); TARGET_FAMILIES
    drafter.py     the DFlash2 drafter: draft block, context commit
    selector.py    the selector (DFlash2PairwiseScan) and SELECTOR_PLUGIN_MODE
    verify.py      drafts into the target's input, logit rows per position
    accept.py      the accept step, counter_uniforms, inverse_cdf
    io.py          the engine inputs (prepare_inputs' body), the step's packing, the outputs
    combined.py    DFlash2ForCausalLM: composes the pieces
    target_only.py TargetOnlyForCausalLM: the autoregressive baseline

One engine step for a batch packed as [context requests..., generation requests...]
(docs/architecture.md §3; the EAGLE one-engine contract of ``engine_io.yaml``)::

    draft     block [anchor, MASK x K] per request -> drafter layers (DFlash2DynamicConv around
              each sublayer, attention over the drafter's committed context K/V in the pool)
              -> norm -> target lm_head (positions 1..K) -> output transform -> top-k
              -> DFlash2PairwiseScan -> K drafts + proposal q
    verify    target over the request's tokens, drafts substituted at positions 1..K of every
              generation request (spec-decoding attention, chain mask from the runtime)
    accept    greedy prefix match (T = 0) or rejection sampling with q (T > 0), per request
    commit    fc(taps) of every token of the step -> each drafter layer's k/v -> written to the
              drafter layers' KV slots at the tokens' positions (the accepted ones are then
              committed by the runtime's ``seqLen += num_accepted_tokens``; the rest lie beyond
              the sequence and are overwritten by the next step, never read)
    outputs   accepted_tokens, num_accepted_tokens, accepted_paths = 0, next_draft_tokens
              (placeholders), next_draft_lens = K, next_draft_paths (the chain), logits

A context request (a whole prompt) gets its first token from the last prompt position and its
drafter context for every prompt position; its draft block is computed too (the graph is the same
for every request) but discarded: it is placed after the prompt, where the next step's block goes.

KV layout and attention windows: :mod:`.kv_layout` (the drafter layers are KV layers after the target's in one
paged pool; windows are entries of the runtime's per-layer ``host_max_attention_window_sizes``).

Under TensorRT-LLM 1.2 (not run here; CPU-only machine). Expected to carry over unchanged: the
module tree and parameter names (= the checkpoint's), the layers' constructors, the target's
``gpt_attention`` call, the plugin layers (``plugin_layers.TrtPlugins``: IPluginV3 through
``add_plugin_v3``), the elementwise / where / gather / softmax / cumsum / topk structure of the draft,
accept and output code, shape tensors built with ``concat`` (the stand-in refuses Python lists
holding Tensors, as TensorRT-LLM does). The stand-in holds the network to TensorRT-LLM's recorded signatures and
dtype rules (``trtllm/cpu/api_1_2.yaml``). Relied on but unverified [I]: int64 elementwise math in
:func:`counter_uniforms`, TensorRT's
top-k/argmax tie order (the contract is lower id first), and the memory of ``[bs, K, V]`` fp32 proposal/target
probabilities at a 248k vocabulary (~1.9 GB at bs 64, K 15: to be gathered over the top-k instead).
"""

from __future__ import annotations

if __name__ == "dflash2_trt.trtllm.network":   # a plain import would bind whatever backend `auto` picks
    raise ImportError("dflash2_trt.trtllm.network is loaded once per backend: use "
                      "dflash2_trt.trtllm.backend.load_network('cpu' | 'trtllm')")

from . import accept, combined, common, drafter, families, io, kv_layout, layers, selector, target_only, verify
from .accept import (PRIME, acceptance_uniforms, accepted_tokens, counter_uniforms, greedy_accept,
                     inverse_cdf, leading_true, rejection_sample)
from .combined import DFlash2ForCausalLM
from .common import (F, AttentionParams, KeyValueCacheParams, RecurrentStateParams, SlidingParams, SpecDecodingParams,
                     api, dims, keep_alive, layer_attention_params, local_heads, logit_transform, op_le)
from .drafter import DFlash2Drafter, DFlash2DrafterLayer, DynamicConv, draft_attention_params
from .families import TARGET_FAMILIES
from .families.muse_glimmer import MuseGlimmerDecoderLayer, MuseGlimmerTransformer
from .families.qwen3 import Qwen3DecoderLayer, Qwen3Transformer
from .families.qwen3_5 import GatedDeltaNet, Qwen3_5DecoderLayer, Qwen3_5Transformer, step_state_params
from .io import StepLayout, declare_inputs, mark_outputs, recurrent_inputs, sliding_inputs, step_layout
from .kv_layout import (check_kv_compatible, drafter_kv_split, hf_layer_types, kv_layer_windows, num_kv_layers_of,
                        rope_positions, rope_tables, sliding_context, total_kv_layers)
from .layers import GatedMLP, OffsetRmsNorm, QKNormAttention, WeightlessRmsNorm
from .selector import SELECTOR_PLUGIN_MODE, DFlash2Selector
from .target_only import DROPPED_PREFIXES, TargetOnlyForCausalLM
from .verify import logits_by_position, substitute_drafts
