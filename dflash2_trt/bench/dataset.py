"""``dflash2-trt bench prepare-dataset``: a dataset in trtllm-bench's JSON-lines format.

One JSON object per line, no newline inside a line (``tensorrt_llm/bench/utils/data.py:
create_dataset_from_stream`` reads line by line; ``tensorrt_llm/bench/dataset/utils.py:
generate_text_dataset`` writes ``json.dumps(d, separators=(",", ":"))``)::

    {"task_id": 0, "input_ids": [187, 95, 235], "output_tokens": 64}

``task_id`` (int) and ``output_tokens`` (int) are required by trtllm-bench's ``InferenceRequest``;
``input_ids`` (token ids) or ``prompt`` (text it tokenizes itself) carries the prompt. This writer
always writes token ids (tokenized here with the target's tokenizer, no special tokens added —
the rule every command of this project uses), so the benchmark does not depend on how another tool
tokenizes.

Sources (exactly one):

- ``builtin``: a shipped prompt set, one per registered tiny pair (``tiny`` / ``tiny-hybrid`` / ``tiny-muse``: its
  trained pair's ``prompts.json``);
- ``prompts``: a prompts file (``analyze``'s format: a JSON list, ``{"prompts": [...]}`` or JSON
  lines; each prompt a list of token ids or a string);
- ``corpus``: a UTF-8 text file, one prompt per non-empty line, tokenized;
- ``token-norm-dist`` / ``token-unif-dist``: synthetic prompts of random token ids with normally /
  uniformly distributed input and output lengths, as trtllm-bench's own synthetic datasets:
  lengths ``max(1, ceil(normal(mean, stdev)))`` (numpy's legacy generator seeded with ``seed``) or
  integers in [min, max] (``numpy.random.default_rng(seed)``); tokens drawn without replacement
  from the vocabulary (with replacement when longer than it; Python's ``random`` seeded with
  ``seed``), stop tokens (EOS) replaced by the next id. Same seed, same file.

Prompt sources repeat their prompts in order to reach ``num_requests`` (or keep the first
``num_requests``), each with ``output_tokens`` new tokens.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from .. import tokenizer as tk
from ..assets import ASSET_ROOT
from ..config import TargetConfig
from ..engine.common import read_prompts_file
from ..errors import ConfigError, DFlash2Error
from ..targets import fixtures_dir, get_target, resolve_dirs, tiny_targets
from ..tokenizer import chat_report, encode_text, find_tokenizer, refuse_chat_without_text
from .common import engine_backend
from .io import atomic_write_text, check_output_file

SOURCES = ("builtin", "prompts", "corpus", "token-norm-dist", "token-unif-dist")
BUILTIN = tiny_targets()
"""The shipped prompt sets: every registered tiny pair's (target key -> its trained pair's folder)."""
LENGTH_OPTIONS = {"token-norm-dist": ("input_mean", "input_stdev", "output_mean", "output_stdev"),
                  "token-unif-dist": ("input_min", "input_max", "output_min", "output_max")}
"""The length options each synthetic source reads (``--input-mean`` ...); any other source reads none of them."""


def builtin_prompts_path(name: str) -> Path:
    if name not in BUILTIN:
        raise ConfigError(f"unknown built-in prompt set {name!r}; known: {', '.join(BUILTIN)}", field="--builtin")
    return ASSET_ROOT / BUILTIN[name] / "prompts.json"


def check_builtin_language(builtin: str, tgt: dict | None, described: str) -> None:
    """A shipped prompt set is token ids of the tiny pairs' phrase language (one tokenizer for all three): refused for
    a target that speaks another (``tgt``: :func:`resolve_target`'s, or None for a registered target that is not a
    tiny pair; ``described``: how the user named it). The tokenizer decides where there is one (the same file, the
    same language), else the vocabulary size."""
    own = ASSET_ROOT / BUILTIN[builtin] / "target"
    own_vocab = TargetConfig.from_hugging_face(own).vocab_size
    if tgt is None:
        same, theirs_said = False, "a published model's vocabulary"
    else:
        theirs = None if tgt["tokenizer_dir"] is None else Path(tgt["tokenizer_dir"]) / "tokenizer.json"
        if theirs is not None and theirs.is_file():
            same = theirs.read_bytes() == (own / "tokenizer.json").read_bytes()
        else:
            same = tgt["vocab_size"] == own_vocab
        theirs_said = f"vocabulary {tgt['vocab_size']:,}"
    if not same:
        raise ConfigError(f"{builtin!r} is token ids of the tiny pairs' phrase language (vocabulary {own_vocab}); "
                          f"{described} speaks another ({theirs_said}): give it prompts with --prompts, --corpus or "
                          f"--synthetic", field="--builtin")


def _need_int(value, field: str, lo: int = 1) -> int:
    if value is None:
        raise ConfigError("is required for this source", field=field)
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ConfigError(f"must be an integer >= {lo}, got {value!r}", field=field)
    return value


def norm_lengths(mean: int, stdev: int, n: int, seed: int) -> list[int]:
    import numpy as np

    rs = np.random.RandomState(seed)
    return [max(1, math.ceil(x)) for x in rs.normal(loc=mean, scale=stdev, size=n).tolist()]


def unif_lengths(lo: int, hi: int, n: int, seed: int) -> list[int]:
    import numpy as np

    return [int(x) for x in np.random.default_rng(seed).integers(low=lo, high=hi + 1, size=n).tolist()]


def random_tokens(lengths: list[int], vocab_size: int, stop_ids, seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    stops = {int(s) for s in stop_ids if 0 <= int(s) < vocab_size}
    if len(stops) >= vocab_size:
        raise ConfigError("every token of the vocabulary is a stop token", field="--synthetic")
    out = []
    for n in lengths:
        ids = rnd.sample(range(vocab_size), n) if n < vocab_size else rnd.choices(range(vocab_size), k=n)
        fixed = []
        for t in ids:
            while t in stops:
                t = (t + 1) % vocab_size
            fixed.append(t)
        out.append(fixed)
    return out


MAX_NUM_REQUESTS = 1_000_000
MAX_LENGTH = 1 << 20          # tokens in one request's prompt or output: past every context length
MAX_TOTAL_TOKENS = 1 << 27    # prompt tokens in one dataset (made in memory: ~134 M ids, a few GB as Python lists)


def _at_most(value: int, limit: int, field: str) -> None:
    if value > limit:
        raise ConfigError(f"must be at most {limit:,} tokens (past every model's context; a dataset is made in memory), "
                          f"got {value:,}", field=field)


def _cycle(prompts: list[list[int]], n: int | None) -> list[list[int]]:
    if n is None:
        return prompts
    return [prompts[i % len(prompts)] for i in range(n)]


def prepare_dataset(*, source: str, output, builtin: str | None = None, prompts_file=None, corpus=None,
                    tokenizer_dir=None, vocab_size: int | None = None, stop_ids=(), num_requests: int | None = None,
                    output_tokens: int | None = 64, max_input_len: int | None = None, seed: int = 0,
                    input_mean=None, input_stdev=None, output_mean=None, output_stdev=None, input_min=None,
                    input_max=None, output_min=None, output_max=None, force: bool = False, chat=None) -> dict:
    """Write the dataset (atomically) and return a summary ``{"output", "requests", ...}``. An existing
    ``output`` is replaced only with ``force`` (``--force``), as every other writer's output. ``chat``: text prompts
    (``--prompts`` strings, ``--corpus`` lines) through the target's chat template before they are encoded
    (:class:`~dflash2_trt.tokenizer.ChatFormat`): the file holds the ids a chat request has, as trtllm-bench's
    datasets hold ids."""

    if source not in SOURCES:
        raise ConfigError(f"unknown source {source!r}; one of {', '.join(SOURCES)}", field="source")
    lengths = {"input_mean": input_mean, "input_stdev": input_stdev, "output_mean": output_mean,
               "output_stdev": output_stdev, "input_min": input_min, "input_max": input_max,
               "output_min": output_min, "output_max": output_max}
    applies = LENGTH_OPTIONS.get(source, ())
    stray = [k for k, v in lengths.items() if v is not None and k not in applies]
    if stray:   # refused, not ignored: the file would not have the lengths asked for
        owner = next(src for src, ks in LENGTH_OPTIONS.items() if stray[0] in ks)
        raise ConfigError(f"applies to --synthetic {owner} only, not to "
                          f"--{'synthetic ' + source if source in LENGTH_OPTIONS else source}",
                          field="--" + stray[0].replace("_", "-"))
    if chat is not None and source not in ("prompts", "corpus"):
        raise ConfigError(f"puts prompt text through the chat template: --{source if source == 'builtin' else 'synthetic'}"
                          f" prompts are token ids (--prompts or --corpus take text)", field="--chat")
    out = check_output_file(output, field="--output")
    if (out.exists() or out.is_symlink()) and not force:
        raise ConfigError(f"{out} exists (pass --force to replace it)", field="--output")
    if num_requests is not None:
        _need_int(num_requests, "--num-requests")
        if num_requests > MAX_NUM_REQUESTS:   # the dataset is made in memory: a typo of a few digits exhausted it
            raise ConfigError(f"must be at most {MAX_NUM_REQUESTS:,} (a benchmark dataset is made in memory), got "
                              f"{num_requests:,}", field="--num-requests")
    if max_input_len is not None:
        _need_int(max_input_len, "--max-input-len")
    if not isinstance(seed, int) or seed < 0 or seed >= 2**32:
        raise ConfigError(f"must be in [0, 2**32), got {seed!r}", field="--seed")
    if source in ("token-norm-dist", "token-unif-dist"):
        n = _need_int(num_requests, "--num-requests")
        if vocab_size is None:
            raise ConfigError("synthetic datasets need the target's vocabulary: give --target, --target-dir or "
                              "--engine-dir", field="--synthetic")
        if source == "token-norm-dist":
            i_mean, o_mean = _need_int(input_mean, "--input-mean"), _need_int(output_mean, "--output-mean")
            i_sd, o_sd = _need_int(input_stdev, "--input-stdev", 0), _need_int(output_stdev, "--output-stdev", 0)
            for v, f in ((i_mean, "--input-mean"), (o_mean, "--output-mean"), (i_sd, "--input-stdev"),
                         (o_sd, "--output-stdev")):
                _at_most(v, MAX_LENGTH, f)
            in_lens, out_lens = norm_lengths(i_mean, i_sd, n, seed), norm_lengths(o_mean, o_sd, n, seed)
        else:
            i_lo, i_hi = _need_int(input_min, "--input-min"), _need_int(input_max, "--input-max")
            o_lo, o_hi = _need_int(output_min, "--output-min"), _need_int(output_max, "--output-max")
            for lo, hi, f in ((i_lo, i_hi, "--input-max"), (o_lo, o_hi, "--output-max")):
                if hi < lo:
                    raise ConfigError(f"{hi} is below the minimum {lo}", field=f)
                _at_most(hi, MAX_LENGTH, f)
            in_lens, out_lens = unif_lengths(i_lo, i_hi, n, seed), unif_lengths(o_lo, o_hi, n, seed)
        for lens, f in ((in_lens, "--input-mean / --input-stdev"), (out_lens, "--output-mean / --output-stdev")):
            if source == "token-norm-dist" and max(lens) > MAX_LENGTH:   # a wide stdev draws past the cap
                raise ConfigError(f"draw a length of {max(lens):,} tokens: at most {MAX_LENGTH:,} (past every model's "
                                  f"context); ask for a smaller mean or spread", field=f)
        if sum(in_lens) > MAX_TOTAL_TOKENS:
            raise ConfigError(f"{sum(in_lens):,} prompt tokens in all: at most {MAX_TOTAL_TOKENS:,} (a dataset is made "
                              f"in memory); ask for fewer requests or shorter prompts", field="--num-requests")
        prompts = random_tokens(in_lens, vocab_size, stop_ids, seed)
    else:
        fixed = _need_int(output_tokens, "--output-tokens")
        rendered: list[str | None] = []   # per prompt: where its text came from, where the chat template rendered it
        if source == "builtin":
            from ..analyze import load_prompts

            prompts = load_prompts(builtin_prompts_path(builtin or ""), tokenizer_dir)
        elif source == "prompts":
            from ..analyze import load_prompt_items

            if prompts_file is None:
                raise ConfigError("is required for this source", field="--prompts")
            items = load_prompt_items(prompts_file, tokenizer_dir, chat)
            refuse_chat_without_text(chat, any(text for _, text in items), f"{prompts_file} holds token-id lists only")
            prompts = [ids for ids, _ in items]
            rendered = [f"{prompts_file}: prompts[{i}]" if text and chat is not None else None
                        for i, (_, text) in enumerate(items)]
        else:
            if corpus is None:
                raise ConfigError("is required for this source", field="--corpus")
            lines = _corpus_prompts(corpus, tokenizer_dir, chat)
            prompts, rendered = [ids for ids, _ in lines], [where if chat is not None else None for _, where in lines]
        if max_input_len is not None:   # a cut would drop the assistant's turn a chat template opened at the end
            long = next(((where, len(p)) for p, where in zip(prompts, rendered) if where and len(p) > max_input_len),
                        None)
            if long is not None:
                raise ConfigError(f"{long[0]} is {long[1]} tokens as the chat template renders it: cutting it to "
                                  f"{max_input_len} would cut off the assistant's turn the template opens at its end; "
                                  f"shorten that prompt", field="--max-input-len")
        prompts = _cycle(prompts, num_requests)
        out_lens = [fixed] * len(prompts)
    if max_input_len is not None:
        prompts = [p[:max_input_len] for p in prompts]
    if vocab_size is not None:
        for i, p in enumerate(prompts):
            bad = [t for t in p if not 0 <= t < vocab_size]
            if bad:
                raise ConfigError(f"prompt {i}: token ids {bad[:5]} outside the target's vocabulary [0, {vocab_size})",
                                  field=f"--{source}")
    lines = [json.dumps({"task_id": i, "input_ids": list(p), "output_tokens": int(o)}, separators=(",", ":"))
             for i, (p, o) in enumerate(zip(prompts, out_lens))]
    atomic_write_text(out, "\n".join(lines) + "\n")
    return {"output": str(out), "source": source, "requests": len(lines),
            "mean_input_len": sum(map(len, prompts)) / len(prompts), "input_lens": [len(p) for p in prompts],
            "mean_output_tokens": sum(out_lens) / len(out_lens), "seed": seed, **chat_report(chat)}


def _corpus_prompts(corpus, tokenizer_dir, chat=None) -> list[tuple[list[int], str]]:
    """Each non-empty line's ids (``chat``: rendered by the chat template first) and its ``FILE:LINE``."""
    path = Path(corpus)
    try:
        text = path.read_text(encoding="utf-8-sig")   # a leading BOM (Windows editors) is not text
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the corpus: {getattr(exc, 'strerror', None) or exc}", source=path) from None
    lines = [(n, ln.strip()) for n, ln in enumerate(text.split("\n"), 1) if ln.strip()]   # as sed and editors count
    if not lines:
        raise ConfigError("no prompts (the corpus has no non-empty line)", source=path)
    tok = find_tokenizer(tokenizer_dir) if tokenizer_dir is not None else None
    if tok is None:
        raise ConfigError("a text corpus needs the target's tokenizer (give --target, --target-dir or --engine-dir "
                          f"of a target that has one; {tokenizer_dir or 'none given'})", source=path)
    out = []
    for n, ln in lines:
        ids = encode_text(tok, ln, source=f"{path}:{n}", chat=chat)
        if not ids:
            raise ConfigError(f"line {n} tokenizes to no tokens", source=path)
        out.append((ids, f"{path}:{n}"))
    return out


