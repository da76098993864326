"""The whole ``build --backend trtllm`` branch up to the subprocess calls, with a recorded command line.

The machine is faked at its two seams (dflash2_trt/engine/trtllm/build.py): a :class:`Toolchain` saying what is
installed, and a runner that records each command and plays CMake / trtllm-build by writing what they would
(a library file; rank engines and a TensorRT-LLM config.json). What is asserted: the exact commands (spelt out
here, not rebuilt from the code under test), the derived build checkpoint trtllm-build reads, every file placed,
checkpoint and plugin-library reuse, and that every failure (missing TensorRT-LLM, a manifest that does not match,
a failed or interrupted step) leaves no half-written engine directory.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash2_trt.assets import trained_pair
from dflash2_trt.engine.build import build_engine
from dflash2_trt.engine.format import load_engine_dir
from dflash2_trt.engine.checkpoint import checkpoint_problems
from dflash2_trt.engine.trtllm.process import EngineBuildError
from dflash2_trt.engine.trtllm.toolchain import Toolchain
from dflash2_trt.errors import ConfigError, MissingDependencyError
from dflash2_trt.trtllm.backend import MODEL_FILE

SETS = {"drafter_window": "full"}          # tiny's drafter has a sliding layer: TensorRT-LLM needs full
FLAGS_TAIL = ["--model_cls_file", str(MODEL_FILE), "--model_cls_name", "DFlash2ForCausalLM",
              "--speculative_decoding_mode", "eagle", "--max_draft_len", "7", "--max_batch_size", "4",
              "--max_input_len", "256", "--max_seq_len", "512", "--max_num_tokens", "1024", "--max_beam_width", "1",
              "--kv_cache_type", "paged", "--tokens_per_block", "32", "--gpt_attention_plugin", "auto",
              "--gemm_plugin", "auto", "--context_fmha", "enable", "--use_paged_context_fmha", "enable",
              "--remove_input_padding", "enable", "--logits_dtype", "float32", "--workers", "1"]


@pytest.fixture(scope="module")
def pair():
    return trained_pair("qwen3")


@pytest.fixture(autouse=True)
def _own_plugin_cache(tmp_path_factory, monkeypatch):
    """Each test starts with an empty plugin-library cache (and the real DFLASH2_PLUGIN_LIB unset)."""
    monkeypatch.setenv("DFLASH2_TRT_CACHE", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.delenv("DFLASH2_PLUGIN_LIB", raising=False)


def declared_toolchain(tmp_path) -> Toolchain:
    """An H200 machine with TensorRT-LLM 1.2.0, TensorRT 10.13 (its headers under ``tmp_path``), CMake and nvcc."""
    inc = tmp_path / "TensorRT-10.13" / "include"
    inc.mkdir(parents=True)
    (inc / "NvInferVersion.h").write_text("#define TRT_MAJOR_ENTERPRISE 10\n#define TRT_MINOR_ENTERPRISE 13\n")
    return Toolchain(tensorrt_llm="1.2.0", tensorrt="10.13.3", trtllm_build="/opt/trt/bin/trtllm-build",
                     cmake="/opt/cmake/bin/cmake", nvcc="/usr/local/cuda/bin/nvcc", cuda="12.9",
                     tensorrt_include=str(inc), gpu_name="NVIDIA H200", gpu_sm="sm_90a")


@pytest.fixture
def toolchain(tmp_path):
    return declared_toolchain(tmp_path)


class FakeRunner:
    """Records every command; plays cmake (configure: CMakeCache.txt; build: the .so) and trtllm-build."""

    def __init__(self, *, trtllm_rc=0, interrupt_in=None, eagle_fields=True, fail_call=None):
        self.calls, self.seen = [], []
        self.trtllm_rc, self.interrupt_in, self.eagle_fields = trtllm_rc, interrupt_in, eagle_fields
        self.fail_call = fail_call          # (n, rc): the n-th trtllm-build call (0-based) exits rc

    def __call__(self, argv, *, env=None, log=None, cwd=None, echo=None):
        argv = list(argv)
        # trtllm-build runs as `python -m dflash2_trt.trtllm.register ...` (MODEL_MAP registration first)
        tool = "trtllm-build" if argv[1:3] == ["-m", "dflash2_trt.trtllm.register"] else Path(argv[0]).name
        self.calls.append({"tool": tool, "argv": argv, "env": dict(env or {})})
        if self.interrupt_in == tool:
            raise KeyboardInterrupt
        if tool == "cmake" and "-S" in argv:
            build = Path(argv[argv.index("-B") + 1])
            build.mkdir(parents=True)
            inc = next(a.split("=", 1)[1] for a in argv if a.startswith("-DTensorRT_INCLUDE_DIR="))
            (build / "CMakeCache.txt").write_text(f"TensorRT_INCLUDE_DIR:PATH={inc}\n")
        elif tool == "cmake":
            (Path(argv[argv.index("--build") + 1]) / "libdflash2_plugins.so").write_bytes(b"\x7fELF fake plugins")
        elif tool == "trtllm-build":
            ck = Path(argv[argv.index("--checkpoint_dir") + 1])
            out = Path(argv[argv.index("--output_dir") + 1])
            pre = json.loads((ck / "config.json").read_text())
            tp = pre["mapping"]["tp_size"]
            self.seen.append({"config": pre, "files": sorted(p.name for p in ck.iterdir()),
                              "ranks": {f"rank{r}.safetensors": os.stat(ck / f"rank{r}.safetensors")[1:3]
                                        for r in range(tp)},   # (inode, device) the file resolves to
                              "plugin_lib_exists": Path(env["DFLASH2_PLUGIN_LIB"]).is_file()})
            with open(log, "a") as f:
                f.write("[TRT-LLM] [I] Total time of building all engines: 00:00:01\n")
            # builder.build's timing cache, at the path as given: relative to the working directory by default
            # (facts/trtllm_build_cli.yaml timing_cache_written)
            cache = argv[argv.index("--output_timing_cache") + 1] if "--output_timing_cache" in argv else "model.cache"
            Path(cwd or ".", cache).write_bytes(b"timing cache")
            if self.trtllm_rc:
                return self.trtllm_rc
            if self.fail_call is not None and self.fail_call[0] == len(self.seen) - 1:
                return self.fail_call[1]
            # what trtllm-build's main and builder.build make of the flags (facts/trtllm_build_cli.yaml checks
            # speculative_mode, max_draft_len_from_config, speculative_sizes): no mode is NONE (1) and no draft slots
            eagle = "--speculative_decoding_mode" in argv
            draft = int(argv[argv.index("--max_draft_len") + 1]) if "--max_draft_len" in argv else 0
            draft = draft or int(pre.get("max_draft_len") or 0)
            seq = int(argv[argv.index("--max_seq_len") + 1]) + (2 * draft if eagle else 0)
            for r in range(tp):
                (out / f"rank{r}.engine").write_bytes(b"fake engine %d" % r)
            built = dict(pre)
            if not self.eagle_fields:
                built.pop("num_eagle_layers")
            built["logits_dtype"] = "float32"
            (out / "config.json").write_text(json.dumps({
                "version": "1.2.0", "pretrained_config": built,
                "build_config": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": seq, "max_num_tokens": 1024,
                                 "max_draft_len": draft, "speculative_decoding_mode": 32 if eagle else 1,
                                 # as BuildConfig.update_kv_cache_type leaves it for a non-Mamba architecture
                                 "plugin_config": {"tokens_per_block": 32, "paged_state": False,
                                                   "mamba_conv1d_plugin": "auto"}}}))
        return 0

    def tools(self):
        return [c["tool"] for c in self.calls]


def _build(pair, out, toolchain, runner, **kw):
    kw.setdefault("sets", SETS)
    kw.setdefault("verify", False)
    return build_engine(pair.drafter_dir, pair.target_dir, out, backend="trtllm", target_key="tiny",
                        toolchain=toolchain, runner=runner, **kw)


def _left_beside(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith("." + out.name))


def test_trtllm_branch_commands_and_files(pair, tmp_path, toolchain):
    out = tmp_path / "eng"
    r = FakeRunner()
    res = _build(pair, out, toolchain, r, command=["dflash2-trt", "build"])
    assert r.tools() == ["cmake", "cmake", "trtllm-build"]
    # CMake: the local GPU's architecture, the TensorRT headers, into a temporary build dir
    conf, build, tb = r.calls
    inc = Path(toolchain.tensorrt_include)
    bdir = conf["argv"][conf["argv"].index("-B") + 1]
    assert conf["argv"] == ["/opt/cmake/bin/cmake", "-S", str(Path(__file__).resolve().parents[2] / "plugins"), "-B",
                            bdir, "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CUDA_ARCHITECTURES=90a",
                            f"-DTensorRT_INCLUDE_DIR={inc}", f"-DTensorRT_ROOT={inc.parent}",
                            "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc"]
    assert build["argv"][:5] == ["/opt/cmake/bin/cmake", "--build", bdir, "--target", "dflash2_plugins"]
    # trtllm-build: in a temporary directory beside the output, renamed at the end
    argv = tb["argv"]
    tmp_out = Path(argv[6])
    assert argv[:7] == [sys.executable, "-m", "dflash2_trt.trtllm.register", "--checkpoint_dir",
                        str(tmp_out / "build-checkpoint"), "--output_dir", str(tmp_out)]
    assert argv[7:] == [*FLAGS_TAIL, "--output_timing_cache", str(tmp_out / "build-checkpoint" / "model.cache")]
    assert tmp_out.parent == out.parent.absolute() and tmp_out.name.startswith(".eng.tmp-")
    lib = Path(tb["env"]["DFLASH2_PLUGIN_LIB"])
    assert tb["env"] == {"DFLASH2_PLUGIN_LIB": str(lib), "DFLASH2_TRT_BACKEND": "trtllm"}
    assert lib.name == "libdflash2_plugins.so" and "plugins-trt" in lib.parts
    # what trtllm-build read: the checkpoint's config.json + the engine fields, the reusable checkpoint's rank files
    seen = r.seen[0]
    pre = seen["config"]
    assert (pre["num_eagle_layers"], pre["max_non_leaves_per_layer"], pre["max_draft_len"]) == (7, 1, 7)
    assert pre["eagle_net_config"] == {"num_hidden_layers": 2}
    assert pre["dflash2_engine"] == {"selector": "greedy", "drafter_window": "full", "max_seq_len": 512,
                                     "tokens_per_block": 32, "sliding_path": "generation"}
    ckpt = tmp_path / "eng.checkpoint"
    assert seen["files"] == ["config.json", "rank0.safetensors"] and seen["plugin_lib_exists"]
    assert seen["ranks"]["rank0.safetensors"] == os.stat(ckpt / "rank0.safetensors")[1:3]   # linked, not copied
    reusable = json.loads((ckpt / "config.json").read_text())
    assert "num_eagle_layers" not in reusable and "dflash2_engine" not in reusable   # never edited
    assert {k: v for k, v in pre.items() if k not in ("num_eagle_layers", "max_non_leaves_per_layer",
                                                        "eagle_net_config", "dflash2_engine")} == reusable
    # the engine dir
    names = sorted(p.name for p in out.iterdir())
    man = json.loads((out / "engine.json").read_text())
    expect = ["RUN.md", "config.json", "engine.json", "libdflash2_plugins.so", "rank0.engine", "trtllm-bench",
              "trtllm-build.log"]
    if man["tokenizer"]:
        expect.append("tokenizer")
    assert names == sorted(expect)
    assert (out / "libdflash2_plugins.so").read_bytes() == b"\x7fELF fake plugins"
    assert "Total time of building all engines" in (out / "trtllm-build.log").read_text()
    assert man["backend"] == "trtllm" and man["block_size"] == 8 and man["dtype"] == "float32"
    assert man["versions"]["tensorrt_llm"] == "1.2.0" and man["versions"]["tensorrt"] == "10.13.3"
    assert man["versions"]["cuda"] == "12.9" and man["gpu"] == {"name": "NVIDIA H200", "sm": "sm_90a"}
    assert man["trtllm_build"]["argv"] == argv and man["trtllm_build"]["env"] == tb["env"]
    assert man["eagle_choices"] == [[0] * i for i in range(1, 8)]
    assert man["command"] == ["dflash2-trt", "build"] and man["verify"] is None
    assert set(man["files"]) == {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} - {"engine.json"}
    cfg, man2 = load_engine_dir(out, verify=True)           # every sha256 matches
    assert man2 == man and cfg["build_config"]["speculative_decoding_mode"] == 32
    # what trtllm-bench needs beside the engine (tests/bench/test_trtllm_bench.py checks their contents)
    bench = man["trtllm_bench"]
    assert bench["available"] is True and bench["model_type"] == "qwen3"
    assert sorted(p.name for p in (out / "trtllm-bench").iterdir()) == ["extra_llm_api_options.yaml", "model",
                                                                         "sampler_options.yaml"]
    assert sorted(p.name for p in (out / "trtllm-bench" / "model").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    import yaml

    opts = yaml.safe_load((out / "trtllm-bench" / "extra_llm_api_options.yaml").read_text())["speculative_config"]
    assert opts["speculative_model_dir"] == str(out.absolute() / "trtllm-bench" / "model")   # the final path
    assert opts["max_draft_len"] == 7 and opts["eagle_choices"] == man["eagle_choices"]
    run = (out / "RUN.md").read_text()
    for needle in (f"LD_PRELOAD={out.absolute()}/libdflash2_plugins.so", json.dumps(man["eagle_choices"]),
                   "ModelRunnerCpp.from_dir", "tritonserver", "decoding_mode:eagle",
                   r"eagle_choices:{0}\,{0\,0}\,{0\,0\,0}\,", "gptManagerBenchmark",
                   f"python -m dflash2_trt.bench.trtllm_bench --model dflash2-trt/tiny --model_path "
                   f"{out.absolute()}/trtllm-bench/model throughput --backend tensorrt --engine_dir {out.absolute()} "
                   f"--dataset DATASET.jsonl --extra_llm_api_options "
                   f"{out.absolute()}/trtllm-bench/extra_llm_api_options.yaml"):
        assert needle in run, needle
    assert "mpirun" not in run
    # the runner example asks for greedy as TensorRT-LLM's EAGLE layer takes it (engine_io.yaml request_temperature)
    assert "temperature=1e-06," in run and "temperature=0.0" not in run
    assert "--temperature 1e-06" in run and "trtllm-bench/sampler_options.yaml" in run   # the bench commands too
    assert res.manifest["sources"]["checkpoint_reused"] is False
    assert _left_beside(out) == []
    assert checkpoint_problems(ckpt, _prep(pair)) == []


def _prep(pair, **over):
    from dflash2_trt.engine.plan import prepare

    return prepare(pair.drafter_dir, pair.target_dir, target_key="tiny", sets=SETS, overrides=over)


def test_checkpoint_and_plugin_library_are_reused(pair, tmp_path, toolchain, monkeypatch):
    out = tmp_path / "eng"
    _build(pair, out, toolchain, FakeRunner())
    import dflash2_trt.convert as conv

    def no_convert(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(conv, "convert_pair", no_convert)
    r = FakeRunner()
    res = _build(pair, out, toolchain, r, force=True)
    assert r.tools() == ["trtllm-build"]                      # no CMake: the cached library
    assert res.manifest["sources"]["checkpoint_reused"] is True and res.manifest["plugin_library"]["cached"] is True


def test_mismatching_checkpoint_is_refused_then_reconverted(pair, tmp_path, toolchain):
    out, ckpt = tmp_path / "eng", tmp_path / "ck"
    _build(pair, out, toolchain, FakeRunner(), checkpoint_dir=ckpt)
    before = (ckpt / "manifest.json").read_text()
    r = FakeRunner()
    with pytest.raises(ConfigError, match=r"ck/manifest.json: exists and does not match this build: dtype: "
                                          r"'float32', this build needs 'float16'; pass --reconvert") as ei:
        _build(pair, tmp_path / "eng2", toolchain, r, checkpoint_dir=ckpt, overrides={"dtype": "float16"})
    assert "\n" not in str(ei.value)
    assert r.calls == [] and not (tmp_path / "eng2").exists() and (ckpt / "manifest.json").read_text() == before
    # a checkpoint written from other sources: the manifest's identity says so
    man = json.loads(before)
    man["sources"]["target"]["config_sha256"] = "0" * 64
    (ckpt / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ConfigError, match="sources.target: written from different files"):
        _build(pair, tmp_path / "eng2", toolchain, FakeRunner(), checkpoint_dir=ckpt)
    res = _build(pair, tmp_path / "eng2", toolchain, FakeRunner(), checkpoint_dir=ckpt, reconvert=True,
                 overrides={"dtype": "float16"})
    assert json.loads((ckpt / "manifest.json").read_text())["dtype"] == "float16"
    assert res.manifest["dtype"] == "float16" and res.manifest["sources"]["checkpoint_reused"] is False


@pytest.mark.parametrize("what", ["documents", "an engine", "a foreign manifest"])
def test_reconvert_replaces_only_a_checkpoint(pair, tmp_path, toolchain, what):
    """`--checkpoint-dir DIR --reconvert` replaced any non-empty DIR (a reviewer's documents, a built engine); now
    only a directory whose manifest.json is the converter's."""
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    if what == "documents":
        (ckpt / "thesis.txt").write_text("important")
    elif what == "an engine":
        (ckpt / "engine.json").write_text("{}")
        (ckpt / "checkpoint").mkdir()
    else:
        (ckpt / "manifest.json").write_text(json.dumps({"format": "something else"}))
    before = sorted(p.name for p in ckpt.iterdir())
    r = FakeRunner()
    with pytest.raises(ConfigError, match=r"ck: not empty and not a dflash2-trt checkpoint .* give a new or empty "
                                          r"--checkpoint-dir") as ei:
        _build(pair, tmp_path / "eng", toolchain, r, checkpoint_dir=ckpt, reconvert=True)
    assert "\n" not in str(ei.value) and r.calls == []
    assert sorted(p.name for p in ckpt.iterdir()) == before and not (tmp_path / "eng").exists()


def test_without_tensorrt_llm_stops_before_the_engine(pair, tmp_path, toolchain):
    from dataclasses import replace

    out = tmp_path / "eng"
    r = FakeRunner()
    with pytest.raises(MissingDependencyError) as ei:
        _build(pair, out, replace(toolchain, tensorrt_llm=None, trtllm_build=None), r)
    msg = str(ei.value)
    assert "\n" not in msg and "TensorRT-LLM is not importable" in msg
    assert "-m dflash2_trt.trtllm.register --checkpoint_dir" in msg and "--max_draft_len 7" in msg and "--model_cls_file" in msg
    assert f"checkpoint {tmp_path / 'eng.checkpoint'}" in msg and "plugin library" in msg
    assert r.tools() == ["cmake", "cmake"]                     # the library is built and kept
    assert not out.exists() and _left_beside(out) == []
    assert checkpoint_problems(tmp_path / "eng.checkpoint", _prep(pair)) == []   # complete, reusable
    # neither TensorRT-LLM nor the plugin toolchain (this machine): both named, the checkpoint still kept
    r = FakeRunner()
    with pytest.raises(MissingDependencyError, match="TensorRT headers") as ei:
        _build(pair, out, replace(toolchain, tensorrt_llm=None, tensorrt_include=None, gpu_sm=None), r)
    assert r.calls == [] and "TensorRT-LLM is not importable" in str(ei.value) and not out.exists()
    # with --baseline the line names the second command too
    with pytest.raises(MissingDependencyError) as ei:
        _build(pair, out, replace(toolchain, tensorrt_llm=None, trtllm_build=None), FakeRunner(), baseline=True)
    then = str(ei.value).split("; then the baseline's: ", 1)
    assert len(then) == 2 and "--model_cls_name TargetOnlyForCausalLM" in then[1] and "--max_draft_len" not in then[1]
    assert f"--output_dir {out / 'baseline'}" in then[1] and "\n" not in str(ei.value)


@pytest.mark.parametrize("version,why", [("1.3.0rc21", "releases after 1.3.0rc20 have no TensorRT engine backend"),
                                         ("1.3.0rc5", "not checked against it"),
                                         ("1.1.0", "older releases lack pieces"), ("2.0", "not checked against it")])
def test_a_tensorrt_llm_outside_1_2_stops_before_the_engine(pair, tmp_path, toolchain, monkeypatch, version, why):
    """The project supports tensorrt-llm>=1.2,<1.3 (what the network, build steps and runtime facts were checked
    against); an installed 1.3 or 1.1 was taken as is and trtllm-build run with it. Now it is named, with the pin, before the
    engine step (the checkpoint and plugin library kept, as for a missing TensorRT-LLM); DFLASH2_TRTLLM_ANY_VERSION=1
    builds anyway and the engine records the version."""
    from dataclasses import replace

    from dflash2_trt.engine.plan import dry_run_plan
    from dflash2_trt.engine.trtllm.toolchain import trtllm_version_problem

    monkeypatch.delenv("DFLASH2_TRTLLM_ANY_VERSION", raising=False)
    for ok in ("1.2.0", "1.2.1", "1.2.0rc2", "1.2.0.post1", "unknown", None):
        assert trtllm_version_problem(ok) is None, ok
    out = tmp_path / "eng"
    r = FakeRunner()
    with pytest.raises(MissingDependencyError) as ei:
        _build(pair, out, replace(toolchain, tensorrt_llm=version), r)
    msg = str(ei.value)
    assert f"TensorRT-LLM {version} is installed" in msg and why in msg and "'tensorrt-llm>=1.2,<1.3'" in msg, msg
    assert "\n" not in msg and "trtllm-build" not in r.tools() and not out.exists() and _left_beside(out) == []
    plan = dry_run_plan(pair.drafter_dir, pair.target_dir, backend="trtllm", target_key="tiny", sets=SETS,
                        toolchain=replace(toolchain, tensorrt_llm=version))
    assert any(f"TensorRT-LLM {version} is installed" in m for m in plan["machine"]["missing"])
    monkeypatch.setenv("DFLASH2_TRTLLM_ANY_VERSION", "1")
    res = _build(pair, out, replace(toolchain, tensorrt_llm=version), FakeRunner())
    assert res.manifest["versions"]["tensorrt_llm"] == version and out.is_dir()


def test_cli_on_this_machine_names_what_is_missing(pair, tmp_path):
    out = tmp_path / "eng"
    r = CliRunner().invoke(main_cli(), ["build", "--target", "tiny", "--backend", "trtllm", "--output", str(out),
                                        "--set", "drafter_window=full", "--dtype", "float16", "--no-verify"])
    ckpt = tmp_path / "eng.checkpoint"
    *steps, last = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and r.stdout == "" and last.startswith("error: the engine step cannot run here")
    assert "-m dflash2_trt.trtllm.register --checkpoint_dir" in last
    # stderr is not a terminal here (a log, a CI job): a TensorRT-LLM build still says its steps, one line each
    assert steps == [f"[convert] {ckpt}", f"checkpoint: converting into {ckpt}", "[plugins]"], steps
    assert not out.exists() and (ckpt / "manifest.json").is_file()


def main_cli():
    from dflash2_trt.cli import main

    return main


@pytest.mark.parametrize("tool", ["cmake", "trtllm-build"])
def test_interrupt_leaves_nothing_half_written(pair, tmp_path, toolchain, tool):
    from dflash2_trt.engine.trtllm.plugin_library import plugin_cache_dir

    out = tmp_path / "eng"
    cached = set(plugin_cache_dir().glob("*")) if plugin_cache_dir().is_dir() else set()
    if tool == "trtllm-build":
        _build(pair, tmp_path / "warm", toolchain, FakeRunner())     # library cached: the interrupt hits trtllm-build
        cached = set(plugin_cache_dir().glob("*"))
    else:
        toolchain = Toolchain(**{**toolchain.to_dict(), "cuda": "interrupt-test"})   # a fresh library hash
    with pytest.raises(KeyboardInterrupt):
        _build(pair, out, toolchain, FakeRunner(interrupt_in=tool))
    assert not out.exists() and _left_beside(out) == []
    assert set(plugin_cache_dir().glob("*")) == cached                 # no half-built library, no build dir
    assert checkpoint_problems(tmp_path / "eng.checkpoint", _prep(pair)) == []


def test_trtllm_build_writes_nothing_in_the_working_directory(pair, tmp_path, toolchain, monkeypatch):
    """trtllm-build saves TensorRT's timing cache at --output_timing_cache as given (default model.cache, relative to
    its working directory, the user's): the build points it into the temporary build checkpoint, removed with it."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "model.cache").write_bytes(b"the user's own file")
    monkeypatch.chdir(here)
    r = FakeRunner()
    _build(pair, tmp_path / "eng", toolchain, r, baseline=True)
    assert r.tools().count("trtllm-build") == 2
    assert sorted(p.name for p in here.iterdir()) == ["model.cache"]
    assert (here / "model.cache").read_bytes() == b"the user's own file"
    assert not list((tmp_path / "eng").rglob("model.cache")) and _left_beside(tmp_path / "eng") == []


def test_progress_names_the_log_trtllm_build_is_writing(pair, tmp_path, toolchain):
    """The step's line names the log file being written (inside the temporary directory: the engine directory only
    appears at the end), so that `tail -f` on it works during an hours-long build."""
    said = []

    class Watching(FakeRunner):
        def __call__(self, argv, **kw):
            if list(argv[1:3]) == ["-m", "dflash2_trt.trtllm.register"]:
                named = re.search(r"trtllm-build.* \(log (\S+); (\S+) once built\)$", said[-1])
                assert named, said[-1]
                assert Path(named[1]) == Path(kw["log"]) and Path(named[1]).is_file()
                self.finals.append(Path(named[2]))
            return super().__call__(argv, **kw)

    r = Watching()
    r.finals = []
    out = tmp_path / "eng"
    _build(pair, out, toolchain, r, baseline=True, progress=said.append)
    assert r.finals == [out / "trtllm-build.log", out / "baseline" / "trtllm-build.log"]
    assert all(f.is_file() for f in r.finals)


def test_trtllm_build_failure_keeps_only_its_log(pair, tmp_path, toolchain):
    out = tmp_path / "eng"
    with pytest.raises(EngineBuildError, match=r"trtllm-build failed \(exit 3\); nothing was written") as ei:
        _build(pair, out, toolchain, FakeRunner(trtllm_rc=3))
    assert "Total time of building" in str(ei.value)
    assert not out.exists() and _left_beside(out) == []
    assert "Total time of building" in (tmp_path / "eng.trtllm-build-failed.log").read_text()


def test_a_killed_trtllm_build_is_named_by_its_signal(pair, tmp_path, toolchain):
    """A trtllm-build the kernel kills (SIGKILL: the out-of-memory killer, a 27B build on a small host) ends with a
    negative status from Popen: the error names the signal and where to look, not "exit -9"."""
    out = tmp_path / "eng"
    with pytest.raises(EngineBuildError, match=r"trtllm-build failed \(killed by SIGKILL; the kernel's "
                                               r"out-of-memory killer .*dmesg`\); nothing was written") as ei:
        _build(pair, out, toolchain, FakeRunner(trtllm_rc=-9))
    assert "exit -9" not in str(ei.value) and "(killed by SIGKILL" in str(ei.value)   # (paths may hold "-9")
    assert not out.exists() and _left_beside(out) == []
    assert (tmp_path / "eng.trtllm-build-failed.log").is_file()
    with pytest.raises(EngineBuildError, match=r"failed \(killed by SIGTERM\); nothing"):
        _build(pair, tmp_path / "eng2", toolchain, FakeRunner(trtllm_rc=-15))


def test_engine_config_without_the_eagle_chain_is_refused(pair, tmp_path, toolchain):
    out = tmp_path / "eng"
    with pytest.raises(EngineBuildError, match="pretrained_config.num_eagle_layers = None \\(expected 7\\)"):
        _build(pair, out, toolchain, FakeRunner(eagle_fields=False))
    assert not out.exists() and _left_beside(out) == []


def test_verify_gate_runs_on_the_finished_engine_and_can_fail_it(pair, tmp_path, toolchain):
    from dflash2_trt.engine.verify import VerifyError

    seen = []

    def ok(engine_dir, **kw):
        seen.append(sorted(p.name for p in Path(engine_dir).iterdir()))
        return {"passed": True, "prompts": 4, "tokens": 96}

    res = _build(pair, tmp_path / "eng", toolchain, FakeRunner(), verify=True, verifier=ok)
    assert "rank0.engine" in seen[0] and "engine.json" in seen[0] and "libdflash2_plugins.so" in seen[0]
    assert json.loads((tmp_path / "eng" / "engine.json").read_text())["verify"]["tokens"] == 96
    assert res.manifest["verify"]["passed"]

    def bad(engine_dir, **kw):
        raise VerifyError("verify failed: prompt 0: output token 3 differs")

    with pytest.raises(VerifyError):
        _build(pair, tmp_path / "eng2", toolchain, FakeRunner(), verify=True, verifier=bad)
    assert not (tmp_path / "eng2").exists() and _left_beside(tmp_path / "eng2") == []


def test_auto_verify_is_on_for_tiny_at_tp1(pair, tmp_path, toolchain):
    calls = []
    _build(pair, tmp_path / "eng", toolchain, FakeRunner(), verify="auto", verifier=lambda d, **k: calls.append(d) or
           {"passed": True})
    assert len(calls) == 1


def test_tp2_engine_and_its_launch(pair, tmp_path, toolchain):
    out = tmp_path / "eng"
    r = FakeRunner()
    res = _build(pair, out, toolchain, r, tp_size=2, verify="auto", verifier=lambda *a, **k: pytest.fail("verified"))
    assert r.calls[-1]["argv"][7:-2] == FLAGS_TAIL                     # --workers 1: one process builds both ranks
    assert r.seen[0]["files"] == ["config.json", "rank0.safetensors", "rank1.safetensors"]
    assert (out / "rank0.engine").is_file() and (out / "rank1.engine").is_file() and res.manifest["tp_size"] == 2
    run = (out / "RUN.md").read_text()
    assert "mpirun -n 2" in run and "--world_size 2" in run
    with pytest.raises(ConfigError, match="--verify: .*mpirun -n 2"):
        _build(pair, tmp_path / "eng2", toolchain, FakeRunner(), tp_size=2, verify=True)


def test_no_keep_checkpoint(pair, tmp_path, toolchain):
    out = tmp_path / "eng"
    res = _build(pair, out, toolchain, FakeRunner(), keep_checkpoint=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["TensorRT-10.13", "eng"]
    assert res.manifest["sources"]["checkpoint_dir"] is None


def test_output_dir_exists_without_force(pair, tmp_path, toolchain):
    out = tmp_path / "eng"
    out.mkdir()
    (out / "keep").write_text("x")
    r = FakeRunner()
    with pytest.raises(Exception, match="not empty \\(pass --force"):
        _build(pair, out, toolchain, r)
    assert r.calls == [] and not (tmp_path / "eng.checkpoint").exists() and (out / "keep").read_text() == "x"


def test_the_xqa_variable_reaches_trtllm_build_engine_json_and_run_md(pair, tmp_path, toolchain, monkeypatch):
    """An engine whose attention needs the JIT XQA kernel (xqa.py; Qwen3.8-27B's head 256 in
    tests/engine/test_xqa_spec_decoding.py): trtllm-build runs with TRTLLM_ENABLE_XQA_JIT=1, engine.json records it
    for the runtimes and RUN.md exports it. The tiny pair's heads need none, so the plan is widened here."""
    from dflash2_trt.engine import plan as plan_mod
    from dflash2_trt.engine.trtllm import xqa

    def forced(t, d, cfg):
        x = xqa.xqa_plan(t, d, cfg)
        return {**x, "env": {"TRTLLM_ENABLE_XQA_JIT": "1"}}

    monkeypatch.setattr(plan_mod, "xqa_plan", forced)
    r = FakeRunner()
    out = tmp_path / "eng"
    _build(pair, out, toolchain, r)
    (call,) = [c for c in r.calls if c["tool"] == "trtllm-build"]
    assert call["env"]["TRTLLM_ENABLE_XQA_JIT"] == "1"
    man = json.loads((out / "engine.json").read_text())
    assert man["runtime_env"] == {"TRTLLM_ENABLE_XQA_JIT": "1"}
    assert man["trtllm_build"]["env"]["TRTLLM_ENABLE_XQA_JIT"] == "1"
    assert "export TRTLLM_ENABLE_XQA_JIT=1" in (out / "RUN.md").read_text()
    # the tiny pair's own plan forces nothing
    monkeypatch.setattr(plan_mod, "xqa_plan", xqa.xqa_plan)
    _build(pair, tmp_path / "eng2", toolchain, FakeRunner())
    assert json.loads((tmp_path / "eng2" / "engine.json").read_text())["runtime_env"] == {}


