"""``dflash2-trt build``: an engine directory, from the CPU backend (here) or the TensorRT-LLM backend
(:mod:`.trtllm_build`: rank engines from ``trtllm-build``; its layout is in that module). Both start
from :func:`dflash2_trt.engine.plan.prepare` (configs, pairing, settings: ``build_configs/NAME.yaml``
+ overrides) and end with the verify gate (:mod:`.verify`) when it is on.

CPU backend: an engine directory the CPU runtime runs.

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
at load time (``engine/cpu.py``). The GPU backend writes TensorRT-LLM's config.json and the same
engine.json around TensorRT-LLM's rank engines. ``engine.json`` records the verify gate's result
(``verify``: prompts, tokens, mean acceptance; null when off).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..errors import ConfigError

ENGINE_FORMAT = "dflash2-trt engine"
ENGINE_SCHEMA = 1

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


def _copy_tokenizer(target_dir, engine_tmp) -> str | None:
    """The target's tokenizer files into the engine directory (``tokenizer/``), when it has any."""
    from ..tokenizer import ENGINE_TOKENIZER_DIR, copy_tokenizer_files

    return ENGINE_TOKENIZER_DIR if copy_tokenizer_files(target_dir, Path(engine_tmp) / ENGINE_TOKENIZER_DIR) else None


def build_engine(drafter_dir, target_dir, output, *, backend: str = "cpu", tp_size: int | None = None, dtype=None,
                 target_key: str | None = None, overrides: dict | None = None, sets: dict | None = None,
                 force: bool = False, command: list[str] | None = None, verify: bool | str = False,
                 checkpoint_dir=None, reconvert: bool = False, keep_checkpoint: bool = True, progress=None,
                 toolchain=None, runner=None, verifier=None) -> BuildResult:
    """Build an engine directory with ``backend`` (``cpu`` or ``trtllm``).

    Settings: ``build_configs/<target_key>.yaml`` (or defaults from the checkpoint configs), then
    ``overrides`` (named options, ``None`` = not given), ``tp_size``/``dtype`` and ``sets`` (``--set``),
    all validated together. ``verify``: True, False or ``"auto"`` (on when the target is small:
    :data:`dflash2_trt.engine.verify.AUTO_MAX_TARGET_BYTES`). ``checkpoint_dir``: keep (and reuse, when its
    manifest matches) the converted checkpoint there; the CPU engine then links its files.
    ``toolchain``/``runner``/``verifier``: injectable machine access for the TensorRT-LLM branch
    (:mod:`.trtllm_build`)."""
    from ..checkpoint.writer import AtomicOutputDir, check_output_dir
    from ..convert import convert_pair
    from .plan import engine_pretrained_config, prepare, weight_bytes_per_rank

    check_build_outputs(drafter_dir, target_dir, output, checkpoint_dir=checkpoint_dir,
                        default_checkpoint=backend == "trtllm" and checkpoint_dir is None and keep_checkpoint)
    if output is not None and not Path(output).is_symlink():
        from ..checkpoint.writer import recover_swapped

        recover_swapped(output)   # an engine a killed --force run moved aside is put back (and named) first
    over = dict(overrides or {})
    if tp_size is not None:
        over["tp_size"] = int(tp_size)
    if dtype is not None:
        over["dtype"] = dtype
    prep = prepare(drafter_dir, target_dir, target_key=target_key, overrides=over, sets=sets)
    if backend == "trtllm":
        from .trtllm_build import build_trtllm

        return build_trtllm(prep, output, force=force, command=command, verify=verify, checkpoint_dir=checkpoint_dir,
                            reconvert=reconvert, keep_checkpoint=keep_checkpoint, progress=progress,
                            toolchain=toolchain, runner=runner, verifier=verifier)
    if backend != "cpu":
        raise ConfigError(f"unknown backend {backend!r}; expected cpu or trtllm", field="--backend")
    if prep.blockers:
        raise ConfigError(f"cannot build an engine for this target: {prep.blockers[0]}", source=prep.t.source)
    say = progress or (lambda s: None)
    check_output_dir(output, force)
    drafter_dir, target_dir = prep.drafter_dir, prep.target_dir
    t, cfg = prep.t, prep.cfg
    s = cfg.to_dict()
    if verify == "auto":
        from .verify import AUTO_MAX_TARGET_BYTES

        verify = sum(r["target"] for r in weight_bytes_per_rank(t, prep.d, cfg.tp_size, cfg.dtype)) \
            <= AUTO_MAX_TARGET_BYTES
    if verify and verifier is None:
        from .verify import planned_check_pool

        planned_check_pool(target_key, t.vocab_size, cfg, s["block_size"] - 1)   # before converting anything
    with AtomicOutputDir(output, force=force) as tmp:
        if checkpoint_dir is not None:
            from .checkpoint import ensure_checkpoint, link_files

            say(f"[convert] {checkpoint_dir}")
            ck_res = ensure_checkpoint(prep, checkpoint_dir, reconvert=reconvert, progress=say)
            names = ["config.json", "manifest.json"] + [f"rank{r}.safetensors" for r in range(cfg.tp_size)]
            link_files(checkpoint_dir, tmp / "checkpoint", names, symlink_ok=False)   # self-contained engine dir
            convert_seconds, reused = ck_res["seconds"], ck_res["reused"]
        else:
            say(f"[convert] {Path(output) / 'checkpoint'}")
            res = convert_pair(drafter_dir, target_dir, tmp / "checkpoint", tp_size=cfg.tp_size, dtype=cfg.dtype,
                               progress=False)
            convert_seconds, reused = res.seconds, False
        ck = json.loads((tmp / "checkpoint" / "config.json").read_text())
        pre = engine_pretrained_config(ck, cfg, prep.d)
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
            "tp_size": cfg.tp_size, "limits": build, "selector": s["selector"], "drafter_window": s["drafter_window"],
            "versions": {"dflash2_trt": __version__, "python": sys.version.split()[0], "torch": _torch_version()},
            "sources": {"target_dir": str(target_dir.resolve()), "drafter_dir": str(drafter_dir.resolve()),
                        "checkpoint_manifest_sha256": files["checkpoint/manifest.json"]["sha256"],
                        "checkpoint_dir": str(Path(checkpoint_dir).resolve()) if checkpoint_dir else None,
                        "checkpoint_reused": reused},
            "eos_token_ids": [int(e) for e in t.eos_token_ids], "tokenizer": tokenizer,
            "command": command or [], "files": files, "convert_seconds": round(convert_seconds, 3),
            "settings_source": cfg.source, "verify": None,
        }
        _write_manifest(tmp, manifest)
        if verify:
            # Through the same loading path as `run` (engine.json written first); a difference raises, and the
            # temporary directory is removed: nothing half-written.
            from .verify import verify_cpu_engine

            say("[verify] fixed prompts through the engine vs the target's greedy decoding")
            manifest["verify"] = (verifier or verify_cpu_engine)(tmp, target_dir=target_dir, target_key=target_key)
            _write_manifest(tmp, manifest)
    return BuildResult(Path(output), manifest)


