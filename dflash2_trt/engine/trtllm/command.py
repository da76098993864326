"""The trtllm-build command line and what it is given: the argv (TensorRT-LLM 1.2 flags) run through
:data:`BUILD_ENTRY`, the environment the model class file needs, the CUDA architectures of the plugin build, the
engine ``config.json`` trtllm-build writes (as far as the runtime reads it), and where the converted checkpoint
is kept beside the engine directory. The builder (:mod:`.build`) runs them; the dry run
(:mod:`dflash2_trt.engine.plan`) prints them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from ...trtllm.backend import MODEL_FILE

MODEL_CLS_NAME = "DFlash2ForCausalLM"
BASELINE_CLS_NAME = "TargetOnlyForCausalLM"   # build --baseline: the target alone (trtllm/network/target_only.py)


def model_cls_file() -> Path:
    return MODEL_FILE


TIMING_CACHE = "model.cache"   # trtllm-build --output_timing_cache: a file in the temporary build checkpoint

BUILD_ENTRY = "dflash2_trt.trtllm.register"
"""The module run as trtllm-build: registers the DFlash2 architectures in TensorRT-LLM's MODEL_MAP (the bare
``trtllm-build`` stops at config parsing with a KeyError), then runs ``tensorrt_llm.commands.build.main()``."""


def trtllm_build_argv(cfg, *, checkpoint_dir, output_dir, python: str | None = None,
                      target_only: bool = False) -> list[str]:
    """The trtllm-build command line (TensorRT-LLM 1.2 flags, ``tensorrt_llm/commands/build.py``), run through
    :data:`BUILD_ENTRY` with ``python`` (default: this interpreter, where tensorrt_llm must import). Every flag is
    spelt in full and every value is one trtllm-build's parser takes (``facts/trtllm_build_cli.yaml``, the options
    of ``parse_arguments`` / ``add_plugin_argument``; tests/engine/test_trtllm_build_cli.py parses this argv with
    a parser built from that record). ``target_only``: the baseline engine of ``build --baseline`` (class
    :data:`BASELINE_CLS_NAME`, no speculative decoding mode and no draft length; the same limits and plugins).
    ``checkpoint_dir`` is the temporary build checkpoint: trtllm-build's timing cache is written there too, so that
    nothing lands in the working directory."""
    K = cfg.block_size - 1
    spec = [] if target_only else ["--speculative_decoding_mode", "eagle", "--max_draft_len", str(K)]
    return [
        python or sys.executable, "-m", BUILD_ENTRY, "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(output_dir),
        "--model_cls_file", str(model_cls_file()), "--model_cls_name", BASELINE_CLS_NAME if target_only
        else MODEL_CLS_NAME, *spec,
        "--max_batch_size", str(cfg.max_batch_size), "--max_input_len", str(cfg.max_input_len),
        "--max_seq_len", str(cfg.max_seq_len), "--max_num_tokens", str(cfg.max_num_tokens), "--max_beam_width", "1",
        "--kv_cache_type", "paged", "--tokens_per_block", str(cfg.tokens_per_block),
        "--gpt_attention_plugin", "auto", "--gemm_plugin", "auto", "--context_fmha", "enable",
        "--use_paged_context_fmha", "enable", "--remove_input_padding", "enable",
        "--logits_dtype", "float32", "--workers", "1",
        # builder.build saves TensorRT's timing cache at this path as given; its default, model.cache, is relative to
        # trtllm-build's working directory: the user's (facts check timing_cache_written). In the build checkpoint
        # directory it goes with it, once the engine is built.
        "--output_timing_cache", str(Path(checkpoint_dir) / TIMING_CACHE),
    ]


def trtllm_engine_config(pre: dict, cfg, *, target_only: bool = False) -> dict:
    """The engine ``config.json`` trtllm-build writes from the build checkpoint's config (``pre``, kept whole as
    ``pretrained_config``) and :func:`trtllm_build_argv`'s flags, as far as the runtime reads it [inferred from
    ``tensorrt_llm/commands/build.py`` and ``plugin.py`` defaults; the real file is trtllm-build's]. What the
    runtime-rule emulation (:mod:`.runtime_rules`) parses. ``target_only``: the baseline engine's (no speculative
    decoding mode: NONE = 1, no draft slots, max_seq_len as given: facts ``speculative_sizes``)."""
    K = 0 if target_only else cfg.block_size - 1
    # "auto" plugins are written as "auto": PluginConfig resolves "auto" to its dtype when a field is READ
    # (__getattribute__), and the engine's config is its model_dump (plugin.py c20322ff, builder.py BuildConfig.to_dict;
    # seen in the config.json the real trtllm-build main() wrote over TensorRT-RTX, scripts/trtllm_real_build.py)
    return {"version": "1.2", "pretrained_config": pre, "build_config": {
        "max_batch_size": cfg.max_batch_size, "max_input_len": cfg.max_input_len, "max_seq_len": cfg.max_seq_len + 2 * K,
        "max_num_tokens": cfg.max_num_tokens, "max_beam_width": 1, "max_draft_len": K,
        "speculative_decoding_mode": 1 if target_only else 32, "kv_cache_type": "PAGED", "lora_config": {},
        "plugin_config": {"gpt_attention_plugin": "auto", "gemm_plugin": "auto", "remove_input_padding": True,
                          "paged_kv_cache": True, "tokens_per_block": cfg.tokens_per_block, "context_fmha": True,
                          "use_paged_context_fmha": True, "lora_plugin": None, "mamba_conv1d_plugin": "auto",
                          # BuildConfig.update_kv_cache_type: False for every architecture but Mamba/RecurrentGemma
                          "paged_state": pre.get("architecture") in STATE_ARCHITECTURES}}}


# builder.py (store id 205252225) BuildConfig.update_kv_cache_type: these architectures take paged_state from
# kv_cache_type; every other one has paged_state overridden to False ("Overriding paged_state to False")
STATE_ARCHITECTURES = ("MambaForCausalLM", "RecurrentGemmaForCausalLM")


def engine_config_fixes(engine: dict) -> list[dict]:
    """What ``dflash2-trt build`` changes in the config.json trtllm-build wrote, in place; returns the changes
    (``{"field", "from", "to", "why"}``), recorded in the engine's manifest.

    An engine with recurrent layers (the hybrid target: ``layer_types`` holds "recurrent") gets
    ``build_config.plugin_config.paged_state`` true. trtllm-build writes False for any architecture but
    Mamba / RecurrentGemma (:data:`STATE_ARCHITECTURES`), while the runtime's RnnStateManager refuses a model
    without paged state at start-up (facts/gptJsonConfig.yaml ``state_manager_requires``). The flag describes the
    engine truly: its network takes each layer's state as the state manager's per-slot pointers (paged state)
    whatever trtllm-build's plugin config says (trtllm/network/io.py ``rnn_state_ptr_*``)."""
    pre = engine.get("pretrained_config") or {}
    plugin = (engine.get("build_config") or {}).get("plugin_config")
    fixes = []
    if "recurrent" in (pre.get("layer_types") or []) and isinstance(plugin, dict) and plugin.get("paged_state") is not True:
        fixes.append({"field": "build_config.plugin_config.paged_state", "from": plugin.get("paged_state"), "to": True,
                      "why": "trtllm-build sets it False for every architecture but Mamba/RecurrentGemma "
                             "(BuildConfig.update_kv_cache_type); the runtime's RnnStateManager refuses a model "
                             "without paged state; the network reads the state through per-slot pointers"})
        plugin["paged_state"] = True
    return fixes


def trtllm_build_env(plugin_lib, extra: dict | None = None) -> dict[str, str]:
    """What the model class file needs in trtllm-build's process: the plugin library (trtllm-build has no
    plugin flag; the network's DFlash2ForCausalLM loads it, trtllm/network/combined.py) and the TensorRT-LLM backend of
    the network; ``extra``: what TensorRT-LLM itself must see while it configures the attention (xqa.py: the XQA
    kernels it compiles then go into the engine)."""
    return {"DFLASH2_PLUGIN_LIB": str(plugin_lib), "DFLASH2_TRT_BACKEND": "trtllm", **(extra or {})}


def cuda_archs(gpus) -> str:
    """CMAKE_CUDA_ARCHITECTURES for the build config's ``gpus`` (``sm_90a`` -> ``90a``)."""
    return ";".join(g.removeprefix("sm_") for g in gpus)


def default_checkpoint_dir(output) -> Path:
    """Where the TensorRT-LLM backend keeps the converted checkpoint: beside the engine dir."""
    output = Path(output)
    return output.with_name(output.name + ".checkpoint")
