"""Header and index validation of the lazy reader: every way a safetensors header or a sharded
index can lie is one CheckpointError naming the file (and the tensor), before any data is read.

Until these checks, overlapping byte ranges and a name given twice in one header loaded without
a word (``json.loads`` keeps the last duplicate), and ``convert`` wrote wrong weights from them.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from dflash2_trt.checkpoint import SafetensorsCheckpoint
from dflash2_trt.checkpoint.reader import read_header
from dflash2_trt.errors import CheckpointError
from dflash2_trt.testing import corrupt
from dflash2_trt.testing.corrupt import CORRUPTIONS, corrupt_copy


def _file(tmp_path, **tensors):
    p = tmp_path / "model.safetensors"
    save_file(tensors or {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4), "c": torch.zeros(2)}, str(p))
    return p


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


def test_overlapping_offsets(tmp_path):
    p = _file(tmp_path, a=torch.ones(4), b=torch.zeros(4), c=torch.full((4,), 2.0))
    corrupt.alias_offsets(p, "c", "a")           # c reads a's bytes; c's own bytes own nothing
    with pytest.raises(CheckpointError) as ei:
        read_header(p)
    msg = _one_line(ei)
    assert msg.startswith(f"{p}: tensor '") and "overlap tensor" in msg
    assert {ei.value.tensor, "a", "c"} == {"a", "c"}


def test_partial_overlap(tmp_path):
    p = _file(tmp_path, a=torch.ones(4), b=torch.zeros(4))
    def fn(h):
        b0 = h["b"]["data_offsets"][0]
        h["b"]["data_offsets"] = [b0 - 4, b0 + 12]
    corrupt.edit_header(p, fn)
    with pytest.raises(CheckpointError, match=r"overlap tensor 'a'"):
        read_header(p)


def test_gap_between_tensors(tmp_path):
    p = _file(tmp_path)
    corrupt.edit_header(p, lambda h: h.pop("b"))  # b's bytes stay, owned by nobody
    with pytest.raises(CheckpointError) as ei:
        read_header(p)
    msg = _one_line(ei)
    assert str(p) in msg and "belong to no tensor" in msg and "tile the data section" in msg


def test_gap_at_the_start(tmp_path):
    p = _file(tmp_path, a=torch.ones(4), b=torch.zeros(4))
    corrupt.edit_header(p, lambda h: h.pop("a"))
    with pytest.raises(CheckpointError, match=r"tensor 'b': corrupt header: bytes \[0, 16\) at the start"):
        read_header(p)


def test_duplicate_name_in_one_header(tmp_path):
    p = _file(tmp_path, a=torch.ones(4), b=torch.zeros(4))
    corrupt.duplicate_name(p, "a", "b")
    assert json.loads(corrupt.split_file(p)[0])["a"]["data_offsets"] == [16, 32]  # what json.loads would use
    with pytest.raises(CheckpointError) as ei:
        read_header(p)
    assert _one_line(ei) == f"{p}: tensor 'a': corrupt safetensors header: this tensor name appears twice in the header"


def test_duplicate_key_inside_an_entry(tmp_path):
    p = _file(tmp_path, a=torch.ones(4))
    header, data = corrupt.split_file(p)
    corrupt.write_raw(p, header.decode().replace('"dtype":"F32"', '"dtype":"F32","dtype":"F16"'), data)
    with pytest.raises(CheckpointError, match="key 'dtype' appears twice"):
        read_header(p)


@pytest.mark.parametrize("meta", [{"format": "pt", "step": 3}, ["format", "pt"], "pt", {"a": None}])
def test_metadata_must_map_strings_to_strings(tmp_path, meta):
    p = _file(tmp_path)
    corrupt.edit_header(p, lambda h: h.update({"__metadata__": meta}))
    with pytest.raises(CheckpointError) as ei:
        read_header(p)
    assert "__metadata__ must map strings to strings" in _one_line(ei) and str(p) in str(ei.value)


def test_null_and_string_metadata_accepted(tmp_path):
    p = _file(tmp_path)
    corrupt.edit_header(p, lambda h: h.update({"__metadata__": None}))
    assert read_header(p)[1] == {}
    corrupt.edit_header(p, lambda h: h.update({"__metadata__": {"format": "pt"}}))
    assert read_header(p)[1] == {"format": "pt"}


@pytest.mark.parametrize("edit", [
    lambda e: e.update(shape=["2", 3]),
    lambda e: e.update(shape=[2.0, 3]),
    lambda e: e.update(shape=[True, 3]),
    lambda e: e.update(data_offsets=[0.0, 24]),
    lambda e: e.update(data_offsets=[0, 24, 24]),
    lambda e: e.pop("dtype"),
])
def test_entry_fields_must_be_json_integers(tmp_path, edit):
    p = _file(tmp_path)
    corrupt.edit_header(p, lambda h: edit(h["a"]))
    with pytest.raises(CheckpointError, match="tensor 'a': corrupt header entry"):
        read_header(p)


def test_zero_size_tensors_tile(tmp_path):
    p = _file(tmp_path, a=torch.ones(2), e=torch.zeros(0), f=torch.zeros(0, 3), z=torch.ones(1))
    assert sorted(read_header(p)[0]) == ["a", "e", "f", "z"]


def test_same_name_in_two_files_without_index(tmp_path):
    save_file({"a": torch.ones(2)}, str(tmp_path / "x.safetensors"))
    save_file({"a": torch.ones(2)}, str(tmp_path / "y.safetensors"))
    with pytest.raises(CheckpointError, match="y.safetensors: tensor 'a': tensor appears in two files"):
        SafetensorsCheckpoint(tmp_path)


# ---- sharded index -------------------------------------------------------------------------------

@pytest.fixture
def sharded(tiny_dense, tmp_path):
    d = tmp_path / "drafter"
    shutil.copytree(tiny_dense.drafter_dir, d)
    files = corrupt.shard(d)
    ck = SafetensorsCheckpoint(d)
    assert len(ck.files) == 2 and len(ck) == 36
    return d, files


def test_same_name_in_two_shards(sharded):
    d, files = sharded
    corrupt._same_name_two_shards(d, files)
    with pytest.raises(CheckpointError) as ei:
        SafetensorsCheckpoint(d)
    msg = _one_line(ei)
    assert "tensor 'norm.weight': tensor appears in two shards" in msg and files[0] in msg and files[1] in msg


def test_index_lists_a_tensor_its_shard_lacks(sharded):
    d, files = sharded
    corrupt._index_wrong_shard(d, files)
    with pytest.raises(CheckpointError) as ei:
        SafetensorsCheckpoint(d)
    msg = _one_line(ei)
    assert "tensor 'norm.weight'" in msg and "lacks it (it is in" in msg


def test_shard_holds_a_tensor_the_index_does_not_list(sharded):
    d, files = sharded
    corrupt._index_unlisted(d, files)
    with pytest.raises(CheckpointError) as ei:
        SafetensorsCheckpoint(d)
    assert "tensor 'norm.weight': tensor not listed in model.safetensors.index.json" in _one_line(ei)


@pytest.mark.parametrize("how", ["dotdot", "absolute", "nested dotdot"])
def test_shard_path_must_stay_inside_the_directory(sharded, how):
    d, files = sharded
    if how == "dotdot":
        corrupt._index_escapes(d, files)
        bad = "../outside.safetensors"
    else:
        bad = str((d / files[1]).resolve()) if how == "absolute" else f"sub/../../{files[1]}"
        corrupt.edit_index(d, lambda idx: idx["weight_map"].update(
            {k: bad for k, v in idx["weight_map"].items() if v == files[1]}))
    with pytest.raises(CheckpointError) as ei:
        SafetensorsCheckpoint(d)
    msg = _one_line(ei)
    assert msg.startswith(str(d / "model.safetensors.index.json")) and repr(bad) in msg
    assert "not a file inside the checkpoint directory" in msg


def test_symlinked_shards_are_allowed_and_dangling_ones_named(sharded, tmp_path):
    """The HF cache keeps snapshot files as symlinks into blobs/: those must keep working."""
    d, files = sharded
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for f in files:
        (d / f).rename(blobs / f)
        (d / f).symlink_to(blobs / f)
    assert len(SafetensorsCheckpoint(d)) == 36
    (d / files[1]).unlink()
    (d / files[1]).symlink_to("../blobs/nowhere")
    with pytest.raises(CheckpointError) as ei:
        SafetensorsCheckpoint(d)
    assert "is a symlink to '../blobs/nowhere', which does not exist" in _one_line(ei)


@pytest.mark.parametrize("weight_map", [{"a": 3}, {"a": ""}, ["a"]])
def test_index_values_must_be_file_names(sharded, weight_map):
    d, _ = sharded
    corrupt.edit_index(d, lambda idx: idx.update(weight_map=weight_map))
    with pytest.raises(CheckpointError, match="model.safetensors.index.json.*invalid index"):
        SafetensorsCheckpoint(d)


def test_index_with_a_tensor_listed_twice(sharded):
    d, files = sharded
    p = d / "model.safetensors.index.json"
    p.write_text(p.read_text().replace('"weight_map": {', f'"weight_map": {{"norm.weight": "{files[1]}",', 1))
    with pytest.raises(CheckpointError, match="'norm.weight' appears twice"):
        SafetensorsCheckpoint(d)


# ---- the catalogue used by the command-level tests -------------------------------------------------

@pytest.mark.parametrize("case", [c for c in CORRUPTIONS if c.stage == "reader"], ids=lambda c: c.name)
def test_catalogue_reader_cases(tiny_dense, tmp_path, case):
    """Each structural corruption of the catalogue is caught by the reader itself (the inventory
    and value cases are caught later, by the commands: tests/test_loading.py)."""
    d, t = corrupt_copy(tiny_dense, case, tmp_path)
    with pytest.raises(CheckpointError) as ei:
        SafetensorsCheckpoint(d if case.side == "drafter" else t)
    assert case.needle in _one_line(ei)
