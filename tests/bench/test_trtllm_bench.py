"""trtllm-bench on a DFlash2 engine (dflash2_trt/bench/trtllm_bench.py), tested against the facts recorded from
TensorRT-LLM 1.2's sources (dflash2_trt/bench/trtllm_bench_1_2.yaml), not against a real TensorRT-LLM:

- the launcher's patch runs against FAKE minimal modules shaped as recorded (a SPECULATIVE_MAP dict with NONE and
  MEDUSA, an IntFlag SpeculativeDecodingMode with the recorded values, a get_decoding_config lookup
  ``SPECULATIVE_MAP[mode]()``, a report that reads ``mode.values[1]``, an entry point taking ``args``);
- the options YAML against the recorded EagleDecodingConfig field names and the TensorRT-path asserts;
- the model folder with this machine's transformers (AutoConfig / AutoTokenizer) and the safetensors library;
- the report parser on SYNTHETIC samples written by hand from the recorded report format (tests/bench/data/
  trtllm_bench_report_synthetic.*: not the output of a real run).
"""

from __future__ import annotations

import enum
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dflash2_trt.bench import trtllm_bench as tb
from dflash2_trt.errors import ConfigError, MissingDependencyError

DATA = Path(__file__).parent / "data"
FACTS = yaml.safe_load((Path(tb.__file__).with_name("trtllm_bench_1_2.yaml")).read_text())


# ------------------------------------------------------------------------------------------------ facts
def test_every_fact_names_its_source_path_and_commit():
    sections = [k for k, v in FACTS.items() if isinstance(v, dict)]
    assert {"speculative_map", "speculative_decoding_mode", "engine_config_reads", "cli", "model_path",
            "eagle_decoding_config", "report"} <= set(sections)
    for k in sections:
        src = FACTS[k]["source"]
        assert src["path"].startswith("tensorrt_llm/") and src["commit"], k
    assert FACTS["speculative_map"]["keys"] == ["NONE", "MEDUSA"]
    assert FACTS["speculative_decoding_mode"]["members"]["EAGLE"] == 32


# --------------------------------------------------------------------------------------------- launcher
def _fake_trtllm(calls: list):
    """Modules shaped as recorded: configuration.SPECULATIVE_MAP + DecodingConfig lookup, modeling_utils'
    IntFlag, commands.bench.main(args=..., prog_name=...) that performs the engine path's lookup and the report's
    mode naming, as trtllm-bench does for an engine whose build_config.speculative_decoding_mode is 32."""
    Mode = enum.IntFlag("SpeculativeDecodingMode", list(FACTS["speculative_decoding_mode"]["members"]))
    assert {m.name: int(m) for m in Mode} == FACTS["speculative_decoding_mode"]["members"]
    configuration = types.ModuleType("tensorrt_llm.bench.dataclasses.configuration")
    configuration.SPECULATIVE_MAP = {Mode.NONE: lambda *a: None, Mode.MEDUSA: lambda *a: "DecodingMode.Medusa"}
    configuration.get_decoding_config = lambda mode: {"decoding_mode": configuration.SPECULATIVE_MAP[Mode(mode)]()}
    modeling = types.ModuleType("tensorrt_llm.models.modeling_utils")
    modeling.SpeculativeDecodingMode = Mode
    bench = types.ModuleType("tensorrt_llm.commands.bench")

    def main(args=None, prog_name=None):
        calls.append({"args": list(args), "prog_name": prog_name,
                      "decoding_config": configuration.get_decoding_config(32),
                      "report_mode": Mode(32).values[1]})
        return None

    bench.main = main
    return {"tensorrt_llm.bench.dataclasses.configuration": configuration,
            "tensorrt_llm.models.modeling_utils": modeling, "tensorrt_llm.commands.bench": bench}, Mode


