"""What ``tensorrt_llm.builder.build(model, build_config)`` does between the model and ``Builder.build_engine`` for
dflash2-trt's trtllm-build command line, run inside the conformance harness (facts and sources:
``trtllm_build_steps.yaml`` beside this file; builder.py itself is not in the source directory, so its steps are
re-written here in the order builder.build runs them, each calling the real TensorRT-LLM code where that code was
read: ``_common.check_max_num_tokens``, ``models.modeling_utils.optimize_model``, ``Network``'s inputs/profiles).

Every step appends ``{"step": id, ...what it did}`` to a log; the harness report carries it (``build_steps``), and
tests/trtllm/test_conformance.py checks that the log's step ids are exactly the YAML's.
"""

from __future__ import annotations

from pathlib import Path

import yaml

STEPS_FILE = Path(__file__).resolve().parent / "trtllm_build_steps.yaml"


def load_steps() -> dict:
    return yaml.safe_load(STEPS_FILE.read_text(encoding="utf-8"))


def argv_value(argv, flag, cast=str, default=None):
    """A flag's value; ``default`` (the parser's default, facts trtllm_build_cli.yaml) when the flag is absent."""
    if flag not in argv and default is not None:
        return default
    return cast(argv[argv.index(flag) + 1])


def build_config_from_argv(argv, model_config, plugin_config, log) -> dict:
    """BuildConfig fields from the command line, then builder.build's adjustments before optimize_model_with_config
    (steps ``update_kv_cache_type`` .. ``eagle_limits``)."""
    from tensorrt_llm._common import check_max_num_tokens

    pc = plugin_config
    bc = {"max_batch_size": argv_value(argv, "--max_batch_size", int),
          "max_input_len": argv_value(argv, "--max_input_len", int),
          "max_seq_len": argv_value(argv, "--max_seq_len", int),
          "max_num_tokens": argv_value(argv, "--max_num_tokens", int),
          "max_beam_width": argv_value(argv, "--max_beam_width", int),
          # parser defaults: --max_draft_len 0, no --speculative_decoding_mode = NONE (the --baseline build)
          "max_draft_len": argv_value(argv, "--max_draft_len", int, default=0),
          "opt_num_tokens": None, "max_prompt_embedding_table_size": 0, "gather_context_logits": False,
          "speculative_decoding_mode": argv_value(argv, "--speculative_decoding_mode", default="none"),
          "kv_cache_type": argv_value(argv, "--kv_cache_type")}
    given = dict(bc)
    # BuildConfig.update_kv_cache_type: paged_kv_cache follows kv_cache_type; paged_state is forced False for every
    # architecture but Mamba / RecurrentGemma
    pc.paged_kv_cache = bc["kv_cache_type"] == "paged"
    pc.paged_state = False
    log.append({"step": "update_kv_cache_type", "paged_kv_cache": pc.paged_kv_cache, "paged_state": pc.paged_state})
    # _init_max_seq_len: max_seq_len given; max_input_len clipped to it; check_max_num_tokens (the real one)
    if bc["max_input_len"] > bc["max_seq_len"]:
        bc["max_input_len"] = bc["max_seq_len"]
    bc["max_num_tokens"], bc["opt_num_tokens"] = check_max_num_tokens(
        max_num_tokens=bc["max_num_tokens"], opt_num_tokens=bc["opt_num_tokens"],
        max_batch_size=bc["max_batch_size"], max_input_len=bc["max_input_len"], max_seq_len=bc["max_seq_len"],
        max_beam_width=bc["max_beam_width"], remove_input_padding=pc.remove_input_padding,
        enable_context_fmha=pc.context_fmha, tokens_per_block=pc.tokens_per_block,
        multiple_profiles=pc.multiple_profiles)
    log.append({"step": "init_max_seq_len", "max_input_len": bc["max_input_len"],
                "max_num_tokens": bc["max_num_tokens"], "opt_num_tokens": bc["opt_num_tokens"]})
    # reduce_fusion / user_buffer / norm_quant_fusion: overridden to False unless tp > 1 and a LLaMA-family
    # architecture (ours is not); all three default False
    for f in ("reduce_fusion", "user_buffer", "norm_quant_fusion"):
        setattr(pc, f, False)
    log.append({"step": "fusion_overrides", "reduce_fusion": False, "user_buffer": False, "norm_quant_fusion": False})
    # a config's max_draft_len is taken when the flag left build_config's at 0 (the baseline's config says 0)
    if hasattr(model_config, "max_draft_len") and bc["max_draft_len"] == 0:
        bc["max_draft_len"] = int(model_config.max_draft_len)
    log.append({"step": "max_draft_len_from_config", "max_draft_len": bc["max_draft_len"],
                "flag": given["max_draft_len"], "config": getattr(model_config, "max_draft_len", None)})
    # speculative decoding: max_seq_len += max_draft_len (mode != NONE), += num_eagle_layers (EAGLE, which asserts
    # the config has it); max_num_tokens >= max_batch_size * (max_draft_len + 1) (mode != NONE)
    mode = bc["speculative_decoding_mode"]
    if mode not in ("eagle", "none"):
        raise RuntimeError(f"--speculative_decoding_mode {mode}: the harness models eagle and none")
    if mode == "eagle":
        if not hasattr(model_config, "num_eagle_layers"):
            raise AssertionError("builder.build: EAGLE needs model.config.num_eagle_layers")
        bc["max_seq_len"] += bc["max_draft_len"] + int(model_config.num_eagle_layers)
        bc["max_num_tokens"] = max(bc["max_num_tokens"], bc["max_batch_size"] * (bc["max_draft_len"] + 1))
    log.append({"step": "speculative_max_seq_len", "applied": mode == "eagle", "max_seq_len": bc["max_seq_len"],
                "from": given["max_seq_len"], "max_num_tokens": bc["max_num_tokens"]})
    # context FMHA on, no FP8 quantization: use_fp8_context_fmha forced False; paged context FMHA kept
    pc.use_fp8_context_fmha = False
    log.append({"step": "context_fmha_rules", "use_paged_context_fmha": pc.use_paged_context_fmha,
                "use_fp8_context_fmha": False})
    if mode == "eagle" and (bc["max_batch_size"] > 512 or bc["max_draft_len"] > 256):
        raise AssertionError("builder.build: EAGLE needs max_batch_size <= 512 and max_draft_len <= 256")
    log.append({"step": "eagle_limits", "applied": mode == "eagle", "max_batch_size": bc["max_batch_size"],
                "max_draft_len": bc["max_draft_len"]})
    return bc


