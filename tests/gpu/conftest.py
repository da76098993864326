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


def pytest_collection_modifyitems(config, items):
    """``DFLASH2_REQUIRE_GPU=1`` (the GPU check's pytest part sets it): a run where torch sees no CUDA GPU fails at
    once instead of skipping every test, which had counted as a green part (a review: 9 skipped, exit 0)."""
    if os.environ.get("DFLASH2_REQUIRE_GPU", "") not in ("", "0"):
        import torch

        if not torch.cuda.is_available():
            pytest.exit(f"DFLASH2_REQUIRE_GPU is set and torch {torch.__version__} sees no CUDA GPU "
                        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})", returncode=1)
