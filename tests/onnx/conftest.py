"""Fixtures for the ONNX export tests: pairs, cached exports, the reference, the plugin library."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.reference.drafter import DFlash2Drafter
from dflash2_trt.reference.loop import load_target
from onnx_harness import REPO, Reference, _muse_pair, trt_include


@pytest.fixture(scope="session")
def pairs(tmp_path_factory):
    """family -> (drafter_dir, target_dir): the two shipped trained pairs, and a built Muse Glimmer pair."""
    cache: dict[str, tuple[Path, Path]] = {}

    def get(family: str) -> tuple[Path, Path]:
        if family not in cache:
            if family == "muse_glimmer":
                cache[family] = _muse_pair(tmp_path_factory.mktemp("muse"))
            else:
                p = trained_pair(family)
                cache[family] = (p.drafter_dir, p.target_dir)
        return cache[family]
    return get


@pytest.fixture(scope="session")
def exported(pairs, tmp_path_factory):
    """(family, plugins, selector, dtype, opset) -> export directory, each exported once per session."""
    from dflash2_trt.onnx import export_onnx

    root = tmp_path_factory.mktemp("onnx-exports")
    cache: dict[tuple, Path] = {}

    def get(family: str, plugins: bool = True, selector: str = "greedy", dtype: str = "float32",
            opset: int = 18) -> Path:
        key = (family, plugins, selector, dtype, opset)
        if key not in cache:
            d, t = pairs(family)
            out = root / "-".join(map(str, key))
            export_onnx(d, t, out, use_plugins=plugins, selector=selector, dtype=dtype, opset=opset,
                        max_seq_len=128)
            cache[key] = out
        return cache[key]
    return get


@pytest.fixture(scope="session")
def reference(pairs):
    cache: dict[str, Reference] = {}

    def get(family: str) -> Reference:
        if family not in cache:
            d, t = pairs(family)
            target = load_target(t, dtype=torch.float32)
            hidden = target.config.get_text_config().hidden_size
            cache[family] = Reference(target, DFlash2Drafter.from_pretrained(d, dtype=torch.float32,
                                                                             target_hidden_size=hidden))
        return cache[family]
    return get


@pytest.fixture(scope="session")
def plugin_library(tmp_path_factory) -> Path:
    """libdflash2_plugins_dynamic.so built with CMake against DFLASH2_TRT_INCLUDE's headers."""
    inc = trt_include()
    if inc is None:
        pytest.skip("DFLASH2_TRT_INCLUDE not set to TensorRT headers: the plugin glue (libdflash2_plugins_dynamic.so) "
                    "cannot be built here; plugin graphs are built by TensorRT-RTX only where headers are given")
    if shutil.which("cmake") is None or shutil.which("nvcc") is None:
        pytest.skip("cmake or nvcc not found: cannot build libdflash2_plugins_dynamic.so")
    build = tmp_path_factory.mktemp("plugins-build")
    for cmd in (["cmake", "-S", str(REPO / "plugins"), "-B", str(build), f"-DTensorRT_ROOT={inc.parent}",
                 "-DCMAKE_BUILD_TYPE=Release"], ["cmake", "--build", str(build), "-j2"]):
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lib = build / "libdflash2_plugins_dynamic.so"
    assert lib.is_file()
    return lib
