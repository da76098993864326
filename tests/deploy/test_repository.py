"""`dflash2-trt deploy triton`: the generated repository (layout, strict configs, wiring, the
tensorrtllm vs python difference) and every bad input as one line with nothing left behind.
No server here (see test_triton_server.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash2_trt.deploy.triton import repository as rp
from dflash2_trt.errors import ConfigError

from deploy_helpers import cli, one_error_line

MODELS = ["ensemble", "postprocessing", "preprocessing", "tensorrt_llm"]
# Every tensor TensorRT-LLM's Triton backend exposes on its tensorrt_llm model (triton_backend/
# all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt), typed as there.
TRTLLM_INPUTS = {
    "input_ids": "INT32", "input_lengths": "INT32", "request_output_len": "INT32", "end_id": "INT32",
    "pad_id": "INT32", "stop_words_list": "INT32", "bad_words_list": "INT32", "embedding_bias": "FP32",
    "num_return_sequences": "INT32", "beam_width": "INT32", "streaming": "BOOL", "stop": "BOOL",
    "exclude_input_in_output": "BOOL", "temperature": "FP32", "seed": "UINT64", "runtime_top_k": "INT32",
    "runtime_top_p": "FP32", "runtime_top_p_min": "FP32", "runtime_top_p_decay": "FP32",
    "runtime_top_p_reset_ids": "INT32", "len_penalty": "FP32", "early_stopping": "BOOL", "repetition_penalty": "FP32",
    "min_tokens": "INT32", "beam_search_diversity_rate": "FP32", "presence_penalty": "FP32",
    "frequency_penalty": "FP32", "return_log_probs": "BOOL", "return_context_logits": "BOOL",
    "return_generation_logits": "BOOL", "return_perf_metrics": "BOOL", "return_num_input_tokens": "BOOL",
    "return_num_output_tokens": "BOOL", "draft_input_ids": "INT32", "draft_logits": "FP32",
    "draft_acceptance_threshold": "FP32", "lookahead_window_size": "INT32", "lookahead_ngram_size": "INT32",
    "lookahead_verification_set_size": "INT32", "encoder_input_features": "FP16", "encoder_output_lengths": "INT32",
    "decoder_input_ids": "INT32", "decoder_input_lengths": "INT32", "prompt_embedding_table": "FP16",
    "prompt_table_extra_ids": "UINT64", "prompt_vocab_size": "INT32", "cross_attention_mask": "BOOL",
    "skip_cross_attn_blocks": "BOOL", "mrope_rotary_cos_sin": "FP32", "mrope_position_deltas": "INT64",
    "lora_task_id": "UINT64", "lora_weights": "FP16", "lora_config": "INT32", "context_phase_params": "UINT8",
    "retention_token_range_starts": "INT32", "retention_token_range_ends": "INT32",
    "retention_token_range_priorities": "INT32", "retention_token_range_durations_ms": "INT32",
    "retention_decode_priority": "INT32", "retention_decode_duration_ms": "INT32",
    "guided_decoding_guide_type": "STRING", "guided_decoding_guide": "STRING",
}
TRTLLM_OUTPUTS = {
    "output_ids": "INT32", "sequence_length": "INT32", "cum_log_probs": "FP32", "output_log_probs": "FP32",
    "context_logits": "FP32", "generation_logits": "FP32", "batch_index": "INT32", "sequence_index": "INT32",
    "context_phase_params": "UINT8", "kv_cache_alloc_new_blocks": "INT32", "kv_cache_reused_blocks": "INT32",
    "kv_cache_alloc_total_blocks": "INT32", "arrival_time_ns": "INT64", "first_scheduled_time_ns": "INT64",
    "first_token_time_ns": "INT64", "last_token_time_ns": "INT64", "acceptance_rate": "FP32",
    "total_accepted_draft_tokens": "INT32", "total_draft_tokens": "INT32", "num_input_tokens": "INT32",
    "num_output_tokens": "INT32",
}


@pytest.fixture(scope="module")
def cpu_repo(engine, tmp_path_factory):
    out = tmp_path_factory.mktemp("r") / "cpu"
    code, text = cli("deploy", "triton", "--engine-dir", str(engine), "--output", str(out), "--decoupled")
    assert code == 0, text
    assert "python backend, decoupled, max batch 16" in text
    return out


@pytest.fixture(scope="module")
def trt_engine(engine, tmp_path_factory):
    """A TensorRT-LLM engine directory of the tiny pair (the CPU engine's manifest, backend trtllm)."""
    return _trtllm_engine_dir(engine, tmp_path_factory.mktemp("e") / "trt-engine")


@pytest.fixture(scope="module")
def gpu_repo(engine, trt_engine, tmp_path_factory):
    out = tmp_path_factory.mktemp("r") / "gpu"
    # the CPU engine's tokenizer directory: the text models' configs equal cpu_repo's
    code, text = cli("deploy", "triton", "--engine-dir", str(trt_engine), "--output", str(out), "--decoupled",
                      "--backend", "tensorrtllm", "--tokenizer", str(engine / "tokenizer"))
    assert code == 0, text
    assert "note:" not in text, text
    return out


def _type(t) -> str:
    from tritonclient.grpc import model_config_pb2 as pb

    return pb.DataType.Name(t.data_type).removeprefix("TYPE_")


def test_layout(cpu_repo, engine):
    assert sorted(p.name for p in cpu_repo.iterdir() if p.is_dir()) == MODELS
    for m in MODELS:
        assert (cpu_repo / m / "config.pbtxt").is_file() and (cpu_repo / m / "1").is_dir()
    for m in ("preprocessing", "postprocessing", "tensorrt_llm"):
        assert (cpu_repo / m / "1" / "model.py").is_file()
    assert not (cpu_repo / "launch.sh").exists()
    meta = json.loads((cpu_repo / "dflash2_repository.json").read_text())
    assert meta["backend"] == "python" and meta["decoupled"] and meta["engine_dir"] == str(engine.resolve())
    assert meta["tokenizer_dir"] == str((engine / "tokenizer").resolve())


def test_every_config_parses_strictly_and_names_the_backend_tensors(cpu_repo, gpu_repo):
    for repo in (cpu_repo, gpu_repo):
        models = rp.check_repository(repo)
        assert sorted(models) == MODELS
        trt = models["tensorrt_llm"]
        assert {t.name: _type(t) for t in trt.input} == TRTLLM_INPUTS
        assert {t.name: _type(t) for t in trt.output} == TRTLLM_OUTPUTS
        assert trt.model_transaction_policy.decoupled and trt.max_batch_size == 16
        params = {k: v.string_value for k, v in trt.parameters.items()}
        assert params["decoding_mode"] == "eagle" and params["gpt_model_type"] == "inflight_fused_batching"
        assert params["eagle_choices"] == "{0},{0,0},{0,0,0},{0,0,0,0},{0,0,0,0,0},{0,0,0,0,0,0},{0,0,0,0,0,0,0}"
        ens = models["ensemble"]
        assert {t.name for t in ens.input} >= {"text_input", "max_tokens", "temperature", "seed", "stream"}
        assert {t.name for t in ens.output} >= {"text_output", "acceptance_rate", "total_accepted_draft_tokens",
                                               "total_draft_tokens"}


def test_gpu_and_cpu_repositories_differ_only_in_the_tensorrt_llm_backend_and_parameters(cpu_repo, gpu_repo, engine,
                                                                                         trt_engine):
    cpu, gpu = rp.check_repository(cpu_repo), rp.check_repository(gpu_repo)
    assert (cpu["tensorrt_llm"].backend, gpu["tensorrt_llm"].backend) == ("python", "tensorrtllm")
    cp = {k: v.string_value for k, v in cpu["tensorrt_llm"].parameters.items()}
    gp = {k: v.string_value for k, v in gpu["tensorrt_llm"].parameters.items()}
    # the CPU model reads a subset, with the same values but for its own engine directory and chunked context: the
    # project runtime chunks a prompt over max_num_tokens, the executor's backend is written with it off
    assert cp["gpt_model_path"] == str(engine.resolve()) and gp["gpt_model_path"] == str(trt_engine.resolve())
    assert (cp["enable_chunked_context"], gp["enable_chunked_context"]) == ("true", "false")
    from dflash2_trt.yaml_files import load_yaml_file

    facts = load_yaml_file(Path(__file__).resolve().parents[2] / "dflash2_trt" / "engine" / "trtllm" / "facts"
                           / "context_chunking.yaml")["executor_path"]
    assert facts["this_project"] is False and "rnn_based" in facts["switched_off_for"]   # the record says why
    assert {k: v for k, v in cp.items() if k not in ("gpt_model_path", "enable_chunked_context")}.items() <= gp.items()
    assert gp["kv_cache_free_gpu_mem_fraction"] == "0.9"
    for m in (cpu["tensorrt_llm"], gpu["tensorrt_llm"]):
        m.ClearField("backend")
        m.ClearField("parameters")
    assert cpu["tensorrt_llm"] == gpu["tensorrt_llm"]
    for name in ("preprocessing", "postprocessing", "ensemble"):
        assert cpu[name] == gpu[name], name
        for f in (cpu_repo / name).rglob("*"):
            if f.is_file():
                assert f.read_bytes() == (gpu_repo / name / f.relative_to(cpu_repo / name)).read_bytes(), f
    assert not (gpu_repo / "tensorrt_llm" / "1" / "model.py").exists()   # the C++ backend has no model file
    assert sorted(p.name for p in gpu_repo.iterdir() if p.is_dir()) == MODELS


def test_launch_script_preloads_the_plugin_library(gpu_repo, trt_engine, tmp_path):
    script = gpu_repo / "launch.sh"
    assert script.stat().st_mode & 0o111
    text = script.read_text()
    assert "LD_PRELOAD" in text and str(trt_engine.resolve() / "libdflash2_plugins.so") in text
    assert "$$" not in text and "plugin_lib" not in text   # every placeholder filled, every escape undone
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # no library: a clear error, tritonserver never started
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "DFLASH2_PLUGIN_LIB": str(tmp_path / "none.so"),
                            "TRITONSERVER": "/bin/false"})
    assert r.returncode == 1 and "plugin library not found" in r.stderr
    # with a library: tritonserver is exec'd with the repository and the preload
    lib = tmp_path / "libdflash2_plugins.so"
    lib.write_bytes(b"")
    fake = tmp_path / "tritonserver"
    fake.write_text('#!/bin/sh\necho "LD_PRELOAD=$LD_PRELOAD"; echo "$@"\n')
    fake.chmod(0o755)
    r = subprocess.run(["bash", str(script), "--log-verbose", "1"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "DFLASH2_PLUGIN_LIB": str(lib), "TRITONSERVER": str(fake)})
    assert r.returncode == 0, r.stderr
    assert f"LD_PRELOAD={lib}" in r.stdout and f"--model-repository {gpu_repo}" in r.stdout
    assert "--http-port 8000 --grpc-port 8001 --metrics-port 8002 --log-verbose 1" in r.stdout