# ---- reading a dataset for `bench run` ----------------------------------------------------------------
def prompt_tokenizer_dir(engine_dir, manifest: dict):
    """Where an engine's text prompts are tokenized: the engine's own tokenizer copy where this version of
    the project writes one (``tokenizer.engine_tokenizer_dir``), else the target directory it was built from."""
    own = getattr(tk, "engine_tokenizer_dir", None)
    if own is not None:
        return own(engine_dir, manifest)
    return (manifest.get("sources") or {}).get("target_dir")


def dataset_lines(path, num_requests: int | None) -> list[dict]:
    """A trtllm-bench dataset's lines (``engine/common.py: read_prompts_file``), the first ``num_requests`` of them
    (as trtllm-bench's ``--num_requests``; more than the file holds is an error)."""
    items = read_prompts_file(path)
    if num_requests is not None:
        if not isinstance(num_requests, int) or isinstance(num_requests, bool) or num_requests < 1:
            raise ConfigError(f"must be an integer >= 1, got {num_requests!r}", field="--num-requests")
        if num_requests > len(items):
            lines = f"{len(items)} line{'' if len(items) == 1 else 's'}"
            raise ConfigError(f"{num_requests} requests asked, the dataset has {lines} "
                              f"(prepare a bigger one with `dflash2-trt bench prepare-dataset --num-requests`)",
                              source=path, field="--num-requests")
        items = items[:num_requests]
    return items


