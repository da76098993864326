"""The CPU stand-in's functional rules against TensorRT-LLM's real functional.py, call for call: every probe of
functional_probes.py runs on the stand-in here and on the real module (in a child process, over a strongly typed
TensorRT-RTX network, as trtllm-build defines one), and both must accept it with the same dtype and shape, or both
refuse it. The two probes the stand-in refuses on purpose (the real code silently truncates or wraps: api_1_2.yaml
dtype_rules elementwise_binary) must be accepted by the real code and refused by the stand-in; the Tensor methods
the stand-in leaves out because the network does not use them must exist in the real code.

Needs TensorRT-LLM's Python sources in $DFLASH2_TRTLLM_SRC (the conformance harness's files, never part of this
repository) and TensorRT-RTX; skips otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash2_trt.trtllm.cpu import functional as F
from dflash2_trt.trtllm.cpu.tensor import raw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from functional_probes import NOT_MODELLED, PROBES, STRICTER  # noqa: E402
from real_sources import child_json, have  # noqa: E402

pytestmark = pytest.mark.skipif(not have("functional.py"),
                                reason="TensorRT-LLM's Python sources are not in $DFLASH2_TRTLLM_SRC")

_REAL_RUNNER = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
sys.path.insert(0, sys.argv[3])
from trtllm_conformance_lib import harness
harness.install(sys.argv[1])
import importlib
import tensorrt as trt
import tensorrt_rtx as rtx
F = importlib.import_module("tensorrt_llm.functional")
from tensorrt_llm.network import Network, net_guard
from tensorrt_llm.plugin.plugin import PluginConfig
from functional_probes import PROBES

NAMES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT32": "int32", "INT64": "int64",
         "BOOL": "bool", "INT8": "int8"}
out = {}
for name, probe in PROBES.items():
    logger = harness.collecting_logger()
    builder = rtx.Builder(logger)
    real_net = builder.create_network(1 << int(rtx.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    network = Network()._init(trt.INetworkDefinition(real_net))
    network.plugin_config = PluginConfig()
    try:
        with net_guard(network):
            r = probe(F, np)
            if isinstance(r, (bool, int)):
                res = {"ok": True, "value": r}
            else:
                res = {"ok": True, "dtype": NAMES.get(str(r.dtype).rsplit(".", 1)[-1], str(r.dtype)),
                       "shape": [int(d) for d in r.shape]}
    except Exception as e:   # noqa: BLE001 - the outcome is what is compared
        res = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    if logger.errors:
        res = {"ok": False, "error": "TensorRT: " + logger.errors[0][:200]}
    out[name] = res
print(json.dumps(out))
"""

_REAL = None


def real_outcomes():
    global _REAL
    if _REAL is None:
        _REAL = child_json(_REAL_RUNNER, str(Path(__file__).resolve().parent))
    return _REAL


def stand_in_outcome(probe):
    names = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.int32: "int32",
             torch.int64: "int64", torch.bool: "bool", torch.int8: "int8"}
    try:
        r = probe(F, np)
    except Exception as e:   # noqa: BLE001 - the outcome is what is compared
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    if isinstance(r, (bool, int)):
        return {"ok": True, "value": r}
    return {"ok": True, "dtype": names[r.dtype], "shape": list(raw(r).shape)}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_stand_in_and_real_functional_agree(name):
    real, mine = real_outcomes()[name], stand_in_outcome(PROBES[name])
    if name in STRICTER:
        assert real["ok"] and not mine["ok"], (real, mine)
        return
    if name in NOT_MODELLED:   # the stand-in says the method exists in TensorRT-LLM and is not used: both true
        assert real["ok"] and mine["error"].startswith("NotImplementedError") and "exists in TensorRT-LLM" in \
            mine["error"], (real, mine)
        return
    assert real["ok"] == mine["ok"], (real, mine)
    if real["ok"]:
        assert {k: v for k, v in real.items() if k != "ok"} == {k: v for k, v in mine.items() if k != "ok"}, \
            (real, mine)
