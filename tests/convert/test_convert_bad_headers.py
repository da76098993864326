"""``convert`` on headers that lie about where tensors live (QA finding, issue 9): with overlapping
byte ranges or a tensor name given twice, convert used to exit 0 and write WRONG weights (the
output's q_layernorm held the source k_norm bytes). Now it is one error line and no output."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dflash2_trt.cli import main
from dflash2_trt.convert import convert_pair
from dflash2_trt.errors import CheckpointError
from dflash2_trt.testing import corrupt
from dflash2_trt.testing.corrupt import D_K, D_Q

CASES = {
    "overlapping offsets": (lambda p: corrupt.alias_offsets(p, D_Q, D_K), "overlap"),
    "duplicate name": (lambda p: corrupt.duplicate_name(p, D_Q, D_K), "appears twice"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lying_header_is_an_error_not_wrong_weights(tiny_dense, tmp_path, case):
    from shutil import copytree

    d, t = tmp_path / "src" / "drafter", tmp_path / "src" / "target"
    copytree(tiny_dense.drafter_dir, d)
    copytree(tiny_dense.target_dir, t)
    edit, needle = CASES[case]
    edit(d / "model.safetensors")
    out_root = tmp_path / "out"
    out_root.mkdir()
    with pytest.raises(CheckpointError) as ei:
        convert_pair(d, t, out_root / "ckpt")
    msg = str(ei.value)
    assert needle in msg and str(d / "model.safetensors") in msg and "\n" not in msg
    assert list(out_root.iterdir()) == []
    r = CliRunner().invoke(main, ["convert", "--drafter", str(d), "--target-dir", str(t),
                                  "--output", str(out_root / "ckpt")])
    assert r.exit_code == 1 and r.output.strip() == f"error: {msg}", r.output
    assert list(out_root.iterdir()) == []


def test_convert_takes_float32_as_build_and_export_onnx_do(tmp_path):
    """`convert --dtype float32` (an audit found it refused by the option's choices, while build and export-onnx take
    it and convert itself writes float32 from a float32 checkpoint)."""
    import json

    from click.testing import CliRunner

    from dflash2_trt.cli import main

    r = CliRunner().invoke(main, ["convert", "--target", "tiny", "--output", str(tmp_path / "c"), "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "c" / "config.json").read_text())["dtype"] == "float32"
