"""Build configs and their overrides: every knob validated strictly, ``--set`` through the same validation,
each error one line naming where the value came from."""

from __future__ import annotations

import pytest
import yaml

from dflash2_trt.testing.cli import cli as _cli
from dflash2_trt.testing.cli import one_error_line as _err
from dflash2_trt.config.build import SETTABLE, BuildConfig, parse_set
from dflash2_trt.errors import ConfigError
from dflash2_trt.targets import TARGETS


def test_every_shipped_config_has_every_trtllm_knob():
    for e in TARGETS.values():
        raw = yaml.safe_load(e.build_config_path.read_text())
        for k in ("dtype", "tp_size", "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
                  "kv_cache_free_gpu_mem_fraction", "gpus", "selector", "tokens_per_block", "drafter_window"):
            assert k in raw, (e.key, k)
        cfg = BuildConfig.load(e.build_config_path)
        assert cfg.target == e.key and cfg.block_size == e.block_size


@pytest.mark.parametrize("item,value", [("max_batch_size=32", 32), ("kv_cache_free_gpu_mem_fraction=0.85", 0.85),
                                        ("gpus=[sm_90a]", ["sm_90a"]), ("drafter_window=full", "full"),
                                        ("selector=viterbi", "viterbi")])
def test_parse_set_values_are_yaml(item, value):
    assert parse_set([item]) == {item.split("=")[0]: value}


@pytest.mark.parametrize("items,needle", [
    (["foo=1"], "--set: foo: unknown key"),
    (["target=tiny"], "--set: target: unknown key"),
    (["max_batch_size"], "expected KEY=VALUE"),
    (["max_batch_size="], "empty value"),
    (["max_batch_size=1", "max_batch_size=2"], "given twice"),
    (["gpus=[sm_90a"], "not a YAML scalar or list"),
])
def test_parse_set_rejects(items, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")):
        parse_set(items)


@pytest.mark.parametrize("over,needle", [
    ({"tokens_per_block": 48}, "tokens_per_block: must be a power of two"),
    ({"tokens_per_block": 0}, "tokens_per_block: must be >= 1"),
    ({"kv_cache_free_gpu_mem_fraction": 0}, "kv_cache_free_gpu_mem_fraction: must be a number in (0, 1)"),
    ({"kv_cache_free_gpu_mem_fraction": 1.5}, "kv_cache_free_gpu_mem_fraction"),
    ({"kv_cache_free_gpu_mem_fraction": 1}, "TensorRT-LLM's KV cache manager refuses 1"),
    ({"kv_cache_free_gpu_mem_fraction": "lots"}, "kv_cache_free_gpu_mem_fraction"),
    ({"drafter_window": "half"}, "drafter_window: must be one of model, full"),
    ({"selector": "sample"}, "selector: must be one of greedy, viterbi"),
    ({"gpus": ["sm_80"]}, "gpus: expected a non-empty list"),
    ({"gpus": []}, "gpus: expected a non-empty list"),
    ({"gpus": ["sm_90a", "sm_90a"]}, "gpus"),
    ({"tp_size": 3}, "tp_size: must be 1, 2, 4 or 8"),
    ({"pp_size": 2}, "pp_size: only 1 is supported"),
    ({"block_size": 17}, "block_size: at most 16"),
    ({"block_size": 1}, "block_size: must be >= 2"),
    ({"max_batch_size": 513, "max_num_tokens": 100000}, "max_batch_size: at most 512"),
    ({"max_num_tokens": 31}, "max_num_tokens: 31 < max_batch_size x block_size = 4 x 8 = 32 (every request of a full "
                             "batch runs block_size tokens per step; trtllm-build requires it): raise max_num_tokens "
                             "or lower max_batch_size"),
    ({"max_input_len": 1000}, "max_input_len 1000 exceeds max_seq_len 512"),
    ({"max_input_len": 504}, "max_seq_len 512 leaves no room to generate after a prompt of max_input_len 504: the "
                             "runtime needs prompt"),      # 504 + 1 + 8 = 513 (503 fits exactly)
    ({"dtype": "int8"}, "dtype: must be one of"),
    ({"max_batch_size": True}, "max_batch_size: expected an integer"),
    ({"num_kv_blocks": -1}, "num_kv_blocks: must be >= 0"),
])
def test_overrides_validated_like_the_file_and_named(over, needle):
    path = TARGETS["tiny"].build_config_path
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) as ei:
        BuildConfig.load(path, over)
    assert str(ei.value).startswith("--set: ")


