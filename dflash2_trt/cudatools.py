"""Where the CUDA toolkit's programs are (nvcc, compute-sanitizer, ncu): the GPU checks and the plugins' CUDA build
look them up the same way."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path


def find_cuda_tool(name: str, extra_globs: tuple[str, ...] = ()) -> str | None:
    """``name`` on PATH, else in the ``bin`` of ``$CUDA_HOME``, ``$CUDA_PATH`` or ``/usr/local/cuda``, else the last
    (newest, by name) match of ``extra_globs`` (e.g. Nsight Compute's ``/opt/nvidia/nsight-compute/*/ncu``); None
    where there is none."""
    found = shutil.which(name)
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / name).is_file():
            return str(Path(root) / "bin" / name)
    for pattern in extra_globs:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None
