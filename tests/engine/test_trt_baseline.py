"""The autoregressive baseline of a TensorRT engine on the project runtime: ``build --backend trtllm --baseline``
writes ``baseline/`` (the target alone, trtllm/network/target_only.py, built by trtllm-build: tests/engine/
test_trtllm_branch.py), and ``bench run`` drives it through the same runtime and feed code with K = 0, after the
speculative engine, one engine at a time; a tp engine's ranks follow rank 0 from one session to the next.

Here the rank engines are the CPU stand-in of TensorRT's execution API (dflash2_trt/testing/tensorrt_standin.py),
the baseline's running the tiny hybrid pair's CPU engine's target alone. The reference for its tokens is the HF
target's own greedy decoding (transformers), not the engine under test."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from dflash2_trt.engine.format import file_sha256
from dflash2_trt.errors import ConfigError
from dflash2_trt.testing import tensorrt_standin as trt
from dflash2_trt.testing.engines import standin_trt_engine_dir

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24], [30, 31, 32, 33]]
NEW = 10


@pytest.fixture(scope="module")
def with_baseline(standin_trt_engine, tmp_path_factory):
    _, cpu_dir = standin_trt_engine
    return standin_trt_engine_dir(cpu_dir, tmp_path_factory.mktemp("b") / "engine", baseline=True)


def _dataset(path):
    path.write_text("".join(json.dumps({"task_id": i, "input_ids": p, "output_tokens": NEW}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    return path


def _rehash(d, rel):
    """Record a changed baseline file in engine.json as a build would have (the refusal tested is the config's, not
    the file list's)."""
    man = json.loads((d / "engine.json").read_text())
    p = d / rel
    man["baseline"]["files"][rel] = {"size": p.stat().st_size, "sha256": file_sha256(p)}
    (d / "engine.json").write_text(json.dumps(man))


def test_bench_run_measures_the_speedup_over_the_baseline_engine(with_baseline, tmp_path):
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.bench.report import render
    from dflash2_trt.bench.run import bench_run
    from dflash2_trt.reference.loop import load_pair, target_generate

    rep = bench_run(with_baseline, _dataset(tmp_path / "ds.jsonl"), concurrency="1,3", trt=trt, progress=False,
                    keep_outputs=True, stop_on_eos=False)
    assert rep["tool"] == "project-runtime" and rep["baseline"]["kind"] == "target-only"
    pair = trained_pair("qwen3_5")
    target, _ = load_pair(pair.target_dir, pair.drafter_dir)
    want = [target_generate(target, p, NEW) for p in PROMPTS]          # the HF target's own greedy decoding
    for run in rep["runs"]:
        sp, ar = run["speculative"], run["autoregressive"]
        assert [o["output_ids"] for o in ar["outputs"]] == want, run["concurrency"]
        assert [o["output_ids"] for o in sp["outputs"]] == want, run["concurrency"]
        assert run["outputs_match"] is True
        assert {a for o in ar["outputs"] for a in o["acceptance_lengths"]} == {1}     # one token per step
        assert ar["acceptance"]["mean"] == 1.0 and sp["acceptance"]["mean"] > 1.0
        assert run["speedup"] > 0 and ar["engine_steps"] > sp["engine_steps"]     # fewer steps with speculation
    text = render(rep)
    assert "autoregressive" in text and "outputs identical to autoregressive (T = 0): True" in text
    assert not any("no autoregressive baseline" in n for n in rep["notes"])
    # not routed (the hybrid target has no sliding layers): no context-route caveat on its baseline
    assert rep["baseline"]["sliding_path"] is None and not any("context route" in n for n in rep["notes"])
    # at a temperature both run, and nothing claims the outputs match
    hot = bench_run(with_baseline, tmp_path / "ds.jsonl", concurrency="2", trt=trt, temperature=0.8, progress=False)
    assert hot["runs"][0]["autoregressive"]["requests"] == 4 and hot["runs"][0]["outputs_match"] is None


def test_the_baseline_session_binds_the_target_only_engine(with_baseline):
    from dflash2_trt.engine.trtllm.session import open_trt_session
    from dflash2_trt.runtime import Request, Runtime

    sess, _ = open_trt_session(with_baseline, trt=trt, baseline=True)
    try:
        assert sess.K == 0 and sess.tensors["next_draft_tokens"].shape[-1] == 0
        reqs = [Request(list(p), 4, task_id=i) for i, p in enumerate(PROMPTS[:2])]
        Runtime(sess, max_batch_size=2).generate(reqs)
        assert sess.bound["draft_lens"].tolist() == [0, 0]         # the runtime's EAGLE inputs, with no draft slots
        assert all(len(r.output_ids) == 4 for r in reqs)
    finally:
        sess.close()
    with pytest.raises(RuntimeError, match="closed"):
        sess.step({})


def test_one_engine_at_a_time(with_baseline, tmp_path, monkeypatch):
    """bench run closes the speculative session before it opens the baseline: when the baseline's session is made,
    nothing of the first one (its execution: the engine's weights; its KV pool) is alive any more."""
    import weakref

    from dflash2_trt.bench.run import bench_run
    from dflash2_trt.engine.trtllm.session import TrtEngineSession

    made, alive_at_open = [], []
    real = TrtEngineSession.__init__

    def init(self, *a, **kw):
        alive_at_open.append([r() is not None for r in made])
        real(self, *a, **kw)
        made.append(weakref.ref(self.execution))
        made.append(weakref.ref(self.pools[0]))

    monkeypatch.setattr(TrtEngineSession, "__init__", init)
    rep = bench_run(with_baseline, _dataset(tmp_path / "ds.jsonl"), concurrency="2", trt=trt, progress=False)
    assert rep["runs"][0]["outputs_match"] is True
    assert alive_at_open == [[], [False, False]]


def test_without_a_baseline_the_report_says_how_to_get_one(standin_trt_engine, with_baseline, tmp_path, capsys):
    from dflash2_trt.bench.run import bench_run
    from dflash2_trt.bench.session import NO_BASELINE_NOTE

    d, _ = standin_trt_engine
    ds = _dataset(tmp_path / "ds.jsonl")
    rep = bench_run(d, ds, concurrency="2", trt=trt, progress=False)
    assert rep["baseline"] is None and NO_BASELINE_NOTE in rep["notes"]
    assert rep["runs"][0]["autoregressive"] is None and rep["runs"][0]["speedup"] is None
    assert "build --backend trtllm --baseline" in capsys.readouterr().err
    off = bench_run(with_baseline, ds, concurrency="2", trt=trt, progress=False, baseline=False)
    assert off["baseline"] is None and off["runs"][0]["autoregressive"] is None
    assert "no autoregressive baseline (--no-baseline)" in off["notes"]


def test_a_baseline_that_does_not_belong_is_refused_before_anything_runs(standin_trt_engine, with_baseline, tmp_path):
    from dflash2_trt.bench.run import bench_run
    from dflash2_trt.engine.trtllm.session import open_trt_session

    d, _ = standin_trt_engine
    with pytest.raises(ConfigError, match=r"has no baseline engine: rebuild with `dflash2-trt build --backend trtllm "
                                          r"--baseline"):
        open_trt_session(d, trt=trt, baseline=True)
    ds = _dataset(tmp_path / "ds.jsonl")
    for field, value, why in (("dflash2_engine.network", None, "is not a baseline engine"),
                              ("vocab_size", 999, "is 999, the combined engine's is"),
                              ("mapping.tp_size", 2, "is 2, the combined engine's is 1")):
        bad = tmp_path / field
        shutil.copytree(with_baseline, bad)
        path = bad / "baseline" / "config.json"
        cfg = json.loads(path.read_text())
        node = cfg["pretrained_config"]
        *parents, leaf = field.split(".")
        for k in parents:
            node = node[k]
        node[leaf] = value
        path.write_text(json.dumps(cfg))
        _rehash(bad, "baseline/config.json")
        calls = []
        real = trt.Runtime.deserialize_cuda_engine
        trt.Runtime.deserialize_cuda_engine = lambda self, data: calls.append(1) or real(self, data)
        try:
            with pytest.raises(ConfigError, match=why) as ei:
                bench_run(bad, ds, concurrency="1", trt=trt, progress=False)
        finally:
            trt.Runtime.deserialize_cuda_engine = real
        assert str(path) in str(ei.value) and f"pretrained_config.{field}" in str(ei.value)
        assert calls == []                                          # no engine was opened


def test_cuda_graphs_cover_the_baseline_too(with_baseline, tmp_path):
    """``--cuda-graphs`` on this path graphs both engines (simulated on the stand-in): the speedup compares graphed with
    graphed, and the baseline's tokens are the eager run's."""
    from dflash2_trt.bench.run import bench_run

    ds = _dataset(tmp_path / "ds.jsonl")
    eager = bench_run(with_baseline, ds, concurrency="1,3", trt=trt, progress=False, keep_outputs=True)
    graphed = bench_run(with_baseline, ds, concurrency="1,3", trt=trt, progress=False, keep_outputs=True,
                        simulate_graphs=True)
    for a, b in zip(graphed["runs"], eager["runs"]):
        assert a["autoregressive"]["outputs"] == b["autoregressive"]["outputs"] and a["outputs_match"] is True
        g = a["autoregressive"]["cuda_graphs"]
        assert g["replayed"] + g["captured"] + g["eager"] == a["autoregressive"]["engine_steps"] and g["replayed"] >= 1


def test_a_deleted_baseline_leaves_the_engine_usable(with_baseline, tmp_path):
    """The baseline costs the target's weights again on disk; a user who deletes baseline/ keeps a working engine
    (its files are engine.json's baseline.files, apart), and bench run without --no-baseline says what to do."""
    from dflash2_trt.bench.run import bench_run
    from dflash2_trt.engine.run import run_engine

    d = tmp_path / "engine"
    shutil.copytree(with_baseline, d)
    shutil.rmtree(d / "baseline")
    ds = _dataset(tmp_path / "ds.jsonl")
    assert len(run_engine(d, prompts_file=str(ds), max_batch_size=2, trt=trt)["requests"]) == 4
    off = bench_run(d, ds, concurrency="2", trt=trt, progress=False, baseline=False)
    assert off["runs"][0]["speculative"]["requests"] == 4
    with pytest.raises(ConfigError, match=r"baseline/config.json is missing: the baseline engine is incomplete or "
                                          r"modified; rebuild with --baseline, or run `bench run --no-baseline`"):
        bench_run(d, ds, concurrency="2", trt=trt, progress=False)


def test_a_baseline_that_fails_keeps_the_speculative_runs(with_baseline, tmp_path, monkeypatch):
    """A baseline engine that fails to deserialize after the speculative sweep (say, built by another TensorRT): the
    report keeps the speculative runs and names the failure, and the command exits 1 with one line."""
    from click.testing import CliRunner

    from dflash2_trt.bench.run import bench_run
    from dflash2_trt.cli import main

    _fail_baseline_open(monkeypatch, lambda: RuntimeError("engine plan built by another TensorRT version"))
    ds = _dataset(tmp_path / "ds.jsonl")
    rep = bench_run(with_baseline, ds, concurrency="1", trt=trt, progress=False)
    assert rep["runs"][0]["speculative"]["requests"] == 4 and rep["runs"][0]["autoregressive"] is None
    assert rep["baseline"] is None and "another TensorRT version" in rep["baseline_error"]
    assert any(n.startswith("the baseline engine failed after the speculative runs") for n in rep["notes"])
    _cli_standin(monkeypatch)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["bench", "run", "--engine-dir", str(with_baseline), "--dataset", str(ds),
                                    "--concurrency", "1", "--json", str(out)])
    assert res.exit_code == 1
    final = json.loads(out.read_text())
    assert final["runs"][0]["speculative"]["requests"] == 4 and "another TensorRT version" in final["baseline_error"]
    assert "error: the baseline engine failed after the speculative runs: RuntimeError: engine plan" in res.output


