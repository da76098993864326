"""Which runtime drives a TensorRT engine (engine/trtllm/paths.py), what `build --dry-run`, engine.json and RUN.md
say about it, and `run` / `bench run` taking the project runtime over TensorRT for the engines TensorRT-LLM's
executor refuses (here on a TensorRT engine directory whose rank engine is the CPU stand-in of TensorRT's execution
API, running the tiny hybrid pair's CPU network)."""

from __future__ import annotations

import json

import pytest

from dflash2_trt.assets import trained_pair
from dflash2_trt.engine.trtllm.paths import EXECUTOR, PROJECT, choose_runtime
from dflash2_trt.errors import ConfigError, MissingDependencyError
from dflash2_trt.testing import tensorrt_standin as trt
from dflash2_trt.testing.fixtures import MUSE_DRAFTER, MUSE_TARGET, QWEN_DRAFTER, QWEN_TARGET


def _plan(*args):
    from dflash2_trt.engine.plan import dry_run_plan
    from dflash2_trt.engine.trtllm.toolchain import Toolchain

    return dry_run_plan(*args[:2], target_key=args[2], overrides=args[3] if len(args) > 3 else None,
                        backend="trtllm", toolchain=Toolchain())


def test_the_dry_run_names_each_targets_runtime_path_and_why():
    q = _plan(QWEN_DRAFTER, QWEN_TARGET, "qwen3.8-27b")
    assert q["runtime_path"]["path"] == PROJECT and q["supported"]["trtllm_engine"] is True
    assert q["runtime_path"]["why"][0].startswith("recurrent target (48 Gated DeltaNet layers)")
    m = _plan(MUSE_DRAFTER, MUSE_TARGET, "muse-glimmer-30b")
    # its 2048-token window can bind at max_seq_len 40960, and TensorRT-LLM's plugin does not apply it in
    # speculative-decoding steps: its sliding layers take the context route, whose inputs only the project runtime
    # binds (tests/engine/test_attention_window.py)
    assert m["runtime_path"]["path"] == PROJECT and "context route" in m["runtime_path"]["why"][0]
    assert m["supported"]["trtllm_engine"] is True and m["trtllm_blockers"] == []
    assert any("paged context FMHA" in w for w in m["runtime_path"]["limits"])
    # its build config's tp 2: the project runtime runs it as one process per rank under mpirun
    assert any("mpirun -n 2 dflash2-trt run" in w for w in m["runtime_path"]["limits"])
    # on the generation path the windows make a variable-window model, and the build is refused at that length
    mg = _plan(MUSE_DRAFTER, MUSE_TARGET, "muse-glimmer-30b", {"sliding_path": "generation"})
    assert mg["runtime_path"]["path"] == PROJECT and "variable window" in mg["runtime_path"]["why"][0]
    assert "[2048, 40960]" in mg["runtime_path"]["why"][0]
    assert mg["supported"]["trtllm_engine"] is False and len(mg["trtllm_blockers"]) == 1
    assert "--max-seq-len 2018 --max-input-len 2001" in mg["trtllm_blockers"][0]
    # where it cannot bind, every window is max_seq_len: not variable-window, so the stock executor takes it
    m1 = _plan(MUSE_DRAFTER, MUSE_TARGET, "muse-glimmer-30b", {"tp_size": 1, "max_seq_len": 2018, "max_input_len": 2001})
    assert m1["supported"]["trtllm_engine"] is True and m1["trtllm_blockers"] == []
    assert m1["runtime_path"]["path"] == EXECUTOR and not m1["runtime_path"]["limits"]
    tiny = trained_pair("qwen3")
    d = _plan(tiny.drafter_dir, tiny.target_dir, "tiny", {"drafter_window": "full", "dtype": "float16"})
    assert d["runtime_path"]["path"] == EXECUTOR and d["supported"]["trtllm_engine"] is True
    from dflash2_trt.engine.plan import render_plan

    text = render_plan(q)
    assert "runtime path: project: the project runtime over TensorRT" in text and "  why: recurrent target" in text
    # the trtllm-bench line is the C++ executor's: on the project path the plan says bench run measures it instead
    assert "trtllm-bench command (the C++ executor's, which this engine's runtime path below does not take" in text
    assert "trtllm-bench command (after the build" in render_plan(d) and "does not take" not in render_plan(d)


def test_a_recurrent_engine_at_tp2_is_not_blocked_the_patched_executor_remains_an_option():
    q = _plan(QWEN_DRAFTER, QWEN_TARGET, "qwen3.8-27b", {"tp_size": 2})
    assert q["runtime_path"]["path"] == PROJECT and q["supported"]["trtllm_engine"] is True
    assert any("tp 2" in w for w in q["runtime_path"]["limits"])