def test_the_recorded_lookup_fails_on_an_eagle_engine_until_patched():
    mods, Mode = _fake_trtllm([])
    conf = mods["tensorrt_llm.bench.dataclasses.configuration"]
    with pytest.raises(KeyError):
        conf.get_decoding_config(32)                       # stock trtllm-bench on this project's engines
    with pytest.raises(AttributeError):
        Mode.EAGLE.values                                  # the report's mode name, stock
    medusa = conf.SPECULATIVE_MAP[Mode.MEDUSA]
    changed = tb.patch_bench(conf, Mode)
    assert len(changed) == 2
    assert conf.get_decoding_config(32) == {"decoding_mode": None}          # no extra decoding mode, like NONE
    assert conf.SPECULATIVE_MAP[Mode.EAGLE] is conf.SPECULATIVE_MAP[Mode.NONE]
    assert conf.SPECULATIVE_MAP[Mode.MEDUSA] is medusa and len(conf.SPECULATIVE_MAP) == 3
    assert Mode.EAGLE.values[1] == "EAGLE" and Mode.MEDUSA.values == (4, "MEDUSA")
    assert tb.patch_bench(conf, Mode) == []                                   # idempotent


def test_patch_refuses_a_map_not_shaped_as_recorded():
    mods, Mode = _fake_trtllm([])
    conf = mods["tensorrt_llm.bench.dataclasses.configuration"]
    del conf.SPECULATIVE_MAP[Mode.NONE]
    with pytest.raises(RuntimeError, match="no NONE entry"):
        tb.patch_bench(conf, Mode)
    Other = enum.IntFlag("SpeculativeDecodingMode", ["NONE", "EAGLE"])    # EAGLE = 2: not the recorded 32
    with pytest.raises(RuntimeError, match="recorded 32"):
        tb.patch_bench(conf, Other)
    with pytest.raises(RuntimeError, match="SPECULATIVE_MAP"):
        tb.patch_bench(types.ModuleType("x"), Mode)


def test_launcher_runs_the_entry_point_with_the_arguments_unchanged(monkeypatch, capsys):
    calls = []
    mods, _ = _fake_trtllm(calls)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    argv = ["--model", "m", "--model_path", "/p", "throughput", "--backend", "tensorrt", "--engine_dir", "/e"]
    assert tb.main(list(argv)) == 0
    (call,) = calls
    assert call["args"] == argv and call["prog_name"] == "trtllm-bench"
    assert call["decoding_config"] == {"decoding_mode": None} and call["report_mode"] == "EAGLE"
    assert "SPECULATIVE_MAP[EAGLE]" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None, reason="TensorRT-LLM is installed here")
