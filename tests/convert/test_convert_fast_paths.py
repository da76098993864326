"""What keeps ``convert`` near the cost of a plain copy, checked structurally (no timings):

* start-up: the command imports neither torch nor transformers before the data pass;
* the target inventory (transformers, ~3 s to import) runs while the data streams, and its
  verdict still comes first and still stops the output from being put in place;
* at tp 1 with the source dtype every data byte is copied by the kernel (``copy_file_range``),
  row-parallel tensors (a "column slice" as wide as the row) included;
* the manifest's sha256 of every file is that of the bytes on disk, whatever path wrote them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from dflash2_trt.checkpoint import writer as writer_mod
from dflash2_trt.convert import convert_pair, driver
from dflash2_trt.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[2]


def test_convert_start_up_imports_neither_torch_nor_transformers():
    code = ("import sys; import dflash2_trt.cli, dflash2_trt.convert, dflash2_trt.checkpoint; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _inventory_waiting_for_the_stream(monkeypatch, extra: str | None = None) -> dict:
    """Make the target inventory wait (up to 20 s) for the first tensor write, and record whether
    it came: with the inventory run before the data pass it never does."""
    first_write = threading.Event()
    seen = {"overlapped": None}
    real_write = writer_mod.StreamingSafetensorsWriter.write
    real_expected = driver.expected_target_tensors

    def write(self, *a, **k):
        first_write.set()
        return real_write(self, *a, **k)

    def expected(cfg):
        seen["overlapped"] = first_write.wait(20)
        out = real_expected(cfg)
        if extra is not None:
            out[extra] = next(iter(out.values()))
        return out

    monkeypatch.setattr(writer_mod.StreamingSafetensorsWriter, "write", write)
    monkeypatch.setattr(driver, "expected_target_tensors", expected)
    return seen


def test_target_inventory_runs_while_the_data_streams(wide_pairs, tmp_path, monkeypatch):
    seen = _inventory_waiting_for_the_stream(monkeypatch)
    d, t = wide_pairs["qwen3_5"]
    convert_pair(d, t, tmp_path / "ckpt", tp_size=2)
    assert seen["overlapped"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_target_inventory_failing_during_the_stream_leaves_nothing(wide_pairs, tmp_path, monkeypatch):
    seen = _inventory_waiting_for_the_stream(monkeypatch, extra="model.language_model.layers.0.extra.weight")
    d, t = wide_pairs["qwen3_5"]
    out_root = tmp_path / "out"
    with pytest.raises(CheckpointError, match=r"missing tensor model\.language_model\.layers\.0\.extra\.weight"):
        convert_pair(d, t, out_root / "ckpt", tp_size=2)
    assert seen["overlapped"] is True
    assert not out_root.exists()  # nor its temporary directory, nor the parent made for it


def _break(directory: Path, name: str) -> None:
    path = directory / "model.safetensors"
    sd = load_file(str(path))
    sd.pop(name)
    save_file(sd, str(path), metadata={"format": "pt"})


def test_target_inventory_error_comes_before_later_errors(tiny_hybrid, tmp_path):
    """As when it ran first: with the drafter broken as well, the error names the target's tensor."""
    d, t = tmp_path / "drafter", tmp_path / "target"
    shutil.copytree(tiny_hybrid.drafter_dir, d)
    shutil.copytree(tiny_hybrid.target_dir, t)
    _break(t, "model.language_model.layers.1.mlp.up_proj.weight")
    _break(d, "layers.0.mlp_conv.base_kernel")
    with pytest.raises(CheckpointError) as exc:
        convert_pair(d, t, tmp_path / "out" / "ckpt", tp_size=2)
    assert "model.language_model.layers.1.mlp.up_proj.weight" in str(exc.value)
    assert "base_kernel" not in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_tp1_same_dtype_data_is_all_copied_by_the_kernel(wide_pairs, tmp_path, monkeypatch):
    written = {"kernel": 0, "user": 0}
    real_write = writer_mod.StreamingSafetensorsWriter.write

    def write(self, name, offset, data, copy_from=None, *rest):
        written["kernel" if copy_from is not None else "user"] += memoryview(data).nbytes
        return real_write(self, name, offset, data, copy_from, *rest)

    monkeypatch.setattr(writer_mod.StreamingSafetensorsWriter, "write", write)
    d, t = wide_pairs["qwen3_5"]  # has row-parallel o_proj / down_proj / out_proj
    res = convert_pair(d, t, tmp_path / "ckpt", tp_size=1)
    assert written == {"kernel": res.bytes_read, "user": 0}


