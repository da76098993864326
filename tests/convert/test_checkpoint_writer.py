"""The streaming safetensors writer and the atomic output directory, on their own."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dflash2_trt.checkpoint.reader import read_header
from dflash2_trt.checkpoint.writer import (
    AtomicOutputDir, OutputWriteError, SafetensorsLayout, StreamingSafetensorsWriter, TensorSpec, HashWorker,
    sha256_file,
)
from dflash2_trt.errors import CheckpointError


def _specs():
    return [TensorSpec("b", "F32", (3, 5)), TensorSpec("a", "BF16", (7,)), TensorSpec("c", "F16", (2, 2, 2))]


def test_out_of_order_writes_give_a_valid_file_and_the_right_digest(tmp_path):
    tensors = {"b": torch.randn(3, 5), "a": torch.randn(7).bfloat16(), "c": torch.randn(2, 2, 2).half()}
    layout = SafetensorsLayout(_specs(), {"format": "pt"})
    assert layout.data_start % 8 == 0
    hasher = HashWorker()
    w = StreamingSafetensorsWriter(tmp_path / "x.safetensors", layout, hasher)
    raw = {k: v.contiguous().view(torch.uint8).numpy().tobytes() for k, v in tensors.items()}
    # c first, then b's second half, a, b's first half: completion order differs from file order.
    w.write("c", 0, raw["c"])
    w.write("b", 30, raw["b"][30:])
    w.write("a", 0, raw["a"])
    w.write("b", 0, raw["b"][:30])
    w.finish()
    hasher.close()
    digest = w.sha256()
    w.close()
    got = load_file(str(tmp_path / "x.safetensors"))
    assert set(got) == set(tensors) and all(torch.equal(got[k], tensors[k]) for k in tensors)
    assert digest == sha256_file(tmp_path / "x.safetensors")
    infos, meta, _ = read_header(tmp_path / "x.safetensors")  # the project's strict reader accepts it
    assert meta == {"format": "pt"} and infos["c"].shape == (2, 2, 2)


def test_incomplete_tensor_is_an_error(tmp_path):
    w = StreamingSafetensorsWriter(tmp_path / "x.safetensors", SafetensorsLayout(_specs()))
    w.write("b", 0, bytes(60))
    w.write("a", 0, bytes(14))
    w.write("c", 0, bytes(8))  # 8 of 16 bytes: a hole would read back as zeros
    with pytest.raises(CheckpointError, match="not fully written"):
        w.finish()
    with pytest.raises(CheckpointError, match="overflows"):
        w.write("c", 8, bytes(9))
    w.close()


def test_atomic_dir_removed_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with AtomicOutputDir(tmp_path / "out") as tmp:
            (tmp / "f").write_text("x")
            assert tmp.parent == tmp_path and tmp.name.startswith(".out.tmp-")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_commit_and_permissions(tmp_path):
    with AtomicOutputDir(tmp_path / "out") as tmp:
        (tmp / "f").write_text("x")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o777 & ~umask


@pytest.mark.parametrize("kernel_copy_fails", [False, True])
def test_copy_from_another_file_and_fallback(tmp_path, monkeypatch, kernel_copy_fails):
    import errno

    src = tmp_path / "src.bin"
    payload = os.urandom(60 + 14 + 16)
    src.write_bytes(b"xx" + payload)
    if kernel_copy_fails:  # e.g. a file system without copy_file_range support: plain writes instead
        def boom(*a, **kw):
            raise OSError(errno.EXDEV, "cross-device")
        monkeypatch.setattr(os, "copy_file_range", boom)
    fd = os.open(src, os.O_RDONLY)
    try:
        w = StreamingSafetensorsWriter(tmp_path / "x.safetensors", SafetensorsLayout(_specs()))
        w.write("b", 0, payload[:60], copy_from=(fd, 2))
        w.write("a", 0, payload[60:74], copy_from=(fd, 62))
        w.write("c", 0, payload[74:])
        w.finish()
        digest = w.sha256()
        w.close()
    finally:
        os.close(fd)
    data = (tmp_path / "x.safetensors").read_bytes()
    assert data.endswith(payload)
    assert digest == sha256_file(tmp_path / "x.safetensors")


def test_atomic_dir_failed_final_rename_with_force_restores_the_old_output(tmp_path, monkeypatch):
    """With force the old output is moved aside first; if the final rename then fails, the old
    output must be back under its own name (not left hidden as .out.old-*)."""
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("old")
    (final / "manifest.json").write_text('{"format": "dflash2-trt combined TensorRT-LLM checkpoint"}')  # ours
    real, calls = os.replace, []

    def flaky(a, b):
        calls.append((a, b))
        if len(calls) == 2:  # 1: final -> aside, 2: tmp -> final
            raise OSError(28, "No space left on device")
        return real(a, b)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(OutputWriteError, match=re.escape(f"{final}: ") + ".*No space left"):  # one line, not a raw OSError
        with AtomicOutputDir(final, force=True) as tmp:
            (tmp / "new.txt").write_text("new")
    monkeypatch.setattr(os, "replace", real)
    assert len(calls) >= 2
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert sorted(p.name for p in final.iterdir()) == ["manifest.json", "old.txt"]


def test_write_behind_drops_only_written_back_and_hashed_pages(tmp_path, monkeypatch):
    """With a small write-behind window: pages are waited for and dropped from the page cache a
    window behind the writes, never above the hashed frontier (out-of-order writes are read back
    from the file there), and the file and its digest are exact."""
    from dflash2_trt.checkpoint import writer as wmod

    if wmod._sync_file_range is None:
        pytest.skip("no sync_file_range on this platform")
    monkeypatch.setattr(wmod, "_WB_STEP", 4096)
    monkeypatch.setattr(wmod, "_WB_WINDOW", 8192)
    calls, drops = [], []
    real_sfr, real_fadvise = wmod._sync_file_range, os.posix_fadvise
    layout = SafetensorsLayout([TensorSpec("x", "U8", (64, 1024))], {"format": "pt"})
    w = None

    def sfr(fd, off, n, flags):
        calls.append((off, n, flags))
        real_sfr(fd, off, n, flags)

    def fadvise(fd, off, n, advice):
        if w is not None and fd == w._fd:
            assert off + n <= w._hashed, (off, n, w._hashed)
            drops.append((off, n))
        real_fadvise(fd, off, n, advice)

    monkeypatch.setattr(wmod, "_sync_file_range", sfr)
    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    data = os.urandom(64 * 1024)
    w = StreamingSafetensorsWriter(tmp_path / "x.safetensors", layout)  # hashes synchronously
    order = list(range(0, 32)) + list(range(40, 64)) + list(range(32, 40))  # a late block in the middle
    for i in order:
        w.write("x", i * 1024, data[i * 1024:(i + 1) * 1024])
    w.finish()
    digest = w.sha256()
    w.close()
    assert (tmp_path / "x.safetensors").read_bytes()[layout.data_start:] == data
    assert digest == sha256_file(tmp_path / "x.safetensors")
    assert any(flags == 7 for _, _, flags in calls) and drops
    assert all(a + n <= b for (a, n), (b, _) in zip(drops, drops[1:]))  # each page dropped once


@pytest.mark.parametrize("err,fails", [(5, True), (22, False)])  # EIO: a write error; EINVAL: unsupported
def test_write_behind_errors(tmp_path, monkeypatch, err, fails):
    from dflash2_trt.checkpoint import writer as wmod

    monkeypatch.setattr(wmod, "_WB_STEP", 4096)

    def sfr(fd, off, n, flags):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(wmod, "_sync_file_range", sfr)
    layout = SafetensorsLayout([TensorSpec("x", "U8", (16, 1024))])
    w = StreamingSafetensorsWriter(tmp_path / "x.safetensors", layout)
    data = os.urandom(16 * 1024)
    try:
        if fails:
            with pytest.raises(OSError) as exc:
                w.write("x", 0, data)
            assert exc.value.errno == err and exc.value.filename == str(tmp_path / "x.safetensors")
        else:
            w.write("x", 0, data)
            w.finish()
            assert w.sha256() == sha256_file(tmp_path / "x.safetensors")
    finally:
        w.close()


@pytest.mark.parametrize("hashed", [True, False])
def test_write_check_sees_every_block_in_order(tmp_path, monkeypatch, hashed):
    """``check`` gets consecutive blocks of each write, whether the write is at the hashed frontier
    (checked while hashing) or ahead of it (checked at once, hashed later), and its error fails it."""
    from dflash2_trt.checkpoint import writer as wmod

    monkeypatch.setattr(wmod, "CHECK_BLOCK", 100)
    layout = SafetensorsLayout([TensorSpec("x", "U8", (1000,))])
    data = os.urandom(1000)
    seen = []
    hasher = HashWorker() if hashed else None
    w = StreamingSafetensorsWriter(tmp_path / "x.safetensors", layout, hasher)
    w.write("x", 600, data[600:], None, lambda blk: seen.append(("late", blk.tobytes())))  # ahead of the frontier
    w.write("x", 0, data[:600], None, lambda blk: seen.append(("first", blk.tobytes())))
    if hasher is not None:
        hasher.close()
    w.finish()
    assert w.sha256() == sha256_file(tmp_path / "x.safetensors")
    w.close()
    late = b"".join(b for k, b in seen if k == "late")
    first = b"".join(b for k, b in seen if k == "first")
    assert (first, late) == (data[:600], data[600:]) and all(len(b) <= 100 for _, b in seen)

    def bad(blk):
        if blk[0] == 0xFF:
            raise CheckpointError("bad block")

    hasher = HashWorker() if hashed else None
    w = StreamingSafetensorsWriter(tmp_path / "y.safetensors", layout, hasher)
    try:
        with pytest.raises(CheckpointError, match="bad block"):
            w.write("x", 0, b"\0" * 500 + b"\xff" * 500, None, bad)
            if hasher is not None:
                hasher.close()
    finally:
        w.close()


def test_a_copy_that_fails_names_the_output_file_not_its_source(tmp_path, monkeypatch):
    """A copy's OSError names its source first (shutil: 'SRC' -> 'DST'): `deploy triton` on a full disk said
    "error: .../dflash2_trt/deploy/triton/models/preprocessing.py: No space left on device (while writing REPO)", the
    package's own file first. The file being written inside the output is named now."""
    import errno
    import shutil

    src = tmp_path / "model.py"
    src.write_text("x = 1\n")

    def full(a, b, *args, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(a), None, str(b))

    monkeypatch.setattr(shutil, "copyfile", full)
    out = tmp_path / "repo"
    with pytest.raises(OutputWriteError) as e:
        with AtomicOutputDir(out) as tmp:
            (tmp / "pre" / "1").mkdir(parents=True)
            shutil.copy(src, tmp / "pre" / "1" / "model.py")
    assert str(e.value) == f"{out}: cannot write pre/1/model.py: No space left on device"
    assert not out.exists()


