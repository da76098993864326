"""The pieces `serve` adds for a tp engine's ranks (deploy/triton/server.py, hygiene.py), without a tritonserver: which
MPI launcher starts them, how many processes a repository asks for, and that a cleanup walks the process groups of
the ranks it started (a tritonserver under mpiexec leads its own, with its stubs) and of nothing else."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash2_trt.deploy.triton import hygiene
from dflash2_trt.deploy.triton.server import mpi_launcher, repository_ranks
from dflash2_trt.errors import ConfigError, MissingDependencyError


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_the_launcher_beside_this_interpreter_first_then_mpirun_and_open_mpi_runs_as_root(tmp_path):
    own = Path(sys.executable).parent / "mpiexec"
    got = mpi_launcher({"PATH": "/usr/bin:/bin"})
    if own.is_file():                 # the `mpi` extra's MPICH: the launcher its mpi4py is built for, no root flag
        assert got == [str(own)]
    ompi = _exe(tmp_path / "mpirun", "#!/bin/sh\necho 'mpirun (Open MPI) 5.0.5'\n")
    assert mpi_launcher({"MPIRUN": str(ompi), "PATH": "/usr/bin:/bin"}) == [str(ompi), "--allow-run-as-root"]
    with pytest.raises(MissingDependencyError, match=r"MPIRUN='mpirun -np': not an executable"):
        mpi_launcher({"MPIRUN": "mpirun -np", "PATH": str(tmp_path)})


def test_no_launcher_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python3"))   # nothing beside it
    with pytest.raises(MissingDependencyError, match=r"one process per rank under an MPI launcher, and none was found"):
        mpi_launcher({"PATH": str(tmp_path)})


def test_how_many_processes_a_repository_asks_for(tmp_path):
    assert repository_ranks(tmp_path) == 1                                   # no record: one tritonserver
    rec = tmp_path / "dflash2_repository.json"
    rec.write_text(json.dumps({"ranks": None}))
    assert repository_ranks(tmp_path) == 1
    rec.write_text(json.dumps({"ranks": {"processes": 2}}))
    assert repository_ranks(tmp_path) == 2
    for bad in ({"processes": 1}, {"processes": True}, [2]):
        rec.write_text(json.dumps({"ranks": bad}))
        with pytest.raises(ConfigError, match=r"dflash2_repository.json: ranks: must hold processes >= 2"):
            repository_ranks(tmp_path)
    rec.write_text("{not json")
    with pytest.raises(ConfigError, match=r"dflash2_repository.json: not a readable repository record"):
        repository_ranks(tmp_path)


LEADER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])   # in the leader's group
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(60)
"""


def _leader(tmp_path, name: str, work: Path) -> tuple[subprocess.Popen, int]:
    """A session leader whose argv[0] is ``name``, naming ``work``, with a child in its group (a rank and its stub)."""
    link = tmp_path / name
    link.symlink_to(sys.executable)
    script = tmp_path / f"{name}.py"
    script.write_text(LEADER)
    pidfile = tmp_path / f"{name}.child"
    p = subprocess.Popen([str(link), str(script), str(pidfile), str(work)], start_new_session=True)
    deadline = time.time() + 30
    while not (pidfile.is_file() and pidfile.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    return p, int(pidfile.read_text())


def test_a_cleanup_walks_the_groups_of_the_ranks_it_started_only(tmp_path):
    work = tmp_path / "dflash2-serve-test"
    work.mkdir()
    rank, stub = _leader(tmp_path, "tritonserver", work)
    other, bystander = _leader(tmp_path, "less", work)      # a user's job that merely names the directory
    try:
        killed = hygiene.kill_named(work)
        assert rank.pid in killed and stub in killed        # the rank and the group it leads
        assert other.pid in killed and bystander not in killed   # a process naming it, but not its group
        assert rank.wait(10) == -signal.SIGKILL and other.wait(10) == -signal.SIGKILL
        assert hygiene.start_time(stub) is None
        assert hygiene.start_time(bystander) is not None
    finally:
        for pid in (stub, bystander):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in (rank, other):
            p.kill()
            p.wait(10)