def test_the_executor_path_tools_refuse_the_project_baseline(standin_trt_engine, with_baseline, tmp_path):
    """trtllm-bench / gptManagerBenchmark take a stock target engine as --baseline-engine-dir; this project's
    baseline/ runs on the project runtime only: refused by name before anything runs."""
    from dflash2_trt.bench.run import bench_run

    d, _ = standin_trt_engine
    with pytest.raises(ConfigError, match="is this project's baseline engine") as ei:
        bench_run(d, _dataset(tmp_path / "ds.jsonl"), concurrency="1", runtime="executor", dry_run=True,
                  baseline_engine_dir=with_baseline / "baseline", trt=trt)
    assert str(with_baseline / "baseline" / "config.json") in str(ei.value)
    assert "pretrained_config.dflash2_engine.network" in str(ei.value)



def _cli_standin(monkeypatch):
    """The CLI as a user runs it, TensorRT's module being the stand-in and no plugin library to load."""
    import dflash2_trt.engine.trtllm.session as session

    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(session, "load_plugin_libraries", lambda engine_dir: None)


def _fail_baseline_open(monkeypatch, exc_factory):
    real = trt.Runtime.deserialize_cuda_engine

    def picky(self, data):
        if b'"target_only"' in bytes(data):
            raise exc_factory()
        return real(self, data)

    monkeypatch.setattr(trt.Runtime, "deserialize_cuda_engine", picky)


