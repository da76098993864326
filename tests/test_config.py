"""Config validation: published fixtures accepted; every numerics field checked, by name."""

from __future__ import annotations

import copy
import json
import re

import pytest

from dflash2_trt.config import DFlash2Config, TargetConfig, check_pair, pairing_problems
from dflash2_trt.errors import ConfigError, PairingError

from dflash2_trt.testing.fixtures import MUSE_DRAFTER, MUSE_TARGET, QWEN_DRAFTER, QWEN_TARGET


def _load(d):
    return json.loads((d / "config.json").read_text())


def test_published_drafters_accepted():
    q = DFlash2Config.from_hugging_face(QWEN_DRAFTER)
    assert (q.block_size, q.mask_token_id, q.target_layer_ids) == (8, 248070, (5, 19, 33, 47, 61))
    assert (q.conv_kernel_size, q.conv_group_size, q.selector_rank, q.selector_top_k) == (2, 16, 256, 16)
    assert q.output_multiplier is None and q.final_logit_softcapping is None
    assert q.layer_window(0) == 2048 and q.is_causal is False and q.rope_theta == 1e7
    assert q.kernel_projection_out == 1280 and q.max_draft_len == 7
    m = DFlash2Config.from_hugging_face(MUSE_DRAFTER)
    assert m.block_size == 16 and m.output_multiplier == pytest.approx(0.19611613513818404)
    assert m.final_logit_softcapping == 20.0 and m.rms_norm_eps == 1e-5
    assert q.ignored_keys == () and m.ignored_keys == ()


def test_config_dict_not_mutated():
    data = _load(QWEN_DRAFTER)
    before = copy.deepcopy(data)
    DFlash2Config.from_hugging_face(data)
    assert data == before


def _dc(**kw):
    data = _load(QWEN_DRAFTER)
    data["dflash_config"].update(kw)
    return data


def _top(**kw):
    data = _load(QWEN_DRAFTER)
    data.update(kw)
    return data


@pytest.mark.parametrize(
    "data, field",
    [
        (_dc(block_size=1), "dflash_config.block_size"),
        (_dc(block_size="8"), "dflash_config.block_size"),
        (_dc(mask_token_id=248320), "dflash_config.mask_token_id"),
        (_dc(mask_token_id=-1), "dflash_config.mask_token_id"),
        (_dc(target_layer_ids=[5, 64]), "dflash_config.target_layer_ids"),
        (_dc(target_layer_ids=[]), "dflash_config.target_layer_ids"),
        (_dc(target_layer_ids=[5, 5]), "dflash_config.target_layer_ids"),
        (_dc(conv_kernel_size=0), "dflash_config.conv_kernel_size"),
        (_dc(conv_kernel_size=5), "dflash_config.conv_kernel_size"),
        (_dc(conv_group_size=3), "dflash_config.conv_group_size"),
        (_dc(selector_rank=0), "dflash_config.selector_rank"),
        (_dc(selector_top_k=248321), "dflash_config.selector_top_k"),
        (_dc(output_multiplier=-1.0), "dflash_config.output_multiplier"),
        (_dc(final_logit_softcapping=0.0), "dflash_config.final_logit_softcapping"),
        (_dc(input_embedding_scale="x"), "dflash_config.input_embedding_scale"),
        (_dc(new_knob=1), "dflash_config.new_knob"),
        (_top(is_causal="no"), "is_causal"),
        (_top(layer_types=["sliding_attention"] * 4), "layer_types"),
        (_top(layer_types=["chunked_attention"] * 5), "layer_types"),
        (_top(sliding_window=None), "sliding_window"),
        (_top(use_sliding_window=False), "use_sliding_window"),
        (_top(rope_parameters={"rope_theta": 1e7, "rope_type": "yarn"}), "rope_parameters.rope_type"),
        (_top(rope_parameters={"rope_theta": -1.0}), "rope_parameters.rope_theta"),
        (_top(rms_norm_eps=0), "rms_norm_eps"),
        (_top(num_key_value_heads=7), "num_key_value_heads"),
        (_top(architectures=["Qwen3ForCausalLM"]), "architectures"),
        (_top(dtype="int8"), "dtype"),
        (_top(attention_bias=True), "attention_bias"),
        (_top(num_target_layers=0), "num_target_layers"),
    ],
)
def test_bad_drafter_field_named(data, field):
    with pytest.raises(ConfigError) as ei:
        DFlash2Config.from_hugging_face(data)
    assert ei.value.field == field, str(ei.value)
    assert field in str(ei.value)


