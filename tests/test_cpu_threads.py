"""dflash2_trt/cpu_threads.py: a process sharing the machine's CPUs with others of its job lowers torch's threads to
its share, never raises them, and leaves OMP_NUM_THREADS's choice alone."""

from __future__ import annotations

import pytest
import torch

from dflash2_trt import cpu_threads


@pytest.fixture
def threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("cpus,processes,reserve,start,expect,now", [
    (16, 2, 0, 16, 8, 8),       # two ranks on a node: half each
    (2, 2, 0, 2, 1, 1),         # this machine's tp 2 jobs
    (2, 1, 1, 2, 1, 1),         # the Triton stub leaves tritonserver a CPU
    (1, 1, 1, 1, None, 1),      # never below 1 (already there: nothing changes)
    (16, 2, 0, 4, None, 4),     # torch already below the share: never raised
    (3, 8, 0, 3, 1, 1),         # more processes than CPUs: 1 each
])
def test_share(threads, monkeypatch, cpus, processes, reserve, start, expect, now):
    monkeypatch.setattr(cpu_threads, "available_cpus", lambda: cpus)
    monkeypatch.setattr(cpu_threads.os, "cpu_count", lambda: cpus)      # the whole machine is this process's
    torch.set_num_threads(start)
    assert cpu_threads.share_cpus(processes, reserve=reserve) == expect
    assert torch.get_num_threads() == now


def test_cpus_a_launcher_pinned_are_not_divided_again(threads, monkeypatch):
    """Open MPI binds each of 2 ranks to a core by default (srun --cpu-bind, likewise): a rank's mask is its share."""
    monkeypatch.setattr(cpu_threads, "available_cpus", lambda: 8)
    monkeypatch.setattr(cpu_threads.os, "cpu_count", lambda: 64)
    torch.set_num_threads(8)
    assert cpu_threads.share_cpus(8) is None and torch.get_num_threads() == 8
    assert cpu_threads.share_cpus(8, reserve=1) == 7


def test_omp_num_threads_is_the_users_choice(threads, monkeypatch):
    monkeypatch.setattr(cpu_threads, "available_cpus", lambda: 16)
    monkeypatch.setenv("OMP_NUM_THREADS", "12")
    torch.set_num_threads(12)
    assert cpu_threads.share_cpus(4) is None and torch.get_num_threads() == 12


def test_available_cpus_is_the_affinity_mask():
    import os

    assert cpu_threads.available_cpus() == len(os.sched_getaffinity(0))


def test_openmp_waits_are_calmed_before_torch_loads(monkeypatch):
    """GOMP_SPINCOUNT is set only where torch is not yet imported (libgomp reads it when it loads) and the user set
    neither it nor OMP_WAIT_POLICY."""
    import sys

    for v in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(v, raising=False)
    assert cpu_threads.calm_openmp_waits() is None and "GOMP_SPINCOUNT" not in cpu_threads.os.environ   # torch is in
    monkeypatch.delitem(sys.modules, "torch")
    assert cpu_threads.calm_openmp_waits() == cpu_threads.OPENMP_SPINCOUNT == cpu_threads.os.environ["GOMP_SPINCOUNT"]
    for var, value in (("GOMP_SPINCOUNT", "5"), ("OMP_WAIT_POLICY", "ACTIVE")):
        monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
        monkeypatch.setenv(var, value)
        assert cpu_threads.calm_openmp_waits() is None and cpu_threads.os.environ.get(var) == value
        monkeypatch.delenv(var)


def test_the_command_sets_it_before_anything_imports_torch(tmp_path):
    """A fresh `dflash2-trt` process sets it before torch is imported (so torch's libgomp starts with it, and so do the
    processes the command starts: they inherit the environment)."""
    import subprocess
    import sys

    code = ("import os, sys\n"
            "from dflash2_trt import cpu_threads\n"
            "seen = []\n"
            "real = cpu_threads.calm_openmp_waits\n"
            "cpu_threads.calm_openmp_waits = lambda: seen.append(('torch' in sys.modules, real())) or seen[-1][1]\n"
            "from dflash2_trt.cli import main\n"
            "try:\n"
            "    main(['targets', '--json'], standalone_mode=False)\n"
            "finally:\n"
            "    print(seen, os.environ.get('GOMP_SPINCOUNT'), file=sys.stderr)\n")
    env = {k: v for k, v in cpu_threads.os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    n = cpu_threads.OPENMP_SPINCOUNT
    assert r.stderr.strip().splitlines()[-1] == f"[(False, '{n}')] {n}"