def test_a_stop_during_the_baseline_stays_a_stop_and_the_sweep_is_on_disk(with_baseline, tmp_path, monkeypatch):
    """SIGTERM while the baseline opens, turned into another error by the code it interrupted (as extension modules
    do): the command still ends as a stop (143), not as a baseline failure (1). --json holds the speculative sweep,
    written before the baseline opened, saying that the baseline did not finish."""
    import os
    import signal
    import time

    from click.testing import CliRunner

    from dflash2_trt.bench.session import BASELINE_PENDING
    from dflash2_trt.cli import main
    from dflash2_trt.errors import clear_stop_requests

    _cli_standin(monkeypatch)

    def converted():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except BaseException:
            return RuntimeError("could not read the plan")
        return AssertionError("no signal arrived")

    _fail_baseline_open(monkeypatch, converted)
    out = tmp_path / "r.json"
    try:
        res = CliRunner().invoke(main, ["bench", "run", "--engine-dir", str(with_baseline), "--dataset",
                                        str(_dataset(tmp_path / "ds.jsonl")), "--concurrency", "1", "--json", str(out)])
    finally:
        clear_stop_requests()       # the recorded stop is this command's; the next test starts without it
    assert res.exit_code == 143, res.output
    assert "baseline engine failed" not in res.output
    rep = json.loads(out.read_text())
    assert rep["baseline_error"] == BASELINE_PENDING and rep["runs"][0]["speculative"]["requests"] == 4
    assert rep["runs"][0]["autoregressive"] is None and rep["baseline"] is None