def test_missing_dflash_config_and_required_fields():
    data = _load(QWEN_DRAFTER)
    del data["dflash_config"]["selector_rank"]
    with pytest.raises(ConfigError, match="dflash_config.selector_rank: required"):
        DFlash2Config.from_hugging_face(data)
    data = _load(QWEN_DRAFTER)
    del data["dflash_config"]
    with pytest.raises(ConfigError, match="dflash_config"):
        DFlash2Config.from_hugging_face(data)


def test_numerics_fields_are_honoured():
    """Each numerics field changes the parsed config (none is silently dropped)."""
    base = DFlash2Config.from_hugging_face(QWEN_DRAFTER)
    changed = {
        "block_size": _dc(block_size=16), "mask_token_id": _dc(mask_token_id=7),
        "target_layer_ids": _dc(target_layer_ids=[1, 2]), "conv_kernel_size": _dc(conv_kernel_size=3),
        "conv_group_size": _dc(conv_group_size=32), "selector_rank": _dc(selector_rank=64),
        "selector_top_k": _dc(selector_top_k=4), "output_multiplier": _dc(output_multiplier=0.5),
        "final_logit_softcapping": _dc(final_logit_softcapping=30.0),
        "input_embedding_scale": _dc(input_embedding_scale=2.0),
        "is_causal": _top(is_causal=True), "sliding_window": _top(sliding_window=512),
        "rms_norm_eps": _top(rms_norm_eps=1e-5),
        "rope_theta": _top(rope_parameters={"rope_theta": 5e5, "rope_type": "default"}),
        "layer_types": _top(layer_types=["full_attention"] * 5),
    }
    for field, data in changed.items():
        cfg = DFlash2Config.from_hugging_face(data)
        assert getattr(cfg, field) != getattr(base, field), field
    full = DFlash2Config.from_hugging_face(changed["layer_types"])
    assert full.layer_window(0) is None and full.sliding_window is None


def test_legacy_rope_and_file_errors(tmp_path):
    data = _load(QWEN_DRAFTER)
    del data["rope_parameters"]
    data["rope_theta"] = 1234.0
    assert DFlash2Config.from_hugging_face(data).rope_theta == 1234.0
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json.*invalid JSON"):
        DFlash2Config.from_hugging_face(tmp_path)
    with pytest.raises(ConfigError, match="nowhere: no such directory"):   # the directory given is what is missing
        DFlash2Config.from_hugging_face(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="config file not found"):
        DFlash2Config.from_hugging_face(tmp_path / "empty")


