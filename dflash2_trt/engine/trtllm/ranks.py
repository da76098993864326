"""A tensor-parallel TensorRT engine on the project runtime: one process per rank under ``mpirun``, in lockstep.

TensorRT-LLM's Python runtime runs a tp engine as one process per rank (``mpirun -n TP``, mpi4py's ``COMM_WORLD``),
rank r binding ``rank{r}.engine`` on ``cuda:(r % GPUs)`` with TensorRT-LLM's custom all-reduce workspace; the
AllReduce plugins inside the engine carry the activations between the GPUs (facts ``multi_rank``). This module does
the same for the project runtime (docs/trt-session.md §4):

- every process opens its own :class:`~.session.TrtEngineSession` (its rank engine, its KV pool and state slots
  holding its heads, the workspace), the ranks size their KV pools alike (the smallest block count of any rank, as
  TensorRT-LLM's KV cache manager does: rank 0's block tables index every rank's pool) and agree that all of them
  opened before any step;
- the bookkeeping (the project :class:`~dflash2_trt.runtime.Runtime`) runs on rank 0 only, over a
  :class:`RankedSession`: each ``step`` / ``reset_slot`` is broadcast to the other ranks (``comm.bcast`` of the
  step's CPU tensors: a few KB), every rank executes it, and an ``allgather`` of the accepted tokens ends the step on
  every rank together: ranks that disagree are an error on rank 0 (the CPU engine checks the same between its
  simulated ranks);
- a rank that fails or is stopped (opening its engine, in a step, Ctrl-C / SIGTERM) cannot tell whether the others
  are already waiting inside the engine's collectives for it, so it writes one line naming itself and aborts the
  whole job (``MPI_Abort``, as TensorRT-LLM's MPI workers do; 130 / 143 for a stop): no process is left waiting;
- the other ranks run :func:`follow` until rank 0 closes the session, then leave quietly
  (:class:`FollowerExit`, exit status 0): rank 0 alone reports, prints and writes files.

MPI carries only the runtime's feed and this status; nothing of the engine's own data. Outside an MPI launch a
tp 1 engine opens as before; a tp engine says how to start it.
"""

from __future__ import annotations

import os
import sys
import time

from ...cpu_threads import share_cpus
from ...errors import Terminated

from ...errors import ConfigError, MissingDependencyError
from ..format import load_engine_dir
from ..launch import launched_size
from .session import open_trt_session


class FollowerExit(SystemExit):
    """Raised on ranks > 0 once rank 0 has closed the session: the process's work is done and rank 0 reported it
    (exit status 0, nothing printed)."""

    def __init__(self):
        super().__init__(0)


def world_comm():
    """mpi4py's ``COMM_WORLD`` when this process was started by an MPI launcher (TensorRT-LLM's ``mpi_comm``), else
    None. A launcher without mpi4py is one line."""
    if launched_size() is None:
        return None
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise MissingDependencyError(f"started by an MPI launcher, but mpi4py is not importable ({exc}): pip install "
                                     f"mpi4py (with the MPI library mpirun belongs to)") from None
    return MPI.COMM_WORLD


def _abort(comm, what: str, exc: BaseException):
    """One line naming the rank and what failed, then ``MPI_Abort``: every process of the job ends, with 143 / 130
    for SIGTERM / Ctrl-C (the CLI's own codes), else 1."""
    code = 143 if isinstance(exc, Terminated) else 130 if isinstance(exc, KeyboardInterrupt) else 1
    text = "stopped" if code != 1 else f"{type(exc).__name__}: {exc}"
    print(f"error: tp rank {comm.Get_rank()} {what}: {text} (aborting every rank)", file=sys.stderr, flush=True)
    # the launcher relays a rank's stderr through its proxy, which MPI_Abort ends: give it a moment to pass the line
    # on (under load it was lost: the job ended with the right status and no message)
    try:
        time.sleep(0.3)
    except BaseException:   # a second stop signal in the pause: abort all the same
        pass
    comm.Abort(code)
    os._exit(code)   # MPICH's MPI_Abort can return before the launcher's kill arrives: never run on