def test_ids_only_and_model_name(engine, tmp_path):
    code, text = cli("deploy", "triton", "--engine-dir", str(engine), "--output", str(tmp_path / "a"), "--ids-only")
    assert code == 0, text
    assert sorted(p.name for p in (tmp_path / "a").iterdir() if p.is_dir()) == ["tensorrt_llm"]
    rp.check_repository(tmp_path / "a")
    code, text = cli("deploy", "triton", "--engine-dir", str(engine), "--output", str(tmp_path / "b"),
                      "--model-name", "dflash2", "--max-batch-size", "4")
    assert code == 0, text
    models = rp.check_repository(tmp_path / "b")
    assert "dflash2" in models and models["dflash2"].platform == "ensemble"
    assert all(m.max_batch_size == 4 for m in models.values())
    assert not models["tensorrt_llm"].model_transaction_policy.decoupled


def test_template_fill_is_strict():
    assert rp.fill("a ${x} b $$y", {"x": 1}) == "a 1 b $y"
    with pytest.raises(ConfigError, match=r"missing values: \['y'\]"):
        rp.fill("${x} ${y}", {"x": 1})
    with pytest.raises(ConfigError, match=r"without placeholders: \['z'\]"):
        rp.fill("${x}", {"x": 1, "z": 2})
    with pytest.raises(ConfigError, match="invalid placeholder"):
        rp.fill("${x} $", {"x": 1})