def load_bench_requests(path, *, vocab_size: int, default_output_tokens: int, num_requests: int | None,
                        tokenizer_dir=None) -> list[dict]:
    """``[{"task_id", "input_ids", "output_tokens", "where"}]`` from a trtllm-bench dataset: parsed by
    ``run``'s reader (``engine/common.py: read_prompts_file``, the one parser of these lines), text
    prompts tokenized with the target's tokenizer, ``num_requests`` the first N lines (as
    trtllm-bench's ``--num_requests``; more than the file holds is an error)."""

    items = dataset_lines(path, num_requests)
    tok = None
    out = []
    for it in items:
        ids = it["input_ids"]
        if ids is None:
            if tok is None:
                tok = find_tokenizer(tokenizer_dir) if tokenizer_dir is not None else None
                if tok is None:
                    raise ConfigError("a line gives prompt text but the target has no tokenizer; write input_ids "
                                      "(bench prepare-dataset does)", source=it["where"])
            ids = encode_text(tok, it["prompt"], source=it["where"])
            if not ids:
                raise ConfigError("the prompt tokenizes to no tokens", source=it["where"])
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ConfigError(f"token ids {bad[:5]} outside the vocabulary [0, {vocab_size})", source=it["where"],
                              field="input_ids")
        out.append({"task_id": it["task_id"], "input_ids": list(ids),
                    "output_tokens": it["output_tokens"] or default_output_tokens, "where": it["where"]})
    return out


