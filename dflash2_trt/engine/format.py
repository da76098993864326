"""The engine directory format, shared by both backends: ``engine.json`` (the manifest: format, schema
version, backend, limits, versions, sources, the size and sha256 of every other file), its load and
hash checks, and the small pieces every builder writes the same way (the tokenizer copy, the file
hashes, the manifest write).

The layout itself (what each backend puts beside ``engine.json``) is described in
:mod:`dflash2_trt.engine.standin.build` (CPU backend) and :mod:`dflash2_trt.engine.trtllm.build`
(TensorRT-LLM backend); ``docs/architecture.md`` shows both. This module imports nothing of the
engine package: every other engine module may use it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..tokenizer import ENGINE_TOKENIZER_DIR, copy_tokenizer_files
from ..textfiles import json_loads

ENGINE_FORMAT = "dflash2-trt engine"
ENGINE_SCHEMA = 1

@dataclass
class BuildResult:
    output: Path
    manifest: dict
    notes: list = field(default_factory=list)    # lines the command prints as "note: ..." after its "wrote" line


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def copy_tokenizer(target_dir, engine_tmp) -> str | None:
    """The target's tokenizer files into the engine directory (``tokenizer/``), when it has any."""
    return ENGINE_TOKENIZER_DIR if copy_tokenizer_files(target_dir, Path(engine_tmp) / ENGINE_TOKENIZER_DIR) else None


def write_manifest(tmp: Path, manifest: dict) -> None:
    with open(tmp / "engine.json", "w") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())


def torch_version() -> str:
    import torch

    return torch.__version__


def file_problems(root, files: dict, *, verify: bool = False, hashed=("config.json",)):
    """``(kind, text)`` for each file of a manifest's list (``{path relative to root: {size, sha256}}``) that is
    ``missing``, has another ``size``, or (every file with ``verify``, else only those named in ``hashed``) another
    ``sha256``; a generator, so the caller can stop at the first."""
    root = Path(root)
    for rel, meta in files.items():
        p = root / rel
        if not p.is_file():
            yield "missing", f"{rel} is missing"
        elif p.stat().st_size != meta.get("size"):
            yield "size", f"{rel} has {p.stat().st_size} bytes, the manifest says {meta.get('size')}"
        elif (verify or rel in hashed) and file_sha256(p) != meta.get("sha256"):
            yield "sha256", f"{rel}: sha256 differs from the manifest"


def check_manifest_fields(man: dict, man_path, *, need_limits: bool = False) -> None:
    """The engine.json fields readers take as they are written (no hash covers engine.json itself), where present
    (``need_limits``: ``limits.max_batch_size`` must be): an edited or damaged one is a ConfigError naming the field,
    never a ValueError deep inside a command."""
    eos = man.get("eos_token_ids")
    if eos is not None and (not isinstance(eos, list) or
                            any(isinstance(e, bool) or not isinstance(e, int) or e < 0 for e in eos)):
        raise ConfigError(f"must be a list of token ids (integers >= 0), got {eos!r}", source=man_path,
                          field="eos_token_ids")
    bs = man.get("block_size")
    if "block_size" in man and (isinstance(bs, bool) or not isinstance(bs, int) or bs < 2):
        raise ConfigError(f"must be an integer >= 2 (K + 1), got {bs!r}", source=man_path, field="block_size")
    tok = man.get("tokenizer")
    if tok is not None and tok != ENGINE_TOKENIZER_DIR:
        # what a build writes: its own copy's directory, or null; a reader never looked anywhere else, so an edited
        # value was ignored without a word
        raise ConfigError(f"must be {ENGINE_TOKENIZER_DIR!r} (the engine's own copy, {ENGINE_TOKENIZER_DIR}/) or null "
                          f"(none: the target directory's, where it has one), got {tok!r}; `deploy triton --tokenizer "
                          f"DIR` serves another", source=man_path, field="tokenizer")
    limits = man.get("limits")
    if limits is None and not need_limits:
        return
    if not isinstance(limits, dict):
        raise ConfigError(f"must be an object, got {limits!r}", source=man_path, field="limits")
    mbs = limits.get("max_batch_size")
    # at most what a build writes (trtllm-build's EAGLE limit): a larger edited value reached deploy triton's
    # config.pbtxt and failed its protobuf check there, naming a temporary file
    from ..config.build import MAX_EAGLE_BATCH

    if (mbs is not None or need_limits) and (isinstance(mbs, bool) or not isinstance(mbs, int)
                                             or not 1 <= mbs <= MAX_EAGLE_BATCH):
        raise ConfigError(f"must be an integer in [1, {MAX_EAGLE_BATCH}], got {mbs!r}", source=man_path,
                          field="limits.max_batch_size")


