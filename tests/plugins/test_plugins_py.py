"""dflash2_trt.plugins: YAML specs -> plugin fields, library lookup, and the specs' agreement
with the C++ glue and validation (one source of attribute names, types, ranges)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dflash2_trt import plugins
from dflash2_trt.errors import ConfigError, MissingDependencyError

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
GLUE = {"DFlash2DynamicConv": PLUGINS / "dynamicConvPlugin" / "dynamicConvPlugin.cpp",
        "DFlash2PairwiseScan": PLUGINS / "pairwiseScanPlugin" / "pairwiseScanPlugin.cpp",
        "DFlash2GatedDeltaNet": PLUGINS / "gatedDeltaNetPlugin" / "gatedDeltaNetPlugin.cpp"}
GLUE_H = {"DFlash2DynamicConv": PLUGINS / "dynamicConvPlugin" / "dynamicConvPlugin.h",
          "DFlash2PairwiseScan": PLUGINS / "pairwiseScanPlugin" / "pairwiseScanPlugin.h",
          "DFlash2GatedDeltaNet": PLUGINS / "gatedDeltaNetPlugin" / "gatedDeltaNetPlugin.h"}


def test_importing_plugins_loads_nothing():
    """Importing the module (in a fresh interpreter) neither imports tensorrt nor maps the library."""
    code = ("import sys, dflash2_trt.plugins as p; "
            "maps = open('/proc/self/maps').read() if sys.platform == 'linux' else ''; "
            "assert 'tensorrt' not in sys.modules; assert p._LOADED == {}; "
            "assert 'libdflash2_plugins' not in maps; print('clean')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and "clean" in res.stdout, res.stderr


def test_specs_load():
    specs = plugins.load_specs()
    conv, scan = specs["DFlash2DynamicConv"], specs["DFlash2PairwiseScan"]
    assert (conv.version, conv.namespace) == ("1", "dflash2")
    assert [a.name for a in conv.attributes] == ["block_size", "kernel_size", "group_size", "fuse_residual"]
    assert [t.name for t in conv.inputs] == ["x", "delta", "base_kernel", "residual"]
    assert [t.name for t in scan.inputs] == ["unary", "cand_ids", "proj_hidden", "anchor", "pred_codebook",
                                             "succ_codebook", "temperature", "uniforms"]
    assert [t.name for t in scan.outputs] == ["path_ids", "q"]
    assert scan.attribute("mode").enum == {"greedy": 0, "sample": 1, "viterbi": 2}


def test_conv_fields():
    fields = plugins.plugin_fields("DFlash2DynamicConv", block_size=16, kernel_size=2, group_size=16)
    assert [(f.name, f.type, f.data.tolist()) for f in fields] == [
        ("block_size", "int32", [16]), ("kernel_size", "int32", [2]), ("group_size", "int32", [16]),
        ("fuse_residual", "int32", [0])]
    assert all(f.data.dtype == np.int32 for f in fields)
    fused = plugins.plugin_fields("DFlash2DynamicConv", block_size=8, kernel_size=2, group_size=16,
                                  fuse_residual=True)
    assert fused[-1].data.tolist() == [1]


def test_attribute_values():
    assert plugins.attribute_values("DFlash2DynamicConv", block_size=8, kernel_size=2, group_size=16) == {
        "block_size": 8, "kernel_size": 2, "group_size": 16, "fuse_residual": 0}
    assert plugins.attribute_values("DFlash2PairwiseScan", mode="sample") == {"mode": 1}


def test_scan_fields_enum():
    assert plugins.plugin_fields("DFlash2PairwiseScan")[0].data.tolist() == [0]  # default greedy
    assert plugins.plugin_fields("DFlash2PairwiseScan", mode="viterbi")[0].data.tolist() == [2]
    assert plugins.plugin_fields("DFlash2PairwiseScan", mode=1)[0].data.tolist() == [1]


@pytest.mark.parametrize("name,attrs,needle", [
    ("DFlash2DynamicConv", dict(block_size=16, kernel_size=5, group_size=16), "5 outside [1, 4]"),
    ("DFlash2DynamicConv", dict(block_size=16, group_size=16), "attribute 'kernel_size': required"),
    ("DFlash2DynamicConv", dict(block_size=16, kernel_size=2, group_size=16, kernal_size=2), "unknown attribute"),
    ("DFlash2DynamicConv", dict(block_size=16.0, kernel_size=2, group_size=16), "expected an integer"),
    ("DFlash2PairwiseScan", dict(mode="beam"), "'beam' is not one of"),
    ("DFlash2PairwiseScan", dict(mode=3), "3 is not one of"),
])
def test_fields_reject(name, attrs, needle):
    with pytest.raises(ConfigError) as e:
        plugins.plugin_fields(name, **attrs)
    assert needle in str(e.value)
    assert "Plugin.yaml" in str(e.value)  # names the spec file


def test_unknown_plugin():
    with pytest.raises(ConfigError, match="unknown plugin 'Nope'"):
        plugins.load_spec("Nope")


def _write_spec(tmp_path, text):
    d = tmp_path / "dynamicConvPlugin"
    d.mkdir(parents=True, exist_ok=True)
    (d / "dynamicConvPlugin.yaml").write_text(text)


@pytest.mark.parametrize("text,needle", [
    ("name: DFlash2DynamicConv\nversion: '1'\nnamespace: x\nattributes: []\ninputs: []\noutputs: []\nextra: 1\n",
     "unknown key(s) ['extra']"),
    ("name: DFlash2DynamicConv\nversion: '1'\nnamespace: x\ninputs: []\noutputs: []\n", "attributes: missing"),
    ("name: DFlash2DynamicConv\nversion: '1'\nnamespace: x\nattributes:\n  - {name: a, type: float32, required: true}"
     "\ninputs: []\noutputs: []\n", "type 'float32' not supported"),
    ("name: DFlash2DynamicConv\nversion: '1'\nnamespace: x\nattributes:\n  - {name: a, type: int32}"
     "\ninputs: []\noutputs: []\n", "optional attribute needs a default"),
    ("name: DFlash2DynamicConv\nversion: '1'\nnamespace: x\nattributes:\n  - {name: a, type: int32, default: 9, max: 4}"
     "\ninputs: []\noutputs: []\n", "9 outside"),
    ("name: Other\nversion: '1'\nnamespace: x\nattributes: []\ninputs: []\noutputs: []\n", "expected 'DFlash2DynamicConv'"),
    ("name: [unclosed\n", "invalid YAML"),
])
def test_bad_spec_files(tmp_path, monkeypatch, text, needle):
    monkeypatch.setenv("DFLASH2_PLUGIN_DIR", str(tmp_path))
    _write_spec(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        plugins.load_spec("DFlash2DynamicConv")
    assert needle in str(e.value) and "dynamicConvPlugin.yaml" in str(e.value)


def test_missing_spec_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH2_PLUGIN_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="plugin spec not found"):
        plugins.load_spec("DFlash2PairwiseScan")


# ------------------------------------------------------------------------------- the library
def test_find_library_error_names_places(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH2_PLUGIN_DIR", str(tmp_path / "plugins"))
    monkeypatch.delenv("DFLASH2_PLUGIN_LIB", raising=False)
    with pytest.raises(MissingDependencyError) as e:
        plugins.find_library()
    msg = str(e.value)
    assert str(tmp_path / "plugins" / "build" / "libdflash2_plugins.so") in msg
    assert "cmake -S plugins" in msg and "DFLASH2_PLUGIN_LIB" in msg
    monkeypatch.setenv("DFLASH2_PLUGIN_LIB", str(tmp_path / "x.so"))
    with pytest.raises(MissingDependencyError, match=re.escape(str(tmp_path / "x.so"))):
        plugins.load_library()


def test_find_and_load_library(tmp_path, monkeypatch, plugin_build_dir):
    """An explicitly given library is found and loaded (a CPU-built stand-in: the real one needs
    CUDA and libnvinfer, which are not here); a file that is not a library fails clearly."""
    import importlib.util  # noqa: PLC0415

    # this folder's conftest by its path: a bare `import conftest` finds whichever conftest pytest imported first
    # (tests/deploy's when the run collects it before this file)
    spec = importlib.util.spec_from_file_location("plugins_conftest", Path(__file__).with_name("conftest.py"))
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    build_shared = conftest.build_shared
    lib = build_shared([PLUGINS / "dynamicConvPlugin" / "dynamicConvParams.cpp"], tmp_path / "libdflash2_plugins.so")
    monkeypatch.setenv("DFLASH2_PLUGIN_LIB", str(lib))
    assert plugins.find_library() == lib.resolve()
    handle = plugins.load_library()
    assert plugins.load_library() is handle  # loaded once
    bad = tmp_path / "bad.so"
    bad.write_text("not an ELF")
    with pytest.raises(MissingDependencyError, match="could not be loaded"):
        plugins.load_library(bad)


def test_tensorrt_absent_is_missing_dependency(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError
    with pytest.raises(MissingDependencyError, match="tensorrt"):
        plugins.trt_field_collection("DFlash2PairwiseScan", mode="greedy")


# ------------------------------------------------------------- YAML <-> C++ glue / validation
PARAMS_H = {name: path.with_name(path.name.replace("Plugin.h", "Params.h")) for name, path in GLUE_H.items()}
_FIELD = re.compile(r'\{"([a-z_]+)", &(\w+)::\w+, (true|false)\}')


def _field_table(name):
    """The plugin's Int32AttrField table in its Params.h: [(attribute, required)], in order."""
    text = PARAMS_H[name].read_text()
    m = re.search(r"Int32AttrField<(\w+)> (k\w+Fields)\[\] = \{(.*?)\n\};", text, re.S)
    assert m, f"no attribute table in {PARAMS_H[name].name}"
    rows = _FIELD.findall(m.group(3))
    assert rows and all(attrs == m.group(1) for _, attrs, _ in rows), "every row names a member of the Attrs struct"
    return m.group(2), [(attr, req == "true") for attr, _, req in rows]


