"""onnxruntime (CPU) runs the exported drafter and reproduces the PyTorch reference drafter: draft ids
and candidates exactly, q within 1e-5, present K/V within 1e-5 (fp32), over consecutive blocks
whose context crosses the sliding window, batch 1 and 3, temperatures 0 and > 0 in one batch;
with the plugins' CPU builds as custom ops and with the plugin-free decomposition."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from dflash2_trt.onnx.ort import for_onnxruntime, session
from dflash2_trt.trtllm.cpu.plugin_libs import PluginRunError

from onnx_harness import KV_TOL, Q_TOL, SCHEDULE, compare_blocks, conv_graph, scan_graph

TEMPS = {1: [0.8], 3: [0.0, 0.7, 1.5]}


def _check(rows, *, batch, selector):
    for r in rows:
        where = f"block at past={r['past']} context={r['context']}"
        assert r["ids_equal"], f"draft ids differ ({where})"
        assert r["cand_equal"], f"candidates differ ({where})"
        assert r["q_diff"] <= Q_TOL, f"max |q diff| {r['q_diff']:.2e} ({where})"
        assert r["kv_diff"] <= KV_TOL, f"max |present K/V diff| {r['kv_diff']:.2e} ({where})"
        assert r["present_len"] == r["start"]
        assert r["dtypes"] == (np.dtype(np.int32), np.dtype(np.float32))
    assert sum(r["context"] for r in rows) > 16   # the sliding window (16) was crossed
    if selector == "greedy":   # the T > 0 rows really sampled (q not one-hot), the T = 0 row did not
        assert all(r["sampled_rows_nonone_hot"] == (batch if batch == 1 else 2) for r in rows)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "muse_glimmer"])
@pytest.mark.parametrize("plugins", [True, False], ids=["plugins", "no-plugins"])
@pytest.mark.parametrize("batch", [1, 3])
def test_ort_matches_reference_published_selector(exported, reference, family, plugins, batch):
    sess = session(exported(family, plugins) / "drafter.onnx")
    rows = compare_blocks(sess, reference(family), batch=batch, selector="greedy", temps=TEMPS[batch], seed=batch)
    _check(rows, batch=batch, selector="greedy")


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("plugins", [True, False], ids=["plugins", "no-plugins"])
def test_ort_matches_reference_viterbi(exported, reference, family, plugins):
    sess = session(exported(family, plugins, "viterbi") / "drafter.onnx")
    rows = compare_blocks(sess, reference(family), batch=3, selector="viterbi", temps=TEMPS[3], seed=7)
    _check(rows, batch=3, selector="viterbi")
    assert all(r["q_diff"] == 0.0 for r in rows)   # one-hot on both sides


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("plugins", [True, False], ids=["plugins", "no-plugins"])
def test_ort_other_opsets(exported, reference, opset, plugins):
    """Opset 17 takes reduce axes as attributes, 23 as inputs: both graphs reproduce the reference."""
    sess = session(exported("qwen3", plugins, "greedy", "float32", opset) / "drafter.onnx")
    _check(compare_blocks(sess, reference("qwen3"), batch=3, selector="greedy", temps=TEMPS[3], seed=11,
                          schedule=SCHEDULE[:3]), batch=3, selector="greedy")


def test_wrong_lattice_row_would_be_caught(pairs, reference, tmp_path, monkeypatch):
    """Control: a decomposition that reads the lattice row of candidate 0 at every position (the silent
    failure mode ops.py names) is caught by the same comparison."""
    from dflash2_trt.onnx import export_onnx, ops

    monkeypatch.setattr(ops, "_row", lambda g, lattice, pos, prev, top_k:
                        g.reshape(g.gather(g.gather(lattice, pos, 1), 0, 1), [-1, top_k]))
    d, t = pairs("qwen3")
    export_onnx(d, t, tmp_path / "wrong", use_plugins=False, max_seq_len=128)
    rows = compare_blocks(session(tmp_path / "wrong" / "drafter.onnx"), reference("qwen3"), batch=3,
                          selector="greedy", temps=[0.0, 0.0, 0.0], seed=3)
    assert not all(r["ids_equal"] for r in rows)


def test_exported_file_keeps_the_dflash2_domain(exported):
    """The onnxruntime copy renames the domain; the file on disk is untouched."""
    path = exported("qwen3", True) / "drafter.onnx"
    before = path.read_bytes()
    model = onnx.load(str(path), load_external_data=False)
    ort_model = for_onnxruntime(model)
    assert {n.domain for n in model.graph.node} == {"", "dflash2"}
    assert {n.domain for n in ort_model.graph.node} == {"", "ai.onnx.contrib"}
    fused = [n for n in ort_model.graph.node if n.op_type == "DFlash2DynamicConvFused"]
    assert len(fused) == 4 and all(len(n.input) == 4 for n in fused)
    assert [list(n.attribute) for n in model.graph.node] == [list(n.attribute) for n in ort_model.graph.node]
    session(path)
    assert path.read_bytes() == before


def test_plugin_rejections_carry_the_plugins_message(tmp_path):
    """A graph the plugins' validation refuses fails in onnxruntime with the plugin's own message
    (the CPU build runs the same validation function as the TensorRT glue), not a crash."""
    sess = session(conv_graph(tmp_path / "conv.onnx", 6, 4))
    with pytest.raises(PluginRunError, match="tokens=6 is not a multiple of block_size=4"):
        sess.run(None, {"x": np.zeros((6, 64), np.float32), "delta": np.zeros((6, 2, 4), np.float32)})
    sess = session(scan_graph(tmp_path / "scan.onnx", 17))
    feeds = {"unary": np.zeros((2, 7, 17), np.float32), "cand": np.zeros((2, 7, 17), np.int32),
             "proj": np.zeros((2, 7, 16), np.float32), "anchor": np.zeros(2, np.int32),
             "temperature": np.ones(2, np.float32), "uniforms": np.zeros((2, 7), np.float32)}
    with pytest.raises(PluginRunError, match="K=17 candidates per position outside"):
        sess.run(None, feeds)


@pytest.mark.parametrize("mode", ["greedy", "sample", "viterbi"])
def test_scan_decomposition_equals_plugin_on_ties_and_temperatures(tmp_path, mode):
    """Decomposed walk vs the plugin's CPU build on a lattice full of exact ties (integer scores),
    with temperatures 0, > 0, inf and NaN in one batch: ids equal, q within 1e-6."""
    g = torch.Generator().manual_seed(0)
    b, length, k, r, v = 6, 7, 5, 8, 32
    feeds = {"unary": torch.randint(-2, 3, (b, length, k), generator=g).float().numpy(),
             "cand": torch.randint(0, v, (b, length, k), generator=g).int().numpy(),
             "proj": torch.zeros(b, length, r).numpy(),   # pairwise term 0: the lattice is the integer unary
             "anchor": torch.randint(0, v, (b,), generator=g).int().numpy(),
             "temperature": np.array([0.0, 0.5, 2.0, np.inf, np.nan, -1.0], np.float32),
             "uniforms": torch.rand(b, length, generator=g).numpy()}
    outs = [session(scan_graph(tmp_path / f"scan-{p}.onnx", k, plugins=p, mode=mode, batch="b", rank=r, vocab=v))
            .run_dict(feeds) for p in (True, False)]
    assert np.array_equal(outs[0]["ids"], outs[1]["ids"])
    assert float(np.abs(outs[0]["q"] - outs[1]["q"]).max()) <= 1e-6
    if mode == "sample":   # rows 1, 2 sampled; 0 (T=0), 3 (inf), 4 (NaN), 5 (< 0) walked greedily
        one_hot = (outs[1]["q"] > 0).sum(-1) == 1
        assert one_hot[[0, 3, 4, 5]].all() and not one_hot[[1, 2]].all()


def test_conv_decomposition_equals_plugin_bit_for_bit(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 64, generator=g).numpy()
    d = torch.randn(24, 2, 4, generator=g).numpy()
    outs = []
    for plugins in (True, False):
        sess = session(conv_graph(tmp_path / f"c{plugins}.onnx", 24, 8, plugins=plugins))
        outs.append(sess.run(None, {"x": x, "delta": d})[0])
    assert np.array_equal(outs[0], outs[1])
