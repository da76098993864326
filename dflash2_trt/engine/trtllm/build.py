"""``dflash2-trt build --backend trtllm``: TensorRT-LLM rank engines around the project's network file.

Steps (each either completes or leaves nothing of its own behind; Ctrl-C included)::

    validate   configs, pairing, settings; the target has an engine network; the local GPU (if any) is one of
               the build config's ``gpus``; the output may be written (exists -> --force)
    convert    the checkpoint at --checkpoint-dir (default ENGINE_DIR.checkpoint), reused when its manifest
               matches (engine/checkpoint.py), else written atomically; --no-keep-checkpoint: a temporary
               one beside the output, removed at the end
    plugins    libdflash2_plugins.so for the GPU's architecture (no GPU: the build config's ``gpus``) with CMake
               against the TensorRT headers, cached by a hash of its sources and flags (:mod:`.plugin_library`);
               DFLASH2_PLUGIN_LIB names a prebuilt one instead
    engine     in a temporary directory beside ENGINE_DIR: ``build-checkpoint/`` = the checkpoint's config.json
               with the EAGLE fields and ``dflash2_engine`` (engine/pretrained.py) + the rank files hard-linked
               (else symlinked); then trtllm-build (:mod:`.command`) with the model class file, EAGLE mode,
               --max_draft_len K and --workers 1 (the model class file loads the plugin library:
               DFLASH2_PLUGIN_LIB), its output streamed to trtllm-build.log; build-checkpoint/ removed; the plugin library, the
               target's tokenizer files, RUN.md and engine.json added
    verify     (when on) the fixed prompts through the engine's runtime (TensorRT-LLM's runner, or the project runtime
               over TensorRT for the engines the executor cannot run: :mod:`.paths`) vs the target's greedy decoding
    baseline   (--baseline) trtllm-build of the target alone into ``baseline/`` (:func:`_build_baseline`); when it
               fails the combined engine is committed without it and the build then fails
               (:class:`~.process.BaselineBuildError`: one error line, the combined engine kept and usable)
    commit     the temporary directory renamed to ENGINE_DIR

Without TensorRT-LLM (or without the plugin toolchain) the build stops after the steps it can do with
one error line naming what is missing, the kept checkpoint (and plugin library), and the command the
engine step runs.

Everything that touches the machine goes through two injectable objects, so that tests run the whole
branch up to the subprocess calls: :class:`~.toolchain.Toolchain` (what is installed:
:func:`~.toolchain.probe_toolchain`) and a runner (:class:`~.process.SubprocessRunner`: ``runner(argv, env=...,
log=..., cwd=...) -> exit status``).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ... import __version__
from ...bench.trtllm_bench import planned_command, write_bench_files
from ...checkpoint.writer import AtomicOutputDir, check_output_dir, sha256_file
from ...errors import ConfigError, MissingDependencyError
from ...plugins import LIBRARY_NAME
from ...sampling import GREEDY_REQUEST_TEMPERATURE
from ..checkpoint import ensure_checkpoint, link_files
from ..common import eagle_choices, shell_line
from ..format import ENGINE_FORMAT, ENGINE_SCHEMA, BuildResult, copy_tokenizer, torch_version, write_manifest
from ..pretrained import BASELINE_DIR, TARGET_ONLY, baseline_pretrained_config, engine_pretrained_config
from .command import (BASELINE_CLS_NAME, default_checkpoint_dir, engine_config_fixes, trtllm_build_argv,
                      trtllm_build_env)
from .paths import PROJECT, runtime_path
from .plugin_library import ensure_plugin_library, plugin_archs
from .process import BaselineBuildError, EngineBuildError, SubprocessRunner, exit_description, log_tail
from .toolchain import Toolchain, environment_problems, probe_toolchain, trtllm_version_refusal
from .verify import verify_trtllm_engine
from .windows import sm100_refusal


# --------------------------------------------------------------------------------------- RUN.md
def run_cli(py: str) -> str:
    """How RUN.md spells this project's command line in the interpreter ``py`` that built the engine: ``dflash2-trt``
    for this one, ``PY -m dflash2_trt`` for TensorRT-LLM's own (``--trtllm-python``)."""
    return "dflash2-trt" if py == sys.executable else f"{shlex.quote(py)} -m dflash2_trt"


