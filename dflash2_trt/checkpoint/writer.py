"""Streaming safetensors writing and atomic output directories.

``safetensors.torch.save_file`` needs every tensor in memory at once. A converter must not hold
the model, so the file is written here by hand from a header computed up front (names, dtypes and
shapes are known from the weight map before any tensor is read):

    [8-byte little-endian header length N][N bytes of JSON header, space-padded to 8][data]

The data section is filled by positioned writes (``pwrite``) in any order (no ``ftruncate``
pre-sizing: on ext4 writing into a pre-sized sparse file measured ~1.5x slower than appending), so one pass over the source tensors can scatter each tensor's slices into every rank
file. Each tensor's received byte count is tracked; :meth:`StreamingSafetensorsWriter.finish`
refuses a file with a tensor not fully written (a hole in the data section reads back as zeros —
a silent failure that this check turns into an error).

SHA-256 of each file is computed while converting, in a background thread (hashlib releases the
GIL, so it runs on another core): a write that lands at the file's hashed frontier is hashed
straight from the caller's buffer; a write ahead of the frontier is remembered and read back
from the page cache once the frontier reaches it. The caller keeps each buffer alive until a
:meth:`_HashWorker.fence` it queued after the writes has passed.

:class:`AtomicOutputDir` writes into a temporary directory beside the final one and renames it
into place only when complete; an exception or Ctrl-C (KeyboardInterrupt) removes it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import queue
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import CheckpointError, DFlash2Error

ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1}
_HASH_BLOCK = 8 << 20


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # safetensors tag
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


class SafetensorsLayout:
    """Header bytes and data offsets of a safetensors file holding ``specs`` in that order."""

    def __init__(self, specs: Iterable[TensorSpec], metadata: Mapping[str, str] | None = None):
        self.specs = list(specs)
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate tensor names in one file: {dup[:5]}")
        header: dict = {}
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        self.offsets: dict[str, tuple[int, int]] = {}
        pos = 0
        for s in self.specs:
            if s.dtype not in ITEMSIZE:
                raise ValueError(f"unsupported dtype tag {s.dtype!r} for {s.name}")
            header[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [pos, pos + s.nbytes]}
            self.offsets[s.name] = (pos, pos + s.nbytes)
            pos += s.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-(8 + len(raw)) % 8)  # data section starts 8-byte aligned, as safetensors does
        self.header = len(raw).to_bytes(8, "little") + raw
        self.data_start = len(self.header)
        self.data_bytes = pos
        self.total_bytes = self.data_start + pos


class _HashWorker:
    """Hashes written data in a background thread, in file order per writer (see the module doc)."""

    def __init__(self):
        self._q: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dflash2-sha256", daemon=True)
        self._thread.start()

    def submit(self, writer: "StreamingSafetensorsWriter", offset: int, data) -> None:
        self._q.put((writer, offset, data))

    def fence(self) -> threading.Event:
        """An event set once everything submitted before it has been hashed (or failed)."""
        ev = threading.Event()
        self._q.put(ev)
        return ev

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            if self._error is not None:
                continue
            writer, offset, data = item
            try:
                writer._hash_piece(offset, data)
            except BaseException as exc:  # reported by close()
                self._error = exc

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


class StreamingSafetensorsWriter:
    """One safetensors file filled by positioned writes from a precomputed :class:`SafetensorsLayout`."""

    def __init__(self, path: str | Path, layout: SafetensorsLayout, hasher: _HashWorker | None = None):
        self.path = Path(path)
        self.layout = layout
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self._closed = False
        self._written = {s.name: 0 for s in layout.specs}
        self._sha = hashlib.sha256()
        self._hashed = 0  # file bytes [0, _hashed) are hashed
        self._pending: dict[int, int] = {}  # written but not yet hashed: offset -> length
        self._hasher = hasher
        self._copy_ok = hasattr(os, "copy_file_range")
        self._put(layout.header, 0)

    def _put(self, data, offset: int, copy_from: tuple[int, int] | None = None) -> None:
        if copy_from is not None and self._copy_ok:
            try:
                self._copy(copy_from, offset, memoryview(data).nbytes)
            except OSError as exc:  # e.g. EXDEV/EINVAL on some file systems: plain writes from now on
                if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF):
                    raise
                self._copy_ok = False
                copy_from = None
        if copy_from is None or not self._copy_ok:
            view = memoryview(data).cast("B")
            pos = offset
            while view:
                n = os.pwrite(self._fd, view, pos)
                view = view[n:]
                pos += n
        if self._hasher is not None:
            self._hasher.submit(self, offset, data)
        else:
            self._hash_piece(offset, data)

    def _copy(self, copy_from: tuple[int, int], offset: int, n: int) -> None:
        fd, src = copy_from
        done = 0
        while done < n:
            k = os.copy_file_range(fd, self._fd, n - done, src + done, offset + done)
            if k <= 0:
                raise CheckpointError(f"copy_file_range returned {k} at byte {offset + done}", file=self.path)
            done += k

    def write(self, name: str, offset: int, data, copy_from: tuple[int, int] | None = None) -> None:
        """Write ``data`` (any contiguous buffer) at byte ``offset`` inside tensor ``name``.

        With a hash worker, ``data`` must stay unchanged until a later fence has passed.
        ``copy_from=(fd, file_offset)`` says ``data`` is exactly those bytes of another file: they
        are then copied file to file inside the kernel (``copy_file_range``), and ``data`` is only
        hashed.
        """
        begin, end = self.layout.offsets[name]
        n = memoryview(data).nbytes
        if offset < 0 or begin + offset + n > end:
            raise CheckpointError(f"write of {n} bytes at {offset} overflows the tensor ({end - begin} bytes)",
                                  file=self.path, tensor=name)
        if self._written[name] + n > end - begin:
            raise CheckpointError("tensor received more bytes than it holds (overlapping writes)",
                                  file=self.path, tensor=name)
        self._put(data, self.layout.data_start + begin + offset, copy_from)
        self._written[name] += n

    # -- hashing (runs in the hash worker thread when there is one) --
    def _hash_piece(self, offset: int, data) -> None:
        n = memoryview(data).nbytes
        if offset != self._hashed:
            if offset < self._hashed or offset in self._pending:
                raise CheckpointError(f"overlapping write at byte {offset}", file=self.path)
            self._pending[offset] = n
            return
        self._sha.update(memoryview(data).cast("B"))
        self._hashed += n
        self._drain()

    def _drain(self) -> None:
        while self._hashed in self._pending:
            end = self._hashed + self._pending.pop(self._hashed)
            while self._hashed < end:
                block = os.pread(self._fd, min(_HASH_BLOCK, end - self._hashed), self._hashed)
                if not block:
                    raise CheckpointError(f"short read while hashing at byte {self._hashed}", file=self.path)
                self._sha.update(block)
                self._hashed += len(block)

    def incomplete(self) -> list[str]:
        return [s.name for s in self.layout.specs if self._written[s.name] != s.nbytes]

    def finish(self) -> None:
        """Check completeness and fsync. The digest is available after the hash worker closes."""
        missing = self.incomplete()
        if missing:
            raise CheckpointError(f"{len(missing)} tensor(s) not fully written, e.g. {missing[:3]}", file=self.path,
                                  tensor=missing[0])
        size = os.fstat(self._fd).st_size
        if size != self.layout.total_bytes:
            raise CheckpointError(f"file has {size} bytes, its header needs {self.layout.total_bytes}", file=self.path)
        os.fsync(self._fd)

    def sha256(self) -> str:
        """The file's digest; call after :meth:`finish` and after the hash worker closed."""
        self._drain()
        if self._hashed != self.layout.total_bytes:
            raise CheckpointError(f"hashed {self._hashed} of {self.layout.total_bytes} bytes (a write was lost)",
                                  file=self.path)
        return self._sha.hexdigest()

    def close(self) -> None:
        if not self._closed:
            os.close(self._fd)
            self._closed = True


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(_HASH_BLOCK)
            if not block:
                return h.hexdigest()
            h.update(block)