def test_choose_runtime():
    pre = {"bogus": True}
    assert choose_runtime(None, pre)["path"] == EXECUTOR              # not a DFlash2 config: the executor's tools
    man = {"runtime_path": {"path": PROJECT, "description": "x", "why": ["w"], "limits": []}}
    assert choose_runtime("auto", None, man)["path"] == PROJECT
    forced = choose_runtime("executor", None, man)
    assert forced["path"] == EXECUTOR and forced["why"][0] == "asked for (--runtime executor)"
    with pytest.raises(ConfigError, match="--runtime"):
        choose_runtime("bogus", None, man)
    # an engine on the context route reads inputs the executor does not bind: asking for it is one line
    routed = {"dflash2_engine": {"sliding_path": "context"}}
    with pytest.raises(ConfigError, match="--runtime.*context route.*sliding_host_request_types"):
        choose_runtime("executor", routed, man)
    assert choose_runtime("project", routed, man)["path"] == PROJECT


# ------------------------------------------------------------------------------------------------ a TensorRT dir
@pytest.fixture(scope="module")
def trt_engine_dir(standin_trt_engine):
    """A TensorRT-LLM engine directory as `build --backend trtllm` leaves it, its rank engine being the stand-in's
    running the tiny hybrid pair's CPU engine (tests/conftest.py: standin_trt_engine)."""
    return standin_trt_engine


def test_run_md_says_which_runtime(trt_engine_dir):
    d, _ = trt_engine_dir
    text = (d / "RUN.md").read_text()
    assert "## 0. Which runtime" in text and "This engine runs on the project runtime over TensorRT" in text
    assert "recurrent target" in text and "scripts/patch_trtllm_recurrent_spec.py" in text
    assert f"dflash2-trt serve --engine-dir {d}" in text and "docs/trt-session.md §8" in text


def test_run_takes_the_project_runtime_and_gives_the_cpu_engines_tokens(trt_engine_dir):
    from dflash2_trt.engine.run import run_engine

    d, cpu_dir = trt_engine_dir
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    path = d.parent / "prompts.jsonl"
    path.write_text("".join(json.dumps({"task_id": i, "input_ids": p, "output_tokens": 10}) + "\n"
                            for i, p in enumerate(prompts)))
    seen = []    # run's bar on this path too: (done, total) after each step (a review: it reached cpu engines only)
    rep = run_engine(d, prompts_file=str(path), max_batch_size=2, trt=trt, progress=lambda *a: seen.append(a))
    assert rep["backend"] == "trtllm" and rep["runtime"] == "project" and rep["runtime_path"]["path"] == PROJECT
    assert len(seen) == rep["totals"]["steps"] and seen[-1] == (2, 2) and seen == sorted(seen)
    want = run_engine(cpu_dir, prompts_file=str(path), max_batch_size=2)
    # the pool's sizing, as the cpu engine's run reports it (no GPU here: every request at max_seq_len, both)
    assert rep["kv_pool"] == want["kv_pool"] and rep["kv_pool"]["rule"] == "every request at max_seq_len"
    assert [r["output_ids"] for r in rep["requests"]] == [r["output_ids"] for r in want["requests"]]
    assert [r["acceptance_lengths"] for r in rep["requests"]] == [r["acceptance_lengths"] for r in want["requests"]]
    # the executor path on this machine: TensorRT-LLM is not installed, said in one line
    with pytest.raises(MissingDependencyError, match="TensorRT-LLM is not importable"):
        run_engine(d, prompt_ids="5,6,7", max_new_tokens=2, runtime="executor")
    with pytest.raises(ConfigError, match="applies to TensorRT-LLM engines"):
        run_engine(cpu_dir, prompt_ids="5,6,7", max_new_tokens=2, runtime="project")


def test_bench_run_takes_the_project_runtime(trt_engine_dir, tmp_path):
    from dflash2_trt.bench.run import bench_run

    d, _ = trt_engine_dir
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"task_id": i, "input_ids": [5 + i, 6, 7], "output_tokens": 6}) + "\n"
                          for i in range(3)))
    rep = bench_run(d, ds, concurrency="2", trt=trt, progress=False)
    assert rep["backend"] == "trtllm" and rep["tool"] == "project-runtime" and rep["baseline"] is None
    assert rep["runtime_path"]["path"] == PROJECT
    run = rep["runs"][0]["speculative"]
    assert run["requests"] == 3 and run["acceptance"]["steps"] > 0
    with pytest.raises(ConfigError, match="^--tool: applies to TensorRT-LLM's executor path"):
        bench_run(d, ds, concurrency="2", trt=trt, tool="gptmanager")