def check_build_outputs(drafter_dir, target_dir, output, *, checkpoint_dir=None, default_checkpoint=False) -> None:
    """The overlap rule (:mod:`dflash2_trt.overlap`) for a build: ``--output`` and ``--checkpoint-dir`` (and the
    TensorRT-LLM backend's default ``OUTPUT.checkpoint``) are not, do not contain and do not lie inside the
    drafter or target directory, nor each other. Raises before anything is written or deleted."""
    from ..overlap import refuse_overlap
    from .plan import default_checkpoint_dir

    inputs = [("drafter directory", drafter_dir), ("target directory", target_dir)]
    refuse_overlap(output, "--output", inputs)
    ckpt, option = checkpoint_dir, "--checkpoint-dir"
    if ckpt is None and default_checkpoint and output is not None:
        ckpt, option = default_checkpoint_dir(output), "--checkpoint-dir (default: OUTPUT.checkpoint)"
    if ckpt is not None:
        refuse_overlap(ckpt, option, inputs + ([("engine output directory", output)] if output is not None else []))


def _write_manifest(tmp: Path, manifest: dict) -> None:
    with open(tmp / "engine.json", "w") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())


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
    backend = man.get("backend")
    # A TensorRT-LLM engine's config.json is TensorRT-LLM's own (the runtime reads it); engine.json is ours.
    ours = ((man, man_path), (cfg, cfg_path)) if backend == "cpu" else ((man, man_path),)
    for doc, p in ours:
        if doc.get("format") != ENGINE_FORMAT:
            raise ConfigError(f"format {doc.get('format')!r}, expected {ENGINE_FORMAT!r}", source=p, field="format")
        if doc.get("schema_version") != ENGINE_SCHEMA:
            raise ConfigError(f"schema version {doc.get('schema_version')!r}; this dflash2-trt reads {ENGINE_SCHEMA} "
                              f"(rebuild the engine)", source=p, field="schema_version")
    if backend not in ("cpu", "trtllm"):
        raise ConfigError(f"backend {backend!r}: expected cpu or trtllm", source=man_path, field="backend")
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
        limit_keys = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")
        for k in limit_keys + (("tokens_per_block",) if backend == "cpu" else ()):
            if not isinstance(build[k], int) or build[k] < 1:
                raise ConfigError(f"must be a positive integer, got {build[k]!r}", source=cfg_path,
                                  field=f"build_config.{k}")
        for where, v, lo in (("pretrained_config.dflash2.block_size", pre["dflash2"]["block_size"], 2),
                             ("pretrained_config.mapping.tp_size", pre["mapping"]["tp_size"], 1),
                             ("pretrained_config.vocab_size", pre["vocab_size"], 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"must be an integer >= {lo}, got {v!r}", source=cfg_path, field=where)
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"missing or malformed field {exc}", source=cfg_path) from None
    return cfg, man


def engine_backend(engine_dir) -> str | None:
    """The ``backend`` an engine directory's engine.json names (None when unreadable: the full load reports why)."""
    try:
        man = json.loads((Path(engine_dir) / "engine.json").read_text())
        return man.get("backend") if isinstance(man, dict) else None
    except (OSError, ValueError):
        return None


def open_cpu_engine(engine_dir, *, verify: bool = False):
    from .cpu import CpuEngine, limits_from

    cfg, man = load_engine_dir(engine_dir, verify=verify)
    if man["backend"] != "cpu":
        raise ConfigError(f"backend {man['backend']!r}: a TensorRT-LLM engine runs through TensorRT-LLM's runner on a GPU "
                          f"machine (`dflash2-trt run` there, or RUN.md in the engine directory)",
                          source=Path(engine_dir) / "engine.json", field="backend")
    pre = cfg["pretrained_config"]
    return CpuEngine(pre, Path(engine_dir) / "checkpoint", limits_from(cfg["build_config"], pre)), man
