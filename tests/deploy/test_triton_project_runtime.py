"""Triton on the project runtime for TensorRT engines (docs/trt-session.md §8).

`deploy triton` writes the python-backend tensorrt_llm model for a TensorRT-LLM engine whose runtime path is the
project runtime (the engines TensorRT-LLM's executor refuses), and `serve` serves it: the model opens the engine with
open_trt_session instead of the CPU engine and runs the same ServingLoop. Here the engine directory's rank engine is
the CPU stand-in of TensorRT running the tiny hybrid pair's CPU engine (tests/conftest.py: standin_trt_engine), so
every served token must be that CPU engine's. The python-backend stub is another process: the stand-in is selected
by the test hook DFLASH2_TRT_TENSORRT_STANDIN=1 (serving.tensorrt_standin_hook), whose refusals are tested too."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash2_trt.deploy.triton import repository as rp
from dflash2_trt.deploy.triton import serving
from dflash2_trt.errors import ConfigError, MissingDependencyError

from deploy_helpers import Serve, cli, free_base_port, one_error_line, procs_with

NEW = 12


@pytest.fixture(scope="module")
def trt_dir(standin_trt_engine):
    return standin_trt_engine[0]


def _with_manifest(src, dst, **changes):
    """A copy of engine directory ``src`` whose engine.json has ``changes``."""
    from dflash2_trt.testing.corrupt import copy_with_json

    return copy_with_json(src, dst, "engine.json", **changes)


# ------------------------------------------------------------------------------------------------ deploy decisions
def test_auto_writes_the_python_model_on_the_project_runtime(trt_dir, tmp_path):
    out = tmp_path / "repo"
    code, text = cli("deploy", "triton", "--engine-dir", str(trt_dir), "--output", str(out), "--ids-only",
                      "--decoupled")
    assert code == 0 and "note:" not in text, text
    assert "python backend, decoupled" in text and "runtime: project" in text, text
    cfg = rp.check_repository(out)["tensorrt_llm"]
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert cfg.backend == "python" and params["gpt_model_path"] == str(trt_dir.resolve())
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.9"     # the build's (engine.json limits), else 0.9
    assert (out / "tensorrt_llm" / "1" / "model.py").read_text() == (rp.MODELS / "tensorrt_llm_python.py").read_text()
    assert not (out / "launch.sh").exists()
    rec = json.loads((out / "dflash2_repository.json").read_text())
    assert (rec["backend"], rec["runtime"], rec["engine_backend"], rec["engine_runtime_path"]) == \
        ("python", "project", "trtllm", "project")
    assert "TensorRT" in rec["runtime_description"]
    # the KV fraction applies to this model (the session's KV pool on the GPU)
    rp.deploy_triton(trt_dir, tmp_path / "r2", ids_only=True, kv_cache_free_gpu_mem_fraction=0.5)
    cfg = rp.check_repository(tmp_path / "r2")["tensorrt_llm"]
    assert cfg.parameters["kv_cache_free_gpu_mem_fraction"].string_value == "0.5"


def test_the_tensorrtllm_backend_stays_with_a_note_for_a_project_path_engine(trt_dir, tmp_path):
    code, text = cli("deploy", "triton", "--engine-dir", str(trt_dir), "--output", str(tmp_path / "repo"),
                      "--ids-only", "--backend", "tensorrtllm")
    assert code == 0 and "tensorrtllm backend" in text, text
    note = next(ln for ln in text.splitlines() if ln.startswith("note:"))
    assert "the tensorrtllm backend (TensorRT-LLM's executor) will not run it on stock TensorRT-LLM 1.2" in note
    assert "`--backend python` (the default for it) serves it on the project runtime" in note
    assert "not built yet" not in note
    rec = json.loads((tmp_path / "repo" / "dflash2_repository.json").read_text())
    assert rec["runtime"] == "executor" and rec["engine_runtime_path"] == "project"


def test_an_executor_path_engine_takes_the_python_model_when_asked(trt_dir, tmp_path):
    d = _with_manifest(trt_dir, tmp_path / "engine", runtime_path={"path": "executor", "why": ["w"], "limits": [],
                                                                   "description": "x"})
    assert rp.deploy_triton(d, tmp_path / "auto", ids_only=True).backend == "tensorrtllm"
    res = rp.deploy_triton(d, tmp_path / "py", ids_only=True, backend="python")
    assert res.backend == "python" and res.runtime == "project" and res.notes == []


def test_a_tp2_project_engine(standin_trt_engine_tp2, trt_dir, tmp_path):
    """A tp 2 engine on the project runtime: auto writes the python model and a launch.sh that starts the ranks under
    mpirun (tritonserver as rank 0, the followers), recorded in dflash2_repository.json; --backend tensorrtllm writes
    the executor's repository with a note saying so. Refused in one line, nothing written: engine.json and config.json
    disagreeing on tp, a rank engine missing, --cuda-graphs."""
    d2, _ = standin_trt_engine_tp2
    res = rp.deploy_triton(d2, tmp_path / "auto", ids_only=True)
    assert res.backend == "python" and res.runtime == "project"
    rec = json.loads((tmp_path / "auto" / "dflash2_repository.json").read_text())
    assert rec["tp_size"] == 2 and rec["launch"] == "launch.sh" and rec["ranks"]["processes"] == 2
    launch = (tmp_path / "auto" / "launch.sh").read_text()
    assert "TP=2\n" in launch and "-m dflash2_trt.deploy.triton.follower --repository" in launch
    assert subprocess.run(["bash", "-n", str(tmp_path / "auto" / "launch.sh")]).returncode == 0
    # rank 0 as TensorRT-LLM's launcher starts each rank's tritonserver (facts triton_leader_mode, from its source)
    import yaml

    from dflash2_trt.engine.trtllm import session as sess_mod

    leader = yaml.safe_load((Path(sess_mod.__file__).parent / "facts" / "tensorrt_session.yaml").read_text())[
        "triton_leader_mode"]
    for part in leader["every_rank"].format(i=0).split():
        assert f'"{part}"' in launch or f" {part} " in launch, part
    res = rp.deploy_triton(d2, tmp_path / "trtllm", ids_only=True, backend="tensorrtllm")
    assert res.backend == "tensorrtllm"
    assert any("`--backend python` (the default for it) serves it on the project runtime (docs/trt-session.md §8; "
               "tp 2: its launch.sh runs it as 2 processes under mpirun)" in n for n in res.notes), res.notes
    lied = _with_manifest(trt_dir, tmp_path / "lied", tp_size=2)      # engine.json tp 2, config.json and ranks tp 1
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(lied), "--output", str(tmp_path / "x"),
                               "--ids-only"))
    assert "config.json: pretrained_config.mapping.tp_size: --backend python: engine.json says tp 2, config.json's" \
        in line, line
    gone = tmp_path / "gone"
    shutil.copytree(d2, gone)
    (gone / "rank1.engine").unlink()
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(gone), "--output", str(tmp_path / "y"),
                               "--ids-only"))
    assert "--backend python: no rank1.engine (the TensorRT engine rank 1 of the tp 2 engine opens)" in line, line
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(d2), "--output", str(tmp_path / "z"),
                               "--ids-only", "--cuda-graphs"))
    assert "error: --cuda-graphs: CUDA graphs serve tp 1 engines; this one is tp 2" in line, line
    assert not any((tmp_path / n).exists() for n in ("x", "y", "z"))


@pytest.mark.parametrize("args,edit,line", [
    (["--plugin-lib", "{lib}"], None,
     "error: --plugin-lib applies to the tensorrtllm backend only (launch.sh's LD_PRELOAD); the python backend loads "
     "TensorRT-LLM's plugin library and the engine directory's own libdflash2_plugins.so itself"),
    (["--kv-cache-free-gpu-mem-fraction", "0"], None, "error: --kv-cache-free-gpu-mem-fraction: must be in (0, 1)"),
    ([], "no-rank0", "rank0.engine (the TensorRT engine the project runtime opens)"),
    ([], "bad-limits", "config.json: --backend python: the project runtime cannot read the engine's limits"),
])
def test_options_and_engines_the_python_model_refuses(trt_dir, tmp_path, args, edit, line):
    """One line naming the option or the file, nothing written."""
    d = trt_dir
    if edit is not None:
        d = tmp_path / "engine"
        shutil.copytree(trt_dir, d)
        if edit == "no-rank0":
            (d / "rank0.engine").unlink()
        else:
            cfg = json.loads((d / "config.json").read_text())
            del cfg["build_config"]["max_num_tokens"]
            (d / "config.json").write_text(json.dumps(cfg))
    lib = tmp_path / "libdflash2_plugins.so"
    lib.write_bytes(b"")
    out = tmp_path / "repo"
    got = one_error_line(*cli("deploy", "triton", "--engine-dir", str(d), "--output", str(out), "--ids-only",
                     *[a.format(lib=lib) for a in args]))
    assert got.startswith(line) if line.startswith("error:") else line in got, got
    assert not out.exists()


def test_cpu_engines_keep_refusing_the_gpu_options(standin_trt_engine, tmp_path):
    cpu_dir = standin_trt_engine[1]
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(cpu_dir), "--output", str(tmp_path / "r"),
                      "--ids-only", "--kv-cache-free-gpu-mem-fraction", "0.5"))
    assert line.startswith("error: --kv-cache-free-gpu-mem-fraction applies to GPU engines (TensorRT-LLM and cuda) "
                           "only; a cpu engine's KV pool"), line
    # serve's option of the same name goes to the repository it writes: refused the same way, before tritonserver
    line = one_error_line(*cli("serve", "--engine-dir", str(cpu_dir), "--kv-cache-free-gpu-mem-fraction", "0.5"))
    assert line.startswith("error: --kv-cache-free-gpu-mem-fraction applies to GPU engines"), line
    line = one_error_line(*cli("serve", "--repository", str(tmp_path), "--kv-cache-free-gpu-mem-fraction", "0.5"))
    assert line.startswith("error: --kv-cache-free-gpu-mem-fraction: applies to --engine-dir only"), line
    rec = json.loads((rp.deploy_triton(cpu_dir, tmp_path / "ok", ids_only=True).output
                      / "dflash2_repository.json").read_text())
    assert (rec["backend"], rec["runtime"], rec["engine_backend"], rec["engine_runtime_path"]) == \
        ("python", "project", "cpu", None)


def test_serve_hands_its_kv_fraction_to_the_repository_it_writes(trt_dir, monkeypatch):
    """serve --engine-dir --kv-cache-free-gpu-mem-fraction F writes its repository with F (deploy triton's option),
    as trtllm-serve takes --kv_cache_free_gpu_memory_fraction; stopped here at the repository, before tritonserver."""
    from dflash2_trt.deploy.triton import repository, server

    seen = {}

    def deploy(engine_dir, output, **kw):
        seen.update(kw)
        raise ConfigError("stop here")

    monkeypatch.setattr(repository, "deploy_triton", deploy)
    with pytest.raises(ConfigError, match="stop here"):
        server.serve(engine_dir=trt_dir, kv_cache_free_gpu_mem_fraction=0.5, port=server.free_port())
    assert seen["kv_cache_free_gpu_mem_fraction"] == 0.5


# ------------------------------------------------------------------------------------------------ the test hook
def test_open_engine_and_the_standin_hook(trt_dir, standin_trt_engine, tmp_path, monkeypatch):
    monkeypatch.delenv(serving.STANDIN_ENV, raising=False)
    # without the hook the model wants TensorRT + TensorRT-LLM's plugins (absent here): never the stand-in quietly
    with pytest.raises(MissingDependencyError, match="tensorrt"):
        serving.open_engine(trt_dir)
    monkeypatch.setenv(serving.STANDIN_ENV, "yes")
    with pytest.raises(ConfigError, match=f"{serving.STANDIN_ENV}: 'yes': a test hook that takes 1 only"):
        serving.open_engine(trt_dir)
    monkeypatch.setenv(serving.STANDIN_ENV, "1")
    real = tmp_path / "real"
    shutil.copytree(trt_dir, real)
    (real / "rank0.engine").write_bytes(b"serialized TensorRT plan")
    with pytest.raises(ConfigError, match="rank0.engine: DFLASH2_TRT_TENSORRT_STANDIN=1 .* is a real TensorRT engine"):
        serving.open_engine(real)
    eng, man, what = serving.open_engine(trt_dir, kv_cache_fraction=0.5)
    try:
        assert type(eng).__name__ == "TrtEngineSession" and man["backend"] == "trtllm" and eng.K == 3
        assert "CPU STAND-IN of TensorRT's execution API" in what and "NOT TensorRT" in what
    finally:
        eng.close()
    # a CPU engine ignores the hook, and has no KV fraction to take
    eng, man, what = serving.open_engine(standin_trt_engine[1])
    eng.close()
    assert man["backend"] == "cpu" and "over the cpu engine" in what
    with pytest.raises(ConfigError, match="kv_cache_free_gpu_mem_fraction: applies to GPU engines .* this is a cpu"):
        serving.open_engine(standin_trt_engine[1], kv_cache_fraction=0.5)


# ------------------------------------------------------------------------------------------------ a real tritonserver
@pytest.mark.triton
def test_serve_a_project_path_engine_on_the_standin(standin_trt_engine, tmp_path):
    """`serve --engine-dir` on the TensorRT engine directory (python model on the project runtime, decoupled), a real
    tritonserver: concurrent streaming requests and a non-streaming one give exactly the CPU engine's tokens (and
    its acceptance); the log says the stand-in ran, not TensorRT; Ctrl-C leaves nothing running."""
    pytest.importorskip("pytriton")
    grpc = pytest.importorskip("tritonclient.grpc")
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.deploy.triton.load import LoadRequest, run_load
    from dflash2_trt.engine.run import run_engine
    from dflash2_trt.testing.engines import shipped_prompts

    trt_dir, cpu_dir = standin_trt_engine
    prompts = shipped_prompts(trained_pair("qwen3_5"), 8)
    pf = tmp_path / "prompts.jsonl"
    pf.write_text("".join(json.dumps({"task_id": i, "input_ids": p, "output_tokens": NEW}) + "\n"
                          for i, p in enumerate(prompts)))
    want = run_engine(cpu_dir, prompts_file=str(pf), max_batch_size=4)["requests"]
    port, log = free_base_port(), tmp_path / "tritonserver.log"
    s = Serve("--engine-dir", str(trt_dir), "--ids-only", "--port", str(port), "--log", str(log),
              env={serving.STANDIN_ENV: "1"})
    try:
        assert s.wait_for("serving", 180), s.lines
        url = f"127.0.0.1:{port + 1}"
        reqs = [LoadRequest(p, NEW, w["output_ids"]) for p, w in zip(prompts, want)]
        rep = run_load(url, reqs, 4, K=3, timeout=120)   # raises unless every token is the CPU engine's
        assert rep["requests"] == len(prompts) and rep["responses_per_request"] > 1
        assert rep["total_accepted_draft_tokens"] == sum(a - 1 for w in want for a in w["acceptance_lengths"])
        one = _one_response(grpc, url, prompts[0])      # decoupled, not streaming: one final response
        assert one == want[0]["output_ids"]
        text = log.read_text(errors="replace")
        assert "runs on the project runtime over the CPU STAND-IN of TensorRT's execution API" in text
        assert "NOT TensorRT: test hook DFLASH2_TRT_TENSORRT_STANDIN=1" in text
        assert re.search(r"tensorrt_llm: KV pool of \d+ blocks \(every request at max_seq_len\)", text), text[-2000:]
        s.p.send_signal(signal.SIGINT)
        assert s.finish() == 0, s.lines
        assert "stopped" in s.lines[-1], s.lines
        deadline = time.time() + 10
        while procs_with(f"--http-port {port}") and time.time() < deadline:
            time.sleep(0.1)
        assert not procs_with(f"--http-port {port}"), "tritonserver (or a stub) left running"
        # a later `serve --log` with the same file takes this real tritonserver log as its own (another file: refused)
        from dflash2_trt.deploy.triton.server import check_log_path

        check_log_path(log)
    finally:
        s.kill()


def _needs_ranks_and_triton():
    pytest.importorskip("pytriton")
    pytest.importorskip("tritonclient.grpc")
    pytest.importorskip("mpi4py", reason="mpi4py + MPICH (pip install -e '.[mpi]') run the ranks as processes")


def _tp2_reference(cpu2, tmp_path, n: int):
    """(n shipped prompts of the hybrid pair, the tp 2 CPU engine's requests for them: both ranks threads of one
    process), the tokens every served request must give."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.run import run_engine
    from dflash2_trt.testing.engines import shipped_prompts

    prompts = shipped_prompts(trained_pair("qwen3_5"), n)
    pf = tmp_path / "prompts.jsonl"
    pf.write_text("".join(json.dumps({"task_id": i, "input_ids": p, "output_tokens": NEW}) + "\n"
                          for i, p in enumerate(prompts)))
    return prompts, run_engine(cpu2, prompts_file=str(pf), max_batch_size=4)["requests"]


