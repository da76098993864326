"""One rank of ``run`` on a TensorRT engine directory, started by ``mpiexec`` from tests/engine/test_mpi_ranks.py.

Each process is what ``mpirun -n TP dflash2-trt run --engine-dir DIR`` starts, except that TensorRT is the CPU
stand-in (``dflash2_trt/testing/tensorrt_standin.py``: rank r's engine steps rank r of the CPU network, its
collectives carried between the processes by MPI). Rank 0 writes the report; the other ranks leave through
``FollowerExit`` once rank 0 closes the session.

    python mpi_driver.py ENGINE_DIR PROMPTS.jsonl REPORT.json [--fail-step-on-rank R] [--interrupt-step-on-rank R] [--cli]
                         [--blocks-on-rank R N [--no-agree]] [--bench]

``--bench``: ``bench run`` (concurrency 1,2, outputs kept) instead of ``run``: the speculative engine, then the
directory's baseline engine when it has one, every rank following rank 0 from one session to the next.
"""

import json
import sys
from pathlib import Path


def _fault_in_third_step(rank: int, exc: BaseException) -> None:
    """Make this process's session raise ``exc`` in its third step if it is MPI rank ``rank`` (the other ranks then
    wait inside the engine's collectives for it)."""
    from mpi4py import MPI

    from dflash2_trt.engine.trtllm.session import TrtEngineSession

    if MPI.COMM_WORLD.Get_rank() != rank:
        return
    real, calls = TrtEngineSession.step, []

    def step(self, inputs):
        calls.append(1)
        if len(calls) == 3:
            raise exc
        return real(self, inputs)

    TrtEngineSession.step = step


def _fewer_blocks(rank: int, blocks: int, report: str, agree: bool) -> None:
    """Size rank ``rank``'s KV pool at ``blocks`` blocks (the others keep theirs), and write every rank's pool size once
    opened to ``REPORT.rank<r>.blocks``. ``agree=False``: the control, the ranks not agreeing on one size."""
    from mpi4py import MPI

    from dflash2_trt.engine.trtllm.session import TrtEngineSession

    me = MPI.COMM_WORLD.Get_rank()
    real_pool, real_init = TrtEngineSession._pool_blocks, TrtEngineSession.__init__

    def pool(self, num_blocks, fraction):
        return blocks if me == rank else real_pool(self, num_blocks, fraction)

    def init(self, *a, **kw):
        if not agree:
            kw.pop("agree_blocks", None)
        real_init(self, *a, **kw)
        Path(f"{report}.rank{me}.blocks").write_text(str(self.num_blocks))

    TrtEngineSession._pool_blocks, TrtEngineSession.__init__ = pool, init


def main(argv):
    engine_dir, prompts, report = argv[:3]
    if "--fail-step-on-rank" in argv:          # an error on one rank only
        _fault_in_third_step(int(argv[argv.index("--fail-step-on-rank") + 1]),
                             RuntimeError("injected fault in step 3"))
    if "--interrupt-step-on-rank" in argv:     # Ctrl-C on one rank (KeyboardInterrupt, as the CLI's handler raises)
        _fault_in_third_step(int(argv[argv.index("--interrupt-step-on-rank") + 1]), KeyboardInterrupt())
    if "--blocks-on-rank" in argv:             # a rank whose GPU had less memory free: a smaller KV pool of its own
        i = argv.index("--blocks-on-rank")
        _fewer_blocks(int(argv[i + 1]), int(argv[i + 2]), report, agree="--no-agree" not in argv)
    from dflash2_trt.testing import tensorrt_standin as trt

    if "--cli" in argv:
        # the command line itself, as `mpirun -n 2 dflash2-trt run --engine-dir DIR --prompts P --json` runs it, with
        # TensorRT's module being the stand-in (this process has no TensorRT) and no plugin library to load
        import dflash2_trt.engine.trtllm.session as session
        from dflash2_trt.cli import main as cli

        sys.modules["tensorrt"] = trt
        session.load_plugin_libraries = lambda engine_dir: None
        cli(["run", "--engine-dir", engine_dir, "--prompts", prompts, "--max-batch-size", "2", "--json"])
        return
    if "--bench" in argv:
        from dflash2_trt.bench.run import bench_run

        rep = bench_run(engine_dir, prompts, concurrency="1,2", trt=trt, keep_outputs=True, progress=False)
        Path(report).write_text(json.dumps(rep))
        return
    from dflash2_trt.engine.run import run_engine

    rep = run_engine(engine_dir, prompts_file=prompts, max_batch_size=2, trt=trt)
    Path(report).write_text(json.dumps(rep))


if __name__ == "__main__":
    main(sys.argv[1:])
