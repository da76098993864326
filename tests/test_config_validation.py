"""Config fields that used to slip through (issue 9 QA): scaled RoPE next to ``rope_parameters``,
quantized checkpoints, token ids outside the vocabulary, strings where transformers wants ints or
bools. Each is one ConfigError naming the file and field, the same in every command."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from dflash2_trt.cli import main
from dflash2_trt.config import DFlash2Config, TargetConfig
from dflash2_trt.errors import ConfigError
from dflash2_trt.testing.fixtures import QWEN_DRAFTER, QWEN_TARGET

TINY = {"qwen3": "dflash2_trt/assets/tiny/qwen3", "qwen3_5": "dflash2_trt/assets/tiny/qwen3_5"}
YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256}


def _cfg(path) -> dict:
    return json.loads((path / "config.json").read_text())


def _text(c: dict) -> dict:
    return c["text_config"] if "text_config" in c else c


def _parse(side: str, c: dict):
    return (DFlash2Config if side == "drafter" else TargetConfig).from_hugging_face(c)


@pytest.fixture(scope="module")
def cfgs(tiny_dense, tiny_hybrid):
    return {"drafter": _cfg(tiny_dense.drafter_dir), "qwen3": _cfg(tiny_dense.target_dir),
            "qwen3_5": _cfg(tiny_hybrid.target_dir)}


# ---- RoPE ------------------------------------------------------------------------------------------

ROPE_CASES = {
    "rope_scaling next to rope_parameters": (lambda c: c.update(rope_scaling=YARN), "rope_scaling.rope_type"),
    "legacy 'type' inside rope_parameters": (
        lambda c: c["rope_parameters"].update(type="yarn", factor=2.0), "rope_parameters.type"),
    "rope_type yarn": (lambda c: c["rope_parameters"].update(rope_type="yarn", factor=2.0), "rope_parameters.rope_type"),
    "legacy rope_scaling 'type'": (lambda c: (c.pop("rope_parameters"), c.update(rope_theta=1e4, rope_scaling={
        "type": "linear", "factor": 2.0})), "rope_scaling.type"),
    "rope_scaling not an object": (lambda c: c.update(rope_scaling="yarn"), "rope_scaling"),
}


@pytest.mark.parametrize("which", ["drafter", "qwen3", "qwen3_5"])
@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_scaled_rope_is_refused_everywhere(cfgs, which, case):
    """transformers applies ``rope_scaling`` even beside ``rope_parameters`` (and reads ``type``),
    so `generate` ran yarn while `convert` wrote ``rotary_scaling: null``."""
    edit, field = ROPE_CASES[case]
    c = json.loads(json.dumps(cfgs[which]))
    edit(_text(c))
    prefix = "text_config." if "text_config" in c else ""
    with pytest.raises(ConfigError) as ei:
        _parse("drafter" if which == "drafter" else "target", c)
    assert ei.value.field == prefix + field, str(ei.value)


def test_default_rope_scaling_is_fine(cfgs):
    for which in ("drafter", "qwen3"):
        c = json.loads(json.dumps(cfgs[which]))
        c["rope_scaling"] = {"rope_type": "default"}
        assert _parse("drafter" if which == "drafter" else "target", c).rope_type == "default"


def test_published_configs_still_accepted():
    DFlash2Config.from_hugging_face(QWEN_DRAFTER)
    TargetConfig.from_hugging_face(QWEN_TARGET)


# ---- quantization, token ids, types ----------------------------------------------------------------

QUANT = {"quant_method": "fp8", "fmt": "e4m3"}


@pytest.mark.parametrize("which, where", [("drafter", "top"), ("qwen3", "top"), ("qwen3_5", "top"),
                                          ("qwen3_5", "text")])
def test_quantized_checkpoints_refused(cfgs, which, where):
    c = json.loads(json.dumps(cfgs[which]))
    (c if where == "top" else _text(c))["quantization_config"] = QUANT
    with pytest.raises(ConfigError, match="quantized checkpoints are not supported") as ei:
        _parse("drafter" if which == "drafter" else "target", c)
    assert ei.value.field == ("text_config." if where == "text" else "") + "quantization_config"


@pytest.mark.parametrize("which", ["drafter", "qwen3", "qwen3_5"])
@pytest.mark.parametrize("key, value", [("eos_token_id", 256), ("eos_token_id", -1), ("eos_token_id", [2, 999]),
                                        ("pad_token_id", 300), ("pad_token_id", [0, 256])])
def test_token_ids_outside_the_vocabulary(cfgs, which, key, value):
    c = json.loads(json.dumps(cfgs[which]))
    _text(c)[key] = value
    with pytest.raises(ConfigError, match=r"outside the vocabulary \[0, 256\)") as ei:
        _parse("drafter" if which == "drafter" else "target", c)
    assert ei.value.field.endswith(key)


def test_top_level_eos_of_a_wrapper_is_checked_too(cfgs):
    c = json.loads(json.dumps(cfgs["qwen3_5"]))
    c["eos_token_id"] = [2, 4096]
    with pytest.raises(ConfigError) as ei:
        TargetConfig.from_hugging_face(c)
    assert ei.value.field == "eos_token_id"
    c["eos_token_id"] = [2, 3]
    assert TargetConfig.from_hugging_face(c).eos_token_ids == (2,)  # the text config's own wins


TYPE_CASES = [
    ("drafter", "hidden_size", "64"), ("drafter", "tie_word_embeddings", "false"), ("drafter", "use_cache", "yes"),
    ("drafter", "eos_token_id", "2"), ("drafter", "initializer_range", "x"), ("drafter", "attention_dropout", None),
    ("qwen3", "hidden_size", "64"), ("qwen3", "tie_word_embeddings", "false"),
    ("qwen3", "use_sliding_window", "false"),   # bool("false") is True: sliding layers out of nowhere
    ("qwen3", "use_cache", "true"), ("qwen3", "bos_token_id", "1"), ("qwen3", "initializer_range", "0.02"),
    ("qwen3", "max_window_layers", "28"), ("qwen3", "attention_dropout", "0.0"), ("qwen3", "attention_bias", "false"),
    ("qwen3", "output_hidden_states", "no"), ("qwen3_5", "use_cache", 1), ("qwen3_5", "attn_output_gate", "true"),
    ("qwen3_5", "full_attention_interval", "4"),
]


@pytest.mark.parametrize("which, key, value", TYPE_CASES)
def test_wrong_json_types_named(cfgs, which, key, value):
    """These were huggingface_hub StrictDataclassFieldValidationError tracebacks (raised while
    transformers built the model), or silently accepted."""
    c = json.loads(json.dumps(cfgs[which]))
    if value is None:   # null is always fine for an optional field
        _text(c)[key] = None
        _parse("drafter" if which == "drafter" else "target", c)
        return
    if key == "full_attention_interval":
        _text(c).pop("layer_types")
    _text(c)[key] = value
    with pytest.raises(ConfigError) as ei:
        _parse("drafter" if which == "drafter" else "target", c)
    assert ei.value.field == ("text_config." if "text_config" in c else "") + key, str(ei.value)
    assert repr(value) in str(ei.value)


def test_transformers_validation_is_a_config_error_too(cfgs):
    """Whatever transformers itself refuses when the meta model is built is a ConfigError, not a
    traceback (the backstop behind the project's own field checks)."""
    import transformers

    from dflash2_trt.checkpoint.inventory import _hf_config, expected_target_tensors

    c = json.loads(json.dumps(cfgs["qwen3"]))
    c["id2label"] = "zz"
    with pytest.raises(ConfigError, match="transformers rejects the config"):
        expected_target_tensors(TargetConfig.from_hugging_face(c))
    c = json.loads(json.dumps(cfgs["qwen3_5"]))
    t = TargetConfig.from_hugging_face(c)
    with pytest.raises(ConfigError) as ei:
        _hf_config(transformers.Qwen3_5TextConfig, dict(_text(c), use_cache="true"), t)
    assert ei.value.field == "text_config.use_cache" and "\n" not in str(ei.value)


# ---- the same line from every command ----------------------------------------------------------------

def _commands(d, t, out):
    pair = ["--drafter", str(d), "--target-dir", str(t)]
    return {
        "inspect": ["inspect", *pair],
        "convert": ["convert", *pair, "--output", str(out)],
        "generate": ["generate", *pair, "--prompt-ids", "1,2,3", "--max-new-tokens", "2"],
        "analyze": ["analyze", *pair, "--max-prompts", "1", "--no-measure"],
    }


@pytest.mark.parametrize("side, key, value, field", [
    ("target", "rope_scaling", YARN, "rope_scaling.rope_type"),
    ("drafter", "rope_scaling", YARN, "rope_scaling.rope_type"),
    ("target", "quantization_config", QUANT, "quantization_config"),
    ("target", "use_cache", "true", "use_cache"),
    ("target", "eos_token_id", 999, "eos_token_id"),
    ("drafter", "tie_word_embeddings", "false", "tie_word_embeddings"),
])
def test_every_command_gives_the_same_line(tiny_dense, tmp_path, side, key, value, field):
    d, t = tmp_path / "drafter", tmp_path / "target"
    shutil.copytree(tiny_dense.drafter_dir, d)
    shutil.copytree(tiny_dense.target_dir, t)
    victim = d if side == "drafter" else t
    c = _cfg(victim)
    c[key] = value
    (victim / "config.json").write_text(json.dumps(c))
    lines = {}
    for name, args in _commands(d, t, tmp_path / "out").items():
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (name, r.output, r.exception)
        lines[name] = r.output.strip()
    assert len(set(lines.values())) == 1, lines
    line = lines["inspect"]
    assert line.startswith(f"error: {victim / 'config.json'}: {field}: ") and "\n" not in line
    assert not (tmp_path / "out").exists()


# ---- target_layer_ids order ------------------------------------------------------------------------------

def test_unsorted_target_layer_ids_are_honoured_in_order(tiny_dense, tmp_path):
    """Listed order is concatenation order (like transformers/NeMo): listing the taps [2, 0]
    instead of [0, 2] changes the drafter's context features, unless fc's input columns are
    permuted to match, in which case the features are the same. The order is kept, never sorted,
    by the config, the reference and the converter."""
    from safetensors.torch import load_file, save_file

    from dflash2_trt.convert import convert_pair
    from dflash2_trt.reference.drafter import DFlash2Drafter, extract_taps
    from dflash2_trt.reference.loop import load_target

    h = 64
    variants = {}
    for name, permute in (("listed", False), ("swapped", False), ("swapped+fc", True)):
        d = tmp_path / name
        shutil.copytree(tiny_dense.drafter_dir, d)
        if name != "listed":
            c = _cfg(d)
            assert c["dflash_config"]["target_layer_ids"] == [0, 2]
            c["dflash_config"]["target_layer_ids"] = [2, 0]
            (d / "config.json").write_text(json.dumps(c))
        if permute:
            sd = load_file(str(d / "model.safetensors"))
            fc = sd["fc.weight"]
            sd["fc.weight"] = torch.cat([fc[:, h:], fc[:, :h]], dim=1).contiguous()
            save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
        variants[name] = DFlash2Drafter.from_pretrained(d)
    assert variants["swapped"].cfg.target_layer_ids == (2, 0)

    target = load_target(tiny_dense.target_dir)
    with torch.no_grad():
        hs = target(torch.tensor([[1, 5, 9, 13, 17]]), output_hidden_states=True).hidden_states
        feats = {k: v.context_features(extract_taps(hs, v.cfg.target_layer_ids)) for k, v in variants.items()}
    taps = extract_taps(hs, (2, 0))
    assert torch.equal(taps[..., :h], hs[3]) and torch.equal(taps[..., h:], hs[1])   # hidden_states[id + 1]
    torch.testing.assert_close(feats["swapped+fc"], feats["listed"], rtol=1e-5, atol=1e-6)
    assert (feats["swapped"] - feats["listed"]).abs().max() > 0.1

    convert_pair(tmp_path / "swapped", tiny_dense.target_dir, tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["dflash2"]["target_layer_ids"] == [2, 0]


def _with_generation_config(tmp_path, tiny_dense, text: str):
    d = tmp_path / "target"
    d.mkdir()
    shutil.copy(tiny_dense.target_dir / "config.json", d / "config.json")
    (d / "generation_config.json").write_text(text)
    return d


@pytest.mark.parametrize("eos,want", [([2, 14], (2, 14)), (14, (14,)), (None, (2,)), ([], (2,)), ("absent", (2,))])
def test_the_eos_ids_are_generation_configs_where_it_names_them(tiny_dense, tmp_path, eos, want):
    """Hugging Face's generate stops at generation_config.json's eos_token_id (Qwen3's lists two), not config.json's
    (2 here). A generation_config.json that names none leaves config.json's (HF would stop at none: docstring)."""
    d = _with_generation_config(tmp_path, tiny_dense, json.dumps({"eos_token_id": eos} if eos != "absent" else {}))
    assert TargetConfig.from_hugging_face(d).eos_token_ids == want
    assert TargetConfig.from_hugging_face(d / "config.json").eos_token_ids == want


def test_the_eos_ids_match_what_transformers_loads(tiny_dense, tmp_path):
    from transformers import GenerationConfig

    d = _with_generation_config(tmp_path, tiny_dense, json.dumps({"eos_token_id": [2, 14], "bos_token_id": 1}))
    assert list(TargetConfig.from_hugging_face(d).eos_token_ids) == GenerationConfig.from_pretrained(d).eos_token_id


@pytest.mark.parametrize("text,needle", [('{"eos_token_id": [2, 14', "invalid JSON"), ("[]", "must be an object"),
                                         ('{"eos_token_id": "2"}', "expected a token id"),
                                         ('{"eos_token_id": [2, 999]}', r"outside the vocabulary \[0, 256\)")])
def test_a_bad_generation_config_is_one_error_naming_it(tiny_dense, tmp_path, text, needle):
    d = _with_generation_config(tmp_path, tiny_dense, text)
    with pytest.raises(ConfigError, match=needle) as ei:
        TargetConfig.from_hugging_face(d)
    assert "generation_config.json" in str(ei.value) and "\n" not in str(ei.value)


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path):
    """A stray byte in a hand-edited build config or config.json ended in a UnicodeDecodeError traceback (the readers
    caught only OSError; a new user's review)."""
    import shutil

    from click.testing import CliRunner

    from dflash2_trt.assets import trained_pair
    from dflash2_trt.cli import main
    from dflash2_trt.config.build import BuildConfig
    from dflash2_trt.targets import get_target

    yml = tmp_path / "tiny.yaml"
    yml.write_bytes(get_target("tiny").build_config_path.read_bytes() + b"\xff\xfe\n")
    with pytest.raises(ConfigError) as e:
        BuildConfig.load(yml, target_key="tiny")
    assert str(e.value).startswith(f"{yml}: not UTF-8 text (byte "), str(e.value)
    pair = trained_pair("qwen3")
    drafter = tmp_path / "drafter"
    shutil.copytree(pair.drafter_dir, drafter)
    (drafter / "config.json").write_bytes((drafter / "config.json").read_bytes() + b"\xff")
    r = CliRunner().invoke(main, ["build", "--drafter", str(drafter), "--target-dir", str(pair.target_dir),
                                  "--backend", "cpu", "--dry-run"])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1, r.output
    assert lines[0].startswith(f"error: {drafter / 'config.json'}: not UTF-8 text (byte "), r.output