def test_launcher_without_tensorrt_llm_fails_in_one_line():
    r = subprocess.run([sys.executable, "-m", "dflash2_trt.bench.trtllm_bench", "throughput", "--help"],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "TensorRT-LLM 1.2 is not importable" in lines[0]


# ----------------------------------------------------------------------------------------- options file
def _recorded_from_dict(doc: dict) -> dict:
    """DecodingBaseConfig.from_dict + EagleDecodingConfig as recorded: dispatch on decoding_type, strict fields,
    max_draft_len required, the TensorRT path's asserts, eagle_choices prefix-closed with depth max_draft_len."""
    f = FACTS["eagle_decoding_config"]
    spec = dict(doc[f["yaml_key"]])
    assert spec.pop("decoding_type") == f["decoding_type"]
    unknown = set(spec) - set(f["base_fields"]) - set(f["fields"])
    assert not unknown, f"fields EagleDecodingConfig does not have: {unknown}"
    for r in f["required"]:
        assert spec.get(r) is not None, r
    assert spec["max_draft_len"] > 0 and spec["speculative_model_dir"] is not None       # trt_asserts
    ch = [list(c) for c in spec["eagle_choices"]]
    assert all(c[:-1] in ch for c in ch if len(c) > 1), "not prefix-closed"
    assert max(len(c) for c in ch) == spec["max_draft_len"]
    return spec


def test_options_yaml_parses_into_the_recorded_eagle_decoding_config(tmp_path):
    text = tb.options_text(7, tmp_path)
    spec = _recorded_from_dict(yaml.safe_load(text))
    assert spec["eagle_choices"] == [[0] * i for i in range(1, 8)] and spec["max_draft_len"] == 7
    assert Path(spec["speculative_model_dir"]) == tmp_path
    assert set(spec) <= set(FACTS["eagle_decoding_config"]["trt_eagle_config"]) | {"max_draft_len",
                                                                                 "speculative_model_dir"}
    with pytest.raises(ConfigError):
        tb.options_text(0, tmp_path)
    # the checker itself refuses a field the recorded class does not have
    bad = yaml.safe_load(text)
    bad["speculative_config"]["num_draft_tokens"] = 7
    with pytest.raises(AssertionError, match="num_draft_tokens"):
        _recorded_from_dict(bad)


# ----------------------------------------------------------------------------------------- model folder
@pytest.fixture(scope="module", params=[("qwen3", "tiny"), ("qwen3_5", "tiny-hybrid")])
def target(request):
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.plan import prepare

    fam, key = request.param
    pair = trained_pair(fam)
    p = prepare(pair.drafter_dir, pair.target_dir, target_key=key)
    return pair.target_dir, p.t, p.K


def test_model_folder_loads_with_autoconfig_and_autotokenizer(target, tmp_path):
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    from dflash2_trt.tokenizer import find_tokenizer

    target_dir, t, K = target
    info = tb.write_bench_files(tmp_path / "eng", target_dir=target_dir, t=t, draft_len=K, final_dir=tmp_path / "e")
    assert info["available"] is True
    folder = tmp_path / "eng" / "trtllm-bench" / "model"
    cfg = AutoConfig.from_pretrained(str(folder)).to_dict()
    rec = FACTS["model_path"]
    assert cfg["model_type"] == info["model_type"] and cfg["model_type"] in tb.BENCH_MODEL_TYPES
    for name, keys in rec["required"].items():
        assert any(k in cfg for k in keys if "." not in k), name
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["hidden_size"]) == \
        (t.num_hidden_layers, t.num_attention_heads, t.hidden_size)
    assert next(cfg[k] for k in rec["dtype_keys"] if cfg.get(k)) in rec["dtype_allowed"]
    tok = AutoTokenizer.from_pretrained(str(folder), padding_side="left", trust_remote_code=True)
    ref = find_tokenizer(target_dir)
    assert tok.eos_token_id == ref.eos_token_id == t.eos_token_ids[0]
    ids = list(range(3, 30))
    assert tok.decode(ids) == ref.decode(ids)
    st = folder / rec["safetensors_files"][0]
    with safe_open(str(st), "np") as fh:
        count = sum(fh.get_tensor(k).size for k in fh.keys())
    assert count > 0 and tb.safetensors_parameter_count(st) == count
    assert tb.check_model_folder(folder)["param_count"] == count
    opts = yaml.safe_load((tmp_path / "eng" / "trtllm-bench" / "extra_llm_api_options.yaml").read_text())
    assert Path(_recorded_from_dict(opts)["speculative_model_dir"]) == tmp_path / "e" / "trtllm-bench" / "model"


def test_model_folder_checker_names_what_trtllm_bench_would_refuse(target, tmp_path):
    target_dir, t, K = target
    tb.write_bench_files(tmp_path, target_dir=target_dir, t=t, draft_len=K, final_dir=tmp_path)
    folder = tmp_path / "trtllm-bench" / "model"
    from safetensors.numpy import save_file
    import numpy as np

    save_file({"x": np.zeros((0,), dtype=np.float32)}, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match="non-zero parameter count"):
        tb.check_model_folder(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="model.safetensors"):
        tb.check_model_folder(folder)
    save_file({"x": np.zeros((2,), dtype=np.float32)}, str(folder / "model.safetensors"))
    assert tb.check_model_folder(folder)["param_count"] == 2
    good = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(good | {"dtype": "int8", "torch_dtype": "int8"}))
    with pytest.raises(ConfigError, match="dtype 'int8'"):
        tb.check_model_folder(folder)
    (folder / "config.json").write_text(json.dumps(good | {"model_type": "no_such_model_type"}))
    with pytest.raises(ConfigError, match="config.json: AutoConfig cannot load it"):
        tb.check_model_folder(folder)


def test_no_tokenizer_no_bench_folder(target, tmp_path):
    _, t, K = target
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    info = tb.write_bench_files(tmp_path / "eng", target_dir=bare, t=t, draft_len=K, final_dir=tmp_path / "eng")
    assert info["available"] is False and "tokenizer" in info["why"]
    assert not (tmp_path / "eng" / "trtllm-bench").exists()


# --------------------------------------------------------------------------------------------- commands
def _flags(argv):
    return [a for a in argv if a.startswith("--")]


