"""``scripts/gpu_check.sh --sanitize OUT_DIR``: the plugins' kernels under compute-sanitizer.

The host emulation of the kernels (tests/plugins) runs every thread of a launch on the CPU and cannot see what only a
GPU does: an access past an allocation, a misaligned vector access, a shared-memory race between warps, a barrier not
reached by every thread. compute-sanitizer sees those. This runs ``gpu_check.py --small`` (the conv, scan and Gated
DeltaNet correctness checks on their small cases; the scan's include the published B 64 x L 7 x K 16 shape and its
thread-block clusters) under each tool of :data:`TOOLS` in turn, each with an equal share of ``--limit`` seconds, and
with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, so that every tensor is its own allocation (memcheck then sees an access
past a tensor's end, not only past a cached block's).

The plugins' CUDA library and the GDN CPU build are built (or found in the cache) once before the tools, outside
their shares, and passed to each run. torch's own kernels are left out where their names say so
(``--kernel-name-exclude kns=native``: at::native; the plugins' kernels are all checked), falling back to every kernel
where the tool refuses the option. A tool whose share is under :data:`MIN_SHARE_S` is skipped. On SIGTERM / SIGINT the running tool's process
group is stopped before this exits.

OUT_DIR gets ``sanitize-<tool>.log`` (the whole output) and ``sanitize.json``: per tool its exit status (124: stopped
at its share of the limit), seconds, the error count of its summary lines, the first reported lines, and
``unsupported`` where the tool said the device is not supported (gVisor machines). Exit 0 when every tool ran to its
end, reported no error and the checks passed, 1 otherwise, 2 without compute-sanitizer or when the builds fail.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
from dflash2_trt.bench.io import atomic_write_text  # noqa: E402 - the repository's package, from this checkout
from dflash2_trt.children import run_limited, stop_signals_raise  # noqa: E402
from dflash2_trt.cudatools import find_cuda_tool  # noqa: E402

TOOLS = ("memcheck", "racecheck", "synccheck")
ERROR_EXIT = 86          # compute-sanitizer's exit status when it reported an error (--error-exitcode)
SUMMARY = re.compile(r"(?:ERROR SUMMARY: (\d+) errors?)|(?:RACECHECK SUMMARY: .*?\((\d+) errors?)")
FIRST_LINES = 40
MIN_SHARE_S = 15.0       # a tool that would get less is skipped (torch's start under the tool alone takes seconds)
# torch's own kernels (the checks' inputs, references and copies) are mostly at::native's, whose names (mangled:
# 2at6native, demangled: at::native) hold this and the plugins' kernels' names do not. An exclusion is sound either
# way: where it matches nothing, every kernel is instrumented (an inclusion that matched nothing would check none)
KERNEL_FILTER = ("--kernel-name-exclude", "kns=native")
STOP_LADDER = ((signal.SIGTERM, 3.0), (signal.SIGKILL, None))


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else under CUDA_HOME / CUDA_PATH / /usr/local/cuda."""
    return find_cuda_tool("compute-sanitizer")


def tool_argv(sanitizer: str, tool: str, lib: str | None = None, *, filtered: bool = True,
              python: str = sys.executable) -> list[str]:
    return [sanitizer, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "20",
            *(KERNEL_FILTER if filtered else ()), python, str(HERE / "gpu_check.py"), "--small",
            *(("--lib", lib) if lib else ())]


def run_tool(argv: list[str], limit: float, log: Path) -> int:
    """``argv`` in its own process group, output to ``log``; at ``limit`` seconds the group is stopped: 124. Else
    its exit status (128 + N for a signal)."""
    return run_limited(argv, limit, log, own_group=True, cwd=REPO, env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
                       ladder=STOP_LADDER)



def option_refused(text: str) -> bool:
    """The tool refused the kernel filter (a compute-sanitizer without it): its error names the option."""
    return "kernel-name-exclude" in text and re.search(r"(?i)unrecogni[sz]ed|unknown|invalid", text) is not None


def unsupported(text: str) -> bool:
    """The tool cannot attach to this device (seen on gVisor machines: 'Device not supported')."""
    return re.search(r"(?i)device (is )?not supported", text) is not None


def prebuild() -> str:
    """The plugins' CUDA library (its path, passed to every run) and the GDN CPU build, from the cache or built now,
    before the tools' shares start."""
    from dflash2_trt.trtllm.cpu.plugin_libs import gdn_lib
    from dflash2_trt.trtllm.cuda.plugin_lib import build_cuda_plugins

    lib = build_cuda_plugins(progress=lambda m: print(m, flush=True))
    gdn_lib()
    return str(lib)


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
    p.add_argument("--limit", type=float, default=150.0, help="seconds for everything: the builds (cached: none) and the tools (default 150)")
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
    deadline = time.monotonic() + args.limit
    with stop_signals_raise():   # a stop from outside kills the running tool's group first
        return _run(args, tools, sanitizer, deadline)


def _run(args, tools: list[str], sanitizer: str, deadline: float) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        lib = prebuild()
    except Exception as e:  # noqa: BLE001 - one line, whatever the build raised
        print(f"sanitize: building the plugins failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    doc: dict = {"sanitizer": sanitizer, "checks": "gpu_check.py --small", "lib": lib,
                 "build_s": round(time.monotonic() - t0, 1), "kernel_filter": " ".join(KERNEL_FILTER), "tools": {}}
    ok = True
    filtered = True
    for i, tool in enumerate(tools):
        share = (deadline - time.monotonic()) / (len(tools) - i)
        if share < MIN_SHARE_S:
            rec = {"exit": None, "skipped": f"{max(share, 0):.0f} s share", "clean": False}
        else:
            log = args.out / f"sanitize-{tool}.log"
            t0 = time.monotonic()
            end = t0 + share
            rc = run_tool(tool_argv(sanitizer, tool, lib, filtered=filtered), share, log)
            text = log.read_text(errors="replace")
            if filtered and rc not in (0, ERROR_EXIT, 124) and option_refused(text) and end - time.monotonic() > 5:
                filtered = False        # this compute-sanitizer has no kernel filter: every kernel from now on
                rc = run_tool(tool_argv(sanitizer, tool, lib, filtered=False), end - time.monotonic(), log)
                text = log.read_text(errors="replace")
            rec = {"exit": rc, "seconds": round(time.monotonic() - t0, 1), "limit": round(share, 1),
                   "kernel_filter": filtered, **read_log(text)}
            if rec["errors"] is None and rc not in (0, 124) and unsupported(text):
                rec["unsupported"] = True
            # clean: the checks under the tool passed and it reported no error (--error-exitcode would have made
            # rc 86); the summary's count is the tool's own word on it where its line was found
            rec["clean"] = rc == 0 and not rec["errors"]
        ok = ok and rec["clean"]
        doc["tools"][tool] = rec
        print(f"sanitize {tool}: exit {rec['exit']}, errors {rec.get('errors')}, {rec.get('seconds', 0)} s"
              + (f" (skipped: {rec['skipped']})" if "skipped" in rec else "")
              + (" (device not supported by the tool)" if rec.get("unsupported") else ""), flush=True)
        for ln in rec.get("first_lines", [])[:10]:
            print(f"  {ln}", flush=True)
        doc["clean"] = ok
        atomic_write_text(args.out / "sanitize.json", json.dumps(doc, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