def test_a_blackwell_gpu_is_refused_before_anything_is_written(pair, tmp_path, toolchain, monkeypatch):
    """TensorRT-LLM 1.2's attention has no kernel for a TensorRT engine's speculative steps on SM 100 (facts/
    spec_decoding_sm100.yaml): the build says so before hours of converting; DFLASH2_TRTLLM_ALLOW_SM100=1 goes on."""
    from dataclasses import replace

    b200 = replace(toolchain, gpu_name="NVIDIA B200", gpu_sm="sm_100a")
    r = FakeRunner()
    with pytest.raises(ConfigError, match=r"GPU is sm_100a: on Blackwell .*No available XQA kernels .*--backend cuda"):
        _build(pair, tmp_path / "eng", b200, r)
    assert r.calls == [] and list(p.name for p in tmp_path.iterdir()) == ["TensorRT-10.13"]
    monkeypatch.setenv("DFLASH2_TRTLLM_ALLOW_SM100", "1")
    r = FakeRunner()
    _build(pair, tmp_path / "eng", b200, r)
    assert "-DCMAKE_CUDA_ARCHITECTURES=100a" in r.calls[0]["argv"]


def test_gpu_outside_the_build_config(pair, tmp_path, toolchain):
    from dataclasses import replace

    with pytest.raises(ConfigError, match=r"GPU NVIDIA A100 \(sm_80\) is not one of the build config's gpus"):
        _build(pair, tmp_path / "eng", replace(toolchain, gpu_name="NVIDIA A100", gpu_sm="sm_80"), FakeRunner())
    assert list(p.name for p in tmp_path.iterdir()) == ["TensorRT-10.13"]
    # no GPU: the library is cross-compiled for every architecture of the config
    r = FakeRunner()
    _build(pair, tmp_path / "eng", replace(toolchain, gpu_name=None, gpu_sm=None, cuda="x"), r)
    assert "-DCMAKE_CUDA_ARCHITECTURES=90a;100a" in r.calls[0]["argv"]