def _load(port: int, prompts, want, concurrency: int) -> dict:
    """Streaming requests at gRPC port+1; raises unless every token is the expected one."""
    from dflash2_trt.deploy.triton.load import LoadRequest, run_load

    return run_load(f"127.0.0.1:{port + 1}", [LoadRequest(q, NEW, w["output_ids"]) for q, w in zip(prompts, want)],
                    concurrency, K=3, timeout=180)


def _not_mpiexec(pids) -> list[int]:
    return [q for q in pids if "mpiexec" not in Path(f"/proc/{q}/cmdline").read_bytes().decode(errors="replace")]


def _until_gone(needle: str) -> list[int]:
    """Processes whose command line names ``needle`` still there after up to 10 s."""
    deadline = time.time() + 10
    while procs_with(needle) and time.time() < deadline:
        time.sleep(0.1)
    return procs_with(needle)


@contextlib.contextmanager
def _job(argv, env, log, repo):
    """``argv`` (an MPI launch) in a session of its own with its output in ``log``; on the way out whatever still
    names ``repo`` and the launcher's group are killed."""
    with open(log, "wb") as fh:
        p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield p
    finally:
        for q in procs_with(str(repo)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(q, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


def _wait_ready(p, port: int, log) -> None:
    import urllib.request

    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(log.read_text(errors="replace")[-3000:])


def _bundled(tmp_path):
    """(the bundled tritonserver install, a backend directory for it, its environment with the stand-in hook)."""
    from dflash2_trt.deploy.triton.server import assemble_backends, find_tritonserver, server_env

    inst = find_tritonserver()
    assemble_backends(inst, tmp_path / "backends")
    return inst, tmp_path / "backends", {**server_env(inst), serving.STANDIN_ENV: "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.triton
def test_serve_a_tp2_engine_as_ranks_under_mpiexec(standin_trt_engine_tp2, tmp_path):
    """`serve --engine-dir` on a tp 2 TensorRT engine directory: `mpiexec -n 1 tritonserver ... : -n 1 python -m
    dflash2_trt.deploy.triton.follower` (real MPICH, a real tritonserver; each rank engine the stand-in running that rank
    of the tp 2 CPU engine, the collectives between the processes by MPI). Concurrent streaming requests give exactly
    the tp 2 CPU engine's tokens (both ranks threads of one process) and acceptance; the model says rank 0 drives and
    rank 1 follows; Ctrl-C stops it with exit 0, the follower leaving with the server, nothing left running."""
    _needs_ranks_and_triton()
    trt_dir, cpu2 = standin_trt_engine_tp2
    prompts, want = _tp2_reference(cpu2, tmp_path, 6)
    port, log = free_base_port(), tmp_path / "tritonserver.log"
    s = Serve("--engine-dir", str(trt_dir), "--ids-only", "--port", str(port), "--log", str(log),
              env={serving.STANDIN_ENV: "1", "OMP_NUM_THREADS": "1"})
    try:
        assert s.wait_for("serving", 240), s.lines
        assert "tp 2: tritonserver rank 0 + 1 follower(s) under MPI" in s.lines[-1], s.lines
        followers = _not_mpiexec(procs_with("dflash2_trt.deploy.triton.follower"))
        assert len(followers) == 1
        rep = _load(port, prompts, want, 3)              # raises unless every token is the tp 2 CPU engine's
        assert rep["requests"] == len(prompts)
        assert rep["total_accepted_draft_tokens"] == sum(a - 1 for w in want for a in w["acceptance_lengths"])
        text = log.read_text(errors="replace")
        assert "tp 2: rank 0 in this process, ranks 1-1 following it under MPI" in text, text[-3000:]
        s.p.send_signal(signal.SIGINT)
        assert s.finish(90) == 0, s.lines
        assert "stopped" in s.lines[-1], s.lines
        assert not _until_gone(f"--http-port {port}"), "tritonserver (or a stub) left running"
        assert not [p for p in followers if p in _until_gone("follower")], "the follower rank left running"
        end = log.read_text(errors="replace")   # the follower left when rank 0 closed: no abort, no stop grace
        assert "aborting" not in end and "did not close the engine" not in end and "BAD TERMINATION" not in end, end[-3000:]
    finally:
        s.kill()


def _tp2_repository(standin_trt_engine_tp2, tmp_path):
    """The decoupled repository `deploy triton` writes for the tp 2 engine, two prompts with the tp 2 CPU engine's
    tokens, and the bundled tritonserver: (repo, prompts, want, install, backend directory, environment)."""
    _needs_ranks_and_triton()
    trt_dir, cpu2 = standin_trt_engine_tp2
    repo = tmp_path / "repo"
    rp.deploy_triton(trt_dir, repo, ids_only=True, decoupled=True)
    prompts, want = _tp2_reference(cpu2, tmp_path, 2)
    return (repo, prompts, want, *_bundled(tmp_path))


@pytest.mark.triton
def test_the_repositorys_launch_sh_starts_the_ranks(standin_trt_engine_tp2, tmp_path):
    """The launch.sh `deploy triton` writes for a tp 2 engine, run as a user runs it (MPIRUN, TRITONSERVER, PYTHON and
    the ports from the environment; the bundled tritonserver's backend directory as an extra argument): mpiexec
    starts tritonserver as rank 0 and the follower as rank 1, a request gets the tp 2 CPU engine's tokens, and a
    SIGTERM to it (mpiexec: launch.sh execs it) ends every process with exit 0."""
    repo, prompts, want, inst, backends, env = _tp2_repository(standin_trt_engine_tp2, tmp_path)
    port = free_base_port()
    env.update(MPIRUN=str(Path(sys.executable).parent / "mpiexec"), TRITONSERVER=str(inst.binary),
               PYTHON=sys.executable, HTTP_PORT=str(port), GRPC_PORT=str(port + 1), METRICS_PORT=str(port + 2))
    log = tmp_path / "launch.log"
    with _job([str(repo / "launch.sh"), "--backend-directory", str(backends), "--http-address", "127.0.0.1",
               "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1"], env, log, repo) as p:
        _wait_ready(p, port, log)
        assert len([q for q in _not_mpiexec(procs_with(str(repo)))
                    if "follower" in Path(f"/proc/{q}/cmdline").read_text(errors="replace")]) == 1
        assert _load(port, prompts, want, 2)["requests"] == len(prompts)
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0, log.read_text(errors="replace")[-3000:]
        assert not _until_gone(str(repo)), "a rank (or a stub) left running"


@pytest.mark.triton
def test_a_tritonserver_on_rank1_follows_rank0(standin_trt_engine_tp2, tmp_path):
    """TensorRT-LLM's own launcher starts a tritonserver on every rank (ranks > 0 loading tensorrt_llm only). Under it
    the python model on rank 1 follows rank 0 inside its model load, so rank 0 serves the tp 2 engine's tokens. Its
    stop is abrupt (rank 1's tritonserver, still loading, exits on the launcher's SIGTERM, and the launcher then kills
    rank 0 without a drain: why the repository's launch.sh runs followers instead); what is checked is that it ends,
    every process with it."""
    repo, prompts, want, inst, backends, env = _tp2_repository(standin_trt_engine_tp2, tmp_path)
    port, other = free_base_port(), free_base_port()

    def server(i, ports, *extra):
        return [str(inst.binary), "--model-repository", str(repo), "--backend-directory", str(backends),
                "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
                "--http-port", str(ports), "--grpc-port", str(ports + 1), "--metrics-port", str(ports + 2),
                "--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name=dflash2test{i}_",
                *extra]

    log = tmp_path / "ranks.log"
    with _job([str(Path(sys.executable).parent / "mpiexec"), "-n", "1", *server(0, port), ":", "-n", "1",
               *server(1, other, "--model-control-mode=explicit", "--load-model=tensorrt_llm")], env, log, repo) as p:
        _wait_ready(p, port, log)
        _load(port, prompts, want, 2)                    # raises unless every token is the tp 2 CPU engine's
        p.send_signal(signal.SIGTERM)
        p.wait(90)
        assert not _until_gone(str(repo)), "a rank (or a stub) left running"


RANK0_THAT_NEVER_CLOSES = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
from dflash2_trt.engine.trtllm.ranks import open_project_session
from dflash2_trt.testing import tensorrt_standin as trt
session, _ = open_project_session(sys.argv[1], trt=trt)
Path(sys.argv[2]).write_text("open")
time.sleep(120)
"""


def test_a_follower_whose_rank0_never_closes_ends_the_job_after_its_grace(standin_trt_engine_tp2, tmp_path):
    """A stop signal reaches every rank (mpiexec relays it); a follower leaves it to rank 0 (the server drains and
    closes the engine), but not forever: rank 0 here ignores the signal and never closes, so the follower, blocked
    inside MPI, is woken by its wakeup fd, waits --stop-grace seconds, names itself in one line and ends the job."""
    pytest.importorskip("mpi4py", reason="mpi4py + MPICH (pip install -e '.[mpi]') run the ranks as processes")

    trt_dir, _ = standin_trt_engine_tp2
    repo = tmp_path / "repo"
    rp.deploy_triton(trt_dir, repo, ids_only=True)
    script, opened = tmp_path / "rank0.py", tmp_path / "opened"
    script.write_text(RANK0_THAT_NEVER_CLOSES)
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {"PATH": f"{mpiexec.parent}:/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "HOME": "/tmp", "OMP_NUM_THREADS": "1", serving.STANDIN_ENV: "1"}
    p = subprocess.Popen([str(mpiexec), "-n", "1", sys.executable, str(script), str(trt_dir), str(opened), ":", "-n", "1",
                          sys.executable, "-m", "dflash2_trt.deploy.triton.follower", "--repository", str(repo),
                          "--stop-grace", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        deadline = time.time() + 120
        while not opened.exists() and time.time() < deadline and p.poll() is None:
            time.sleep(0.1)
        assert opened.exists(), p.communicate(timeout=30)
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)      # a follower that never woke would keep the job for the 120 s
        assert p.returncode != 0
        assert "error: tp rank 1 (Triton follower): stopped, and rank 0 did not close the engine within 1 s (ending " \
               "the job)" in err, err[-2000:]
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_follower_refuses_what_it_cannot_follow(trt_dir, tmp_path, monkeypatch):
    """Outside an MPI launch, as rank 0, or on a repository that is not the python model's: one line, exit 2."""
    from dflash2_trt.deploy.triton import follower

    repo = tmp_path / "repo"
    rp.deploy_triton(trt_dir, repo, ids_only=True)
    assert follower.repository_engine(repo) == (trt_dir.resolve(), 0.9)
    for key in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert follower.main(["--repository", str(repo)]) == 2
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "0")
    assert follower.main(["--repository", str(repo)]) == 2
    monkeypatch.setenv("PMI_RANK", "1")
    exe = rp.deploy_triton(trt_dir, tmp_path / "exe", ids_only=True, backend="tensorrtllm")
    with pytest.raises(ConfigError, match=r"tensorrt_llm/config.pbtxt: backend: backend 'tensorrtllm': the followers "
                                          r"serve the python-backend model's tp engine only"):
        follower.repository_engine(exe.output)
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    assert follower.main(["--repository", str(tmp_path / "none")]) == 2     # refused after the stop grace was armed
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before   # disarmed: handlers back
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    assert fd == -1                                                          # ... and no wakeup fd left behind
    assert follower.main(["--repository", str(repo), "--stop-grace", "0"]) == 2


def _one_response(grpc, url, prompt):
    import queue

    import numpy as np

    from dflash2_trt.sampling import GREEDY_REQUEST_TEMPERATURE

    def t(name, arr, dt):
        x = grpc.InferInput(name, list(arr.shape), dt)
        x.set_data_from_numpy(arr)
        return x

    c = grpc.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        c.async_stream_infer("tensorrt_llm", [
            t("input_ids", np.array([prompt], dtype=np.int32), "INT32"),
            t("input_lengths", np.array([[len(prompt)]], dtype=np.int32), "INT32"),
            t("request_output_len", np.array([[NEW]], dtype=np.int32), "INT32"),
            t("temperature", np.array([[GREEDY_REQUEST_TEMPERATURE]], dtype=np.float32), "FP32")],
            request_id="one", enable_empty_final_response=True)
        result, error = q.get(timeout=120)
        assert error is None, error
        assert result.get_response().parameters["triton_final_response"].bool_param
        n = int(result.as_numpy("sequence_length").reshape(-1)[0])
        return result.as_numpy("output_ids").reshape(-1)[:n].tolist()
    finally:
        c.stop_stream()
        c.close()


# ------------------------------------------------------------------------------------------------ CUDA graphs
def test_cuda_graphs_in_the_python_model(trt_dir, standin_trt_engine, tmp_path, monkeypatch):
    """`deploy triton --cuda-graphs` writes the model's cuda_graph_mode (the tensorrtllm backend's name for it); the
    model passes it to open_engine, which gives the TensorRT session its graphs (engine/trtllm/session_graphs.py).
    Served through the ServingLoop with the graphs simulated on the stand-in, the tokens are the eager session's.
    Refused in one line where it cannot apply: a cpu engine, the tensorrtllm backend, a CPU machine without the
    simulation, `serve --repository`."""
    from dflash2_trt.deploy.triton.serving import ServingLoop, parse_request
    from dflash2_trt.testing.serving import CollectingSink
    from dflash2_trt.sampling import GREEDY_REQUEST_TEMPERATURE

    import numpy as np

    out = tmp_path / "repo"
    code, text = cli("deploy", "triton", "--engine-dir", str(trt_dir), "--output", str(out), "--ids-only",
                      "--cuda-graphs")
    assert code == 0, text
    params = {k: v.string_value for k, v in rp.check_repository(out)["tensorrt_llm"].parameters.items()}
    assert params["cuda_graph_mode"] == "true"
    rp.deploy_triton(trt_dir, tmp_path / "plain", ids_only=True)
    assert "cuda_graph_mode" not in rp.check_repository(tmp_path / "plain")["tensorrt_llm"].parameters
    cpu_dir = standin_trt_engine[1]
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(cpu_dir), "--output", str(tmp_path / "c"),
                               "--ids-only", "--cuda-graphs"))
    assert "--cuda-graphs" in line and "this is a cpu engine" in line, line
    line = one_error_line(*cli("deploy", "triton", "--engine-dir", str(trt_dir), "--output", str(tmp_path / "t"),
                               "--ids-only", "--backend", "tensorrtllm", "--cuda-graphs"))
    assert "applies to the python-backend model" in line, line
    line = one_error_line(*cli("serve", "--repository", str(out), "--cuda-graphs"))
    assert "--cuda-graphs" in line and "applies to --engine-dir only" in line, line
    port = free_base_port()
    line = one_error_line(*cli("serve", "--engine-dir", str(cpu_dir), "--ids-only", "--cuda-graphs", "--port",
                               str(port)))
    assert "--cuda-graphs" in line and "this is a cpu engine" in line, line
    # a cuda engine's repository (its manifest: the model's parameters do not depend on the engine files) at tp 1,
    # and its refusal at tp 2
    cuda_dir = _with_manifest(cpu_dir, tmp_path / "cuda1", backend="cuda")
    rp.deploy_triton(cuda_dir, tmp_path / "cr", ids_only=True, cuda_graphs=True)
    assert rp.check_repository(tmp_path / "cr")["tensorrt_llm"].parameters["cuda_graph_mode"].string_value == "true"
    cuda2 = _with_manifest(cpu_dir, tmp_path / "cuda2", backend="cuda", tp_size=2)
    with pytest.raises(ConfigError, match="serve tp 1 engines; this one is tp 2"):
        rp.deploy_triton(cuda2, tmp_path / "cr2", ids_only=True, cuda_graphs=True)

    with pytest.raises(ConfigError, match="this is a cpu engine"):
        serving.open_engine(cpu_dir, cuda_graphs=True)
    from dflash2_trt.engine.standin.graphs import GraphedSteps

    engine, _, desc = serving.open_engine(cpu_dir, simulate_graphs=True)   # a stand-in engine: the graphed runner
    assert isinstance(engine, GraphedSteps) and "CUDA graphs" in desc
    engine.close()
    monkeypatch.setenv(serving.STANDIN_ENV, "1")
    with pytest.raises(ConfigError, match="need the session on a GPU"):
        serving.open_engine(trt_dir, cuda_graphs=True)
    prompts = [[5, 6, 7, 8, 9], [12, 13, 14], [20, 21, 22, 23], [30, 31]]
    results = {}
    for graphs in (False, True):
        engine, man, desc = serving.open_engine(trt_dir, simulate_graphs=graphs)
        assert ("CUDA graphs" in desc) == graphs
        loop = ServingLoop(engine, max_batch_size=4)
        sinks = []
        try:
            for p in prompts:
                spec = parse_request({"input_ids": np.array([p], dtype=np.int32),
                                      "input_lengths": np.array([[len(p)]], dtype=np.int32),
                                      "request_output_len": np.array([[NEW]], dtype=np.int32),
                                      "temperature": np.array([[GREEDY_REQUEST_TEMPERATURE]], dtype=np.float32)},
                                     vocab_size=engine.vocab_size, eos_token_ids=())
                sinks.append(CollectingSink())
                loop.submit(spec, sinks[-1])
            for s in sinks:
                assert s.done.wait(120)
        finally:
            loop.close()
        results[graphs] = [s.ids for s in sinks]
        if graphs:
            st = engine.graphs.report()
            assert st["replayed"] >= 3 and st["failed"] == [], st
        engine.close()
    assert results[True] == results[False] and all(len(t) == NEW for t in results[False])


