"""``dflash2-trt build --backend cpu``: an engine directory the CPU runtime runs.

Layout (everything written into a temporary directory beside the output, renamed at the end; an error
or Ctrl-C leaves nothing behind)::

    ENGINE_DIR/
      checkpoint/        the combined TensorRT-LLM checkpoint (``dflash2-trt convert``; config.json,
                         rank{N}.safetensors, manifest.json)
      config.json        the engine config: ``pretrained_config`` (the checkpoint's, with the engine's
                         block size and ``dflash2_engine`` build settings) + ``build_config`` (limits)
      tokenizer/         the target's tokenizer files, when it has any (``run --prompt`` and
                         ``deploy triton`` read this copy: the engine is self-contained)
      engine.json        manifest: format, backend, target, block size, dtype, tp, limits, versions,
                         source identities, the command, size and sha256 of every other file

The CPU "engine" holds weights, not a compiled plan: the network file is executed by the CPU stand-in
at load time (``engine/cpu.py``). The GPU backend (``trtllm-build``) writes the same config.json and
engine.json around TensorRT-LLM's rank engines.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..errors import ConfigError, DFlash2Error

ENGINE_FORMAT = "dflash2-trt engine"
ENGINE_SCHEMA = 1
DRAFTER_WINDOWS = ("model", "full")
SELECTORS = ("greedy", "viterbi")
DEFAULTS = {"tokens_per_block": 32, "selector": "greedy", "drafter_window": "model", "num_kv_blocks": 0}


@dataclass
class BuildResult:
    output: Path
    manifest: dict


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _int_setting(settings: dict, key: str, lo: int = 1) -> int:
    v = settings[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ConfigError(f"must be an integer >= {lo}, got {v!r}", field=key)
    return v


def resolve_settings(build_cfg, target_cfg, drafter_cfg, overrides: dict) -> dict:
    """Engine settings: the target's build config (``build_configs/NAME.yaml``) or defaults from the
    checkpoint configs, then the command line's overrides (``None`` = not given)."""
    if build_cfg is not None:
        s = {"max_batch_size": build_cfg.max_batch_size, "max_input_len": build_cfg.max_input_len,
             "max_seq_len": build_cfg.max_seq_len, "max_num_tokens": build_cfg.max_num_tokens,
             "block_size": build_cfg.block_size, "selector": build_cfg.selector}
    else:
        mpe = target_cfg.max_position_embeddings
        s = {"max_batch_size": 8, "max_input_len": mpe // 2, "max_seq_len": mpe,
             "block_size": drafter_cfg.block_size}
        s["max_num_tokens"] = max(4096, s["max_batch_size"] * s["block_size"])
    s = {**DEFAULTS, **s}
    s.update({k: v for k, v in overrides.items() if v is not None})
    for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tokens_per_block"):
        _int_setting(s, k)
    _int_setting(s, "block_size", 2)
    _int_setting(s, "num_kv_blocks", 0)
    if s["selector"] not in SELECTORS:
        raise ConfigError(f"the engine's selector is one of {', '.join(SELECTORS)} (greedy = the published walk: "
                          f"greedy at T=0, sampling at T>0), got {s['selector']!r}", field="selector")
    if s["drafter_window"] not in DRAFTER_WINDOWS:
        raise ConfigError(f"must be one of {', '.join(DRAFTER_WINDOWS)}, got {s['drafter_window']!r}",
                          field="drafter_window")
    if s["max_input_len"] > s["max_seq_len"]:
        raise ConfigError(f"max_input_len {s['max_input_len']} exceeds max_seq_len {s['max_seq_len']}",
                          field="max_input_len")
    if s["max_seq_len"] > target_cfg.max_position_embeddings:
        raise ConfigError(f"max_seq_len {s['max_seq_len']} exceeds the target's max_position_embeddings "
                          f"{target_cfg.max_position_embeddings}", field="max_seq_len")
    K = s["block_size"] - 1
    if s["max_num_tokens"] < s["max_batch_size"] * (K + 1):
        raise ConfigError(f"max_num_tokens {s['max_num_tokens']} < max_batch_size x block_size = "
                          f"{s['max_batch_size'] * (K + 1)} (trtllm-build requires it)", field="max_num_tokens")
    if s["block_size"] - 1 > 15 and s["block_size"] != drafter_cfg.block_size:
        raise ConfigError("the selector plugin handles at most 15 draft positions (block size 16)", field="block_size")
    return s


