#!/usr/bin/env bash
# GPU check of the DFlash2 plugin kernels (dynamic conv, pairwise scan, Gated DeltaNet): builds their CUDA library
# extension, checks them against the torch reference and the CPU build (bit for bit), and times them against
# torch eager or the DRAM bound (see scripts/gpu_check/gpu_check.py).
# Needs a CUDA GPU, a CUDA build of torch and nvcc. Exits 2 with a message when there is no GPU.
# Usage: scripts/gpu_check.sh [--json out.json] [--skip-bench] [--lib libdf2_cuda.so]
#        scripts/gpu_check.sh --e2e OUT_DIR [gpu_e2e.py options]   the cuda engine backend end to end and the
#        real-width step timings (scripts/gpu_e2e.py): JSON, tables and logs in OUT_DIR
#        scripts/gpu_check.sh --all OUT_DIR   everything a GPU session measures, in one call of at most 570 s: the
#        kernels (OUT_DIR/kernels.json), the engine flow (OUT_DIR/e2e/: lossless c1/c16 fp32+bf16, the step table of
#        both published targets at c1..c64), the TensorRT session's binding on device pointers
#        (OUT_DIR/trt_session/) and the gpu-marked tests (OUT_DIR/pytest_gpu.log); each part under its own time
#        limit, a failed part does not stop the next; OUT_DIR/summary.json: each part's exit status and seconds
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-python3}"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU found (nvidia-smi missing or failing): nothing was run" >&2
    exit 2
fi
nvidia-smi -L
cd "$repo"
if [ "${1:-}" = "--all" ]; then
    [ $# -ge 2 ] || { echo "gpu_check: --all needs an output directory" >&2; exit 2; }
    out="$2"; mkdir -p "$out"
    summary="$out/summary.json"; echo "{" > "$summary"; sep=""
    part() {   # part NAME SECONDS COMMAND...: run under its own limit, log to OUT/NAME.log, record rc and seconds
        local name="$1" limit="$2"; shift 2
        local t0=$SECONDS rc=0
        echo "== $name (limit ${limit} s): $*"
        timeout --kill-after=5 "$limit" "$@" > "$out/$name.log" 2>&1 || rc=$?
        tail -n 40 "$out/$name.log"
        echo "== $name: exit $rc after $((SECONDS - t0)) s"
        printf '%s  "%s": {"exit": %d, "seconds": %d, "limit": %d}\n' "$sep" "$name" "$rc" "$((SECONDS - t0))" \
            "$limit" >> "$summary"
        sep=","
    }
    part kernels 150 "$python" "$here/gpu_check/gpu_check.py" --json "$out/kernels.json"
    part e2e 300 "$python" "$here/gpu_e2e.py" --out "$out/e2e" --part-timeout 145
    part trt_session 45 "$python" "$here/gpu_check_trt_session.py" --out "$out/trt_session"
    part pytest_gpu 60 "$python" -m pytest -q -m gpu tests/gpu
    echo "}" >> "$summary"
    cat "$summary"
    exit 0
fi
if [ "${1:-}" = "--e2e" ]; then
    [ $# -ge 2 ] || { echo "gpu_check: --e2e needs an output directory" >&2; exit 2; }
    out="$2"; shift 2
    exec timeout --kill-after=10 900 "$python" "$here/gpu_e2e.py" --out "$out" "$@"
fi
# the whole check is budgeted to 9 minutes (extension build of the three plugins' kernels included)
exec timeout --kill-after=10 540 "$python" "$here/gpu_check/gpu_check.py" "$@"