@pytest.mark.parametrize("tp,dtype,kernel_copy", [(1, None, True), (1, "float16", True), (2, None, True),
                                                  (2, None, False), (4, "bfloat16", True)])
def test_manifest_sha256_is_that_of_the_files_on_disk(wide_pairs, tmp_path, monkeypatch, tp, dtype, kernel_copy):
    """Hashing happens while writing (from the mapped source, the cast buffers, or re-read from
    the output for out-of-order writes): the digests must still be those of the files."""
    monkeypatch.setattr(driver, "KERNEL_COPY", kernel_copy)
    d, t = wide_pairs["qwen3_5"]
    out = tmp_path / "ckpt"
    convert_pair(d, t, out, tp_size=tp, dtype=dtype)
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert sorted(f["name"] for f in files) == sorted(p.name for p in out.iterdir() if p.name != "manifest.json")
    for f in files:
        data = (out / f["name"]).read_bytes()
        assert (f["size"], f["sha256"]) == (len(data), hashlib.sha256(data).hexdigest()), f["name"]



@pytest.mark.parametrize("tp", [1, 4])
def test_write_behind_keeps_the_conversion_exact(wide_pairs, tmp_path, monkeypatch, tp):
    """A tiny write-behind window, so pages are written back and dropped throughout the rank files
    (at tp 4 with out-of-order pieces hashed back from the file): still an exact round trip."""
    from test_convert_roundtrip import _check_roundtrip

    from dflash2_trt.checkpoint import writer as wmod

    monkeypatch.setattr(wmod, "_WB_STEP", 4096)
    monkeypatch.setattr(wmod, "_WB_WINDOW", 4096)
    monkeypatch.setattr(driver, "CHUNK_BYTES", 3000)
    d, t = wide_pairs["qwen3_5"]
    out = tmp_path / "ckpt"
    convert_pair(d, t, out, tp_size=tp)
    _check_roundtrip(d, t, out)
    for f in json.loads((out / "manifest.json").read_text())["files"]:
        assert f["sha256"] == hashlib.sha256((out / f["name"]).read_bytes()).hexdigest(), f["name"]


def test_write_back_error_is_one_line_and_leaves_nothing(tiny_dense, tmp_path, monkeypatch):
    from dflash2_trt.checkpoint import writer as wmod
    from dflash2_trt.checkpoint.writer import OutputWriteError

    monkeypatch.setattr(wmod, "_WB_STEP", 4096)

    def sfr(fd, off, n, flags):
        raise OSError(5, os.strerror(5))

    monkeypatch.setattr(wmod, "_sync_file_range", sfr)
    out_root = tmp_path / "out"
    with pytest.raises(OutputWriteError) as exc:
        convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, out_root / "ckpt")
    msg = str(exc.value)
    assert "\n" not in msg and "rank0.safetensors" in msg and "Input/output error" in msg, msg
    assert not out_root.exists()


def test_non_finite_found_at_tp1_by_the_check_done_while_hashing(tiny_hybrid, tmp_path, monkeypatch):
    """At tp 1 a chunk usually goes whole to one file: its NaN/Inf check runs block by block with
    the hashing. A NaN in a late block of a late chunk is still found, and nothing is left."""
    d, t = tmp_path / "drafter", tmp_path / "target"
    shutil.copytree(tiny_hybrid.drafter_dir, d)
    shutil.copytree(tiny_hybrid.target_dir, t)
    path = t / "model.safetensors"
    sd = load_file(str(path))
    name = "model.language_model.layers.3.mlp.down_proj.weight"
    sd[name][-1, -1] = float("inf")
    save_file(sd, str(path), metadata={"format": "pt"})
    monkeypatch.setattr(writer_mod, "CHECK_BLOCK", 64)
    monkeypatch.setattr(driver, "CHUNK_BYTES", 2048)
    raised_on = []
    real_call = driver._FiniteCheck.__call__

    def call(self, raw, *a, **k):
        try:
            return real_call(self, raw, *a, **k)
        except CheckpointError:
            raised_on.append(raw.nbytes)
            raise

    monkeypatch.setattr(driver._FiniteCheck, "__call__", call)
    with pytest.raises(CheckpointError, match="non-finite") as exc:
        convert_pair(d, t, tmp_path / "out" / "ckpt", tp_size=1)
    assert name in str(exc.value)
    assert raised_on == [64]  # found by the block-wise check fused with the hashing
    assert not (tmp_path / "out").exists()