def test_a_key_given_twice_takes_the_last_value_and_says_so(tmp_path, capsys):
    # json.load (transformers' reading) keeps a repeated key's last value; a hand-edited config that repeats
    # block_size gets the last one here too, with a warning naming the file, the key and both values
    text = (QWEN_DRAFTER / "config.json").read_text()
    assert text.count('"block_size": 8') == 1
    (tmp_path / "config.json").write_text(text.replace('"block_size": 8', '"block_size": 8, "block_size": 16'))
    assert DFlash2Config.from_hugging_face(tmp_path).block_size == 16
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / 'config.json'}: dflash_config.block_size is given more than once, with different " \
           f"values (8, then 16); the last one is used" in err
    # the same value twice changes nothing: no warning
    (tmp_path / "config.json").write_text(text.replace('"block_size": 8', '"block_size": 8, "block_size": 8'))
    assert DFlash2Config.from_hugging_face(tmp_path).block_size == 8
    assert "warning" not in capsys.readouterr().err
    # compared as JSON text: another type is another value; NaN twice is the same one
    (tmp_path / "config.json").write_text(text.replace('"block_size": 8', '"block_size": 8.0, "block_size": 8'))
    DFlash2Config.from_hugging_face(tmp_path)
    assert "dflash_config.block_size is given more than once, with different values (8.0, then 8)" in \
        capsys.readouterr().err
    (tmp_path / "config.json").write_text(text.replace('{', '{"note": NaN, "note": NaN, ', 1))
    DFlash2Config.from_hugging_face(tmp_path)
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "no_such_type", "qwen3_5_text", None, 5])
def test_a_model_type_that_contradicts_the_architecture_is_refused(model_type):
    # transformers' Auto classes build the model from model_type: a Qwen3.8 config saying 'llama' would be verified
    # against a Llama (which has no q/k norms), and 'qwen3_5_text' reads the top level where this layout keeps its
    # fields in text_config; inspect and convert refuse them as build's verify would fail them
    data = _load(QWEN_TARGET)
    assert data["model_type"] == "qwen3_5"
    data["model_type"] = model_type
    with pytest.raises(ConfigError, match=rf"model_type: {re.escape(repr(model_type))} does not match "
                                          r"architectures\[0\] 'Qwen3_5ForConditionalGeneration' \(model_type "
                                          r"'qwen3_5'\)"):
        TargetConfig.from_hugging_face(data)
    del data["model_type"]
    assert TargetConfig.from_hugging_face(data).family == "qwen3_5"


def test_each_architecture_takes_its_own_model_type_only():
    data = _load(QWEN_TARGET)
    text = dict(data["text_config"], architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text")
    assert TargetConfig.from_hugging_face(text).family == "qwen3_5"
    with pytest.raises(ConfigError, match=r"'qwen3_5' does not match architectures\[0\] 'Qwen3_5ForCausalLM' "
                                          r"\(model_type 'qwen3_5_text'\)"):
        TargetConfig.from_hugging_face(dict(text, model_type="qwen3_5"))


def test_published_targets_accepted():
    q = TargetConfig.from_hugging_face(QWEN_TARGET)
    assert q.family == "qwen3_5" and q.weight_prefix == "model.language_model."
    assert q.layer_types.count("linear_attention") == 48 and q.layer_types.count("full_attention") == 16
    assert q.hidden_size == 5120 and q.vocab_size == 248320 and q.rotary_dim == 64
    m = TargetConfig.from_hugging_face(MUSE_TARGET)
    assert m.family == "muse_glimmer" and m.layer_rope_theta[3] == 0.0 and m.qk_scale_factor == 3.87


def test_muse_glimmer_defaults_are_transformers():
    """A Muse Glimmer config that leaves a numerics field out gets transformers' default, not the
    project's generic one (rms_norm_eps is 1e-5 there; layer_rope_theta NoPE on every 4th layer
    from the back); a wrong default would silently convert another model."""
    from transformers.models.muse_glimmer.configuration_muse_glimmer import MuseGlimmerTextConfig

    from dflash2_trt.config.target import MUSE_GLIMMER_DEFAULTS

    hf = MuseGlimmerTextConfig()
    assert MUSE_GLIMMER_DEFAULTS == {k: getattr(hf, k) for k in MUSE_GLIMMER_DEFAULTS}
    data = _load(MUSE_TARGET)
    for k in [*MUSE_GLIMMER_DEFAULTS, "layer_rope_theta"]:
        data["text_config"].pop(k)
    data["text_config"]["num_hidden_layers"] = 6
    data["text_config"]["layer_types"] = data["text_config"]["layer_types"][:6]
    m = TargetConfig.from_hugging_face(data)
    hf = MuseGlimmerTextConfig(num_hidden_layers=6, rope_parameters={"rope_theta": 500000.0, "rope_type": "default"})
    assert m.layer_rope_theta == tuple(float(x) for x in hf.layer_rope_theta) == (500000.0, 0.0, 500000.0, 500000.0,
                                                                                  500000.0, 0.0)
    assert (m.rms_norm_eps, m.qk_scale_factor, m.output_multiplier, m.final_logit_softcapping, m.post_norm_eps) == (
        hf.rms_norm_eps, hf.qk_scale_factor, hf.output_multiplier, hf.final_logit_softcapping, hf.post_norm_eps)
    published = TargetConfig.from_hugging_face(MUSE_TARGET)
    assert published.post_norm_eps == 1e-8 and published.rms_norm_eps == 1e-5
    for bad in ([0.0] * 5, [1.0, -1.0, 0.0, 0.0, 0.0, 0.0], [True] * 6, ["0"] * 6):
        data["text_config"]["layer_rope_theta"] = bad
        with pytest.raises(ConfigError, match="text_config.layer_rope_theta"):
            TargetConfig.from_hugging_face(data)


def test_unsupported_target_architecture_lists_supported():
    data = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8}
    with pytest.raises(ConfigError) as ei:
        TargetConfig.from_hugging_face(data)
    msg = str(ei.value)
    assert "architectures" in msg and "Qwen3ForCausalLM" in msg and "Qwen3_5ForConditionalGeneration" in msg
    with pytest.raises(ConfigError, match="drafter config, not a target"):
        TargetConfig.from_hugging_face(QWEN_DRAFTER)


