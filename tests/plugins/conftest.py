"""Fixtures for the plugin tests: the plugins' CPU builds (shared math + validation), loaded by ctypes.

The builds and their wrappers live in the package (dflash2_trt.trtllm.cpu.plugin_libs, which
the CPU engine backend uses too); here they are compiled into the session's temp cache
(DFLASH2_TRT_CACHE, set by tests/conftest.py), never into the repo or the user's cache. They are
compiled with -ffp-contract=off: the CUDA kernels use explicit round-to-nearest multiplies/adds
(no FMA), and the CPU build must not contract either, or the two would differ in the last bit
while both "look" right (see plugin_libs.CXXFLAGS).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash2_trt.errors import MissingDependencyError
from dflash2_trt.trtllm.cpu import plugin_libs
from dflash2_trt.trtllm.cpu.plugin_libs import (DTYPE_CODES, UNKNOWN_DTYPE, ConvLib, GdnLib,  # noqa: F401
                                                ScanLib, descs)

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"


def build_shared(sources: list[Path], out: Path) -> Path:
    """g++ (the package's flags) ``sources`` into ``out``; skips the test where g++ is absent."""
    try:
        return plugin_libs.compile_shared(sources, out)
    except MissingDependencyError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def plugin_build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plugin-cpu-build")


def _lib(accessor):
    try:
        return accessor()
    except MissingDependencyError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def conv_lib(_tiny_cache) -> ConvLib:
    return _lib(plugin_libs.conv_lib)


@pytest.fixture(scope="session")
def scan_lib(_tiny_cache) -> ScanLib:
    return _lib(plugin_libs.scan_lib)


@pytest.fixture(scope="session")
def gdn_lib(_tiny_cache) -> GdnLib:
    return _lib(plugin_libs.gdn_lib)
