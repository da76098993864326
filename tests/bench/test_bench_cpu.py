"""``bench run`` on the tiny CPU engine: every figure is reported, greedy outputs are lossless against the
target for every request, the measured acceptance equals ``run``'s, the baseline is the target alone, and bad
input is one clear line. Timings are reported, never asserted."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from dflash2_trt.bench.report import REPORT_FORMAT, RUN_FIELDS
from dflash2_trt.bench.run import bench_run
from dflash2_trt.cli import main
from dflash2_trt.errors import ConfigError

N_NEW = 24


def _cli(*args):
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.build import build_engine

    pair = trained_pair("qwen3")
    out = tmp_path_factory.mktemp("bench") / "eng"
    build_engine(pair.drafter_dir, pair.target_dir, out, target_key="tiny", overrides={"max_batch_size": 4})
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from dflash2_trt.bench.dataset import prepare_dataset

    p = tmp_path_factory.mktemp("ds") / "ds.jsonl"
    prepare_dataset(source="builtin", builtin="tiny", output=p, num_requests=6, output_tokens=N_NEW, vocab_size=256)
    return p


@pytest.fixture(scope="module")
def report(engine, dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("rep")
    rep = bench_run(engine, dataset, concurrency="1,4", json_out=out / "r.json", plot_out=out / "r.png",
                    project_gpus="h200", keep_outputs=True)
    return rep, out


def test_report_has_every_figure(report):
    rep, out = report
    assert json.loads((out / "r.json").read_text()) == json.loads(json.dumps(rep))
    assert (out / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rep["format"] == REPORT_FORMAT and rep["schema_version"] == 1 and rep["backend"] == "cpu"
    from importlib.metadata import version

    pk = rep["environment"]["packages"]   # what the numbers may depend on, null where not installed
    assert pk["transformers"] == version("transformers") and pk["tokenizers"] == version("tokenizers")
    assert set(pk) >= {"tensorrt", "tensorrt_llm"}
    assert rep["block_size"] == 8 and rep["draft_len"] == 7 and rep["dataset"]["requests"] == 6
    assert rep["baseline"]["kind"] == "target-only" and rep["unavailable"] == []
    assert [r["concurrency"] for r in rep["runs"]] == [1, 4]
    for run in rep["runs"]:
        for mode in ("speculative", "autoregressive"):
            m = run[mode]
            assert set(RUN_FIELDS) <= set(m)
            assert m["requests"] == 6 and m["output_tokens"] > 0 and m["output_tokens_per_s"] > 0
            for d in ("latency_s", "ttft_s", "itl_s"):
                assert m[d]["min"] <= m[d]["p50"] <= m[d]["p90"] <= m[d]["p99"] <= m[d]["max"]
        spec, ar = run["speculative"], run["autoregressive"]
        assert run["speedup"] == pytest.approx(spec["output_tokens_per_s"] / ar["output_tokens_per_s"])
        acc = spec["acceptance"]
        assert sum(acc["histogram"].values()) == acc["steps"] and len(acc["per_position"]) == 7
        assert all(a >= b for a, b in zip(acc["per_position"], acc["per_position"][1:]))
        # the target's work: every prompt once, then K + 1 tokens per request per generation step
        assert spec["target_tokens"] == spec["input_tokens"] + 8 * acc["steps"]
        assert spec["target_tokens_per_emitted_token"] == pytest.approx(spec["target_tokens"] / spec["output_tokens"])
        # a request's last step may accept past its end: what was emitted never exceeds what was accepted
        assert acc["emitted_mean"] <= acc["mean"]
        assert spec["decode_target_tokens_per_emitted_token"] == pytest.approx(8 / acc["emitted_mean"])
        # autoregressive: one token per request per step, exactly one emitted per step
        assert ar["acceptance"]["mean"] == 1.0 and ar["acceptance"]["per_position"] == []
        assert ar["target_tokens"] == ar["input_tokens"] + ar["output_tokens"] - ar["requests"]
        assert ar["decode_target_tokens_per_emitted_token"] == 1.0
        assert acc["mean"] > 1.5 and spec["decode_target_tokens_per_emitted_token"] < 8
    proj = rep["projection"]
    assert proj["kind"].startswith("roofline") and proj["acceptance"]["kind"] == "measured"
    assert proj["tau"] == pytest.approx(rep["runs"][0]["speculative"]["acceptance"]["mean"])
    # the projection's capacity check, as bench project's (its own tests): every level fits the tiny target's KV
    assert proj["gpus"][0]["memory"]["most_requests"] > 4 and all(p["kv_fits"] for p in proj["gpus"][0]["points"])


def test_greedy_outputs_are_lossless_for_every_request(report, dataset):
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.reference.loop import load_pair, target_generate

    rep, _ = report
    pair = trained_pair("qwen3")
    target, _ = load_pair(pair.target_dir, pair.drafter_dir)
    lines = [json.loads(x) for x in dataset.read_text().splitlines()]
    eos = tuple(rep["settings"]["stop_token_ids"])
    assert eos == (2,)
    ref = {ln["task_id"]: target_generate(target, ln["input_ids"], ln["output_tokens"], stop_token_ids=eos)
           for ln in lines}
    for run in rep["runs"]:
        assert run["outputs_match"] is True
        for mode in ("speculative", "autoregressive"):
            got = {r["task_id"]: r["output_ids"] for r in run[mode]["outputs"]}
            assert got == ref, (run["concurrency"], mode)


def test_measured_acceptance_equals_runs(report, engine, dataset):
    from dflash2_trt.engine.run import run_engine

    rep, _ = report
    ran = run_engine(engine, prompts_file=dataset, max_batch_size=4)
    for run in rep["runs"]:
        assert run["speculative"]["acceptance"]["mean"] == pytest.approx(ran["totals"]["mean_acceptance"], abs=1e-12)
        assert [r["output_ids"] for r in run["speculative"]["outputs"]] == [r["output_ids"] for r in ran["requests"]]


def test_cli_run_prints_the_table_and_writes_the_report(engine, dataset, tmp_path):
    code, text = _cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(dataset), "--concurrency", "2",
                      "--num-requests", "3", "--json", str(tmp_path / "r.json"), "--no-progress", "--temperature",
                      "0.8", "--seed", "5", "--backend", "cpu")
    assert code == 0, text
    assert "speculative" in text and "autoregressive" in text and f"wrote report {tmp_path / 'r.json'}" in text
    rep = json.loads((tmp_path / "r.json").read_text())
    (run,) = rep["runs"]
    assert run["outputs_match"] is None                       # sampling: sequences differ, laws do not
    assert rep["settings"]["temperature"] == 0.8 and run["speculative"]["requests"] == 3
    assert rep["settings"]["torch_threads"] == 1


def _one_error_line(code, text) -> str:
    assert code != 0, text
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]


def test_a_concurrency_past_the_engine_names_every_option_the_rebuild_needs(dataset, tmp_path):
    """The advice to rebuild with --max-batch-size C alone is refused by the build where max_num_tokens cannot hold C
    generation requests (a new user's review): it names --max-num-tokens too, at the build's own minimum."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.build import build_engine

    pair = trained_pair("qwen3")
    small = tmp_path / "small"
    build_engine(pair.drafter_dir, pair.target_dir, small, target_key="tiny", verify=False,
                 overrides={"max_batch_size": 4, "max_num_tokens": 32})
    line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(small), "--dataset", str(dataset),
                                 "--concurrency", "1,16"))
    assert line.endswith("rebuild it with `dflash2-trt build ... --max-batch-size 16 --max-num-tokens 128`"), line


