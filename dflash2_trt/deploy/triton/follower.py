"""The ranks > 0 of a tp TensorRT engine served by Triton on the project runtime (docs/trt-session.md §8).

TensorRT-LLM serves a tp engine with one process per rank under ``mpirun`` (its
``triton_backend/scripts/launch_triton_server.py``: one ``tritonserver`` per rank, ranks > 0 loading only
``tensorrt_llm``, each with its own python-backend shared-memory prefix), and its python model's non-leader ranks do
no serving: they block in model load until the leader is done (facts ``triton_leader_mode`` in
``engine/trtllm/facts/tensorrt_session.yaml``). The project's python model does the same with one difference:
rank 0 is ``tritonserver`` (its python-backend stub opens rank 0's engine through :func:`~dflash2_trt.engine.trtllm
.ranks.open_project_session` and drives the runtime), and ranks > 0 are this module, not tritonservers that would
serve nothing: each opens its rank engine with the same KV settings and follows rank 0's steps until rank 0 closes
the session when the server unloads the model, then exits 0::

    mpirun -n 1 tritonserver --model-repository REPO ... : -n TP-1 python -m dflash2_trt.deploy.triton.follower \\
        --repository REPO

(``deploy triton`` writes this as the repository's ``launch.sh``; ``serve`` starts it itself.)

Stopping is rank 0's: ``mpirun`` relays a SIGTERM / Ctrl-C to every rank; tritonserver drains and unloads the model,
whose ``finalize`` closes the session, which releases the followers. So a follower does not act on the signal: it
waits up to ``--stop-grace`` seconds for rank 0 to close (a follower blocked inside MPI cannot run Python, so the
wait is a thread woken through ``signal.set_wakeup_fd``), then writes one line naming itself and ends the job. A
rank that fails aborts the job naming itself, as every rank of the project runtime does (``ranks.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ...errors import ConfigError, DFlash2Error


def repository_engine(repository: Path) -> tuple[Path, float | None]:
    """(engine directory, KV-cache fraction) the repository's python-backend ``tensorrt_llm`` model opens: its
    ``gpt_model_path`` and ``kv_cache_free_gpu_mem_fraction`` parameters, read as the model reads them."""
    from .repository import parse_config

    path = repository / "tensorrt_llm" / "config.pbtxt"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read it ({exc.strerror or exc})", source=path) from None
    cfg = parse_config(text, source=path)
    if cfg.backend != "python":
        raise ConfigError(f"backend {cfg.backend!r}: the followers serve the python-backend model's tp engine only (the "
                          f"tensorrtllm backend's ranks are tritonservers: its launch.sh)", source=path,
                          field="backend")
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    engine = params.get("gpt_model_path")
    if not engine:
        raise ConfigError("not set", source=path, field="parameters.gpt_model_path")
    fraction = params.get("kv_cache_free_gpu_mem_fraction") or None
    try:
        fraction = None if fraction is None else float(fraction)
    except ValueError:
        raise ConfigError(f"{fraction!r} is not a number", source=path,
                          field="parameters.kv_cache_free_gpu_mem_fraction") from None
    return Path(engine), fraction


def _env_rank() -> str | None:
    """This process's rank as the MPI launcher put it in the environment (Open MPI, MPICH / Intel MPI's hydra, PMIx),
    the variables ``ranks.launched_size`` reads the world size from."""
    for key in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(key):
            return os.environ[key]
    return None


class StopGrace:
    """On SIGTERM / SIGINT: give rank 0 ``grace`` seconds to close the session (the follower loop then returns and the
    process exits 0), else one line naming this rank and the job ends (exit 143). Armed first thing (a stop while the
    follower starts is the same stop); :meth:`disarm` puts the previous handlers back."""

    def __init__(self, grace: float):
        self.grace = grace
        self.closed = threading.Event()      # rank 0 closed the session (or disarmed): the watcher stands down
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._old_fd = signal.set_wakeup_fd(self._w)   # written by the C-level handler even while the main thread
        self._old = {sig: signal.signal(sig, lambda signum, frame: None)   # waits inside MPI
                     for sig in (signal.SIGTERM, signal.SIGINT)}
        threading.Thread(target=self._watch, name="stop-grace", daemon=True).start()

    def _watch(self):
        try:
            if not os.read(self._r, 1):        # disarmed: the write end closed
                return
        except OSError:
            return
        if self.closed.wait(self.grace):
            return                             # rank 0 closed: the process is on its way out with 0
        rank = _env_rank() or "?"
        print(f"error: tp rank {rank} (Triton follower): stopped, and rank 0 did not close the engine within "
              f"{self.grace:g} s (ending the job)", file=sys.stderr, flush=True)
        time.sleep(0.3)   # the launcher's proxy relays the line; ending at once lost it under load (ranks._abort)
        os._exit(143)

    def disarm(self) -> None:
        self.closed.set()                      # a watcher already counting down stands down too
        signal.set_wakeup_fd(self._old_fd)
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        os.close(self._w)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash2_trt.deploy.triton.follower", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repository", required=True, help="the model repository rank 0's tritonserver serves")
    p.add_argument("--stop-grace", type=float, default=60.0,
                   help="seconds a stopped follower waits for rank 0 to close the engine (default 60)")
    p.add_argument("--work", help=argparse.SUPPRESS)   # `serve`'s working directory: names this process for cleanup
    args = p.parse_args(argv)
    if not args.stop_grace > 0:
        print(f"error: --stop-grace: must be > 0, got {args.stop_grace}", file=sys.stderr, flush=True)
        return 2
    stop = StopGrace(args.stop_grace)
    try:
        from ...engine.trtllm.ranks import FollowerExit, launched_size, open_project_session
        from .serving import tensorrt_standin_hook

        size = launched_size()
        rank = _env_rank()
        if size is None or size < 2 or rank in (None, "0"):
            raise ConfigError("runs as ranks 1.. of `mpirun -n 1 tritonserver ... : -n TP-1 python -m "
                              "dflash2_trt.deploy.triton.follower --repository REPO` (rank 0 is tritonserver: the "
                              "repository's launch.sh)", field="rank")
        engine_dir, fraction = repository_engine(Path(args.repository))
        kw = {} if fraction is None else {"kv_cache_fraction": fraction}
        open_project_session(engine_dir, trt=tensorrt_standin_hook(engine_dir), **kw)
    except FollowerExit:
        stop.closed.set()       # MPI_Finalize at exit may still wait for the others: not a missed close
        return 0
    except DFlash2Error as exc:
        stop.disarm()
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    stop.disarm()
    raise RuntimeError("rank 0 returned from open_project_session in a follower")   # not reached


if __name__ == "__main__":  # pragma: no cover - a process of its own
    sys.exit(main())