def optimize_model_with_config(model, plugin_config, log):
    """builder.optimize_model_with_config for our flags: no LoRA, no swiglu plugin, no auto-parallel, unquantized;
    the real ``optimize_model`` with the arguments builder.py passes."""
    from tensorrt_llm.models.modeling_utils import optimize_model

    pc = plugin_config
    if pc.lora_plugin is not None:
        raise RuntimeError("lora_plugin set: the harness does not model LoRA")
    arch = model.config.architecture
    kw = dict(share_embedding_table=True, use_ootb_moe=pc.moe_plugin is None,
              use_fused_mlp=bool(pc.use_fused_mlp) and arch not in ("EncoderModel", "DecoderModel"),
              gemm_swiglu_plugin_dtype=pc.gemm_swiglu_plugin,
              low_latency_gemm_swiglu_plugin_dtype=pc.low_latency_gemm_swiglu_plugin,
              use_fused_rg_lru=arch == "RecurrentGemmaForCausalLM", use_unfused_qkv_gemm=False,
              use_prompt_tuning=False, use_lora=False, max_lora_rank=None, use_fp8_context_fmha=False,
              fuse_fp4_quant=bool(pc.fuse_fp4_quant), use_optimize_cross_qkv=True, use_dora=bool(pc.dora_plugin))
    before = {n: id(p) for n, p in model.named_parameters()}
    modules_before = {n: type(m).__name__ for n, m in model.named_modules()}
    model = optimize_model(model, **kw)
    after = {n: id(p) for n, p in model.named_parameters()}
    modules_after = {n: type(m).__name__ for n, m in model.named_modules()}
    shared = sorted(n for n in before if n in after and before[n] != after[n])
    log.append({"step": "optimize_model", "arguments": {k: v for k, v in kw.items() if v not in (None, False)},
                "parameters_replaced": shared, "parameters_dropped": sorted(set(before) - set(after)),
                "modules_changed": sorted(n for n in set(modules_before) | set(modules_after)
                                          if modules_before.get(n) != modules_after.get(n))})
    return model