def run_md(man: dict, engine_dir: Path) -> str:
    K = man["block_size"] - 1
    tp = man["tp_size"]
    choices = json.dumps(eagle_choices(K))
    # fill_template.py splits its argument on ',' and ':' and takes '\\' as the escape of either
    braces = "\\,".join("{" + "\\,".join(["0"] * (i + 1)) + "}" for i in range(K))
    eos = (man.get("eos_token_ids") or [None])[0]
    v = man["versions"]
    gpu = man.get("gpu") or {}
    lib = man["plugin_library"]["file"]
    mpi = f"mpirun -n {tp} --allow-run-as-root " if tp > 1 else ""
    renv = man.get("runtime_env") or {}
    py = (man.get("trtllm_build") or {}).get("argv", [sys.executable])[0]
    cli = run_cli(py)
    env_lines = "".join(f"\n    export {k}={val}" for k, val in renv.items())
    env_note = ("\n\n`TRTLLM_ENABLE_XQA_JIT=1`: this engine was built with it (an attention layer whose XQA kernel "
                "for speculative-decoding steps only the JIT path compiles: engine/trtllm/xqa.py); the project "
                "runtime (`dflash2-trt run`, `bench run`, `serve`) sets it itself, TensorRT-LLM's own tools need it "
                "exported" if "TRTLLM_ENABLE_XQA_JIT" in renv else "")
    greedy_t = GREEDY_REQUEST_TEMPERATURE
    trt_env = (f"the environment of `{py}`, which built it (TensorRT-LLM 1.2 on its own pins, this project installed "
               f"there too: `{cli}`; docs/trt-session.md §11)" if py != sys.executable else
               f"the environment of `{py}`, which built it (docs/trt-session.md §11)")
    path = man.get("runtime_path") or {}
    why = "\n".join(f"- {w}" for w in path.get("why") or [])
    limits = "".join(f"\n- limit: {w}" for w in path.get("limits") or [])
    serve = f"\n    {cli} serve --engine-dir {engine_dir}"
    engines = (f"`rank{{r}}.engine` in rank r of {tp} processes (mpirun; rank 0 reports)" if tp > 1
               else "`rank0.engine`")
    served = ("`serve` (and `deploy triton`, which writes its repository) runs the same runtime in a python-backend "
              "Triton model (docs/trt-session.md §8)" + (
                  f": tritonserver as rank 0 and the other {tp - 1} rank(s) following it under mpirun (`serve` starts "
                  f"them; the repository's `launch.sh` does the same)" if tp > 1 else ""))
    bench = "`bench run`" if path.get("path") == PROJECT else "`bench run --runtime project`"
    baseline_line = (f"{bench} compares every concurrency with `baseline/`: the target alone (built by `--baseline`: "
                     f"trtllm-build of the target-only network from the same checkpoint), on the same runtime, one "
                     f"engine on the GPUs at a time; at temperature 0 it also reports whether both emitted the same "
                     f"tokens." if man.get("baseline") else
                     f"This directory has no baseline engine, so {bench} reports no speedup: rebuild with "
                     f"`--baseline` to add the target alone (`baseline/`, the target's weights again on disk).")
    if path.get("path") == PROJECT:
        routed = bool(path.get("context_route"))
        kept = ("nor on any other: this engine's sliding-window layers read `sliding_*` inputs that TensorRT-LLM's "
                "runtime does not bind (the context route: docs/gpu.md \"Sliding windows on TensorRT-LLM\"); they "
                "are kept for reference." if routed else
                "they are kept for a TensorRT-LLM rebuilt with `scripts/patch_trtllm_recurrent_spec.py` (recurrent "
                "targets; never compiled by this project).")
        runtime = f"""**This engine runs on the project runtime over TensorRT** ({path.get('description')}), because:

{why}{limits}

    {mpi}{cli} run --engine-dir {engine_dir} --prompt-ids 1,2,3 --max-new-tokens 64
    {mpi}{cli} bench run --engine-dir {engine_dir} --dataset DATASET.jsonl --concurrency 1,4,16{serve}

{baseline_line}

They load TensorRT-LLM's plugin library (`import tensorrt_llm`) and `{lib}` themselves, deserialize
{engines} with TensorRT's Python API and bind every step's inputs by TensorRT-LLM's runtime rules
(docs/trt-session.md); {served}. Stock TensorRT-LLM 1.2 is enough: no executor check is involved. Sections 2-4 below (the
C++ executor, Triton's `tensorrtllm` backend, trtllm-bench) do NOT run this engine on stock TensorRT-LLM; {kept}"""
    else:
        runtime = f"""**This engine runs on TensorRT-LLM's C++ executor** ({path.get('description') or 'ModelRunnerCpp'}):

{why or '- (engine.json has no runtime_path: built before it was recorded)'}

The project runtime over TensorRT drives it too: `{cli} run --engine-dir {engine_dir} --runtime project ...`.
{baseline_line}"""
    return f"""# Running this engine

Built by dflash2-trt {v['dflash2_trt']} with TensorRT-LLM {v.get('tensorrt_llm')} (TensorRT {v.get('tensorrt')},
CUDA {v.get('cuda')}) on {gpu.get('name') or 'no GPU'} ({gpu.get('sm') or 'n/a'}); target `{man.get('target')}`,
block size {K + 1} (a chain of K = {K} drafts per step), tp {tp}, {man['dtype']}.

Files: `rank{{N}}.engine` (one per TP rank), `config.json` (TensorRT-LLM's engine config: EAGLE one-engine mode,
`speculative_decoding_mode` 32, `max_draft_len` {K}, `num_eagle_layers` {K}, `max_non_leaves_per_layer` 1,
`eagle_net_config.num_hidden_layers` = the drafter's layers), `{lib}` (the DFlash2 TensorRT plugins),
`engine.json` (manifest: versions, GPU, the exact trtllm-build command, sha256 of every file),
`trtllm-build.log`, and `tokenizer/` when the target has one.

The engine drafts, verifies and accepts inside one step (docs/architecture.md §3); the runtime sees an EAGLE
engine. Its limits: EOS, stop words and max length apply; penalties, bad words and min length are
not applied in EAGLE mode; guided decoding and logits post-processors do not combine with in-engine
acceptance. This project has not run a TensorRT-LLM engine on hardware yet: treat the first run as
the check it is.

Every command below runs where TensorRT-LLM imports: {trt_env}.

## 0. Which runtime

{runtime}

## 1. Load the plugins in every process that deserialises the engine

    export LD_PRELOAD={engine_dir}/{lib}${{LD_PRELOAD:+:$LD_PRELOAD}}{env_lines}{env_note}

(Python alternative: `ctypes.CDLL("{engine_dir}/{lib}", mode=ctypes.RTLD_GLOBAL)` before the engine loads.)

## 2. The draft tree: a linear chain of {K}

Every request (or the executor's `DecodingConfig`) passes

    eagle_choices = {choices}

(TensorRT-LLM's default tree has depth 4; a depth other than `num_eagle_layers` = {K} is an error.)

## 3. Run it

    {mpi}{cli} run --engine-dir {engine_dir} --prompt-ids 1,2,3 --max-new-tokens 64

or with TensorRT-LLM's C++ runner directly:

```python
import ctypes, torch
ctypes.CDLL("{engine_dir}/{lib}", mode=ctypes.RTLD_GLOBAL)
from dflash2_trt.trtllm.register import register
register()   # the DFlash2 architectures into tensorrt_llm.models.MODEL_MAP, or from_dir's config parsing fails
from tensorrt_llm.runtime import ModelRunnerCpp
runner = ModelRunnerCpp.from_dir(engine_dir="{engine_dir}", eagle_choices={choices})
out = runner.generate([torch.tensor([1, 2, 3], dtype=torch.int32)], max_new_tokens=64, end_id={eos},
                      pad_id={eos}, temperature={greedy_t}, return_dict=True, output_sequence_lengths=True)
```

Greedy is `temperature={greedy_t}`: for a request without a temperature TensorRT-LLM fills the engine's with
1.0 (this engine then samples), and its EAGLE decoding layer refuses 0; the engine decodes any temperature below
1e-5 greedily.

(the executor API: `tensorrt_llm.bindings.executor.DecodingConfig(eagle_config=EagleConfig(eagle_choices))`
in the `ExecutorConfig`).

## 3b. Benchmarks

{bench_md(man, engine_dir)}

## 4. Triton (the `tensorrtllm` backend)

`{cli} deploy triton --engine-dir {engine_dir} --output <repo>` writes the repository. By hand: in a
copy of the `inflight_batcher_llm` repository (TensorRT-LLM's `triton_backend/all_models/`), fill
`tensorrt_llm/config.pbtxt` with TensorRT-LLM's `triton_backend/tools/fill_template.py` (commas inside a value
are escaped with a backslash):

    python3 fill_template.py -i <repo>/tensorrt_llm/config.pbtxt 'gpt_model_path:{engine_dir},decoding_mode:eagle,eagle_choices:{braces},batching_strategy:inflight_fused_batching,kv_cache_free_gpu_mem_fraction:{man['limits'].get('kv_cache_free_gpu_mem_fraction')}'

(plus the template's other keys: `triton_max_batch_size`, `decoupled_mode`, ...), then start the server with
the plugins preloaded:

    LD_PRELOAD={engine_dir}/{lib} tritonserver --model-repository <repo>

{"For tp > 1: one process per GPU through TensorRT-LLM's launcher, `python3 scripts/launch_triton_server.py --world_size " + str(tp) + " --model_repo <repo>` (it runs `mpirun -n " + str(tp) + "`; export LD_PRELOAD first so every rank inherits it)." if tp > 1 else "tp 1: one GPU, one process."}
"""