def test_target_without_a_network_is_refused_before_anything(tmp_path, toolchain, monkeypatch):
    from dflash2_trt.trtllm.backend import load_network

    net = load_network("cpu")
    monkeypatch.setattr(net, "TARGET_FAMILIES", {k: v for k, v in net.TARGET_FAMILIES.items() if k != "qwen3_5"})
    hy = trained_pair("qwen3_5")
    r = FakeRunner()
    with pytest.raises(ConfigError, match="no engine network yet.*issue 15"):
        build_engine(hy.drafter_dir, hy.target_dir, tmp_path / "eng", backend="trtllm", target_key="tiny-hybrid",
                     sets=SETS, toolchain=toolchain, runner=r)
    assert r.calls == [] and list(p.name for p in tmp_path.iterdir()) == ["TensorRT-10.13"]


def test_run_on_a_trtllm_engine_needs_tensorrt_llm(pair, tmp_path, toolchain):
    out = tmp_path / "eng"
    _build(pair, out, toolchain, FakeRunner())
    runner = CliRunner()
    r = runner.invoke(main_cli(), ["run", "--engine-dir", str(out), "--prompt-ids", "5,6,7"])
    assert r.exit_code == 1 and "TensorRT-LLM is not importable" in r.output and len(r.output.strip().splitlines()) == 1
    r = runner.invoke(main_cli(), ["run", "--engine-dir", str(out), "--prompt-ids", "5,999"])
    assert r.exit_code == 1 and "vocabulary" in r.output


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_dry_run_engine_config_is_exactly_what_trtllm_build_receives(family, tmp_path, toolchain):
    """``build --dry-run --json``'s ``engine_config`` is the build checkpoint's config.json byte for byte as parsed
    (what a user checks before renting a GPU); for the hybrid it carries the runtime's full layer list and the RNN
    fields."""
    from dflash2_trt.engine.plan import dry_run_plan

    p = trained_pair(family)
    r = FakeRunner()
    key = {"qwen3": "tiny", "qwen3_5": "tiny-hybrid"}[family]   # a target name of the pair's own family
    build_engine(p.drafter_dir, p.target_dir, tmp_path / "eng", backend="trtllm", target_key=key, sets=SETS,
                 toolchain=toolchain, runner=r, verify=False)
    plan = dry_run_plan(p.drafter_dir, p.target_dir, target_key=key, sets=SETS, toolchain=toolchain,
                        backend="trtllm")
    assert plan["engine_config"] == r.seen[0]["config"]
    if family == "qwen3_5":
        pre = plan["engine_config"]
        assert len(pre["layer_types"]) == pre["num_hidden_layers"] + pre["eagle_net_config"]["num_hidden_layers"]
        assert {"state_size", "conv_kernel", "rnn_hidden_size", "rnn_conv_dim_size"} <= set(pre)
        assert plan["runtime"]["recurrent_layers"] == pre["hf_layer_types"].count("linear_attention")
    # the config.json the engine directory keeps: trtllm-build's (the fake writes paged_state False, as
    # BuildConfig.update_kv_cache_type does), with the build's fix for a recurrent engine, named in the manifest
    eng = json.loads((tmp_path / "eng" / "config.json").read_text())
    man = json.loads((tmp_path / "eng" / "engine.json").read_text())
    fixed = [(f["field"], f["from"], f["to"]) for f in man["engine_config_fixes"]]
    if family == "qwen3_5":
        assert fixed == [("build_config.plugin_config.paged_state", False, True)]
        assert eng["build_config"]["plugin_config"]["paged_state"] is True
    else:
        assert fixed == [] and eng["build_config"]["plugin_config"]["paged_state"] is False