def _models(repo):
    return rp.check_repository(repo)


@pytest.mark.parametrize("edit,needle", [
    (lambda t: t.replace('key: "QUERY" value: "text_input"', 'key: "QUERYX" value: "text_input"'),
     "'QUERYX' is not an input of preprocessing"),
    (lambda t: t.replace('value: "_INPUT_ID" }\n      input_map { key: "input_lengths"',
                         'value: "_NOPE" }\n      input_map { key: "input_lengths"'),
     "'_NOPE' is neither an ensemble input nor an earlier output"),
    (lambda t: t.replace('input_map { key: "request_output_len" value: "_REQUEST_OUTPUT_LEN" }\n', ""),
     "required input 'request_output_len' of tensorrt_llm is not mapped"),
    (lambda t: t.replace('output_map { key: "OUTPUT" value: "text_output" }', 'output_map { key: "OUTPUT" value: "x" }'),
     "ensemble output 'text_output' is produced by no step"),
    (lambda t: t.replace('model_name: "postprocessing"', 'model_name: "postprocess"'),
     "model 'postprocess' is not in the repository"),
    (lambda t: t.replace('input_map { key: "seed" value: "seed" }', 'input_map { key: "seed" value: "temperature" }'),
     "'temperature' feeds tensorrt_llm.seed with another data type"),
    (lambda t: t.replace("ensemble_scheduling {", "ensemble_schedule {"), "no field named \"ensemble_schedule\""),
    (lambda t: t.replace("TYPE_STRING", "TYPE_TEXT", 1), "TYPE_TEXT"),
])
def test_repository_check_catches_wiring_errors(cpu_repo, tmp_path, edit, needle):
    bad = tmp_path / "bad"
    shutil.copytree(cpu_repo, bad)
    cfg = bad / "ensemble" / "config.pbtxt"
    before = cfg.read_text()
    cfg.write_text(edit(before))
    assert cfg.read_text() != before
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        rp.check_repository(bad)


