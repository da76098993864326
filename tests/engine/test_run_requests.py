"""`run` on a cpu engine: a request of a prompts file that the engine cannot take is refused before anything runs, in
one line naming the file and its line (as `bench run` names its dataset's), not only the request's task id."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dflash2_trt.cli import main


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.build import build_engine

    pair = trained_pair("qwen3")
    out = tmp_path_factory.mktemp("run") / "eng"
    build_engine(pair.drafter_dir, pair.target_dir, out, target_key="tiny",
                 overrides={"max_seq_len": 64, "max_input_len": 32, "max_num_tokens": 256})
    return out


@pytest.mark.parametrize("line,needle", [
    ({"task_id": "b", "input_ids": [5] * 33}, "request b: prompt of 33 tokens exceeds the engine's max_input_len 32"),
    ({"task_id": "b", "input_ids": [5, 999]}, "request b: token ids [999] outside the vocabulary [0, 256)"),
    ({"task_id": "b", "input_ids": [5, 6], "output_tokens": 60}, "request b: prompt (2) + max new tokens (60)"),
])
def test_a_bad_prompts_line_names_the_file_and_line(engine, tmp_path, line, needle):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"task_id": "a", "input_ids": [5, 6, 7]}) + "\n" + json.dumps(line) + "\n")
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(engine), "--prompts", str(f), "--max-new-tokens", "4"])
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [r.output.strip()]
    assert r.output.startswith(f"error: {f}:2: {needle}"), r.output
