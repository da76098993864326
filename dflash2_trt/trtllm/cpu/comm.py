"""Simulated tensor-parallel ranks for the CPU stand-in: one thread per rank, NCCL-like collectives.

TensorRT-LLM runs one process per GPU and its ``allreduce``/``allgather`` plugins exchange over
NCCL. Here the ranks of one engine step run as threads of one process (``World.run``); each
collective is a rendezvous of every rank in the group, combined in rank order (so results are
deterministic: the fp32 sum is ``((r0 + r1) + r2) + ...``), then handed back to every rank.
With one rank the collectives are the identity.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Callable, Sequence

import torch

from ...errors import raise_if_stop_requested

_local = threading.local()


class World:
    def __init__(self, size: int):
        if size < 1:
            raise ValueError("world size must be >= 1")
        self.size = size
        self._barrier = threading.Barrier(size)
        self._slots: list = [None] * size
        self._result = None

    # ---- per-thread context ---------------------------------------------------------------------
    @property
    def rank(self) -> int:
        r = getattr(_local, "rank", None)   # None: outside World.run (a single-rank caller)
        return 0 if r is None else r

    def _exchange(self, value, combine: Callable[[list], object]):
        if self.size == 1:
            return combine([value]).clone()
        r = self.rank
        self._slots[r] = value
        if self._barrier.wait() == 0:
            self._result = combine(list(self._slots))
        self._barrier.wait()
        # No reset afterwards: the next collective's combine runs only once every rank has reached it,
        # i.e. after every rank has read this result (a reset here raced with fast ranks' next slot).
        return self._result.clone()   # each rank owns its buffer, as with NCCL

    def allreduce(self, tensor: torch.Tensor, group: Sequence[int] | None):
        self._check_group(group)

        def combine(parts):
            acc = parts[0].float()
            for p in parts[1:]:
                acc = acc + p.float()
            return acc.to(tensor.dtype)

        return self._exchange(tensor, combine)

    def allgather(self, tensor: torch.Tensor, group: Sequence[int] | None, gather_dim: int = 0):
        self._check_group(group)
        return self._exchange(tensor, lambda parts: torch.cat(parts, dim=gather_dim))

    def _check_group(self, group) -> None:
        if group is not None and list(group) != list(range(self.size)):
            raise ValueError(f"collective group {list(group)} != all {self.size} simulated ranks")

    def run(self, fn: Callable[[int], object]) -> list:
        """Call ``fn(rank)`` on every rank (threads when size > 1); return the results by rank."""
        if self.size == 1:
            return [self._scoped(0, fn)]
        results: list = [None] * self.size
        errors: list = [None] * self.size

        def work(r):
            try:
                results[r] = self._scoped(r, fn)
            except BaseException as exc:  # re-raised on the caller's thread
                errors[r] = exc
                self._barrier.abort()

        # each rank's thread runs in a copy of the caller's context (the stand-in's device, tensor.on_device);
        # daemons, waited for in steps that look at the stop's record: a Ctrl-C whose exception Python lost can leave
        # the import lock held, and a rank's first import (safetensors.torch, the plugins) would then never return
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(work, r), name=f"tp-rank-{r}",
                                    daemon=True) for r in range(self.size)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    raise_if_stop_requested()
                    t.join(0.05)
        except BaseException:
            # a stop: ranks waiting at a collective end (BrokenBarrierError); a rank still stuck elsewhere is left to
            # the process's end (a daemon). The barrier stays broken: a world stopped so is not run again
            self._barrier.abort()
            raise
        first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
                     next((e for e in errors if e is not None), None))
        if first is not None:
            self._barrier = threading.Barrier(self.size)
            raise first
        return results

    def _scoped(self, rank: int, fn):
        prev_world, prev_rank = getattr(_local, "world", None), getattr(_local, "rank", None)
        _local.world, _local.rank = self, rank
        try:
            return fn(rank)
        finally:
            _local.world, _local.rank = prev_world, prev_rank


class ProcessWorld(World):
    """The same collectives with each rank in its own process (one rank per process, launched by ``mpirun``), for
    the CPU stand-in of a TensorRT engine's rank under the project runtime's multi-process path
    (``engine/trtllm/ranks.py``). It stands in for TensorRT-LLM's AllReduce / AllGather plugins (which exchange
    over CUDA IPC or NCCL): each collective is an MPI ``allgather`` of the ranks' tensors, combined in rank order
    exactly as :class:`World` combines them, so a tp engine gives bit for bit the tokens of its threaded run. Only
    test stand-ins use it; the real path's activations never leave TensorRT-LLM's plugins."""

    def __init__(self, comm, size: int):
        if comm.Get_size() != size:
            raise ValueError(f"{comm.Get_size()} processes for a world of {size} ranks")
        super().__init__(1)
        self.size = size
        self.comm = comm
        self.local_rank = comm.Get_rank()

    def _exchange(self, value, combine: Callable[[list], object]):
        parts = self.comm.allgather(value.cpu() if value.device.type != "cpu" else value)
        return combine([p.to(value.device) for p in parts]).clone()

    def run(self, fn: Callable[[int], object]) -> list:
        """``fn(rank)`` for this process's rank; the results by rank (``None`` for the other processes' ranks)."""
        out: list = [None] * self.size
        out[self.local_rank] = self._scoped(self.local_rank, fn)
        return out


_SINGLE = World(1)


def current() -> World:
    return getattr(_local, "world", None) or _SINGLE
