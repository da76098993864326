"""Fixtures of the conversion tests: wide tiny pairs (every tp up to 8) built once per session."""

from __future__ import annotations

import pytest

from cv_wide import build_wide_pair


@pytest.fixture(scope="session")
def wide_pairs(tmp_path_factory, _tiny_cache):
    """family -> (drafter_dir, target_dir) of the wide variants (8 q / 2 kv heads, 8 v / 2 k DeltaNet heads)."""
    root = tmp_path_factory.mktemp("wide")
    return {fam: build_wide_pair(fam, root / fam) for fam in ("qwen3", "qwen3_5", "muse_glimmer")}


@pytest.fixture(scope="session", params=["qwen3", "muse_glimmer"])
def tied_pair(request, tmp_path_factory, _tiny_cache):
    root = tmp_path_factory.mktemp("tied")
    return build_wide_pair(request.param, root, tie=True)
