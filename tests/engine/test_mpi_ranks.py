"""A tp 2 TensorRT engine on the project runtime under a real ``mpiexec``: one process per rank, in lockstep.

The engine directory is what ``build --backend trtllm --tp-size 2`` leaves, its rank engines the CPU stand-in of
TensorRT (each steps its own rank of the tiny pair's tp 2 CPU network; the collectives, TensorRT-LLM's AllReduce
plugins in a real engine, carried between the processes by MPI: ``trtllm/cpu/comm.ProcessWorld``). Real MPI
(MPICH from PyPI), real processes: what is checked is the project's multi-process path (engine/trtllm/ranks.py):
every rank opens its rank engine and binds it with its own pool, slots and all-reduce workspace, rank 0 drives the
runtime and broadcasts each step, the others follow, a fault or a Ctrl-C on one rank ends every process, the rank
naming itself.
The reference is the same tp 2 CPU engine stepping both ranks as threads of one process (bit-identical collectives)
and the tp 1 engine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash2_trt.engine.format import file_sha256
from dflash2_trt.testing import tensorrt_standin as trt
from dflash2_trt.testing.engines import standin_trt_engine_dir

pytest.importorskip("mpi4py", reason="mpi4py (pip install -e '.[mpi]') runs the ranks as processes")
MPIEXEC = Path(sys.executable).parent / "mpiexec"
if not MPIEXEC.exists():
    MPIEXEC = Path(shutil.which("mpiexec") or "mpiexec")
DRIVER = Path(__file__).with_name("mpi_driver.py")
REPO = Path(__file__).resolve().parents[2]
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24]]


def mpirun(n: int, *args, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {"PATH": f"{MPIEXEC.parent}:/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/tmp",
           "DFLASH2_TRT_BACKEND": "cpu", "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(MPIEXEC), "-n", str(n), sys.executable, str(DRIVER), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def hybrid(standin_trt_engine_tp2, standin_trt_engine):
    """(tp 2 TensorRT dir, its tp 2 CPU engine, the tp 1 CPU engine) of the tiny hybrid pair."""
    return (*standin_trt_engine_tp2, standin_trt_engine[1])


@pytest.fixture(scope="module")
def threaded(hybrid, tmp_path_factory):
    """The tp 2 CPU engine's report on the prompts, both ranks threads of one process: what every mpirun run must
    reproduce (computed once for the module)."""
    from dflash2_trt.engine.run import run_engine

    prompts = _prompts(tmp_path_factory.mktemp("threaded") / "p.jsonl")
    return run_engine(hybrid[1], prompts_file=str(prompts), max_batch_size=2)


def _prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"task_id": i, "input_ids": p, "output_tokens": 12}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    return path


def test_two_processes_give_the_tokens_of_the_threaded_tp2_engine(hybrid, threaded, tmp_path):
    from dflash2_trt.engine.run import run_engine

    d, cpu2, cpu1 = hybrid
    prompts, report = _prompts(tmp_path / "p.jsonl"), tmp_path / "report.json"
    done = mpirun(2, d, prompts, report)
    assert done.returncode == 0, done.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert rep["runtime"] == "project" and rep["tp_size"] == 2
    want = threaded
    assert [r["output_ids"] for r in rep["requests"]] == [r["output_ids"] for r in want["requests"]]
    assert [r["acceptance_lengths"] for r in rep["requests"]] == [r["acceptance_lengths"] for r in want["requests"]]
    tp1 = run_engine(cpu1, prompts_file=str(prompts), max_batch_size=2)
    assert [r["output_ids"] for r in rep["requests"]] == [r["output_ids"] for r in tp1["requests"]]
    assert all(len(r["output_ids"]) == 12 for r in rep["requests"])
    assert done.stdout == ""                      # rank 1 printed nothing of its own


def test_the_ranks_size_their_kv_pools_alike(hybrid, threaded, tmp_path):
    """A rank whose GPU had less memory free sizes a smaller KV pool. Rank 0's block tables index every rank's pool, so
    every rank takes the smallest block count of any rank, as TensorRT-LLM's KV cache manager does (facts
    multi_rank.kv_pool_size): the run keeps the threaded engine's tokens. Control: ranks that do not agree (rank 1 with
    3 blocks, rank 0 with its 128) are handed blocks rank 1 does not have, and the job dies."""
    d, _, _ = hybrid
    prompts = _prompts(tmp_path / "p.jsonl")
    report = tmp_path / "report.json"
    done = mpirun(2, d, prompts, report, "--blocks-on-rank", 1, 3)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [Path(f"{report}.rank{r}.blocks").read_text() for r in (0, 1)] == ["3", "3"]
    assert [r["output_ids"] for r in json.loads(report.read_text())["requests"]] == \
        [r["output_ids"] for r in threaded["requests"]]
    control = tmp_path / "control.json"
    bad = mpirun(2, d, prompts, control, "--blocks-on-rank", 1, 3, "--no-agree", timeout=120)
    sizes = [Path(f"{control}.rank{r}.blocks").read_text() for r in (0, 1)]
    assert sizes[1] == "3" and int(sizes[0]) > 3
    # rank 1 writes KV rows past its 3-block pool: a memory fault, and WHEN the process dies is not defined (a CI run
    # saw rank 0 write its report first and rank 1 die in free() after), so the control holds the job's exit status
    assert bad.returncode != 0, (bad.returncode, bad.stderr[-2000:])


def test_a_fault_on_one_rank_ends_every_process_and_the_rank_names_itself(hybrid, tmp_path):
    d, _, _ = hybrid
    prompts, report = _prompts(tmp_path / "p.jsonl"), tmp_path / "report.json"
    done = mpirun(2, d, prompts, report, "--fail-step-on-rank", 1, timeout=120)    # no process left waiting
    assert done.returncode != 0
    assert "error: tp rank 1 failed in a step: RuntimeError: injected fault in step 3 (aborting every rank)" in \
        done.stderr
    assert "Traceback" not in done.stderr and not report.exists()


def test_the_command_line_under_mpirun_prints_one_report_from_rank0(hybrid, threaded, tmp_path):
    """`mpirun -n 2 dflash2-trt run --json`: stdout is rank 0's one JSON report (rank 1 leaves through FollowerExit,
    exit 0, printing nothing), with the threaded tp 2 engine's tokens."""
    d, _, _ = hybrid
    prompts = _prompts(tmp_path / "p.jsonl")
    done = mpirun(2, d, prompts, tmp_path / "unused.json", "--cli")
    assert done.returncode == 0, done.stderr[-3000:]
    rep = json.loads(done.stdout)                          # exactly one JSON document: nothing else on stdout
    assert [r["output_ids"] for r in rep["requests"]] == [r["output_ids"] for r in threaded["requests"]]
    assert rep["tp_size"] == 2 and rep["runtime"] == "project"


