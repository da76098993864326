"""export-onnx: the output directory, the graph (checker, I/O, plugin nodes from the YAML specs,
standard ops only without plugins), the manifest, and refusals that leave nothing behind."""

from __future__ import annotations

import json
import shutil

import onnx
import pytest
from onnx import defs

from dflash2_trt import plugins
from dflash2_trt.checkpoint.writer import sha256_file
from dflash2_trt.errors import ConfigError, DFlash2Error
from dflash2_trt.onnx import export_onnx
from dflash2_trt.onnx.export import SELECTORS, profile_shapes, trtexec_command


def _load(out):
    return onnx.load(str(out / "drafter.onnx"), load_external_data=False)


def test_layout_manifest_and_checker(exported):
    out = exported("qwen3", True)
    assert sorted(p.name for p in out.iterdir()) == ["drafter.onnx", "drafter.onnx.data", "manifest.json"]
    onnx.checker.check_model(str(out / "drafter.onnx"), full_check=True)
    m = json.loads((out / "manifest.json").read_text())
    for name, f in m["files"].items():
        assert (out / name).stat().st_size == f["size"] and sha256_file(out / name) == f["sha256"]
    model = _load(out)
    ext = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert ext and all(e.value == "drafter.onnx.data" for t in ext for e in t.external_data if e.key == "location")
    assert not any(t.raw_data for t in ext)
    assert {i["name"]: i["shape"] for i in m["inputs"]} == {
        "block_ids": ["batch", 8], "context_taps": ["batch", "context_length", 128],
        **{f"past_{k}_{i}": ["batch", 2, "past_length", 16] for i in range(2) for k in ("key", "value")},
        "temperature": ["batch"], "uniforms": ["batch", 7]}
    assert [o["name"] for o in m["outputs"]][:3] == ["draft_ids", "q", "cand_ids"]
    assert (m["dtype"], m["opset"], m["block_size"], m["top_k"], m["scan_mode"]) == ("float32", 18, 8, 8, "sample")
    assert m["sources"]["drafter"]["config_sha256"] and m["sources"]["target"]["files"]
    shapes = profile_shapes(m)
    assert shapes["past_key_0"] == ([1, 2, 0, 16], [4, 2, 60, 16], [8, 2, 120, 16])   # max_seq_len 128 - block 8
    assert "--minShapes=block_ids:1x8," in trtexec_command(m)


def test_plugin_nodes_are_the_specs(exported):
    """Op type = plugin name, domain = namespace, attributes = the YAML spec's (defaults filled)."""
    model = _load(exported("qwen3_5", True, "viterbi"))
    custom = [n for n in model.graph.node if n.domain]
    assert {o.domain: o.version for o in model.opset_import} == {"": 18, "dflash2": 1}
    conv = [n for n in custom if n.op_type == "DFlash2DynamicConv"]
    scan = [n for n in custom if n.op_type == "DFlash2PairwiseScan"]
    assert len(conv) == 8 and len(scan) == 1 and len(custom) == 9
    spec = plugins.load_spec("DFlash2DynamicConv")
    for n in conv:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert sorted(attrs) == sorted(a.name for a in spec.attributes)   # make_node sorts them by name
        fused = len(n.input) == 4
        assert attrs == plugins.attribute_values("DFlash2DynamicConv", block_size=8, kernel_size=2, group_size=16,
                                                 fuse_residual=int(fused))
    assert sum(len(n.input) == 4 for n in conv) == 4    # every post conv carries the fp32 residual
    (s,) = scan
    assert {a.name: onnx.helper.get_attribute_value(a) for a in s.attribute} == {"mode": 2}
    assert [o for o in s.output] == ["draft_ids", "q"]


def test_plugin_free_graph_uses_standard_ops_only(exported):
    model = _load(exported("qwen3", False))
    assert {o.domain for o in model.opset_import} == {""}
    for n in model.graph.node:
        assert n.domain == "" and defs.has(n.op_type), n.op_type
    assert "Loop" not in {n.op_type for n in model.graph.node}    # the walk is unrolled
    onnx.checker.check_model(str(exported("qwen3", False) / "drafter.onnx"), full_check=True)


