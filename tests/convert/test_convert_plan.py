"""The weight maps at the REAL widths (published Qwen3.8-27B + its DFlash2 drafter configs, no
weights): for every tp, each source tensor is covered completely, each rank's shapes follow the
TP rules, and duplication happens only where heads are fewer than ranks."""

from __future__ import annotations

import math

import pytest

from dflash2_trt.checkpoint import expected_drafter_tensors, expected_target_tensors
from dflash2_trt.config import DFlash2Config, TargetConfig
from dflash2_trt.convert import dflash2, qwen3_5
from dflash2_trt.convert.plan import DRAFTER, TARGET, width_of
from dflash2_trt.testing.fixtures import QWEN_DRAFTER, QWEN_TARGET


@pytest.fixture(scope="module")
def real():
    t = TargetConfig.from_hugging_face(QWEN_TARGET)
    d = DFlash2Config.from_hugging_face(QWEN_DRAFTER)
    shapes = {(TARGET, k): v.shape for k, v in expected_target_tensors(t).items()}
    shapes.update({(DRAFTER, k): v.shape for k, v in expected_drafter_tensors(d, t.hidden_size).items()})
    return t, d, shapes


def _merge(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_every_source_row_and_column_is_covered(real, tp):
    t, d, shapes = real
    plans = [qwen3_5.target_tensors(t, tp, r) + dflash2.drafter_tensors(d, t.hidden_size, tp, r) for r in range(tp)]
    copies: dict = {}
    cover: dict = {}
    for plan in plans:
        assert len({o.name for o in plan}) == len(plan)
        for out in plan:
            assert sum(p.num_rows for p in out.pieces) == out.shape[0]
            for p in out.pieces:
                shape = shapes[(p.ckpt, p.src)]
                c0, c1 = p.cols or (0, width_of(shape))
                assert c1 - c0 == out.width, (out.name, p)
                cover.setdefault((p.ckpt, p.src), []).append((p.rows, (c0, c1)))
                copies[(p.ckpt, p.src)] = copies.get((p.ckpt, p.src), 0) + (p.rows[1] - p.rows[0]) * (c1 - c0)
    assert set(cover) == set(shapes)  # every expected tensor is used (nothing dropped at the real widths)
    for key, pieces in cover.items():
        shape = shapes[key]
        rows = _merge([r for r, _ in pieces])
        assert rows == [[0, shape[0]]], key
        for r, _ in pieces:  # the columns of every row range are covered too
            cols = _merge([c for r2, c in pieces if r2[0] < r[1] and r[0] < r2[1]])
            assert cols == [[0, width_of(shape)]], key
        factor = copies[key] / math.prod(shape or (1,))
        name = key[1]
        if name.endswith(("k_proj.weight", "v_proj.weight")) and key[0] == TARGET:
            assert factor == max(1, tp // t.num_key_value_heads), (name, factor)  # KV heads: 4
        elif "in_proj_qkv" in name or "conv1d" in name:
            # q and k rows (2 x 16 heads) duplicated when 16 < tp: never at tp <= 8; v rows never
            assert factor == 1, (name, factor)
        elif name.endswith(("norm.weight", "base_kernel", "kernel_projection.weight")) or "candidate_selector" in name:
            assert factor == tp, (name, factor)  # replicated
        else:
            assert factor == 1, (name, factor)  # split exactly once over the ranks


def test_rank_shapes_at_tp8(real):
    t, d, _ = real
    plan = {o.name: o for o in qwen3_5.target_tensors(t, 8, 3) + dflash2.drafter_tensors(d, t.hidden_size, 8, 3)}
    full = t.layer_types.index("full_attention")
    lin = t.layer_types.index("linear_attention")
    a = f"transformer.layers.{full}.attention."
    la = f"transformer.layers.{lin}.linear_attention."
    assert plan[a + "qkv.weight"].shape == ((3 + 1 + 1) * 256, 5120)          # 24/8 q heads, 1 duplicated kv head
    assert plan[a + "output_gate.weight"].shape == (3 * 256, 5120)
    assert plan[a + "dense.weight"].shape == (5120, 3 * 256)
    assert plan[la + "qkv.weight"].shape == ((2 * 128) * 2 + 6 * 128, 5120)  # 2 k heads, 6 v heads
    assert plan[la + "conv1d.weight"].shape == ((2 * 128) * 2 + 6 * 128, 1, 4)
    assert plan[la + "A_log"].shape == (6,) and plan[la + "A_log"].keep_float32
    assert plan[la + "dense.weight"].shape == (5120, 6 * 128)
    assert plan["lm_head.weight"].shape == (248320 // 8, 5120)
    assert plan["transformer.vocab_embedding.weight"].shape == (248320 // 8, 5120)
    assert plan["dflash2.layers.0.attention.qkv.weight"].shape == ((4 + 1 + 1) * 128, 5120)
    assert plan["dflash2.fc.weight"].shape == (5120 // 8, 5 * 5120)
    assert plan["dflash2.selector.predecessor_codebook"].shape == (248320, 256)
    # KV head of rank 3 at tp 8 with 4 KV heads: head 1 (ranks 2 and 3 share it)
    kv = [p for p in plan[a + "qkv.weight"].pieces if p.src.endswith("k_proj.weight")]
    assert [p.rows for p in kv] == [(256, 512)]
