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

import json
import sys
from pathlib import Path

from .. import __version__
from ..checkpoint.writer import AtomicOutputDir, check_output_dir, recover_swapped
from ..errors import ConfigError
from ..overlap import refuse_overlap
from .checkpoint import ensure_checkpoint, link_files
from .common import AUTO_MAX_TARGET_BYTES
from .cpu import open_cpu_engine
from .format import (ENGINE_FORMAT, ENGINE_SCHEMA, BuildResult, copy_tokenizer, file_sha256, load_engine_dir,
                     torch_version, write_manifest)
from .plan import default_checkpoint_dir, engine_pretrained_config, prepare, weight_bytes_per_rank
from .trtllm_build import build_trtllm
from .verify import planned_check_pool, verify_cpu_engine

# Public here as before the format moved out: ``from dflash2_trt.engine.build import open_cpu_engine``
# (deploy/triton, scripts/bench_engine.py), ``load_engine_dir``, ``ENGINE_FORMAT`` (tests).
__all__ = ["ENGINE_FORMAT", "ENGINE_SCHEMA", "BuildResult", "build_engine", "check_build_outputs", "load_engine_dir",
           "open_cpu_engine"]


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
    from ..convert import convert_pair   # looked up per call: tests replace it to prove a checkpoint is reused

    check_build_outputs(drafter_dir, target_dir, output, checkpoint_dir=checkpoint_dir,
                        default_checkpoint=backend == "trtllm" and checkpoint_dir is None and keep_checkpoint)
    if output is not None and not Path(output).is_symlink():
        recover_swapped(output)   # an engine a killed --force run moved aside is put back (and named) first
    over = dict(overrides or {})
    if tp_size is not None:
        over["tp_size"] = int(tp_size)
    if dtype is not None:
        over["dtype"] = dtype
    prep = prepare(drafter_dir, target_dir, target_key=target_key, overrides=over, sets=sets)
    if backend == "trtllm":
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
        verify = sum(r["target"] for r in weight_bytes_per_rank(t, prep.d, cfg.tp_size, cfg.dtype)) \
            <= AUTO_MAX_TARGET_BYTES
    if verify and verifier is None:
        planned_check_pool(target_key, t.vocab_size, cfg, s["block_size"] - 1)   # before converting anything
    with AtomicOutputDir(output, force=force) as tmp:
        if checkpoint_dir is not None:
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
        tokenizer = copy_tokenizer(target_dir, tmp)
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                files[str(p.relative_to(tmp))] = {"size": p.stat().st_size, "sha256": file_sha256(p)}
        manifest = {
            "format": ENGINE_FORMAT, "schema_version": ENGINE_SCHEMA, "backend": "cpu",
            "target": target_key, "family": ck["qwen_type"], "block_size": s["block_size"], "dtype": ck["dtype"],
            "tp_size": cfg.tp_size, "limits": build, "selector": s["selector"], "drafter_window": s["drafter_window"],
            "versions": {"dflash2_trt": __version__, "python": sys.version.split()[0], "torch": torch_version()},
            "sources": {"target_dir": str(target_dir.resolve()), "drafter_dir": str(drafter_dir.resolve()),
                        "checkpoint_manifest_sha256": files["checkpoint/manifest.json"]["sha256"],
                        "checkpoint_dir": str(Path(checkpoint_dir).resolve()) if checkpoint_dir else None,
                        "checkpoint_reused": reused},
            "eos_token_ids": [int(e) for e in t.eos_token_ids], "tokenizer": tokenizer,
            "command": command or [], "files": files, "convert_seconds": round(convert_seconds, 3),
            "settings_source": cfg.source, "verify": None,
        }
        write_manifest(tmp, manifest)
        if verify:
            # Through the same loading path as `run` (engine.json written first); a difference raises, and the
            # temporary directory is removed: nothing half-written.
            say("[verify] fixed prompts through the engine vs the target's greedy decoding")
            manifest["verify"] = (verifier or verify_cpu_engine)(tmp, target_dir=target_dir, target_key=target_key)
            write_manifest(tmp, manifest)
    return BuildResult(Path(output), manifest)


def check_build_outputs(drafter_dir, target_dir, output, *, checkpoint_dir=None, default_checkpoint=False) -> None:
    """The overlap rule (:mod:`dflash2_trt.overlap`) for a build: ``--output`` and ``--checkpoint-dir`` (and the
    TensorRT-LLM backend's default ``OUTPUT.checkpoint``) are not, do not contain and do not lie inside the
    drafter or target directory, nor each other. Raises before anything is written or deleted."""
    inputs = [("drafter directory", drafter_dir), ("target directory", target_dir)]
    refuse_overlap(output, "--output", inputs)
    ckpt, option = checkpoint_dir, "--checkpoint-dir"
    if ckpt is None and default_checkpoint and output is not None:
        ckpt, option = default_checkpoint_dir(output), "--checkpoint-dir (default: OUTPUT.checkpoint)"
    if ckpt is not None:
        refuse_overlap(ckpt, option, inputs + ([("engine output directory", output)] if output is not None else []))


