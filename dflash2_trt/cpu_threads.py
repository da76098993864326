"""torch's CPU threads for a process that shares its machine's CPUs with others of the same job.

torch starts as many intra-op threads as there are CPUs. Two processes that each do that on the same CPUs (the ranks
of a tp engine under ``mpirun``; the Triton python-backend stub beside tritonserver's own request threads)
oversubscribe them: OpenMP workers spin while waiting, so each process's steps slow the other's down. torchrun sets
``OMP_NUM_THREADS=1`` for its workers where several share a node for the same reason. :func:`share_cpus` gives this
process its share of the CPUs instead (a launcher that pinned the process to CPUs of its own has given it its share
already), and only ever lowers torch's count; ``OMP_NUM_THREADS``, where set, is the user's choice and is left alone.

Measured on a 2-CPU machine: the CPU engine of the trained tiny pair served by tritonserver, one request at a time,
251 ms a request with the stub at torch's 2 threads, 178 ms at 1 (the suite's 600-request load test 73.5 s -> 55.2 s).
The ranks' share is not measured: the suite's rank tests set ``OMP_NUM_THREADS=1`` themselves.
"""

from __future__ import annotations

import os
import sys

# how many times an idle OpenMP worker spins before it sleeps (libgomp: 300,000 by default; 100, or 1000 under
# OMP_WAIT_POLICY=ACTIVE, where it knows its threads outnumber the CPUs): see calm_openmp_waits
OPENMP_SPINCOUNT = "1000"


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def share_cpus(processes: int, *, reserve: int = 0) -> int | None:
    """Lower torch's intra-op threads to this process's share: (available CPUs − ``reserve``) // ``processes``, at
    least 1, where ``processes`` share this process's CPUs (an affinity mask narrower than the machine is a launcher's
    pinning, e.g. Open MPI's or ``srun --cpu-bind``: those CPUs are this process's alone, so they are not divided
    again). Returns the new count, or None where nothing changed (``OMP_NUM_THREADS`` set, or torch already at or below
    the share)."""
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return None
    import torch

    cpus = available_cpus()
    if cpus < (os.cpu_count() or cpus):
        processes = 1
    share = max(1, (cpus - max(0, reserve)) // max(1, processes))
    if share >= torch.get_num_threads():
        return None
    torch.set_num_threads(share)
    return share


def check_threads(threads, *, field: str = "--threads", why: str = "more threads than cores slow torch's many small "
                  "ops down") -> int | None:
    """``threads`` as given for torch's intra-op threads (None: torch's own count), refused with a
    :class:`~dflash2_trt.errors.ConfigError` naming ``field`` unless it is an integer from 1 to the CPUs this process
    may use (an audit: ``--threads 1000`` on 2 cores ran for over 10 minutes; 64 cut the tokens/s to a third)."""
    from .errors import ConfigError

    if threads is None:
        return None
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ConfigError(f"must be an integer >= 1, got {threads!r}", field=field)
    if threads > available_cpus():
        raise ConfigError(f"must be at most the {available_cpus()} CPU cores this process may use, got {threads} "
                          f"({why})", field=field)
    return threads


def calm_openmp_waits() -> str | None:
    """Make torch's OpenMP workers (libgomp, which the CPU wheels use) sleep after a short spin instead of a long one,
    by setting ``GOMP_SPINCOUNT`` before torch is first imported (libgomp reads it once, when it loads), unless the user
    set ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``. Between torch's many small ops of an engine step each worker spins
    up to 300,000 times, holding a core: where anything else wants that core (another job, a second engine process,
    tritonserver) the steps slow down by up to an order of magnitude. Measured on a 2-CPU machine with `run` of the tiny
    engine (the loop's wall time; 2026-12-07):

    - 64 new tokens alone: 0.37-0.42 s at the default, 0.40-0.47 s at 1000, 0.47 s at 100, 0.52-0.55 s at 0, 0.35-0.43 s
      with one thread; beside two busy shell loops: 1.5-2.0 s, 0.74-0.91 s, 0.85-1.01 s, 0.92-1.12 s, 0.51-0.74 s;
    - 256 new tokens, two runs at once: 13.7-67.3 s each at the default, 3.6-4.0 s at 1000 (alone: 2.63 / 2.87 s).

    Returns the value set, or None where nothing was set (torch already imported, or the user's variables)."""
    if "torch" in sys.modules or any(os.environ.get(v, "").strip() for v in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")):
        return None
    os.environ["GOMP_SPINCOUNT"] = OPENMP_SPINCOUNT
    return OPENMP_SPINCOUNT
