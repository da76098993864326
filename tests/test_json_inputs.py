"""A JSON file a user hands the commands that the parser cannot take (nested deeper than its recursion, an integer of
more digits than Python converts) is one error line naming the file, like any other invalid JSON, not a traceback
(a fuzzing review found both in every reader: config.json, prompts files, engine.json)."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash2_trt.engine.common import read_prompts_file
from dflash2_trt.errors import ConfigError
from dflash2_trt.testing.cli import cli, one_error_line
from dflash2_trt.textfiles import json_loads

NESTED = "[" * 100_000 + "]" * 100_000
LONG_INT = '{"task_id": 1, "input_ids": [1' + "0" * 5000 + '], "output_tokens": 4}'


def test_json_loads_raises_json_errors():
    with pytest.raises(json.JSONDecodeError, match="nested deeper than 900 levels"):
        json_loads(NESTED)
    with pytest.raises(json.JSONDecodeError, match="a number too long"):
        json_loads(LONG_INT)
    assert json_loads('{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(json.JSONDecodeError):
        json_loads("{bad")


def test_a_prompts_file_with_a_huge_number_names_its_line(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text(LONG_INT + "\n")
    with pytest.raises(ConfigError, match=r"p\.jsonl: line 1: invalid JSON \(a number too long"):
        read_prompts_file(p)


def test_a_config_nested_too_deeply_is_one_line(tiny_dense, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(tiny_dense.target_dir, target)
    (target / "config.json").write_text(NESTED)
    line = one_error_line(*cli("inspect", "--drafter", str(tiny_dense.drafter_dir), "--target-dir", str(target)))
    assert "config.json" in line and "invalid JSON at line 1 column 901: nested deeper than 900 levels" in line, line
