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
:meth:`HashWorker.fence` it queued after the writes has passed.

Write-behind: every 256 MiB the writer waits for the writeback of what it wrote more than 1 GiB
before (``sync_file_range``) and drops those pages, already hashed, from the page cache; so a
multi-GB file never fills memory with its own dirty and cached pages (which made every further
page cost reclaim: 4x the kernel CPU time of a plain copy, measured) and the final fsync is short.

:class:`AtomicOutputDir` writes into a temporary directory beside the final one and renames it
into place only when complete; an exception or Ctrl-C (KeyboardInterrupt) removes it. A failed
write (read-only or full file system, no permission) is one :class:`OutputWriteError` line naming
the output and the file. Once the swap into place starts, SIGINT/SIGTERM are held back until it
and the removal of the replaced output are done: the run then succeeds (for an output nested in
another one still being written, such as an engine's checkpoint, the signal is delivered after
the inner swap, and stops the whole run). A run killed outright
(SIGKILL, power loss) leaves ``.NAME.tmp-*`` / ``.NAME.old-*`` beside the output; the next run
removes them unless a live run holds a lock on them (``flock`` on the directory), naming each on
stderr (:func:`notice`). A run killed between the two renames of the swap leaves no output and the
previous one under ``.NAME.old-*``: the next run renames it back first (:func:`recover_swapped`).
The CLI turns SIGTERM into :class:`~dflash2_trt.errors.Terminated` (a KeyboardInterrupt), so it
unwinds exactly like Ctrl-C.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from ..errors import CheckpointError, DFlash2Error, committed_outputs, raise_if_stop_requested

ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1}
_HASH_BLOCK = 8 << 20
CHECK_BLOCK = 1 << 20  # a write's ``check`` sees blocks this size (fits the L2 cache with the hash)
# Write-behind (see StreamingSafetensorsWriter._write_behind): every _WB_STEP bytes, wait for the
# writeback of what was written more than _WB_WINDOW ago and drop those clean, hashed pages.
_WB_STEP = 256 << 20
_WB_WINDOW = 1 << 30