@pytest.mark.parametrize("extra,needle", [
    (["--concurrency", "0"], "--concurrency: every concurrency must be >= 1"),
    (["--concurrency", "1,x"], "--concurrency: expected comma-separated positive integers"),
    (["--concurrency", "8"], "exceeds the engine's max_batch_size 4; rebuild it"),
    (["--backend", "trtllm"], "is a cpu engine"),
    (["--num-requests", "99", "--concurrency", "2"], "99 requests asked, the dataset has 6"),
    (["--temperature", "-1"], "--temperature"),
    (["--json", "{tmp}"], "--json: "),
    (["--project", "a100"], "--project: unknown GPU 'a100'"),      # bench run's option, not bench project's --gpu
    (["--dry-run"], "error: --dry-run: applies to TensorRT-LLM engines only (this is a cpu engine)"),
    # the options given, not the whole family of executor-only ones
    (["--tool", "gptmanager", "--plugin-lib", "x.so"], "error: --plugin-lib/--tool: applies to TensorRT-LLM engines"),
    # issue 21 item 11: options that cannot apply are refused, not ignored
    (["--project", ""], "--project: unknown GPU ''"),
    (["--project", "h200", "--context-len", "0"], "--context-len: must be an integer >= 1, got 0"),
    (["--context-len", "512"], "--context-len: applies to the projection only"),
    (["--project-target", "muse-glimmer-30b"], "--project-target: applies to the projection only: give --project"),
    (["--project", "h200", "--context-len", "1000000000", "--concurrency", "1"], "max_position_embeddings"),
    (["--threads", "4096"], "--threads: must be at most the"),      # more threads than cores: skewed numbers
])
def test_bad_run_options_are_one_line(engine, dataset, tmp_path, extra, needle):
    extra = [e.format(tmp=tmp_path) for e in extra]
    line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(dataset),
                                 "--no-progress", *extra))
    assert needle in line, line


