"""TensorRT-RTX (a real TensorRT builder, on the CPU) parses and builds the exported graphs.

RTX targets SM75..SM121 consumer parts only: these builds validate the graph (every node through
TensorRT's ONNX parser, shapes and types at every profile corner) and the plugins' build-time
code; they do not make an H200/B200 engine and run nothing. Plugin graphs need
libdflash2_plugins_dynamic.so, which needs TensorRT headers (DFLASH2_TRT_INCLUDE): those tests
skip without them.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import tensorrt_rtx as trt

from dflash2_trt.errors import DFlash2Error
from dflash2_trt.onnx import rtx
from onnx_harness import conv_graph, scan_graph

BUILD_TIME = ("getOutputDataTypes", "getOutputShapes", "supportsFormatCombination", "configurePlugin",
              "getWorkspaceSize")


def test_rtx_has_no_hopper_or_blackwell_datacenter_target():
    """Pins the fact the notes rely on: the plans built here are not H200/B200 engines."""
    names = {n for n in dir(trt.ComputeCapability) if n.startswith("SM")}
    assert names == set(rtx.COMPUTE_CAPABILITIES)
    assert "SM90" not in names and "SM100" not in names
    with pytest.raises(DFlash2Error, match="not SM90/SM100"):
        rtx.build("unused.onnx", compute_capability="SM90")


@pytest.mark.parametrize("family,dtype", [("qwen3", "float32"), ("qwen3", "bfloat16"), ("qwen3_5", "float16"),
                                          ("muse_glimmer", "float32")])
def test_plugin_free_graph_builds(exported, family, dtype):
    out = exported(family, False, "greedy", dtype)
    r = rtx.build(out / "drafter.onnx")
    assert r.ok, r.errors
    assert r.plan_bytes > 0 and r.plugin_layers == []
    m = json.loads((out / "manifest.json").read_text())
    L, K = m["draft_len"], m["top_k"]
    assert r.network_outputs["draft_ids"] == {"dtype": "INT32", "shape": [-1, L]}
    assert r.network_outputs["q"] == {"dtype": "FLOAT", "shape": [-1, L, K]}
    want = {"float32": "FLOAT", "bfloat16": "BF16", "float16": "HALF"}[dtype]
    assert r.network_outputs["present_key_0"]["dtype"] == want


def test_plugin_free_viterbi_builds(exported):
    r = rtx.build(exported("qwen3", False, "viterbi") / "drafter.onnx", compute_capability="SM120")
    assert r.ok, r.errors


def test_plugin_graph_is_refused_without_the_plugin_library(exported):
    """The parser needs the creators: without the library the first plugin node is an error naming it."""
    r, _ = rtx.build_in_subprocess(exported("qwen3", True) / "drafter.onnx", trace=False)
    assert not r.ok
    assert any("DFlash2DynamicConv" in e for e in r.errors), r.errors


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_plugin_graph_builds_and_runs_the_plugins_build_methods(exported, plugin_library, family, dtype):
    out = exported(family, True, "greedy", dtype)
    m = json.loads((out / "manifest.json").read_text())
    r, err = rtx.build_in_subprocess(out / "drafter.onnx", plugin_library=plugin_library)
    assert r.ok, (r.errors, err[-2000:])
    assert len(r.plugin_layers) == 4 * m["num_layers"] + 1
    calls = Counter(re.findall(r"trace (DFlash2\w+::\w+)", err))
    for plugin in ("DFlash2DynamicConv", "DFlash2PairwiseScan"):
        for method in BUILD_TIME:
            assert calls[f"{plugin}::{method}"] > 0, (plugin, method, calls)
    assert calls["DFlash2DynamicConv::configurePlugin"] >= 4 * m["num_layers"]
    B, L, K = m["profile"]["batch"][2], m["draft_len"], m["top_k"]
    assert f"DFlash2PairwiseScan::getWorkspaceSize bytes={B * L * K * K * 4}" in err   # at the profile's max
    assert r.network_outputs["q"] == {"dtype": "FLOAT", "shape": [-1, L, K]}   # the plugin's getOutputShapes


def test_conv_constraint_violation_fails_with_the_plugins_message(plugin_library, tmp_path):
    r, err = rtx.build_in_subprocess(conv_graph(tmp_path / "conv.onnx", 6, 4), plugin_library=plugin_library,
                                     profile={}, trace=False)
    assert not r.ok
    assert "DFlash2DynamicConv: tokens=6 is not a multiple of block_size=4" in err
    ok, _ = rtx.build_in_subprocess(conv_graph(tmp_path / "conv8.onnx", 8, 4), plugin_library=plugin_library,
                                    profile={}, trace=False)
    assert ok.ok, ok.errors   # the control: whole blocks build


def test_scan_constraint_violation_fails_with_the_plugins_message(plugin_library, tmp_path):
    r, err = rtx.build_in_subprocess(scan_graph(tmp_path / "scan.onnx", 17), plugin_library=plugin_library,
                                     profile={}, trace=False)
    assert not r.ok
    assert "DFlash2PairwiseScan: K=17 candidates per position outside [1, 16]" in err
    ok, _ = rtx.build_in_subprocess(scan_graph(tmp_path / "scan16.onnx", 16), plugin_library=plugin_library,
                                    profile={}, trace=False)
    assert ok.ok, ok.errors
