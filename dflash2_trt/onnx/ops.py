"""The two DFlash2 operators in an ONNX graph: as TensorRT plugin nodes, or decomposed.

Both forms have the I/O contract of the plugins (``plugins/*/…Plugin.yaml``) and of the engine
network's calls (``dflash2_trt/trtllm/network/``):

- ``DFlash2DynamicConv(x [N, H], delta [N, K, H/G], base [K, H][, residual fp32 [N, H]])`` ->
  ``y [N, H]`` (x's dtype; fp32 ``residual + y`` when ``fuse_residual = 1``);
- ``DFlash2PairwiseScan(unary fp32 [B, L, K], cand_ids int32, proj_hidden [B, L, R], anchor int32 [B],
  pred_codebook [V, R], succ_codebook [V, R], temperature fp32 [B], uniforms fp32 [B, L])`` ->
  ``path_ids int32 [B, L], q fp32 [B, L, K]``.

Plugin nodes: op type = the plugin name, domain = its namespace (``dflash2``, where TensorRT's
ONNX parser looks the creator up), attributes = exactly the spec's, values checked and defaults
filled by :func:`dflash2_trt.plugins.attribute_values` (one source of names).

Decompositions (``--no-plugins``) use standard ONNX ops only and follow the plugins' stated math
(README of each plugin): the conv in fp32 tap by tap, each tap a product and a sum of its own; the
lattice as two codebook gathers and one batched MatMul; the walk unrolled over the L draft
positions, with the plugin's rules: ``sample`` mode walks greedily where ``T <= 0`` or ``T`` is not
finite (``T > 3e38``), inverse CDF with the last-positive fallback, ties to lower indices, Viterbi
backpointers to the lowest predecessor.

Silent failure mode (nothing would crash): reading the lattice row of the SAME candidate index at
every position instead of the row of the previous choice; tests/onnx pins both forms against the
reference walk.
"""

from __future__ import annotations

import numpy as np

from .. import plugins as _plugins
from .graph import ONNX_DTYPES, GraphBuilder

__all__ = ["SCAN_MODES", "dynamic_conv", "pairwise_scan", "plugin_node"]

SCAN_MODES = ("greedy", "sample", "viterbi")
_MAX_FINITE_T = 3.0e38  # pairwiseScanMath.h temperatureUsable: 0 < T <= 3e38


def plugin_node(g: GraphBuilder, plugin: str, inputs, n_outputs: int, *, name: str | None = None, **attrs):
    """One custom node standing for ``plugin`` (attributes from its YAML spec)."""
    spec = _plugins.load_spec(plugin)
    values = _plugins.attribute_values(plugin, **attrs)
    return g.op(spec.name, *inputs, outputs=n_outputs, domain=spec.namespace, name=name or spec.name, **values)


# ------------------------------------------------------------------------------------- the conv
def dynamic_conv(g: GraphBuilder, x: str, delta: str, base: str, *, hidden: int, block_size: int, kernel_size: int,
                 group_size: int, dtype: str, residual: str | None = None, use_plugins: bool = True,
                 name: str = "conv") -> str:
    """``y [N, H]`` in ``dtype`` (or fp32 ``residual + y`` when ``residual`` is given)."""
    if use_plugins:
        ins = [x, delta, base] + ([residual] if residual is not None else [])
        return plugin_node(g, "DFlash2DynamicConv", ins, 1, name=name, block_size=block_size,
                           kernel_size=kernel_size, group_size=group_size, fuse_residual=int(residual is not None))
    groups = hidden // group_size
    xf = g.cast(x, "float32", dtype)
    # coef[t, j, c] = base[j, c] + delta[t, j, c // G]: each group's value over its G contiguous channels
    d4 = g.reshape(g.cast(delta, "float32", dtype), [-1, kernel_size, groups, 1])
    d4 = g.op("Expand", d4, g.const([1, 1, 1, group_size], "int64", "shape"))
    coef = g.op("Add", g.unsqueeze(g.cast(base, "float32", dtype), [0]), g.reshape(d4, [-1, kernel_size, hidden]))
    y = g.op("Mul", g.gather(coef, 0, 1), xf)
    if kernel_size > 1:
        xb = g.reshape(xf, [-1, block_size, hidden])
        for j in range(1, kernel_size):
            # position s >= j of a block reads s - j of the SAME block; s < j reads zero padding
            shifted = g.slice(xb, [0], [block_size - j], [1])
            shifted = g.op("Pad", shifted, g.const([0, j, 0, 0, 0, 0], "int64", "pads"))
            y = g.op("Add", y, g.op("Mul", g.gather(coef, j, 1), g.reshape(shifted, [-1, hidden])))
    if residual is not None:
        return g.op("Add", residual, y)
    return g.cast(y, dtype, "float32")


