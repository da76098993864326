"""The TensorRT 10 execution-API facts the project's TensorRT session relies on (facts/tensorrt_session.yaml
``tensorrt_api``: enums, calls and what they return), read against the closest real TensorRT this machine has:
TensorRT-RTX's Python bindings (a TensorRT 10 fork with the same execution API; it builds here, it cannot execute
without a GPU). The stand-in of the execution API is held to the record (test_trt_session.py); this holds the record to
a real binary. What RTX adds (e.g. DataType.E8M0) is not a disagreement; a recorded name, value, return type or the
arity the session calls with that RTX lacks is. The return types are read from pybind11's docstring signatures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

trt = pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX (tensorrt-rtx-cu13) is not installed")

REPO = Path(__file__).resolve().parents[2]
FACTS = yaml.safe_load((REPO / "dflash2_trt" / "engine" / "trtllm" / "facts" / "tensorrt_session.yaml").read_text())
API = FACTS["tensorrt_api"]

SESSION = REPO / "dflash2_trt" / "engine" / "trtllm" / "session.py"

# how dflash2_trt/engine/trtllm/session.py calls each method: positional arguments after self (held to session.py's
# own calls by test_the_arities_are_the_sessions_calls)
SESSION_ARITY = {"Runtime.deserialize_cuda_engine": 1, "ICudaEngine.create_execution_context": 0,
                 "IExecutionContext.set_optimization_profile_async": 2, "IExecutionContext.set_input_shape": 2,
                 "IExecutionContext.infer_shapes": 0, "IExecutionContext.set_tensor_address": 2,
                 "IExecutionContext.execute_async_v3": 1, "IExecutionContext.get_tensor_shape": 1,
                 "ICudaEngine.get_tensor_name": 1, "ICudaEngine.get_tensor_mode": 1, "ICudaEngine.get_tensor_dtype": 1,
                 "ICudaEngine.get_tensor_location": 1, "ICudaEngine.get_tensor_shape": 1,
                 "ICudaEngine.get_tensor_profile_shape": 2}

# the result each recorded call's text describes, as the bindings' return annotation ends (pybind11 spells a list
# "list[...]" or "List[...]"); every recorded method has one here, so none goes unchecked
RESULT = {"Runtime.deserialize_cuda_engine": "ICudaEngine", "ICudaEngine.get_tensor_name": "str",
          "ICudaEngine.get_tensor_mode": "TensorIOMode", "ICudaEngine.get_tensor_dtype": "DataType",
          "ICudaEngine.get_tensor_location": "TensorLocation", "ICudaEngine.get_tensor_shape": "Dims",
          "ICudaEngine.get_tensor_profile_shape": "]", "ICudaEngine.create_execution_context": "IExecutionContext",
          "IExecutionContext.set_optimization_profile_async": "bool", "IExecutionContext.set_input_shape": "bool",
          "IExecutionContext.get_tensor_shape": "Dims", "IExecutionContext.infer_shapes": "str]",
          "IExecutionContext.set_tensor_address": "bool", "IExecutionContext.execute_async_v3": "bool"}


def _overloads(fn):
    """Each signature line pybind11 writes into the docstring: (parameters after self, return annotation)."""
    out = []
    for m in re.finditer(r"^(?:\d+\. )?\w+\(self: [^,)]+(?:, )?(.*)\) -> (.+)$", fn.__doc__ or "", re.M):
        params = [p for p in re.split(r", (?=\w+: )", m.group(1)) if p]
        out.append((params, _plain(m.group(2))))
    return out


def _plain(annotation: str) -> str:
    """A return annotation without the spellings that vary between pybind11 releases: ``typing.`` prefixes,
    ``Optional[X]`` / ``X | None`` (X), ``List[...]`` (``list[...]``)."""
    a = re.sub(r"\btyping\.", "", annotation.strip())
    a = re.sub(r"^Optional\[(.*)\]$", r"\1", a)
    a = re.sub(r"\s*\|\s*None$", "", a)
    return re.sub(r"^List\[", "list[", a)


@pytest.mark.parametrize("enum", ["DataType", "TensorIOMode", "TensorLocation"])
def test_recorded_enum_values_are_tensorrts(enum):
    real = {k: int(v) for k, v in getattr(trt, enum).__members__.items()}
    for name, value in API[enum].items():
        assert real.get(name) == value, (enum, name, value, real)


@pytest.mark.parametrize("call", sorted(API["calls"]))
def test_recorded_call_exists_with_the_recorded_result(call):
    cls, name = call.split(".")
    attr = getattr(getattr(trt, cls), name, None)
    assert attr is not None, f"TensorRT has no {call}"
    said = API["calls"][call]
    if isinstance(attr, property):           # num_io_tensors, num_optimization_profiles: attributes, as recorded
        assert "the number" in said or "at least" in said, (call, said)
        return
    sigs = _overloads(attr)
    assert sigs, (call, attr.__doc__[:200])
    returns = {r for _, r in sigs}
    want = RESULT[call]
    # the record's own words name the type where they can ("-> bool", "-> ICudaEngine", "-> TensorIOMode", ...)
    named = re.search(r"-> (\w+)", said)
    if named and named.group(1)[0].isupper() or (named and named.group(1) == "bool"):
        assert named.group(1) == want, (call, said, want)
    assert all(r.endswith(want) for r in returns), (call, want, returns)
    if want.endswith("]"):
        assert all(r.startswith("list[") for r in returns), (call, returns)
    if call in SESSION_ARITY:
        # some overload takes exactly the arguments the session passes (defaults may follow)
        n = SESSION_ARITY[call]
        assert any(len(p) >= n and all("=" in q for q in p[n:]) for p, _ in sigs), (call, sigs)


def test_every_call_the_session_makes_is_recorded():
    """The arities above cover calls the record describes, and every recorded method has its result above."""
    assert set(SESSION_ARITY) <= set(API["calls"]), set(SESSION_ARITY) - set(API["calls"])
    methods = {c for c in API["calls"] if not isinstance(getattr(getattr(trt, c.split(".")[0]), c.split(".")[1]),
                                                         property)}
    assert methods == set(RESULT), methods ^ set(RESULT)


def test_the_arities_are_the_sessions_calls():
    """Every call session.py makes of a recorded method name, with its positional arguments, is one SESSION_ARITY
    names with that arity (the engine and the context share get_tensor_shape's arity), and each entry is made."""
    import ast

    by_name = {}
    for call, n in SESSION_ARITY.items():
        by_name.setdefault(call.split(".")[1], set()).add(n)
    seen = {}
    for node in ast.walk(ast.parse(SESSION.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in by_name:
            seen.setdefault(node.func.attr, set()).add(len(node.args))
    assert seen == by_name, (seen, by_name)