def test_cuda_graphs_on_the_project_runtime(trt_engine_dir, tmp_path):
    """``run`` / ``bench run --cuda-graphs`` on a TensorRT engine of the project path: the session's graphs
    (simulated on the stand-in) keep the tokens and report their counts; the executor path and a cpu engine refuse
    the flag in one line."""
    from dflash2_trt.bench.report import render
    from dflash2_trt.bench.run import bench_run
    from dflash2_trt.engine.run import render as render_run, run_engine
    from dflash2_trt.engine.trtllm.runner import run_engine_trtllm

    d, cpu_dir = trt_engine_dir
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23]]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"task_id": i, "input_ids": p, "output_tokens": 16}) + "\n"
                            for i, p in enumerate(prompts)))
    want = run_engine(d, prompts_file=str(path), max_batch_size=3, trt=trt)
    rep = run_engine_trtllm(d, prompts_file=str(path), max_batch_size=3, trt=trt, simulate_graphs=True)
    assert [r["output_ids"] for r in rep["requests"]] == [r["output_ids"] for r in want["requests"]]
    g = rep["cuda_graphs"]
    assert g["simulated"] and g["replayed"] >= 3 and g["captured"] >= 1 and g["failed"] == [], g
    assert g["replayed"] + g["captured"] + g["eager"] == rep["totals"]["steps"] and "CUDA graphs:" in render_run(rep)
    with pytest.raises(ConfigError, match="applies to the project runtime"):
        run_engine_trtllm(d, prompt_ids="5,6,7", max_new_tokens=2, runtime="executor", trt=trt, cuda_graphs=True)
    with pytest.raises(ConfigError, match="need the session on a GPU"):        # no GPU here
        run_engine(d, prompt_ids="5,6,7", max_new_tokens=2, trt=trt, cuda_graphs=True)
    with pytest.raises(ConfigError, match="this is a cpu engine"):
        run_engine(cpu_dir, prompt_ids="5,6,7", max_new_tokens=2, cuda_graphs=True)

    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"task_id": i, "input_ids": p, "output_tokens": 12}) + "\n"
                          for i, p in enumerate(prompts)))
    eager = bench_run(d, ds, concurrency="1,3", trt=trt, progress=False, keep_outputs=True)
    graphed = bench_run(d, ds, concurrency="1,3", trt=trt, progress=False, keep_outputs=True, simulate_graphs=True)
    assert graphed["settings"]["cuda_graphs"] is True and eager["settings"]["cuda_graphs"] is False
    for a, b in zip(graphed["runs"], eager["runs"]):
        assert a["speculative"]["outputs"] == b["speculative"]["outputs"]
        g = a["speculative"]["cuda_graphs"]
        assert g["replayed"] + g["captured"] + g["eager"] == a["speculative"]["engine_steps"], g
        assert g["replayed"] >= 1, g
    assert "CUDA graphs: speculative" in render(graphed)
    with pytest.raises(ConfigError, match="applies to the project runtime"):
        bench_run(d, ds, concurrency="1", trt=trt, runtime="executor", cuda_graphs=True, progress=False)
    # without --cuda-graphs nothing of it is read: an executor-path directory without config.json still dry-runs
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "engine.json").write_text((d / "engine.json").read_text())
    rep = bench_run(bare, ds, concurrency="1", tool="gptmanager", dry_run=True, benchmark_bin="/bin/true",
                    runtime="executor", progress=False)
    assert rep["tool"] == "gptmanager"


def test_deploy_triton_takes_a_project_path_engine_to_the_python_model(trt_engine_dir, tmp_path):
    """`deploy triton` serves an engine on the project path with the python model on the project runtime (auto); the
    tensorrtllm backend, asked for, is written with a note that its executor will not run it (details:
    tests/deploy/test_triton_project_runtime.py)."""
    from dflash2_trt.deploy.triton.repository import deploy_triton

    d, _ = trt_engine_dir
    res = deploy_triton(d, tmp_path / "repo", ids_only=True)
    assert res.backend == "python" and res.runtime == PROJECT and res.notes == []
    res = deploy_triton(d, tmp_path / "repo2", ids_only=True, backend="tensorrtllm")
    assert res.backend == "tensorrtllm" and res.runtime == EXECUTOR
    assert any("the tensorrtllm backend (TensorRT-LLM's executor) will not run it" in n and "--backend python" in n
               for n in res.notes)


def test_a_prompts_line_the_project_runtime_refuses_names_its_line(trt_engine_dir):
    """prompt + new tokens fit max_seq_len (the executor's rule, checked first) but not with the K + 1 draft slots the
    project runtime reserves: the one line names the prompts file's line, not only the request's task id."""
    from dflash2_trt.engine.run import run_engine

    d, _ = trt_engine_dir
    path = d.parent / "too-long.jsonl"
    msl = json.loads((d / "engine.json").read_text())["limits"]["max_seq_len"]
    path.write_text(json.dumps({"task_id": "a", "input_ids": [5, 6], "output_tokens": 2}) + "\n"
                    + json.dumps({"task_id": "b", "input_ids": [5, 6, 7], "output_tokens": msl - 4}) + "\n")
    with pytest.raises(ConfigError) as e:
        run_engine(d, prompts_file=str(path), trt=trt)
    assert str(e.value).startswith(f"{path}:2: request b: prompt (3) + max new tokens ({msl - 4}) + draft slots"), e.value


