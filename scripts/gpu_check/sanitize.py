"""``scripts/gpu_check.sh --sanitize OUT_DIR``: the plugins' kernels under compute-sanitizer.

The host emulation of the kernels (tests/plugins) runs every thread of a launch on the CPU and cannot see what only a
GPU does: an access past an allocation, a misaligned vector access, a shared-memory race between warps, a barrier not
reached by every thread. compute-sanitizer sees those. This runs ``gpu_check.py --small`` (the conv, scan and Gated
DeltaNet correctness checks on their small cases; the scan's include the published B 64 x L 7 x K 16 shape and its
thread-block clusters) under each tool of :data:`TOOLS` in turn, each with an equal share of ``--limit`` seconds, and
with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, so that every tensor is its own allocation (memcheck then sees an access
past a tensor's end, not only past a cached block's).

OUT_DIR gets ``sanitize-<tool>.log`` (the whole output) and ``sanitize.json``: per tool its exit status (124: stopped
at its share of the limit), seconds, the error count of its summary line and the first reported lines. Exit 0 when
every tool ran to its end and reported no error and the checks passed, 1 otherwise, 2 without compute-sanitizer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
from dflash2_trt.bench.io import atomic_write_text  # noqa: E402 - the repository's package, from this checkout
from run_all import run_limited  # noqa: E402

TOOLS = ("memcheck", "racecheck", "synccheck")
ERROR_EXIT = 86          # compute-sanitizer's exit status when it reported an error (--error-exitcode)
SUMMARY = re.compile(r"(?:ERROR SUMMARY: (\d+) errors?)|(?:RACECHECK SUMMARY: .*?\((\d+) errors?)")
FIRST_LINES = 40


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else under CUDA_HOME or /usr/local/cuda."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "compute-sanitizer").is_file():
            return str(Path(root) / "bin" / "compute-sanitizer")
    return None


def tool_argv(sanitizer: str, tool: str, python: str = sys.executable) -> list[str]:
    return [sanitizer, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "20",
            python, str(HERE / "gpu_check.py"), "--small"]


def read_log(text: str) -> dict:
    """The error count of the tool's summary lines (None: none found, e.g. stopped before its end) and the first lines
    it reported (compute-sanitizer's lines start with '=========', its banner and summary left out)."""
    errors = None
    for m in SUMMARY.finditer(text):     # racecheck may give its count twice (its own summary and the common one)
        errors = max(errors or 0, int(m.group(1) or m.group(2)))
    reported = [ln for ln in text.splitlines()
                if ln.startswith("=========") and "SUMMARY" not in ln and "COMPUTE-SANITIZER" not in ln
                and ln.strip("= ")]
    return {"errors": errors, "first_lines": reported[:FIRST_LINES]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="output directory (sanitize.json and one log per tool)")
    p.add_argument("--limit", type=float, default=150.0, help="seconds for all tools together (default 150)")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {', '.join(TOOLS)}")
    args = p.parse_args(argv)
    tools = [t for t in args.tools.split(",") if t]
    if not tools or any(t not in TOOLS for t in tools):
        print(f"error: --tools: expected a comma-separated list of {', '.join(TOOLS)}, got {args.tools!r}",
              file=sys.stderr)
        return 2
    if not args.limit > 0:
        print(f"error: --limit must be a positive number of seconds, got {args.limit}", file=sys.stderr)
        return 2
    sanitizer = find_sanitizer()
    if sanitizer is None:
        print("sanitize: compute-sanitizer not found (PATH, CUDA_HOME/bin, /usr/local/cuda/bin): nothing was run",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    doc: dict = {"sanitizer": sanitizer, "checks": "gpu_check.py --small", "tools": {}}
    deadline = time.monotonic() + args.limit
    ok = True
    for i, tool in enumerate(tools):
        share = (deadline - time.monotonic()) / (len(tools) - i)
        log = args.out / f"sanitize-{tool}.log"
        t0 = time.monotonic()
        rc = run_limited(tool_argv(sanitizer, tool), share, log)
        rec = {"exit": rc, "seconds": round(time.monotonic() - t0, 1), "limit": round(share, 1),
               **read_log(log.read_text(errors="replace"))}
        # clean: the checks under the tool passed and it reported no error (--error-exitcode would have made rc 86);
        # the summary's count is the tool's own word on it where its line was found
        rec["clean"] = rc == 0 and not rec["errors"]
        ok = ok and rec["clean"]
        doc["tools"][tool] = rec
        print(f"sanitize {tool}: exit {rc}, errors {rec['errors']}, {rec['seconds']} s", flush=True)
        for ln in rec["first_lines"][:10]:
            print(f"  {ln}", flush=True)
        doc["clean"] = ok
        atomic_write_text(args.out / "sanitize.json", json.dumps(doc, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
