#!/usr/bin/env python3
"""TensorRT-LLM's own trtllm-build, run as ``dflash2-trt build --backend trtllm`` runs it, over TensorRT-RTX.

    python scripts/trtllm_real_build.py --trtllm-src DIR --target tiny|tiny-hybrid|tiny-muse [--tp 1|2]
                                        [--network combined|baseline] [--no-build] --workdir W [--json]

The module dflash2-trt hands the build to (``python -m dflash2_trt.trtllm.register``: register the architectures,
then ``tensorrt_llm.commands.build.main()``) runs with the argv ``build`` records, over TensorRT-LLM's real Python
sources in DIR (the conformance harness's files plus ``tensorrt_llm/commands/build.py`` and
``tensorrt_llm/builder.py``; never part of this repository) and TensorRT-RTX with the plugin placeholders. The engine
directory trtllm-build writes (config.json, rank<r>.engine) lands in W/engine-<network>; with ``--no-build`` the
engine files hold placeholder bytes instead of an RTX build (minutes on a small CPU). What stands in for what cannot
run here: scripts/trtllm_conformance_lib/real_build.py. One build per process (the modules it installs are global).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trtllm-src", required=True, type=Path)
    ap.add_argument("--target", required=True, choices=["tiny", "tiny-hybrid", "tiny-muse"])
    ap.add_argument("--tp", type=int, default=1, choices=[1, 2])
    ap.add_argument("--network", default="combined", choices=["combined", "baseline"])
    ap.add_argument("--workdir", required=True, type=Path, help="an empty or new directory for the checkpoint and engine")
    ap.add_argument("--no-build", action="store_true", help="placeholder engine bytes instead of a TensorRT-RTX build")
    ap.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    a = ap.parse_args(argv)
    if a.workdir.exists() and any(a.workdir.iterdir()):
        print(f"error: --workdir {a.workdir}: not empty", file=sys.stderr)
        return 2
    a.workdir.mkdir(parents=True, exist_ok=True)
    from trtllm_conformance_lib import real_build

    rep = real_build.run(a.trtllm_src, a.target, a.tp, a.network, a.workdir, build=not a.no_build)
    if a.json:
        print(json.dumps(rep, indent=2))
    else:
        print(f"{a.target} tp{a.tp} {a.network}: trtllm-build wrote {', '.join(rep['files'])} "
              f"({'RTX build' if rep['built'] else 'placeholder engine bytes'}; calls {rep['calls']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
