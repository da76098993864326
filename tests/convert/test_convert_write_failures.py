"""The output side of convert failing: read-only, full or forbidden file systems, symlinked
--output paths, an interrupt during the final swap, and what a killed run leaves behind.

Each failure is one DFlash2Error line naming the output path (never a raw OSError traceback) and
leaves nothing behind; once the new output has been swapped in, the run is a success.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash2_trt.checkpoint import writer as writer_mod
from dflash2_trt.cli import main
from dflash2_trt.convert import convert_pair
from dflash2_trt.errors import DFlash2Error


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def _convert(pair, out, **kw):
    return convert_pair(pair.drafter_dir, pair.target_dir, out, **kw)


def _cli(pair, out, *extra):
    return CliRunner().invoke(main, ["convert", "--drafter", str(pair.drafter_dir), "--target-dir",
                                     str(pair.target_dir), "--output", str(out), *extra])


def _assert_one_line_error(exc: BaseException, path: Path, reason: str) -> None:
    msg = str(exc)
    assert isinstance(exc, DFlash2Error), repr(exc)
    assert "\n" not in msg and str(path) in msg and reason in msg, msg


def _fail_under(monkeypatch, root: Path, name: str, err: int, *, after: int = 0, suffix: str = ""):
    """Make ``os.<name>(path_or_fd, ...)`` fail with ``err`` for paths under ``root`` ending in
    ``suffix`` (any fd for fd-based calls), after ``after`` successful calls."""
    real = getattr(os, name)
    calls = {"n": 0}

    def fake(first, *a, **kw):
        path = str(os.fspath(first)) if isinstance(first, (str, os.PathLike)) else None
        under = path is None or (path.startswith(str(root)) and path.endswith(suffix))
        if under:
            calls["n"] += 1
            if calls["n"] > after:
                raise OSError(err, os.strerror(err), None if isinstance(first, int) else os.fspath(first))
        return real(first, *a, **kw)
    monkeypatch.setattr(os, name, fake)


# ---- read-only / full / forbidden ------------------------------------------------------------

def test_read_only_output_file_system(tiny_dense, tmp_path, monkeypatch):
    out_root = tmp_path / "ro"
    out_root.mkdir()
    _fail_under(monkeypatch, out_root, "mkdir", errno.EROFS)
    with pytest.raises(DFlash2Error) as ei:
        _convert(tiny_dense, out_root / "a" / "ckpt")  # missing parent: the first mkdir fails
    _assert_one_line_error(ei.value, out_root / "a" / "ckpt", "Read-only file system")
    with pytest.raises(DFlash2Error) as ei:
        _convert(tiny_dense, out_root / "ckpt")          # the temporary directory cannot be made
    _assert_one_line_error(ei.value, out_root / "ckpt", "Read-only file system")
    monkeypatch.undo()
    assert _names(out_root) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_output_directory_for_real(tiny_dense, tmp_path):
    out_root = tmp_path / "locked"
    out_root.mkdir()
    out_root.chmod(0o555)
    try:
        with pytest.raises(DFlash2Error) as ei:
            _convert(tiny_dense, out_root / "ckpt")
        _assert_one_line_error(ei.value, out_root / "ckpt", "Permission denied")
    finally:
        out_root.chmod(0o755)
    assert _names(out_root) == []


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_disk_full_while_streaming(tiny_hybrid, tmp_path, monkeypatch, kernel_copy):
    """ENOSPC from pwrite / copy_file_range in the middle of the rank files."""
    import dflash2_trt.convert.driver as driver

    monkeypatch.setattr(driver, "KERNEL_COPY", kernel_copy)
    _fail_under(monkeypatch, tmp_path, "pwrite", errno.ENOSPC, after=5)
    if hasattr(os, "copy_file_range"):
        _fail_under(monkeypatch, tmp_path, "copy_file_range", errno.ENOSPC, after=3)
    with pytest.raises(DFlash2Error) as ei:
        _convert(tiny_hybrid, tmp_path / "ckpt", tp_size=2)
    _assert_one_line_error(ei.value, tmp_path / "ckpt", "No space left on device")
    assert _names(tmp_path) == []


def test_disk_full_at_fsync_and_in_small_files(tiny_dense, tmp_path, monkeypatch):
    _fail_under(monkeypatch, tmp_path, "fsync", errno.ENOSPC)
    with pytest.raises(DFlash2Error) as ei:
        _convert(tiny_dense, tmp_path / "ckpt")
    _assert_one_line_error(ei.value, tmp_path / "ckpt", "No space left on device")
    assert _names(tmp_path) == []
    monkeypatch.undo()
    real = writer_mod.write_small_file

    def full(path, text):
        if Path(path).name == "manifest.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, text)
    monkeypatch.setattr("dflash2_trt.convert.driver.write_small_file", full)
    with pytest.raises(DFlash2Error) as ei:
        _convert(tiny_dense, tmp_path / "ckpt")
    _assert_one_line_error(ei.value, tmp_path / "ckpt", "No space left on device")
    assert "manifest.json" in str(ei.value)
    assert _names(tmp_path) == []


def test_permission_denied_creating_a_rank_file(tiny_dense, tmp_path, monkeypatch):
    _fail_under(monkeypatch, tmp_path, "open", errno.EACCES, suffix=".safetensors")  # rmtree opens dirs
    with pytest.raises(DFlash2Error) as ei:
        _convert(tiny_dense, tmp_path / "ckpt")
    _assert_one_line_error(ei.value, tmp_path / "ckpt", "Permission denied")
    assert "rank0.safetensors" in str(ei.value)
    monkeypatch.undo()
    assert _names(tmp_path) == []


def test_cli_disk_full_is_one_line(tiny_dense, tmp_path, monkeypatch):
    _fail_under(monkeypatch, tmp_path, "pwrite", errno.ENOSPC, after=2)
    if hasattr(os, "copy_file_range"):
        _fail_under(monkeypatch, tmp_path, "copy_file_range", errno.ENOSPC)
    r = _cli(tiny_dense, tmp_path / "ckpt")
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.exception, r.output)
    assert r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    assert str(tmp_path / "ckpt") in r.output and "No space left on device" in r.output
    monkeypatch.undo()
    assert _names(tmp_path) == []


# ---- symlinks ------------------------------------------------------------------------------

@pytest.mark.parametrize("force", [False, True])
def test_dangling_symlink_output_is_refused(tiny_dense, tmp_path, force):
    link = tmp_path / "ckpt"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(DFlash2Error, match="symbolic link") as ei:
        _convert(tiny_dense, link, force=force)
    assert "\n" not in str(ei.value) and str(link) in str(ei.value)
    assert _names(tmp_path) == ["ckpt"] and link.is_symlink() and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("force", [False, True])
def test_symlink_to_a_directory_is_refused(tiny_dense, tmp_path, force):
    """Neither written through (into the link's target) nor replaced by a real directory."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "keep.txt").write_text("user data")
    link = tmp_path / "ckpt"
    link.symlink_to(real)
    with pytest.raises(DFlash2Error, match="symbolic link"):
        _convert(tiny_dense, link, force=force)
    assert _names(real) == ["keep.txt"] and link.is_symlink()
    assert _names(tmp_path) == ["ckpt", "real"]


def test_dangling_symlink_among_the_parents(tiny_dense, tmp_path):
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    r = _cli(tiny_dense, tmp_path / "gone" / "sub" / "ckpt")
    assert r.exit_code == 1 and "symbolic link" in r.output and "Traceback" not in r.output, r.output
    assert str(tmp_path / "gone") in r.output
    assert _names(tmp_path) == ["gone"]


# ---- the directory the user is in ----------------------------------------------------------

@pytest.mark.parametrize("command", ["convert", "build"])
@pytest.mark.parametrize("output,needle", [("", "the output path is empty"), (".", "is the current directory"),
                                           ("..", "is a directory above the current one")])
def test_an_empty_output_or_the_current_directory_is_refused(tiny_dense, tmp_path, monkeypatch, command, output,
                                                             needle):
    """`--output ''` is Path('') = '.', so `--force` used to replace the current directory and all it held."""
    here = tmp_path / "work"
    here.mkdir()
    (here / "keep.txt").write_text("user data")
    monkeypatch.chdir(here)
    r = CliRunner().invoke(main, [command, "--drafter", str(tiny_dense.drafter_dir), "--target-dir",
                                  str(tiny_dense.target_dir), "--output", output, "--force"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1 and needle in lines[0], r.output
    assert _names(here) == ["keep.txt"] and _names(tmp_path) == ["work"]


# ---- interrupted swap ----------------------------------------------------------------------

def test_interrupt_in_old_output_removal_after_the_swap_is_a_success(tiny_hybrid, tmp_path, monkeypatch):
    """Ctrl-C while the replaced output is being deleted (after the new one is in place) used to
    exit 130 'interrupted' with the new output in place and a hidden .ckpt.old-* beside it."""
    out = tmp_path / "ckpt"
    _convert(tiny_hybrid, out, tp_size=1)
    real = shutil.rmtree
    hits = []

    def rmtree(path, *a, **kw):
        if ".ckpt.old-" in str(path) and not hits:
            hits.append(path)
            (Path(path) / "rank0.safetensors").unlink()   # part of it is gone, then Ctrl-C
            raise KeyboardInterrupt
        return real(path, *a, **kw)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    try:
        res = _convert(tiny_hybrid, out, tp_size=2, force=True)
    except KeyboardInterrupt:
        pytest.fail("interrupted after the new output was swapped in")
    assert hits and res.tp_size == 2
    assert "rank1.safetensors" in _names(out)
    assert _names(tmp_path) == ["ckpt"]  # the old output is gone, nothing hidden beside it


def test_real_sigint_during_the_swap_is_deferred(tiny_hybrid, tmp_path, monkeypatch):
    """A SIGINT delivered between the two renames of the swap: the run completes and succeeds."""
    out = tmp_path / "ckpt"
    _convert(tiny_hybrid, out, tp_size=1)
    real = os.replace
    sent = []

    def replace(src, dst, *a, **kw):
        if ".ckpt.old-" in str(dst) and not sent:  # final -> old: the first half of the swap
            sent.append(dst)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        return real(src, dst, *a, **kw)
    monkeypatch.setattr(os, "replace", replace)
    try:
        r = _cli(tiny_hybrid, out, "--tp-size", "2", "--force")
    except KeyboardInterrupt:
        pytest.fail("interrupted in the middle of the swap")
    assert sent and r.exit_code == 0, r.output
    assert "rank1.safetensors" in _names(out) and _names(tmp_path) == ["ckpt"]


# ---- leftovers of a killed run ---------------------------------------------------------------

def test_stale_temporary_and_old_dirs_are_removed_and_named(tiny_dense, tmp_path):
    out = tmp_path / "ckpt"
    _convert(tiny_dense, out)
    stale_tmp, stale_old = tmp_path / ".ckpt.tmp-abcd1234", tmp_path / ".ckpt.old-x_y9z0qq"
    for d in (stale_tmp, stale_old):
        d.mkdir()
        (d / "rank0.safetensors").write_bytes(b"partial")
    other = tmp_path / ".other.tmp-abcd1234"  # another output's: not ours to touch
    other.mkdir()
    r = _cli(tiny_dense, out, "--force")
    assert r.exit_code == 0, r.output
    assert _names(tmp_path) == [".other.tmp-abcd1234", "ckpt"]
    assert str(stale_tmp) in r.output and str(stale_old) in r.output and "removed" in r.output


def test_a_live_runs_temporary_dir_is_left_alone(tiny_dense, tmp_path):
    """A temporary directory whose run is still alive (it holds a lock on it) is not removed."""
    fcntl = pytest.importorskip("fcntl")
    live = tmp_path / ".ckpt.tmp-live0000"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _convert(tiny_dense, tmp_path / "ckpt")
        assert live.is_dir()
    finally:
        os.close(fd)
    _convert(tiny_dense, tmp_path / "ckpt", force=True)  # the lock is gone: now it is stale
    assert _names(tmp_path) == ["ckpt"]


_SLOW_CONVERT = textwrap.dedent("""
    import sys, time
    from dflash2_trt.checkpoint import writer
    real = writer.StreamingSafetensorsWriter.write
    def slow(self, *a, **kw):
        time.sleep(0.01)
        return real(self, *a, **kw)
    writer.StreamingSafetensorsWriter.write = slow
    from dflash2_trt.convert import convert_pair
    convert_pair(sys.argv[1], sys.argv[2], sys.argv[3], tp_size=4, force=True)
""")


def test_sigkilled_run_leftovers_are_removed_by_the_next_run(tiny_hybrid, tmp_path):
    out = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_CONVERT, str(tiny_hybrid.drafter_dir),
                             str(tiny_hybrid.target_dir), str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and not any(p.name.startswith(".ckpt.tmp-") for p in tmp_path.iterdir()):
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.2)
    proc.kill()  # SIGKILL: no cleanup can run
    proc.wait(timeout=60)
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt.tmp-")]
    assert left, _names(tmp_path)
    res = _convert(tiny_hybrid, out, tp_size=2)
    assert [Path(p) for p in res.stale_removed] == left
    assert _names(tmp_path) == ["ckpt"]
