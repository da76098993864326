"""``DFlash2ForCausalLM``: target + DFlash2 drafter + plugins + in-engine acceptance, ONE engine step.

The class trtllm-build builds (``--model_cls_name DFlash2ForCausalLM``, through ``trtllm/model.py``) and the CPU
engine runs. It reads the checkpoint ``dflash2-trt convert`` writes (names: ``dflash2_trt/convert/{qwen3,
dflash2}.py``; config: ``convert/schema.py``). ``forward`` composes the pieces of this package in the order of
the step (the package docstring has the whole picture)::

    draft     drafter.draft_hidden -> target lm_head -> output transform -> selector.propose
    verify    verify.substitute_drafts -> target transformer -> lm_head -> verify.logits_by_position
    accept    accept.acceptance_uniforms -> accept.accept -> accept.accepted_tokens
    commit    the Gated DeltaNet layers' accepted counts (the next step folds them into the state); drafter.commit
              (context K/V)
    outputs   io.mark_outputs
"""

from __future__ import annotations

from .accept import accept, acceptance_uniforms, accepted_tokens
from .common import F, api, keep_alive, logit_transform
from .drafter import DFlash2Drafter
from .families import TARGET_FAMILIES
from .families.qwen3_5 import step_state_params
from .io import declare_inputs, mark_outputs, step_layout
from .kv_layout import check_kv_compatible
from .selector import SELECTOR_PLUGIN_MODE
from .verify import logits_by_position, substitute_drafts


class DFlash2ForCausalLM(api.PretrainedModel):
    """Target + DFlash2 drafter + acceptance in one engine (EAGLE one-engine contract)."""

    def __init__(self, config):
        super().__init__(config)
        if api.name == "trtllm":   # pragma: no cover - TensorRT-LLM only
            # trtllm-build has no plugin flag: the model class file loads the DFlash2 plugin library itself
            # (DFLASH2_PLUGIN_LIB, or the build directories dflash2_trt.plugins searches); build with --workers 1.
            from dflash2_trt.plugins import load_library

            load_library()
        check_kv_compatible(config)
        if config.qwen_type not in TARGET_FAMILIES:
            raise ValueError(f"qwen_type {config.qwen_type!r}: no engine network yet (have "
                             f"{', '.join(TARGET_FAMILIES)})")
        d, m = config.dflash2, config.mapping
        self.K = d["block_size"] - 1
        self.transformer = TARGET_FAMILIES[config.qwen_type](config)
        self.lm_head = api.layers.ColumnLinear(config.hidden_size, config.vocab_size, bias=False, dtype=config.dtype,
                                               tp_group=m.tp_group, tp_size=m.tp_size, gather_output=True)
        self.dflash2 = DFlash2Drafter(config)
        eng = getattr(config, "dflash2_engine", None) or {}
        self.selector_mode = SELECTOR_PLUGIN_MODE[eng.get("selector", "greedy")]
        self.drafter_window = eng.get("drafter_window", "model")
        self.max_seq_len = int(eng.get("max_seq_len", config.max_position_embeddings))

    def prepare_inputs(self, max_batch_size: int, max_num_tokens: int, max_seq_len: int,
                       max_blocks_per_seq: int | None = None, num_kv_layers: int | None = None,
                       tokens_per_block: int | None = None, **unused):
        """Every engine input, with dim ranges (names and shapes: ``engine_io.yaml``; :func:`.io.declare_inputs`).
        trtllm-build calls it with its own keyword set (max_batch_size, max_input_len, max_seq_len, max_num_tokens,
        max_draft_len, ...); the rest is ignored."""
        return declare_inputs(self.config, self.K, getattr(self.transformer, "recurrent", False), max_batch_size,
                              max_num_tokens, max_seq_len, max_blocks_per_seq, num_kv_layers, tokens_per_block)

    def forward(self, input_ids, last_token_ids, kv_cache_params, attention_params, spec_decoding_params,
                draft_lens, eagle_temperature, rand_data_validation, rand_data_sample,
                host_gen_eagle_net_request_types, recurrent_params=None, sliding_params=None,
                all_reduce_workspace=None):
        # all_reduce_workspace (tp > 1): the all-reduce plugins take it through TensorRT-LLM's all-reduce helper
        # (set when prepare_inputs declared it), not from here
        K, d, cfg = self.K, self.config.dflash2, self.config
        att, kvp, spec = attention_params, kv_cache_params, spec_decoding_params
        step = step_layout(att, draft_lens, K)
        recurrent = getattr(self.transformer, "recurrent", False)

        # ---- 1. draft: K drafts + proposal q per request --------------------------------------------
        anchor = F.index_select(input_ids, 0, step.starts)                          # [bs]
        hid = self.dflash2.draft_hidden(anchor, self.transformer.vocab_embedding, att, kvp, spec,
                                        host_gen_eagle_net_request_types, step.is_gen, step.bs)
        unary = logit_transform(F.cast(self.lm_head(hid), "float32"), d["output_multiplier"],
                                d["final_logit_softcapping"])
        drafts, q, cand, temperature = self.dflash2.selector.propose(
            unary, hid, anchor, step.anchor_pos, step.j, eagle_temperature, rand_data_sample, K=K,
            top_k=d["selector_top_k"], mode=self.selector_mode)

        # ---- 2. verify: the target over the step's tokens, drafts in the draft slots ---------------
        target_ids = substitute_drafts(input_ids, drafts, step, K)
        if recurrent:
            rs, saved = step_state_params(recurrent_params, att, step.ends, step.is_gen), []
            final, layer_outs = self.transformer(target_ids, att, kvp, spec, rs, saved)
        else:
            # sliding_params (the context route): the target's sliding-window layers attend with the second set
            final, layer_outs = self.transformer(target_ids, att, kvp, spec, sliding_params)
        # The runtime's logits rows: last_token_ids is the inclusive scan of logits per request (a context
        # request 1 at its last token, a generation request K+1), i.e. row r is token last_token_ids[r] - 1.
        # The target's own logit transform follows (Muse Glimmer). [num_logits, V]
        logits = logit_transform(F.cast(self.lm_head(F.index_select(final, 0, last_token_ids - 1)), "float32"),
                                 getattr(cfg, "output_multiplier", None), getattr(cfg, "final_logit_softcapping", None))
        logits3, vocab = logits_by_position(logits, step, K)                         # [bs, K+1, V]

        # ---- 3. accept -----------------------------------------------------------------------------
        u = acceptance_uniforms(rand_data_validation, step.anchor_pos, step.j, step.bs)   # [bs, K+1]
        n, nxt = accept(logits3, drafts, q, cand, temperature, u, step.is_gen, step.bs, vocab, K)
        accepted = accepted_tokens(drafts, n, nxt, step.j, step.bs, K)

        # ---- 4. commit: recurrent state over the accepted tokens, drafter context for every token --------
        # layers run for what they write (state, KV), not for their outputs. Generation requests: anchor + n accepted
        # drafts (deferred: the next step's forward folds them into the state; every step whose forward ran must run
        # the commit); context requests: done
        state_commits = [gdn.commit(keep, F.cast(n + 1, "int32"), rs) for gdn, keep in saved] if recurrent else []
        drafter_writes = self.dflash2.commit(layer_outs, att, kvp, spec)
        # TensorRT removes layers whose outputs reach no network output: num_accepted_tokens depends on each commit
        num_accepted = keep_alive(n + 1, counts=state_commits, values=drafter_writes)

        # ---- 5. outputs ----------------------------------------------------------------------------
        mark_outputs(accepted, num_accepted, logits, step.bs, K, d["mask_token_id"])
        return accepted