def build_engine(drafter_dir, target_dir, output, *, backend: str = "cpu", tp_size: int = 1, dtype=None,
                 target_key: str | None = None, overrides: dict | None = None, force: bool = False,
                 command: list[str] | None = None) -> BuildResult:
    from ..checkpoint.writer import AtomicOutputDir
    from ..config import DFlash2Config, TargetConfig
    from ..config.build import BuildConfig
    from ..convert import convert_pair

    if backend != "cpu":
        raise DFlash2Error(f"backend {backend!r}: only the CPU backend is implemented (the TensorRT-LLM build "
                           f"is the next step; see RUN.md once it lands)")
    drafter_dir, target_dir = Path(drafter_dir), Path(target_dir)
    t = TargetConfig.from_hugging_face(target_dir)
    d = DFlash2Config.from_hugging_face(drafter_dir)
    build_cfg = None
    if target_key is not None:
        from ..targets import get_target

        path = get_target(target_key).build_config_path
        if path.exists():
            build_cfg = BuildConfig.load(path)
    s = resolve_settings(build_cfg, t, d, overrides or {})
    with AtomicOutputDir(output, force=force) as tmp:
        res = convert_pair(drafter_dir, target_dir, tmp / "checkpoint", tp_size=tp_size, dtype=dtype, progress=False)
        ck = json.loads((tmp / "checkpoint" / "config.json").read_text())
        if ck["qwen_type"] != "qwen3":
            raise ConfigError(f"target family {ck['qwen_type']!r} has no engine network yet (dense qwen3 only; the "
                              f"hybrid Qwen3.5 target is its own issue)", source=t.source, field="architectures")
        pre = json.loads(json.dumps(ck))
        pre["dflash2"]["block_size"] = s["block_size"]
        pre["max_draft_len"] = s["block_size"] - 1
        pre["dflash2_engine"] = {"selector": s["selector"], "drafter_window": s["drafter_window"],
                                 "max_seq_len": s["max_seq_len"]}
        from ..trtllm.backend import load_network

        net = load_network("cpu")
        try:
            net.check_kv_compatible(net.api.PretrainedConfig.from_dict(pre))
        except ValueError as exc:
            raise ConfigError(str(exc), source=drafter_dir / "config.json", field="num_key_value_heads") from None
        build = {k: s[k] for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
                                   "tokens_per_block", "num_kv_blocks")}
        engine_cfg = {"format": ENGINE_FORMAT, "schema_version": ENGINE_SCHEMA, "backend": "cpu",
                      "pretrained_config": pre, "build_config": build}
        (tmp / "config.json").write_text(json.dumps(engine_cfg, indent=2) + "\n")
        from ..tokenizer import ENGINE_TOKENIZER_DIR, copy_tokenizer_files

        tokenizer = ENGINE_TOKENIZER_DIR if copy_tokenizer_files(target_dir, tmp / ENGINE_TOKENIZER_DIR) else None
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                files[str(p.relative_to(tmp))] = {"size": p.stat().st_size, "sha256": _sha256(p)}
        manifest = {
            "format": ENGINE_FORMAT, "schema_version": ENGINE_SCHEMA, "backend": "cpu",
            "target": target_key, "family": ck["qwen_type"], "block_size": s["block_size"], "dtype": ck["dtype"],
            "tp_size": tp_size, "limits": build, "selector": s["selector"], "drafter_window": s["drafter_window"],
            "versions": {"dflash2_trt": __version__, "python": sys.version.split()[0], "torch": _torch_version()},
            "sources": {"target_dir": str(target_dir.resolve()), "drafter_dir": str(drafter_dir.resolve()),
                        "checkpoint_manifest_sha256": files["checkpoint/manifest.json"]["sha256"]},
            "eos_token_ids": [int(e) for e in t.eos_token_ids], "tokenizer": tokenizer,
            "command": command or [], "files": files, "convert_seconds": round(res.seconds, 3),
        }
        (tmp / "engine.json").write_text(json.dumps(manifest, indent=2) + "\n")
        with open(tmp / "engine.json", "rb") as f:
            os.fsync(f.fileno())
    return BuildResult(Path(output), manifest)


def _torch_version() -> str:
    import torch

    return torch.__version__


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
            docs.append(json.loads(p.read_text()))
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror or exc}", source=p) from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON: {exc.msg} at line {exc.lineno}", source=p) from None
        if not isinstance(docs[-1], dict):
            raise ConfigError("top level must be an object", source=p)
    man, cfg = docs
    for doc, p in ((man, man_path), (cfg, cfg_path)):
        if doc.get("format") != ENGINE_FORMAT:
            raise ConfigError(f"format {doc.get('format')!r}, expected {ENGINE_FORMAT!r}", source=p, field="format")
        if doc.get("schema_version") != ENGINE_SCHEMA:
            raise ConfigError(f"schema version {doc.get('schema_version')!r}; this dflash2-trt reads {ENGINE_SCHEMA} "
                              f"(rebuild the engine)", source=p, field="schema_version")
    if man.get("backend") != "cpu":
        raise ConfigError(f"backend {man.get('backend')!r}: `dflash2-trt run` runs CPU engines; run a TensorRT-LLM "
                          f"engine with TensorRT-LLM's executor", source=man_path, field="backend")
    files = man.get("files")
    if not isinstance(files, dict) or "config.json" not in files:
        raise ConfigError("no file list", source=man_path, field="files")
    for rel, meta in files.items():
        p = engine_dir / rel
        if not p.is_file():
            raise ConfigError(f"{rel} is missing", source=man_path, field="files")
        if p.stat().st_size != meta.get("size"):
            raise ConfigError(f"{rel} has {p.stat().st_size} bytes, the manifest says {meta.get('size')} (truncated or "
                              f"modified; rebuild the engine)", source=man_path, field="files")
        if (verify or rel == "config.json") and _sha256(p) != meta.get("sha256"):
            raise ConfigError(f"{rel}: sha256 differs from the manifest (modified after the build)", source=man_path,
                              field="files")
    try:
        pre, build = cfg["pretrained_config"], cfg["build_config"]
        for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tokens_per_block"):
            if not isinstance(build[k], int) or build[k] < 1:
                raise ConfigError(f"must be a positive integer, got {build[k]!r}", source=cfg_path,
                                  field=f"build_config.{k}")
        pre["dflash2"]["block_size"], pre["mapping"]["tp_size"], pre["vocab_size"]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"missing or malformed field {exc}", source=cfg_path) from None
    return cfg, man


def open_cpu_engine(engine_dir, *, verify: bool = False):
    from .cpu import CpuEngine, limits_from

    cfg, man = load_engine_dir(engine_dir, verify=verify)
    pre = cfg["pretrained_config"]
    return CpuEngine(pre, Path(engine_dir) / "checkpoint", limits_from(cfg["build_config"], pre)), man