BASELINE_TAIL = ["--model_cls_file", str(MODEL_FILE), "--model_cls_name", "TargetOnlyForCausalLM",
                 "--max_batch_size", "4", "--max_input_len", "256", "--max_seq_len", "512", "--max_num_tokens", "1024",
                 "--max_beam_width", "1", "--kv_cache_type", "paged", "--tokens_per_block", "32",
                 "--gpt_attention_plugin", "auto", "--gemm_plugin", "auto", "--context_fmha", "enable",
                 "--use_paged_context_fmha", "enable", "--remove_input_padding", "enable", "--logits_dtype", "float32",
                 "--workers", "1"]


def test_baseline_is_a_second_trtllm_build_of_the_target_alone(pair, tmp_path, toolchain):
    """``build --baseline``: after the combined engine, trtllm-build of TargetOnlyForCausalLM from the same rank files
    (hard links of the kept checkpoint), its config the combined one marked target-only with max_draft_len 0, no
    speculative decoding mode; the result in baseline/, hashed in engine.json and accepted by the session's check."""
    from dflash2_trt.engine.trtllm.session import baseline_config

    out = tmp_path / "eng"
    r = FakeRunner()
    res = _build(pair, out, toolchain, r, baseline=True)
    assert r.tools() == ["cmake", "cmake", "trtllm-build", "trtllm-build"]
    main, base = r.calls[2]["argv"], r.calls[3]["argv"]
    tmp_out = Path(main[6])
    assert base == [sys.executable, "-m", "dflash2_trt.trtllm.register", "--checkpoint_dir",
                    str(tmp_out / "baseline-checkpoint"), "--output_dir", str(tmp_out / "baseline"), *BASELINE_TAIL,
                    "--output_timing_cache", str(tmp_out / "baseline-checkpoint" / "model.cache")]
    assert r.calls[3]["env"] == r.calls[2]["env"]                  # the same plugin library
    combined, alone = r.seen
    assert alone["config"]["dflash2_engine"] == {**combined["config"]["dflash2_engine"], "network": "target_only"}
    assert alone["config"]["max_draft_len"] == 0 and combined["config"]["max_draft_len"] == 7
    rest = lambda c: {k: v for k, v in c.items() if k not in ("dflash2_engine", "max_draft_len")}   # noqa: E731
    assert rest(alone["config"]) == rest(combined["config"])
    assert alone["ranks"] == combined["ranks"] == {"rank0.safetensors": os.stat(
        tmp_path / "eng.checkpoint" / "rank0.safetensors")[1:3]}        # the same files, linked
    assert sorted(p.name for p in (out / "baseline").iterdir()) == ["config.json", "rank0.engine", "trtllm-build.log"]
    assert not (out / "baseline-checkpoint").exists() and _left_beside(out) == []
    man = res.manifest
    assert man["baseline"]["dir"] == "baseline" and man["baseline"]["network"] == "TargetOnlyForCausalLM"
    assert man["baseline"]["trtllm_build"]["argv"] == base
    assert man["baseline"]["trtllm_build"]["renamed_to"] == str(out.absolute())
    # the baseline's files apart from the engine's: a directory whose baseline/ is deleted still loads
    assert set(man["baseline"]["files"]) == {"baseline/rank0.engine", "baseline/config.json",
                                             "baseline/trtllm-build.log"}
    assert not any(f.startswith("baseline/") for f in man["files"])
    cfg, _ = load_engine_dir(out, verify=True)
    got = baseline_config(out, cfg, man, verify=True)
    assert got["build_config"]["speculative_decoding_mode"] == 1 and got["build_config"]["max_draft_len"] == 0
    assert "compares every concurrency with `baseline/`" in (out / "RUN.md").read_text()
    # without --baseline: no second build, and RUN.md says how to get one
    plain = _build(pair, tmp_path / "plain", toolchain, FakeRunner())
    assert plain.manifest["baseline"] is None
    assert "rebuild with `--baseline`" in (tmp_path / "plain" / "RUN.md").read_text()