@pytest.mark.parametrize("args,needle", [
    (["--engine-dir", "/nonexistent/engine"], "engine directory not found"),
    (["--max-batch-size", "17"], "the engine's max_batch_size"),
    (["--max-batch-size", "0"], "--max-batch-size"),
    (["--model-name", "tensorrt_llm"], "--model-name"),
    (["--model-name", "a b"], "--model-name"),
    (["--tokenizer", "/nonexistent/tok"], "tokenizer directory not found"),
    (["--kv-cache-free-gpu-mem-fraction", "1.5"], "--kv-cache-free-gpu-mem-fraction"),
])
def test_bad_input_is_one_line_and_writes_nothing(engine, tmp_path, args, needle):
    out = tmp_path / "repo"
    full = ["deploy", "triton", "--engine-dir", str(engine), "--output", str(out), *args]
    if args[0] == "--engine-dir":
        full = ["deploy", "triton", *args, "--output", str(out)]
    line = one_error_line(*cli(*full))
    assert needle in line, line
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,line", [
    (["--ids-only", "--tokenizer", "{engine}/tokenizer"],
     "error: --ids-only and --tokenizer contradict each other: --ids-only writes the tensorrt_llm model alone, with "
     "no tokenizer and no text ensemble; give one or the other"),
    (["--ids-only", "--model-name", "dflash2"], "error: --ids-only and --model-name contradict each other"),
    (["--plugin-lib", "/nonexistent.so"], "error: --plugin-lib applies to the tensorrtllm backend only (launch.sh's "
                                          "LD_PRELOAD); the python backend serves a cpu engine (no plugin library to "
                                          "preload)"),
    (["--backend", "python", "--kv-cache-free-gpu-mem-fraction", "0.5"],
     "error: --kv-cache-free-gpu-mem-fraction applies to GPU engines (TensorRT-LLM and cuda) only; a cpu engine's KV "
     "pool, in host memory, holds every request at max_seq_len"),
    (["--backend", "tensorrtllm", "--plugin-lib", "/nonexistent.so"],
     "error: {engine}: --backend tensorrtllm: a cpu engine: the tensorrtllm backend runs TensorRT-LLM engines only"),
])
def test_contradictory_or_ignored_options_are_refused(engine, tmp_path, args, line):
    """Options that contradict each other, or that the chosen backend would ignore, are one line naming
    them; nothing is written."""
    out = tmp_path / "repo"
    got = one_error_line(*cli("deploy", "triton", "--engine-dir", str(engine), "--output", str(out),
                     *[a.format(engine=engine) for a in args]))
    assert got.startswith(line.format(engine=engine)), got
    assert not out.exists()


def test_the_tensorrtllm_backend_is_refused_for_a_cpu_or_cuda_engine(engine, tmp_path, monkeypatch):
    """TensorRT-LLM's executor runs TensorRT-LLM engine files only: a CPU or cuda engine asked for the tensorrtllm
    backend is one line naming the engine directory and the way out, exit 1, nothing written (not a repository
    that cannot load)."""
    out = tmp_path / "repo"
    for extra in ([], ["--decoupled", "--ids-only"], ["--kv-cache-free-gpu-mem-fraction", "0.5"]):
        line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(engine), "--output", str(out),
                                   "--backend", "tensorrtllm", *extra))
        assert line == (f"error: {engine}: --backend tensorrtllm: a cpu engine: the tensorrtllm backend runs "
                        "TensorRT-LLM engines only (`dflash2-trt build --backend trtllm` on a GPU machine); use "
                        "--backend python or auto for a CPU/cuda engine"), line
        assert list(tmp_path.iterdir()) == []
    real = rp.read_engine
    monkeypatch.setattr(rp, "read_engine", lambda d: (lambda cm: (cm[0], {**cm[1], "backend": "cuda"}))(real(d)))
    with pytest.raises(ConfigError, match=r"--backend tensorrtllm: a cuda engine: the tensorrtllm backend runs "
                                          r"TensorRT-LLM engines only"):
        rp.deploy_triton(engine, out, backend="tensorrtllm")
    assert list(tmp_path.iterdir()) == []