def test_bad_target_fields_named():
    data = _load(QWEN_TARGET)
    data["text_config"]["layer_types"][0] = "sliding_attention"
    with pytest.raises(ConfigError, match=r"text_config.layer_types: layer 0"):
        TargetConfig.from_hugging_face(data)
    data = _load(QWEN_TARGET)
    data["text_config"]["linear_num_value_heads"] = 17
    with pytest.raises(ConfigError, match="text_config.linear_num_value_heads"):
        TargetConfig.from_hugging_face(data)


def test_published_pairs_fit():
    check_pair(DFlash2Config.from_hugging_face(QWEN_DRAFTER), TargetConfig.from_hugging_face(QWEN_TARGET))
    check_pair(DFlash2Config.from_hugging_face(MUSE_DRAFTER), TargetConfig.from_hugging_face(MUSE_TARGET))


def test_pairing_mismatches_rejected():
    d = DFlash2Config.from_hugging_face(QWEN_DRAFTER)
    t = TargetConfig.from_hugging_face(QWEN_TARGET)
    muse = TargetConfig.from_hugging_face(MUSE_TARGET)
    probs = pairing_problems(d, muse)
    assert any(p.startswith("vocab_size") for p in probs)
    assert any(p.startswith("hidden_size") for p in probs)
    assert any(p.startswith("num_target_layers") for p in probs)
    with pytest.raises(PairingError, match="vocab_size"):
        check_pair(d, muse)
    # fc input width must be len(target_layer_ids) x target hidden
    assert any(p.startswith("fc.weight") for p in pairing_problems(d, t, fc_weight_shape=(5120, 5120 * 4)))
    assert not pairing_problems(d, t, fc_weight_shape=(5120, 5120 * 5))
    # dtype, layer ids and mask id against a smaller target
    tdata = _load(QWEN_TARGET)
    tdata["text_config"]["dtype"] = "float16"
    assert any(p.startswith("dtype") for p in pairing_problems(d, TargetConfig.from_hugging_face(tdata)))
    tdata = _load(QWEN_TARGET)
    tdata["text_config"]["num_hidden_layers"] = 60
    tdata["text_config"]["layer_types"] = tdata["text_config"]["layer_types"][:60]
    probs = pairing_problems(d, TargetConfig.from_hugging_face(tdata))
    assert any("target_layer_ids" in p and "[61]" in p for p in probs)
    tdata = _load(QWEN_TARGET)
    tdata["text_config"]["vocab_size"] = 248000
    tdata["text_config"]["eos_token_id"] = tdata["text_config"]["bos_token_id"] = 2   # 248044: outside the vocab
    probs = pairing_problems(d, TargetConfig.from_hugging_face(tdata))
    assert any("mask_token_id" in p for p in probs)