def check_block_size(man: dict, cfg: dict, man_path) -> None:
    """engine.json's ``block_size`` (K + 1; no hash covers engine.json) against the engine config's
    ``pretrained_config.max_draft_len`` (K), which every engine kind this project writes carries: the project's own
    config.json and TensorRT-LLM's alike; and its ``eos_token_ids`` against ``pretrained_config.vocab_size`` (an
    edited id past the vocabulary was deployed as Triton's ``end_id`` and never matched a token)."""
    pre = cfg.get("pretrained_config")
    vocab = pre.get("vocab_size") if isinstance(pre, dict) else None
    eos = man.get("eos_token_ids")
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab >= 1 and isinstance(eos, list):
        # (a vocab_size below 1 is the config's own error, reported where the config is checked)
        past = [e for e in eos if isinstance(e, int) and e >= vocab]
        if past:
            raise ConfigError(f"{past} past the engine's vocabulary (config.json pretrained_config.vocab_size {vocab}): "
                              f"engine.json was edited or belongs to another engine", source=man_path,
                              field="eos_token_ids")
    draft = pre.get("max_draft_len") if isinstance(pre, dict) else None
    if man.get("block_size") is not None and isinstance(draft, int) and man["block_size"] != draft + 1:
        raise ConfigError(f"{man['block_size']}, but the engine's config.json has pretrained_config.max_draft_len "
                          f"{draft} (K + 1 = {draft + 1}): engine.json was edited or belongs to another engine",
                          source=man_path, field="block_size")


def load_engine_dir(engine_dir, *, verify: bool = False):
    """(engine config, manifest) of an engine directory, checked; ``verify`` re-hashes every file."""
    engine_dir = Path(engine_dir)
    if not engine_dir.is_dir():
        raise ConfigError("not a directory", source=engine_dir)
    man_path, cfg_path = engine_dir / "engine.json", engine_dir / "config.json"
    if not man_path.is_file():
        raise ConfigError("not an engine directory (no engine.json; build one with `dflash2-trt build`)",
                          source=engine_dir)
    docs = []
    for p in (man_path, cfg_path):
        try:
            docs.append(json_loads(p.read_text()))
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror or exc}", source=p) from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON: {exc.msg} at line {exc.lineno}", source=p) from None
        if not isinstance(docs[-1], dict):
            raise ConfigError("top level must be an object", source=p)
    man, cfg = docs
    backend = man.get("backend")
    # A TensorRT-LLM engine's config.json is TensorRT-LLM's own (the runtime reads it); engine.json is ours.
    ours = ((man, man_path), (cfg, cfg_path)) if backend in ("cpu", "cuda") else ((man, man_path),)
    for doc, p in ours:
        if doc.get("format") != ENGINE_FORMAT:
            raise ConfigError(f"format {doc.get('format')!r}, expected {ENGINE_FORMAT!r}", source=p, field="format")
        if doc.get("schema_version") != ENGINE_SCHEMA:
            raise ConfigError(f"schema version {doc.get('schema_version')!r}; this dflash2-trt reads {ENGINE_SCHEMA} "
                              f"(rebuild the engine)", source=p, field="schema_version")
    if backend not in ("cpu", "cuda", "trtllm"):
        raise ConfigError(f"backend {backend!r}: expected cpu, cuda or trtllm", source=man_path, field="backend")
    check_manifest_fields(man, man_path)
    check_block_size(man, cfg, man_path)
    files = man.get("files")
    if not isinstance(files, dict) or "config.json" not in files:
        raise ConfigError("no file list", source=man_path, field="files")
    advice = {"missing": "", "size": " (truncated or modified; rebuild the engine)",
              "sha256": " (modified after the build)"}
    for kind, text in file_problems(engine_dir, files, verify=verify):
        raise ConfigError(text + advice[kind], source=man_path, field="files")
    try:
        pre, build = cfg["pretrained_config"], cfg["build_config"]
        if backend in ("cpu", "cuda") and isinstance(pre, dict):   # ours (a TensorRT-LLM engine's is trtllm-build's)
            check_engine_pretrained(pre, cfg_path)
        limit_keys = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")
        for k in limit_keys + (("tokens_per_block",) if backend in ("cpu", "cuda") else ()):
            if not isinstance(build[k], int) or build[k] < 1:
                raise ConfigError(f"must be a positive integer, got {build[k]!r}", source=cfg_path,
                                  field=f"build_config.{k}")
        for where, v, lo in (("pretrained_config.dflash2.block_size", pre["dflash2"]["block_size"], 2),
                             ("pretrained_config.mapping.tp_size", pre["mapping"]["tp_size"], 1),
                             ("pretrained_config.vocab_size", pre["vocab_size"], 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"must be an integer >= {lo}, got {v!r}", source=cfg_path, field=where)
        ids, n = pre["dflash2"]["target_layer_ids"], pre["dflash2"]["num_target_layers"]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                           and 0 <= i < n for i in ids):
            raise ConfigError(f"must be a non-empty list of target layer indices in [0, {n}) "
                              f"(dflash2.num_target_layers), got {ids!r}", source=cfg_path,
                              field="pretrained_config.dflash2.target_layer_ids")
        if "max_draft_len" in pre and pre["max_draft_len"] != pre["dflash2"]["block_size"] - 1:
            raise ConfigError(f"{pre['max_draft_len']!r}, but dflash2.block_size {pre['dflash2']['block_size']} "
                              f"drafts {pre['dflash2']['block_size'] - 1}", source=cfg_path,
                              field="pretrained_config.max_draft_len")
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"missing or malformed field {exc}", source=cfg_path) from None
    return cfg, man


