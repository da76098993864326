"""The CPU stand-in of TensorRT-LLM (``dflash2_trt/trtllm/cpu``) op by op, against plain torch.

Every reference here is written independently of the stand-in: explicit loops, Python ints, float64
math, or a different torch primitive than the one the stand-in wraps (for the trivial wrappers a
direct comparison on odd shapes). The paged ``gpt_attention`` is checked against a dense attention
over contiguous per-request K/V histories written below, through several calls on one pool with
scrambled block assignments.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from dflash2_trt.errors import CheckpointError
from dflash2_trt.trtllm.cpu import comm
from dflash2_trt.trtllm.cpu import functional as _F
from dflash2_trt.trtllm.cpu import layers as L
from dflash2_trt.trtllm.cpu.attention import (
    AttentionMaskType, KVCachePool, PositionEmbeddingType, RotaryScalingType, _plugin_facts, _unpack_mask, pack_mask,
)
from dflash2_trt.trtllm.cpu.attention import gpt_attention as _gpt_attention
from dflash2_trt.trtllm.cpu.tensor import Tensor as _T
from dflash2_trt.trtllm.cpu.tensor import network_input, raw


class _PlainOutputs:
    """The stand-in's functional module with its results as plain torch tensors, so these tests can index and
    compare them with torch (the network itself only sees the stand-in's Tensor; tests/trtllm/test_api_fidelity.py
    covers what that Tensor refuses)."""

    def __getattr__(self, name):
        fn = getattr(_F, name)
        if not callable(fn) or isinstance(fn, type):
            return fn

        def call(*a, **k):
            out = fn(*a, **k)
            return tuple(raw(o) for o in out) if isinstance(out, tuple) else raw(out)
        return call


F = _PlainOutputs()
ROPE_POSITIONS = 512


def _rope_tables_ref(num_pos: int, dim: int, base: float):
    """The plugin's rotary inputs, written here from the recorded layout (api_1_2.yaml rope_tables): the power in
    float64 rounded to fp32, the division in fp32, fp32 angles, float2 (cos, sin) per position and frequency."""
    inv = np.array([np.float32(1.0) / np.float32(base ** (i / dim)) for i in range(0, dim, 2)], np.float32)
    ang = np.arange(num_pos, dtype=np.float32)[:, None] * inv[None, :]
    table = np.stack([np.cos(ang), np.sin(ang)], axis=-1).reshape(1, -1).astype(np.float32)
    return torch.from_numpy(inv), torch.from_numpy(table)


def gpt_attention(**kw):
    """Call the stand-in's gpt_attention as an engine would: arguments TensorRT-LLM requires but these tests do
    not vary get their runtime value (no contiguous cache, a zero beam indirection, the host copy of the block
    offsets, the rotary tables of a RoPE layer), and every tensor is bound as the runtime binds it (host inputs in
    host memory). Returns plain torch tensors."""
    kw = dict(kw)
    kw.setdefault("past_key_value", None)
    kw.setdefault("q_scaling", 1.0)
    kw.setdefault("host_sink_token_length", torch.zeros(1, dtype=torch.int32))
    seq = kw["sequence_length"]
    kw.setdefault("context_lengths", kw.get("host_context_lengths", seq))
    kw.setdefault("cache_indirection", torch.zeros(seq.shape[0], 1, ROPE_POSITIONS, dtype=torch.int32))
    if kw.get("kv_cache_block_offsets") is not None:
        kw.setdefault("host_kv_cache_block_offsets", kw["kv_cache_block_offsets"].clone())
    kw.setdefault("max_context_length", ROPE_POSITIONS)
    pet = kw.get("position_embedding_type", PositionEmbeddingType.learned_absolute)
    if pet in (PositionEmbeddingType.rope_gpt_neox, PositionEmbeddingType.rope_gptj) and kw.get("rotary_embedding_dim"):
        inv, table = _rope_tables_ref(ROPE_POSITIONS, kw["rotary_embedding_dim"],
                                      kw.get("rotary_embedding_base", 10000.0))
        kw.setdefault("rotary_inv_freq", inv)
        kw.setdefault("rotary_cos_sin", table)
        kw.setdefault("rotary_embedding_max_positions", ROPE_POSITIONS)
    memory = {e["name"]: e["memory"] for e in _plugin_facts()["inputs"]}
    for k, v in list(kw.items()):
        if isinstance(v, torch.Tensor) and not isinstance(v, _T) and k in memory:
            kw[k] = network_input(v, k, memory[k])
    out, present = _gpt_attention(**kw)
    return raw(out), present
from dflash2_trt.trtllm.cpu.modeling_utils import PretrainedConfig, PretrainedModel
from dflash2_trt.trtllm.cpu.module import Module, ModuleList, Parameter


# Regression tests for stand-in bugs found in review (now fixed): integer sum/cumsum keep int32; every rank
# owns its collective result; TensorRT-LLM's own defaults of unimplemented arguments are accepted, tensors and
# nonzero sink / KV-quant values are refused.


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _run_guarded(fn, timeout: float = 10.0):
    """Run ``fn()`` on a daemon thread; fail (instead of hanging the suite) if it does not return."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"deadlock: still running after {timeout} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


# =================================================================================================
# functional: construction / shape ops
# =================================================================================================
def test_constant_copies_and_arange_shape_cast():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    c = F.constant(a)
    a[0, 0] = 99
    assert c.dtype == torch.int32 and c.tolist() == [[0, 1, 2], [3, 4, 5]]

    r = F.arange(torch.tensor(2), torch.tensor(7), "int32")
    assert r.dtype == torch.int32 and r.tolist() == [2, 3, 4, 5, 6]
    with pytest.raises(TypeError, match="both"):     # TensorRT-LLM asserts int/int or Tensor/Tensor
        F.arange(2, torch.tensor(7), "int32")
    assert F.arange(0, 0, "int64").numel() == 0

    x = torch.zeros(3, 5, 7)
    s = F.shape(x)
    assert s.dtype == torch.int64 and s.tolist() == [3, 5, 7]   # TensorRT 10: IShapeLayer is int64 (api_1_2.yaml)
    s1 = F.shape(x, 1)
    assert s1.dim() == 0 and int(s1) == 5 and int(F.shape(x, -1)) == 7

    y = torch.tensor([1.7, -2.5, 3.0])
    for name, dt in (("int32", torch.int32), ("bfloat16", torch.bfloat16), ("float16", torch.float16),
                     ("int64", torch.int64), ("bool", torch.bool), ("int8", torch.int8)):
        out = F.cast(y, name)
        assert out.dtype == dt
    assert F.cast(y, "int32").tolist() == [1, -2, 3]          # truncation toward zero, as a C cast
    assert F.cast(y, torch.float16).dtype == torch.float16
    with pytest.raises(ValueError, match="unsupported dtype"):
        F.cast(y, "float8")


def test_slice_matches_indexing_and_rejects_out_of_range():
    x = torch.randn(3, 5, 7, generator=_gen(0))
    out = F.slice(x, [1, 0, 2], [2, 5, 3])
    ref = torch.empty(2, 5, 3)
    for i in range(2):
        for j in range(5):
            for k in range(3):
                ref[i, j, k] = x[1 + i, j, 2 + k]
    assert torch.equal(out, ref)
    # starts / sizes given as 0-d tensors (what F.shape returns), as the network passes them
    out2 = F.slice(x, F.concat([torch.tensor(0), 4, torch.tensor(6)]), F.concat([3, torch.tensor(1), 1]))
    with pytest.raises(TypeError, match="concat"):   # a Python list holding Tensors is no TensorRT-LLM shape
        F.slice(x, [torch.tensor(0), 4, torch.tensor(6)], [3, 1, 1])
    assert torch.equal(out2, x[:, 4:5, 6:7])
    assert F.slice(x, [0, 0, 7], [3, 5, 0]).shape == (3, 5, 0)
    with pytest.raises(IndexError, match="out of range"):
        F.slice(x, [0, 0, 5], [3, 5, 3])
    with pytest.raises(IndexError, match="out of range"):
        F.slice(x, [-1, 0, 0], [1, 5, 7])
    with pytest.raises(IndexError, match="out of range"):
        F.slice(x, [0, 0, 0], [4, 5, 7])
    with pytest.raises(ValueError, match="entries"):
        F.slice(x, [0, 0], [3, 5])


def test_gather_element_mode():
    g = _gen(1)
    x = torch.randn(4, 6, generator=g)
    idx = torch.randint(0, 6, (4, 3), generator=g, dtype=torch.int32)
    out = F.gather(x, 1, idx)
    for i in range(4):
        for j in range(3):
            assert out[i, j] == x[i, int(idx[i, j])]
    idx0 = torch.randint(0, 4, (2, 6), generator=g, dtype=torch.int32)
    out0 = F.gather(x, 0, idx0)
    for i in range(2):
        for j in range(6):
            assert out0[i, j] == x[int(idx0[i, j]), j]


def test_index_select_and_select():
    g = _gen(2)
    x = torch.randn(5, 3, 4, generator=g)
    idx = torch.tensor([4, 0, 0, 2], dtype=torch.int32)
    out = F.index_select(x, 0, idx)
    assert out.shape == (4, 3, 4)
    for a, i in enumerate(idx.tolist()):
        assert torch.equal(out[a], x[i])
    out1 = F.index_select(x, 2, torch.tensor([3, 1], dtype=torch.int32))
    for a, i in enumerate([3, 1]):
        for r in range(5):
            for c in range(3):
                assert out1[r, c, a] == x[r, c, i]

    s = F.select(x, 1, torch.tensor([2]))            # an int or a 1-element rank-1 Tensor (TensorRT-LLM asserts)
    assert s.shape == (5, 4)
    for r in range(5):
        for c in range(4):
            assert s[r, c] == x[r, 2, c]
    assert F.select(x, 0, 4).shape == (3, 4) and torch.equal(F.select(x, 0, 4), x[4])


def test_scatter_out_of_place():
    g = _gen(3)
    x = torch.randn(3, 7, generator=g)
    keep = x.clone()
    idx = torch.stack([torch.randperm(7, generator=g)[:4] for _ in range(3)]).to(torch.int32)
    upd = torch.randn(3, 4, generator=g)
    out = F.scatter(x, 1, idx, upd)
    ref = keep.clone()
    for i in range(3):
        for j in range(4):
            ref[i, int(idx[i, j])] = upd[i, j]
    assert torch.equal(out, ref)
    assert torch.equal(x, keep)                               # input untouched