def test_bad_datasets_and_engine_dirs_are_one_line(engine, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": 0, "input_ids": [1, 2], "output_tokens": 4}\n{"task_id": 1, "inputs": [1]}\n')
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"task_id": 0, "input_ids": [5] * 300, "output_tokens": 300}) + "\n")
    for ds, needle in ((empty, "no prompts"), (bad, "line 2: unknown key 'inputs'"),
                       (tmp_path / "missing.jsonl", "cannot read"),
                       (long, f"{long}:1: request 0: prompt of 300 tokens exceeds")):   # the file and line
        line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(ds), "--concurrency", "2"))
        assert needle in line, line
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps({"task_id": 0, "input_ids": [1, 2], "output_tokens": 4}) + "\n")
    line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(tmp_path), "--dataset", str(ok)))
    assert "not an engine directory" in line
    other = tmp_path / "other"
    shutil.copytree(engine, other)
    man = json.loads((other / "engine.json").read_text())
    (other / "engine.json").write_text(json.dumps(man | {"backend": "trtllm"}))
    line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(other), "--dataset", str(ok), "--backend", "cpu"))
    assert "is a trtllm engine" in line and "--backend cpu" in line


def test_no_baseline_skips_the_autoregressive_runs(engine, dataset):
    with pytest.raises(ConfigError):
        bench_run(engine, dataset, concurrency="1", num_requests=1, seed=-3)
    rep = bench_run(engine, dataset, concurrency="2", num_requests=2, baseline=False)
    (run,) = rep["runs"]
    assert run["autoregressive"] is None and run["speedup"] is None and rep["baseline"] is None


def test_plot_of_a_run_without_generation_steps(engine, tmp_path):
    """Requests of one output token end on their context step: no generation step, acceptance mean null. --plot used
    to crash on it with a traceback after --json had already been written; now both files are written."""
    ds = tmp_path / "one.jsonl"
    ds.write_text("".join(json.dumps({"task_id": i, "input_ids": [1, 2, 3], "output_tokens": 1}) + "\n"
                          for i in range(2)))
    code, text = _cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(ds), "--concurrency", "1",
                      "--no-progress", "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png"))
    assert code == 0, text
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["runs"][0]["speculative"]["acceptance"]["mean"] is None
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _run_must_not_start(monkeypatch):
    """bench run's measurement replaced by a failure: a refusal that comes from it came after the run started."""
    import dflash2_trt.bench.cpu as cpu_mod

    def ran(*a, **k):
        raise AssertionError("the benchmark ran before the output was refused")
    monkeypatch.setattr(cpu_mod, "bench_cpu", ran)