def _guard(comm, what: str, fn, *args, **kw):
    """``fn(*args, **kw)``, or the job aborted naming this rank (module docstring): an exception or a stop signal
    inside a collective operation can leave the other ranks waiting in it."""
    try:
        return fn(*args, **kw)
    except FollowerExit:
        raise
    except BaseException as exc:
        _abort(comm, what, exc)
        raise   # not reached: Abort does not return


def _digest(out) -> bytes | None:
    """The accepted tokens of a step's outputs, as bytes (what every rank must agree on)."""
    if not out:
        return None
    parts = [out[k].cpu().contiguous().numpy().tobytes() for k in ("num_accepted_tokens", "accepted_tokens")
             if k in out]
    return b"".join(parts)


def _settle(digests: list) -> None:
    """Raise on rank 0 if the ranks disagree on the accepted tokens of a step."""
    for r, digest in enumerate(digests[1:], start=1):
        if digest != digests[0]:
            raise RuntimeError(f"tp rank {r} disagrees with rank 0 on the accepted tokens of a step")


class RankedSession:
    """Rank 0's view of a tp engine: the interface the project runtime drives (every attribute of rank 0's
    :class:`~.session.TrtEngineSession`), each call executed by every rank (module docstring)."""

    def __init__(self, session, comm):
        self.session = session
        self.comm = comm
        self._closed = False

    def __getattr__(self, name):
        return getattr(self.session, name)

    def step(self, inputs: dict) -> dict:
        def one():
            self.comm.bcast(("step", inputs), root=0)
            out = self.session.step(inputs)
            return out, self.comm.allgather(_digest(out))

        out, digests = _guard(self.comm, "failed in a step", one)
        _settle(digests)        # every rank finished the step: a disagreement is an ordinary error on rank 0
        return out

    def reset_slot(self, slot: int) -> None:
        def one():
            self.comm.bcast(("reset_slot", int(slot)), root=0)
            self.session.reset_slot(slot)

        _guard(self.comm, f"failed in reset_slot({slot})", one)

    def close(self, then: str | None = None) -> None:
        """Close the session on every rank. ``then``: the session rank 0 opens next (:data:`NEXT_SESSIONS`: the
        engine directory's baseline), which the other ranks then open and follow too; None: they leave."""
        if then not in NEXT_SESSIONS:
            raise ValueError(f"then={then!r}: expected one of {NEXT_SESSIONS}")
        if not self._closed:
            self._closed = True
            self.comm.bcast(("close", then), root=0)
            self.session.close()


NEXT_SESSIONS = (None, "baseline")
"""What a closing rank 0 may open next (:meth:`RankedSession.close`): nothing, or the engine directory's baseline
engine (``bench run``: the speculative engine's runs, then the baseline's, one engine on the GPUs at a time)."""


def close_session(session, then: str | None = None) -> None:
    """Close a session from :func:`open_project_session`; on rank 0 of a tp engine, telling the other ranks which
    session follows (``then``, :meth:`RankedSession.close`). A tp 1 session just closes."""
    if isinstance(session, RankedSession):
        session.close(then=then)
    else:
        session.close()


def follow(session, comm):
    """Ranks > 0: execute what rank 0 broadcasts, in the same order, until it closes the session; returns what rank 0
    opens next (:data:`NEXT_SESSIONS`). Anything that escapes (an error, a stop signal while waiting) aborts the
    job."""
    def loop():
        while True:
            op, arg = comm.bcast(None, root=0)
            if op == "close":
                if arg not in NEXT_SESSIONS:
                    raise RuntimeError(f"rank 0 closed the session to open {arg!r}, which this rank cannot open")
                return arg
            if op == "step":
                comm.allgather(_digest(_guard(comm, "failed in a step", session.step, arg)))
            elif op == "reset_slot":
                _guard(comm, f"failed in reset_slot({arg})", session.reset_slot, arg)
            else:
                raise RuntimeError(f"unknown operation {op!r} from rank 0")

    try:
        return _guard(comm, "failed following rank 0", loop)
    finally:
        session.close()