ENGINE_INT_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_size",
                     "intermediate_size", "max_position_embeddings")   # vocab_size: load_engine_dir's, every backend
ENGINE_DTYPES = ("float32", "float16", "bfloat16")


def check_engine_pretrained(pre: dict, cfg_path) -> None:
    """The fields of a cpu / cuda engine's ``pretrained_config`` the network is built from, present and of their kind
    (a fault there reached the network's construction as a traceback): the checkpoint schema's keys
    (``convert/schema.py``), the sizes as positive integers, the dtype, one layer kind per layer, the drafter's
    numerics and the selector. What a build wrote always passes; this names a hand edit's or another version's fault
    by its field."""
    from ..config.build import SELECTORS
    from ..config.drafter import NUMERICS_FIELDS
    from ..convert.schema import required_keys

    def bad(field: str, msg: str) -> ConfigError:
        return ConfigError(msg, source=cfg_path, field=f"pretrained_config.{field}")

    for k in required_keys(pre.get("qwen_type")):
        if k not in pre:
            raise bad(k, "required field is missing (rebuild the engine)")
    for k in ENGINE_INT_FIELDS:
        v = pre[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad(k, f"must be an integer >= 1, got {v!r}")
    if pre["dtype"] not in ENGINE_DTYPES:
        raise bad("dtype", f"must be one of {', '.join(ENGINE_DTYPES)}, got {pre['dtype']!r}")
    kinds = pre["layer_types"]   # the target's layers, and for a hybrid TensorRT-LLM's kinds of the drafter's too
    if not isinstance(kinds, list) or len(kinds) < pre["num_hidden_layers"] \
            or not all(isinstance(t, str) for t in kinds):
        raise bad("layer_types", f"expected a list of at least {pre['num_hidden_layers']} layer kinds "
                                 f"(num_hidden_layers), got {kinds!r}")
    d = pre["dflash2"]
    if not isinstance(d, dict):
        raise bad("dflash2", "must be an object")
    for k in NUMERICS_FIELDS:
        if k not in d:
            raise bad(f"dflash2.{k}", "required field is missing (rebuild the engine)")
    sel = (pre.get("dflash2_engine") or {}).get("selector", "greedy")
    if sel not in SELECTORS:
        raise bad("dflash2_engine.selector", f"must be one of {', '.join(SELECTORS)}, got {sel!r}")


def engine_backend(engine_dir) -> str | None:
    """The ``backend`` an engine directory's engine.json names (None when unreadable: the full load reports why)."""
    try:
        man = json_loads((Path(engine_dir) / "engine.json").read_text())
        return man.get("backend") if isinstance(man, dict) else None
    except (OSError, ValueError):
        return None