# ------------------------------------------------------------------------------------- the scan
def pairwise_scan(g: GraphBuilder, unary: str, cand: str, proj: str, anchor: str, pred_cb: str, succ_cb: str,
                  temperature: str, uniforms: str, *, mode: str, length: int, top_k: int, dtype: str,
                  use_plugins: bool = True, outputs: tuple[str, str] | None = None) -> tuple[str, str]:
    """(path_ids int32 [B, L], q fp32 [B, L, K]); ``outputs`` names them."""
    if mode not in SCAN_MODES:
        raise ValueError(f"scan mode {mode!r} not in {SCAN_MODES}")
    if use_plugins:
        spec = _plugins.load_spec("DFlash2PairwiseScan")
        vals = _plugins.attribute_values("DFlash2PairwiseScan", mode=mode)
        ins = [unary, cand, proj, anchor, pred_cb, succ_cb, temperature, uniforms]
        ids, q = g.op(spec.name, *ins, outputs=list(outputs) if outputs else 2, domain=spec.namespace,
                      name=spec.name, **vals)
        return ids, q
    lattice = _lattice(g, unary, cand, proj, anchor, pred_cb, succ_cb, top_k=top_k, dtype=dtype)
    cand64 = g.cast(cand, "int64")
    if mode == "viterbi":
        idx = _viterbi(g, lattice, length, top_k)
        q = _one_hot(g, idx, top_k)
    else:
        idx, q = _walk(g, lattice, temperature, uniforms, length, top_k, sampled_mode=(mode == "sample"))
    ids = g.squeeze(g.op("GatherElements", cand64, g.unsqueeze(idx, [2]), axis=2), [2])
    ids_name, q_name = outputs if outputs else (None, None)
    ids = g.op("Cast", ids, to=ONNX_DTYPES["int32"], outputs=[ids_name] if ids_name else 1)
    if q_name:
        q = g.op("Identity", q, outputs=[q_name])
    return ids, q


def _lattice(g, unary, cand, proj, anchor, pred_cb, succ_cb, *, top_k, dtype):
    """S[b, l, p, c] = unary[b, l, c] + sum_r A[pred(b, l, p), r] * Hh[b, l, r] * Bc[cand[b, l, c], r]."""
    cand64 = g.cast(cand, "int64")
    a_row = g.op("Expand", g.reshape(g.cast(anchor, "int64"), [-1, 1, 1]),
                 g.op("Concat", g.dim(cand, 0), g.const([1, top_k], "int64", "shape"), axis=0))   # [B, 1, K]
    prev = g.slice(cand64, [0], [-1], [1])                                                         # [B, L-1, K]
    pred_ids = g.op("Concat", a_row, prev, axis=1)                                                 # [B, L, K]
    a = g.op("Gather", g.cast(pred_cb, "float32", dtype), pred_ids, axis=0)                        # [B, L, K, R]
    s = g.op("Gather", g.cast(succ_cb, "float32", dtype), cand64, axis=0)                          # [B, L, K, R]
    ctx = g.op("Mul", a, g.unsqueeze(g.cast(proj, "float32", dtype), [2]))
    pair = g.op("MatMul", ctx, g.op("Transpose", s, perm=[0, 1, 3, 2]))                            # [B, L, K, K]
    return g.op("Add", g.unsqueeze(unary, [2]), pair)


def _row(g, lattice, pos, prev, top_k):
    """lattice[b, pos, prev[b], :] -> [B, K]."""
    lat = g.gather(lattice, pos, 1)                                                                # [B, K, K]
    idx = g.op("Expand", g.reshape(prev, [-1, 1, 1]),
               g.op("Concat", g.dim(lat, 0), g.const([1, top_k], "int64", "shape"), axis=0))
    return g.reshape(g.op("GatherElements", lat, idx, axis=1), [-1, top_k])