def test_file_errors_name_the_file(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text((TARGETS["tiny"].build_config_path.read_text()) + "tokens_per_blok: 32\n")
    with pytest.raises(ConfigError, match=r"x\.yaml: tokens_per_blok: unknown key"):
        BuildConfig.load(p)
    p.write_text(TARGETS["tiny"].build_config_path.read_text().replace("tokens_per_block: 32", "tokens_per_block: 33"))
    with pytest.raises(ConfigError, match=r"x\.yaml: tokens_per_block: must be a power of two"):
        BuildConfig.load(p)
    p.write_text("dtype: float32\n")
    with pytest.raises(ConfigError, match="x.yaml: target: required"):
        BuildConfig.load(p)
    # a key given twice is refused, not resolved to the last (an audit's build took the second max_batch_size)
    src = TARGETS["tiny"].build_config_path.read_text()
    p.write_text(src + "max_batch_size: 8\n")
    with pytest.raises(ConfigError, match=r"x\.yaml: max_batch_size: given twice \(lines \d+ and \d+\)"):
        BuildConfig.load(p)
    # YAML's own error in one line, with its place
    p.write_text(src + "dtype: [float32\n")
    with pytest.raises(ConfigError) as e:
        BuildConfig.load(p)
    assert "\n" not in str(e.value) and "invalid YAML:" in str(e.value) and "at line" in str(e.value)
    p.write_text(src + "? [a, b]\n: 1\n")           # an unhashable key: YAML's own refusal, one line
    with pytest.raises(ConfigError, match=r"invalid YAML: found unhashable key at line \d+"):
        BuildConfig.load(p)
    # the file of one target naming another
    p.write_text(src)
    with pytest.raises(ConfigError, match="x.yaml: target: 'tiny', but this is the build config of target 'tiny-muse'"):
        BuildConfig.load(p, target_key="tiny-muse")
    assert BuildConfig.load(p, target_key="tiny").target == "tiny"


def test_every_settable_key_is_a_field():
    cfg = BuildConfig.load(TARGETS["tiny"].build_config_path)
    assert set(SETTABLE) == set(cfg.to_dict()) - {"target"}


@pytest.mark.parametrize("args,needle", [
    (["--set", "foo=1"], "--set: foo: unknown key"),
    (["--set", "tokens_per_block=3"], "--set: tokens_per_block: must be a power of two"),
    (["--block-size", "4", "--set", "block_size=5"], "given twice"),
    (["--set", "max_seq_len=4096"], "--set: max_seq_len: max_seq_len 4096 exceeds the target's max_position_embeddings"),
    (["--tp-size", "8"], "num_attention_heads: 4 heads are not divisible by --tp-size 8"),
])
def test_cli_bad_settings_one_line_nothing_written(tmp_path, args, needle):
    out = tmp_path / "eng"
    line = _err(*_cli("build", "--target", "tiny", "--backend", "cpu", "--output", str(out), *args))
    assert needle in line, line
    assert list(tmp_path.iterdir()) == []


def test_cli_unknown_target_and_missing_output(tmp_path):
    assert "unknown target 'tiny2'" in _err(*_cli("build", "--target", "tiny2", "--dry-run"))
    assert "--output: required" in _err(*_cli("build", "--target", "tiny"))