def test_the_combined_engine_is_verified_before_the_baseline_is_built(pair, tmp_path, toolchain):
    from dflash2_trt.engine.verify import VerifyError

    def failing(*a, **k):
        raise VerifyError("prompt 0: token 3 differs")

    r = FakeRunner()
    with pytest.raises(VerifyError):
        _build(pair, tmp_path / "eng", toolchain, r, baseline=True, verify=True, verifier=failing)
    assert r.tools().count("trtllm-build") == 1                 # no hours spent on a baseline of a failing engine
    assert not (tmp_path / "eng").exists() and _left_beside(tmp_path / "eng") == []


def test_a_failed_baseline_build_keeps_the_combined_engine(pair, tmp_path, toolchain):
    """The baseline's trtllm-build fails after the combined engine built (and passed its checks): the combined engine
    is committed without baseline/ and loads; the build still fails, its error naming the kept engine and log."""
    from dflash2_trt.engine.trtllm.process import BaselineBuildError

    out = tmp_path / "eng"
    with pytest.raises(BaselineBuildError, match=r"trtllm-build of the baseline \(--baseline\) failed \(exit 5\)") as ei:
        _build(pair, out, toolchain, FakeRunner(fail_call=(1, 5)), baseline=True)
    msg = str(ei.value)
    assert f"the combined engine is built and kept at {out} without baseline/" in msg
    assert f"reusing the kept checkpoint {tmp_path / 'eng.checkpoint'}" in msg and "Total time of building" in msg
    assert "Total time of building" in (tmp_path / "eng.baseline-trtllm-build-failed.log").read_text()
    cfg, man = load_engine_dir(out, verify=True)               # every file hashed in engine.json is there
    assert man["baseline"] is None and ei.value.result.manifest["baseline"] is None
    assert ei.value.result.output == out and (out / "rank0.engine").is_file()
    assert not (out / "baseline").exists() and not (out / "baseline-checkpoint").exists() and _left_beside(out) == []
    assert "rebuild with `--baseline`" in (out / "RUN.md").read_text()
    with pytest.raises(BaselineBuildError, match="converting the checkpoint again") as ei:
        _build(pair, tmp_path / "eng2", toolchain, FakeRunner(fail_call=(1, 5)), baseline=True, keep_checkpoint=False)
    assert "reusing the kept checkpoint" not in str(ei.value)
    assert (tmp_path / "eng2" / "engine.json").is_file() and _left_beside(tmp_path / "eng2") == []