def _python_model_module(monkeypatch):
    """The python-backend model's module, loaded outside a stub (``triton_python_backend_utils`` a stand-in of the
    two names it uses): (pb_utils, module)."""
    import importlib.util
    import types

    pb = types.ModuleType("triton_python_backend_utils")
    pb.TritonModelException = type("TritonModelException", (Exception,), {})
    pb.using_decoupled_model_transaction_policy = lambda cfg: False
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    spec = importlib.util.spec_from_file_location("df2_tensorrt_llm_under_test", rp.MODELS / "tensorrt_llm_python.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return pb, mod


def _init_model(mod, engine_dir, **params):
    """The model initialized on ``engine_dir`` with the config.pbtxt ``params`` given (None: left out)."""
    given = {"gpt_model_path": {"string_value": str(engine_dir)}}
    given.update({k: {"string_value": v} for k, v in params.items() if v is not None})
    m = mod.TritonPythonModel()
    m.initialize({"model_config": json.dumps({"parameters": given, "max_batch_size": 4})})
    return m


def test_the_model_reads_enable_chunked_context(trt_dir, standin_trt_engine, tmp_path, monkeypatch):
    """`deploy triton` writes the python model's enable_chunked_context "true" (the tensorrtllm backend's parameter
    name; the project runtime takes a prompt over max_num_tokens in chunks); the model hands it to its runtime, and
    "false" turns chunking off; anything else is the parameter's own error."""
    rp.deploy_triton(trt_dir, tmp_path / "repo", ids_only=True)
    params = rp.check_repository(tmp_path / "repo")["tensorrt_llm"].parameters
    assert params["enable_chunked_context"].string_value == "true"
    monkeypatch.setenv("DFLASH2_CHUNKED_CONTEXT", "0")          # the switch, written where serve and deploy read it
    rp.deploy_triton(trt_dir, tmp_path / "off", ids_only=True)
    assert rp.check_repository(tmp_path / "off")["tensorrt_llm"].parameters["enable_chunked_context"].string_value \
        == "false"
    monkeypatch.delenv("DFLASH2_CHUNKED_CONTEXT")
    cpu_dir = standin_trt_engine[1]
    pb, mod = _python_model_module(monkeypatch)

    def init(value):
        return _init_model(mod, cpu_dir, enable_chunked_context=value)

    for value, on in (("true", True), (None, True), ("false", False), ("False", False)):
        m = init(value)
        try:
            assert m.loop.runtime.chunked_context is on
        finally:
            m.finalize()
    with pytest.raises(pb.TritonModelException, match="parameter enable_chunked_context 'yes' is not true or false"):
        init("yes")


def test_the_model_reads_cuda_graph_mode(standin_trt_engine, monkeypatch):
    """The python-backend model passes its cuda_graph_mode parameter to open_engine: "true" on a cpu engine is the
    engine's refusal, "false" opens it plainly, anything else is the parameter's own error; and at unload it logs
    what the graphs did (here: a cpu engine's runner simulated through open_engine)."""
    cpu_dir = standin_trt_engine[1]
    pb, mod = _python_model_module(monkeypatch)

    def init(mode):
        return _init_model(mod, cpu_dir, cuda_graph_mode=mode)

    with pytest.raises(pb.TritonModelException, match="cannot open the engine: .*this is a cpu engine"):
        init("true")
    with pytest.raises(pb.TritonModelException, match="cuda_graph_mode 'maybe' is not true or false"):
        init("maybe")
    logged = []
    monkeypatch.setattr(mod, "_log", logged.append)
    for mode in ("false", None):
        m = init(mode)
        assert not hasattr(m.engine, "report") and serving.graph_report(m.engine) is None
        m.finalize()
    real = serving.open_engine
    monkeypatch.setattr(mod, "open_engine", lambda d, **kw: real(d, kv_cache_fraction=kw.get("kv_cache_fraction"),
                                                                  simulate_graphs=kw["cuda_graphs"]))
    m = init("true")
    m.finalize()
    assert any("CUDA graphs: 0 steps replayed, 0 captured, 0 eager" in ln for ln in logged), logged

    # the stub shares the CPUs with tritonserver's request threads: torch gets all but one (dflash2_trt/cpu_threads.py)
    import torch

    from dflash2_trt import cpu_threads

    monkeypatch.setattr(mod, "open_engine", real)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads, "available_cpus", lambda: 4)
    monkeypatch.setattr(cpu_threads.os, "cpu_count", lambda: 4)
    torch.set_num_threads(4)       # the suite puts the count back after the test (tests/conftest.py)
    logged.clear()
    init("false").finalize()
    assert torch.get_num_threads() == 3
    assert "tensorrt_llm: torch uses 3 CPU threads, one CPU left to tritonserver (OMP_NUM_THREADS overrides)" in logged


    # a max_batch_size edited into config.pbtxt past the engine's: named as that file's field (it was reported as
    # the runtime's "--max-batch-size", an option the user never gave)
    def init_batch(n):
        m = mod.TritonPythonModel()
        m.initialize({"model_config": json.dumps({"parameters": {"gpt_model_path": {"string_value": str(cpu_dir)}},
                                                  "max_batch_size": n})})
        return m

    with pytest.raises(pb.TritonModelException, match=r"^config.pbtxt max_batch_size 1000: must be in \[1, \d+\] "
                                                      r"\(the engine's max_batch_size\); write the repository again"):
        init_batch(1000)