def test_command_uses_only_recorded_options_and_never_max_seq_len():
    cmd = tb.bench_argv(model_name="dflash2-trt/tiny", model_dir="/e/trtllm-bench/model", engine_dir="/e",
                        dataset="/w/d.jsonl", options="/w/o.yaml", concurrency=4, num_requests=3, eos_id=2,
                        warmup=2, kv_cache_fraction=0.9, sampler_options="/w/s.yaml", report_json="/w/r.json",
                        output_json="/w/out.json", workspace="/w/ws", python="/py")
    assert cmd[:3] == ["/py", "-m", "dflash2_trt.bench.trtllm_bench"]
    sub = cmd.index("throughput")
    cli = FACTS["cli"]
    assert set(_flags(cmd[:sub])) <= set(cli["group_options"]) and "--model" in cmd[:sub]
    assert set(_flags(cmd[sub:])) <= set(cli["throughput"]["options"])
    assert "--max_seq_len" not in cmd
    flags = dict(zip(cmd[sub + 1::2], cmd[sub + 2::2]))
    assert flags["--backend"] == "tensorrt" and flags["--engine_dir"] == "/e"
    assert flags["--extra_llm_api_options"] == "/w/o.yaml" and flags["--eos_id"] == "2"
    assert "--streaming" in cmd
    base = tb.bench_argv(model_name="m", model_dir="/m", engine_dir="/t", dataset="/d", options=None)
    assert "--extra_llm_api_options" not in base and base[base.index("--eos_id") + 1] == "-1"


def test_build_dry_run_prints_the_trtllm_bench_command_next_to_trtllm_build():
    from dflash2_trt.cli import main

    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--backend", "trtllm", "--dry-run"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    i = lines.index("trtllm-build command:")
    j = next(k for k, ln in enumerate(lines) if ln.startswith("trtllm-bench command"))
    assert j > i
    line = lines[j + 1]
    for needle in ("LD_PRELOAD=ENGINE_DIR/libdflash2_plugins.so", "-m dflash2_trt.bench.trtllm_bench",
                   "--model_path ENGINE_DIR/trtllm-bench/model", "throughput --backend tensorrt",
                   "--engine_dir ENGINE_DIR", "--dataset DATASET.jsonl",
                   "--extra_llm_api_options ENGINE_DIR/trtllm-bench/extra_llm_api_options.yaml", "--concurrency 4",
                   "--eos_id 2", "--sampler_options ENGINE_DIR/trtllm-bench/sampler_options.yaml"):
        assert needle in line, needle
    assert "--max_seq_len" not in line
    plan = json.loads(CliRunner().invoke(main, ["build", "--target", "tiny", "--backend", "trtllm", "--dry-run",
                                                "--json"]).output)
    assert plan["trtllm_bench"]["line"] == line.strip()


# ----------------------------------------------------------------------------------------------- report
def test_text_and_json_reports_parse_to_the_same_run_block():
    text = (DATA / "trtllm_bench_report_synthetic.txt").read_text()
    doc = json.loads((DATA / "trtllm_bench_report_synthetic.json").read_text())
    from_text = tb.metrics_from_report(tb.parse_report_text(text))
    from_json = tb.metrics_from_report(tb.parse_report_json(doc))
    assert from_text == from_json
    m = from_json
    assert m["requests"] == 64 and m["wall_s"] == 8.0 and m["input_tokens"] == 8192 and m["output_tokens"] == 16384
    assert m["requests_per_s"] == 8.0 and m["output_tokens_per_s"] == 2048.0
    assert m["latency_s"] == pytest.approx({"mean": 0.4805, "std": None, "p50": 0.45, "p90": 0.7, "p99": 0.9,
                                            "min": 0.21025, "max": 0.91})
    assert m["ttft_s"]["p50"] == pytest.approx(0.03) and m["itl_s"]["p99"] == pytest.approx(0.0034)
    assert m["acceptance"]["mean"] == 4.25 and m["decoding_mode"] == "EAGLE"
    assert m["acceptance"]["histogram"] is None and m["target_tokens"] is None
    from dflash2_trt.bench.report import RUN_FIELDS

    assert set(RUN_FIELDS) <= set(m)