_NODE_RANKS: dict = {}


def _node_ranks(comm) -> tuple[int, int]:
    """(this process's rank among the ranks on its node, their number): each takes a GPU of its own, as TensorRT-LLM's
    runtime does (rank % gpus_per_node). Found once per process: the split is collective, and only rank 0 comes back
    here for a second session (the other ranks are still inside their first call), so a second split would wait
    forever."""
    if "node" not in _NODE_RANKS:
        from mpi4py import MPI

        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        _NODE_RANKS["node"] = (local.Get_rank(), local.Get_size())
        local.Free()
    return _NODE_RANKS["node"]


def open_project_session(engine_dir, *, trt=None, verify: bool = False, baseline: bool = False, **kw):
    """(session, manifest) for the project runtime on any TensorRT engine directory (``baseline``: its baseline
    engine, :func:`~.session.open_trt_session`). A tp 1 engine in one process: its
    :class:`~.session.TrtEngineSession`. A tp engine under ``mpirun -n TP``: on rank 0 a :class:`RankedSession`, on
    the other ranks the follower loop, then :class:`FollowerExit`. Every other combination is one line.

    Rank 0 may open a second session after closing one with :func:`close_session` ``(then="baseline")``: the other
    ranks, still inside their first call, open it with the same arguments and follow it too."""
    cfg, _ = load_engine_dir(engine_dir, verify=False)
    tp = int(cfg["pretrained_config"]["mapping"]["tp_size"])
    comm = world_comm()
    size = 1 if comm is None else comm.Get_size()
    if tp == 1 and size == 1:
        return open_trt_session(engine_dir, trt=trt, verify=verify, baseline=baseline, **kw)
    if size != tp:
        how = (f"mpirun -n {tp} dflash2-trt ... (one process per rank, as TensorRT-LLM runs a tp engine)" if tp > 1
               else "without mpirun (one process)")
        raise ConfigError(f"a tp {tp} engine runs as {tp} process{'es' if tp > 1 else ''}, started as {size}: run it "
                          f"{how}", source=engine_dir, field="pretrained_config.mapping.tp_size")
    from mpi4py import MPI   # world_comm imported it: this is an MPI launch

    rank = comm.Get_rank()
    local_rank, local_size = _node_ranks(comm)
    # the ranks on this node share its CPUs (a CPU engine's steps run on them): each takes its share of torch's
    # threads (torchrun gives its workers one each for the same reason; dflash2_trt/cpu_threads.py)
    share_cpus(local_size)

    def open_rank(base: bool):
        # opening may itself be collective (TensorRT-LLM's workspace exchanges IPC handles over MPI)
        # ... and sizing the KV pool is: every rank takes the smallest block count of any rank (rank 0's block
        # tables index every rank's pool), as TensorRT-LLM's KV cache manager does (facts multi_rank.kv_pool_size)
        sess, man = _guard(comm, f"could not open {'baseline/' if base else ''}rank{rank}.engine", open_trt_session,
                           engine_dir, trt=trt, verify=verify, rank=rank, launched=True, local_rank=local_rank,
                           gpus_per_node=local_size, baseline=base,
                           agree_blocks=lambda n: comm.allreduce(int(n), op=MPI.MIN), **kw)
        _guard(comm, "failed waiting for the other ranks to open theirs", comm.Barrier)
        return sess, man

    sess, man = open_rank(baseline)
    if rank == 0:
        return RankedSession(sess, comm), man
    while True:
        nxt = follow(sess, comm)       # closes the session: nothing of it stays on the device
        sess = None
        if nxt is None:
            raise FollowerExit()
        sess, _ = open_rank(nxt == "baseline")


__all__ = ["FollowerExit", "NEXT_SESSIONS", "RankedSession", "close_session", "follow", "launched_size", "open_project_session", "world_comm"]