def bench_md(man: dict, engine_dir: Path) -> str:
    """RUN.md's benchmark paragraph: trtllm-bench through the launcher (it maps EAGLE mode), else gptManagerBenchmark."""
    K = man["block_size"] - 1
    choices = json.dumps(eagle_choices(K)).replace(" ", "")
    gpt = (f"`benchmarks/cpp/gptManagerBenchmark --engine_dir {engine_dir} --eagle_choices '{choices}' "
           f"--temperature {GREEDY_REQUEST_TEMPERATURE:g} ...` with `LD_PRELOAD` set (`bench run --tool "
           f"gptmanager`; greedy is a temperature below 1e-5: without one TensorRT-LLM fills 1.0 and this engine "
           f"samples, and 0 fails its EAGLE layer)")
    tb = man.get("trtllm_bench") or {}
    if not tb.get("available"):
        return (f"trtllm-bench needs a tokenizer and none was written ({tb.get('why', 'no trtllm-bench/ folder')}); "
                f"use {gpt}.")
    eos = (man.get("eos_token_ids") or [None])[0]
    py = (man.get("trtllm_build") or {}).get("argv", [sys.executable])[0]
    cmd = planned_command(engine_dir=engine_dir, target_key=man.get("target"), draft_len=K,
                          max_batch_size=man["limits"]["max_batch_size"], eos_id=eos,
                          kv_cache_fraction=man["limits"].get("kv_cache_free_gpu_mem_fraction"),
                          python=None if py == sys.executable else py)
    return f"""`{run_cli(py)} bench run --engine-dir {engine_dir} --dataset DATASET.jsonl` runs trtllm-bench per concurrency
and writes the bench report (`bench prepare-dataset --engine-dir {engine_dir} ...` writes a dataset). By hand:

    {cmd["line"]}

`python -m dflash2_trt.bench.trtllm_bench` is trtllm-bench with EAGLE added to its `SPECULATIVE_MAP`
(stock trtllm-bench stops at a KeyError on this engine's mode, 32) and a mode name its report can read, its
arguments passed through unchanged;
`{tb["options"]}` gives the LLM API the chain (`speculative_config`: Eagle, {K} drafts, `eagle_choices`), and
`{tb["model_dir"]}` is the `--model_path` folder it needs (tokenizer, a `{tb["model_type"]}` config with the target's
sizes, a placeholder safetensors: the weights are in the engine), and `{tb.get("sampler_options", "trtllm-bench/sampler_options.yaml")}`
asks for greedy decoding (`temperature: {GREEDY_REQUEST_TEMPERATURE:g}`: without one TensorRT-LLM fills 1.0 and this
engine samples; 0 fails TensorRT-LLM's EAGLE layer). No `--max_seq_len` with `--backend tensorrt`;
every dataset line must fit the engine's max_seq_len. Alternative: {gpt}. Not yet run on a GPU (nor at tp > 1).
"""