@pytest.mark.parametrize("name", plugins.PLUGIN_NAMES)
def test_glue_matches_spec(name):
    spec = plugins.load_spec(name)
    hdr, params = GLUE_H[name].read_text(), PARAMS_H[name].read_text()
    assert re.search(rf'Name = "{spec.name}";', params), "plugin name constant"
    assert re.search(rf'Version = "{spec.version}";', hdr), "plugin version constant"
    utils = (PLUGINS / "common" / "df2PluginUtils.h").read_text()
    assert f'kPluginNamespace = "{spec.namespace}";' in utils
    # one attribute table: the spec's names in the spec's order (the CPU builds' C ABI passes the
    # values in that order), the spec's required flags; the glue's creator fields, createPlugin and
    # serialisation all read it (PluginV3Base / PluginCreatorBase iterate kFields, kINT32, length 1)
    table, rows = _field_table(name)
    assert rows == [(a.name, a.required) for a in spec.attributes]
    assert re.search(rf"static constexpr auto& kFields = {table};", hdr), "the plugin uses its table"
    base = (PLUGINS / "common" / "df2PluginBase.h").read_text()
    assert base.count("for (auto const& f : Derived::kFields)") == 1 and "for (auto const& f : Plugin::kFields)" in base
    assert "parseInt32Fields(Plugin::kName, fc, Plugin::kFields, &a)" in base
    # nothing in the glue names an attribute by its string any more (one source: the table)
    cpp = GLUE[name].read_text()
    assert not [a.name for a in spec.attributes if f'"{a.name}"' in cpp + hdr]


