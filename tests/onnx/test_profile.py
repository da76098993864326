"""export-onnx's optimisation profile: min <= opt <= max in every dimension of every input (TensorRT refuses a
profile otherwise), in the manifest and in the printed trtexec command, at the edges of --max-seq-len; and
--max-batch-size bounded like ``build``'s max_batch_size."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from dflash2_trt.cli import main
from dflash2_trt.config.build import MAX_EAGLE_BATCH
from dflash2_trt.onnx.export import profile_shapes

BLOCK = 8      # the tiny qwen3 drafter's dflash_config.block_size
MPE = 512      # the tiny qwen3 target's max_position_embeddings


def _export(tmp_path, *extra):
    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["export-onnx", "--target", "tiny", "--output", str(out), *extra])
    return r, out


def _printed_shapes(output: str) -> dict[str, dict[str, list[int]]]:
    """--minShapes/--optShapes/--maxShapes of the printed trtexec line -> kind -> input -> dims."""
    out = {}
    for kind in ("min", "opt", "max"):
        (spec,) = re.findall(rf"--{kind}Shapes=(\S+)", output)
        out[kind] = {name: [int(d) for d in dims.split("x")]
                     for name, dims in (item.split(":") for item in spec.split(","))}
    return out


def _assert_ordered(lo, mid, hi, what):
    assert len(lo) == len(mid) == len(hi), what
    for i, (a, b, c) in enumerate(zip(lo, mid, hi)):
        assert 0 <= a <= b <= c, f"{what} dim {i}: min {a}, opt {b}, max {c}"


@pytest.mark.parametrize("max_seq_len", [BLOCK + 1, 2 * BLOCK - 1, 2 * BLOCK, BLOCK + 24, None])
def test_profile_min_le_opt_le_max(tmp_path, max_seq_len):
    extra = [] if max_seq_len is None else ["--max-seq-len", str(max_seq_len)]
    r, out = _export(tmp_path, *extra)
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    for dim, (lo, mid, hi) in m["profile"].items():
        _assert_ordered([lo], [mid], [hi], f"profile {dim}")
    assert m["profile"]["batch"][0] >= 1 and m["profile"]["context_length"][0] >= 1
    seq = MPE if max_seq_len is None else max_seq_len
    assert m["profile"]["context_length"][2] + BLOCK <= seq and m["profile"]["past_length"][2] + BLOCK <= seq
    assert m["profile"]["context_length"][1] == min(BLOCK, seq - BLOCK)
    shapes = profile_shapes(m)
    for name, (lo, mid, hi) in shapes.items():
        _assert_ordered(lo, mid, hi, f"manifest shapes {name}")
    printed = _printed_shapes(r.output)
    assert set(printed["min"]) == set(printed["opt"]) == set(printed["max"]) == set(shapes)
    for name in shapes:
        _assert_ordered(printed["min"][name], printed["opt"][name], printed["max"][name], f"trtexec {name}")
        assert tuple(printed[k][name] for k in ("min", "opt", "max")) == shapes[name]


def test_max_batch_size_upper_bound(tmp_path):
    for bad in (MAX_EAGLE_BATCH + 1, 100000000, 0):
        r, out = _export(tmp_path, "--max-batch-size", str(bad), "--max-seq-len", "64")
        assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
        assert r.output.startswith(f"error: --max-batch-size: must be an integer in [1, {MAX_EAGLE_BATCH}]")
        assert str(bad) in r.output and not out.exists()
    r, out = _export(tmp_path, "--max-batch-size", str(MAX_EAGLE_BATCH), "--max-seq-len", "64")
    assert r.exit_code == 0, r.output
    assert _printed_shapes(r.output)["max"]["block_ids"] == [MAX_EAGLE_BATCH, BLOCK]