def test_the_model_reads_target_only(standin_trt_engine, monkeypatch):
    """target_only "true" opens the target alone (K 0) with decoding_mode auto and no eagle_choices; a bad value, a
    draft tree or another decoding mode beside it is the parameter's own error, said before the engine loads."""
    cpu_dir = standin_trt_engine[1]
    pb, mod = _python_model_module(monkeypatch)
    opened = []
    real = serving.open_engine
    monkeypatch.setattr(mod, "open_engine", lambda d, **kw: opened.append(kw) or real(d, **kw))
    m = _init_model(mod, cpu_dir, target_only="true", decoding_mode="auto")
    try:
        assert m.engine.K == 0 and type(m.engine).__name__ == "TargetOnlyEngine"
    finally:
        m.finalize()
    opened.clear()
    for params, why in (({"target_only": "yes"}, "parameter target_only 'yes' is not true or false"),
                        ({"target_only": "true", "eagle_choices": "{0}"}, "eagle_choices: the target alone"),
                        ({"target_only": "true", "decoding_mode": "eagle"}, "decoding_mode 'eagle': the target alone"),
                        ({"decoding_mode": "auto"}, "decoding_mode 'auto': this engine runs eagle decoding only")):
        with pytest.raises(pb.TritonModelException, match=why):
            _init_model(mod, cpu_dir, **params)
    assert opened == []   # each refused before the engine was opened
