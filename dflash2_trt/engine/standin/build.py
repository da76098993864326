"""``dflash2-trt build --backend cpu|cuda``: an engine directory the project's runtime runs with the torch stand-in
(``cpu``: on the CPU, the plugins' CPU builds; ``cuda``: on a GPU, the plugins' CUDA kernels). The two differ only in
``engine.json``'s ``backend``, which decides where ``run``/``bench``/``serve`` open it, and in where the verify gate
ran.

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
at load time (:mod:`.engine`). ``engine.json`` records the verify gate's result (``verify``: prompts,
tokens, mean acceptance; null when off).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ... import __version__, convert
from ...checkpoint.writer import AtomicOutputDir, check_output_dir
from ...errors import ConfigError
from ..checkpoint import ensure_checkpoint, link_files
from ..format import (ENGINE_FORMAT, ENGINE_SCHEMA, BuildResult, copy_tokenizer, file_sha256, torch_version,
                      write_manifest)
from ..pretrained import engine_pretrained_config
from ..verify import planned_check_pool
from .verify import verify_standin_engine


def build_standin(prep, output, *, force: bool = False, command: list[str] | None = None, verify: bool = False,
                  checkpoint_dir=None, reconvert: bool = False, progress=None, verifier=None,
                  backend: str = "cpu") -> BuildResult:
    """The CPU engine directory for ``prep`` (:func:`dflash2_trt.engine.plan.prepare`) at ``output``; the options
    are :func:`dflash2_trt.engine.build.build_engine`'s (``verify`` already decided there). The converter is looked
    up per call (``convert.convert_pair``): tests replace it to prove a checkpoint is reused."""
    if prep.blockers:
        # the pair's, not the target file's: a blocker may come from the drafter's config (its head_dim, say), and
        # naming the target's config.json blamed a file nobody edited (a new user's review)
        raise ConfigError(f"cannot build an engine for this pair (drafter {prep.drafter_dir}, target "
                          f"{prep.target_dir}): {prep.blockers[0]}")
    say = progress or (lambda s: None)
    check_output_dir(output, force)
    drafter_dir, target_dir = prep.drafter_dir, prep.target_dir
    t, cfg = prep.t, prep.cfg
    s = cfg.to_dict()
    if verify and verifier is None:
        planned_check_pool(prep.target_key, t.vocab_size, cfg, s["block_size"] - 1)   # before converting anything
    with AtomicOutputDir(output, force=force) as tmp:
        if checkpoint_dir is not None:
            say(f"[convert] {checkpoint_dir}")
            ck_res = ensure_checkpoint(prep, checkpoint_dir, reconvert=reconvert, progress=say)
            names = ["config.json", "manifest.json"] + [f"rank{r}.safetensors" for r in range(cfg.tp_size)]
            link_files(checkpoint_dir, tmp / "checkpoint", names, symlink_ok=False)   # self-contained engine dir
            convert_seconds, reused = ck_res["seconds"], ck_res["reused"]
        else:
            say(f"[convert] {Path(output) / 'checkpoint'}")
            res = convert.convert_pair(drafter_dir, target_dir, tmp / "checkpoint", tp_size=cfg.tp_size,
                                       dtype=cfg.dtype, progress=False)
            convert_seconds, reused = res.seconds, False
        ck = json.loads((tmp / "checkpoint" / "config.json").read_text())
        pre = engine_pretrained_config(ck, cfg, prep.d)
        build = {k: s[k] for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
                                   "tokens_per_block", "num_kv_blocks")}
        if backend == "cuda":   # its pool is sized from the GPU memory free when it opens (engine/standin/engine.py)
            build["kv_cache_free_gpu_mem_fraction"] = s["kv_cache_free_gpu_mem_fraction"]
        engine_cfg = {"format": ENGINE_FORMAT, "schema_version": ENGINE_SCHEMA, "backend": backend,
                      "pretrained_config": pre, "build_config": build}
        (tmp / "config.json").write_text(json.dumps(engine_cfg, indent=2) + "\n")
        tokenizer = copy_tokenizer(target_dir, tmp)
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                files[str(p.relative_to(tmp))] = {"size": p.stat().st_size, "sha256": file_sha256(p)}
        manifest = {
            "format": ENGINE_FORMAT, "schema_version": ENGINE_SCHEMA, "backend": backend,
            "target": prep.target_key, "family": ck["qwen_type"], "block_size": s["block_size"], "dtype": ck["dtype"],
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
            manifest["verify"] = (verifier or verify_standin_engine)(tmp, target_dir=target_dir,
                                                                 target_key=prep.target_key)
            write_manifest(tmp, manifest)
    return BuildResult(Path(output), manifest)