def write_small_file(path: str | Path, text: str) -> None:
    """Write a small text file and fsync it (used inside an :class:`AtomicOutputDir`)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


class OutputDirError(DFlash2Error):
    """The output directory cannot be used (exists and not empty, is a file, ...)."""


def check_output_dir(final: str | Path, force: bool) -> Path:
    """Refuse a non-empty ``final`` unless ``force``; never touches the disk."""
    final = Path(final)
    if final.exists() or final.is_symlink():
        if not final.is_dir():
            raise OutputDirError(f"{final}: exists and is not a directory")
        if any(final.iterdir()) and not force:
            raise OutputDirError(f"{final}: output directory is not empty (pass --force to replace it)")
    return final


class AtomicOutputDir:
    """``with AtomicOutputDir(final, force) as tmp:`` — write into ``tmp``; renamed to ``final`` on success.

    The temporary directory lives beside ``final`` (same file system, so the rename is atomic).
    On any exception, KeyboardInterrupt included, it is deleted and ``final`` is left as it was;
    parent directories created for it are removed again. With ``force`` an existing ``final``
    is moved aside, replaced, then deleted.
    """

    def __init__(self, final: str | Path, *, force: bool = False):
        self.final = check_output_dir(final, force).absolute()
        self.force = force
        self.tmp: Path | None = None
        self._created_parents: list[Path] = []

    def __enter__(self) -> Path:
        parent = self.final.parent
        missing = []
        p = parent
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            d.mkdir()
            self._created_parents.append(d)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.tmp-", dir=parent))
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(self.tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; the result should look like mkdir's
        return self.tmp

    def _cleanup(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        for d in reversed(self._created_parents):
            try:
                d.rmdir()
            except OSError:
                pass

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._cleanup()
            return
        try:
            self._commit()
        except BaseException:
            self._cleanup()
            raise

    def _commit(self) -> None:
        assert self.tmp is not None
        old = None
        if self.final.exists():
            check_output_dir(self.final, self.force)  # re-check: it may have changed meanwhile
            if any(self.final.iterdir()):
                old = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.old-", dir=self.final.parent))
                os.rmdir(old)
                os.replace(self.final, old)
        try:
            os.replace(self.tmp, self.final)  # replaces an empty directory too
        except BaseException:
            # Silent failure mode otherwise: the previous output stays moved aside under a hidden
            # ".NAME.old-*" name and ``final`` is gone. Put it back before reporting the error.
            if old is not None:
                os.replace(old, self.final)
            raise
        self.tmp = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        try:
            fd = os.open(self.final.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:  # some file systems refuse fsync on directories; the rename is done
            pass


__all__ = [
    "AtomicOutputDir", "OutputDirError", "SafetensorsLayout", "StreamingSafetensorsWriter", "TensorSpec",
    "check_output_dir", "sha256_file", "write_small_file", "ITEMSIZE",
]