def test_selector_modes_agree_with_the_engine_network():
    from dflash2_trt.trtllm.backend import load_network

    assert SELECTORS == load_network("cpu").SELECTOR_PLUGIN_MODE


def _listing(parent):
    return sorted(p.name for p in parent.iterdir())


@pytest.mark.parametrize("kwargs,field", [({"tp_size": 2}, "--tp-size"), ({"opset": 16}, "--opset"),
                                          ({"opset": 24}, "--opset"), ({"dtype": "int8"}, "--dtype"),
                                          ({"selector": "sample"}, "--selector"),
                                          ({"max_batch_size": 0}, "--max-batch-size"),
                                          ({"max_seq_len": 8}, "--max-seq-len"),
                                          ({"max_seq_len": 10**6}, "--max-seq-len")])
def test_refusals_leave_nothing(pairs, tmp_path, kwargs, field):
    d, t = pairs("qwen3")
    with pytest.raises(ConfigError) as e:
        export_onnx(d, t, tmp_path / "out", **kwargs)
    assert field in str(e.value) and "\n" not in str(e.value)
    assert _listing(tmp_path) == []


def _drafter_copy(pairs, tmp_path, **dflash):
    d, t = pairs("qwen3")
    dd = tmp_path / "drafter"
    shutil.copytree(d, dd)
    cfg = json.loads((dd / "config.json").read_text())
    cfg["dflash_config"].update(dflash)
    (dd / "config.json").write_text(json.dumps(cfg))
    return dd, t


def test_plugin_limits_are_refused_unless_no_plugins(pairs, tmp_path):
    dd, t = _drafter_copy(pairs, tmp_path, selector_top_k=17)
    with pytest.raises(ConfigError, match=r"selector_top_k: K=17 outside \[1, 16\].*--no-plugins"):
        export_onnx(dd, t, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    res = export_onnx(dd, t, tmp_path / "out", use_plugins=False)
    assert res.manifest["top_k"] == 17 and not res.manifest["plugins"]


def test_unsupported_family_is_refused(pairs, tmp_path):
    d, t = pairs("qwen3")
    tt = tmp_path / "target"
    shutil.copytree(t, tt)
    cfg = json.loads((tt / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["LlamaForCausalLM"], "llama"
    (tt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="architectures"):
        export_onnx(d, tt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failure_mid_write_leaves_nothing(pairs, tmp_path, monkeypatch):
    from dflash2_trt.onnx.graph import GraphBuilder

    calls = {"n": 0}
    real = GraphBuilder.weight

    def failing(self, name, tensor):
        calls["n"] += 1
        if calls["n"] == 10:
            raise OSError(28, "No space left on device", str(self.data_path))
        return real(self, name, tensor)

    monkeypatch.setattr(GraphBuilder, "weight", failing)
    d, t = pairs("qwen3")
    with pytest.raises(DFlash2Error, match="No space left on device") as e:
        export_onnx(d, t, tmp_path / "out")
    assert "drafter.onnx.data" in str(e.value)
    assert _listing(tmp_path) == []


def test_output_inside_a_source_and_existing_output(pairs, tmp_path):
    d, t = pairs("qwen3")
    with pytest.raises(ConfigError, match="--force would delete it"):
        export_onnx(d, t, d.parent, force=True)
    with pytest.raises(ConfigError, match="lies inside the drafter directory"):
        export_onnx(d, t, d / "onnx", force=True)
    assert not (d / "onnx").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    with pytest.raises(DFlash2Error):
        export_onnx(d, t, tmp_path / "out")
    assert _listing(tmp_path / "out") == ["keep"]
    with pytest.raises(DFlash2Error, match="holds no dflash2-trt output"):   # --force replaces only an earlier output
        export_onnx(d, t, tmp_path / "out", force=True)
    (tmp_path / "out" / "keep").unlink()
    export_onnx(d, t, tmp_path / "out")
    (tmp_path / "out" / "keep").write_text("x")
    export_onnx(d, t, tmp_path / "out", force=True)
    assert "keep" not in _listing(tmp_path / "out")
