"""The stand-in makes each Python scalar constant and each small array constant once and reuses it
(trtllm/cpu/tensor.py ``scalar``, trtllm/cpu/functional.py ``constant``), as a TensorRT engine holds its
constants: that is only sound if no op ever writes into one. Every family's engine runs steps of
every kind (context, generation, mixed, sampled), then every cached constant must still hold its value."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.testing.engines import EngineCache, run_prompts, shipped_prompts
from dflash2_trt.trtllm.cpu import functional, tensor


@pytest.mark.parametrize("family,key", [("qwen3", "tiny"), ("qwen3_5", "tiny-hybrid"), ("muse_glimmer", "tiny-muse")])
def test_no_step_writes_into_a_cached_constant(family, key, tmp_path_factory):
    pair = trained_pair(family)
    d = EngineCache(pair, key, tmp_path_factory, verify=False)(4)
    prompts = shipped_prompts(pair, 5)
    run_prompts(d, prompts, new=10, max_batch=3)                        # greedy: context, generation and mixed steps
    run_prompts(d, prompts[:2], new=6, max_batch=2, temperature=0.8)    # sampled
    cached = tensor.cached_scalars()
    assert len(cached) > 20
    arrays = functional.cached_constants()
    assert len(arrays) > 3
    for (dtype, shape, data, device), t in arrays.items():
        if torch.device(device).type == "meta":
            continue
        want = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
        assert np.array_equal(t.cpu().numpy(), want), (dtype, shape)
    for (kind, value, dtype, device), t in cached.items():
        assert t.shape == (1,) and t.dtype == dtype and t.device == device
        if device.type == "meta":          # made while a network was declared at real widths: no value to hold
            continue
        got = t.item()
        if isinstance(value, str):          # a float, keyed by its bits
            value = float.fromhex(value)
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got)
        else:
            assert got == (torch.tensor([value], dtype=dtype).item()), (kind, value, dtype, got)


def test_the_cache_tells_one_from_one_point_zero_and_stays_bounded():
    a = tensor.scalar(1, torch.float32, "cpu")
    b = tensor.scalar(1.0, torch.float32, "cpu")
    assert a is not b and a is tensor.scalar(1, torch.float32, "cpu")
    assert tensor.scalar(True, torch.bool, "cpu") is not tensor.scalar(1, torch.bool, "cpu")
    # -0.0 == 0.0 as values: the cache keeps them apart by their bits (a sign can matter: 1 / -0.0)
    z, nz = tensor.scalar(0.0, torch.float32, "cpu"), tensor.scalar(-0.0, torch.float32, "cpu")
    assert math.copysign(1.0, z.item()) == 1.0 and math.copysign(1.0, nz.item()) == -1.0
    assert tensor.scalar(float("nan"), torch.float32, "cpu") is tensor.scalar(float("nan"), torch.float32, "cpu")
    assert math.copysign(1.0, tensor.scalar(np.float32(-0.0), torch.float32, "cpu").item()) == -1.0
    for i in range(tensor._SCALARS_MAX + 10):
        tensor.scalar(i + 0.5, torch.float32, "cpu")
    assert len(tensor.cached_scalars()) <= tensor._SCALARS_MAX


def test_the_standin_tensor_writes_nothing_in_place():
    """TensorRT-LLM's Tensor has no in-place operators (`x += y` makes x + y) and no item assignment: the stand-in's
    neither, so no network code can write into a constant it shares between steps."""
    from dflash2_trt.trtllm.cpu import functional as F

    x = F.constant(np.array([1.0, 2.0], dtype=np.float32))
    y = x
    y += 1.0
    assert y is not x and tensor.raw(x).tolist() == [1.0, 2.0] and tensor.raw(y).tolist() == [2.0, 3.0]
    y = x
    y *= 3.0
    assert tensor.raw(x).tolist() == [1.0, 2.0]
    for write in (lambda t: t.__setitem__(0, 5.0), lambda t: t.add_(1.0), lambda t: t.copy_(t), lambda t: t.zero_(),
                  lambda t: t.fill_(0.0)):
        with pytest.raises(TypeError, match="tensorrt_llm's Tensor has no"):
            write(x)
    assert tensor.raw(F.constant(np.array([1.0, 2.0], dtype=np.float32))).tolist() == [1.0, 2.0]