def test_view_zero_placeholder_unsqueeze_expand_concat_and_layout_ops():
    x = torch.arange(2 * 3 * 5).reshape(2, 3, 5)
    v = F.view(x, [0, -1])
    assert v.shape == (2, 15) and v.reshape(-1).tolist() == list(range(30))
    assert F.view(x, [0, 0, 5]).shape == (2, 3, 5)
    assert F.view(x, torch.tensor([0, 15])).shape == (2, 15)         # a shape tensor works too
    assert F.view(x, [5, 0, 2]).shape == (5, 3, 2)                    # 0 copies the SAME dim of the input
    assert F.view(torch.zeros(0, 3), [0, 3], zero_is_placeholder=False).shape == (0, 3)
    with pytest.raises(RuntimeError):
        F.view(x, [0, 4])

    assert F.unsqueeze(x, 1).shape == (2, 1, 3, 5)
    e = F.expand(torch.tensor([[1, 2, 3]]), F.concat([torch.tensor(4), 3]))
    with pytest.raises(TypeError, match="Tensor"):   # TensorRT-LLM's expand takes a shape Tensor
        F.expand(torch.tensor([[1, 2, 3]]), [4, 3])
    assert e.shape == (4, 3) and all(e[i].tolist() == [1, 2, 3] for i in range(4))

    a, b, c = torch.randn(2, 3), torch.randn(1, 3), torch.randn(4, 3)
    cat = F.concat([a, b, c], dim=0)
    assert torch.equal(cat[:2], a) and torch.equal(cat[2:3], b) and torch.equal(cat[3:], c)
    d = torch.randn(2, 5)
    cat1 = F.concat([a, d], dim=1)
    assert cat1.shape == (2, 8) and torch.equal(cat1[:, :3], a) and torch.equal(cat1[:, 3:], d)

    r = F.repeat_interleave(torch.tensor([[1, 2], [3, 4]]), 3, 0)
    assert r.tolist() == [[1, 2]] * 3 + [[3, 4]] * 3
    p = F.permute(x, [2, 0, 1])
    assert p.shape == (5, 2, 3) and p[4, 1, 2] == x[1, 2, 4]
    t = F.transpose(x, 0, 2)
    assert t.shape == (5, 3, 2) and t[4, 2, 1] == x[1, 2, 4]
    assert F.flatten(x, 1).shape == (2, 15) and F.flatten(x).shape == (30,)


# =================================================================================================
# functional: elementwise
# =================================================================================================
def test_where_comparisons_and_logic():
    g = _gen(4)
    a = torch.randint(-3, 4, (3, 5), generator=g)
    b = torch.randint(-3, 4, (1, 5), generator=g)
    for fn, op in ((F.eq, lambda p, q: p == q), (F.lt, lambda p, q: p < q), (F.gt, lambda p, q: p > q)):
        out = fn(a, b)
        assert out.dtype == torch.bool
        for i in range(3):
            for j in range(5):
                assert bool(out[i, j]) == op(int(a[i, j]), int(b[0, j]))
        s = fn(a, 1)
        assert all(bool(s[i, j]) == op(int(a[i, j]), 1) for i in range(3) for j in range(5))
    p, q = a > 0, b < 1
    for fn, op in ((F.op_and, lambda u, w: u and w), (F.op_or, lambda u, w: u or w)):
        out = fn(p, q)
        assert all(bool(out[i, j]) == op(bool(p[i, j]), bool(q[0, j])) for i in range(3) for j in range(5))

    cond = torch.tensor([1, 0, 2, 0], dtype=torch.int32)
    x, y = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([-1.0, -2.0, -3.0, -4.0])
    with pytest.raises(TypeError, match="condition must be bool"):   # ISelectLayer takes a bool condition
        F.where(cond, x, y)
    cond = cond.bool()
    assert F.where(cond, x, y).tolist() == [1.0, -2.0, 3.0, -4.0]
    assert F.where(cond, 0, 7).tolist() == [0, 7, 0, 7]
    w = F.where(cond.bool().unsqueeze(1), x, 0.5)                 # broadcast [4,1] x [4] -> [4, 4]
    assert w.shape == (4, 4)
    assert all(float(w[i, j]) == (float(x[j]) if cond[i] else 0.5) for i in range(4) for j in range(4))


def test_minimum_maximum_keep_dtype():
    g = _gen(5)
    a = torch.randint(-5, 5, (4, 3), generator=g, dtype=torch.int32)
    b = torch.randint(-5, 5, (4, 3), generator=g, dtype=torch.int32)
    mn, mx = F.minimum(a, b), F.maximum(a, b)
    for i in range(4):
        for j in range(3):
            assert int(mn[i, j]) == min(int(a[i, j]), int(b[i, j]))
            assert int(mx[i, j]) == max(int(a[i, j]), int(b[i, j]))
    assert F.maximum(a, 0).dtype == torch.int32 and F.maximum(a, 0).tolist() == a.clamp(min=0).tolist()
    f = torch.randn(5, generator=g)
    assert F.maximum(f, 0.0).dtype == torch.float32
    assert F.minimum(f, 0.0).tolist() == [min(v, 0.0) for v in f.tolist()]


def test_floordiv_floors_negative_numbers():
    vals = [-7, -6, -1, 0, 1, 6, 7, 2**40 + 3, -(2**40) - 3]
    a = torch.tensor(vals, dtype=torch.int64)
    for d in (3, -3, 2**31 - 1):
        out = F.floordiv(a, d)
        assert out.tolist() == [v // d for v in vals]           # Python // floors
    assert F.floordiv(torch.tensor([-7, 7], dtype=torch.int32), torch.tensor([2, -2], dtype=torch.int32)).tolist() \
        == [-4, -4]
    assert F.floordiv(torch.tensor([-7.5, 7.5]), 2.0).tolist() == [-4.0, 3.0]


def test_unary_elementwise():
    x = torch.linspace(-4, 4, 17, dtype=torch.float64)
    assert torch.allclose(F.exp(x), torch.tensor([math.exp(v) for v in x.tolist()], dtype=torch.float64))
    assert torch.allclose(F.sigmoid(x), torch.tensor([1 / (1 + math.exp(-v)) for v in x.tolist()], dtype=torch.float64))
    assert torch.allclose(F.silu(x), torch.tensor([v / (1 + math.exp(-v)) for v in x.tolist()], dtype=torch.float64))
    assert torch.allclose(F.tanh(x), torch.tensor([math.tanh(v) for v in x.tolist()], dtype=torch.float64))


# =================================================================================================
# functional: reductions
# =================================================================================================
def test_sum_max_cumsum_against_loops():
    g = _gen(6)
    x = torch.randint(-9, 10, (3, 4, 5), generator=g).double()
    s = F.sum(x, 1)
    m = F.max(x, 2, keepdim=True)
    c = F.cumsum(x, 2)
    for i in range(3):
        for k in range(5):
            assert s[i, k] == builtins_sum(float(x[i, j, k]) for j in range(4))
        for j in range(4):
            assert m[i, j, 0] == max(float(x[i, j, k]) for k in range(5))
            acc = 0.0
            for k in range(5):
                acc += float(x[i, j, k])
                assert c[i, j, k] == acc
    assert F.sum(x, 0, keepdim=True).shape == (1, 4, 5)
    ci = F.cumsum(torch.tensor([[1, 0, 1, 1]], dtype=torch.int32), 1)
    assert ci.tolist() == [[1, 1, 2, 3]]


def builtins_sum(it):
    total = 0.0
    for v in it:
        total += v
    return total


def test_sum_cumsum_keep_int32():
    x = torch.tensor([[1, 0, 1]], dtype=torch.int32)
    assert F.cumsum(x, 1).dtype == torch.int32
    assert F.sum(x, 1).dtype == torch.int32


def test_argmax_first_index_on_ties():
    g = _gen(7)
    x = torch.randint(0, 3, (6, 9), generator=g).float()       # many ties
    out = F.argmax(x, 1)
    assert out.dtype == torch.int32 and out.shape == (6,)
    for i in range(6):
        row = x[i].tolist()
        assert int(out[i]) == row.index(max(row))
    k = F.argmax(x, 0, keepdim=True)
    assert k.shape == (1, 9)
    for j in range(9):
        col = x[:, j].tolist()
        assert int(k[0, j]) == col.index(max(col))
    assert int(F.argmax(torch.full((1, 5), 2.0), 1)[0]) == 0


def test_topk_stable_tie_order_and_nan_rejected():
    g = _gen(8)
    x = torch.randint(0, 4, (3, 2, 11), generator=g).float()
    x[0, 0, 3] = float("inf")
    x[1, 1, 0] = float("-inf")
    for largest in (True, False):
        vals, idx = F.topk(x, 5, dim=2, largest=largest)
        assert vals.shape == idx.shape == (3, 2, 5) and idx.dtype == torch.int32
        for a in range(3):
            for b in range(2):
                row = x[a, b].tolist()
                key = (lambda i: (-row[i], i)) if largest else (lambda i: (row[i], i))
                want = sorted(range(11), key=key)[:5]
                assert idx[a, b].tolist() == want
                assert vals[a, b].tolist() == [row[i] for i in want]
    v0, i0 = F.topk(x[:, 0, :], 2, dim=0)
    for j in range(11):
        col = x[:, 0, j].tolist()
        want = sorted(range(3), key=lambda i: (-col[i], i))[:2]
        assert i0[:, j].tolist() == want
    v1, i1 = F.topk(torch.zeros(1, 6), 6, dim=1)
    assert i1.tolist() == [[0, 1, 2, 3, 4, 5]]
    bad = torch.zeros(2, 4)
    bad[1, 2] = float("nan")
    from dflash2_trt.errors import NumericsError

    with pytest.raises(NumericsError, match="NaN"):    # one error line at the CLI, not a traceback
        F.topk(bad, 2, dim=1)


def test_softmax_against_float64_loop():
    g = _gen(9)
    x = torch.randn(3, 7, generator=g) * 5
    out = F.softmax(x, dim=1)
    for i in range(3):
        row = [float(v) for v in x[i]]
        m = max(row)
        den = sum(math.exp(v - m) for v in row)
        for j in range(7):
            assert abs(float(out[i, j]) - math.exp(row[j] - m) / den) < 1e-6
    out0 = F.softmax(x, 0)
    assert torch.allclose(out0.sum(0), torch.ones(7))


def test_matmul_transa_transb():
    g = _gen(10)

    def ref(a, b):      # a [..., m, k], b [..., k, n] as float64 loops over k
        a, b = a.double(), b.double()
        out = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.float64)
        for k in range(a.shape[-1]):
            out += a[..., :, k:k + 1] * b[..., k:k + 1, :]
        return out

    a, b = torch.randn(2, 3, 5, generator=g), torch.randn(2, 5, 4, generator=g)
    for ta, tb in ((False, False), (True, False), (False, True), (True, True)):
        aa = a.transpose(-1, -2).contiguous() if ta else a
        bb = b.transpose(-1, -2).contiguous() if tb else b
        out = F.matmul(aa, bb, transa=ta, transb=tb)
        assert out.shape == (2, 3, 4)
        assert torch.allclose(out.double(), ref(a, b), atol=1e-5)
    x, w = torch.randn(7, 5, generator=g), torch.randn(3, 5, generator=g)   # the linear layers' use
    assert torch.allclose(F.matmul(x, w, transb=True).double(), ref(x, w.t()), atol=1e-5)