# ---------------------------------------------------------------------------------------- build
def build_trtllm(prep, output, *, force: bool = False, command=None, verify: bool = False, checkpoint_dir=None,
                 reconvert: bool = False, keep_checkpoint: bool = True, progress=None, toolchain: Toolchain | None = None,
                 runner=None, verifier=None, baseline: bool = False) -> BuildResult:
    """The TensorRT-LLM engine directory for ``prep`` (:func:`dflash2_trt.engine.plan.prepare`) at ``output``; the
    options are :func:`dflash2_trt.engine.build.build_engine`'s (``verify`` already decided there). ``baseline``:
    also the target alone in ``baseline/`` (:func:`_build_baseline`)."""
    toolchain = toolchain if toolchain is not None else probe_toolchain()
    runner = runner if runner is not None else SubprocessRunner()
    say = progress or (lambda s: None)
    cfg, K = prep.cfg, prep.K
    output = Path(output)
    xqa = prep.xqa   # the XQA kernels' env for trtllm-build and the runtimes (xqa.py; its blockers are trtllm_blockers)
    blockers = prep.blockers + prep.trtllm_blockers
    if blockers:
        raise ConfigError(f"cannot build a TensorRT-LLM engine for this target: {blockers[0]}", source=cfg.source)
    check_output_dir(output, force)
    if toolchain.python and (env_missing := environment_problems(toolchain)[0]):
        # TensorRT-LLM's interpreter was named: what it lacks stops the build before hours of converting
        raise MissingDependencyError(f"the TensorRT-LLM side {toolchain.python} cannot build: {'; '.join(env_missing)}")
    plugin_archs(cfg, toolchain)      # refuses a GPU outside the config's `gpus` before hours of converting
    if (sm100 := sm100_refusal(toolchain.gpu_sm)) is not None:   # no kernel for the engine's steps there
        raise ConfigError(sm100, field="--backend")
    if verify and cfg.tp_size > 1:
        raise ConfigError(f"--verify on a tp {cfg.tp_size} TensorRT-LLM engine needs one MPI rank per GPU; build "
                          f"with --no-verify, then `mpirun -n {cfg.tp_size} dflash2-trt run ...`", field="--verify")
    t0 = time.perf_counter()

    # ---- convert
    temp_ckpt = None
    if checkpoint_dir is None and not keep_checkpoint:
        output.absolute().parent.mkdir(parents=True, exist_ok=True)
        temp_ckpt = Path(tempfile.mkdtemp(prefix=f".{output.name}.checkpoint-", dir=output.absolute().parent))
        ckpt_dir = temp_ckpt / "checkpoint"
    else:
        ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else default_checkpoint_dir(output)
    try:
        say(f"[convert] {ckpt_dir}")
        ck = ensure_checkpoint(prep, ckpt_dir, reconvert=reconvert, progress=say)
        kept = [f"checkpoint {ckpt_dir}"] if temp_ckpt is None else []

        # ---- plugins
        py = toolchain.python    # TensorRT-LLM's interpreter where it is not this one (--trtllm-python)
        final_argv = trtllm_build_argv(cfg, checkpoint_dir=output / "build-checkpoint", output_dir=output, python=py)
        plugin = None
        plugin_err = None
        try:
            say("[plugins]")
            plugin = ensure_plugin_library(cfg, toolchain, runner, progress=say)
            kept.append(f"plugin library {plugin['path']}")
        except MissingDependencyError as exc:
            plugin_err = str(exc)
        missing = [] if plugin_err is None else [plugin_err]
        if toolchain.tensorrt_llm is None:
            missing.insert(0, f"TensorRT-LLM is not importable{f' by {py}' if py else ''} (pip install "
                              f"'tensorrt-llm>=1.2,<1.3' from NVIDIA's index, on a GPU machine, in an environment of "
                              f"its own: docs/trt-session.md §11)")
        elif (wrong := trtllm_version_refusal(toolchain.tensorrt_llm)) is not None:
            missing.insert(0, wrong)
        env_missing, env_warnings = environment_problems(toolchain)
        missing[:0] = env_missing   # e.g. TensorRT-LLM beside transformers 5: it would not import
        for w in env_warnings:
            say(f"warning: {w}")
        if missing:
            lib_env = trtllm_build_env(plugin["path"] if plugin else "<libdflash2_plugins.so>", xqa["env"])
            then = ""
            if baseline:
                base_argv = trtllm_build_argv(cfg, checkpoint_dir=output / "baseline-checkpoint",
                                              output_dir=output / BASELINE_DIR, target_only=True, python=py)
                then = f"; then the baseline's: {shell_line(base_argv, lib_env)}"
            raise MissingDependencyError(
                f"the engine step cannot run here: {'; '.join(missing)}. Kept: {', '.join(kept) or 'nothing'} "
                f"(`dflash2-trt build` on a GPU machine reuses what is kept). The engine step runs: "
                f"{shell_line(final_argv, lib_env)}{then}")

        # ---- engine
        man = None
        with AtomicOutputDir(output, force=force) as tmp:
            bck = tmp / "build-checkpoint"
            bck.mkdir()
            pre = engine_pretrained_config(json.loads((ckpt_dir / "config.json").read_text()), cfg, prep.d)
            (bck / "config.json").write_text(json.dumps(pre, indent=2) + "\n")
            how = link_files(ckpt_dir, bck, [f"rank{r}.safetensors" for r in range(cfg.tp_size)])
            argv = trtllm_build_argv(cfg, checkpoint_dir=bck, output_dir=tmp, python=py)
            env = trtllm_build_env(plugin["path"], xqa["env"])
            log = tmp / "trtllm-build.log"
            log.write_text(f"# {shell_line(argv, env)}\n")
            # the log as it is written (the final directory appears only at the commit)
            say(f"[engine] trtllm-build (log {log}; {output / 'trtllm-build.log'} once built)")
            build_s = _run_trtllm_build(runner, argv, env, log, say=say, echo=bool(progress),
                                        kept_log=output.with_name(output.name + ".trtllm-build-failed.log"),
                                        failed=f"trtllm-build failed ({{rc}}); nothing was written to {output}")
            shutil.rmtree(bck)
            _check_engine_output(tmp, cfg, K, log)
            fixes = _fix_engine_config(tmp, say)
            shutil.copy2(plugin["path"], tmp / LIBRARY_NAME)
            tokenizer = copy_tokenizer(prep.target_dir, tmp)
            bench = write_bench_files(tmp, target_dir=prep.target_dir, t=prep.t, draft_len=K,
                                      final_dir=output.absolute())
            files = engine_files(tmp, sha256_file)
            man = {
                "format": ENGINE_FORMAT, "schema_version": ENGINE_SCHEMA, "backend": "trtllm",
                "target": prep.target_key, "family": prep.t.family, "block_size": cfg.block_size, "dtype": cfg.dtype,
                "tp_size": cfg.tp_size,
                "limits": {k: getattr(cfg, k) for k in ("max_batch_size", "max_input_len", "max_seq_len",
                                                         "max_num_tokens", "tokens_per_block",
                                                         "kv_cache_free_gpu_mem_fraction")},
                "selector": cfg.selector, "drafter_window": cfg.drafter_window,
                "eagle_choices": eagle_choices(K),
                # the interpreter that built and runs the engine: TensorRT-LLM's (--trtllm-python) where given
                "versions": {"dflash2_trt": __version__,
                             "python": (toolchain.python_version if py else None) or sys.version.split()[0],
                             "torch": (toolchain.torch if py else None) or torch_version(),
                             "tensorrt_llm": toolchain.tensorrt_llm, "tensorrt": toolchain.tensorrt,
                             "cuda": toolchain.cuda, "transformers": toolchain.transformers if py else None,
                             "trtllm_python": py},
                "gpu": {"name": toolchain.gpu_name, "sm": toolchain.gpu_sm},
                "sources": {"target_dir": str(prep.target_dir.resolve()), "drafter_dir": str(prep.drafter_dir.resolve()),
                            "checkpoint_dir": str(ckpt_dir.resolve()) if temp_ckpt is None else None,
                            "checkpoint_manifest_sha256": sha256_file(ckpt_dir / "manifest.json"),
                            "checkpoint_reused": ck["reused"]},
                "plugin_library": {"file": LIBRARY_NAME, "built_from": plugin["path"], "archs": plugin.get("archs"),
                                   "cached": plugin["cached"]},
                "trtllm_build": {"argv": argv, "env": env, "line": shell_line(argv, env),
                                 "ran_in": str(tmp), "renamed_to": str(output.absolute()),
                                 "build_checkpoint_files": how, "seconds": round(build_s, 3)},
                # what TensorRT-LLM must see at run time too (xqa.py); `run` sets it before TensorRT-LLM loads
                "runtime_env": dict(xqa["env"]),
                "eos_token_ids": [int(e) for e in prep.t.eos_token_ids], "tokenizer": tokenizer,
                "trtllm_bench": bench, "engine_config_fixes": fixes, "baseline": None,
                # which runtime drives this engine and why (the executor cannot run every DFlash2 engine: .paths)
                "runtime_path": runtime_path(pre),
                "command": command or [], "files": files, "verify": None,
            }
            (tmp / "RUN.md").write_text(run_md(man, output.absolute()))
            man["files"] = engine_files(tmp, sha256_file)
            write_manifest(tmp, man)
            if verify:
                say("[verify] fixed prompts through TensorRT-LLM's runner vs the target's greedy decoding")
                if verifier is None:
                    verifier = verify_trtllm_engine
                man["verify"] = verifier(tmp, target_dir=prep.target_dir, target_key=prep.target_key, python=py,
                                         kept_log=output.absolute().with_name(output.absolute().name
                                                                              + ".verify-failed.log"),
                                         plugin_lib=tmp / LIBRARY_NAME)
                write_manifest(tmp, man)
            baseline_failed = None
            if baseline:   # after the combined engine passed its checks: a failing one costs no baseline build
                try:
                    man["baseline"] = _build_baseline(tmp, pre, cfg, ckpt_dir, env, runner, output, say,
                                                      echo=bool(progress), kept=kept, python=py)
                except EngineBuildError as exc:
                    # the combined engine is complete, checked and already described without a baseline (RUN.md,
                    # engine.json: baseline null, files apart from baseline/): it is committed, the command fails
                    baseline_failed = exc
                    for left in (tmp / BASELINE_DIR, tmp / "baseline-checkpoint"):
                        shutil.rmtree(left, ignore_errors=True)
                else:
                    (tmp / "RUN.md").write_text(run_md(man, output.absolute()))
                    man["files"] = engine_files(tmp, sha256_file)
                    write_manifest(tmp, man)
        man["seconds"] = round(time.perf_counter() - t0, 3)
        if baseline_failed is not None:
            raise BaselineBuildError(str(baseline_failed), BuildResult(output, man))
        return BuildResult(output, man)
    finally:
        if temp_ckpt is not None:
            shutil.rmtree(temp_ckpt, ignore_errors=True)


