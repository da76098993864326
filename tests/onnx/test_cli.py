"""The export-onnx command: parsing and printing only (the work is dflash2_trt.onnx.export)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from dflash2_trt.cli import main


def test_export_onnx_command(tmp_path):
    r = CliRunner().invoke(main, ["export-onnx", "--target", "tiny", "--output", str(tmp_path / "o"),
                                  "--no-plugins", "--max-seq-len", "64"])
    assert r.exit_code == 0, r.output
    assert "no plugins, float32, opset 18" in r.output and "trtexec --onnx=" in r.output
    assert "--dynamicPlugins" not in r.output
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["target"] == "tiny" and m["command"]
    r = CliRunner().invoke(main, ["export-onnx", "--target", "tiny", "--output", str(tmp_path / "p"),
                                  "--tp-size", "2"])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and r.output.startswith("error: --tp-size: 2")
    assert not (tmp_path / "p").exists()
    h = CliRunner().invoke(main, ["export-onnx", "--help"])
    assert "--dynamicPlugins=plugins/build/libdflash2_plugins_dynamic.so" in h.output
    assert "--staticPlugins" in h.output
