"""Lazy safetensors reading: single file, sharded, prefixes, and every corruption named."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from dflash2_trt.checkpoint import SafetensorsCheckpoint, check_inventory, expected_drafter_tensors
from dflash2_trt.checkpoint.inventory import Expected
from dflash2_trt.config import DFlash2Config
from dflash2_trt.errors import CheckpointError


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "model.language_model.a.weight": torch.randn(4, 3, generator=g),
        "model.language_model.b.weight": torch.randn(5, generator=g).to(torch.bfloat16),
        "model.visual.c": torch.randn(2, 2, generator=g),
        "lm_head.weight": torch.randn(7, 3, generator=g),
    }


def _sharded(tmp_path, tensors):
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / fname))
        weight_map.update({k: fname for k in keys})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return shards


def test_single_file_and_prefix(tmp_path):
    t = _tensors()
    save_file(t, str(tmp_path / "model.safetensors"))
    ck = SafetensorsCheckpoint(tmp_path)
    assert sorted(ck.keys()) == sorted(t)
    for k, v in t.items():
        assert torch.equal(ck.get(k), v)
        assert ck.info(k).shape == tuple(v.shape)
    lm = ck.with_prefix("model.language_model.")
    assert sorted(lm.keys()) == ["a.weight", "b.weight"]
    assert torch.equal(lm.get("a.weight"), t["model.language_model.a.weight"])
    with pytest.raises(CheckpointError, match="model.language_model.zzz"):
        lm.get("zzz")


def test_sharded_reading(tmp_path):
    t = _tensors()
    _sharded(tmp_path, t)
    ck = SafetensorsCheckpoint(tmp_path)
    assert len(ck.files) == 2 and sorted(ck.keys()) == sorted(t)
    for k, v in t.items():
        assert torch.equal(ck.get(k), v)


def test_missing_shard_named(tmp_path):
    shards = _sharded(tmp_path, _tensors())
    gone = sorted(shards)[1]
    (tmp_path / gone).unlink()
    with pytest.raises(CheckpointError) as ei:
        SafetensorsCheckpoint(tmp_path)
    assert gone in str(ei.value) and "missing" in str(ei.value)


def test_index_names_tensor_absent_from_shard(tmp_path):
    _sharded(tmp_path, _tensors())
    idx = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    idx["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match="ghost.weight"):
        SafetensorsCheckpoint(tmp_path)


@pytest.mark.parametrize("cut", [3, 40, -1])
def test_truncated_file_named(tmp_path, cut):
    save_file(_tensors(), str(tmp_path / "model.safetensors"))
    p = tmp_path / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[:cut])
    with pytest.raises(CheckpointError) as ei:
        SafetensorsCheckpoint(tmp_path)
    assert "model.safetensors" in str(ei.value) and "truncated" in str(ei.value)


def test_corrupt_header_named(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes((20).to_bytes(8, "little") + b"{this is not json!!}" + b"\0" * 8)
    with pytest.raises(CheckpointError, match="model.safetensors: corrupt safetensors header"):
        SafetensorsCheckpoint(tmp_path)


def test_trailing_garbage_rejected(tmp_path):
    save_file(_tensors(), str(tmp_path / "model.safetensors"))
    with open(tmp_path / "model.safetensors", "ab") as fh:
        fh.write(b"\0" * 16)
    with pytest.raises(CheckpointError, match="does not match its header"):
        SafetensorsCheckpoint(tmp_path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weight_named(tmp_path, bad):
    t = _tensors()
    t["model.language_model.a.weight"][1, 2] = bad
    save_file(t, str(tmp_path / "model.safetensors"))
    ck = SafetensorsCheckpoint(tmp_path)
    with pytest.raises(CheckpointError) as ei:
        ck.get("model.language_model.a.weight")
    msg = str(ei.value)
    assert "model.safetensors" in msg and "model.language_model.a.weight" in msg and "non-finite" in msg
    assert ck.get("model.language_model.a.weight", check_finite=False).shape == (4, 3)


def test_no_weights_and_missing_dir(tmp_path):
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        SafetensorsCheckpoint(tmp_path)
    with pytest.raises(CheckpointError, match="not found"):
        SafetensorsCheckpoint(tmp_path / "nope")


def test_inventory_reports_everything(tmp_path):
    t = _tensors()
    save_file(t, str(tmp_path / "model.safetensors"))
    ck = SafetensorsCheckpoint(tmp_path)
    expected = {
        "model.language_model.a.weight": Expected((4, 3), "F32"),
        "model.language_model.b.weight": Expected((6,), "BF16"),
        "lm_head.weight": Expected((7, 3), "F16"),
        "model.language_model.missing": Expected((1,), "F32"),
    }
    rep = check_inventory(ck, expected, ignore_prefixes=("model.visual.",))
    assert rep.missing == ["model.language_model.missing"]
    assert rep.unexpected == []
    assert rep.ignored == {"model.visual.": 1}
    assert len(rep.wrong_shape) == 1 and "b.weight" in rep.wrong_shape[0]
    assert len(rep.wrong_dtype) == 1 and "lm_head" in rep.wrong_dtype[0]
    with pytest.raises(CheckpointError, match="1 missing, 0 unexpected, 1 wrong shape, 1 wrong dtype"):
        rep.raise_for_problems()
    rep = check_inventory(ck, expected)
    assert rep.unexpected == ["model.visual.c"]


def test_tiny_drafter_inventory_exact(tiny):
    cfg = DFlash2Config.from_hugging_face(tiny.drafter_dir)
    rep = check_inventory(SafetensorsCheckpoint(tiny.drafter_dir), expected_drafter_tensors(cfg))
    assert rep.ok and rep.missing == [] and rep.unexpected == [] and rep.checked == 6 + 15 * 2


def test_tiny_drafter_extra_tensor_reported(tiny, tmp_path):
    d = tmp_path / "drafter"
    shutil.copytree(tiny.drafter_dir, d)
    ck = SafetensorsCheckpoint(d)
    tensors = {k: ck.get(k) for k in ck.keys()}
    tensors["embed_tokens.weight"] = torch.zeros(256, 64)
    del tensors["layers.1.mlp_conv.base_kernel"]
    ck.close()
    save_file(tensors, str(d / "model.safetensors"))
    cfg = DFlash2Config.from_hugging_face(d)
    rep = check_inventory(SafetensorsCheckpoint(d), expected_drafter_tensors(cfg))
    assert rep.unexpected == ["embed_tokens.weight"]
    assert rep.missing == ["layers.1.mlp_conv.base_kernel"]
