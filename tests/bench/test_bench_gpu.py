"""The GPU path (gptManagerBenchmark on an EAGLE engine): command builder, dataset conversion and output parser,
tested on a recorded SAMPLE written by hand from the 1.2 source's print format (data/, not a real run)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dflash2_trt.bench.gpu import (benchmark_command, bench_gpu, eagle_choices, metrics_from_benchmark,
                                   parse_benchmark_output, workload_json)
from dflash2_trt.errors import ConfigError, MissingDependencyError
from dflash2_trt.sampling import GREEDY_BELOW

DATA = Path(__file__).parent / "data"


def _parse_vector_of_vectors(text: str) -> list[list[int]]:
    """benchmarks/cpp/utils/utils.cpp parseVectorOfVectors, ported: outer ``\\[(.*?)\\]``, inner ``\\d+``."""
    return [[int(x) for x in re.findall(r"\d+", m)] for m in re.findall(r"\[(.*?)\]", text)]


def test_eagle_choices_is_the_linear_chain_gptmanagerbenchmark_parses():
    assert eagle_choices(3) == "[[0],[0,0],[0,0,0]]"
    # the C++ regex is non-greedy from the first '[': the outer bracket and the first inner one open together
    assert _parse_vector_of_vectors(eagle_choices(7)) == [[0] * d for d in range(1, 8)]
    with pytest.raises(ConfigError):
        eagle_choices(0)


def test_workload_document_never_asks_for_lora():
    doc = workload_json([{"task_id": 7, "input_ids": [1, 2, 3], "output_tokens": 5}])
    assert doc["samples"] == [{"input_len": 3, "input_ids": [1, 2, 3], "output_len": 5, "task_id": -1}]
    assert isinstance(doc["metadata"], dict)


def test_command_has_the_eagle_and_concurrency_flags():
    cmd = benchmark_command(binary="/opt/gptManagerBenchmark", engine_dir="/e", dataset_json="/w.json", concurrency=4,
                            num_samples=64, draft_len=7, temperature=0.0, eos_id=2, output_csv="/o.csv",
                            responses_json="/r.json")
    assert cmd[0] == "/opt/gptManagerBenchmark"
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert flags["--engine_dir"] == "/e" and flags["--dataset"] == "/w.json" and flags["--concurrency"] == "4"
    assert flags["--api"] == "executor" and flags["--type"] == "inflight" and flags["--max_num_samples"] == "64"
    i = cmd.index("--eagle_choices")
    assert _parse_vector_of_vectors(cmd[i + 1]) == [[0] * d for d in range(1, 8)]
    assert cmd[cmd.index("--eos_id") + 1] == "2"
    assert "--streaming" in cmd and "--enable_kv_cache_reuse=false" in cmd
    # greedy on the EAGLE engine: a positive temperature below the engine's greedy threshold, never unset (1.0:
    # sampling) nor 0 (the EAGLE layer's (0, FLT_MAX] check), engine_io.yaml request_temperature
    t = float(cmd[cmd.index("--temperature") + 1])
    assert 0 < t < GREEDY_BELOW
    # both default to true in gptManagerBenchmark (cxxopts default_value "true"); the hybrid runtime and the
    # Triton repository run with them off
    assert "--enable_chunked_context=false" in cmd
    assert "--streaming" not in benchmark_command(binary="b", engine_dir="/e", dataset_json="/w.json", concurrency=1,
                                                  num_samples=1, draft_len=7, streaming=False)
    base = benchmark_command(binary="b", engine_dir="/t", dataset_json="/w.json", concurrency=1, num_samples=1,
                             draft_len=None, temperature=0.7, eos_id=None)
    assert "--eagle_choices" not in base and base[base.index("--temperature") + 1] == "0.7"
    greedy_base = benchmark_command(binary="b", engine_dir="/t", dataset_json="/w.json", concurrency=1,
                                    num_samples=1, draft_len=None, temperature=0.0)
    assert "--temperature" not in greedy_base        # TensorRT-LLM's own target engine: greedy by default
    spec = benchmark_command(binary="b", engine_dir="/e", dataset_json="/w.json", concurrency=1, num_samples=1,
                             draft_len=7, temperature=0.7)
    assert spec[spec.index("--temperature") + 1] == "0.7"
    assert base[base.index("--eos_id") + 1] == "-1"


def test_parse_the_recorded_sample():
    vals = parse_benchmark_output((DATA / "gptManagerBenchmark_eagle_sample.txt").read_text())
    assert vals["num_samples"] == 64 and vals["token_throughput"] == 2048.0
    assert vals["avg_acceptance_rate"] == 4.25 and vals["p99_sequence_latency"] == 900.0
    m = metrics_from_benchmark(vals, num_requests=64)
    assert m["requests"] == 64 and m["wall_s"] == 8.0 and m["output_tokens"] == 16384
    assert m["requests_per_s"] == 8.0 and m["output_tokens_per_s"] == 2048.0
    assert m["latency_s"] == {"mean": 0.4805, "std": None, "p50": 0.45, "p90": 0.7, "p99": 0.9, "min": 0.21025,
                              "max": 0.91}
    assert m["ttft_s"]["p50"] == 0.03 and m["itl_s"]["p99"] == pytest.approx(0.0034)
    assert m["acceptance"]["mean"] == 4.25 and m["acceptance"]["histogram"] is None and m["target_tokens"] is None
    with pytest.raises(ConfigError, match="no \\[BENCHMARK\\] lines"):
        parse_benchmark_output("[TensorRT-LLM][ERROR] engine not found\n")


def test_nan_values_are_parsed_not_dropped():
    """printf("%.2f") of a 0/0 average prints -nan (glibc): the value is read (as nan), and the report gives null
    for it instead of losing the line or writing NaN into JSON."""
    text = ("[BENCHMARK] num_samples 4\n[BENCHMARK] token_throughput(token/sec) 100.00\n"
            "[BENCHMARK] total_latency(ms) 1000.00\n[BENCHMARK] avg_inter_token_latency(ms) -nan\n"
            "[BENCHMARK] p50_inter_token_latency(ms) nan\n[BENCHMARK] max_inter_token_latency(ms) -inf\n")
    vals = parse_benchmark_output(text)
    assert set(vals) >= {"avg_inter_token_latency", "p50_inter_token_latency", "max_inter_token_latency"}
    assert vals["avg_inter_token_latency"] != vals["avg_inter_token_latency"]      # nan
    assert vals["max_inter_token_latency"] == float("-inf")
    m = metrics_from_benchmark(vals, num_requests=4)
    assert m["itl_s"] is None and m["output_tokens_per_s"] == 100.0
    json.dumps(m, allow_nan=False)


@pytest.fixture()
def gpu_engine(tmp_path):
    """A stand-in TensorRT-LLM engine directory: engine.json + config.json only (enough for the benchmark path)."""
    from dflash2_trt.engine.format import ENGINE_FORMAT

    e = tmp_path / "gpu-engine"
    e.mkdir()
    (e / "engine.json").write_text(json.dumps({"format": ENGINE_FORMAT, "schema_version": 1, "backend": "trtllm",
                                               "target": "tiny", "block_size": 8, "tp_size": 1,
                                               "eos_token_ids": [2]}))
    (e / "config.json").write_text(json.dumps({"pretrained_config": {"vocab_size": 256}}))
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"task_id": i, "input_ids": [5 + i, 6], "output_tokens": 16}) + "\n"
                          for i in range(3)))
    binary = tmp_path / "gptManagerBenchmark"
    binary.write_text("#!/bin/sh\nexit 1\n")
    binary.chmod(0o755)
    return e, ds, binary


def test_bench_gpu_with_a_fake_benchmark_builds_the_report(gpu_engine, tmp_path):
    e, ds, binary = gpu_engine
    spec_out = (DATA / "gptManagerBenchmark_eagle_sample.txt").read_text()
    base_out = (DATA / "gptManagerBenchmark_baseline_sample.txt").read_text()
    calls = []

    def runner(cmd, **kw):
        calls.append(cmd)
        if "--responses_json" in cmd:       # gptManagerBenchmark records responses in non-streaming runs only
            assert "--streaming" not in cmd
            resp = Path(cmd[cmd.index("--responses_json") + 1])
            resp.write_text(json.dumps([{"response_id": i + 1, "response_tokens": [9, i]} for i in range(3)]))
        out = spec_out if "--eagle_choices" in cmd else base_out
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")

    m = bench_gpu(e, ds, manifest=json.loads((e / "engine.json").read_text()) | {"vocab_size": 256},
                  concurrency="1,4", baseline_engine_dir=tmp_path / "target-engine", binary=str(binary),
                  workdir=tmp_path / "work", runner=runner)
    # per level: a streaming timing run per engine, then a non-streaming outputs check per engine
    assert len(calls) == 8 and [c[c.index("--concurrency") + 1] for c in calls] == ["1"] * 4 + ["4"] * 4
    assert ["--streaming" in c for c in calls[:4]] == [True, True, False, False]
    assert ["--responses_json" in c for c in calls[:4]] == [False, False, True, True]
    work = json.loads((tmp_path / "work" / "workload.json").read_text())
    assert [s["input_ids"] for s in work["samples"]] == [[5, 6], [6, 6], [7, 6]]
    for row in m["runs"]:
        assert row["speedup"] == 2.0                      # 2048 / 1024 token/s in the two samples
        assert row["outputs_match"] is True and row["outputs_compared"]["compared"] == 3
        assert row["speculative"]["acceptance"]["mean"] == 4.25
    assert "target_tokens" in m["unavailable"] and m["backend"] == "trtllm"
    from dflash2_trt.bench.report import build_report, render

    text = render(build_report(m, ds))     # the tool's figure is labelled as the tool's, not as counted here
    assert "accept = the acceptance length TensorRT-LLM's benchmark tool reports" in text, text

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 3, stdout="", stderr="[TensorRT-LLM][ERROR] boom\n")

    with pytest.raises(ConfigError, match="exited 3 at concurrency 1 .*boom"):
        bench_gpu(e, ds, manifest={"block_size": 8, "vocab_size": 256}, concurrency="1", binary=str(binary),
                  workdir=tmp_path / "w2", runner=failing)


def test_a_recorded_stop_starts_no_further_benchmark_run(gpu_engine, tmp_path):
    """A Ctrl-C whose exception Python lost (recorded by errors.stop_requested) ends bench run before its next
    benchmark process, instead of running every level on both engines."""
    from dflash2_trt.testing.stops import StopDuringFirstRun

    e, ds, binary = gpu_engine
    with StopDuringFirstRun((DATA / "gptManagerBenchmark_eagle_sample.txt").read_text()) as runner, \
            pytest.raises(KeyboardInterrupt):
        bench_gpu(e, ds, manifest=json.loads((e / "engine.json").read_text()) | {"vocab_size": 256},
                  concurrency="1,4", baseline_engine_dir=tmp_path / "target-engine", binary=str(binary),
                  workdir=tmp_path / "work", runner=runner)
    assert len(runner.calls) == 1


def test_gpu_engine_without_the_benchmark_binary_is_a_clear_error(gpu_engine, tmp_path, monkeypatch):
    from dflash2_trt.bench.run import bench_run

    e, ds, _ = gpu_engine
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(MissingDependencyError, match="gptManagerBenchmark not found"):
        bench_run(e, ds, concurrency="1", tool="gptmanager")
    rep = bench_run(e, ds, concurrency="2", dry_run=True, tool="gptmanager")
    (cmd,) = rep["commands"]
    assert cmd[0] == "gptManagerBenchmark" and "--eagle_choices" in cmd


@pytest.mark.tensorrt
def test_real_gptmanagerbenchmark_help_lists_the_flags_used():
    exe = shutil.which("gptManagerBenchmark")
    if exe is None:
        pytest.skip("gptManagerBenchmark is not on PATH (TensorRT-LLM 1.2 benchmarks/cpp, GPU machines)")
    text = subprocess.run([exe, "--help"], capture_output=True, text=True).stdout
    for flag in ("--eagle_choices", "--concurrency", "--streaming", "--responses_json", "--max_num_samples"):
        assert flag in text


def _fake(spec_tokens, base_tokens, spec_out, base_out):
    def runner(cmd, **kw):
        if "--responses_json" in cmd:
            toks = spec_tokens if "--eagle_choices" in cmd else base_tokens
            Path(cmd[cmd.index("--responses_json") + 1]).write_text(json.dumps(
                [{"response_id": i + 10, "response_tokens": t} for i, t in enumerate(toks)]))
        return subprocess.CompletedProcess(cmd, 0, stdout=spec_out if "--eagle_choices" in cmd else base_out,
                                           stderr="")
    return runner


def test_outputs_match_reports_a_mismatch_and_null_when_nothing_was_compared(gpu_engine, tmp_path):
    """outputs_match comes from comparing the two engines' non-streaming responses: a differing token is False
    (with the request named), an empty responses file (what a streaming run writes) or no baseline is null."""
    e, ds, binary = gpu_engine
    spec_out = (DATA / "gptManagerBenchmark_eagle_sample.txt").read_text()
    base_out = (DATA / "gptManagerBenchmark_baseline_sample.txt").read_text()
    man = json.loads((e / "engine.json").read_text()) | {"vocab_size": 256}
    same = [[9, 1], [9, 2], [9, 3]]
    kw = dict(manifest=man, concurrency="2", baseline_engine_dir=tmp_path / "t", binary=str(binary))
    m = bench_gpu(e, ds, workdir=tmp_path / "a", runner=_fake(same, [[9, 1], [9, 7], [9, 3]], spec_out, base_out), **kw)
    row = m["runs"][0]
    assert row["outputs_match"] is False and row["outputs_compared"]["mismatched"] == [1]
    m = bench_gpu(e, ds, workdir=tmp_path / "b", runner=_fake(same, same[:2], spec_out, base_out), **kw)
    assert m["runs"][0]["outputs_match"] is False                  # a missing response is not a match
    m = bench_gpu(e, ds, workdir=tmp_path / "c", runner=_fake([], [], spec_out, base_out), **kw)
    assert m["runs"][0]["outputs_match"] is None and m["runs"][0]["outputs_compared"]["compared"] == 0
    m = bench_gpu(e, ds, workdir=tmp_path / "d", runner=_fake(same, same, spec_out, base_out), **kw)
    assert m["runs"][0]["outputs_match"] is True
    m = bench_gpu(e, ds, workdir=tmp_path / "e", runner=_fake(same, same, spec_out, base_out), manifest=man,
                  concurrency="2", binary=str(binary))
    assert m["runs"][0]["outputs_match"] is None                   # no baseline: nothing compared
    assert not any("--responses_json" in c for c in m["commands"])


def test_requests_with_fewer_than_two_output_tokens_are_refused(gpu_engine, tmp_path):
    """gptManagerBenchmark's streaming metrics read an unset inter-token latency for a request with <= 1 output
    token (std::optional::value): the run would throw after doing all the work."""
    e, ds, binary = gpu_engine
    ds.write_text(json.dumps({"task_id": 0, "input_ids": [5, 6], "output_tokens": 1}) + "\n")
    with pytest.raises(ConfigError, match="request 0 asks for 1 output token.*>= 2"):
        bench_gpu(e, ds, manifest={"block_size": 8, "vocab_size": 256}, concurrency="1", binary=str(binary),
                  workdir=tmp_path / "w", runner=lambda *a, **k: pytest.fail("ran"))


def test_gptmanager_refuses_a_sampling_temperature_with_a_baseline(tmp_path):
    """gptManagerBenchmark has only --temperature: TensorRT-LLM decodes the baseline's top_k 0 / top_p 0 requests
    greedily whatever the temperature, so a sampled speculative run would be compared with a greedy baseline."""
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"task_id": 0, "input_ids": [5, 6], "output_tokens": 8}) + "\n")
    man = {"block_size": 8, "vocab_size": 256, "eos_token_ids": [2]}
    with pytest.raises(ConfigError, match="--temperature: 0.7 with a baseline engine: gptManagerBenchmark has no "
                                          "top-k / top-p option"):
        bench_gpu(tmp_path, ds, manifest=man, concurrency="1", temperature=0.7, baseline_engine_dir=tmp_path,
                  dry_run=True)
    out = bench_gpu(tmp_path, ds, manifest=man, concurrency="1", temperature=0.7, dry_run=True)   # no baseline: fine
    assert out is not None