def test_gdn_cpu_attribute_order_is_the_table():
    """GdnLib hands the CPU build its attribute values in ATTRS' order; attrsFromValues reads them
    in the table's order: the two must be the spec's order (a swap would build wrong heads silently)."""
    from dflash2_trt.trtllm.cpu.plugin_libs import GdnLib
    assert list(GdnLib.ATTRS) == [a for a, _ in _field_table("DFlash2GatedDeltaNet")[1]]


def _good_conv_inputs():
    return [(1, (-1, 64)), (1, (-1, 2, 4)), (1, (2, 64))]


def test_conv_ranges_match_validation(conv_lib):
    spec = plugins.load_spec("DFlash2DynamicConv")
    base = dict(block_size=16, kernel_size=2, group_size=16, fuse=False)
    key = {"block_size": "block_size", "kernel_size": "kernel_size", "group_size": "group_size",
           "fuse_residual": "fuse"}
    for a in spec.attributes:
        for v, ok in ((a.min, True), (a.max, True), (None if a.min is None else a.min - 1, False),
                      (None if a.max is None else a.max + 1, False)):
            if v is None:
                continue
            attrs = dict(base, **{key[a.name]: v})
            ins = _good_conv_inputs()
            if a.name == "block_size":  # block_size 1 only admits kernel_size 1
                attrs["kernel_size"] = 1
                ins = [(1, (-1, 64)), (1, (-1, 1, 4)), (1, (1, 64))]
            if a.name == "kernel_size":
                ins = [(1, (-1, 64)), (1, (-1, max(v, 0), 4)), (1, (max(v, 0), 64))]
            if a.name == "group_size":
                ins = [(1, (-1, 64)), (1, (-1, 2, -1)), (1, (2, 64))]
            if a.name == "fuse_residual" and v == 1:
                ins = ins + [(0, (-1, 64))]
            rc, msg = conv_lib.validate(ins, **attrs)
            assert (rc == 0) == ok, (a.name, v, msg)
            if not ok:
                assert a.name in msg, msg


def test_scan_enum_matches_validation(scan_lib):
    spec = plugins.load_spec("DFlash2PairwiseScan")
    ins = [(0, (2, 3, 4)), (3, (2, 3, 4)), (1, (2, 3, 16)), (3, (2,)), (1, (10, 16)), (1, (10, 16)),
           (0, (2,)), (0, (2, 3))]
    for name, v in spec.attribute("mode").enum.items():
        assert scan_lib.validate(ins, v) == (0, ""), name
    assert scan_lib.validate(ins, max(spec.attribute("mode").enum.values()) + 1)[0] == 1
    assert len(spec.inputs) == 8 and len(spec.outputs) == 2