def _rms_ref(x: torch.Tensor, n_dims: int, eps: float, weight=None) -> torch.Tensor:
    """fp32-exact-ish reference: mean of squares in float64, normalised, cast to the input dtype, times weight."""
    xd = x.double()
    dims = tuple(range(-n_dims, 0))
    y = (xd / torch.sqrt((xd * xd).mean(dims, keepdim=True) + eps)).to(x.dtype)
    return y if weight is None else weight * y


def test_rms_norm_fp32_math_cast_back():
    g = _gen(11)
    x = torch.randn(4, 3, 16, generator=g)
    w = torch.randn(16, generator=g)
    out = F.rms_norm(x, 16, weight=w, eps=1e-6)
    assert out.dtype == torch.float32
    assert torch.allclose(out, _rms_ref(x, 1, 1e-6, w), atol=1e-6, rtol=1e-6)
    # two normalised dims, no weight
    out2 = F.rms_norm(x, (3, 16), eps=1e-5)
    assert torch.allclose(out2, _rms_ref(x, 2, 1e-5), atol=1e-6, rtol=1e-6)

    xb, wb = x.bfloat16(), w.bfloat16()
    ob = F.rms_norm(xb, [16], weight=wb, eps=1e-6)
    assert ob.dtype == torch.bfloat16
    ref = _rms_ref(xb, 1, 1e-6, wb)
    assert torch.allclose(ob.float(), ref.float(), rtol=2 ** -7, atol=1e-6)
    # the normalisation is rounded to bf16 BEFORE the weight multiply (cast back, then times weight)
    ones = F.rms_norm(xb, 16, weight=torch.ones(16, dtype=torch.bfloat16))
    assert torch.equal(ones, F.rms_norm(xb, 16))

    # fp32 math: squares of 300 overflow fp16 (max 65504); fp32 accumulation does not
    xh = torch.full((2, 8), 300.0, dtype=torch.float16)
    xh[1] = -300.0
    oh = F.rms_norm(xh, 8)
    assert oh.dtype == torch.float16 and torch.isfinite(oh).all()
    assert oh.float().tolist() == [[1.0] * 8, [-1.0] * 8]