def _one_hot(g, idx, top_k):
    """float one-hot of int64 ``idx [...]`` over K (last axis)."""
    ar = g.const(np.arange(top_k, dtype=np.int64), name="arange_k")
    return g.cast(g.op("Equal", g.unsqueeze(idx, [-1]), ar), "float32")


def _walk(g, lattice, temperature, uniforms, length, top_k, *, sampled_mode):
    """Greedy (and, in sample mode, per-row sampling) walk left to right."""
    kf = g.const(np.float32(top_k), name="k_float")
    ar_f = g.const(np.arange(top_k, dtype=np.float32), name="arange_k_f")
    if sampled_mode:
        t = temperature
        sampled = g.op("And", g.op("Greater", t, g.const(np.float32(0.0), name="zero_f")),
                       g.op("Not", g.op("Greater", t, g.const(np.float32(_MAX_FINITE_T), name="max_t"))))
        t_safe = g.unsqueeze(g.op("Where", sampled, t, g.const(np.float32(1.0), name="one_f")), [1])   # [B, 1]
        sampled_col = g.unsqueeze(sampled, [1])                                                          # [B, 1]
    prev = g.op("Expand", g.const(np.zeros(1, np.int64), name="zeros_i"), g.dim(lattice, 0))        # [B]
    idxs, qs = [], []
    for pos in range(length):
        row = _row(g, lattice, pos, prev, top_k)                                                  # [B, K]
        greedy = g.op("ArgMax", row, axis=1, keepdims=0, select_last_index=0)                     # first max
        q_greedy = _one_hot(g, greedy, top_k)
        if not sampled_mode:
            prev, q = greedy, q_greedy
        else:
            p = g.op("Softmax", g.op("Div", row, t_safe), axis=-1)
            cdf = g.op("CumSum", p, g.const(np.int64(1), name="axis1"))
            u = g.gather(uniforms, pos, 1)                                                        # [B]
            hit = g.op("Greater", cdf, g.unsqueeze(u, [1]))
            first = g.reduce("ReduceMin", g.op("Where", hit, ar_f, kf), [1], keepdims=0)
            last = g.reduce("ReduceMax", g.op("Where", g.op("Greater", p, g.const(np.float32(0.0), name="zero_f")),
                                              ar_f, g.const(np.float32(-1.0), name="minus_one_f")), [1], keepdims=0)
            last = g.op("Max", last, g.const(np.float32(0.0), name="zero_f"))
            pick = g.cast(g.op("Where", g.op("Less", first, kf), first, last), "int64")
            prev = g.op("Where", sampled, pick, greedy)
            q = g.op("Where", sampled_col, p, q_greedy)
        idxs.append(g.unsqueeze(prev, [1]))
        qs.append(g.unsqueeze(q, [1]))
    idx = g.op("Concat", *idxs, axis=1) if length > 1 else idxs[0]
    q = g.op("Concat", *qs, axis=1) if length > 1 else qs[0]
    return idx, q


def _viterbi(g, lattice, length, top_k):
    """Max-plus DP; backpointers to the lowest predecessor reaching the max, final ties to the lowest index."""
    kf = g.const(np.float32(top_k), name="k_float")
    ar_col = g.const(np.arange(top_k, dtype=np.float32).reshape(1, top_k, 1), name="arange_k_col")
    score = g.gather(g.gather(lattice, 0, 1), 0, 1)                                               # [B, K]
    backs = []
    for pos in range(1, length):
        tot = g.op("Add", g.unsqueeze(score, [2]), g.gather(lattice, pos, 1))                     # [B, K(p), K(c)]
        score = g.reduce("ReduceMax", tot, [1], keepdims=0)                                       # [B, K]
        at_max = g.op("Equal", tot, g.unsqueeze(score, [1]))
        bp = g.reduce("ReduceMin", g.op("Where", at_max, ar_col, kf), [1], keepdims=0)
        backs.append(g.cast(bp, "int64"))
    last = g.op("ArgMax", score, axis=1, keepdims=0, select_last_index=0)
    path = [last]
    for bp in reversed(backs):
        last = g.squeeze(g.op("GatherElements", bp, g.unsqueeze(last, [1]), axis=1), [1])
        path.append(last)
    cols = [g.unsqueeze(p, [1]) for p in reversed(path)]
    return g.op("Concat", *cols, axis=1) if len(cols) > 1 else cols[0]