def test_cli_a_failed_baseline_says_what_was_kept_and_exits_1(pair, tmp_path, toolchain, monkeypatch):
    from dflash2_trt.engine.trtllm import build as trtllm_build

    monkeypatch.setattr(trtllm_build, "probe_toolchain", lambda: toolchain)              # the machine's two seams
    monkeypatch.setattr(trtllm_build, "SubprocessRunner", lambda: FakeRunner(fail_call=(1, 5)))
    out = tmp_path / "eng"
    r = CliRunner().invoke(main_cli(), ["build", "--target", "tiny", "--drafter", str(pair.drafter_dir),
                                        "--target-dir", str(pair.target_dir), "--backend", "trtllm", "--output",
                                        str(out), "--set", "drafter_window=full", "--no-verify", "--baseline"])
    assert r.exit_code == 1 and r.stdout.startswith(f"wrote {out} (trtllm engine"), r.output
    err = r.stderr.splitlines()
    steps = err[:err.index(next(ln for ln in err if ln.startswith("error: ")))]
    # the steps, one line each where stderr is not a terminal; trtllm-build's own output only in its log
    assert [ln.split(" ")[0] for ln in steps] == ["[convert]", "checkpoint:", "[plugins]", "plugins:", "[engine]",
                                                  "[baseline]"], steps
    assert not any("trtllm-build | " in ln for ln in steps)
    assert err[len(steps)].startswith("error: trtllm-build of the baseline (--baseline) failed (exit 5)")
    assert load_engine_dir(out, verify=True)[1]["baseline"] is None