def test_not_an_engine_dir_and_tokenizer_errors(engine_without_tokenizer, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "not an engine directory" in one_error_line(*cli("deploy", "triton", "--engine-dir", str(tmp_path / "empty"),
                                                   "--output", str(tmp_path / "o")))
    # an engine without a tokenizer asked for the text ensemble
    eng = engine_without_tokenizer
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(eng), "--output", str(tmp_path / "o")))
    assert "has no tokenizer" in line and "--ids-only" in line
    # a directory that is no tokenizer
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(eng), "--output", str(tmp_path / "o"), "--tokenizer",
                      str(tmp_path / "empty")))
    assert "no usable tokenizer" in line
    # a tokenizer larger than the engine's vocabulary
    big = tmp_path / "big"
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(300)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w0").save_pretrained(big)
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(eng), "--output", str(tmp_path / "o"), "--tokenizer",
                      str(big)))
    assert "300 tokens, the engine's vocabulary 256" in line
    assert not (tmp_path / "o").exists()
    code, text = cli("deploy", "triton", "--engine-dir", str(eng), "--output", str(tmp_path / "o"), "--ids-only")
    assert code == 0 and (tmp_path / "o" / "tensorrt_llm").is_dir(), text


def test_a_directory_that_is_no_engine_is_named_so_before_any_overlap(tmp_path):
    """An --output inside a directory that is no engine used to be refused as lying "inside the engine directory"
    (and `serve --engine-dir /tmp`, whose repository goes under /tmp, blamed an --output it was never given)."""
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(tmp_path), "--output", str(tmp_path / "repo")))
    assert "not an engine directory" in line and "--output" not in line, line
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_force(cpu_repo, engine):
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(engine), "--output", str(cpu_repo)))
    assert "--force" in line
    assert (cpu_repo / "tensorrt_llm" / "config.pbtxt").is_file()


def test_a_failing_check_leaves_nothing(engine, tmp_path, monkeypatch):
    """A template that does not parse is caught before the rename: no repository, no temp dir."""
    bad = tmp_path / "templates"
    shutil.copytree(rp.TEMPLATES, bad)
    (bad / "postprocessing.pbtxt").write_text((bad / "postprocessing.pbtxt").read_text().replace("dims", "dimz", 1))
    monkeypatch.setattr(rp, "TEMPLATES", bad)
    out = tmp_path / "out" / "repo"
    with pytest.raises(ConfigError, match="postprocessing/config.pbtxt: not a valid Triton model config"):
        rp.deploy_triton(engine, out)
    assert not (tmp_path / "out").exists()


def test_wheel_carries_templates_models_and_tokenizers(tmp_path):
    """The package data a `pip install .` needs: templates, model files, the tiny tokenizers."""
    repo = Path(__file__).resolve().parents[2]
    lib = tmp_path / "lib"
    r = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path), "build_py",
                        "--build-lib", str(lib)], cwd=repo, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    pkg = lib / "dflash2_trt"
    for rel in ("deploy/triton/templates/tensorrt_llm.pbtxt", "deploy/triton/templates/ensemble.pbtxt",
                "deploy/triton/templates/preprocessing.pbtxt", "deploy/triton/templates/postprocessing.pbtxt",
                "deploy/triton/templates/launch.sh", "deploy/triton/models/tensorrt_llm_python.py",
                "deploy/triton/models/preprocessing.py", "deploy/triton/models/postprocessing.py",
                "assets/tiny/qwen3/target/tokenizer.json", "assets/tiny/qwen3_5/target/tokenizer_config.json",
                "deploy/triton/tensorrtllm_backend.yaml", "engine/trtllm/facts/gptJsonConfig.yaml",
                "engine/trtllm/runtime_rules.py"):
        assert (pkg / rel).is_file(), rel


def _trtllm_engine_dir(engine, d):
    """An engine directory as `build --backend trtllm` writes it (engine.json backend trtllm,
    TensorRT-LLM's config.json, the plugin library, tokenizer/); rank engines are not needed here."""
    d.mkdir()
    man = json.loads((engine / "engine.json").read_text())
    man.update({"backend": "trtllm", "plugin_library": {"file": "libdflash2_plugins.so"}})
    (d / "engine.json").write_text(json.dumps(man))
    (d / "config.json").write_text(json.dumps({"pretrained_config": {"vocab_size": 256}, "build_config": {}}))
    shutil.copytree(engine / "tokenizer", d / "tokenizer")
    return d