# ----------------------------------------------------------------------- DFlash2GatedDeltaNet
_GDN_ATTRS = dict(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, conv_kernel=4, max_verify_tokens=4)


def _gdn_inputs(mode, attrs):
    """Input descriptors with unknown T/B for ``attrs`` (what TensorRT sees at build time)."""
    c = 2 * attrs["num_k_heads"] * attrs["head_k_dim"] + attrs["num_v_heads"] * attrs["head_v_dim"]
    hv, kc, kv = attrs["num_v_heads"], attrs["conv_kernel"], attrs["max_verify_tokens"]
    if mode == 0:
        return [(2, (-1, c)), (2, (c, kc)), (2, (-1, hv)), (2, (-1, hv)), (0, (hv,)), (0, (hv,)), (3, (-1,)),
                (3, (-1,)), (3, (-1,)), (4, (1,)), (4, (1,))] + ([(3, (-1,))] if attrs.get("zero_state_input") else [])
    return [(2, (-1, kv, c)), (0, (-1, kv, 2, hv)), (2, (c, kc)), (3, (-1,)), (3, (-1,)), (3, (-1,)), (3, (-1,)),
            (4, (1,)), (4, (1,))]


def test_gdn_spec_and_fields():
    spec = plugins.load_spec("DFlash2GatedDeltaNet")
    assert (spec.version, spec.namespace) == ("1", "dflash2")
    assert [a.name for a in spec.attributes] == ["mode", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim",
                                                 "conv_kernel", "max_verify_tokens", "chunk_size", "zero_state_input"]
    assert spec.attribute("mode").enum == {"forward": 0, "commit": 1}
    fwd = [t.name for t in spec.inputs if t.when in (None, "mode == 0")]
    com = [t.name for t in spec.inputs if t.when in (None, "mode == 1")]
    assert fwd == ["qkv", "conv_weight", "a", "b", "dt_bias", "A_log", "cu_seqlens", "slot_mapping",
                   "host_request_types", "rnn_state_ptr", "conv_state_ptr"]
    assert com == ["verify_qkv", "verify_gates", "conv_weight", "num_accepted", "cu_seqlens", "slot_mapping",
                   "host_request_types", "rnn_state_ptr", "conv_state_ptr"]
    assert [t.name for t in spec.inputs if t.when == "mode == 0 and zero_state_input == 1"] == ["zero_state"]
    assert [t.name for t in spec.outputs] == ["y", "verify_qkv", "verify_gates", "committed"]
    assert plugins.attribute_values("DFlash2GatedDeltaNet", **_GDN_ATTRS) == {"mode": 0, **_GDN_ATTRS, "chunk_size": 64,
                                                                              "zero_state_input": 0}
    assert plugins.attribute_values("DFlash2GatedDeltaNet", mode="commit", **_GDN_ATTRS)["mode"] == 1


def test_gdn_input_names_match_validation_messages(gdn_lib):
    """The YAML's input order is the validation's (each message names the input it checks)."""
    spec = plugins.load_spec("DFlash2GatedDeltaNet")
    for mode, zs in ((0, 0), (0, 1), (1, 0)):
        when = {None, f"mode == {mode}"} | ({"mode == 0 and zero_state_input == 1"} if zs else set())
        names = [t.name for t in spec.inputs if t.when in when]
        attrs = dict(_GDN_ATTRS, zero_state_input=zs)
        for i, name in enumerate(names):
            ins = _gdn_inputs(mode, attrs)
            code, shape = ins[i]
            ins[i] = (99, shape)  # an unknown dtype at position i
            rc, msg = gdn_lib.validate(ins, mode, **attrs)
            assert rc == 1 and f"input {i} ({name})" in msg, (mode, i, msg)


def test_gdn_ranges_match_validation(gdn_lib):
    spec = plugins.load_spec("DFlash2GatedDeltaNet")
    for a in spec.attributes:
        if a.enum is not None:
            for v in a.enum.values():
                attrs = dict(_GDN_ATTRS, chunk_size=64)
                assert gdn_lib.validate(_gdn_inputs(v, attrs), v, **attrs) == (0, ""), (a.name, v)
            continue
        for v, ok in ((a.min, True), (a.max, True), (None if a.min is None else a.min - 1, False),
                      (None if a.max is None else a.max + 1, False)):
            if v is None:
                continue
            attrs = {**_GDN_ATTRS, "chunk_size": 64, a.name: v}
            if a.name == "num_k_heads":
                attrs["num_v_heads"] = max(v, 1)  # keep Hv a multiple of Hk
            if a.name == "num_v_heads":
                attrs["num_k_heads"] = 1
            rc, msg = gdn_lib.validate(_gdn_inputs(0, attrs), "forward", **attrs)
            assert (rc == 0) == ok, (a.name, v, msg)
            if not ok:
                assert a.name in msg, msg
