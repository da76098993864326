"""Small helpers the engine modules and the benchmarks share, with no engine-package imports: the
prompts-file reader (``run --prompts``, ``bench``), the stop ids and tokenizer an engine directory
names, the EAGLE chain every TensorRT-LLM request passes, and a shell line for a printed command."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ..errors import ConfigError
from ..textfiles import json_loads, read_utf8
from ..tokenizer import engine_tokenizer_dir, find_tokenizer, refuse_chat_without_text


def text_origin(item: dict) -> dict:
    """Where a request item's prompt text came from, as :func:`~dflash2_trt.tokenizer.encode_text`'s ``source`` and
    ``field`` for an error about it: a prompts file's ``FILE:LINE`` and its ``prompt`` field, or the command-line option
    that gave it (``--prompt``) alone."""
    where = item.get("where")
    if where is not None and where.startswith("--"):
        return {"source": None, "field": where}
    return {"source": where, "field": "prompt"}


def read_prompts_file(path: str | Path) -> list[dict]:
    """trtllm-bench dataset lines: ``{"task_id", "input_ids" | "prompt", "output_tokens"}``, one JSON object per line.
    ``task_id`` (an integer or a string; the line's index among the prompts when absent) names the request in
    every report (``run --json``, ``bench run --save-outputs``), so two lines may not share one."""
    path = Path(path)
    lines = read_utf8(path, bom=True).splitlines()
    out = []
    seen: dict[object, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json_loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"line {n}: invalid JSON ({exc.msg})", source=path) from None
        if not isinstance(d, dict):
            raise ConfigError(f"line {n}: expected an object", source=path)
        unknown = sorted(set(d) - {"task_id", "input_ids", "prompt", "output_tokens"})
        if unknown:
            raise ConfigError(f"line {n}: unknown key {unknown[0]!r}", source=path)
        if ("input_ids" in d) == ("prompt" in d):
            raise ConfigError(f"line {n}: give exactly one of input_ids or prompt", source=path)
        ids = d.get("input_ids")
        if ids is not None and (not isinstance(ids, list) or not ids
                                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
            raise ConfigError(f"line {n}: input_ids must be a non-empty list of non-negative integers", source=path)
        if "prompt" in d and not isinstance(d["prompt"], str):
            raise ConfigError(f"line {n}: prompt must be a string", source=path)
        ot = d.get("output_tokens")
        if ot is not None and (not isinstance(ot, int) or isinstance(ot, bool) or ot < 1):
            raise ConfigError(f"line {n}: output_tokens must be an integer >= 1", source=path)
        tid = d.get("task_id", len(out))
        if not isinstance(tid, (int, str)) or isinstance(tid, bool):
            raise ConfigError(f"line {n}: task_id must be an integer or a string, got {json.dumps(tid)}", source=path)
        key = str(tid)      # 1 and "1" are printed alike (`run`'s [1], the reports' task ids): one request's name
        if key in seen:
            given = "" if "task_id" in d else " (the line's index, given no task_id)"
            first_n, first = seen[key]
            alike = "" if first == tid else f" ({json.dumps(first)} there: the two print alike)"
            raise ConfigError(f"line {n}: task_id {json.dumps(tid)}{given} repeats line {first_n}'s{alike}: each "
                              f"request needs its own", source=path)
        seen[key] = (n, tid)
        out.append({"task_id": tid, "input_ids": ids, "prompt": d.get("prompt"),
                    "output_tokens": ot, "where": f"{path}:{n}"})
    if not out:
        raise ConfigError("no prompts", source=path)
    return out


def check_requests(checker, items, requests) -> None:
    """Every request fits the engine (``checker.check``: :meth:`~dflash2_trt.runtime.Runtime.check`) before anything
    runs; one that does not is named by where it came from (``items[i]["where"]``: ``FILE:LINE`` of a prompts file or
    dataset, or the option), not only by its task id."""
    for item, r in zip(items, requests):
        try:
            checker.check(r)
        except ConfigError as exc:
            raise ConfigError(str(exc), source=item["where"]) from None


def stop_ids(man: dict, vocab: int) -> tuple[int, ...]:
    """The target's eos_token_id(s), recorded in engine.json at build time (``generate`` stops on the same)."""
    return tuple(int(e) for e in man.get("eos_token_ids") or () if 0 <= int(e) < vocab)


def prompt_tokenizer(man: dict, engine_dir):
    d = engine_tokenizer_dir(engine_dir, man)   # the engine's own copy first, else the target dir
    tok = None if d is None else find_tokenizer(d, strict=True)   # a corrupt one is not "none"
    if tok is None:
        raise ConfigError("--prompt needs a tokenizer (the engine's tokenizer/ or its target directory); this engine "
                          "has none: use --prompt-ids or a prompts file with input_ids", field="--prompt")
    return tok


def run_tokenizer(man: dict, engine_dir, items: list[dict], chat=None):
    """The tokenizer of a ``run``: with any prompt text, the one it needs (:func:`prompt_tokenizer`, an error where
    there is none); with token ids only, the one every output is decoded with, as ``generate`` prints the text of an id
    prompt: the engine's, or None where there is no usable one (the ids are the output then, and a tokenizer that does
    not load is no reason to fail the run). ``chat`` (``--chat``) with no prompt text at all is refused."""
    has_text = any(it["prompt"] is not None for it in items)
    refuse_chat_without_text(chat, has_text, "every prompt here is token ids (--prompt-ids, or input_ids lines)")
    if has_text:
        return prompt_tokenizer(man, engine_dir)
    d = engine_tokenizer_dir(engine_dir, man)
    return None if d is None else find_tokenizer(d)


def run_report(engine_dir, reqs, rt, wall: float, tokenizer=None, **head) -> dict:
    """The ``run`` report of requests the project's runtime ``rt`` finished in ``wall`` seconds: ``head`` (engine,
    backend, block size, ..., and ``kv_pool`` where the engine says how its pool was sized) then every request (with its
    text when there is a tokenizer) and the totals."""
    out = []
    for r in reqs:
        d = r.to_dict()
        if tokenizer is not None:
            d["text"] = tokenizer.decode(r.output_ids)
        out.append(d)
    n_tok = sum(len(r.output_ids) for r in reqs)
    acc = [a for r in reqs for a in r.acceptance_lengths]
    sizing = getattr(rt.engine, "pool_sizing", None)   # the engine's or TensorRT session's: how its KV pool was sized
    if sizing is not None:   # and the longest request it takes
        head["kv_pool"] = {**sizing, "token_capacity": rt.token_capacity, "max_seq_len": rt.max_seq_len}
    return {"engine_dir": str(engine_dir), **head, "max_batch_size": rt.max_batch_size, "requests": out,
            "totals": {"requests": len(reqs), "output_tokens": n_tok, "steps": rt.step_count,
                       # steps in which a prompt was cut (chunked context: it did not fit what the step had left)
                       "chunked_steps": sum(1 for s in rt.step_log if s.get("cut")),
                       "generation_steps": len(acc), "mean_acceptance": sum(acc) / len(acc) if acc else None,
                       "wall_s": wall, "output_tokens_per_s": n_tok / wall if wall > 0 else None}}


def eagle_choices(K: int) -> list[list[int]]:
    """The linear chain every request/executor must pass: ``[[0], [0, 0], ..., [0] * K]``."""
    return [[0] * (i + 1) for i in range(K)]


def shell_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    pre = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    return (pre + " " if pre else "") + shlex.join(argv)


def greedy_outputs(engine, prompts, new: int, *, eos=()) -> list[list[int]]:
    """Greedy new tokens per prompt through an opened engine (or TensorRT session) with the project runtime, which
    is closed afterwards: a verify gate's engine side."""
    from ..runtime import Request, Runtime

    try:
        reqs = [Request(list(p), new, stop_token_ids=tuple(eos), task_id=i) for i, p in enumerate(prompts)]
        Runtime(engine).generate(reqs)
        return [r.output_ids for r in reqs]
    finally:
        engine.close()
