"""``dflash2-trt build --backend trtllm``: TensorRT-LLM rank engines around the project's network file.

Steps (each either completes or leaves nothing of its own behind; Ctrl-C included)::

    validate   configs, pairing, settings; the target has an engine network; the local GPU (if any) is one of
               the build config's ``gpus``; the output may be written (exists -> --force)
    convert    the checkpoint at --checkpoint-dir (default ENGINE_DIR.checkpoint), reused when its manifest
               matches (engine/checkpoint.py), else written atomically; --no-keep-checkpoint: a temporary
               one beside the output, removed at the end
    plugins    libdflash2_plugins.so for the GPU's architecture (no GPU: the build config's ``gpus``) with CMake
               against the TensorRT headers, cached under $DFLASH2_TRT_CACHE/plugins-trt/<sha256>/ (the hash
               covers every file under plugins/, the flags, the TensorRT header version and nvcc's version);
               DFLASH2_PLUGIN_LIB names a prebuilt one instead
    engine     in a temporary directory beside ENGINE_DIR: ``build-checkpoint/`` = the checkpoint's config.json
               with the EAGLE fields and ``dflash2_engine`` (engine/plan.py: engine_pretrained_config) + the
               rank files hard-linked (else symlinked); then trtllm-build with the model class file, EAGLE mode,
               --max_draft_len K and --workers 1 (the model class file loads the plugin library: DFLASH2_PLUGIN_LIB),
               its output streamed to trtllm-build.log; build-checkpoint/ removed; the plugin library, the
               target's tokenizer files, RUN.md and engine.json added
    verify     (when on) the fixed prompts through TensorRT-LLM's runner vs the target's greedy decoding
    commit     the temporary directory renamed to ENGINE_DIR

Without TensorRT-LLM (or without the plugin toolchain) the build stops after the steps it can do with
one error line naming what is missing, the kept checkpoint (and plugin library), and the command the
engine step runs.

Everything that touches the machine goes through two injectable objects, so that tests run the whole
branch up to the subprocess calls: :class:`Toolchain` (what is installed: :func:`probe_toolchain`) and
a runner (:class:`SubprocessRunner`: ``runner(argv, env=..., log=..., cwd=...) -> exit status``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import __version__
from ..bench.trtllm_bench import planned_command, write_bench_files
from ..checkpoint.writer import AtomicOutputDir, check_output_dir, sha256_file
from ..errors import ConfigError, DFlash2Error, MissingDependencyError
from ..plugins import LIBRARY_NAME, plugin_dir
from . import plan as planmod
from .checkpoint import ensure_checkpoint, link_files
from .common import AUTO_MAX_TARGET_BYTES
from .format import ENGINE_FORMAT, ENGINE_SCHEMA, BuildResult, copy_tokenizer, torch_version
from .toolchain import Toolchain, plugin_toolchain_missing, probe_toolchain
from .verify import verify_trtllm_engine

PLUGIN_TARGET = "dflash2_plugins"
_PLUGIN_HASH_VERSION = b"dflash2-trt plugins-trt 1\0"
_LOG_TAIL = 3000


class EngineBuildError(DFlash2Error):
    """trtllm-build (or CMake) failed, or wrote something unexpected."""


# --------------------------------------------------------------------------------------- runner
class SubprocessRunner:
    """Run a command, its output (stdout and stderr) appended line by line to ``log`` and, when given, to
    ``echo`` (progress). Ctrl-C / SIGTERM: the child is interrupted, waited for (then killed), and the
    interrupt re-raised, so the caller's cleanup runs with no child still writing."""

    def __call__(self, argv, *, env=None, log=None, cwd=None, echo=None) -> int:
        full_env = {**os.environ, **(env or {})}
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
                                    text=True, bufsize=1, start_new_session=True)
        except OSError as exc:
            raise EngineBuildError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        fh = open(log, "a", encoding="utf-8") if log is not None else None
        try:
            for line in proc.stdout:
                if fh is not None:
                    fh.write(line)
                    fh.flush()
                if echo is not None:
                    echo(line.rstrip("\n"))
            return proc.wait()
        except BaseException:
            _stop(proc)
            raise
        finally:
            if fh is not None:
                fh.close()


def _stop(proc) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""
    return text if len(text) <= _LOG_TAIL else "..." + text[-_LOG_TAIL:]


