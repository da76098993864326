"""The plugins' compiled builds carried from one cache into another (the GPU tests' session cache)."""

from __future__ import annotations

import shutil
from pathlib import Path

PLUGIN_BUILD_DIRS = ("plugins-cuda", "plugins-cpu")


def copy_plugin_builds(src: str | Path | None, dst: str | Path) -> list[str]:
    """Copy the plugins' CUDA and CPU builds of the cache ``src`` (``plugins-cuda/<sha256>/``,
    ``plugins-cpu/<sha256>/``) into the cache ``dst``, where absent; returns the builds copied. Each build's folder is
    named by the hash of its sources, flags, compiler and architecture, so a copy is the very build the same lookup
    would compile: a test session whose cache is a fresh temporary folder (tests/conftest.py) finds the builds that
    the GPU command brings (``.gpucache``) instead of spending its time limit in nvcc. ``src`` None or missing: none."""
    if not src:
        return []
    src, dst = Path(src), Path(dst)
    copied = []
    for kind in PLUGIN_BUILD_DIRS:
        if not (src / kind).is_dir() or src.resolve() == dst.resolve():
            continue
        for build in sorted(p for p in (src / kind).iterdir() if p.is_dir()):
            target = dst / kind / build.name
            if not target.exists():
                shutil.copytree(build, target)
                copied.append(f"{kind}/{build.name}")
    return copied