def test_a_tensorrt_llm_engine_gets_the_tensorrtllm_backend(engine, tmp_path):
    eng = _trtllm_engine_dir(engine, tmp_path / "trt-engine")
    code, text = cli("deploy", "triton", "--engine-dir", str(eng), "--output", str(tmp_path / "repo"), "--decoupled")
    assert code == 0 and "tensorrtllm backend" in text and "note:" not in text, text
    models = rp.check_repository(tmp_path / "repo")
    assert models["tensorrt_llm"].backend == "tensorrtllm"
    assert models["tensorrt_llm"].parameters["gpt_model_path"].string_value == str(eng.resolve())
    assert str(eng.resolve() / "libdflash2_plugins.so") in (tmp_path / "repo" / "launch.sh").read_text()
    assert one_error_line(*cli("deploy", "triton", "--engine-dir", str(eng), "--output", str(tmp_path / "r1"),
                               "--plugin-lib", "/nonexistent.so")) == "error: --plugin-lib: /nonexistent.so: no such file"
    assert not (tmp_path / "r1").exists()
    # the python model on the project runtime opens the rank engine: refused, naming it, where there is none
    assert "no rank0.engine" in one_error_line(*cli("deploy", "triton", "--engine-dir", str(eng), "--output",
                                          str(tmp_path / "r2"), "--backend", "python"))
    (eng / "config.json").write_text("{}")
    assert "pretrained_config.vocab_size" in one_error_line(*cli("deploy", "triton", "--engine-dir", str(eng), "--output",
                                                        str(tmp_path / "r3")))


def test_tensorrtllm_repository_carries_every_parameter_the_backend_reads_without_default(gpu_repo, tmp_path):
    """TensorRT-LLM's Triton backend (model_instance_state.cc / model_state.cc; paths and commits in
    tensorrtllm_backend.yaml) fails the load on a parameter it reads with no fallback; the generated
    config.pbtxt carries each with an accepted value, and the repository check names a missing one."""
    import yaml

    facts = yaml.safe_load((Path(rp.__file__).parent / "tensorrtllm_backend.yaml").read_text())
    assert {s["path"].rsplit("/", 1)[-1] for s in facts["sources"]} == {"model_instance_state.cc", "model_state.cc"}
    assert {"tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend",
            "gpt_model_type"} <= set(facts["required"])
    params = {k: v.string_value for k, v in rp.check_repository(gpu_repo)["tensorrt_llm"].parameters.items()}
    for name, rule in {**facts["required"], **facts["effectively_required"]}.items():
        assert name in params, name
        if rule and "allowed" in rule:
            assert params[name] in rule["allowed"], (name, params[name])
    assert not set(facts["forbidden"]) & set(params)
    assert params["guided_decoding_backend"] == "" and params["enable_kv_cache_reuse"] == "false"
    for name in ("tokenizer_dir", "guided_decoding_backend"):
        bad = tmp_path / name
        shutil.copytree(gpu_repo, bad)
        cfg = bad / "tensorrt_llm" / "config.pbtxt"
        text = cfg.read_text()
        start = text.index(f'  key: "{name}"') - len("parameters: {\n")
        end = text.index("}\n}", start) + 3
        cfg.write_text(text[:start] + text[end:])
        with pytest.raises(ConfigError, match=f"parameters.{name}.*Cannot find parameter with name: {name}"):
            rp.check_repository(bad)


