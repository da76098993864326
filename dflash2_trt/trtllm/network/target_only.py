"""The target alone, one token per generation request per step: the autoregressive baseline.

``dflash2-trt bench`` compares speculative decoding with plain autoregressive decoding of the SAME
target on the SAME executor. On the CPU backend that is this network, run by the same CPU stand-in
of TensorRT-LLM and driven by the same CPU runtime (``runtime/runtime.py``) as the combined engine
(:mod:`.combined`): the only difference between the two runs is speculation.

What it shares with the combined engine (this package, loaded once per backend): the target
transformer class (``TARGET_FAMILIES[qwen_type]``, e.g. ``Qwen3Transformer``, :mod:`.families`), the
engine-parameter dataclasses (:mod:`.common`), ``inverse_cdf`` (sampling, :mod:`.accept`), and the
``lm_head`` layout (``ColumnLinear`` gathered over the TP ranks). It reads the same combined
checkpoint ``dflash2-trt convert`` writes and drops the drafter's tensors (``dflash2.*``, :data:`DROPPED_PREFIXES`) deliberately; any other missing or
unknown tensor is an error, as in ``PretrainedModel.load``.

One step, for a batch packed as [context requests..., generation requests...]::

    target    the request's new tokens (a whole prompt, or the last emitted token) -> logits of
              the request's last token
    sample    greedy argmax where eagle_temperature < 1e-5 (accept.decoding_temperature), else inverse-CDF sampling of
              softmax(logits / T) with the runtime's ``rand_data_sample`` uniform
    outputs   the EAGLE output contract with K = 0: accepted_tokens [bs, 1], num_accepted_tokens
              = 1, accepted_paths = 0, next_draft_tokens [bs, 0], next_draft_lens = 0,
              next_draft_paths [bs, 1, 1] = 0, logits [bs, V]

With K = 0 the runtime's bookkeeping is exactly autoregressive decoding (``seqLen += 1``, the next
step feeds the emitted token back). Attention runs WITHOUT speculative-decoding parameters (plain
causal generation attention): a generation request has one new token. The EAGLE-only inputs the
runtime still fills (``rand_data_validation``, ``draft_lens``, ``host_gen_eagle_net_*``, the
spec-decoding inputs, positions) are accepted and unused: positions follow from the KV lengths.

A baseline network for measurement. The stand-in backends (cpu, cuda) build it from the engine directory's
checkpoint when ``bench run`` asks; ``build --backend trtllm --baseline`` builds it with trtllm-build
(``--model_cls_name TargetOnlyForCausalLM``, no ``--speculative_decoding_mode``) into the engine directory's
``baseline/``, which ``bench run`` drives through the project runtime over TensorRT (``bench/session.py``). Its
inputs are the combined engine's with K = 0, so the project runtime's feed is the same code for both.
"""

from __future__ import annotations

import numpy as np

from .accept import decoding_temperature, inverse_cdf
from .io import declare_inputs
from .common import F, SpecDecodingParams, api, dims, keep_alive
from .families import TARGET_FAMILIES
from .families.qwen3_5 import step_state_params

DROPPED_PREFIXES = ("dflash2.",)
"""Checkpoint tensors the target-only network does not read: the drafter (convert's ``dflash2.`` prefix)."""


