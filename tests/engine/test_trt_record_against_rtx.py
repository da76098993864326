"""The TensorRT 10 execution-API facts the project's TensorRT session relies on (facts/tensorrt_session.yaml
``tensorrt_api``: enums, calls and what they return), read against the closest real TensorRT this machine has:
TensorRT-RTX's Python bindings (a TensorRT 10 fork with the same execution API; it builds here, it cannot execute
without a GPU). The stand-in of the execution API is held to the record (test_trt_session.py); this holds the record to
a real binary. What RTX adds (e.g. DataType.E8M0) is not a disagreement; a recorded name, value, return type or the
arity the session calls with that RTX lacks is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

trt = pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX (tensorrt-rtx-cu13) is not installed")

REPO = Path(__file__).resolve().parents[2]
FACTS = yaml.safe_load((REPO / "dflash2_trt" / "engine" / "trtllm" / "facts" / "tensorrt_session.yaml").read_text())
API = FACTS["tensorrt_api"]

# how dflash2_trt/engine/trtllm/session.py calls each method: positional arguments after self
SESSION_ARITY = {"Runtime.deserialize_cuda_engine": 1, "ICudaEngine.create_execution_context": 0,
                 "IExecutionContext.set_optimization_profile_async": 2, "IExecutionContext.set_input_shape": 2,
                 "IExecutionContext.infer_shapes": 0, "IExecutionContext.set_tensor_address": 2,
                 "IExecutionContext.execute_async_v3": 1, "IExecutionContext.get_tensor_shape": 1,
                 "ICudaEngine.get_tensor_name": 1, "ICudaEngine.get_tensor_mode": 1, "ICudaEngine.get_tensor_dtype": 1,
                 "ICudaEngine.get_tensor_location": 1, "ICudaEngine.get_tensor_shape": 1,
                 "ICudaEngine.get_tensor_profile_shape": 2}


def _overloads(fn):
    """Each signature line pybind11 writes into the docstring: (parameters after self, return annotation)."""
    out = []
    for m in re.finditer(r"^(?:\d+\. )?\w+\(self: [^,)]+(?:, )?(.*)\) -> (.+)$", fn.__doc__ or "", re.M):
        params = [p for p in re.split(r", (?=\w+: )", m.group(1)) if p]
        out.append((params, m.group(2).strip()))
    return out


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
    if "-> bool" in said:
        assert returns == {"bool"}, (call, returns)
    if "-> ICudaEngine" in said:
        assert all(r.endswith("ICudaEngine") for r in returns), (call, returns)
    if "-> IExecutionContext" in said:
        assert all(r.endswith("IExecutionContext") for r in returns), (call, returns)
    if call == "IExecutionContext.infer_shapes":
        assert returns == {"list[str]"}, returns
    if call in SESSION_ARITY:
        # some overload takes exactly the arguments the session passes (defaults may follow)
        n = SESSION_ARITY[call]
        assert any(len(p) >= n and all("=" in q for q in p[n:]) for p, _ in sigs), (call, sigs)


def test_every_call_the_session_makes_is_recorded():
    """The arities above cover calls the record describes, so the two lists cannot drift apart silently."""
    assert set(SESSION_ARITY) <= set(API["calls"]), set(SESSION_ARITY) - set(API["calls"])