def test_tp2_engine_launches_one_mpi_rank_per_gpu(engine, tmp_path):
    """The tensorrtllm backend's executor expects an MPI world of tp ranks (executorImpl.cpp, initializeWorkers:
    worldSize == tp*pp*cp without participant ids): launch.sh starts them as TensorRT-LLM's
    triton_backend/scripts/launch_triton_server.py does (one `-n 1 tritonserver` app context per rank; ranks > 0
    load tensorrt_llm only; a python shared-memory prefix per rank), or says clearly that mpirun is missing."""
    eng = _trtllm_engine_dir(engine, tmp_path / "tp2-engine")
    man = json.loads((eng / "engine.json").read_text())
    (eng / "engine.json").write_text(json.dumps({**man, "tp_size": 2}))
    repo = tmp_path / "repo"
    code, text = cli("deploy", "triton", "--engine-dir", str(eng), "--output", str(repo))
    assert code == 0, text
    script = repo / "launch.sh"
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lib = tmp_path / "libdflash2_plugins.so"
    lib.write_bytes(b"")
    fake = tmp_path / "mpirun"
    fake.write_text('#!/bin/sh\necho "LD_PRELOAD=$LD_PRELOAD"; for a in "$@"; do echo "[$a]"; done\n')
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "DFLASH2_PLUGIN_LIB": str(lib), "MPIRUN": str(fake), "TRITONSERVER": "/opt/ts"}
    r = subprocess.run(["bash", str(script), "--log-verbose", "1"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"LD_PRELOAD={lib}"
    args = [a[1:-1] for a in lines[1:]]
    assert args[:3] == ["--allow-run-as-root", "-x", "LD_PRELOAD"]
    ranks = " ".join(args[3:]).split(" : ")
    ports = "--http-port 8000 --grpc-port 8001 --metrics-port 8002"
    assert ranks == [
        f"-n 1 /opt/ts --model-repository {repo} {ports} --disable-auto-complete-config "
        "--backend-config=python,shm-region-prefix-name=prefix0_ --log-verbose 1",
        f"-n 1 /opt/ts --model-repository {repo} {ports} --model-control-mode=explicit --load-model=tensorrt_llm "
        "--disable-auto-complete-config --backend-config=python,shm-region-prefix-name=prefix1_ --log-verbose 1"]
    env["MPIRUN"] = str(tmp_path / "no-mpirun")
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "tp 2" in r.stderr and "one MPI process per GPU" in r.stderr


def test_ensemble_inputs_are_the_documented_subset_of_the_upstream_ensemble(cpu_repo):
    """Every input of TensorRT-LLM's text ensemble (recorded with its source in tensorrtllm_backend.yaml) is either
    an input of this ensemble, with the upstream name, type and dims, or listed as not offered, with a reason, in the
    data and in docs/cli.md."""
    import yaml

    up = yaml.safe_load((Path(rp.__file__).parent / "tensorrtllm_backend.yaml").read_text())["upstream_ensemble"]
    assert up["source"]["path"].endswith("inflight_batcher_llm/ensemble/config.pbtxt") and len(up["inputs"]) == 36
    ens = rp.check_repository(cpu_repo)["ensemble"]
    ours = {t.name: (_type(t), list(t.dims)) for t in ens.input}
    accepted = {k for k, v in up["inputs"].items() if v == "accepted"}
    assert set(ours) == accepted
    upstream_types = {"text_input": ("STRING", [1]), "max_tokens": ("INT32", [1]), "stop_words": ("STRING", [-1]),
                      "bad_words": ("STRING", [-1]),
                      "end_id": ("INT32", [1]), "pad_id": ("INT32", [1]), "temperature": ("FP32", [1]),
                      "top_k": ("INT32", [1]), "top_p": ("FP32", [1]), "seed": ("UINT64", [1]),
                      "beam_width": ("INT32", [1]), "stream": ("BOOL", [1]), "exclude_input_in_output": ("BOOL", [1]),
                      "return_perf_metrics": ("BOOL", [1]), "return_num_input_tokens": ("BOOL", [1]),
                      "return_num_output_tokens": ("BOOL", [1])}
    assert ours == upstream_types
    readme = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    section = readme[readme.index("The ensemble's inputs are a subset"):][:2500]
    for name, why in up["inputs"].items():
        assert f"`{name}`" in section, name
        assert why == "accepted" or len(why) > 10, name


@pytest.mark.parametrize("edit,field", [
    (lambda m: m.update(eos_token_ids=["a"]), "eos_token_ids"),
    (lambda m: m.update(eos_token_ids=2), "eos_token_ids"),
    (lambda m: m["limits"].update(max_batch_size="x"), "limits.max_batch_size"),
    (lambda m: m["limits"].pop("max_batch_size"), "limits.max_batch_size"),
    # above any build's (512): it failed config.pbtxt's protobuf check, naming a temporary file (a fuzzing review)
    (lambda m: m["limits"].update(max_batch_size=10**12), "limits.max_batch_size"),
    (lambda m: m.update(limits=[]), "limits"),
    (lambda m: m.update(block_size="abc"), "block_size"),
    (lambda m: m.update(block_size=None), "block_size"),   # present but null: deploy read int(None)
    (lambda m: m.update(block_size=3), "block_size"),      # an integer, but not the engine's K + 1
    (lambda m: m.update(eos_token_ids=[2, 999]), "eos_token_ids"),   # past the vocabulary: deployed as end_id 999
    (lambda m: m.update(tokenizer="../elsewhere"), "tokenizer"),     # was ignored without a word (a fuzzing review)
])
def test_a_damaged_engine_json_field_is_one_line_naming_it(engine, tmp_path, edit, field):
    """engine.json carries no hash of itself; a damaged eos_token_ids or limits used to end `deploy triton` (and
    `run`) in a ValueError / KeyError traceback."""
    bad = tmp_path / "engine"
    shutil.copytree(engine, bad)
    man = json.loads((bad / "engine.json").read_text())
    edit(man)
    (bad / "engine.json").write_text(json.dumps(man))
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(bad), "--output", str(tmp_path / "repo")))
    assert f"engine.json: {field}: " in line, line
    assert not (tmp_path / "repo").exists()
    if field in ("eos_token_ids", "block_size", "tokenizer"):
        line = one_error_line(*cli("run", "--engine-dir", str(bad), "--prompt-ids", "1,2", "--max-new-tokens", "2"))
        assert f"engine.json: {field}: " in line, line