def test_an_executor_path_engine_says_its_prompts_over_max_num_tokens_are_refused_there(pair, tmp_path, toolchain,
                                                                                         monkeypatch):
    """TensorRT-LLM's C++ executor tools run this project's engines with chunked context off (the Triton repository,
    gptManagerBenchmark's flags, ModelRunnerCpp's default), so an executor-path engine whose max_num_tokens is below
    its max_input_len refuses the prompts between them there: the build says so, and names the project runtime, which
    chunks them (a cpu engine gets no such note: tests/engine/test_build_options.py)."""
    from dflash2_trt.engine.trtllm import build as trtllm_build

    monkeypatch.setattr(trtllm_build, "probe_toolchain", lambda: toolchain)
    monkeypatch.setattr(trtllm_build, "SubprocessRunner", lambda: FakeRunner())
    for name, mnt, said in (("small", "32", True), ("whole", "256", False)):
        out = tmp_path / name
        r = CliRunner().invoke(main_cli(), ["build", "--target", "tiny", "--drafter", str(pair.drafter_dir),
                                            "--target-dir", str(pair.target_dir), "--backend", "trtllm", "--output",
                                            str(out), "--set", "drafter_window=full", "--no-verify",
                                            "--max-num-tokens", mnt])
        assert r.exit_code == 0, r.output
        assert load_engine_dir(out)[1]["runtime_path"]["path"] == "executor"
        note = ("note: max_num_tokens 32 < max_input_len 256: on TensorRT-LLM's C++ executor (this engine's runtime "
                "path) chunked context is off, so prompts over 32 tokens are refused there; the project runtime "
                "(`run --runtime project`) takes them in chunks")
        assert (note in r.stderr) == said, r.stderr
    # and `run` on that path refuses such a prompt in one line before TensorRT-LLM is needed (its C++ runner would stop
    # on a TLLM_CHECK deep in its scheduler), naming the runtime that takes it
    r = CliRunner().invoke(main_cli(), ["run", "--engine-dir", str(tmp_path / "small"), "--prompt-ids",
                                        ",".join(["5"] * 40)])
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
    assert ("40 prompt tokens exceed the engine's max_num_tokens 32, which TensorRT-LLM's C++ runner takes whole "
            "(chunked context off); the project runtime takes them in chunks: --runtime project") in r.output