TRTLLM_BUILD_ECHO = "  trtllm-build | "   # before each line of trtllm-build's own output in a build's progress


def _run_trtllm_build(runner, argv, env, log: Path, *, say, echo: bool, kept_log: Path, failed: str,
                      hint: str = "") -> float:
    """Run one trtllm-build (its output streamed to ``log``, and echoed with ``echo``); returns its seconds. A
    non-zero exit is an :class:`EngineBuildError`: ``failed`` (``{rc}``: the exit status or the signal that killed
    it, :func:`~.process.exit_description`), where its log is kept (``kept_log``: the build's temporary directory
    goes), ``hint``, and the log's last lines."""
    t0 = time.perf_counter()
    rc = runner(argv, env=env, log=log, cwd=None, echo=(lambda line: say(TRTLLM_BUILD_ECHO + line)) if echo else None)
    seconds = time.perf_counter() - t0
    if rc != 0:
        try:
            shutil.copy2(log, kept_log)
        except OSError:
            kept_log = None
        raise EngineBuildError(failed.replace("{rc}", exit_description(rc))
                               + (f"; its log is kept at {kept_log}" if kept_log else "")
                               + hint + f". Last lines:\n{log_tail(log)}")
    return seconds


def _build_baseline(tmp: Path, pre: dict, cfg, ckpt_dir: Path, env: dict, runner, output: Path, say, *,
                    echo: bool, kept: list[str], python: str | None = None) -> dict:
    """``build --baseline``: the target alone (``trtllm/network/target_only.py``) as a second trtllm-build into
    ``tmp/baseline/``, from a build checkpoint of the same rank files whose config is the combined engine's marked
    target-only (:func:`~dflash2_trt.engine.pretrained.baseline_pretrained_config`), with the same limits and
    plugins and no speculative decoding mode. ``bench run`` drives it through the project runtime as the
    autoregressive baseline (bench/session.py). Returns the manifest's ``baseline`` record."""
    # what a failure says (raised once the combined engine is in place: build_trtllm commits it without baseline/)
    reuse = ("reusing the kept " + " and ".join(kept) if any(k.startswith("checkpoint") for k in kept) else
             "converting the checkpoint again (--no-keep-checkpoint)")
    again = (f"the combined engine is built and kept at {output} without {BASELINE_DIR}/ (`bench run` reports no "
             f"speedup); `build --baseline --force` builds both again, {reuse}")
    bck = tmp / "baseline-checkpoint"
    bck.mkdir()
    (bck / "config.json").write_text(json.dumps(baseline_pretrained_config(pre), indent=2) + "\n")
    how = link_files(ckpt_dir, bck, [f"rank{r}.safetensors" for r in range(cfg.tp_size)])
    out = tmp / BASELINE_DIR
    out.mkdir()
    argv = trtllm_build_argv(cfg, checkpoint_dir=bck, output_dir=out, target_only=True, python=python)
    log = out / "trtllm-build.log"
    log.write_text(f"# {shell_line(argv, env)}\n")
    say(f"[baseline] trtllm-build of the target alone (log {log}; {output / BASELINE_DIR / 'trtllm-build.log'} once "
        f"built)")
    seconds = _run_trtllm_build(runner, argv, env, log, say=say, echo=echo,
                                kept_log=output.with_name(output.name + ".baseline-trtllm-build-failed.log"),
                                failed="trtllm-build of the baseline (--baseline) failed ({rc})",
                                hint=f"; {again}")
    shutil.rmtree(bck)
    missing = [f"rank{r}.engine" for r in range(cfg.tp_size) if not (out / f"rank{r}.engine").is_file()]
    if missing or not (out / "config.json").is_file():
        raise EngineBuildError(f"trtllm-build of the baseline exited 0 but wrote no "
                               f"{', '.join(missing) or 'config.json'}; {again}. "
                               f"Last lines of its log:\n{log_tail(log)}")
    try:
        c = json.loads((out / "config.json").read_text())
        got = {"pretrained_config.dflash2_engine.network": (c["pretrained_config"].get("dflash2_engine") or {}).get(
            "network"), "build_config.max_draft_len": c["build_config"].get("max_draft_len")}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise EngineBuildError(f"trtllm-build wrote an unreadable baseline/config.json ({exc}); {again}") from None
    want = {"pretrained_config.dflash2_engine.network": TARGET_ONLY, "build_config.max_draft_len": 0}
    got["build_config.speculative_decoding_mode"] = c["build_config"].get("speculative_decoding_mode")
    want["build_config.speculative_decoding_mode"] = 1          # NONE: no --speculative_decoding_mode
    bad = [f"{k} = {got[k]!r} (expected {want[k]!r})" for k in want if got[k] != want[k]]
    if bad:
        raise EngineBuildError("trtllm-build's baseline/config.json does not describe the target alone: "
                               + "; ".join(bad) + f"; {again}")
    fixes = _fix_engine_config(out, say, name=f"{BASELINE_DIR}/config.json")
    return {"dir": BASELINE_DIR, "network": BASELINE_CLS_NAME,
            "trtllm_build": {"argv": argv, "env": env, "line": shell_line(argv, env), "ran_in": str(tmp),
                             "renamed_to": str(output.absolute()), "build_checkpoint_files": how,
                             "seconds": round(seconds, 3)},
            "engine_config_fixes": fixes, "files": hash_tree(tmp, sha256_file, BASELINE_DIR)}


