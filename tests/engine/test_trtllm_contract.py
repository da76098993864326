"""What trtllm-build does with the network file, checked where it can be without TensorRT-LLM, and the real
build (marked ``tensorrt``; skipped where TensorRT-LLM is absent).

trtllm-build (TensorRT-LLM 1.2, ``tensorrt_llm/builder.py``: ``build``) calls ``model.prepare_inputs(**args)``
with exactly the keywords below in EAGLE mode, and the model is made by ``model_cls.from_checkpoint(ckpt_dir,
config=rank_config)`` from the derived build checkpoint's config.json.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math

import pytest

from dflash2_trt.assets import trained_pair

# tensorrt_llm/builder.py, build(): prepare_input_args (+ the EAGLE-mode key)
TRTLLM_BUILD_PREPARE_INPUTS = {
    "max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512 + 14, "use_cache": True, "max_beam_width": 1,
    "max_num_tokens": 1024, "opt_num_tokens": None, "prompt_embedding_table_size": 0, "max_draft_len": 7,
    "speculative_decoding_draft_tokens_external": False, "gather_context_logits": False, "lora_target_modules": [],
    "spec_decoding_is_generation_length_variable": True,
}


def _derived_config(**sets):
    from dflash2_trt.engine.plan import prepare
    from dflash2_trt.engine.pretrained import engine_pretrained_config

    p = trained_pair("qwen3")
    prep = prepare(p.drafter_dir, p.target_dir, target_key="tiny", sets={"drafter_window": "full", **sets})
    return engine_pretrained_config(prep.checkpoint_config, prep.cfg, prep.d)


def test_prepare_inputs_takes_what_trtllm_build_passes():
    from dflash2_trt.trtllm.backend import load_network

    net = load_network("cpu")
    inspect.signature(net.DFlash2ForCausalLM.prepare_inputs).bind(object(), **TRTLLM_BUILD_PREPARE_INPUTS)


@pytest.mark.parametrize("tpb", [16, 64])
def test_block_table_width_comes_from_the_derived_config(tpb):
    """trtllm-build passes no max_blocks_per_seq: the network derives it from dflash2_engine.tokens_per_block of the
    build checkpoint's config.json (which --tokens_per_block must equal)."""
    from dflash2_trt.trtllm.backend import load_network

    net = load_network("cpu")
    pre = _derived_config(tokens_per_block=tpb)
    assert pre["dflash2_engine"]["tokens_per_block"] == tpb
    model = net.DFlash2ForCausalLM(net.api.PretrainedConfig.from_dict(pre))
    decl = model.prepare_inputs(**TRTLLM_BUILD_PREPARE_INPUTS)
    rng = decl["kv_cache_params"].kv_cache_block_offsets.dim_range["max_blocks_per_seq"]
    assert len(rng) == 1, rng                          # one optimization profile: [[min, opt, max]]
    assert rng[0][-1] == math.ceil(TRTLLM_BUILD_PREPARE_INPUTS["max_seq_len"] / tpb)
    assert pre["num_eagle_layers"] == model.K == 7


def test_derived_config_holds_what_the_runtime_reads():
    """gptJsonConfig.cpp (createModelConfig): in EAGLE mode pretrained_config.eagle_net_config.num_hidden_layers is
    added to the layer count that sizes the KV pool; the EAGLE decoder reads num_eagle_layers and
    max_non_leaves_per_layer."""
    pre = _derived_config()
    ck_layers = pre["num_hidden_layers"]
    assert pre["eagle_net_config"]["num_hidden_layers"] == pre["dflash2"]["num_hidden_layers"] == 2
    assert ck_layers + pre["eagle_net_config"]["num_hidden_layers"] == 6   # the pool: 4 target + 2 drafter layers
    assert pre["max_non_leaves_per_layer"] == 1 and pre["max_draft_len"] == pre["num_eagle_layers"] == 7
    json.dumps(pre)


@pytest.mark.tensorrt
@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is None,
                    reason="TensorRT-LLM is not installed (GPU machines: tensorrt-llm 1.2.x from NVIDIA's index, "
                           "TensorRT headers for the plugin library, a Hopper or Blackwell GPU)")
def test_real_trtllm_build_of_tiny_is_verified(tmp_path):   # pragma: no cover - GPU machines
    from dflash2_trt.engine.build import build_engine

    p = trained_pair("qwen3")
    res = build_engine(p.drafter_dir, p.target_dir, tmp_path / "eng", backend="trtllm", target_key="tiny",
                       overrides={"dtype": "float16"}, sets={"drafter_window": "full"}, verify=True)
    assert res.manifest["verify"]["passed"]
    assert (tmp_path / "eng" / "rank0.engine").is_file()