# -------------------------------------------------------------------------------------- plugins
def plugin_archs(cfg, toolchain: Toolchain) -> tuple[str, ...]:
    """The architectures to build the plugin library for: the local GPU's (which must be one of the build
    config's ``gpus``), else all of ``gpus`` (cross-compiling needs no GPU)."""
    if toolchain.gpu_sm:
        if toolchain.gpu_sm not in cfg.gpus:
            raise ConfigError(f"this machine's GPU {toolchain.gpu_name} ({toolchain.gpu_sm}) is not one of the build "
                              f"config's gpus ({', '.join(cfg.gpus)}); the kernels target Hopper and Blackwell",
                              source=cfg.source, field="gpus")
        return (toolchain.gpu_sm,)
    return tuple(cfg.gpus)


def _plugin_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not any(part.startswith(".") or part == "build" or part.startswith("build-")
                                   for part in rel.parts):
            out.append(p)
    return out


def plugin_digest(root: Path, archs, toolchain: Toolchain) -> str:
    h = hashlib.sha256(_PLUGIN_HASH_VERSION)
    for a in archs:
        h.update(f"arch={a}\0".encode())
    h.update(f"cuda={toolchain.cuda}\0".encode())
    inc = Path(toolchain.tensorrt_include or "")
    ver = inc / "NvInferVersion.h"
    h.update(ver.read_bytes() if ver.is_file() else b"no NvInferVersion.h")
    for f in _plugin_files(root):
        data = f.read_bytes()
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def plugin_cache_dir() -> Path:
    from ..trtllm.cpu.plugin_libs import cache_dir

    return cache_dir() / "plugins-trt"


def cmake_commands(root: Path, build_dir: Path, archs, toolchain: Toolchain) -> list[list[str]]:
    configure = [toolchain.cmake or "cmake", "-S", str(root), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DCMAKE_CUDA_ARCHITECTURES={planmod.cuda_archs(archs)}",
                 f"-DTensorRT_INCLUDE_DIR={toolchain.tensorrt_include}"]
    inc = Path(toolchain.tensorrt_include or "")
    if inc.name == "include":
        configure.append(f"-DTensorRT_ROOT={inc.parent}")
    if toolchain.nvcc:
        configure.append(f"-DCMAKE_CUDA_COMPILER={toolchain.nvcc}")
    build = [toolchain.cmake or "cmake", "--build", str(build_dir), "--target", PLUGIN_TARGET, "-j",
             str(max(1, os.cpu_count() or 1))]
    return [configure, build]


def ensure_plugin_library(cfg, toolchain: Toolchain, runner, *, progress=None) -> dict:
    """``{"path", "cached", "archs", "commands"}`` of the plugin library, built into the cache unless there."""
    env_lib = os.environ.get("DFLASH2_PLUGIN_LIB")
    if env_lib:
        p = Path(env_lib)
        if not p.is_file():
            raise ConfigError(f"{p} does not exist", field="DFLASH2_PLUGIN_LIB")
        return {"path": str(p.resolve()), "cached": True, "archs": None, "commands": [], "from": "DFLASH2_PLUGIN_LIB"}
    archs = plugin_archs(cfg, toolchain)
    root = plugin_dir().resolve()
    if not (root / "CMakeLists.txt").is_file():
        raise MissingDependencyError(f"the plugin sources are not in {root} (a wheel does not carry plugins/): set "
                                     f"DFLASH2_PLUGIN_DIR to a checkout's plugins/, or DFLASH2_PLUGIN_LIB to a built "
                                     f"{LIBRARY_NAME}")
    missing = plugin_toolchain_missing(toolchain)
    if missing:
        raise MissingDependencyError("cannot build the plugin library: " + "; ".join(missing))
    digest = plugin_digest(root, archs, toolchain)
    final = plugin_cache_dir() / digest
    lib = final / LIBRARY_NAME
    if lib.is_file():
        if progress:
            progress(f"plugins: cached {lib}")
        return {"path": str(lib), "cached": True, "archs": list(archs), "commands": [], "sha256_of_sources": digest}
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        cmds = cmake_commands(root, work / "build", archs, toolchain)
        log = work / "build.log"
        if progress:
            progress(f"plugins: building {LIBRARY_NAME} for {', '.join(archs)} (log {log})")
        for argv in cmds:
            with open(log, "a") as fh:
                fh.write(f"# {planmod.shell_line(argv)}\n")
            rc = runner(argv, env={}, log=log, cwd=None, echo=None)
            if rc != 0:
                raise EngineBuildError(f"CMake failed (exit {rc}) building the plugin library: {planmod.shell_line(argv)}"
                                       f"\n{_tail(log)}")
        cache = _read_cmake_cache(work / "build" / "CMakeCache.txt")
        inc = cache.get("TensorRT_INCLUDE_DIR", "")
        if not inc or inc.endswith("NOTFOUND"):
            raise EngineBuildError(f"CMake did not find the TensorRT headers (TensorRT_INCLUDE_DIR={inc!r}), so the "
                                   f"library would hold kernels but no plugins; set TensorRT_ROOT")
        built = work / "build" / LIBRARY_NAME
        if not built.is_file():
            raise EngineBuildError(f"CMake exited 0 but wrote no {built}\n{_tail(log)}")
        stage = work / "out"
        stage.mkdir()
        shutil.copy2(built, stage / LIBRARY_NAME)
        shutil.copy2(log, stage / "build.log")
        (stage / "build.json").write_text(json.dumps({"archs": list(archs), "commands": cmds,
                                                      "toolchain": toolchain.to_dict()}, indent=2) + "\n")
        try:
            os.rename(stage, final)
        except OSError:
            if not lib.is_file():   # not a concurrent build that got there first
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"path": str(lib), "cached": False, "archs": list(archs), "commands": cmds, "sha256_of_sources": digest}


