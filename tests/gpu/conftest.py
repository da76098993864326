"""The gpu tests' session cache (tests/conftest.py: a fresh temporary folder) starts with the plugins' builds of the
cache the run was started with (``DFLASH2_TRT_CACHE``, read here before that fixture replaces it: the GPU command's
``.gpucache``), so the tests do not spend their time limit compiling the CUDA library again."""

from __future__ import annotations

import os

import pytest

STARTED_WITH = os.environ.get("DFLASH2_TRT_CACHE")


@pytest.fixture(scope="session", autouse=True)
def _prebuilt_plugins(_tiny_cache):
    from dflash2_trt.testing.plugin_cache import copy_plugin_builds

    return copy_plugin_builds(STARTED_WITH, _tiny_cache)
