#!/usr/bin/env bash
# GPU check of the DFlash2 plugin kernels (dynamic conv, pairwise scan, Gated DeltaNet): builds their CUDA library
# extension, checks them against the torch reference and the CPU build (bit for bit), and times them against
# torch eager or the DRAM bound (see scripts/gpu_check/gpu_check.py).
# Needs a CUDA GPU, a CUDA build of torch and nvcc. Exits 2 with a message when there is no GPU.
# Usage: scripts/gpu_check.sh [--json out.json] [--skip-bench] [--lib libdf2_cuda.so]
#        scripts/gpu_check.sh --e2e OUT_DIR [gpu_e2e.py options]   the cuda engine backend end to end and the
#        real-width step timings (scripts/gpu_e2e.py): JSON, tables and logs in OUT_DIR
#        scripts/gpu_check.sh --all OUT_DIR [--parts kernels,e2e,...]   everything a GPU session measures, in one
#        call that ends inside DFLASH2_GPU_BUDGET_S (default 540 s): the kernels, the engine flow (lossless c1/c16
#        fp32+bf16, the step table of both published targets), the TensorRT session's binding on device pointers, the
#        kernels under Nsight Compute, the gpu-marked tests and compute-sanitizer, each part under its own limit
#        (--parts: only those); OUT_DIR/results.tar.gz (every part's JSON, tables and logs) and
#        OUT_DIR/summary.json (each part's exit status and seconds), both refreshed after each part and every 20 s
#        while one runs; stopped from outside, the running part is stopped too and marked interrupted
#        (scripts/gpu_check/run_all.py: the device tool brings back at most 8 files)
#        scripts/gpu_check.sh --sanitize OUT_DIR [--limit S] [--tools memcheck,racecheck,synccheck]   the kernels'
#        small correctness cases under compute-sanitizer (scripts/gpu_check/sanitize.py): OUT_DIR/sanitize.json
#        scripts/gpu_check.sh --profile OUT_DIR [--limit S] [--workloads a,b|all]   the timed workloads under Nsight
#        Compute (hardware counters, warp stalls, the SASS lines that stall; scripts/gpu_check/profile.py):
#        OUT_DIR/profile.json + CSVs
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-python3}"
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then   # the usage above, on any machine (no GPU needed to read it)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU found (nvidia-smi missing or failing): nothing was run" >&2
    exit 2
fi
nvidia-smi -L
cd "$repo"
if [ "${1:-}" = "--all" ]; then
    [ $# -eq 2 ] || [ $# -eq 4 ] || { echo "gpu_check: --all takes one output directory [--parts a,b]" >&2; exit 2; }
    shift
    exec "$python" "$here/gpu_check/run_all.py" "$@"
fi
if [ "${1:-}" = "--sanitize" ]; then
    [ $# -ge 2 ] || { echo "gpu_check: --sanitize needs an output directory" >&2; exit 2; }
    shift
    exec timeout --kill-after=10 600 "$python" "$here/gpu_check/sanitize.py" "$@"
fi
if [ "${1:-}" = "--profile" ]; then
    [ $# -ge 2 ] || { echo "gpu_check: --profile needs an output directory" >&2; exit 2; }
    shift
    exec timeout --kill-after=10 600 "$python" "$here/gpu_check/profile.py" "$@"
fi
if [ "${1:-}" = "--e2e" ]; then
    [ $# -ge 2 ] || { echo "gpu_check: --e2e needs an output directory" >&2; exit 2; }
    out="$2"; shift 2
    exec timeout --kill-after=10 900 "$python" "$here/gpu_e2e.py" --out "$out" "$@"
fi
# the whole check is budgeted to 9 minutes (extension build of the three plugins' kernels included)
exec timeout --kill-after=10 540 "$python" "$here/gpu_check/gpu_check.py" "$@"