def _read_cmake_cache(path: Path) -> dict[str, str]:
    out = {}
    try:
        for line in path.read_text(errors="replace").splitlines():
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):[A-Z]+=(.*)$", line)
            if m:
                out[m.group(1)] = m.group(2)
    except OSError:
        pass
    return out


# --------------------------------------------------------------------------------------- RUN.md
def run_md(man: dict, engine_dir: Path) -> str:
    K = man["block_size"] - 1
    tp = man["tp_size"]
    choices = json.dumps(planmod.eagle_choices(K))
    # fill_template.py splits its argument on ',' and ':' and takes '\\' as the escape of either
    braces = "\\,".join("{" + "\\,".join(["0"] * (i + 1)) + "}" for i in range(K))
    eos = (man.get("eos_token_ids") or [None])[0]
    v = man["versions"]
    gpu = man.get("gpu") or {}
    lib = man["plugin_library"]["file"]
    mpi = f"mpirun -n {tp} --allow-run-as-root " if tp > 1 else ""
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

## 1. Load the plugins in every process that deserialises the engine

    export LD_PRELOAD={engine_dir}/{lib}${{LD_PRELOAD:+:$LD_PRELOAD}}

(Python alternative: `ctypes.CDLL("{engine_dir}/{lib}", mode=ctypes.RTLD_GLOBAL)` before the engine loads.)

## 2. The draft tree: a linear chain of {K}