# =================================================================================================
# functional: embedding and collectives
# =================================================================================================
def test_embedding_tp1_against_lookup_loop():
    g = _gen(12)
    w = torch.randn(13, 5, generator=g)
    ids = torch.tensor([[0, 12, 7], [7, 3, 1]], dtype=torch.int32)
    out = F.embedding(ids, w)
    assert out.shape == (2, 3, 5)
    for i in range(2):
        for j in range(3):
            assert torch.equal(out[i, j], w[int(ids[i, j])])


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_vocab_parallel_equals_plain_lookup(tp, dtype):
    g = _gen(13 + tp)
    V, Hd = 12, 6
    w = torch.randn(V, Hd, generator=g).to(dtype)
    ids = torch.tensor([0, V - 1, V // tp, V // tp - 1, 5, 5, 2, 11], dtype=torch.int32)
    rows = V // tp
    world = comm.World(tp)

    def rank_fn(r):
        return F.embedding(ids, w[r * rows:(r + 1) * rows].clone(), tp_size=tp, tp_group=list(range(tp)),
                           sharding_dim=0, tp_rank=r)

    outs = _run_guarded(lambda: world.run(rank_fn))
    ref = torch.stack([w[int(i)] for i in ids])
    for o in outs:
        assert o.dtype == dtype and torch.equal(o, ref)
    with pytest.raises(NotImplementedError):
        F.embedding(ids, w, tp_size=2, tp_group=[0, 1], sharding_dim=1, tp_rank=0)


@pytest.mark.parametrize("size", [2, 4])
def test_allreduce_allgather_rank_order_and_dtype(size):
    world = comm.World(size)
    g = _gen(20 + size)
    parts = [torch.randn(3, 4, generator=g) * 10 ** r for r in range(size)]   # order matters in fp32

    def rank_fn(r):
        red = F.allreduce(parts[r], list(range(size)))
        red_b = F.allreduce(parts[r].bfloat16(), None)
        gat0 = F.allgather(parts[r], list(range(size)), gather_dim=0)
        gat1 = F.allgather(parts[r][:, : r + 1], list(range(size)), gather_dim=1)   # uneven widths
        return red, red_b, gat0, gat1, comm.current().rank

    outs = _run_guarded(lambda: world.run(rank_fn))
    acc = parts[0].clone()
    for p in parts[1:]:
        acc = acc + p                                    # ((r0 + r1) + r2) + r3 in fp32
    acc_b = parts[0].bfloat16().float()
    for p in parts[1:]:
        acc_b = acc_b + p.bfloat16().float()
    for r, (red, red_b, gat0, gat1, rank) in enumerate(outs):
        assert rank == r
        assert red.dtype == torch.float32 and torch.equal(red, acc)
        assert red_b.dtype == torch.bfloat16 and torch.equal(red_b, acc_b.bfloat16())
        assert gat0.shape == (3 * size, 4)
        for q in range(size):
            assert torch.equal(gat0[3 * q:3 * q + 3], parts[q])
        col = 0
        for q in range(size):
            assert torch.equal(gat1[:, col:col + q + 1], parts[q][:, :q + 1])
            col += q + 1
        assert gat1.shape[1] == col


def test_collectives_world_of_one_are_identity_and_group_checked():
    x = torch.randn(2, 3)
    assert torch.equal(F.allreduce(x, [0]), x)
    assert torch.equal(F.allgather(x, None, 1), x)
    assert comm.current().rank == 0 and comm.current().size == 1
    world = comm.World(2)
    with pytest.raises(ValueError, match="group"):
        _run_guarded(lambda: world.run(lambda r: F.allreduce(x, [0])))
    with pytest.raises(ValueError):
        comm.World(0)


def test_exception_on_one_rank_propagates_without_deadlock():
    world = comm.World(4)

    def fn(r):
        if r == 2:
            raise KeyError("rank 2 failed")
        return F.allreduce(torch.ones(2), [0, 1, 2, 3])      # the others wait in the collective

    with pytest.raises(KeyError, match="rank 2 failed"):
        _run_guarded(lambda: world.run(fn))
    # a failure INSIDE a collective (shapes that cannot be concatenated) propagates too
    with pytest.raises(RuntimeError):
        _run_guarded(lambda: world.run(lambda r: F.allgather(torch.ones(r + 1, 2), None, gather_dim=1)))
    # a failure after a few collectives (ranks mid-protocol)
    def late(r):
        F.allreduce(torch.ones(1), None)
        if r == 0:
            raise ValueError("late")
        F.allreduce(torch.ones(1), None)
        return r

    with pytest.raises(ValueError, match="late"):
        _run_guarded(lambda: world.run(late))
    # the world is usable again afterwards
    outs = _run_guarded(lambda: world.run(lambda r: F.allreduce(torch.full((2,), float(r)), None)))
    assert all(o.tolist() == [6.0, 6.0] for o in outs)


def test_a_recorded_stop_ends_the_wait_for_ranks_that_cannot_finish():
    """A Ctrl-C whose exception Python lost (recorded by errors.stop_requested) while a rank is stuck (as on an
    import lock the lost exception left held) ends World.run; the other ranks, waiting at a collective, are let go."""
    import time

    from dflash2_trt.testing.stops import stop_recorded_after

    world, release, waiting = comm.World(3), threading.Event(), threading.Event()

    def fn(r):
        if r == 1:
            waiting.set()
            release.wait(60)   # stuck
        return F.allreduce(torch.ones(1), None)

    t0 = time.monotonic()
    try:
        with stop_recorded_after(0.3), pytest.raises(KeyboardInterrupt):
            world.run(fn)
        assert waiting.is_set() and time.monotonic() - t0 < 10
    finally:
        release.set()


def test_many_back_to_back_collectives_stay_consistent():
    world = comm.World(4)

    def fn(r):
        out = []
        for i in range(50):
            out.append(float(F.allreduce(torch.tensor([float(r * 100 + i)]), None)))
        return out

    outs = _run_guarded(lambda: world.run(fn))
    want = [float(sum(r * 100 + i for r in range(4))) for i in range(50)]
    assert all(o == want for o in outs)


def test_collective_results_are_per_rank_buffers():
    world = comm.World(2)
    outs = _run_guarded(lambda: world.run(lambda r: F.allreduce(torch.ones(2), None)))
    outs[0].add_(1.0)
    assert outs[1].tolist() == [2.0, 2.0]


# =================================================================================================
# attention: pack_mask / _unpack_mask
# =================================================================================================
def _pack_ref(mask: torch.Tensor) -> list:
    """Python-int packing of a bool [n, n]: word w of row i = sum of bits j in [32w, 32w+32), as signed int32."""
    n = mask.shape[-1]
    rows = []
    for i in range(mask.shape[0]):
        words = []
        for w in range((n + 31) // 32):
            v = 0
            for j in range(32 * w, min(n, 32 * w + 32)):
                if bool(mask[i, j]):
                    v |= 1 << (j - 32 * w)
            words.append(v - (1 << 32) if v >= 1 << 31 else v)
        rows.append(words)
    return rows


@pytest.mark.parametrize("n", [1, 9, 33, 40])
def test_pack_mask_round_trip(n):
    g = _gen(30 + n)
    m = torch.rand(2, n, n, generator=g) < 0.5
    if n > 31:
        m[:, :, 31] = True                                  # bit 31: the sign bit of word 0
    packed = pack_mask(m)
    assert packed.dtype == torch.int32 and packed.shape == (2, n, (n + 31) // 32)
    for b in range(2):
        assert packed[b].tolist() == _pack_ref(m[b])
        assert torch.equal(_unpack_mask(packed[b], n), m[b])
    if n > 31:
        assert (packed[:, :, 0] < 0).all()
    # chain (lower triangular) and all-ones masks
    tri = torch.ones(n, n, dtype=torch.bool).tril()
    assert torch.equal(_unpack_mask(pack_mask(tri), n), tri)
    full = torch.ones(n, n, dtype=torch.bool)
    pf = pack_mask(full)
    assert torch.equal(_unpack_mask(pf, n), full)
    if n >= 32:
        assert int(pf[0, 0]) == -1


def test_unpack_mask_reads_only_the_first_n_rows():
    m = torch.ones(5, 5, dtype=torch.bool).tril()
    packed = pack_mask(m)
    assert torch.equal(_unpack_mask(packed, 3), m[:3, :3])


# =================================================================================================
# attention: gpt_attention against a dense reference
# =================================================================================================
def _rope_ref(x: torch.Tensor, pos: list, rot: int, base: float) -> torch.Tensor:
    """Rotate-half RoPE in float64 with explicit per-pair angles. x [n, heads, D] float64."""
    out = x.clone()
    half = rot // 2
    for t, p in enumerate(pos):
        for i in range(half):
            theta = p * base ** (-2.0 * i / rot)
            c, s = math.cos(theta), math.sin(theta)
            a, b = x[t, :, i], x[t, :, i + half]
            out[t, :, i] = a * c - b * s
            out[t, :, i + half] = b * c + a * s
    return out


def _dense_ref(q, keys, vals, allowed, scale, H, Hkv):
    """q [n, H, D], keys/vals [L, Hkv, D] (float64, post-RoPE), allowed [n, L] bool -> [n, H, D]."""
    n, L = allowed.shape
    g = H // Hkv
    out = torch.zeros(n, H, q.shape[-1], dtype=torch.float64)
    for i in range(n):
        for h in range(H):
            kv = h // g
            js = [j for j in range(L) if allowed[i, j]]
            s = torch.stack([(q[i, h] * keys[j, kv]).sum() * scale for j in js])
            p = torch.exp(s - s.max())
            p = p / p.sum()
            for w, j in zip(p, js):
                out[i, h] += w * vals[j, kv]
    return out


class PagedSim:
    """One KV pool filled over several gpt_attention calls, next to a dense per-request history.

    Blocks come from a shuffled free list in the order requests need them (so every request's blocks
    are scattered and interleaved with the others'); offsets in TensorRT-LLM's index: K at block * layers * 2, V one
    further (the pool is [blocks, layers, 2, Hkv, tpb, D])."""

    def __init__(self, *, H, Hkv, D, rot, tpb, num_blocks=24, num_layers=2, dtype=torch.float32, seed=0,
                 base=10000.0, q_scaling=1.0, windows=(10_000, 10_000), mapping=((0, 0), (0, 1)),
                 pos_type=PositionEmbeddingType.rope_gpt_neox):
        self.H, self.Hkv, self.D, self.rot, self.tpb = H, Hkv, D, rot, tpb
        self.dtype, self.base, self.q_scaling = dtype, base, q_scaling
        self.windows, self.mapping, self.pos_type = list(windows), [list(m) for m in mapping], pos_type
        self.g = _gen(seed)
        self.pool = KVCachePool(num_blocks, num_layers, Hkv, tpb, D, dtype)
        self.free = torch.randperm(num_blocks, generator=self.g).tolist()
        self.blocks: dict = {}
        self.hist: dict = {}         # (req, layer) -> [K rows (float64 [Hkv, D], post-RoPE)], [V rows]
        self.length: dict = {}
        self.prompt: dict = {}       # req -> tokens its context calls consumed (TensorRT-LLM's context length)
        self.pending_prompt: dict = {}

    def _ensure(self, req, length):
        b = self.blocks.setdefault(req, [])
        while len(b) * self.tpb < length:
            b.append(self.free.pop())

    def offsets(self, reqs, max_blocks=None):
        mb = max_blocks or max(len(self.blocks[r]) for r in reqs)
        out = torch.zeros(1, len(reqs), 2, mb, dtype=torch.int32)
        for i, r in enumerate(reqs):
            blk = torch.tensor(self.blocks[r], dtype=torch.int32)
            out[0, i, 0, :len(blk)] = blk * (2 * self.pool.num_layers)
            out[0, i, 1, :len(blk)] = blk * (2 * self.pool.num_layers) + 1
        return out

    def build(self, reqs, layer_idx=0, mask_type=AttentionMaskType.causal, spec=False, ctx_past_kv="stock",
              width=None, pad_rows=0):
        """reqs: list of dicts {id, n, gen: bool, offsets: list (spec), mask: bool [n, n] (spec)}, context
        requests first. The inputs are encoded as TensorRT-LLM 1.2's batch manager fills them:

        - context request: ``host_context_lengths`` = n (the chunk), ``sequence_length`` = chunk start + n,
          ``host_past_key_value_lengths`` = ``ctx_past_kv``: "stock" (chunk start + n, what TensorRT-LLM
          writes), "start" (the chunk start) or an int (anything: it must not be read);
        - generation request: ``sequence_length`` = committed + n, ``host_past_key_value_lengths`` = committed,
          ``host_context_lengths`` = prompt length + K (n = K + 1; what the runtime feeds, as TensorRT-LLM's
          generation_mixin does): it must not be read;
        - spec tensors for the G generation requests only, indexed by g: ``spec_decoding_generation_lengths
          [G]``, ``spec_decoding_position_offsets [G, width]`` (width = K+1, default the longest generation
          request) and ``spec_decoding_packed_mask [num_gen_tokens, ceil(width/32)]``, the generation
          requests' rows back to back. ``pad_rows`` > 0 appends that many garbage rows to each of them (rows
          past G / past num_gen_tokens: they must not be read)."""
        H, Hkv, D = self.H, self.Hkv, self.D
        kinds = [r["gen"] for r in reqs]
        assert kinds == sorted(kinds), "context requests first"
        past = [self.length.get(r["id"], 0) for r in reqs]
        for r, p in zip(reqs, past):
            self._ensure(r["id"], p + r["n"])
        T = sum(r["n"] for r in reqs)
        qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=self.g).to(self.dtype)
        gens = [r for r in reqs if r["gen"]]
        G, n_gen_tokens = len(gens), sum(r["n"] for r in gens)
        width = width or max([r["n"] for r in gens], default=1)
        W = (width + 31) // 32
        pos_off = torch.randint(-5, 50, (G + pad_rows, width), generator=self.g, dtype=torch.int32)
        packed = torch.randint(-2**31, 2**31 - 1, (n_gen_tokens + pad_rows, W), generator=self.g,
                               dtype=torch.int32)
        gen_len = torch.randint(1, width + 1, (G + pad_rows,), generator=self.g, dtype=torch.int32)
        row = 0
        for gi, r in enumerate(gens):
            gen_len[gi] = r["n"]
            if spec:
                pos_off[gi, :r["n"]] = torch.tensor(r["offsets"], dtype=torch.int32)
                words = torch.tensor(_pack_ref(r["mask"]), dtype=torch.int32)
                packed[row:row + r["n"]] = 0
                packed[row:row + r["n"], :words.shape[1]] = words
            else:
                assert r["n"] == 1, "generation without spec decoding owns one token"
            row += r["n"]
        ctx_len, past_kv = [], []
        for r, p in zip(reqs, past):
            if r["gen"]:
                ctx_len.append(self.prompt[r["id"]] + r["n"] - 1)       # prompt + K, as the runtime feeds
                past_kv.append(p)
            else:
                ctx_len.append(r["n"])
                past_kv.append({"stock": p + r["n"], "start": p}.get(ctx_past_kv, ctx_past_kv))
        kw = dict(
            qkv=qkv,
            sequence_length=torch.tensor([p + r["n"] for p, r in zip(past, reqs)], dtype=torch.int32),
            host_past_key_value_lengths=torch.tensor(past_kv, dtype=torch.int32),
            host_max_attention_window_sizes=torch.tensor(self.windows, dtype=torch.int32),
            host_sink_token_length=torch.zeros(1, dtype=torch.int32),
            context_lengths=torch.tensor(ctx_len, dtype=torch.int32),
            host_context_lengths=torch.tensor(ctx_len, dtype=torch.int32),
            host_request_types=torch.tensor([1 if r["gen"] else 0 for r in reqs], dtype=torch.int32),
            layer_idx=layer_idx, num_heads=H, num_kv_heads=Hkv, hidden_size_per_head=D, q_scaling=self.q_scaling,
            rotary_embedding_dim=self.rot, rotary_embedding_base=self.base, position_embedding_type=self.pos_type,
            mask_type=mask_type, kv_cache_block_offsets=self.offsets([r["id"] for r in reqs]),
            host_kv_cache_pool_pointers=torch.tensor([[self.pool.handle, 0]], dtype=torch.int64),
            host_kv_cache_pool_mapping=torch.tensor(self.mapping, dtype=torch.int32),
            spec_decoding_position_offsets=pos_off, spec_decoding_packed_mask=packed,
            spec_decoding_generation_lengths=gen_len,
            spec_decoding_use=torch.tensor([1 if spec else 0], dtype=torch.int32),
            spec_decoding_max_generation_length=width, spec_decoding_is_generation_length_variable=True)
        for r in reqs:                                          # prompt length: what context calls consumed
            if not r["gen"]:
                self.pending_prompt[r["id"]] = self.prompt.get(r["id"], 0) + r["n"]
        return kw, past

    def reference(self, kw, reqs, past, layer_idx, mask_type, spec):
        """Dense reference of one call; appends the new tokens to the histories."""
        H, Hkv, D = self.H, self.Hkv, self.D
        rot = self.rot if self.pos_type == PositionEmbeddingType.rope_gpt_neox else 0
        scale = 1.0 / (math.sqrt(D) * self.q_scaling)
        window = self.windows[layer_idx]
        outs, t0 = [], 0
        for r, p0 in zip(reqs, past):
            n = r["n"]
            x = kw["qkv"][t0:t0 + n].double()
            t0 += n
            q = x[:, :H * D].reshape(n, H, D)
            k = x[:, H * D:(H + Hkv) * D].reshape(n, Hkv, D)
            v = x[:, (H + Hkv) * D:].reshape(n, Hkv, D)
            if spec and r["gen"]:
                pos = [p0 + o for o in r["offsets"]]
                new_mask = r["mask"]
            else:
                pos = [p0 + i for i in range(n)]
                if mask_type == AttentionMaskType.bidirectional:
                    new_mask = torch.ones(n, n, dtype=torch.bool)
                else:
                    new_mask = torch.tensor([[j <= i for j in range(n)] for i in range(n)])
            q, k = _rope_ref(q, pos, rot, self.base), _rope_ref(k, pos, rot, self.base)
            ks, vs = self.hist.setdefault((r["id"], layer_idx), ([], []))
            ks.extend(k[i] for i in range(n))
            vs.extend(v[i] for i in range(n))
            keys, vals = torch.stack(ks), torch.stack(vs)           # contiguous [p0 + n, Hkv, D]
            assert keys.shape[0] == p0 + n
            allowed = torch.zeros(n, p0 + n, dtype=torch.bool)
            for i in range(n):
                for j in range(p0 + n):
                    seen = True if j < p0 else bool(new_mask[i, j - p0])
                    allowed[i, j] = seen and (pos[i] - j) < window
            outs.append(_dense_ref(q, keys, vals, allowed, scale, H, Hkv))
            self.length[r["id"]] = p0 + n
            if not r["gen"]:
                self.prompt[r["id"]] = self.pending_prompt[r["id"]]
        return outs

    def step(self, reqs, *, layer_idx=0, mask_type=AttentionMaskType.causal, spec=False, atol=1e-5, **build):
        kw, past = self.build(reqs, layer_idx, mask_type, spec, **build)
        out, present = gpt_attention(**kw)
        assert present is None
        assert out.shape == (kw["qkv"].shape[0], self.H * self.D) and out.dtype == self.dtype
        refs = self.reference(kw, reqs, past, layer_idx, mask_type, spec)
        t0 = 0
        for r, ref in zip(reqs, refs):
            got = out[t0:t0 + r["n"]].double().reshape(r["n"], self.H, self.D)
            t0 += r["n"]
            err = (got - ref).abs().max().item()
            assert err <= atol, f"request {r['id']}: max error {err} > {atol}"
        return out, kw

    def check_pool_layout(self, req, layer_idx, atol):
        """K of position t at [block, layer, 0], V at [block, layer, 1] (block = blocks[t // tpb], slot t % tpb)."""
        layer = self.mapping[layer_idx][1]
        ks, vs = self.hist[(req, layer_idx)]
        for t in range(len(ks)):
            blk, slot = self.blocks[req][t // self.tpb], t % self.tpb
            assert torch.allclose(self.pool.data[blk, layer, 0, :, slot].double(), ks[t], atol=atol)
            assert torch.allclose(self.pool.data[blk, layer, 1, :, slot].double(), vs[t], atol=atol)


def _tree(n: int, g: torch.Generator):
    """Random tree over n tokens (token 0 the root): ancestor-or-self mask and depths."""
    parent = [-1] + [int(torch.randint(0, j, (1,), generator=g)) for j in range(1, n)]
    mask = torch.zeros(n, n, dtype=torch.bool)
    depth = []
    for i in range(n):
        a, d = i, 0
        while a >= 0:
            mask[i, a] = True
            a = parent[a]
            d += 1
        depth.append(d - 1)
    return mask, depth


def _chain(n: int):
    return torch.ones(n, n, dtype=torch.bool).tril(), list(range(n))


@pytest.mark.parametrize("H,Hkv", [(4, 1), (2, 2)])
def test_gpt_attention_paged_multi_call_fp32(H, Hkv):
    sim = PagedSim(H=H, Hkv=Hkv, D=8, rot=8, tpb=3, seed=H * 10 + Hkv, q_scaling=1.25)
    # call 1: a batch of context requests (causal), lengths not multiples of tokens_per_block
    sim.step([{"id": "a", "n": 7, "gen": False}, {"id": "b", "n": 4, "gen": False},
              {"id": "c", "n": 1, "gen": False}])
    # call 2: a chunk (past > 0) next to a fresh prompt
    sim.step([{"id": "a", "n": 5, "gen": False}, {"id": "d", "n": 8, "gen": False}])
    # call 3: context request + generation requests with spec decoding (chain and random tree)
    g = _gen(99)
    cm, co = _chain(4)
    tm, to = _tree(6, g)
    sim.step([{"id": "e", "n": 3, "gen": False},
              {"id": "a", "n": 4, "gen": True, "mask": cm, "offsets": co},
              {"id": "b", "n": 6, "gen": True, "mask": tm, "offsets": to},
              {"id": "d", "n": 1, "gen": True, "mask": torch.ones(1, 1, dtype=torch.bool), "offsets": [0]}],
             spec=True)
    # call 4: plain generation (no spec decoding), one token each
    sim.step([{"id": "c", "n": 1, "gen": True}, {"id": "a", "n": 1, "gen": True}])
    # the blocks really are scattered (not one contiguous run per request)
    assert any(b != list(range(b[0], b[0] + len(b))) for b in sim.blocks.values() if len(b) > 1)
    for req in "abcde":
        sim.check_pool_layout(req, 0, atol=1e-5)
    assert (sim.pool.data[:, 1] == 0).all()                   # layer 1 untouched ([blocks, layers, 2, ...])


def test_gpt_attention_context_past_kv_length_sizes_but_does_not_place():
    """A context chunk's host_past_key_value_lengths holds chunk start + chunk length in TensorRT-LLM (== its
    sequence_length). The chunk's start comes from sequence_length - host_context_lengths; the plugin only sizes
    its key range from host_past_key_value_lengths (max over the part, api_1_2.yaml
    gpt_attention_plugin_launch_sizes). So a larger value changes nothing, and one below the part's longest
    sequence is refused on the CPU (a device plan, sized from it, would drop keys)."""
    sim = PagedSim(H=4, Hkv=2, D=8, rot=8, tpb=3, seed=11)
    sim.step([{"id": "a", "n": 5, "gen": False}, {"id": "b", "n": 4, "gen": False}])
    reqs = [{"id": "a", "n": 4, "gen": False}, {"id": "c", "n": 3, "gen": False},
            {"id": "b", "n": 1, "gen": True}]
    kw, past = sim.build(reqs, ctx_past_kv="stock")
    assert past == [5, 0, 4]
    assert kw["host_past_key_value_lengths"].tolist() == [9, 3, 4]         # stock: chunk start + chunk length
    assert kw["host_past_key_value_lengths"][:2].tolist() == kw["sequence_length"][:2].tolist()
    assert kw["host_context_lengths"].tolist() == [4, 3, 4]                # b: prompt + K (K = 0), not 1
    saved = sim.pool.data.clone()
    outs, pools = [], []
    for hpkv in ([9, 3, 4], [9, 0, 4], [10**6, 7, 4]):        # stock, a short chunk's below its length, larger
        sim.pool.data.copy_(saved)
        outs.append(gpt_attention(**{**kw, "host_past_key_value_lengths": torch.tensor(hpkv, dtype=torch.int32)})[0])
        pools.append(sim.pool.data.clone())
    for hpkv in ([5, 0, 4], [0, 0, 4], [9, 3, 0]):              # the chunk starts; a generation request's too short
        with pytest.raises(ValueError, match="host_past_key_value_lengths gives them"):
            gpt_attention(**{**kw, "host_past_key_value_lengths": torch.tensor(hpkv, dtype=torch.int32)})
    for o, d in zip(outs[1:], pools[1:]):
        assert torch.equal(o, outs[0]) and torch.equal(d, pools[0])
    refs = sim.reference(kw, reqs, past, 0, AttentionMaskType.causal, False)
    t0 = 0
    for r, ref in zip(reqs, refs):
        got = outs[0][t0:t0 + r["n"]].double().reshape(r["n"], sim.H, sim.D)
        t0 += r["n"]
        assert (got - ref).abs().max() <= 1e-5, r["id"]
    for req in "abc":
        sim.check_pool_layout(req, 0, atol=1e-5)
    # the chunk really sits at 5: read as a fresh prompt (start 0) its output differs
    sim.pool.data.copy_(saved)
    as_prompt = {**kw, "sequence_length": torch.tensor([4, 3, 5], dtype=torch.int32)}
    assert not torch.allclose(gpt_attention(**as_prompt)[0][:4], outs[0][:4])


def test_gpt_attention_generation_only_spec_tensors_exactly_g_rows():
    """A generation-only batch with spec decoding: generation lengths [G], position offsets [G, K+1] (K+1
    wider than the longest request) and the packed mask [num_gen_tokens, words] with no spare row; one
    request has 34 tokens, so its rows take two words."""
    sim = PagedSim(H=4, Hkv=1, D=8, rot=8, tpb=4, seed=12, num_blocks=40)
    sim.step([{"id": "a", "n": 6, "gen": False}, {"id": "b", "n": 9, "gen": False},
              {"id": "c", "n": 2, "gen": False}])
    g = _gen(13)
    tm, to = _tree(34, g)
    tm[33, 31] = True                               # bit 31 of word 0 (the sign bit) in a row of word 1 too
    cm, co = _chain(5)
    reqs = [{"id": "a", "n": 34, "gen": True, "mask": tm, "offsets": to},
            {"id": "b", "n": 5, "gen": True, "mask": cm, "offsets": co},
            {"id": "c", "n": 1, "gen": True, "mask": torch.ones(1, 1, dtype=torch.bool), "offsets": [0]}]
    _, kw = sim.step(reqs, spec=True, width=36)
    assert kw["spec_decoding_generation_lengths"].tolist() == [34, 5, 1]
    assert kw["spec_decoding_position_offsets"].shape == (3, 36)
    assert kw["spec_decoding_packed_mask"].shape == (40, 2)
    assert (kw["spec_decoding_packed_mask"][:34, 0] < 0).any()
    # then a second step: requests in another order, other lengths (row starts move)
    tm2, to2 = _tree(7, g)
    reqs2 = [{"id": "c", "n": 7, "gen": True, "mask": tm2, "offsets": to2},
             {"id": "a", "n": 2, "gen": True, "mask": _chain(2)[0], "offsets": [0, 1]}]
    _, kw2 = sim.step(reqs2, spec=True)
    assert kw2["spec_decoding_position_offsets"].shape == (2, 7)
    assert kw2["spec_decoding_packed_mask"].shape == (9, 1)
    for req in "abc":
        sim.check_pool_layout(req, 0, atol=1e-5)


def test_gpt_attention_spec_rows_past_g_not_read():
    """Spec tensors with garbage rows after the G generation requests' rows (and after the last generation
    token's mask row) in a batch that starts with context requests: only the generation rows are read."""
    sim = PagedSim(H=2, Hkv=1, D=8, rot=8, tpb=3, seed=14)
    sim.step([{"id": "a", "n": 4, "gen": False}, {"id": "b", "n": 5, "gen": False}])
    tm, to = _tree(5, _gen(15))
    reqs = [{"id": "c", "n": 3, "gen": False}, {"id": "d", "n": 2, "gen": False},
            {"id": "a", "n": 5, "gen": True, "mask": tm, "offsets": to},
            {"id": "b", "n": 3, "gen": True, "mask": _chain(3)[0], "offsets": [0, 1, 2]}]
    _, kw = sim.step(reqs, spec=True, pad_rows=3)
    assert kw["spec_decoding_position_offsets"].shape == (5, 5)
    assert kw["spec_decoding_packed_mask"].shape == (11, 1)


def test_gpt_attention_bidirectional_rotary_dim_window_and_layer_mapping():
    # layer_idx 1 -> pool layer 0 (mapping permuted); its window (3) is looked up by layer_idx
    sim = PagedSim(H=4, Hkv=2, D=8, rot=4, tpb=4, seed=5, windows=(10_000, 3), mapping=((0, 1), (0, 0)),
                   base=500.0)
    sim.step([{"id": "a", "n": 9, "gen": False}, {"id": "b", "n": 2, "gen": False}], layer_idx=1)
    sim.step([{"id": "a", "n": 3, "gen": False}], layer_idx=1, ctx_past_kv=12345)   # chunk under the window (a
    # larger host_past_key_value_lengths only sizes the key range: nothing changes)
    sim.step([{"id": "b", "n": 5, "gen": False}], layer_idx=1, mask_type=AttentionMaskType.bidirectional)
    cm, co = _chain(3)
    sim.step([{"id": "a", "n": 3, "gen": True, "mask": cm, "offsets": co}], layer_idx=1, spec=True)
    sim.check_pool_layout("a", 1, atol=1e-5)
    assert (sim.pool.data[:, 1] == 0).all()
    # the window really masked something: without it the output differs
    sim2 = PagedSim(H=4, Hkv=2, D=8, rot=4, tpb=4, seed=5, windows=(10_000, 10_000), mapping=((0, 1), (0, 0)),
                    base=500.0)
    kw1, _ = PagedSim(H=4, Hkv=2, D=8, rot=4, tpb=4, seed=5, windows=(10_000, 3), mapping=((0, 1), (0, 0)),
                      base=500.0).build([{"id": "a", "n": 9, "gen": False}], layer_idx=1)
    kw2, _ = sim2.build([{"id": "a", "n": 9, "gen": False}], layer_idx=1)
    assert torch.equal(kw1["qkv"], kw2["qkv"])
    assert not torch.allclose(gpt_attention(**kw1)[0], gpt_attention(**kw2)[0])


def test_gpt_attention_no_rope_and_rotary_dim_zero():
    sim = PagedSim(H=2, Hkv=1, D=4, rot=4, tpb=2, seed=6, pos_type=PositionEmbeddingType.learned_absolute)
    sim.step([{"id": "a", "n": 5, "gen": False}])
    sim.step([{"id": "a", "n": 2, "gen": False}])
    with pytest.raises(ValueError, match="host_past_key_value_lengths"):   # the chunk start there: refused
        sim.step([{"id": "c", "n": 2, "gen": False}, {"id": "a", "n": 2, "gen": False}], ctx_past_kv="start")


def test_gpt_attention_bf16():
    sim = PagedSim(H=4, Hkv=1, D=16, rot=16, tpb=5, seed=7, dtype=torch.bfloat16)
    sim.step([{"id": "a", "n": 11, "gen": False}, {"id": "b", "n": 6, "gen": False}], atol=3e-2)
    tm, to = _tree(5, _gen(3))
    sim.step([{"id": "a", "n": 5, "gen": True, "mask": tm, "offsets": to},
              {"id": "b", "n": 2, "gen": True, "mask": _chain(2)[0], "offsets": [0, 1]}], spec=True, atol=3e-2)
    sim.check_pool_layout("a", 0, atol=3e-2)


def test_gpt_attention_wrong_block_offset_changes_output():
    sim = PagedSim(H=2, Hkv=1, D=8, rot=8, tpb=3, seed=8)
    sim.step([{"id": "a", "n": 8, "gen": False}, {"id": "b", "n": 6, "gen": False}])
    kw, past = sim.build([{"id": "a", "n": 1, "gen": True}])
    saved = sim.pool.data.clone()
    good, _ = gpt_attention(**kw)
    ref = sim.reference(kw, [{"id": "a", "n": 1, "gen": True}], past, 0, AttentionMaskType.causal, False)[0]
    assert (good.double().reshape(1, 2, 8) - ref).abs().max() < 1e-5
    for mutate in ("swap_k", "swap_v", "other_request"):
        sim.pool.data.copy_(saved)
        bad = {**kw, "kv_cache_block_offsets": kw["kv_cache_block_offsets"].clone()}
        o = bad["kv_cache_block_offsets"][0, 0]
        # (exchanging whole blocks, K and V together, only permutes the keys: attention cannot see that)
        if mutate in ("swap_k", "swap_v"):        # K (or V) blocks 0 and 1 exchanged: not TensorRT-LLM's index, where
            kv = 0 if mutate == "swap_k" else 1   # a block's V offset is its K offset + 1; refused, not misread
            o[kv, [0, 1]] = o[kv, [1, 0]]
            with pytest.raises(IndexError, match="not TensorRT-LLM's index"):
                gpt_attention(**bad)
            continue
        two_l = 2 * sim.pool.num_layers           # block 0 points at a block of request b: a valid index, wrong data
        o[0, 0], o[1, 0] = two_l * sim.blocks["b"][0], two_l * sim.blocks["b"][0] + 1
        out, _ = gpt_attention(**bad)
        assert (out - good).abs().max() > 1e-3, mutate


def test_gpt_attention_pool_has_trtllms_layout_and_block_index():
    """TensorRT-LLM's primary pool: [blocks, layers, 2, Hkv, tpb, D], a block offset block * layers * 2 + field, and
    layer l of the pool at sub-block offset + 2 * l (the attention plugin's pointer arithmetic)."""
    pool = KVCachePool(3, 2, 1, 2, 2, torch.float32)               # 3 blocks, 2 layers
    qkv = torch.tensor([[0.0, 0.0, 1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 5.0, 6.0, 7.0, 8.0],
                        [0.0, 0.0, 9.0, 10.0, 11.0, 12.0]])       # H = Hkv = 1, D = 2: q | k | v
    offs = torch.tensor([[[[8, 0], [9, 1]]]], dtype=torch.int32)  # block 2 (2 * 2 * 2) then block 0
    gpt_attention(qkv=qkv, sequence_length=torch.tensor([3]), host_past_key_value_lengths=torch.tensor([3]),
                  host_context_lengths=torch.tensor([3]),
                  host_max_attention_window_sizes=torch.tensor([100, 100]), host_request_types=torch.tensor([0]),
                  layer_idx=1, num_heads=1, num_kv_heads=1, hidden_size_per_head=2,
                  position_embedding_type=PositionEmbeddingType.learned_absolute, kv_cache_block_offsets=offs,
                  host_kv_cache_pool_pointers=torch.tensor([[pool.handle, 0]]),
                  host_kv_cache_pool_mapping=torch.tensor([[0, 0], [0, 1]]))
    d = pool.data[:, :, :, 0]                                      # [3 blocks, 2 layers, K|V, tpb 2, D 2]
    assert d[2, 1, 0].tolist() == [[1.0, 2.0], [5.0, 6.0]]         # K of block 2, pool layer 1
    assert d[2, 1, 1].tolist() == [[3.0, 4.0], [7.0, 8.0]]         # its V
    assert d[0, 1, 0].tolist() == [[9.0, 10.0], [0.0, 0.0]]        # K of token 2 in block 0, slot 0
    assert d[0, 1, 1].tolist() == [[11.0, 12.0], [0.0, 0.0]]
    assert (d[:, 0] == 0).all() and (d[1] == 0).all()             # layer 0 and block 1 untouched
    flat = pool.data.view(-1, 1, 2, 2)                             # the same bytes as sub-blocks
    assert torch.equal(flat[8 + 2 * 1], pool.data[2, 1, 0]) and torch.equal(flat[9 + 2 * 1], pool.data[2, 1, 1])
    pool.release()
    with pytest.raises(ValueError, match="no KV pool"):
        KVCachePool.from_handle(pool.handle)


def _small_call(**over):
    H, Hkv, D = 2, 1, 4
    pool = over.pop("pool", None) or KVCachePool(4, 1, Hkv, 4, D, torch.float32)
    kw = dict(qkv=torch.randn(3, (H + 2 * Hkv) * D, generator=_gen(0)), sequence_length=torch.tensor([3]),
              host_context_lengths=torch.tensor([3]), host_past_key_value_lengths=torch.tensor([3]),
              host_max_attention_window_sizes=torch.tensor([100]),
              host_request_types=torch.tensor([0]), layer_idx=0, num_heads=H, num_kv_heads=Hkv,
              hidden_size_per_head=D, rotary_embedding_dim=D,
              position_embedding_type=PositionEmbeddingType.rope_gpt_neox,
              kv_cache_block_offsets=torch.tensor([[[[0], [1]]]], dtype=torch.int32),
              host_kv_cache_pool_pointers=torch.tensor([[pool.handle, 0]]),
              host_kv_cache_pool_mapping=torch.tensor([[0, 0]]))
    kw.update(over)
    return gpt_attention(**kw)


def test_gpt_attention_errors():
    _small_call()                                              # the base call is valid
    with pytest.raises(IndexError, match="outside the pool"):
        _small_call(kv_cache_block_offsets=torch.tensor([[[[8], [9]]]], dtype=torch.int32))   # 4 blocks x 1 layer
    with pytest.raises(IndexError, match="outside the pool"):
        _small_call(kv_cache_block_offsets=torch.tensor([[[[-2], [-1]]]], dtype=torch.int32))
    with pytest.raises(IndexError, match="block offsets"):      # 5 tokens, 4 per block, one offset
        _small_call(qkv=torch.randn(5, 16), sequence_length=torch.tensor([5]), host_context_lengths=torch.tensor([5]),
                    host_past_key_value_lengths=torch.tensor([5]))
    with pytest.raises(IndexError, match="block offsets"):      # a 1-token chunk at 4: block 1, no offset
        _small_call(qkv=torch.randn(1, 16), sequence_length=torch.tensor([5]), host_context_lengths=torch.tensor([1]),
                    host_past_key_value_lengths=torch.tensor([5]))
    with pytest.raises(ValueError, match="qkv must be"):
        _small_call(qkv=torch.randn(3, 15))
    with pytest.raises(ValueError, match="qkv must be"):
        _small_call(qkv=torch.randn(3, 4, 4))
    with pytest.raises(ValueError, match="token"):              # more tokens than the requests own
        _small_call(qkv=torch.randn(4, 16))
    with pytest.raises(ValueError, match="token"):              # fewer
        _small_call(qkv=torch.randn(2, 16))
    with pytest.raises(ValueError, match="token"):              # old encoding: n = seq - past = 3, but the
        _small_call(host_context_lengths=torch.tensor([2]),     # context length (2) is what counts
                    host_past_key_value_lengths=torch.tensor([0]))
    with pytest.raises(ValueError, match="new tokens"):         # context length > sequence length
        _small_call(sequence_length=torch.tensor([2]))
    with pytest.raises(ValueError, match="new tokens"):
        _small_call(host_context_lengths=torch.tensor([-1]))
    gen = dict(host_request_types=torch.tensor([1]), host_context_lengths=torch.tensor([7]),
               spec_decoding_use=torch.tensor([1]), spec_decoding_generation_lengths=torch.tensor([3]),
               spec_decoding_position_offsets=torch.tensor([[0, 1, 2]], dtype=torch.int32),
               spec_decoding_packed_mask=pack_mask(torch.ones(3, 3, dtype=torch.bool).tril()),
               spec_decoding_max_generation_length=3, spec_decoding_is_generation_length_variable=True)
    _small_call(**gen)                                          # a valid 3-token spec-decoding step at 0
    with pytest.raises(ValueError, match="new tokens"):         # generation length > sequence length
        _small_call(**{**gen, "sequence_length": torch.tensor([2])})
    with pytest.raises(ValueError, match="token"):              # 3 tokens, the request owns 2
        _small_call(**{**gen, "spec_decoding_generation_lengths": torch.tensor([2])})
    with pytest.raises(ValueError, match="spec-decoding positions"):   # 3 tokens, 2 position offsets
        _small_call(**{**gen, "spec_decoding_position_offsets": torch.tensor([[0, 1]], dtype=torch.int32)})
    # spec_decoding_use 0: the plugin takes one token per generation request (the first ones); the rest of its
    # output is undefined (zeros in the stand-in) -- only a discarded result (a context-only step's draft) may use it
    one = _small_call(**{**gen, "spec_decoding_use": torch.tensor([0])})[0]
    assert one.shape[0] == 3 and torch.equal(one[1:], torch.zeros_like(one[1:]))
    with pytest.raises(ValueError, match="token"):              # fewer tokens than the requests own
        _small_call(**{**gen, "qkv": torch.randn(0, 16), "spec_decoding_use": torch.tensor([0])})
    with pytest.raises(ValueError, match="no KV pool"):
        _small_call(host_kv_cache_pool_pointers=torch.tensor([[10**9, 0]]))


@pytest.mark.parametrize("over", [
    dict(rotary_embedding_scale_type=RotaryScalingType.linear),
    dict(rotary_embedding_scale=2.0),
    dict(attn_logit_softcapping_scale=30.0),
    dict(qkv_bias=torch.zeros(16)),
    dict(do_cross_attention=True),
    dict(use_cache=False),
    dict(position_embedding_type=PositionEmbeddingType.rope_gptj),
    dict(position_embedding_type=PositionEmbeddingType.alibi),
    dict(mask_type=AttentionMaskType.padding),
    dict(mask_type=AttentionMaskType.sliding_window_causal),
    dict(mask_type=AttentionMaskType.custom_mask),
    dict(tp_size=2),
    dict(cp_size=2),
], ids=lambda d: next(iter(d)))
def test_gpt_attention_unsupported_args_raise(over):
    with pytest.raises(NotImplementedError):
        _small_call(**over)


def test_gpt_attention_neutral_args_accepted_unknown_refused():
    base, _ = _small_call()
    for over in (dict(tp_rank=0), dict(alibi_slopes=None), dict(skip_attn=None)):
        assert torch.equal(_small_call(**over)[0], base)
    for over in (dict(beam_width=0), dict(some_flag=False), dict(qk_tanh_scale=0.0)):   # not TensorRT-LLM 1.2's
        with pytest.raises(TypeError, match="unexpected keyword"):
            _small_call(**over)


@pytest.mark.parametrize("over", [dict(tp_size=1), dict(vision_start=-1), dict(block_sparse_block_size=64)],
                         ids=lambda d: next(iter(d)))
def test_gpt_attention_trtllm_default_values_accepted(over):
    base, _ = _small_call()
    assert torch.equal(_small_call(**over)[0], base)


def test_gpt_attention_unknown_tensor_arg_not_implemented():
    with pytest.raises(NotImplementedError):
        _small_call(alibi_slopes=torch.ones(2))


def test_gpt_attention_nonzero_sink_tokens_not_implemented():
    with pytest.raises(NotImplementedError):
        _small_call(host_sink_token_length=torch.tensor([4], dtype=torch.int32))


def test_gpt_attention_kv_quant_mode_not_implemented():
    with pytest.raises(NotImplementedError):
        _small_call(kv_cache_quant_mode=2)


# =================================================================================================
# layers and module
# =================================================================================================
def _linear_ref(x, w):
    """x [..., in] @ w[out, in].T in float64 with explicit accumulation over `in`."""
    out = torch.zeros(*x.shape[:-1], w.shape[0], dtype=torch.float64)
    for k in range(x.shape[-1]):
        out += x[..., k:k + 1].double() * w[:, k].double()
    return out


@pytest.mark.parametrize("tp", [1, 2])
def test_column_linear_gather_and_not(tp):
    g = _gen(40 + tp)
    W = torch.randn(6, 5, generator=g)
    x = torch.randn(4, 5, generator=g)
    ref = _linear_ref(x, W)
    world = comm.World(tp)
    rows = 6 // tp

    def fn(r):
        out = []
        for gather in (True, False):
            lin = L.ColumnLinear(5, 6, bias=False, dtype="float32", tp_group=list(range(tp)), tp_size=tp,
                                 gather_output=gather)
            assert lin.weight.shape == (rows, 5)
            lin.weight.value = W[r * rows:(r + 1) * rows]
            out.append(raw(lin(x)))
        return out

    for r, (full, part) in enumerate(_run_guarded(lambda: world.run(fn))):
        assert full.shape == (4, 6) and torch.allclose(full.double(), ref, atol=1e-5)
        assert part.shape == (4, rows) and torch.allclose(part.double(), ref[:, r * rows:(r + 1) * rows], atol=1e-5)
    assert L.Linear is L.ColumnLinear
    with pytest.raises(ValueError, match="divisible"):
        L.ColumnLinear(5, 7, tp_size=2)
    # TensorRT-LLM's default is bias=True: the layer owns `bias` (so a checkpoint without it cannot load) and adds it
    lin = L.ColumnLinear(5, 6)
    assert lin.bias is not None and lin.bias.shape == (6,)
    lin.weight.value, lin.bias.value = W, torch.arange(6.0)
    assert torch.allclose(raw(lin(x)).double(), ref + torch.arange(6.0).double(), atol=1e-5)


@pytest.mark.parametrize("tp", [1, 2])
def test_row_linear_sums_partials(tp):
    g = _gen(50 + tp)
    W = torch.randn(5, 6, generator=g)
    x = torch.randn(3, 6, generator=g)
    ref = _linear_ref(x, W)
    cols = 6 // tp
    world = comm.World(tp)

    def fn(r):
        lin = L.RowLinear(6, 5, bias=False, tp_group=list(range(tp)), tp_size=tp)
        assert lin.weight.shape == (5, cols)
        lin.weight.value = W[:, r * cols:(r + 1) * cols]
        return raw(lin(x[:, r * cols:(r + 1) * cols]))

    outs = _run_guarded(lambda: world.run(fn))
    for o in outs:
        assert o.shape == (3, 5) and torch.allclose(o.double(), ref, atol=1e-5)
        assert torch.equal(o, outs[0])
    with pytest.raises(ValueError, match="divisible"):
        L.RowLinear(7, 5, tp_size=2)
    lin = L.RowLinear(6, 5)                                       # bias=True by default (TensorRT-LLM)
    assert lin.bias is not None and lin.bias.shape == (5,)


def test_embedding_and_rmsnorm_layers():
    g = _gen(60)
    W = torch.randn(8, 3, generator=g)
    ids = torch.tensor([7, 0, 4, 3], dtype=torch.int32)
    emb = L.Embedding(8, 3)
    emb.weight.value = W
    assert torch.equal(raw(emb(ids)), torch.stack([W[i] for i in ids.tolist()]))
    world = comm.World(2)

    def fn(r):
        e = L.Embedding(8, 3, tp_size=2, tp_group=[0, 1], sharding_dim=0, tp_rank=r)
        assert e.weight.shape == (4, 3)
        e.weight.value = W[4 * r:4 * r + 4]
        return raw(e(ids))

    for o in _run_guarded(lambda: world.run(fn)):
        assert torch.equal(o, W[ids.long()])
    e1 = L.Embedding(8, 4, tp_size=2, tp_group=[0, 1], sharding_dim=1, tp_rank=0)
    assert e1.weight.shape == (8, 2)
    e1.weight.value = torch.zeros(8, 2)
    with pytest.raises(NotImplementedError):
        e1(ids)

    x = torch.randn(3, 6, generator=g)
    norm = L.RmsNorm(6, eps=1e-5)
    w = torch.randn(6, generator=g)
    norm.weight.value = w
    assert torch.allclose(raw(norm(x)), _rms_ref(x, 1, 1e-5, w), atol=1e-6)
    plain = L.RmsNorm(6, eps=1e-5, elementwise_affine=False)
    assert plain.weight is None and list(dict(plain.named_parameters())) == []
    assert torch.allclose(raw(plain(x)), _rms_ref(x, 1, 1e-5), atol=1e-6)
    nb = L.RmsNorm(6, dtype="bfloat16")
    nb.weight.value = w                                           # cast to the parameter dtype
    assert nb.weight.value.dtype == torch.bfloat16


class _Block(Module):
    def __init__(self):
        super().__init__()
        self.attn = L.ColumnLinear(4, 6, bias=False, gather_output=False)
        self.norm = L.RmsNorm(4)
        self.scale = Parameter(shape=(2, 3), dtype="float32")


class _Tiny(PretrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed = L.Embedding(10, 4)
        self.layers = ModuleList([_Block(), _Block()])
        self.head = L.RowLinear(4, 10, bias=False)
        self.plain = L.RmsNorm(4, elementwise_affine=False)

    def forward(self, ids):
        x = self.embed(ids)
        for blk in self.layers:
            x = blk.norm(x)
        return self.head(x)


# pre-order: a module's own parameters first, then its sub-modules' in attribute order
_TINY_NAMES = ["embed.weight", "layers.0.scale", "layers.0.attn.weight", "layers.0.norm.weight",
               "layers.1.scale", "layers.1.attn.weight", "layers.1.norm.weight", "head.weight"]


def _tiny_weights(seed=0):
    g = _gen(seed)
    model = _Tiny(PretrainedConfig())
    return {n: torch.randn(*p.shape, generator=g) for n, p in model.named_parameters()}


def test_module_named_parameters_and_modules():
    model = _Tiny(PretrainedConfig(architecture="x", extra_key=3))
    names = [n for n, _ in model.named_parameters()]
    assert names == _TINY_NAMES
    assert dict(model.named_parameters())["layers.1.attn.weight"] is model.layers[1].attn.weight
    mods = [n for n, _ in model.named_modules()]
    assert mods[0] == "" and "layers.0.attn" in mods and "layers.1.norm" in mods and "plain" in mods
    assert len(model.layers) == 2 and list(model.layers) == [model.layers[0], model.layers[1]]
    assert model.config.extra_key == 3 and model.config.mapping.tp_size == 1
    with pytest.raises(RuntimeError, match="never loaded"):
        model.head.weight.value
    assert not model.head.weight.is_loaded
    with pytest.raises(ValueError, match="shape"):
        model.head.weight.value = torch.zeros(4, 10)


def test_pretrained_model_load_ok_and_errors():
    w = _tiny_weights()
    model = _Tiny(PretrainedConfig())
    model.load(w)
    for n, p in model.named_parameters():
        assert p.is_loaded and torch.equal(p.value, w[n])
    assert model(torch.tensor([1, 9])).shape == (2, 10)

    missing = {k: v for k, v in w.items() if k != "layers.0.scale"}
    with pytest.raises(CheckpointError, match="not provided") as ei:
        _Tiny(PretrainedConfig()).load(missing, source="rank0.safetensors")
    assert ei.value.tensor == "layers.0.scale" and str(ei.value.file) == "rank0.safetensors"

    extra = {**w, "layers.2.scale": torch.zeros(2, 3)}
    with pytest.raises(CheckpointError, match="does not use") as ei:
        _Tiny(PretrainedConfig()).load(extra)
    assert ei.value.tensor == "layers.2.scale"

    bad_shape = {**w, "head.weight": torch.zeros(4, 10)}
    with pytest.raises(CheckpointError, match="shape") as ei:
        _Tiny(PretrainedConfig()).load(bad_shape)
    assert ei.value.tensor == "head.weight"

    bad_dtype = {**w, "layers.1.norm.weight": w["layers.1.norm.weight"].bfloat16()}
    with pytest.raises(CheckpointError, match="dtype") as ei:
        _Tiny(PretrainedConfig()).load(bad_dtype)
    assert ei.value.tensor == "layers.1.norm.weight"


# =================================================================================================
# network helpers (trtllm/network/accept.py): counter_uniforms, inverse_cdf, leading_true
# =================================================================================================
@pytest.fixture(scope="module")
def net():
    from dflash2_trt.trtllm.backend import load_network

    return load_network("cpu")


def _uniform_ref(key: int, counter: int) -> float:
    """counter_uniforms in Python ints (unbounded: no overflow possible)."""
    P = 2**31 - 1
    x = (key * 1103515245 + counter * 2654435761 + 12345) % P
    for add in (1442695041, 2147483587, 1013904223):
        x = (x * 48271) % P
        x = (x * x + add) % P
    return (x // 256) / 2**23


def test_counter_uniforms_matches_python_ints_at_extremes(net):
    keys = [0, 1, 2**31 - 1, 2**31 - 2, 123456789, 2**30]
    counters = [0, 1, 2, 2**20 - 1, 2**20, 777]
    k = torch.tensor(keys, dtype=torch.int64)
    c = torch.tensor([counters] * len(keys), dtype=torch.int64)
    u = raw(net.counter_uniforms(k, c))
    assert u.dtype == torch.float32 and u.shape == (len(keys), len(counters))
    for i, kk in enumerate(keys):
        for j, cc in enumerate(counters):
            assert float(u[i, j]) == _uniform_ref(kk, cc), (kk, cc)
    # the key the network actually derives: rand_data_sample * 2**31 in fp32, cast to int64
    rs = torch.tensor([0.0, 0.5, 1.0 - 2**-24], dtype=torch.float32)
    key = F.cast(rs * float(2**31), "int64")
    assert int(key.max()) <= 2**31 - 1
    u2 = raw(net.counter_uniforms(key, torch.tensor([[3, 2**20]] * 3, dtype=torch.int64)))
    for i in range(3):
        for j, cc in enumerate([3, 2**20]):
            assert float(u2[i, j]) == _uniform_ref(int(key[i]), cc)


def test_counter_uniforms_deterministic_distinct_and_uniform(net):
    from scipy import stats

    g = _gen(70)
    keys = torch.randint(0, 2**31 - 1, (20,), generator=g, dtype=torch.int64)
    start = torch.randint(0, 2**20 - 1000, (20, 1), generator=g, dtype=torch.int64)
    counters = start + torch.arange(1000, dtype=torch.int64)[None]        # consecutive positions per key
    u = raw(net.counter_uniforms(keys, counters))
    assert torch.equal(u, raw(net.counter_uniforms(keys.clone(), counters.clone())))
    assert (u >= 0).all() and (u < 1).all()
    flat = u.reshape(-1).double().numpy()
    assert stats.kstest(flat, "uniform").pvalue > 1e-3
    assert len(np.unique(flat)) > 0.99 * flat.size                       # 23-bit values: few collisions
    # consecutive keys at one counter (the per-request axis)
    k2 = torch.arange(10**6, 10**6 + 20000, dtype=torch.int64)
    u2 = raw(net.counter_uniforms(k2, torch.full((20000, 1), 5, dtype=torch.int64))).reshape(-1).double().numpy()
    assert stats.kstest(u2, "uniform").pvalue > 1e-3
    # different keys give different sequences; different counters different values
    a = raw(net.counter_uniforms(torch.tensor([7, 8]), torch.arange(16)[None].expand(2, 16)))
    assert (a[0] != a[1]).sum() >= 15 and len(set(a[0].tolist())) >= 15
    # neighbouring counters are not strongly correlated
    assert abs(np.corrcoef(u[:, :-1].reshape(-1).numpy(), u[:, 1:].reshape(-1).numpy())[0, 1]) < 0.05


def _inverse_cdf_ref(probs: torch.Tensor, u: torch.Tensor) -> list:
    """Float64 walk: the first index whose running sum exceeds u * total; else the last index with mass."""
    out = []
    for row, uu in zip(probs.double().tolist(), u.double().tolist()):
        total = 0.0
        for p in row:
            total += p
        t = uu * total
        acc, pick = 0.0, None
        for i, p in enumerate(row):
            acc += p
            if acc > t:
                pick = i
                break
        if pick is None:
            pos = [i for i, p in enumerate(row) if p > 0]
            pick = pos[-1] if pos else -1
        out.append(pick)
    return out


def test_inverse_cdf_exact_dyadic_cases_and_fallback(net):
    # dyadic masses and u: fp32 and fp64 sums are exact, so ties (u * total == a cdf value) are decided
    # by the rule itself ("exceeds": the next index)
    probs = torch.tensor([[0.25, 0.25, 0.5, 0.0],
                          [0.25, 0.25, 0.5, 0.0],
                          [0.0, 0.5, 0.0, 0.5],
                          [0.0, 0.5, 0.0, 0.5],
                          [0.0, 0.5, 0.0, 0.5],
                          [1.0, 2.0, 1.0, 0.0],          # unnormalised
                          [0.2, 0.3, 0.5, 0.0],          # fallback: u * total reaches total
                          [0.2, 0.3, 0.5, 0.0],
                          [0.0, 0.0, 0.0, 0.0]])         # no mass: both give -1
    u = torch.tensor([0.5, 0.0, 0.0, 1.0 - 2**-24, 0.5, 0.75, 1.0, 1.0 + 2**-23, 0.3])
    got = raw(net.inverse_cdf(probs, u))
    want = _inverse_cdf_ref(probs, u)
    assert want == [2, 0, 1, 3, 3, 2, 2, 2, -1]
    assert got.tolist() == want
    from dflash2_trt.reference.verify import sample_from_probs

    assert sample_from_probs(probs, u).tolist() == want


def test_inverse_cdf_random_against_float64(net):
    g = _gen(71)
    N, V = 400, 37
    probs = torch.rand(N, V, generator=g)
    probs[torch.rand(N, V, generator=g) < 0.4] = 0.0                      # zeros in probs
    probs[0] = 0.0
    probs[0, 5] = 1.0                                                     # a single mass
    probs[1, :-1] = 0.0                                                   # mass only at the end
    u = torch.rand(N, generator=g)
    u[2] = 0.0
    got = raw(net.inverse_cdf(probs, u)).tolist()
    want = _inverse_cdf_ref(probs, u)
    # only rows where u * total is clearly away from every cumulative value (fp32 vs fp64 rounding)
    cdf = probs.double().cumsum(1)
    t = u.double() * cdf[:, -1]
    clear = ((cdf - t[:, None]).abs() > 1e-5 * cdf[:, -1:]).all(1)
    assert int(clear.sum()) > 0.95 * N
    for i in range(N):
        if clear[i]:
            assert got[i] == want[i], i
        assert probs[i, got[i]] > 0                                       # never a zero-mass index
    assert got[0] == 5 and got[1] == V - 1


def test_leading_true(net):
    g = _gen(72)
    ok = torch.rand(50, 7, generator=g) < 0.7
    ok[0] = True
    ok[1] = False
    ok[2, :] = True
    ok[2, 6] = False
    got = raw(net.leading_true(ok)).tolist()
    for i in range(50):
        n = 0
        while n < 7 and bool(ok[i, n]):
            n += 1
        assert got[i] == n
    assert got[0] == 7 and got[1] == 0 and got[2] == 6
    assert raw(net.leading_true(torch.tensor([[True], [False]]))).tolist() == [1, 0]


def test_gpt_attention_spec_mask_bits_above_the_diagonal_are_honoured():
    """XQA, the kernel of a speculative-decoding generation call, takes new key j as visible to new-token row i exactly
    when bit j of row i is set, with no causal term (engine/trtllm/facts/xqa_spec_decoding.yaml packed_mask, read in
    cpp/kernels/xqa/mha.cu): a drafter's bidirectional block is an all-ones mask. The stand-in reads the bits the same
    way: an all-ones block and a random full mask (bits above the diagonal) against the dense reference, and the
    all-ones block's rows differ from a causal block's but for the last."""
    from dflash2_trt.engine.trtllm.runtime_rules import facts

    rec = facts("xqa_spec_decoding")["packed_mask"]
    assert rec["bits_above_diagonal_honoured"] is True and rec["visibility_among_new_tokens"] == \
        "the packed-mask bit only" and rec["keys_per_row"] == "past + N"
    sim = PagedSim(H=4, Hkv=2, D=8, rot=8, tpb=4, seed=5)
    sim.step([{"id": "a", "n": 9, "gen": False}, {"id": "b", "n": 6, "gen": False}])
    g = _gen(3)
    full = torch.rand(5, 5, generator=g) < 0.5
    full |= torch.eye(5, dtype=torch.bool)
    assert bool(full.triu(1).any())
    ones = torch.ones(5, 5, dtype=torch.bool)
    saved = sim.pool.data.clone()
    reqs = [{"id": "a", "n": 5, "gen": True, "mask": ones, "offsets": list(range(5))},
            {"id": "b", "n": 5, "gen": True, "mask": full, "offsets": list(range(5))}]
    length, hist = dict(sim.length), {k: (list(v[0]), list(v[1])) for k, v in sim.hist.items()}
    out_ones, kw = sim.step(reqs, spec=True)                   # held to the dense reference of each mask
    # the same call with a causal block for request a: rows 0..3 see fewer keys, row 4 the same
    sim.pool.data.copy_(saved)
    sim.length, sim.hist = length, hist
    tri = _pack_ref(torch.ones(5, 5, dtype=torch.bool).tril())
    packed = kw["spec_decoding_packed_mask"].clone()
    packed[:5, :len(tri[0])] = torch.tensor(tri, dtype=torch.int32)
    out_tri = gpt_attention(**{**kw, "spec_decoding_packed_mask": packed})[0]
    diff = (out_ones[:5] - out_tri[:5]).abs().amax(1)
    assert bool((diff[:4] > 0).all()) and float(diff[4]) == 0.0