def test_the_cli_takes_runtime(trt_engine_dir):
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    d, cpu_dir = trt_engine_dir
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(cpu_dir), "--prompt-ids", "5,6", "--runtime", "project"])
    assert r.exit_code == 1 and "--runtime: applies to TensorRT-LLM engines" in r.output, r.output
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(d), "--prompt-ids", "5,6", "--runtime", "executor"])
    assert r.exit_code == 1 and "TensorRT-LLM is not importable" in r.output, r.output
    r = CliRunner().invoke(main, ["bench", "run", "--engine-dir", str(cpu_dir), "--dataset", "x.jsonl", "--runtime",
                                  "bogus"])
    assert r.exit_code == 2 and "bogus" in r.output


def test_the_executor_paths_run_report_has_no_mean_acceptance(monkeypatch):
    """ModelRunnerCpp returns no per-step acceptance: the executor path's `run` report said mean acceptance 0.00 (a
    drafter that never helps), where the number is unknown: null, printed "-" (the session's reviewer)."""
    from dflash2_trt.engine import run as run_mod
    from dflash2_trt.engine.trtllm import runner

    monkeypatch.setattr(runner, "_runner", lambda *a, **k: (object(), {}))
    monkeypatch.setattr(runner, "_decode", lambda r, prompts, new, eos, t, s: [[7, 8] for _ in prompts])
    rep = runner.run_trtllm_engine("eng", {"eos_token_ids": [2]}, [{"task_id": 0, "input_ids": [5, 6],
                                                                    "output_tokens": None}],
                                   max_new_tokens=2, temperature=0.0, seed=0)
    assert rep["totals"]["mean_acceptance"] is None and rep["requests"][0]["mean_acceptance"] is None
    text = run_mod.render(rep)
    assert "mean acceptance - over 0 steps" in text and "0.00" not in text, text


def test_the_executor_paths_tokens_are_the_cpu_runtimes():
    """TensorRT-LLM's executor leaves the end token out of a request's output (recorded with its sources in
    deploy/triton/tensorrtllm_backend.yaml ``responses``); ``run`` and the verify gate on the executor path give the
    new tokens as the CPU runtime and the HF target's ``generate`` do, ending with the end token they stopped at."""
    import yaml
    from pathlib import Path

    import dflash2_trt.deploy.triton as triton_pkg
    from dflash2_trt.engine.trtllm.runner import executor_tokens

    facts = yaml.safe_load((Path(triton_pkg.__file__).parent / "tensorrtllm_backend.yaml").read_text())["responses"]
    eos = (2, 3)                          # end id 2; 3 goes to the executor as a stop word (runner._decode)

    def executor(out):                    # what the executor returns for a request whose tokens are `out`
        ends_at_end_id = out and out[-1] == eos[0]
        return out[:-1] if ends_at_end_id and not facts["end_token_in_output"] else out

    for out, new in [([5, 6, 2], 8), ([2], 8), ([5, 6, 7, 8], 4), ([5, 3], 8), ([5, 6, 7, 2], 4), ([9] * 8, 8)]:
        assert executor_tokens(executor(out), new, eos) == out, (out, new)
    assert executor_tokens([5, 6], 8, ()) == [5, 6]              # no end id: nothing to put back


@pytest.mark.parametrize("var", ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
def test_a_cpu_engine_started_by_an_mpi_launcher_is_refused(trt_engine_dir, monkeypatch, var):
    """A cpu engine runs every tp rank in one process: `mpirun -n 2 dflash2-trt run` on one ran the whole engine twice
    and printed two identical reports (a new user's check of README's tp line). Now each process says so in one line;
    a launch of one process is still fine."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    _, cpu_dir = trt_engine_dir
    args = ["run", "--engine-dir", str(cpu_dir), "--prompt-ids", "5,6", "--max-new-tokens", "2"]
    monkeypatch.setenv(var, "2")
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and r.stderr.strip() == (
        f"error: {cpu_dir}: a cpu engine runs in one process (its tp ranks, if any, all in it); this is one of 2 "
        f"processes an MPI launcher started: run it without mpirun (one process per rank is for TensorRT engines)"), \
        r.output
    for fine in ("1", "not a number"):   # one process, or a variable that never mattered to a cpu engine
        monkeypatch.setenv(var, fine)
        assert CliRunner().invoke(main, args).exit_code == 0