def prepare_input_args(bc) -> dict:
    """builder.build's prepare_inputs keywords (EAGLE adds spec_decoding_is_generation_length_variable)."""
    args = {"max_batch_size": bc["max_batch_size"], "max_input_len": bc["max_input_len"],
            "max_seq_len": bc["max_seq_len"], "use_cache": bc["kv_cache_type"] != "disabled",
            "max_beam_width": bc["max_beam_width"], "max_num_tokens": bc["max_num_tokens"],
            "opt_num_tokens": bc["opt_num_tokens"],
            "prompt_embedding_table_size": bc["max_prompt_embedding_table_size"],
            "max_draft_len": bc["max_draft_len"], "speculative_decoding_draft_tokens_external": False,
            "gather_context_logits": bc["gather_context_logits"], "lora_target_modules": []}
    if bc["speculative_decoding_mode"] == "eagle":
        args["spec_decoding_is_generation_length_variable"] = True
    return args


def fuse_attention_with_bias_matches(real_net, pnet, log) -> int:
    """graph_rewriting.optimize(network) (builder.build runs it for every architecture but DecoderModel): its one
    pass, FuseAttentionWithBiasPass, rewrites a GPTAttention plugin call whose qkv input (a) has exactly one user,
    (b) is made by an ELEMENTWISE SUM whose inputs are one constant-foldable tensor (every path back within 10
    layers ends at an input-less CONSTANT) and one other, (c) with qkv_bias None: the bias moves into the plugin.
    The plugins here are placeholders (ordinary layers), so the real pass cannot see them; this reproduces its
    match on the real graph: the GPTAttention placeholder's first layer takes qkv as its input 0 (fake_trt)."""
    import tensorrt_rtx as rtx

    producer, users = {}, {}
    for i in range(real_net.num_layers):
        layer = real_net.get_layer(i)
        for k in range(layer.num_inputs):
            t = layer.get_input(k)
            if t is not None:
                users[t.name] = users.get(t.name, 0) + 1
        for j in range(layer.num_outputs):
            producer[layer.get_output(j).name] = layer

    def const_foldable(t, depth=0):
        layer = producer.get(t.name)
        if layer is None or depth > 10:
            return False
        if layer.type == rtx.LayerType.CONSTANT and layer.num_inputs == 0:
            return True
        return all(const_foldable(layer.get_input(k), depth + 1) for k in range(layer.num_inputs)
                   if layer.get_input(k) is not None)

    qkvs = getattr(pnet, "_harness_gpt_attention_qkv", None)
    if qkvs is None:
        raise RuntimeError("fake_trt did not record the GPTAttention qkv inputs")
    matches = []
    for n, (qkv, has_bias) in enumerate(qkvs):
        p = producer.get(qkv.name)
        if has_bias or users.get(qkv.name, 0) != 1 or p is None or p.type != rtx.LayerType.ELEMENTWISE:
            continue
        p.__class__ = rtx.IElementWiseLayer
        if p.op != rtx.ElementWiseOperation.SUM:
            continue
        c = [const_foldable(p.get_input(k)) for k in range(p.num_inputs)]
        if sum(c) == 1 and len(c) - sum(c) == 1:
            matches.append(n)
    log.append({"step": "graph_rewriting_optimize", "gpt_attention_calls": len(qkvs),
                "fuse_attention_with_bias_matches": matches})
    return len(matches)


def optimization_profiles(network, log) -> dict:
    """Builder._add_optimization_profile + _validate_named_dimensions (build_engine, before the TensorRT build): one
    profile per entry of the first input's profile list; every input's dim names must have one range per profile.
    Returns the profiles as data (per input: per profile (min, opt, max) of each dimension)."""
    inputs = network._inputs
    counts = {n: len(t.profiles) for n, t in inputs.items() if t.profiles}
    num = len(next(iter(inputs.values())).profiles) if inputs else 0
    ranges, bad = {}, []
    for p in range(num):
        by_dim = {}
        for name, t in inputs.items():
            if not t.profiles:
                continue
            prof = t.profiles[p]
            for d, dim in enumerate(prof.dimension_names):
                by_dim.setdefault(dim, set()).add((prof.min[d], prof.opt[d], prof.max[d]))
        bad += [f"profile {p}: dimension {d} has ranges {sorted(v)}" for d, v in by_dim.items() if len(v) != 1]
    for name, t in inputs.items():
        ranges[name] = [[list(x) for x in zip(pr.min, pr.opt, pr.max)] for pr in t.profiles]
    dynamic = sorted(n for n, rs in ranges.items() if any(r[0] != r[2] for prof in rs for r in prof))
    log.append({"step": "add_optimization_profile", "num_profiles": num,
                "inputs_with_other_profile_counts": sorted(n for n, c in counts.items() if c != num),
                "named_dimension_errors": bad, "inputs_with_a_dynamic_range": dynamic})
    return ranges
