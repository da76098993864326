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