def test_an_engine_with_draft_slots_is_no_baseline(with_baseline, tmp_path):
    """baseline/rank0.engine swapped for the combined engine (its next_draft_tokens has K slots) under a target-only
    config: refused by what the engine declares; the sweep is kept."""
    from dflash2_trt.bench.run import bench_run

    d = tmp_path / "engine"
    shutil.copytree(with_baseline, d)
    shutil.copy2(d / "rank0.engine", d / "baseline" / "rank0.engine")
    _rehash(d, "baseline/rank0.engine")
    rep = bench_run(d, _dataset(tmp_path / "ds.jsonl"), concurrency="1", trt=trt, progress=False)
    assert "next_draft_tokens has 3 draft slots, expected 0 (not a target-only engine)" in rep["baseline_error"]
    assert rep["runs"][0]["speculative"]["requests"] == 4


@pytest.mark.parametrize("change, why", [
    (lambda p: p.write_bytes(p.read_bytes() + b" "), r"baseline/rank0.engine has \d+ bytes, the manifest says \d+"),
    (lambda p: p.with_name("config.json").write_text(p.with_name("config.json").read_text().replace("float32",
                                                                                                   "float64", 1)),
     "baseline/config.json: sha256 differs from the manifest"),
])
def test_a_changed_baseline_file_is_refused(with_baseline, tmp_path, change, why):
    from dflash2_trt.bench.run import bench_run

    d = tmp_path / "engine"
    shutil.copytree(with_baseline, d)
    change(d / "baseline" / "rank0.engine")
    with pytest.raises(ConfigError, match=why):
        bench_run(d, _dataset(tmp_path / "ds.jsonl"), concurrency="1", trt=trt, progress=False)