def test_existing_outputs_are_replaced_only_if_they_are_this_commands(engine, dataset, tmp_path, monkeypatch):
    """`bench run --json` overwrote any file without a word (an engine's engine.json included): it replaces its own
    previous report (--plot: a PNG) and refuses anything else in one line naming the file and what it is, before
    the run."""
    ok = ("--engine-dir", str(engine), "--dataset", str(dataset), "--concurrency", "1", "--num-requests", "1",
          "--no-baseline", "--no-progress")
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    code, text = _cli("bench", "run", *ok, "--json", str(js), "--plot", str(png))
    assert code == 0, text
    js.write_text(json.dumps({"format": REPORT_FORMAT, "old": True}))        # a previous run's report and plot
    png.write_bytes(b"\x89PNG\r\n\x1a\nold")
    code, text = _cli("bench", "run", *ok, "--json", str(js), "--plot", str(png))
    assert code == 0 and f"wrote report {js}" in text and f"wrote plot {png}" in text, text
    assert "old" not in json.loads(js.read_text()) and not png.read_bytes().endswith(b"old")
    manifest = tmp_path / "engine.json"
    shutil.copy(engine / "engine.json", manifest)
    other = tmp_path / "notes.txt"
    other.write_text("not a report")
    before = {p: p.read_bytes() for p in (manifest, other, js, png)}
    _run_must_not_start(monkeypatch)
    for args, needle in ((["--json", str(manifest)], f"--json: {manifest} exists and is a 'dflash2-trt engine' file, "
                                                     f"not a `bench run` report"),
                         (["--json", str(other)], f"--json: {other} exists and is a file of another kind (no JSON "
                                                  f"document, no PNG signature), not a `bench run` report"),
                         (["--json", str(png)], "is a PNG image, not a `bench run` report"),
                         (["--plot", str(js)], f"--plot: {js} exists and is a `bench run` report, not a PNG image"),
                         (["--plot", str(other)], "(no JSON document, no PNG signature), not a PNG image")):
        line = _one_error_line(*_cli("bench", "run", *ok, *args))
        assert needle in line and line.endswith("pass another path"), line
    assert {p: p.read_bytes() for p in before} == before


def test_an_output_that_cannot_be_written_is_refused_before_the_run(engine, dataset, monkeypatch):
    """`bench run --json /proc/x.json` ran the whole benchmark and only then failed with `cannot write`."""
    import os

    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc: a directory where no file can be created, even by root")
    _run_must_not_start(monkeypatch)
    for opt in ("--json", "--plot"):
        line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(dataset),
                                     "--no-progress", opt, "/proc/x.out"))
        assert line.startswith(f"error: {opt}: cannot create a file in /proc: "), line


def test_an_output_that_is_the_dataset_is_refused_in_words_that_fit_bench_run(engine, dataset):
    """bench run has no --force: the overlap line said "(--force would delete it)"."""
    line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(dataset),
                                 "--no-progress", "--json", str(dataset)))
    assert "--force" not in line and "is the dataset" in line and "writing the output would replace it" in line, line


def test_each_run_says_a_line_where_no_bar_shows(engine, dataset, capsys):
    """Without a terminal (a log, CI) the bar is off: each concurrency and mode still says a line on stderr."""
    from dflash2_trt.bench.cpu import bench_cpu

    bench_cpu(engine, dataset, concurrency="1", num_requests=2, max_new_tokens=4, progress=True)
    err = capsys.readouterr().err
    assert "concurrency 1 speculative:" in err and "concurrency 1 autoregressive:" in err and "tokens/s" in err


