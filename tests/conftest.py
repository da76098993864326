"""Shared fixtures. Tiny checkpoints are built once per session into a temp cache dir so that
tests never depend on (or pollute) the user's cache, and nothing is downloaded."""

from __future__ import annotations

import os
import signal

import pytest

# A launcher may start the suite with Ctrl-C ignored (a background job of a non-interactive shell does: measured, its
# children print SIG_IGN for SIGINT). Children inherit an ignored signal through exec, so every test that stops a
# child with SIGINT would fail there for the launcher's reason, not the code's. Python's own handler, installed here,
# is reset to the default at each child's exec, and a Python child then installs its own Ctrl-C handler as it would
# when started from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite's own process runs engines as a `dflash2-trt` command does: torch's OpenMP workers sleep after a short
# spin (set before anything here imports torch; the children the tests start inherit it, as a command's do).
from dflash2_trt.cpu_threads import calm_openmp_waits  # noqa: E402

calm_openmp_waits()

@pytest.fixture(scope="session", autouse=True)
def _cpu_backend_by_default():
    """`--backend auto` picks cuda where torch sees a GPU: the suite is the CPU suite (the GPU tests in tests/gpu ask
    for cuda by name), so auto means cpu here unless DFLASH2_TRT_BACKEND says otherwise."""
    old = os.environ.get("DFLASH2_TRT_BACKEND")
    os.environ.setdefault("DFLASH2_TRT_BACKEND", "cpu")
    yield
    if old is None:
        os.environ.pop("DFLASH2_TRT_BACKEND", None)


@pytest.fixture(scope="session", autouse=True)
def _chunked_context_default():
    """$DFLASH2_CHUNKED_CONTEXT=0 exported in the shell that runs the suite would turn chunking off in every runtime
    it starts: the suite tests the default (the tests of the switch set it themselves)."""
    old = os.environ.pop("DFLASH2_CHUNKED_CONTEXT", None)
    yield
    if old is not None:
        os.environ["DFLASH2_CHUNKED_CONTEXT"] = old


@pytest.fixture(autouse=True)
def _torch_threads_kept():
    """A test that runs a process's start-up in this one (the Triton model's initialize, a rank's session) lowers
    torch's threads as that process would (dflash2_trt/cpu_threads.py); the count is put back after it, or every
    later test would run on one thread (seen: the suite far slower after it)."""
    import torch

    n = torch.get_num_threads()
    yield
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@pytest.fixture(scope="session", autouse=True)
def _no_shared_memory_left():
    """The suite's MPI and Triton jobs create shared-memory segments in /dev/shm; the tests that kill a job on purpose
    (an abrupt stop, a rank that never closes) leave theirs (7 MPICH segments of 2 MB and a 1 MB python-backend
    region per run, seen accumulating on a development machine). At the end of the session, the segments that
    appeared during it and that no process maps any more are removed."""
    from dflash2_trt.testing.processes import remove_orphan_segments, shm_segments

    before = shm_segments()
    yield
    remove_orphan_segments(shm_segments() - before)


@pytest.fixture(scope="session", autouse=True)
def _tiny_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash2-cache")
    old = os.environ.get("DFLASH2_TRT_CACHE")
    os.environ["DFLASH2_TRT_CACHE"] = str(root)
    yield root
    if old is None:
        os.environ.pop("DFLASH2_TRT_CACHE", None)
    else:
        os.environ["DFLASH2_TRT_CACHE"] = old


@pytest.fixture(scope="session", params=["qwen3", "qwen3_5"])
def tiny(request, _tiny_cache):
    from dflash2_trt.testing.tiny import tiny_pair

    return tiny_pair(request.param)


@pytest.fixture(scope="session")
def tiny_dense(_tiny_cache):
    from dflash2_trt.testing.tiny import tiny_pair

    return tiny_pair("qwen3")


@pytest.fixture(scope="session")
def tiny_hybrid(_tiny_cache):
    from dflash2_trt.testing.tiny import tiny_pair

    return tiny_pair("qwen3_5")



@pytest.fixture(scope="session")
def standin_trt_engine(tmp_path_factory):
    """(TensorRT-LLM engine directory, CPU engine directory): the trained tiny hybrid pair's CPU engine (block 4) and
    a TensorRT-LLM engine directory whose rank engine is the CPU stand-in of TensorRT running it (its runtime path:
    the project runtime). Built once for the engine tests and the Triton ones."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.testing.engines import EngineCache, standin_trt_engine_dir

    cpu_dir = EngineCache(trained_pair("qwen3_5"), "tiny-hybrid", tmp_path_factory, verify=False)(4)
    return standin_trt_engine_dir(cpu_dir, tmp_path_factory.mktemp("trt") / "engine"), cpu_dir


@pytest.fixture(scope="session")
def standin_trt_engine_tp2(tmp_path_factory):
    """(TensorRT-LLM engine directory, CPU engine directory) as :func:`standin_trt_engine`, at tp 2: each rank engine
    the stand-in of TensorRT running that rank of the tp 2 CPU engine (run as processes under mpiexec)."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.testing.engines import EngineCache, standin_trt_engine_dir

    cpu2 = EngineCache(trained_pair("qwen3_5"), "tiny-hybrid", tmp_path_factory, verify=False)(4, tp=2)
    return standin_trt_engine_dir(cpu2, tmp_path_factory.mktemp("trt") / "engine"), cpu2


def pytest_terminal_summary(terminalreporter):
    """The versions pip resolved, at the end of every run (`-q` included, so CI's log shows them): what the pins
    allowed today. tests/test_dependency_pins.py fails on a minor release the suite has not passed on."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("torch", "transformers", "tokenizers", "safetensors", "numpy", "nvidia-pytriton", "onnxruntime"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} (not installed)")
    terminalreporter.write_line("resolved: " + ", ".join(found))