def test_an_executor_path_report_says_where_its_baseline_runs(tmp_path):
    """An executor-path engine (the dense tiny pair) built with --baseline: trtllm-bench's report notes that baseline/
    runs on the project runtime only (`--runtime project`), instead of ignoring it silently."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.bench.run import bench_run
    from dflash2_trt.engine.build import build_engine

    pair = trained_pair("qwen3")
    cpu = tmp_path / "cpu"
    build_engine(pair.drafter_dir, pair.target_dir, cpu, target_key="tiny", overrides={"block_size": 4}, verify=False,
                 sets={"drafter_window": "full"})        # no sliding drafter layer: the executor can run it
    d = standin_trt_engine_dir(cpu, tmp_path / "trt", baseline=True)
    rep = bench_run(d, _dataset(tmp_path / "ds.jsonl"), concurrency="1", trt=trt, dry_run=True)
    assert rep["runtime_path"]["path"] == "executor"
    assert any("baseline/ (build --baseline) runs on the project runtime only" in n for n in rep["notes"])
    proj = bench_run(d, tmp_path / "ds.jsonl", concurrency="1", trt=trt, runtime="project", progress=False)
    assert proj["runs"][0]["outputs_match"] is True and proj["baseline"]["kind"] == "target-only"


def test_a_request_the_engine_cannot_take_is_named_by_its_dataset_line(with_baseline, tmp_path):
    """As on the CPU path (tests/bench/test_bench_cpu.py): the project runtime over TensorRT checks every request
    before anything runs, and names the dataset file and line of one that does not fit."""
    from dflash2_trt.bench.run import bench_run

    ds = tmp_path / "big.jsonl"
    ds.write_text(json.dumps({"task_id": 0, "input_ids": [5, 6, 7], "output_tokens": 4}) + "\n"
                  + json.dumps({"task_id": 1, "input_ids": [5, 6, 7], "output_tokens": 100000}) + "\n")
    with pytest.raises(ConfigError) as e:
        bench_run(with_baseline, ds, concurrency="1", trt=trt, progress=False, stop_on_eos=False)
    assert str(e.value).startswith(f"{ds}:2: ") and "100000" in str(e.value), str(e.value)


def test_serving_the_target_alone_opens_the_baseline_engine(standin_trt_engine, with_baseline, tmp_path, monkeypatch):
    """`serve --target-only` / `deploy triton --target-only` on a TensorRT engine directory: the python model opens its
    baseline/ (K 0, one token a step, the HF target's greedy decoding); a directory without one is refused in one
    line naming `build --baseline`, before any repository is written."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.deploy.triton import serving
    from dflash2_trt.deploy.triton.repository import deploy_triton
    from dflash2_trt.reference.loop import load_pair, target_generate
    from dflash2_trt.runtime import Request, Runtime

    monkeypatch.setenv(serving.STANDIN_ENV, "1")
    eng, _, what = serving.open_engine(with_baseline, target_only=True)
    try:
        assert eng.K == 0 and "its baseline/ engine (the target alone, K 0)" in what
        reqs = [Request(list(p), NEW, task_id=i) for i, p in enumerate(PROMPTS)]
        Runtime(eng, max_batch_size=4).generate(reqs)
    finally:
        eng.close()
    pair = trained_pair("qwen3_5")
    target, _ = load_pair(pair.target_dir, pair.drafter_dir)
    assert [r.output_ids for r in reqs] == [target_generate(target, p, NEW) for p in PROMPTS]
    assert {a for r in reqs for a in r.acceptance_lengths} == {1}
    without = standin_trt_engine[0]
    with pytest.raises(ConfigError, match="has no baseline engine to serve the target alone from: build it with"):
        serving.open_engine(without, target_only=True)
    with pytest.raises(ConfigError, match="has no baseline engine"):
        deploy_triton(without, tmp_path / "repo", ids_only=True, target_only=True)
    assert not (tmp_path / "repo").exists()
    repo = deploy_triton(with_baseline, tmp_path / "repo", ids_only=True, target_only=True).output
    pbtxt = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert '"target_only"' in pbtxt and "eagle_choices" not in pbtxt
    with pytest.raises(ConfigError, match="--target-only: applies to the python-backend model"):
        deploy_triton(with_baseline, tmp_path / "repo2", ids_only=True, target_only=True, backend="tensorrtllm")


def test_the_target_alone_of_an_executor_path_engine_and_of_a_broken_baseline(with_baseline, tmp_path):
    """An engine TensorRT-LLM's executor runs (runtime path executor) still serves its target alone: baseline/ runs on
    the project runtime only, so --target-only writes the python model there, `--backend auto` included (serve has no
    --backend). A baseline whose files are gone is refused before anything is written, with advice for serving."""
    from dflash2_trt.deploy.triton.repository import deploy_triton
    from dflash2_trt.testing.corrupt import copy_with_json

    d = copy_with_json(with_baseline, tmp_path / "exec", "engine.json",
                       runtime_path={"path": "executor", "why": ["w"], "limits": [], "description": "x"})
    assert deploy_triton(d, tmp_path / "plain", ids_only=True).backend == "tensorrtllm"
    res = deploy_triton(d, tmp_path / "alone", ids_only=True, target_only=True)
    assert (res.backend, res.runtime) == ("python", "project")
    broken = tmp_path / "broken"
    shutil.copytree(with_baseline, broken)
    gone = next(p for p in (broken / "baseline").iterdir() if p.name != "config.json")
    gone.unlink()
    with pytest.raises(ConfigError, match="the baseline engine is incomplete or modified; rebuild with --baseline, "
                                          "or serve the combined engine without --target-only"):
        deploy_triton(broken, tmp_path / "repo", ids_only=True, target_only=True)
    assert not (tmp_path / "repo").exists()