def test_a_tensorrt_engines_edited_block_size_is_refused(standin_trt_engine, tmp_path):
    """The TensorRT-LLM engine directory's engine.json is read by deploy's own branch: its block_size is held to the
    engine config's max_draft_len there too (an edited 3 wrote a repository with K = 2)."""
    bad = tmp_path / "engine"
    shutil.copytree(standin_trt_engine[0], bad, symlinks=True)
    man = json.loads((bad / "engine.json").read_text())
    assert man["backend"] == "trtllm"
    man["block_size"] = 3
    (bad / "engine.json").write_text(json.dumps(man))
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(bad), "--output", str(tmp_path / "repo"),
                               "--backend", "tensorrtllm"))
    assert "engine.json: block_size: 3, but the engine's config.json has pretrained_config.max_draft_len" in line, line
    assert not (tmp_path / "repo").exists()


def test_a_repository_path_with_whitespace_is_refused_for_python_models(engine, tmp_path):
    """Triton's python backend starts each model's stub with the model's path in a command line split at spaces:
    every stub died at once ("stol") while `serve` waited out its readiness time with the models LOADING (a
    reviewer, 120 s). deploy triton refuses such an --output where it writes python models, and serve refuses such a
    --repository, in one line, before anything is written or started."""
    spaced = tmp_path / "sp ace"
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(engine), "--output", str(spaced / "repo")))
    assert line == (f"error: --output: '{spaced / 'repo'}' holds whitespace, and Triton's python backend cannot "
                    f"load a model from such a path (its stubs die at start: 'stol'): choose a path without spaces")
    assert not spaced.exists()
    repo = tmp_path / "repo"
    rp.deploy_triton(engine, repo)
    spaced.mkdir()
    shutil.move(str(repo), str(spaced / "repo"))       # moved there after it was written
    line = one_error_line(*cli("serve", "--repository", str(spaced / "repo"), "--port", "1"))
    assert line.startswith(f"error: --repository: '{spaced / 'repo'}' holds whitespace"), line


def test_serve_names_tmpdir_when_its_temporary_repository_would_hold_whitespace(engine, tmp_path, monkeypatch):
    """`serve --engine-dir` writes its repository into a temporary directory: with whitespace in TMPDIR the refusal
    named `--output`, an option serve does not have (the session's reviewer)."""
    import tempfile

    spaced = tmp_path / "t mp"
    spaced.mkdir()
    monkeypatch.setenv("TMPDIR", str(spaced))
    monkeypatch.setattr(tempfile, "tempdir", None)
    line = one_error_line(*cli("serve", "--engine-dir", str(engine), "--port", "1"))
    assert "holds whitespace" in line and "set TMPDIR to a directory without spaces" in line, line
    assert "--output" not in line and list(spaced.iterdir()) == []          # its work directory removed


def test_a_generated_config_the_check_refuses_is_named_as_the_output(engine, tmp_path, monkeypatch):
    """The strict check runs on the repository before it is renamed into place; its error names the output's path,
    not the temporary directory that is gone by the time the user reads it (a fuzzing review)."""
    def refuse(repo):
        raise ConfigError("not a valid Triton model config: 1:1 : boom", source=Path(repo) / "ensemble" / "config.pbtxt")

    monkeypatch.setattr(rp, "check_repository", refuse)
    out = tmp_path / "repo"
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(engine), "--output", str(out)))
    assert line.startswith(f"error: {out}/ensemble/config.pbtxt: not a valid Triton model config") and ".tmp" not in line
    assert "(as generated: nothing was written)" in line and not out.exists()


def test_the_missing_tritonserver_advice_is_the_extras_package_alone():
    """`serve` / `deploy triton` without tritonserver say what to install: the [triton] extra's package itself, pinned as
    the extra pins it, since `pip install 'dflash2-trt[triton]'` in TensorRT-LLM's environment (this project --no-deps,
    docs/trt-session.md §11) would resolve this project's dependencies and move TensorRT-LLM's transformers."""
    import re

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    (pin,) = re.findall(r'^triton = \["([^"]+)"\]$', text, flags=re.M)
    TRITON_EXTRA = rp.TRITON_EXTRA
    assert TRITON_EXTRA.startswith(f"pip install {pin} ") and "[triton]" not in TRITON_EXTRA.split("(")[0]