def test_a_plot_that_cannot_be_written_keeps_the_table_and_the_report(engine, dataset, tmp_path, monkeypatch):
    """The plot is written last: where that write fails (a full disk, seen), the measurement is complete and its JSON
    report already written, yet the command's only line was the plot's error. Now the table is printed, the report
    named, and the error says the measurement is complete and where its report is."""
    import dflash2_trt.bench.run as run_mod
    from dflash2_trt.checkpoint.writer import OutputWriteError

    js, png = tmp_path / "r.json", tmp_path / "p.png"
    real = run_mod.atomic_write_bytes

    def full_disk(path, data):
        if str(path) == str(png):
            raise OutputWriteError(f"{path}: cannot write: No space left on device")
        return real(path, data)

    monkeypatch.setattr(run_mod, "atomic_write_bytes", full_disk)
    code, text = _cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(dataset), "--concurrency", "1",
                      "--num-requests", "1", "--no-baseline", "--no-progress", "--json", str(js), "--plot", str(png))
    lines = text.strip().splitlines()
    assert code == 1 and f"wrote report {js}" in text and "wrote plot" not in text, text
    assert lines[-1] == (f"error: {png}: cannot write: No space left on device (the measurement is complete: its "
                         f"table is above, its report in {js})"), text
    assert json.loads(js.read_text())["format"] == REPORT_FORMAT and not png.exists()
    assert len(lines) > 3                                   # the table


@pytest.mark.parametrize("name", ["p.svg", "p.pdf", "p.JPG"])
def test_the_plot_is_a_png_whatever_its_name_says(engine, dataset, tmp_path, monkeypatch, name):
    """--plot out.svg wrote PNG bytes under that name; a name with another suffix is refused before the run."""
    _run_must_not_start(monkeypatch)
    line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(dataset),
                                 "--no-progress", "--plot", str(tmp_path / name)))
    assert line == f"error: --plot: writes a PNG image: give a name ending in .png, got '{tmp_path / name}'", line


def test_a_concurrency_above_the_requests_says_so(engine, dataset):
    """`--concurrency 4 --num-requests 2` printed a "concurrency 4" row with no word that at most 2 were in flight."""
    code, text = _cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(dataset), "--concurrency", "1,4",
                      "--num-requests", "2", "--no-baseline", "--no-progress")
    assert code == 0, text
    assert "2 request(s) in this run: at most 2 in flight, not 4" in text and "not 1" not in text, text


def test_a_dash_is_not_taken_for_a_file_name(engine, dataset, monkeypatch):
    """`--json -` wrote a file named "-" (many tools read it as standard output): refused before the run."""
    _run_must_not_start(monkeypatch)
    line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(dataset),
                                 "--no-progress", "--json", "-"))
    assert line.startswith("error: --json: '-' (standard output) is not an output here"), line


@pytest.mark.parametrize("cmd", [["bench", "run", "--no-progress"], ["bench", "steps", "--target", "tiny", "--backend",
                                                                       "cpu"], ["bench", "project", "--acceptance", "4.8"]])
def test_an_option_after_json_is_not_taken_for_its_file(engine, dataset, monkeypatch, tmp_path, cmd):
    """`--json` takes a path in the bench commands (a flag elsewhere): `bench run ... --json --no-baseline` wrote its
    report to a file named "--no-baseline" and ran the baseline it was told to skip (a new user's review)."""
    _run_must_not_start(monkeypatch)
    monkeypatch.chdir(tmp_path)
    extra = ["--engine-dir", str(engine), "--dataset", str(dataset)] if cmd[1] == "run" else []
    line = _one_error_line(*_cli(*cmd, *extra, "--json", "--no-baseline"))
    assert line.startswith("error: --json: takes the path of the file it writes, got '--no-baseline', an option's "
                           "name"), line
    assert not list(tmp_path.iterdir())


def test_save_outputs_without_a_report_is_refused(engine, dataset, monkeypatch):
    """The outputs go in the JSON report only: without --json, --save-outputs was silently ignored."""
    _run_must_not_start(monkeypatch)
    line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(dataset),
                                 "--no-progress", "--save-outputs"))
    assert line == "error: --save-outputs: keeps every request's output ids in the JSON report: give --json PATH too"