def test_force_replaces_only_what_a_dflash2_trt_command_wrote(tmp_path):
    """--force deletes the directory it replaces: only one holding an output of this project (its marker file with
    the project's format) qualifies, so a mistyped --output of other files is refused, not deleted."""
    import json

    from dflash2_trt.checkpoint.writer import OUTPUT_MARKERS, OutputDirError, check_output_dir, is_project_output
    from dflash2_trt.convert.schema import FORMAT as CHECKPOINT_FORMAT
    from dflash2_trt.engine.format import ENGINE_FORMAT
    from dflash2_trt.onnx.export import FORMAT as ONNX_FORMAT

    repository = "dflash2-trt triton repository"   # deploy/triton/repository.py writes it inline
    assert f'"format": "{repository}"' in (Path(__file__).resolve().parents[2] / "dflash2_trt" / "deploy" / "triton"
                                           / "repository.py").read_text()
    for name, fmt in (("engine.json", ENGINE_FORMAT), ("manifest.json", CHECKPOINT_FORMAT),
                      ("manifest.json", ONNX_FORMAT), ("dflash2_repository.json", repository)):
        assert name in OUTPUT_MARKERS
        d = tmp_path / f"{name}-{fmt}".replace(" ", "_")
        d.mkdir()
        (d / "other.bin").write_bytes(b"x")
        (d / name).write_text(json.dumps({"format": fmt}))
        assert is_project_output(d) and check_output_dir(d, True) == d
    docs = tmp_path / "documents"
    docs.mkdir()
    for marker in ("", "{}", '{"format": "safetensors"}', "[1, 2]", "not json"):
        if marker:
            (docs / "manifest.json").write_text(marker)
        (docs / "thesis.txt").write_text("important")
        assert not is_project_output(docs)
        with pytest.raises(OutputDirError, match="holds no dflash2-trt output.*remove it yourself"):
            check_output_dir(docs, True)
    assert sorted(p.name for p in docs.iterdir()) == ["manifest.json", "thesis.txt"]