Every request (or the executor's `DecodingConfig`) passes

    eagle_choices = {choices}

(TensorRT-LLM's default tree has depth 4; a depth other than `num_eagle_layers` = {K} is an error.)

## 3. Run it

    {mpi}dflash2-trt run --engine-dir {engine_dir} --prompt-ids 1,2,3 --max-new-tokens 64

or with TensorRT-LLM's C++ runner directly:

```python
import ctypes, torch
ctypes.CDLL("{engine_dir}/{lib}", mode=ctypes.RTLD_GLOBAL)
from dflash2_trt.trtllm.register import register
register()   # the DFlash2 architectures into tensorrt_llm.models.MODEL_MAP, or from_dir's config parsing fails
from tensorrt_llm.runtime import ModelRunnerCpp
runner = ModelRunnerCpp.from_dir(engine_dir="{engine_dir}", eagle_choices={choices})
out = runner.generate([torch.tensor([1, 2, 3], dtype=torch.int32)], max_new_tokens=64, end_id={eos},
                      pad_id={eos}, temperature=0.0, return_dict=True, output_sequence_lengths=True)
```

(the executor API: `tensorrt_llm.bindings.executor.DecodingConfig(eagle_config=EagleConfig(eagle_choices))`
in the `ExecutorConfig`).

## 3b. Benchmarks

{bench_md(man, engine_dir)}

## 4. Triton (the `tensorrtllm` backend)

`dflash2-trt deploy triton --engine-dir {engine_dir} --output <repo>` writes the repository. By hand: in a
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
    choices = json.dumps(planmod.eagle_choices(K)).replace(" ", "")
    gpt = (f"`benchmarks/cpp/gptManagerBenchmark --engine_dir {engine_dir} --eagle_choices '{choices}' ...` with "
           f"`LD_PRELOAD` set (`dflash2-trt bench run --tool gptmanager`)")
    tb = man.get("trtllm_bench") or {}
    if not tb.get("available"):
        return (f"trtllm-bench needs a tokenizer and none was written ({tb.get('why', 'no trtllm-bench/ folder')}); "
                f"use {gpt}.")
    eos = (man.get("eos_token_ids") or [None])[0]
    cmd = planned_command(engine_dir=engine_dir, target_key=man.get("target"), draft_len=K,
                          max_batch_size=man["limits"]["max_batch_size"], eos_id=eos,
                          kv_cache_fraction=man["limits"].get("kv_cache_free_gpu_mem_fraction"))
    return f"""`dflash2-trt bench run --engine-dir {engine_dir} --dataset DATASET.jsonl` runs trtllm-bench per concurrency
and writes the bench report (`bench prepare-dataset --engine-dir {engine_dir} ...` writes a dataset). By hand:

    {cmd["line"]}

`python -m dflash2_trt.bench.trtllm_bench` is trtllm-bench with EAGLE added to its `SPECULATIVE_MAP`
(stock trtllm-bench stops at a KeyError on this engine's mode, 32) and a mode name its report can read, its
arguments passed through unchanged;
`{tb["options"]}` gives the LLM API the chain (`speculative_config`: Eagle, {K} drafts, `eagle_choices`), and
`{tb["model_dir"]}` is the `--model_path` folder it needs (tokenizer, a `{tb["model_type"]}` config with the target's
sizes, a placeholder safetensors: the weights are in the engine). No `--max_seq_len` with `--backend tensorrt`;
every dataset line must fit the engine's max_seq_len. Alternative: {gpt}. Not yet run on a GPU (nor at tp > 1).
"""


# ---------------------------------------------------------------------------------------- build
def build_trtllm(prep, output, *, force: bool = False, command=None, verify="auto", checkpoint_dir=None,
                 reconvert: bool = False, keep_checkpoint: bool = True, progress=None, toolchain: Toolchain | None = None,
                 runner=None, verifier=None):
    toolchain = toolchain if toolchain is not None else probe_toolchain()
    runner = runner if runner is not None else SubprocessRunner()
    say = progress or (lambda s: None)
    cfg, K = prep.cfg, prep.K
    output = Path(output)
    blockers = prep.blockers + prep.trtllm_blockers
    if blockers:
        raise ConfigError(f"cannot build a TensorRT-LLM engine for this target: {blockers[0]}", source=cfg.source)
    check_output_dir(output, force)
    archs = plugin_archs(cfg, toolchain)
    if verify == "auto":
        w = planmod.weight_bytes_per_rank(prep.t, prep.d, cfg.tp_size, cfg.dtype)
        verify = cfg.tp_size == 1 and sum(r["target"] for r in w) <= AUTO_MAX_TARGET_BYTES
    elif verify and cfg.tp_size > 1:
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
        ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else planmod.default_checkpoint_dir(output)
    try:
        say(f"[convert] {ckpt_dir}")
        ck = ensure_checkpoint(prep, ckpt_dir, reconvert=reconvert, progress=say)
        kept = [f"checkpoint {ckpt_dir}"] if temp_ckpt is None else []

        # ---- plugins
        final_argv = planmod.trtllm_build_argv(cfg, checkpoint_dir=output / "build-checkpoint", output_dir=output)
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
            missing.insert(0, "TensorRT-LLM is not importable (pip install 'tensorrt-llm>=1.2,<1.3' from NVIDIA's "
                              "index, on a GPU machine)")
        if missing:
            lib = plugin["path"] if plugin else "<libdflash2_plugins.so>"
            raise MissingDependencyError(
                f"the engine step cannot run here: {'; '.join(missing)}. Kept: {', '.join(kept) or 'nothing'} "
                f"(`dflash2-trt build` on a GPU machine reuses what is kept). The engine step runs: "
                f"{planmod.shell_line(final_argv, planmod.trtllm_build_env(lib))}")

        # ---- engine
        man = None
        with AtomicOutputDir(output, force=force) as tmp:
            bck = tmp / "build-checkpoint"
            bck.mkdir()
            pre = planmod.engine_pretrained_config(json.loads((ckpt_dir / "config.json").read_text()), cfg, prep.d)
            (bck / "config.json").write_text(json.dumps(pre, indent=2) + "\n")
            how = link_files(ckpt_dir, bck, [f"rank{r}.safetensors" for r in range(cfg.tp_size)])
            argv = planmod.trtllm_build_argv(cfg, checkpoint_dir=bck, output_dir=tmp)
            env = planmod.trtllm_build_env(plugin["path"])
            log = tmp / "trtllm-build.log"
            log.write_text(f"# {planmod.shell_line(argv, env)}\n")
            say(f"[engine] trtllm-build (log {output / 'trtllm-build.log'})")
            tb = time.perf_counter()
            rc = runner(argv, env=env, log=log, cwd=None, echo=(lambda line: say("  trtllm-build | " + line))
                        if progress else None)
            build_s = time.perf_counter() - tb
            if rc != 0:
                saved = output.with_name(output.name + ".trtllm-build-failed.log")
                try:
                    shutil.copy2(log, saved)
                except OSError:
                    saved = None
                raise EngineBuildError(f"trtllm-build failed (exit {rc}); nothing was written to {output}"
                                       + (f"; its log is kept at {saved}" if saved else "")
                                       + f". Last lines:\n{_tail(log)}")
            shutil.rmtree(bck)
            _check_engine_output(tmp, cfg, K, log)
            shutil.copy2(plugin["path"], tmp / LIBRARY_NAME)
            tokenizer = copy_tokenizer(prep.target_dir, tmp)
            bench = write_bench_files(tmp, target_dir=prep.target_dir, t=prep.t, draft_len=K,
                                      final_dir=output.absolute())
            files = _hash_files(tmp, sha256_file)
            man = {
                "format": ENGINE_FORMAT, "schema_version": ENGINE_SCHEMA, "backend": "trtllm",
                "target": prep.target_key, "family": prep.t.family, "block_size": cfg.block_size, "dtype": cfg.dtype,
                "tp_size": cfg.tp_size,
                "limits": {k: getattr(cfg, k) for k in ("max_batch_size", "max_input_len", "max_seq_len",
                                                         "max_num_tokens", "tokens_per_block",
                                                         "kv_cache_free_gpu_mem_fraction")},
                "selector": cfg.selector, "drafter_window": cfg.drafter_window,
                "eagle_choices": planmod.eagle_choices(K),
                "versions": {"dflash2_trt": __version__, "python": sys.version.split()[0], "torch": torch_version(),
                             "tensorrt_llm": toolchain.tensorrt_llm, "tensorrt": toolchain.tensorrt,
                             "cuda": toolchain.cuda},
                "gpu": {"name": toolchain.gpu_name, "sm": toolchain.gpu_sm},
                "sources": {"target_dir": str(prep.target_dir.resolve()), "drafter_dir": str(prep.drafter_dir.resolve()),
                            "checkpoint_dir": str(ckpt_dir.resolve()) if temp_ckpt is None else None,
                            "checkpoint_manifest_sha256": sha256_file(ckpt_dir / "manifest.json"),
                            "checkpoint_reused": ck["reused"]},
                "plugin_library": {"file": LIBRARY_NAME, "built_from": plugin["path"], "archs": plugin.get("archs"),
                                   "cached": plugin["cached"]},
                "trtllm_build": {"argv": argv, "env": env, "line": planmod.shell_line(argv, env),
                                 "ran_in": str(tmp), "renamed_to": str(output.absolute()),
                                 "build_checkpoint_files": how, "seconds": round(build_s, 3)},
                "eos_token_ids": [int(e) for e in prep.t.eos_token_ids], "tokenizer": tokenizer,
                "trtllm_bench": bench,
                "command": command or [], "files": files, "verify": None,
            }
            (tmp / "RUN.md").write_text(run_md(man, output.absolute()))
            man["files"] = _hash_files(tmp, sha256_file)
            _write_manifest(tmp, man)
            if verify:
                say("[verify] fixed prompts through TensorRT-LLM's runner vs the target's greedy decoding")
                if verifier is None:
                    verifier = verify_trtllm_engine
                man["verify"] = verifier(tmp, target_dir=prep.target_dir, target_key=prep.target_key,
                                         plugin_lib=tmp / LIBRARY_NAME)
                _write_manifest(tmp, man)
        man["seconds"] = round(time.perf_counter() - t0, 3)
        return BuildResult(output, man)
    finally:
        if temp_ckpt is not None:
            shutil.rmtree(temp_ckpt, ignore_errors=True)


def _hash_files(root: Path, sha) -> dict:
    return {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": sha(p)}
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "engine.json"}


def _write_manifest(tmp: Path, man: dict) -> None:
    with open(tmp / "engine.json", "w") as f:
        f.write(json.dumps(man, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _check_engine_output(tmp: Path, cfg, K: int, log: Path) -> None:
    """What the runtime needs from trtllm-build's output: one engine per rank and a config.json whose EAGLE
    fields are the chain's (docs/TRTLLM-ENGINE.md §1)."""
    missing = [f"rank{r}.engine" for r in range(cfg.tp_size) if not (tmp / f"rank{r}.engine").is_file()]
    if missing or not (tmp / "config.json").is_file():
        raise EngineBuildError(f"trtllm-build exited 0 but wrote no {', '.join(missing) or 'config.json'}. Last lines "
                               f"of its log:\n{_tail(log)}")
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