def engine_files(root: Path, sha) -> dict:
    """engine.json's ``files``: every file of the engine directory but the manifest and ``baseline/`` (the baseline
    engine is optional: its files are ``baseline.files``, checked when it is opened, so a directory whose baseline
    was deleted still runs)."""
    return {rel: meta for rel, meta in hash_tree(root, sha).items()
            if Path(rel).parts[0] != BASELINE_DIR}


def hash_tree(root: Path, sha, under: str | None = None) -> dict:
    """``{path relative to root: {size, sha256}}`` of every file under ``root`` (or ``root/under``) but
    ``engine.json``."""
    base = root / under if under else root
    return {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": sha(p)}
            for p in sorted(base.rglob("*")) if p.is_file() and p.name != "engine.json"}


def _fix_engine_config(tmp: Path, say, name: str = "config.json") -> list[dict]:
    """:func:`~.command.engine_config_fixes` on the config.json trtllm-build wrote (before anything is hashed);
    each change is printed and returned for the manifest."""
    path = tmp / "config.json"
    engine = json.loads(path.read_text())
    fixes = engine_config_fixes(engine)
    if fixes:
        path.write_text(json.dumps(engine, indent=4) + "\n")
        for f in fixes:
            say(f"[engine] {name}: {f['field']} {f['from']!r} -> {f['to']!r} ({f['why']})")
    return fixes