class TargetOnlyForCausalLM(api.PretrainedModel):
    """Target transformer + lm_head; next token sampled in the graph (see the module docstring)."""

    def __init__(self, config):
        super().__init__(config)
        if api.name == "trtllm":   # pragma: no cover - TensorRT-LLM only
            # as the combined engine: trtllm-build has no plugin flag, and a hybrid target's Gated DeltaNet layers
            # are the DFlash2 plugin library's (DFLASH2_PLUGIN_LIB)
            from dflash2_trt.plugins import load_library

            load_library()
        if config.qwen_type not in TARGET_FAMILIES:
            raise ValueError(f"qwen_type {config.qwen_type!r}: no target network yet (have "
                             f"{', '.join(TARGET_FAMILIES)})")
        m = config.mapping
        self.K = 0
        self.transformer = TARGET_FAMILIES[config.qwen_type](config)
        self.lm_head = api.layers.ColumnLinear(config.hidden_size, config.vocab_size, bias=False, dtype=config.dtype,
                                               tp_group=m.tp_group, tp_size=m.tp_size, gather_output=True)

    def prepare_inputs(self, max_batch_size: int, max_num_tokens: int, max_seq_len: int,
                       max_blocks_per_seq: int | None = None, num_kv_layers: int | None = None,
                       tokens_per_block: int | None = None, **unused):
        """The combined engine's inputs with K = 0 (the KV pool keeps the combined engine's layer count)."""
        return declare_inputs(self.config, 0, getattr(self.transformer, "recurrent", False), max_batch_size,
                              max_num_tokens, max_seq_len, max_blocks_per_seq, num_kv_layers, tokens_per_block)

    ignored_weight_prefixes = DROPPED_PREFIXES   # the combined checkpoint's drafter tensors; the rest strict

    def forward(self, input_ids, last_token_ids, kv_cache_params, attention_params, spec_decoding_params=None,
                eagle_temperature=None, rand_data_validation=None, rand_data_sample=None, recurrent_params=None,
                sliding_params=None, **unused_eagle_inputs):
        # With K = 0 every request has exactly one logit row, so last_token_ids has one entry per request
        # (the inclusive scan of the tokens per request: a prompt, or the one generation token).
        bs = F.shape(attention_params.sequence_length, 0)
        plain = SpecDecodingParams(spec_decoding_is_generation_length_variable=False,
                                   spec_decoding_max_generation_length=1)        # no spec-decoding attention
        ends = F.cast(last_token_ids, "int32")                                   # exclusive ends of the requests
        recurrent = getattr(self.transformer, "recurrent", False)
        if recurrent:                 # hybrid target: its Gated DeltaNet layers read and advance the state slots
            if recurrent_params is None:
                raise ValueError("a recurrent target needs the runtime's recurrent-state inputs")
            # the combined engine's state parameters, zero_state included: a prompt's first chunk starts from zeros
            # whatever the reused slot holds (TensorRT-LLM never zeroes a slot). With K = 0 no request is marked as
            # generating (draft_lens is 0 for all), and none needs to be: a generation request feeds one token
            # after at least its prompt, so its sequence_length exceeds its context_lengths.
            rs = step_state_params(recurrent_params, attention_params, ends, F.gt(ends, ends))
            saved = []
            final, _ = self.transformer(input_ids, attention_params, kv_cache_params, plain, rs, saved)
        else:
            # the context route (sliding_params): a generation request's one token is a context chunk of one in the
            # sliding-window layers, whose caches are then written and read at absolute positions in every step
            final, _ = self.transformer(input_ids, attention_params, kv_cache_params, plain, sliding_params)
        last = ends - 1                                                          # each request's last token
        logits = F.cast(self.lm_head(F.index_select(final, 0, last)), "float32")  # [bs, V]

        greedy = F.cast(F.argmax(logits, 1), "int32")
        temperature = decoding_temperature(eagle_temperature)                  # 0 below 1e-5: greedy
        sampled = F.gt(temperature, 0.0)
        t_safe = F.where(sampled, temperature, 1.0)
        probs = F.softmax(logits * F.unsqueeze(F.div(1.0, t_safe), 1), 1)      # no reverse division on a Tensor
        drawn = F.cast(inverse_cdf(probs, F.cast(rand_data_sample, "float32")), "int32")
        nxt = F.where(sampled, drawn, greedy)

        def zeros():   # [bs] int32 zeros, a distinct tensor per output (TensorRT names a tensor: one output each)
            return F.expand(F.constant(np.zeros(1, np.int32)), dims(bs))

        zero = zeros()
        accepted = zero + 1
        if recurrent:                 # a generation request's one token is always kept: commit it
            # TensorRT removes a layer no output depends on, and the commits exist for their writes (as in the
            # combined engine): num_accepted_tokens depends on each of them
            accepted = keep_alive(accepted, counts=[gdn.commit(keep, zero + 1, rs) for gdn, keep in saved])
        api.mark_output(F.unsqueeze(nxt, 1), "accepted_tokens", "int32")
        api.mark_output(accepted, "num_accepted_tokens", "int32")
        api.mark_output(zero, "accepted_paths", "int32")
        # [bs, 0] as a slice: TensorRT refuses an empty constant (api_1_2.yaml dtype_rules constant_empty)
        api.mark_output(F.slice(F.unsqueeze(zero, 1), [0, 0], dims(bs, 0)), "next_draft_tokens", "int32")
        api.mark_output(zeros(), "next_draft_lens", "int32")
        api.mark_output(F.expand(F.constant(np.zeros((1, 1, 1), np.int32)), dims(bs, 1, 1)), "next_draft_paths",
                        "int32")
        api.mark_output(logits, "logits", "float32")
        return nxt
