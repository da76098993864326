"""trtllm-bench's dataset line, written from TensorRT-LLM 1.2's sources (independently of the writer):

- ``tensorrt_llm/bench/utils/data.py: create_dataset_from_stream`` reads the stream line by line
  (``stream.readline()``, ``json.loads(line)``: one complete JSON object per line, no newline inside),
  takes ``data["task_id"]`` and ``data["output_tokens"]`` (KeyError when absent) and
  ``data.get("input_ids", data.get("logits"))`` or tokenizes ``data["prompt"]``;
- ``tensorrt_llm/bench/dataclasses/general.py: InferenceRequest``: ``task_id: int``,
  ``output_tokens: int``, ``input_ids: Optional[List[int]]`` (alias ``logits``), ``prompt:
  Optional[str]``, and a validator refusing a request with neither prompt nor input_ids.

``validate_line`` raises AssertionError naming the first violation; pydantic's lax mode would also
take numeric strings, this check is strict (what the writer must produce).
"""

from __future__ import annotations

import json

KNOWN = {"task_id", "prompt", "output_tokens", "input_ids", "logits", "lora_request", "turns", "category",
         "question_id", "media_paths"}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate_line(line: str) -> dict:
    assert line and "\n" not in line, "one JSON object per line"
    d = json.loads(line)
    assert isinstance(d, dict), "a line is a JSON object"
    assert set(d) <= KNOWN, f"unknown keys {sorted(set(d) - KNOWN)}"
    assert "task_id" in d and _is_int(d["task_id"]), "task_id: int is required"
    assert "output_tokens" in d and _is_int(d["output_tokens"]), "output_tokens: int is required"
    ids = d.get("input_ids", d.get("logits"))
    if ids is not None:
        assert isinstance(ids, list) and all(_is_int(t) for t in ids), "input_ids: List[int]"
    if d.get("prompt") is not None:
        assert isinstance(d["prompt"], str), "prompt: str"
    assert ids is not None or d.get("prompt") is not None, "neither prompt nor input_ids"
    return d


def validate_file(path) -> list[dict]:
    text = open(path, encoding="utf-8").read()
    assert text.endswith("\n"), "newline-terminated lines"
    return [validate_line(ln) for ln in text.split("\n")[:-1]]