def _check_engine_output(tmp: Path, cfg, K: int, log: Path) -> None:
    """What the runtime needs from trtllm-build's output: one engine per rank and a config.json whose EAGLE
    fields are the chain's (docs/TRTLLM-ENGINE.md §1)."""
    missing = [f"rank{r}.engine" for r in range(cfg.tp_size) if not (tmp / f"rank{r}.engine").is_file()]
    if missing or not (tmp / "config.json").is_file():
        raise EngineBuildError(f"trtllm-build exited 0 but wrote no {', '.join(missing) or 'config.json'}. Last lines "
                               f"of its log:\n{log_tail(log)}")
    try:
        c = json.loads((tmp / "config.json").read_text())
        pre, build = c["pretrained_config"], c["build_config"]
        got = {"pretrained_config.num_eagle_layers": pre.get("num_eagle_layers"),
               "pretrained_config.max_non_leaves_per_layer": pre.get("max_non_leaves_per_layer"),
               "pretrained_config.eagle_net_config.num_hidden_layers": (pre.get("eagle_net_config") or {}).get(
                   "num_hidden_layers"),
               "build_config.max_draft_len": build.get("max_draft_len")}
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise EngineBuildError(f"trtllm-build wrote an unreadable config.json ({exc})") from None
    want = {"pretrained_config.num_eagle_layers": K, "pretrained_config.max_non_leaves_per_layer": 1,
            "pretrained_config.eagle_net_config.num_hidden_layers": pre["dflash2"]["num_hidden_layers"]
            if isinstance(pre.get("dflash2"), dict) else None, "build_config.max_draft_len": K}
    bad = [f"{k} = {got[k]!r} (expected {want[k]!r})" for k in want if got[k] != want[k]]
    if bad:
        raise EngineBuildError("trtllm-build's config.json does not describe the EAGLE chain the runtime needs: "
                               + "; ".join(bad))