def registered_target_dir(target_key: str) -> Path:
    """The directory of a registered target, for a dataset: its local checkpoint (tokenizer included), else the
    published config.json shipped in the package (vocabulary and EOS: enough for a synthetic dataset). A dataset
    needs no drafter, so none is looked up (``qwen3-8b`` has none published, and prepare-dataset takes no --drafter)."""
    entry = get_target(target_key)
    try:
        return resolve_dirs(entry, drafter_dir=fixtures_dir())[1]   # any existing directory: the drafter is unused
    except DFlash2Error:
        shipped = fixtures_dir() / (entry.target_id or "").replace("/", "__")
        if entry.target_id is not None and (shipped / "config.json").is_file():
            return shipped
        # resolve_dirs' advice names build's options (--download, --target-dir DIR): say what works here
        repo = entry.target_id or target_key
        raise ConfigError(f"target {repo} is not available locally and no config of it is shipped: download it first "
                          f"(`hf download {repo}`), set DFLASH2_TRT_MODELS to a directory holding "
                          f"{repo.replace('/', '__')}/, or pass --target-dir DIR", field="--target") from None


def resolve_target(*, target_key=None, target_dir=None, engine_dir=None) -> dict:
    """``{"vocab_size", "stop_ids", "tokenizer_dir"}`` of the target a dataset is prepared for: a registered
    target, a target directory, or an engine directory (its config and manifest); all None if none is given."""
    given = sum(x is not None for x in (target_key, target_dir, engine_dir))
    if given > 1:
        raise ConfigError("give at most one of --target, --target-dir, --engine-dir", field="--target")
    if given == 0:
        return {"vocab_size": None, "stop_ids": (), "tokenizer_dir": None, "input_limit": None}
    if engine_dir is not None:
        _, man, cfg = engine_backend(engine_dir)
        try:
            vocab = int(cfg["pretrained_config"]["vocab_size"])
        except (TypeError, KeyError, ValueError):
            raise ConfigError("no pretrained_config.vocab_size", source=Path(engine_dir) / "config.json") from None
        limit = (man.get("limits") or {}).get("max_input_len")
        return {"vocab_size": vocab, "stop_ids": tuple(int(e) for e in man.get("eos_token_ids") or ()),
                "tokenizer_dir": prompt_tokenizer_dir(engine_dir, man),
                "input_limit": (limit, "the engine's max_input_len") if isinstance(limit, int) else None}
    if target_key is not None:
        target_dir = registered_target_dir(target_key)
    t = TargetConfig.from_hugging_face(Path(target_dir))
    limit = getattr(t, "max_position_embeddings", None)
    return {"vocab_size": t.vocab_size, "stop_ids": tuple(int(e) for e in t.eos_token_ids),
            "tokenizer_dir": Path(target_dir),
            "input_limit": (limit, "the target's max_position_embeddings") if isinstance(limit, int) else None}