def test_baseline_applies_to_the_trtllm_backend_only(pair, tmp_path, toolchain):
    from dflash2_trt.cli import main
    from dflash2_trt.engine.plan import dry_run_plan

    with pytest.raises(ConfigError, match="--baseline: applies to --backend trtllm"):
        build_engine(pair.drafter_dir, pair.target_dir, tmp_path / "cpu", backend="cpu", target_key="tiny",
                     baseline=True)
    assert not (tmp_path / "cpu").exists()
    res = CliRunner().invoke(main, ["build", "--target", "tiny", "--drafter", str(pair.drafter_dir), "--target-dir",
                                    str(pair.target_dir), "--output", str(tmp_path / "c"), "--backend", "cpu",
                                    "--baseline"])
    assert res.exit_code != 0 and res.output.strip().count("\n") == 0 and "--baseline" in res.output, res.output
    # the dry run: the second command, its step, and its engines counted on the disk
    plan = dry_run_plan(pair.drafter_dir, pair.target_dir, output=str(tmp_path / "e"), target_key="tiny", sets=SETS,
                        toolchain=toolchain, baseline=True, backend="trtllm")
    argv = plan["baseline_trtllm_build"]["argv"]
    assert argv[argv.index("--model_cls_name") + 1] == "TargetOnlyForCausalLM"
    assert "--speculative_decoding_mode" not in argv and "--max_draft_len" not in argv
    # in the order the build runs them: the baseline after the combined engine passed --verify
    assert [s["step"] for s in plan["steps"]] == ["validate", "convert", "plugins", "engine", "verify", "baseline"]
    items = {it["what"]: it["bytes"] for g in plan["disk"] for it in g["items"]}
    w = plan["sizing"]["weights_per_rank"]
    assert items["baseline engines"] == sum(x["target"] for x in w) > 0
    assert dry_run_plan(pair.drafter_dir, pair.target_dir, target_key="tiny", sets=SETS, backend="trtllm",
                        toolchain=toolchain)["baseline_trtllm_build"] is None
    with pytest.raises(ConfigError, match="--baseline"):
        dry_run_plan(pair.drafter_dir, pair.target_dir, target_key="tiny", backend="cpu", toolchain=toolchain,
                     baseline=True)


def test_off_a_terminal_a_trtllm_build_says_its_steps_and_now_and_then_its_latest_line(monkeypatch, capsys):
    """stderr not a terminal (a log, CI, nohup): the steps, one line each; trtllm-build's own lines only in its log,
    but for one every BUILD_HEARTBEAT_S, so hours of trtllm-build do not look like a hang; cpu and cuda: quiet."""
    from dflash2_trt import cli

    assert cli._build_progress("cpu") is None and cli._build_progress("cuda") is None
    say = cli._build_progress("trtllm")
    say("[engine] trtllm-build (log L)")
    say("  trtllm-build | [TRT-LLM] [I] building layer 1")          # just after a step: into the log only
    monkeypatch.setattr(cli, "BUILD_HEARTBEAT_S", 0.0)
    say("  trtllm-build | [TRT-LLM] [I] building layer 2")
    say("[verify] fixed prompts")
    assert capsys.readouterr().err.splitlines() == [
        "[engine] trtllm-build (log L)",
        "  trtllm-build is running; its latest line: [TRT-LLM] [I] building layer 2",
        "[verify] fixed prompts"]
