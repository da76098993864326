#!/usr/bin/env bash
# Prepare, on a machine with internet and nvcc, what the one GPU command carries to a device machine that has
# neither internet nor the project's pins (docs/gpu.md "The GPU checks"), then print that command:
#   .whl/       transformers and everything it needs at run time (but numpy: the device's torch is built against its
#               own) at the versions this environment resolved, as wheels for the device's Python (default 3.12,
#               manylinux x86_64)
#   .gpucache/  the plugins' CUDA library for the device's architecture (default 90a), built here by nvcc into a
#               DFLASH2_TRT_CACHE; its cache key holds the nvcc version, so a device with the same nvcc compiles
#               nothing, and one with another compiles it there
# Both paths are git-ignored (git's info/exclude, the main checkout's for a worktree), which is what the device
# tool's `carry` needs.
# Usage: scripts/gpu_prepare.sh [--python-version 3.12] [--arch 90a]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-python3}"
pyver=3.12
arch=90a
while [ $# -gt 0 ]; do
    case "$1" in
        --python-version) pyver="$2"; shift 2 ;;
        --arch) arch="$2"; shift 2 ;;
        *) echo "gpu_prepare: unknown argument $1 (expected --python-version X.Y, --arch 90a)" >&2; exit 2 ;;
    esac
done
cd "$repo"
# git's own path of the exclude file: in a worktree .git is a file, and the exclude file is the main checkout's
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
for p in /.whl/ /.gpucache/; do
    grep -qxF "$p" "$exclude" 2>/dev/null || echo "$p" >> "$exclude"
done
# transformers and everything it needs at run time, at the versions this environment resolved (the ones the suite
# passed with), its requirements' markers evaluated for the device's Python; numpy stays the device's (its torch is
# built against it)
mapfile -t pins < <("$python" - "$pyver" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pyver = sys.argv[1]
env = {"python_version": pyver, "python_full_version": pyver + ".0", "platform_machine": "x86_64",
       "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}
skip = {"numpy", "torch"}
todo, seen = ["transformers"], {}
while todo:
    name = canonicalize_name(todo.pop())
    if name in seen or name in skip:
        continue
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        continue
    seen[name] = dist.version
    for text in dist.requires or ():
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            todo.append(req.name)
for name, ver in sorted(seen.items()):
    print(f"{name}=={ver}")
EOF
)
[ "${#pins[@]}" -gt 0 ] || { echo "gpu_prepare: transformers is not installed in $python's environment" >&2; exit 2; }
rm -rf .whl.tmp && mkdir .whl.tmp
plats=()
for n in 28 27 17; do plats+=(--platform "manylinux_2_${n}_x86_64"); done
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    "${plats[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl.tmp "${pins[@]}"
rm -rf .whl && mv .whl.tmp .whl
export DFLASH2_TRT_CACHE="$repo/.gpucache"
lib="$(DFLASH2_CUDA_ARCH="$arch" "$python" -c "
from dflash2_trt.trtllm.cuda.plugin_lib import build_cuda_plugins
print(build_cuda_plugins('$arch'))")"
echo "gpu_prepare: $(ls .whl | tr '\n' ' ')"
echo "gpu_prepare: $lib ($(du -sh .whl .gpucache | awk '{print $1}' | paste -sd/) for .whl/.gpucache)"
cat <<EOF
The device command (carry: .whl .gpucache; OUT is the device tool's output folder; ask for an H200 by name where
there is a choice: qwen3.8-27b's steps at concurrency 64 need ~90 GB, so on an 80 GB H100 that level is dropped):
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \\
  || exit 3; export PYTHONPATH=/tmp/site:\$PWD DFLASH2_TRT_CACHE=\$PWD/.gpucache DFLASH2_CUDA_ARCH=$arch \\
  PYTHONUNBUFFERED=1 DFLASH2_GPU_BUDGET_S=525; scripts/gpu_check.sh --all \$OUT/all
A second call while the machine is warm (the parts its summary.json says were skipped, in a budget cut to what the
session has left, e.g. DFLASH2_GPU_BUDGET_S=200): the same command ending in
  scripts/gpu_check.sh --all \$OUT/all2 --parts profile,pytest_gpu,sanitize
EOF
