"""One rank of ``run`` on a TensorRT engine directory, started by ``mpiexec`` from tests/engine/test_mpi_ranks.py.

Each process is what ``mpirun -n TP dflash2-trt run --engine-dir DIR`` starts, except that TensorRT is the CPU
stand-in (``dflash2_trt/testing/tensorrt_standin.py``: rank r's engine steps rank r of the CPU network, its
collectives carried between the processes by MPI). Rank 0 writes the report; the other ranks leave through
``FollowerExit`` once rank 0 closes the session.

    python mpi_driver.py ENGINE_DIR PROMPTS.jsonl REPORT.json [--fail-step-on-rank R]
"""

import json
import sys
from pathlib import Path


def main(argv):
    engine_dir, prompts, report = argv[:3]
    if "--fail-step-on-rank" in argv:
        # a fault on one rank only, in its third step (the other ranks then wait inside the engine's collectives)
        from mpi4py import MPI

        from dflash2_trt.engine.trtllm.session import TrtEngineSession

        bad = int(argv[argv.index("--fail-step-on-rank") + 1])
        if MPI.COMM_WORLD.Get_rank() == bad:
            real, calls = TrtEngineSession.step, []

            def step(self, inputs):
                calls.append(1)
                if len(calls) == 3:
                    raise RuntimeError("injected fault in step 3")
                return real(self, inputs)

            TrtEngineSession.step = step
    from dflash2_trt.engine.run import run_engine
    from dflash2_trt.testing import tensorrt_standin as trt

    rep = run_engine(engine_dir, prompts_file=prompts, max_batch_size=2, trt=trt)
    Path(report).write_text(json.dumps(rep))


if __name__ == "__main__":
    main(sys.argv[1:])
