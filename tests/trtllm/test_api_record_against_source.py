"""The record the CPU stand-in is held to (``dflash2_trt/trtllm/cpu/api_1_2.yaml``) held in turn to TensorRT-LLM's real
Python sources: every signature, keyword and Tensor operator / method it records, read off the real objects.

test_api_fidelity.py holds the stand-in to the record; this holds the record to the source it names, so a fact
misread when it was written down shows here. It needs the sources in $DFLASH2_TRTLLM_SRC (DIR/tensorrt_llm/
functional.py ...; the conformance harness's files, never part of this repository) and TensorRT-RTX (the harness
imports them over its stand-in ``tensorrt``, in a child process so this one's modules stay untouched); it skips
otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_sources import REPO, child_json, have  # noqa: E402

FACTS = yaml.safe_load((REPO / "dflash2_trt" / "trtllm" / "cpu" / "api_1_2.yaml").read_text())
pytestmark = pytest.mark.skipif(not have("functional.py"),
                                reason="TensorRT-LLM's Python sources are not in $DFLASH2_TRTLLM_SRC")

# Run in a child: the real modules, imported through the conformance harness, described as JSON. A default that is
# not a plain literal is described by its type and name (an enum member: its name), so the record's
# "<non-literal>" rows can be told from a missing default.
_READER = r"""
import enum, functools, inspect, json, sys
sys.path.insert(0, sys.argv[2])
from trtllm_conformance_lib import harness
harness.install(sys.argv[1])
import importlib
F = importlib.import_module("tensorrt_llm.functional")
layers = {"Linear": "tensorrt_llm.layers.linear", "ColumnLinear": "tensorrt_llm.layers.linear",
          "RowLinear": "tensorrt_llm.layers.linear", "RmsNorm": "tensorrt_llm.layers.normalization",
          "Embedding": "tensorrt_llm.layers.embedding"}

def describe(v):
    if v is inspect.Parameter.empty:
        return {"required": True}
    if v is None or (isinstance(v, (bool, int, float, str)) and not isinstance(v, enum.Enum)):
        return {"value": v}
    return {"object": type(v).__name__, "member": getattr(v, "name", None)}

def params(fn, skip_self=False):
    bound = set(fn.keywords) if isinstance(fn, functools.partial) else set()
    out = []
    for p in inspect.signature(fn).parameters.values():
        if skip_self and p.name == "self":
            continue
        out.append({"name": p.name, "kind": p.kind.name, "partial_bound": p.name in bound, **describe(p.default)})
    return out

names = sys.argv[3].split(",")
out = {"functional": {n: (params(getattr(F, n)) if hasattr(F, n) else None) for n in names},
       "layers": {}, "tensor_attrs": sorted(a for a in dir(F.Tensor)),
       "tensor_methods": {}}
for cls, mod in layers.items():
    c = getattr(importlib.import_module(mod), cls)
    out["layers"][cls] = {"params": params(c.__init__, skip_self=True), "mro": [k.__name__ for k in c.__mro__]}
for m in sys.argv[4].split(","):
    fn = getattr(F.Tensor, m, None)
    out["tensor_methods"][m] = None if fn is None else [p["name"] for p in params(fn, skip_self=True)]
print(json.dumps(out))
"""

_REAL = None


def real():
    global _REAL
    if _REAL is None:
        names = sorted(FACTS["functional"]["signatures"]) + ["gpt_attention"]
        methods = sorted(FACTS["tensor_methods"]["present"]) + FACTS["tensor_methods"]["absent_examples"]
        _REAL = child_json(_READER, ",".join(names), ",".join(methods))
    return _REAL


def _rows(params):
    """The real parameters as the record writes them: [name, default], REQUIRED for none; keyword-only parameters a
    functools.partial binds (functional.add = partial(elementwise_binary, op=...)) are not the caller's."""
    return [[p["name"], "REQUIRED" if p.get("required") else p.get("value", p)] for p in params
            if not p["partial_bound"]]


def _same(recorded, params, what):
    got = _rows(params)
    assert [n for n, _ in got] == [n for n, _ in recorded], (what, got)
    for (n, want), (_, real_default) in zip(recorded, got):
        if want == "<non-literal>":   # a default, not a plain literal
            assert isinstance(real_default, dict) and "object" in real_default, (what, n, real_default)
        else:
            assert real_default == want, (what, n, want, real_default)


@pytest.mark.parametrize("name", sorted(FACTS["functional"]["signatures"]))
def test_recorded_functional_signature_is_the_real_one(name):
    params = real()["functional"][name]
    assert params is not None, f"tensorrt_llm.functional has no {name}"
    _same(FACTS["functional"]["signatures"][name], params, name)


def test_recorded_gpt_attention_is_the_real_one():
    """Keyword-only from its first parameter; the recorded leading parameters in order with their defaults; every
    later keyword the network may pass exists after them, in the recorded order; the recorded defaults hold."""
    params = real()["functional"]["gpt_attention"]
    g = FACTS["functional"]
    assert g["gpt_attention_keyword_only"] is True and params[0]["kind"] == "KEYWORD_ONLY"
    lead = g["gpt_attention"]
    _same(lead, params[:len(lead)], "gpt_attention")
    later = [p["name"] for p in params[len(lead):]]
    positions = [later.index(k) if k in later else -1 for k in g["gpt_attention_later_keywords"]]
    assert -1 not in positions, [k for k, i in zip(g["gpt_attention_later_keywords"], positions) if i < 0]
    assert positions == sorted(positions)
    by_name = {p["name"]: p for p in params}
    for k, want in g["gpt_attention_defaults"].items():
        have = by_name[k]
        assert have.get("value", have.get("member")) == want, (k, want, have)


@pytest.mark.parametrize("cls", sorted(FACTS["layers"]))
def test_recorded_layer_constructor_is_the_real_one(cls):
    rec = FACTS["layers"][cls]
    got = real()["layers"][cls]
    if "alias_of" in rec:
        # ColumnLinear: the real name is the recorded class or a subclass of it with the same constructor
        base = rec["alias_of"]
        assert base in got["mro"], got["mro"]
        _same(FACTS["layers"][base]["signature"], got["params"], cls)
    else:
        _same(rec["signature"], got["params"], cls)


def test_recorded_tensor_operators_and_methods_are_the_real_ones():
    attrs = set(real()["tensor_attrs"])
    ops = FACTS["tensor_operators"]
    assert set(ops["present"]) <= attrs, set(ops["present"]) - attrs
    # an operator Python gives every object (object.__eq__ / __ne__) counts as absent when Tensor does not define it:
    # only __ne__ is of that kind among the recorded absent ones, and Tensor's own __eq__ is recorded present
    assert not (set(ops["absent"]) - {"__ne__"}) & attrs, (set(ops["absent"]) - {"__ne__"}) & attrs
    methods = real()["tensor_methods"]
    for m, args in FACTS["tensor_methods"]["present"].items():
        assert methods[m] is not None, m
        assert methods[m][:len(args)] == args, (m, args, methods[m])
    for m in FACTS["tensor_methods"]["absent_examples"]:
        if m in ("__len__", "__iter__", "__bool__", "__index__", "__int__", "__float__"):
            continue   # dunder protocols: checked through attrs below
        assert methods[m] is None, m
    assert not {"__len__", "__iter__", "__bool__", "__index__", "__int__", "__float__"} & attrs