def test_report_parser_takes_the_report_not_the_dataset_summary_and_refuses_no_report():
    text = (DATA / "trtllm_bench_report_synthetic.txt").read_text()
    d = tb.parse_report_text(text)
    assert d["request_info"]["avg_output_length"] == 256.0 and d["performance"]["total_latency_ms"] == 8000.0
    assert d["decoding_stats"]["acceptance_length_percentiles"]["p90"] == 4.9
    with pytest.raises(ConfigError, match="no trtllm-bench report"):
        tb.parse_report_text("[TRT-LLM] [E] Error during benchmarking:\nKeyError: <SpeculativeDecodingMode.EAGLE: 32>\n")
    with pytest.raises(ConfigError, match="not a trtllm-bench report"):
        tb.parse_report_json({"engine": {}})


# ------------------------------------------------------------------------------------------------ bench
def _engine(tmp_path, *, with_folder=True, config=None):
    """A stand-in TensorRT-LLM engine dir: engine.json, a config.json with the keys trtllm-bench reads, the
    plugin library file, and (with_folder) trtllm-bench/ written by the build's own function."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.format import ENGINE_FORMAT
    from dflash2_trt.engine.plan import prepare

    e = tmp_path / "eng"
    e.mkdir(parents=True)
    (e / "engine.json").write_text(json.dumps({
        "format": ENGINE_FORMAT, "schema_version": 1, "backend": "trtllm", "target": "tiny", "block_size": 8,
        "tp_size": 1, "eos_token_ids": [2], "limits": {"max_seq_len": 64, "kv_cache_free_gpu_mem_fraction": 0.85}}))
    (e / "config.json").write_text(json.dumps(config if config is not None else {
        "version": "1.2.0",
        "pretrained_config": {"vocab_size": 256, "dtype": "float32",
                              "mapping": {"pp_size": 1, "tp_size": 1, "world_size": 1, "gpus_per_node": 8,
                                          "moe_ep_size": 1, "moe_cluster_size": 1},
                              "quantization": {"quant_algo": None, "kv_cache_quant_algo": None}},
        "build_config": {"max_batch_size": 4, "max_num_tokens": 1024, "max_seq_len": 78, "max_input_len": 32,
                         "speculative_decoding_mode": 32}}))
    (e / "libdflash2_plugins.so").write_bytes(b"\x7fELF")
    if with_folder:
        pair = trained_pair("qwen3")
        p = prepare(pair.drafter_dir, pair.target_dir, target_key="tiny")
        tb.write_bench_files(e, target_dir=pair.target_dir, t=p.t, draft_len=7, final_dir=e)
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"task_id": i, "input_ids": [5 + i, 6], "output_tokens": 16}) + "\n"
                          for i in range(3)))
    return e, ds


def test_bench_with_a_fake_launcher_builds_the_report(tmp_path, monkeypatch):
    e, ds = _engine(tmp_path)
    monkeypatch.setattr(tb, "tensorrt_llm_importable", lambda python=None: True)
    doc = json.loads((DATA / "trtllm_bench_report_synthetic.json").read_text())
    text = (DATA / "trtllm_bench_report_synthetic.txt").read_text()
    calls = []

    def runner(cmd, **kw):
        calls.append((cmd, kw["env"]))
        flags = dict(zip(cmd[::2], cmd[1::2])) | dict(zip(cmd[1::2], cmd[2::2]))
        Path(flags["--output_json"]).write_text(json.dumps({"1": "a b", "2": "c"}))
        if "--extra_llm_api_options" in cmd:
            _recorded_from_dict(yaml.safe_load(Path(flags["--extra_llm_api_options"]).read_text()))
            Path(flags["--report_json"]).write_text(json.dumps(doc))     # the JSON report
            return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")
        half = text.replace("Total Output Throughput (tokens/sec):             2048.0000",
                            "Total Output Throughput (tokens/sec):             1024.0000")
        return subprocess.CompletedProcess(cmd, 0, stdout=half, stderr="")     # no JSON: the log text

    m = tb.bench_trtllm_bench(e, ds, manifest=json.loads((e / "engine.json").read_text()) | {"vocab_size": 256},
                              concurrency="1,4", baseline_engine_dir=tmp_path / "eng", workdir=tmp_path / "work",
                              runner=runner)
    assert len(calls) == 4
    assert [c[c.index("--concurrency") + 1] for c, _ in calls] == ["1", "1", "4", "4"]
    for cmd, env in calls:
        assert cmd[1:3] == ["-m", "dflash2_trt.bench.trtllm_bench"] and "--max_seq_len" not in cmd
        assert env["LD_PRELOAD"].split(":")[0] == str(e / "libdflash2_plugins.so")
        assert cmd[cmd.index("--model_path") + 1] == str((e / "trtllm-bench" / "model").absolute())
        assert cmd[cmd.index("--eos_id") + 1] == "2"
        assert cmd[cmd.index("--kv_cache_free_gpu_mem_fraction") + 1] == "0.85"
    # the engine's own options file describes this engine: used as is, nothing written over it
    spec_cmd = calls[0][0]
    assert spec_cmd[spec_cmd.index("--extra_llm_api_options") + 1] == str(
        (e / "trtllm-bench" / "extra_llm_api_options.yaml").absolute())
    # greedy (the default temperature 0): the speculative runs name a positive temperature the engine reads as
    # greedy (unset would be TensorRT-LLM's 1.0, 0 fails its EAGLE layer: engine_io.yaml request_temperature);
    # the baseline target engine runs with TensorRT-LLM's greedy defaults
    from dflash2_trt.sampling import GREEDY_BELOW

    for cmd, _ in calls:
        if "--extra_llm_api_options" in cmd:
            opts = yaml.safe_load(Path(cmd[cmd.index("--sampler_options") + 1]).read_text())
            assert set(opts) == {"temperature"} and 0 < opts["temperature"] < GREEDY_BELOW
        else:
            assert "--sampler_options" not in cmd
    lines = (tmp_path / "work" / "dataset.jsonl").read_text().splitlines()
    assert [json.loads(ln) for ln in lines] == [{"task_id": i, "input_ids": [5 + i, 6], "output_tokens": 16}
                                                for i in range(3)]
    for row in m["runs"]:
        assert row["speculative"]["acceptance"]["mean"] == 4.25
        assert row["autoregressive"]["output_tokens_per_s"] == 1024.0 and row["speedup"] == 2.0
        assert row["outputs_match"] is True
    assert m["tool"] == "trtllm-bench" and "acceptance.histogram" in m["unavailable"]

    # at a sampling temperature: the speculative run gets it, the baseline gets it with top_p 1.0 (TensorRT-LLM
    # decodes top_k 0 / top_p 0, its defaults, greedily whatever the temperature: engine_io.yaml request_temperature)
    calls.clear()
    tb.bench_trtllm_bench(e, ds, manifest=json.loads((e / "engine.json").read_text()) | {"vocab_size": 256},
                          concurrency="1", baseline_engine_dir=tmp_path / "eng", workdir=tmp_path / "work_t",
                          temperature=0.7, runner=runner)
    got = {("--extra_llm_api_options" in c): yaml.safe_load(Path(c[c.index("--sampler_options") + 1]).read_text())
           for c, _ in calls}
    assert got == {True: {"temperature": 0.7}, False: {"temperature": 0.7, "top_p": 1.0}}

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="KeyError: <SpeculativeDecodingMode.EAGLE: 32>\n")

    with pytest.raises(ConfigError, match="exited 1 at concurrency 1 .*KeyError"):
        tb.bench_trtllm_bench(e, ds, manifest={"block_size": 8, "vocab_size": 256}, concurrency="1",
                              workdir=tmp_path / "w2", runner=failing)


def test_a_recorded_stop_starts_no_further_trtllm_bench_run(tmp_path, monkeypatch):
    """A Ctrl-C whose exception Python lost ends bench run before its next trtllm-bench process."""
    from dflash2_trt.testing.stops import StopDuringFirstRun

    e, ds = _engine(tmp_path)
    monkeypatch.setattr(tb, "tensorrt_llm_importable", lambda python=None: True)
    with StopDuringFirstRun((DATA / "trtllm_bench_report_synthetic.txt").read_text()) as runner, \
            pytest.raises(KeyboardInterrupt):
        tb.bench_trtllm_bench(e, ds, manifest=json.loads((e / "engine.json").read_text()) | {"vocab_size": 256},
                              concurrency="1,4", baseline_engine_dir=tmp_path / "eng", workdir=tmp_path / "work",
                              runner=runner)
    assert len(runner.calls) == 1


def test_bench_refuses_what_trtllm_bench_would_refuse(tmp_path, monkeypatch):
    monkeypatch.setattr(tb, "tensorrt_llm_importable", lambda python=None: True)
    man = {"block_size": 8, "vocab_size": 256, "limits": {"max_seq_len": 64}}
    e, ds = _engine(tmp_path, config={"version": "1.2.0", "pretrained_config": {}, "build_config": {}})
    with pytest.raises(ConfigError, match="pretrained_config.mapping.pp_size"):
        tb.bench_trtllm_bench(e, ds, manifest=man, concurrency="1", workdir=tmp_path / "w")
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"task_id": 0, "input_ids": [5] * 60, "output_tokens": 16}) + "\n")
    with pytest.raises(ConfigError, match="request 0: 60 prompt \\+ 16 output tokens exceed .* 64"):
        tb.bench_trtllm_bench(e, long, manifest=man, concurrency="1", dry_run=True)
    e2, ds2 = _engine(tmp_path / "b", with_folder=False)
    with pytest.raises(ConfigError, match="no trtllm-bench/model/"):
        tb.bench_trtllm_bench(e2, ds2, manifest=man, concurrency="1", workdir=tmp_path / "w3")
    monkeypatch.setattr(tb, "tensorrt_llm_importable", lambda python=None: False)
    with pytest.raises(MissingDependencyError, match="TensorRT-LLM is not importable"):
        tb.bench_trtllm_bench(e2, ds2, manifest=man, concurrency="1", workdir=tmp_path / "w4")


def test_bench_run_dry_run_prints_the_launcher_commands(tmp_path):
    from dflash2_trt.cli import main

    e, ds = _engine(tmp_path, with_folder=False)
    r = CliRunner().invoke(main, ["bench", "run", "--engine-dir", str(e), "--dataset", str(ds), "--backend", "trtllm",
                                  "--concurrency", "2", "--dry-run"])
    assert r.exit_code == 0, r.output
    cmds = [ln for ln in r.output.splitlines() if not ln.startswith("#")]
    (line,) = cmds
    for needle in (f"LD_PRELOAD={e}/libdflash2_plugins.so", "-m dflash2_trt.bench.trtllm_bench",
                   f"--model_path {e}/trtllm-bench/model", f"--engine_dir {e}", "--dataset WORKDIR/dataset.jsonl",
                   "--extra_llm_api_options WORKDIR/extra_llm_api_options.yaml", "--concurrency 2"):
        assert needle in line, needle
    assert "# writes WORKDIR/dataset.jsonl (3 requests, token ids)" in r.output
    assert f"# note: {e}/trtllm-bench/model does not exist" in r.output
    assert not (tmp_path / "WORKDIR").exists() and not Path("WORKDIR").exists()
    g = CliRunner().invoke(main, ["bench", "run", "--engine-dir", str(e), "--dataset", str(ds), "--dry-run",
                                  "--tool", "gptmanager"])
    assert g.exit_code == 0 and g.output.startswith("gptManagerBenchmark --engine_dir")
    bad = CliRunner().invoke(main, ["bench", "run", "--engine-dir", str(e), "--dataset", str(ds), "--dry-run",
                                    "--benchmark-bin", "/x"])
    assert bad.exit_code != 0 and "--tool gptmanager" in bad.output


def test_tool_applies_to_tensorrt_llm_engines_only(tmp_path):
    from dflash2_trt.bench.run import bench_run
    from dflash2_trt.engine.format import ENGINE_FORMAT

    e = tmp_path / "cpu-engine"
    e.mkdir()
    (e / "engine.json").write_text(json.dumps({"format": ENGINE_FORMAT, "backend": "cpu", "block_size": 8}))
    with pytest.raises(ConfigError, match="--tool"):
        bench_run(e, tmp_path / "ds.jsonl", tool="trtllm-bench")
    with pytest.raises(ConfigError, match="must be trtllm-bench or gptmanager"):
        bench_run(e, tmp_path / "ds.jsonl", tool="genai-perf")


def test_the_build_writes_a_greedy_sampler_file_for_the_hand_run_command(tmp_path):
    e, _ = _engine(tmp_path)
    from dflash2_trt.sampling import GREEDY_BELOW

    opts = yaml.safe_load((e / "trtllm-bench" / "sampler_options.yaml").read_text())
    assert set(opts) == {"temperature"} and 0 < opts["temperature"] < GREEDY_BELOW
    assert tb.sampler_options(0.0, speculative=False) is None          # the baseline: TensorRT-LLM's greedy defaults
    assert tb.sampler_options(1e-45, speculative=True) == opts