def _libc_sync_file_range():
    """``sync_file_range(2)`` through libc (Linux; ``os`` has no wrapper), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):  # pragma: no cover - no such libc symbol
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int

    def call(fd: int, offset: int, nbytes: int, flags: int) -> None:
        if fn(fd, offset, nbytes, flags) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    return call


_SFR_WAIT_BEFORE, _SFR_WRITE, _SFR_WAIT_AFTER = 1, 2, 4
_sync_file_range = _libc_sync_file_range()

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locks, so leftovers are never swept
    fcntl = None


def _named(exc: OSError, path: str | Path) -> OSError:
    """``exc`` with ``path`` as its file name (fd-based calls such as pwrite/fsync have none)."""
    if exc.filename is not None:
        return exc
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


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


class HashWorker:
    """Hashes written data in a background thread, in file order per writer (see the module doc)."""

    def __init__(self):
        self._q: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dflash2-sha256", daemon=True)
        self._thread.start()

    def submit(self, writer: "StreamingSafetensorsWriter", offset: int, data, check=None) -> None:
        self._q.put((writer, offset, (data, check)))

    def call(self, fn, *args) -> None:
        """Run ``fn(*args)`` in the worker, in queue order (e.g. a check of a buffer that is then
        hashed); an exception it raises is reported by :meth:`raise_error` / :meth:`close`."""
        self._q.put((None, fn, args))

    def fence(self) -> threading.Event:
        """An event set once everything submitted before it has been hashed (or failed)."""
        ev = threading.Event()
        self._q.put(ev)
        return ev

    def raise_error(self) -> None:
        """Raise the first error the worker met, if any (it skips all work after it)."""
        if self._error is not None:
            raise self._error

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
            writer, a, b = item
            try:
                if writer is None:
                    a(*b)
                else:
                    writer._hash_piece(a, *b)
            except BaseException as exc:  # reported by raise_error() / close()
                self._error = exc

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


class StreamingSafetensorsWriter:
    """One safetensors file filled by positioned writes from a precomputed :class:`SafetensorsLayout`."""

    def __init__(self, path: str | Path, layout: SafetensorsLayout, hasher: HashWorker | None = None):
        self.path = Path(path)
        self.layout = layout
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)  # OSError names the path
        self._closed = False
        self._written = {s.name: 0 for s in layout.specs}
        self._sha = hashlib.sha256()
        self._hashed = 0  # file bytes [0, _hashed) are hashed
        self._pending: dict[int, int] = {}  # written but not yet hashed: offset -> length
        self._hasher = hasher
        self._copy_ok = hasattr(os, "copy_file_range")
        self._wb_next = _WB_STEP  # write-behind (see _write_behind): next trigger,
        self._wb_done = 0  # bytes [0, _wb_done) written back,
        self._wb_dropped = 0  # bytes [0, _wb_dropped) dropped from the page cache
        self._wb_ok = True
        try:
            self._put(layout.header, 0)
        except BaseException:
            self.close()  # the caller never gets this writer to close
            raise

    def _put(self, data, offset: int, copy_from: tuple[int, int] | None = None, check=None) -> None:
        try:
            self._put_raw(data, offset, copy_from, check)
            end = offset + memoryview(data).nbytes
            if end >= self._wb_next:
                self._write_behind(end)
        except OSError as exc:  # e.g. ENOSPC: say which file
            raise _named(exc, self.path) from exc

    def _write_behind(self, end: int) -> None:
        """Keep at most ~:data:`_WB_WINDOW` of this file dirty or cached, as a copy that fsyncs
        each file does: wait for the writeback of what lies a window behind ``end``, drop those
        pages from the page cache once hashed (they are never read again), and start writeback of
        the rest. Measured on a 9 GB conversion: without it the file's dirty and cached pages fill
        memory and every new page costs reclaim (kernel CPU time 4x that of the copy itself).
        """
        self._wb_next = end + _WB_STEP
        if _sync_file_range is None or not self._wb_ok:
            return
        try:
            lag = end - _WB_WINDOW
            if lag > self._wb_done:
                _sync_file_range(self._fd, self._wb_done, lag - self._wb_done,
                                 _SFR_WAIT_BEFORE | _SFR_WRITE | _SFR_WAIT_AFTER)
                hashed = min(lag, self._hashed)  # pages above the hashed frontier may be read back
                if hashed > self._wb_dropped and hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(self._fd, self._wb_dropped, hashed - self._wb_dropped,
                                     os.POSIX_FADV_DONTNEED)
                    self._wb_dropped = hashed
                self._wb_done = lag
            _sync_file_range(self._fd, 0, 0, _SFR_WRITE)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ESPIPE):
                raise  # e.g. EIO / ENOSPC from the writeback: a write error
            self._wb_ok = False  # not supported here: the kernel writes back on its own

    def _put_raw(self, data, offset: int, copy_from: tuple[int, int] | None, check=None) -> None:
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
            self._hasher.submit(self, offset, data, check)
        else:
            self._hash_piece(offset, data, check)

    def _copy(self, copy_from: tuple[int, int], offset: int, n: int) -> None:
        fd, src = copy_from
        done = 0
        while done < n:
            k = os.copy_file_range(fd, self._fd, n - done, src + done, offset + done)
            if k <= 0:
                raise CheckpointError(f"copy_file_range returned {k} at byte {offset + done}", file=self.path)
            done += k

    def write(self, name: str, offset: int, data, copy_from: tuple[int, int] | None = None, check=None) -> None:
        """Write ``data`` (any contiguous buffer) at byte ``offset`` inside tensor ``name``.

        With a hash worker, ``data`` must stay unchanged until a later fence has passed.
        ``copy_from=(fd, file_offset)`` says ``data`` is exactly those bytes of another file: they
        are then copied file to file inside the kernel (``copy_file_range``), and ``data`` is only
        hashed. ``check``, if given, is called (in the hash worker) on consecutive blocks of
        ``data`` (numpy uint8 arrays of at most :data:`CHECK_BLOCK` bytes) just before each is
        hashed, so both read it while it is in the CPU cache; an error it raises fails the write.
        """
        begin, end = self.layout.offsets[name]
        n = memoryview(data).nbytes
        if offset < 0 or begin + offset + n > end:
            raise CheckpointError(f"write of {n} bytes at {offset} overflows the tensor ({end - begin} bytes)",
                                  file=self.path, tensor=name)
        if self._written[name] + n > end - begin:
            raise CheckpointError("tensor received more bytes than it holds (overlapping writes)",
                                  file=self.path, tensor=name)
        self._put(data, self.layout.data_start + begin + offset, copy_from, check)
        self._written[name] += n

    # -- hashing (runs in the hash worker thread when there is one) --
    def _hash_piece(self, offset: int, data, check=None) -> None:
        view = memoryview(data).cast("B")
        n = view.nbytes
        if offset != self._hashed:
            if offset < self._hashed or offset in self._pending:
                raise CheckpointError(f"overlapping write at byte {offset}", file=self.path)
            if check is not None:
                for i in range(0, n, CHECK_BLOCK):
                    check(np.frombuffer(view[i:i + CHECK_BLOCK], dtype=np.uint8))
            self._pending[offset] = n
            return
        if check is None:
            self._sha.update(view)
        else:
            for i in range(0, n, CHECK_BLOCK):
                block = view[i:i + CHECK_BLOCK]
                check(np.frombuffer(block, dtype=np.uint8))
                self._sha.update(block)
        self._hashed += n
        self._drain()

    def _drain(self) -> None:
        try:
            self._drain_raw()
        except OSError as exc:
            raise _named(exc, self.path) from exc

    def _drain_raw(self) -> None:
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
        try:
            size = os.fstat(self._fd).st_size
            if size != self.layout.total_bytes:
                raise CheckpointError(f"file has {size} bytes, its header needs {self.layout.total_bytes}",
                                      file=self.path)
            os.fsync(self._fd)  # a full disk may only show here (delayed allocation)
        except OSError as exc:
            raise _named(exc, self.path) from exc

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
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise _named(exc, path) from exc


class OutputDirError(DFlash2Error):
    """The output directory cannot be used (exists and not empty, is a file, ...)."""


class OutputWriteError(OutputDirError):
    """Writing the output failed: read-only or full file system, no permission, I/O error."""


def check_output_dir(final: str | Path, force: bool) -> Path:
    """Refuse a non-empty ``final`` unless ``force``, and a symlinked one; never writes.

    An ``--output`` that is a symbolic link (dangling or not) is refused: writing through it would
    put the checkpoint somewhere the command line does not say, and the final rename would replace
    the link itself (with ``--force``, the link's target would be left as it was, the link gone).

    An empty path (``--output ''``: ``Path('')`` is ``.``) and the current directory or one above it are refused
    too: replacing them would delete what the user is working in (``--force`` did, with everything in it).
    """
    from ..overlap import refuse_unreachable

    refuse_unreachable(final, "--output")
    if str(final) == "":
        raise OutputDirError("the output path is empty (it would name the current directory); give a directory")
    final = Path(final)
    try:
        here, where = Path.cwd().resolve(), final.resolve()
    except (OSError, RuntimeError):   # no current directory any more, or a link loop (refused below)
        here = where = None
    if here is not None and (where == here or where in here.parents):
        which = "the current directory" if where == here else f"a directory above the current one ({here})"
        raise OutputDirError(f"{final}: is {which}; writing the output there would replace it and everything in "
                             f"it: give a new directory")
    if final.is_symlink():
        raise OutputDirError(f"{final}: is a symbolic link (to {os.readlink(final)}); give the real directory "
                             f"path as --output")
    for p in final.absolute().parents:
        if p.is_symlink() and not p.exists():
            raise OutputDirError(f"{p}: is a dangling symbolic link (to {os.readlink(p)}), a parent of the "
                                 f"output {final}")
    if final.exists():
        if not final.is_dir():
            raise OutputDirError(f"{final}: exists and is not a directory")
        try:
            empty = not any(final.iterdir())
        except OSError as exc:
            raise OutputDirError(f"{final}: cannot read the output directory: {exc.strerror or exc}") from None
        if not empty and not force:
            raise OutputDirError(f"{final}: output directory is not empty (pass --force to replace it)")
        if not empty and not is_project_output(final):
            raise OutputDirError(f"{final}: output directory is not empty and holds no dflash2-trt output "
                                 f"({', '.join(OUTPUT_MARKERS)}); --force replaces only an earlier output, so that a "
                                 f"mistyped --output cannot delete other files: remove it yourself, or give a new "
                                 f"directory")
    return final


# The file at the top of each directory a dflash2-trt command writes (build: engine.json; convert and a kept
# --checkpoint-dir: manifest.json; export-onnx: manifest.json; deploy triton: dflash2_repository.json), whose
# "format" names the project: what --force may replace.
OUTPUT_MARKERS = ("engine.json", "manifest.json", "dflash2_repository.json")


def marker_format(directory, name: str) -> str | None:
    """The ``format`` string the JSON file ``directory/name`` names at its top level, or None (no such file, not
    readable, not JSON, larger than any marker this project writes, no string ``format``)."""
    from ..textfiles import json_loads

    p = Path(directory) / name
    try:
        if not p.is_file() or p.stat().st_size > 64 << 20:
            return None
        doc = json_loads(p.read_bytes())
    except (OSError, ValueError):
        return None
    fmt = doc.get("format") if isinstance(doc, dict) else None
    return fmt if isinstance(fmt, str) else None


def is_project_output(directory: Path) -> bool:
    """Whether ``directory`` holds an output a dflash2-trt command wrote (one of :data:`OUTPUT_MARKERS` with a
    ``format`` naming dflash2-trt; a damaged one does not count)."""
    return any((marker_format(directory, name) or "").startswith("dflash2-trt") for name in OUTPUT_MARKERS)


def _lock(path: Path) -> int | None:
    """Hold an exclusive ``flock`` on directory ``path`` (released when closed or when the process
    dies, SIGKILL included): it tells a later run that this leftover-looking directory is live."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def notice(message: str) -> None:
    """One ``note:`` line on stderr: what a run did on its own beside the output (a leftover removed, an
    output restored). Never silent: a user must learn that something beside ``--output`` changed."""
    print(f"note: {message}", file=sys.stderr, flush=True)


def _leftovers(final: Path, kind: str) -> list[Path]:
    pattern = re.compile(rf"\.{re.escape(final.name)}\.{kind}-[a-z0-9_]{{8}}")
    try:
        entries = sorted(final.parent.iterdir())
    except OSError:
        return []
    return [p for p in entries if pattern.fullmatch(p.name) and not p.is_symlink() and p.is_dir()]


def recover_swapped(final: str | Path) -> Path | None:
    """Put back an output a killed ``--force`` run moved aside and never replaced.

    The swap is two renames (``final`` -> ``.NAME.old-*``, then the new output -> ``final``); a run
    killed between them (SIGKILL, power loss) leaves no ``final``, the previous complete output under
    ``.NAME.old-*``. When ``final`` is absent and such a directory exists that no live run holds, the
    newest one is renamed back to ``final`` and a note says so (the caller then sees an existing output:
    without ``--force`` it is refused as usual); the killed run's other leftovers are then removed
    (:func:`remove_stale`, each named). Returns where it was restored from, else None."""
    final = Path(final).absolute()
    if os.path.lexists(final):
        return None
    olds = sorted(_leftovers(final, "old"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in olds:
        fd = _lock(old)
        if fd is None:   # a live run's swap in progress, or cannot tell: not ours
            continue
        try:
            if not any(old.iterdir()):
                continue
            os.replace(old, final)
        except OSError:
            continue
        finally:
            _unlock(fd)
        notice(f"restored {final} from {old}: a run killed during its --force swap had moved the previous output "
               f"aside and never put a new one in place")
        remove_stale(final)   # that run's half-swapped new output and any older leftovers (each named)
        return old
    return None


def remove_stale(final: Path) -> list[Path]:
    """Remove the ``.NAME.tmp-*`` / ``.NAME.old-*`` directories a killed run left beside ``final``.

    A directory some live run still holds a lock on is left alone, and so is one whose lock
    cannot be tested (no ``fcntl``, or a file system refusing ``flock``). Returns what was removed.
    """
    removed = []
    for p in sorted(_leftovers(final, "tmp") + _leftovers(final, "old")):
        fd = _lock(p)
        if fd is None:  # in use by a live run, or cannot tell
            continue
        try:
            shutil.rmtree(p, ignore_errors=True)
        finally:
            _unlock(fd)
        if not os.path.lexists(p):
            removed.append(p)
            notice(f"removed {p} (left behind by an earlier run that was killed)")
    return removed


_open_outputs = 0   # AtomicOutputDirs entered and not yet exited (nested: a checkpoint inside an engine)


@contextmanager
def _signals_held():
    """Hold SIGINT/SIGTERM back (main thread only): once the swap into place has started, stopping
    half-way would leave the new output in place but the run reported as interrupted, and a
    hidden ``.NAME.old-*`` beside it. Yields the list of signals received meanwhile; the caller
    drops them (the run succeeds) or re-delivers them (an enclosing output is still being written)."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield held
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _discard(path: Path) -> None:
    """Delete the replaced output. The new one is already in place, so nothing here fails the run;
    what cannot be deleted now is swept by the next run (:func:`remove_stale`)."""
    for _ in range(3):
        try:
            shutil.rmtree(path, ignore_errors=True)
        except KeyboardInterrupt:  # signals are held here; this is only reachable from code, not Ctrl-C
            pass
        if not os.path.lexists(path):
            return


def current_umask() -> int:
    """The process's umask, read without changing it (Linux: ``/proc/self/status``); elsewhere by setting and
    restoring it, which a file another thread creates in between would see."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class AtomicOutputDir:
    """``with AtomicOutputDir(final, force) as tmp:`` — write into ``tmp``; renamed to ``final`` on success.

    The temporary directory lives beside ``final`` (same file system, so the rename is atomic).
    On any exception, KeyboardInterrupt included, it is deleted and ``final`` is left as it was;
    parent directories created for it are removed again. An ``OSError`` (ENOSPC, EROFS, EACCES,
    ...) leaves as one :class:`OutputWriteError` naming ``final`` and the file. With ``force`` an
    existing ``final`` is moved aside, replaced, then deleted, with SIGINT/SIGTERM held back from
    the first rename to the end. Leftovers of a killed run beside ``final`` are removed on entry
    (listed in :attr:`stale_removed`).
    """

    def __init__(self, final: str | Path, *, force: bool = False):
        from ..overlap import refuse_unreachable

        refuse_unreachable(final, "--output")   # before the is_symlink() that raises PermissionError there
        self.restored_from = recover_swapped(final) if not Path(final).is_symlink() else None
        self.final = check_output_dir(final, force).absolute()
        self.force = force
        self.tmp: Path | None = None
        self.stale_removed: list[Path] = []
        self._tmp_name: Path | None = None
        self._created_parents: list[Path] = []
        self._locks: list[int | None] = []

    def __enter__(self) -> Path:
        global _open_outputs
        try:
            tmp = self._enter()
            _open_outputs += 1
            return tmp
        except BaseException as exc:
            self._cleanup()
            self._release()
            if isinstance(exc, OSError):
                raise self._write_error(exc) from exc
            raise

    def _enter(self) -> Path:
        parent = self.final.parent
        missing = []
        p = parent
        while not p.exists():
            if p.is_symlink():
                raise OutputDirError(f"{p}: is a dangling symbolic link (to {os.readlink(p)}), a parent of the "
                                     f"output {self.final}")
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            d.mkdir()
            self._created_parents.append(d)
        self.stale_removed = remove_stale(self.final)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.tmp-", dir=parent))
        self._tmp_name = self.tmp
        self._locks.append(_lock(self.tmp))  # a later run must not sweep it while this one lives
        os.chmod(self.tmp, 0o777 & ~current_umask())  # mkdtemp makes it 0700; the result should look like mkdir's
        return self.tmp

    def _cleanup(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        for d in reversed(self._created_parents):
            try:
                d.rmdir()
            except OSError:
                pass

    def _release(self) -> None:
        for fd in self._locks:
            _unlock(fd)
        self._locks.clear()

    def _write_error(self, exc: OSError) -> DFlash2Error:
        """One line naming the output and the file (inside the temporary directory: its final name)."""
        reason = exc.strerror or str(exc)
        if exc.filename is None:
            return OutputWriteError(f"{self.final}: cannot write the output: {reason}")
        path = Path(os.fsdecode(exc.filename)).absolute()
        tmp = self._tmp_name
        if exc.filename2 is not None and tmp is not None:
            # a copy's error names its source first (shutil: 'SRC' -> 'DST'): the file being written is DST
            dst = Path(os.fsdecode(exc.filename2)).absolute()
            if dst == tmp or tmp in dst.parents:
                path = dst
        if tmp is not None and (path == tmp or tmp in path.parents):
            rel = path.relative_to(tmp)
            what = str(rel) if str(rel) != "." else "the output directory"
            return OutputWriteError(f"{self.final}: cannot write {what}: {reason}")
        if path.parent == self.final.parent and path.name.startswith(f".{self.final.name}."):
            return OutputWriteError(f"{self.final}: cannot create a temporary directory in {path.parent}: {reason}")
        if path == self.final or path in self.final.parents or path.parent == self.final.parent:
            return OutputWriteError(f"{self.final}: cannot create {path}: {reason}")
        return DFlash2Error(f"{path}: {reason} (while writing {self.final})")

    def __exit__(self, exc_type, exc, tb) -> None:
        global _open_outputs
        _open_outputs -= 1
        try:
            if exc_type is not None:
                self._cleanup()
                if isinstance(exc, OSError):
                    raise self._write_error(exc) from exc
                return
            try:
                self._commit()
            except BaseException as err:
                self._cleanup()
                if isinstance(err, OSError):
                    raise self._write_error(err) from err
                raise
        finally:
            self._release()

    def _commit(self) -> None:
        assert self.tmp is not None
        raise_if_stop_requested()   # a SIGTERM / Ctrl-C whose exception was swallowed on the way: not into place
        with _signals_held() as held:
            old = None
            if self.final.exists() or self.final.is_symlink():
                check_output_dir(self.final, self.force)  # re-check: it may have changed meanwhile
                if any(self.final.iterdir()):
                    self._locks.append(_lock(self.final))  # the lock moves with it to .NAME.old-*
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
            # From here on the new output is in place: the run has succeeded, whatever follows.
            self.tmp = None
            committed_outputs.append(self.final)
            if old is not None:
                _discard(old)
            try:
                fd = os.open(self.final.parent, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:  # some file systems refuse fsync on directories; the rename is done
                pass
        if held and _open_outputs > 0:
            # This output lies inside another one still being written (the checkpoint of an engine): the
            # signal is for the whole run, so it is delivered now, to the handler in force again (Ctrl-C /
            # SIGTERM: the enclosing output is removed). Dropping it let the build run on and succeed.
            os.kill(os.getpid(), held[0])


__all__ = [
    "AtomicOutputDir", "OutputDirError", "OutputWriteError", "SafetensorsLayout", "StreamingSafetensorsWriter",
    "TensorSpec", "check_output_dir", "is_project_output", "marker_format", "notice", "recover_swapped", "remove_stale",
    "sha256_file", "write_small_file",
    "ITEMSIZE",
]