@pytest.mark.parametrize("rank", [0, 1])
def test_ctrl_c_on_one_rank_ends_every_process(hybrid, tmp_path, rank):
    d, _, _ = hybrid
    prompts, report = _prompts(tmp_path / "p.jsonl"), tmp_path / "report.json"
    done = mpirun(2, d, prompts, report, "--interrupt-step-on-rank", rank, timeout=120)   # no process left waiting
    assert done.returncode == 130                      # the CLI's code for Ctrl-C, through MPI_Abort
    assert f"error: tp rank {rank} failed in a step: stopped (aborting every rank)" in done.stderr, done.stderr[-2000:]
    assert not report.exists()


def test_the_process_count_must_match_the_engines_ranks(hybrid, tmp_path):
    from dflash2_trt.engine.trtllm.ranks import launched_size, open_project_session
    from dflash2_trt.errors import ConfigError

    d, _, cpu1 = hybrid
    assert launched_size() is None                 # pytest itself is not an MPI launch
    with pytest.raises(ConfigError, match=r"a tp 2 engine runs as 2 processes, started as 1: run it mpirun -n 2"):
        open_project_session(d, trt=trt)
    prompts, report = _prompts(tmp_path / "p.jsonl"), tmp_path / "report.json"
    one = mpirun(1, d, prompts, report, timeout=120)
    assert one.returncode != 0 and "a tp 2 engine runs as 2 processes, started as 1" in one.stderr
    assert "mpirun -n 2" in one.stderr and not report.exists()
    t1 = standin_trt_engine_dir(cpu1, tmp_path / "tp1")
    three = mpirun(2, t1, prompts, report, timeout=120)
    assert three.returncode != 0 and "a tp 1 engine runs as 1 process, started as 2" in three.stderr


def test_a_rank_engine_that_does_not_open_stops_every_rank(hybrid, tmp_path):
    d0, _, _ = hybrid
    d = tmp_path / "engine"
    shutil.copytree(d0, d)
    (d / "rank1.engine").write_bytes(b"not an engine")
    man = json.loads((d / "engine.json").read_text())
    man["files"]["rank1.engine"] = {"size": 13, "sha256": file_sha256(d / "rank1.engine")}
    (d / "engine.json").write_text(json.dumps(man))
    prompts, report = _prompts(tmp_path / "p.jsonl"), tmp_path / "report.json"
    done = mpirun(2, d, prompts, report, timeout=120)
    assert done.returncode != 0 and "error: tp rank 1 could not open rank1.engine: " in done.stderr
    assert not report.exists()


def test_bench_under_mpirun_every_rank_follows_into_the_baseline(hybrid, tmp_path):
    """tp 2 under a real mpiexec (tests/engine/mpi_driver.py --bench): rank 0 closes the speculative session telling the
    others the baseline follows; all open it, step it, and leave when rank 0 closes it. The tokens of both engines are
    the HF target's own greedy decoding (transformers), and the report is rank 0's alone."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.reference.loop import load_pair, target_generate

    _, cpu2, _ = hybrid
    d = standin_trt_engine_dir(cpu2, tmp_path / "engine", baseline=True)
    ds, report = _prompts(tmp_path / "p.jsonl"), tmp_path / "report.json"
    done = mpirun(2, d, ds, report, "--bench", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == ""
    rep = json.loads(report.read_text())
    assert rep["tp_size"] == 2 and rep["baseline"]["kind"] == "target-only"
    pair = trained_pair("qwen3_5")
    target, _ = load_pair(pair.target_dir, pair.drafter_dir)
    stops = tuple(rep["settings"]["stop_token_ids"])
    want = [target_generate(target, p, 12, stop_token_ids=stops) for p in PROMPTS]
    for run in rep["runs"]:
        assert [o["output_ids"] for o in run["autoregressive"]["outputs"]] == want
        assert [o["output_ids"] for o in run["speculative"]["outputs"]] == want
        assert run["outputs_match"] is True
    assert "concurrency 2 autoregressive" in done.stderr
