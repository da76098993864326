"""``dflash2-trt convert``: HF drafter + target -> combined TensorRT-LLM checkpoint, streamed.

Order of work (nothing is renamed into place before every check passed):

1. configs (typed, validated), pairing, ``--tp-size``/``--dtype`` checks;
2. tensor inventories: every tensor transformers (target) or the published contract (drafter)
   expects must be present with its shape and dtype; every tensor present must be mapped or
   deliberately dropped by a named rule — anything else is an error. The target's needs
   transformers and torch (~3 s to import), so it runs in a background thread overlapping steps
   3-4; its error is reported first whenever it fails, as if it had run first;
3. the plan (:mod:`.plan`) for every rank, checked against the source shapes; from it the
   header of every ``rank{N}.safetensors`` is computed;
4. inside a temporary directory beside the output: one pass over the source tensors in file
   order, each in row chunks of at most :data:`CHUNK_BYTES` seen through a read-only memory map
   of just that chunk (two rotating windows, so the resident set does not grow with the tensor
   or model size), and scattered into every rank file that needs a slice of it: whole rows of
   unchanged dtype by ``copy_file_range`` (file to file in the kernel), column slices and dtype
   casts by ``pwrite`` from reused buffers; the NaN/Inf check and SHA-256 in a background thread
   from the same memory; write-behind keeps the rank files' dirty/cached pages to ~1 GiB (see
   :mod:`..checkpoint.writer`); then ``config.json`` and ``manifest.json``; then the rename.

Measured (scripts/bench_convert.py --reps 3, Qwen3.8-27B widths, 9.25 GiB, a quiet 2-core VM, load
average 0.8-1.1): plain copy 20.5-21.5 s, convert 15.0-15.7 s with start-up: 0.73x the copy (0.69x
after start-up), peak RSS 513 MiB. A copy that streams as the converter does (copy_file_range with
write-behind) takes 4.7-5.2 s: what remains is the hash thread's work, SHA-256 of every output byte
(one stream per file, 1.1 GB/s on this CPU: ~9 s) with the NaN/Inf check fused into it (~2 s).
Moving the check to the main thread instead was tried and measured slower (17.3-18.1 s: the memory is
then read twice). On a machine shared with other jobs the converter's ~18 s of CPU shows: 1.3-2.3x at
load average 3-7 (the code before the write-behind gave 3.4x there).
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import re
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from .. import __version__
from ..checkpoint.inventory import check_inventory, expected_drafter_tensors, expected_target_tensors
from ..checkpoint.reader import DTYPE_NAMES, SafetensorsCheckpoint, TensorInfo
from ..checkpoint.writer import (
    ITEMSIZE, AtomicOutputDir, SafetensorsLayout, StreamingSafetensorsWriter, TensorSpec, HashWorker,
    check_output_dir, sha256_file, write_small_file,
)
from ..config import DFlash2Config, TargetConfig, pairing_problems
from ..errors import (CheckpointError, ConfigError, PairingError, clear_stop_requests, raise_if_stop_requested,
                      raise_stop)
from ..overlap import refuse_overlap
from . import dflash2, muse_glimmer, qwen3, qwen3_5
from .plan import DRAFTER, TARGET, Drop, OutTensor, width_of
from .schema import FORMAT, SCHEMA_VERSION, build_config

TP_SIZES = (1, 2, 4, 8)
OUT_DTYPES = ("bfloat16", "float16", "float32")
CHUNK_BYTES = 64 << 20
KERNEL_COPY = True  # copy_file_range for whole-row, same-dtype slices (bench_convert A/B switch)
FAMILY_MAPS = {"qwen3": qwen3, "qwen3_5": qwen3_5, "muse_glimmer": muse_glimmer}
N_SLOTS = 2  # chunks in flight: the writes of one while the worker checks and hashes the previous
# Exponent bits: a value is NaN or Inf exactly when all of them are set.
_EXP_MASK = {"BF16": (np.uint16, 0x7F80), "F16": (np.uint16, 0x7C00), "F32": (np.uint32, 0x7F800000)}


def _torch_dtype(tag: str):
    import torch

    return {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[tag]


@dataclass
class ConvertResult:
    output: Path
    tp_size: int
    dtype: str
    files: list[dict]
    bytes_read: int
    seconds: float
    dropped: dict[str, int] = field(default_factory=dict)
    stale_removed: list[str] = field(default_factory=list)  # leftovers of a killed run, removed


@dataclass
class _Source:
    ckpt: SafetensorsCheckpoint
    config: object
    directory: Path


# ---- planning -------------------------------------------------------------------------------

def rank_plans(t: TargetConfig, d: DFlash2Config, tp: int) -> list[list[OutTensor]]:
    fam = FAMILY_MAPS[t.family]
    return [fam.target_tensors(t, tp, r) + dflash2.drafter_tensors(d, t.hidden_size, tp, r) for r in range(tp)]


def _check_inventory(ckpt: SafetensorsCheckpoint, expected: dict, rules: list[Drop], dropped: dict[str, int]) -> None:
    """Raise on missing / wrong-shape / wrong-dtype / unmapped tensors; count dropped ones by reason."""
    rep = check_inventory(ckpt, expected)
    unexpected = []
    for name in rep.unexpected:
        rule = next((r for r in rules if r.matches(name)), None)
        if rule is None:
            unexpected.append(name)
        else:
            dropped[rule.reason] = dropped.get(rule.reason, 0) + 1
    rep.unexpected = unexpected
    if rep.unexpected and not (rep.missing or rep.wrong_shape or rep.wrong_dtype):
        n = len(rep.unexpected)
        raise CheckpointError(
            f"{n} tensor(s) neither converted nor deliberately dropped (unmapped), e.g. {rep.unexpected[:5]}",
            file=ckpt.directory, tensor=rep.unexpected[0])
    rep.raise_for_problems()


class _TargetInventory:
    """The target's inventory check, whose expected tensors come from transformers (importing it
    and torch is ~3 s, more than a tenth of converting a 9 GB pair). The import and the meta-device
    model run in a background thread from the start, so they overlap planning and the data pass.

    Its verdict comes first, as if it had run before everything else: :meth:`first_error` gives it
    for any error raised meanwhile, and the output is renamed into place only after :meth:`check`
    passed (until then it is a temporary directory, removed on error).
    """

    def __init__(self, t: TargetConfig, ckpt: SafetensorsCheckpoint, drops: list[Drop]):
        self._ckpt, self._drops = ckpt, drops
        self._expected: dict | None = None
        self._exc: BaseException | None = None
        self._verdict: tuple[dict[str, int] | None, BaseException | None] | None = None
        self._thread = threading.Thread(target=self._run, args=(t,), name="dflash2-target-inventory", daemon=True)
        self._thread.start()

    def _run(self, t: TargetConfig) -> None:
        try:
            self._expected = expected_target_tensors(t)
        except BaseException as exc:  # re-raised in the caller's thread
            self._exc = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def _judge(self) -> tuple[dict[str, int] | None, BaseException | None]:
        if self._verdict is None:
            # In short steps, so that a recorded stop ends the wait: a Ctrl-C whose KeyboardInterrupt Python lost
            # inside importlib's lock bookkeeping (a weakref callback) can leave the import lock held, and then
            # this thread, still importing torch, never finishes (seen once: convert hung after SIGINT).
            while self._thread.is_alive():
                raise_if_stop_requested()
                self._thread.join(0.05)
            dropped: dict[str, int] = {}
            try:
                if self._exc is not None:
                    raise self._exc
                _check_inventory(self._ckpt, self._expected, self._drops, dropped)
                self._verdict = (dropped, None)
            except Exception as exc:
                self._verdict = (None, exc)
        return self._verdict

    def check(self) -> dict[str, int]:
        """Wait for the check; raise its error, or return the dropped tensor counts by reason."""
        dropped, exc = self._judge()
        if exc is not None:
            raise exc
        return dropped

    def first_error(self) -> BaseException | None:
        """The check's error (waiting for it), or None when it passes."""
        return self._judge()[1]


def _check_plan(plans: list[list[OutTensor]], sources: dict[str, _Source], drops: list[Drop]) -> None:
    """Every piece fits its source and its output; every source tensor is used or dropped."""
    used: set[tuple[str, str]] = set()
    for plan in plans:
        for out in plan:
            assert sum(p.num_rows for p in out.pieces) == out.rows, out.name
            for p in out.pieces:
                used.add((p.ckpt, p.src))
                info = sources[p.ckpt].ckpt.info(p.src)
                width = width_of(info.shape)
                c0, c1 = p.cols if p.cols is not None else (0, width)
                if not (0 <= p.rows[0] < p.rows[1] <= info.shape[0] and 0 <= c0 < c1 <= width):
                    raise CheckpointError(f"plan slice rows {p.rows} cols {(c0, c1)} outside shape {list(info.shape)}"
                                          f" (converter bug)", file=info.file, tensor=p.src)
                if c1 - c0 != out.width:
                    raise CheckpointError(f"plan slice width {c1 - c0} != output {out.name} width {out.width} "
                                          f"(converter bug)", file=info.file, tensor=p.src)
    for kind, src in sources.items():
        rules = drops if kind == TARGET else []
        left = [n for n in src.ckpt.keys() if (kind, n) not in used and not any(r.matches(n) for r in rules)]
        if left:
            raise CheckpointError(f"{len(left)} tensor(s) expected but not mapped by the converter (converter bug), "
                                  f"e.g. {left[:5]}", file=src.directory, tensor=left[0])


def _out_tag(out: OutTensor, sources: dict[str, _Source], dtype: str) -> str:
    src_tags = {sources[p.ckpt].ckpt.info(p.src).dtype for p in out.pieces}
    if out.keep_float32 and src_tags == {"F32"}:
        return "F32"
    return DTYPE_NAMES[dtype]


# ---- identities -----------------------------------------------------------------------------

_SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})(/|$)")


def source_identity(directory: Path, ckpt: SafetensorsCheckpoint) -> dict:
    """What identifies a source: its config hash, file sizes, modification times and header hashes, HF revision if
    known.

    Tensor data is not hashed (that would double the read cost: every build that keeps a checkpoint reads this
    identity); the headers pin every name, dtype, shape and offset, and sizes pin the rest of the layout. The
    modification time (nanoseconds, of the file a symlink names: a Hub snapshot's blob) stands for the data: a drafter
    retrained and saved again with the same shapes had the same headers and sizes, and a kept checkpoint of the old
    weights was reused without a word (a new user's review). A copy that does not keep times is then taken for other
    files: the build says the checkpoint does not match, and --reconvert converts again.
    """
    import hashlib

    directory = directory.resolve()
    files = []
    for f in sorted({i.file for i in ckpt.infos().values()}):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header_sha = hashlib.sha256(fh.read(n)).hexdigest()
        st = f.stat()
        files.append({"name": f.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "header_sha256": header_sha})
    m = _SNAPSHOT.search(str(directory))
    ident = {"path": str(directory), "config_sha256": sha256_file(directory / "config.json"), "files": files}
    if m:
        ident["hf_revision"] = m.group(1)
    return ident


# ---- streaming ------------------------------------------------------------------------------

@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C while converting, so the temporary directory is removed; and record both (as the
    CLI does), so that one whose exception Python lost still stops the convert (:func:`raise_if_stop_requested`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    old = signal.signal(signal.SIGTERM, raise_stop)
    owns_int = signal.getsignal(signal.SIGINT) is signal.default_int_handler   # not under the CLI, which records it
    old_int = signal.signal(signal.SIGINT, raise_stop) if owns_int else None
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
        if old_int is not None:
            signal.signal(signal.SIGINT, old_int)
            # not under the CLI (which owns SIGINT and clears the record per command): a library caller's next
            # convert in this process must not find this one's stop, which has been raised by now
            clear_stop_requests()


class _FiniteCheck:
    """NaN/Inf check on raw bits: ``max(bits & exponent_mask) == exponent_mask``.

    Runs in the hash worker thread (off the critical path of the writes), block by block through
    a small scratch buffer that stays in the CPU cache: a fresh 64 MiB temporary per chunk costs
    page faults that made this 25x slower (measured), and a chunk-sized scratch one costs a
    second pass over memory.
    """

    BLOCK = 1 << 20

    def __init__(self):
        self.scratch = np.empty(self.BLOCK, dtype=np.uint8)

    def __call__(self, raw: np.ndarray, tag: str, info: TensorInfo, row0: int, row1: int) -> None:
        if tag not in _EXP_MASK:
            return
        np_t, mask = _EXP_MASK[tag]
        bits = raw.reshape(-1).view(np_t)
        step = self.BLOCK // bits.itemsize
        scratch = self.scratch.view(np_t)
        m = np_t(mask)
        for i in range(0, bits.size, step):
            part = bits[i:i + step]
            out = scratch[:part.size]
            np.bitwise_and(part, m, out=out)
            if int(out.max()) == mask:
                raise CheckpointError(f"non-finite values (NaN or Inf) in rows [{row0}, {row1})", file=info.file,
                                      tensor=info.name)


class _Arena:
    """Reused memory for the slices and casts of one chunk slot (bump allocation, reset when the
    slot's fence has passed): fresh 64 MiB arrays per chunk cost page faults on every use."""

    def __init__(self):
        self.buf = np.empty(0, dtype=np.uint8)
        self.used = 0

    def reset(self) -> None:
        self.used = 0

    def take(self, nbytes: int) -> np.ndarray:
        if self.used + nbytes > self.buf.nbytes:
            # Views handed out earlier keep the old buffer alive until they are hashed.
            self.buf = np.empty(max(2 * self.buf.nbytes, nbytes, 1 << 20), dtype=np.uint8)
            self.used = 0
        view = self.buf[self.used:self.used + nbytes]
        self.used += nbytes
        return view


def _stream(sources: dict[str, _Source], plans: list[list[OutTensor]], writers: list[StreamingSafetensorsWriter],
            tags: list[dict[str, str]], progress, hasher: HashWorker | None, poll=None) -> int:
    """One pass over every used source tensor, in file order; returns the bytes read."""
    dests: dict[tuple[str, str], list] = {}
    for rank, plan in enumerate(plans):
        for out in plan:
            row = 0
            for p in out.pieces:
                dests.setdefault((p.ckpt, p.src), []).append((rank, out, p, row))
                row += p.num_rows
    infos = {k: sources[k[0]].ckpt.info(k[1]) for k in dests}
    order = sorted(dests, key=lambda k: (str(infos[k].file), infos[k].offsets[0]))
    fds: dict[Path, tuple[int, int]] = {}
    # Each chunk is a read-only memory map of the source (no copy into user space; page-cache pages
    # are checked and hashed in place). Two slots: the hash thread reads chunk k while chunk k+1 is
    # mapped; a slot's map is dropped (unmapped once no view is left) only after the fence queued
    # behind its writes has passed, so the resident set stays ~2 chunks whatever the tensor size.
    maps: list = [None] * N_SLOTS
    fences: list = [None] * N_SLOTS
    arenas = [_Arena() for _ in range(N_SLOTS)]
    n_chunk = 0
    check_finite = _FiniteCheck()
    total = 0
    try:
        for key in order:
            info = infos[key]
            if info.file not in fds:
                try:
                    fd = os.open(info.file, os.O_RDONLY)
                except OSError as exc:  # not an output error: say it is the source
                    raise CheckpointError(f"cannot open: {exc.strerror or exc}", file=info.file) from None
                fds[info.file] = (fd, 8 + int.from_bytes(os.pread(fd, 8, 0), "little"))
            fd, data_start = fds[info.file]
            isz = ITEMSIZE[info.dtype]
            n_rows = info.shape[0] if info.shape else 1
            row_bytes = width_of(info.shape) * isz
            chunk_rows = max(1, CHUNK_BYTES // row_bytes)
            for a in range(0, n_rows, chunk_rows):
                b = min(n_rows, a + chunk_rows)
                nbytes = (b - a) * row_bytes
                slot = n_chunk % N_SLOTS
                n_chunk += 1
                if fences[slot] is not None:
                    fences[slot].wait()
                    if hasher is not None:
                        hasher.raise_error()  # e.g. non-finite values found by the check queued there
                maps[slot] = None
                arena = arenas[slot]
                arena.reset()
                off = data_start + info.offsets[0] + a * row_bytes
                base = off - off % mmap.ALLOCATIONGRANULARITY
                try:
                    mm = mmap.mmap(fd, off + nbytes - base, access=mmap.ACCESS_READ, offset=base)
                except (OSError, ValueError) as exc:
                    raise CheckpointError(f"cannot map rows [{a}, {b}): {exc}", file=info.file,
                                          tensor=info.name) from None
                maps[slot] = mm
                view = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=off - base)
                arr = view.reshape(b - a, row_bytes)
                hits = [(rank, out, p, row0) for rank, out, p, row0 in dests[key] if max(a, p.rows[0]) < min(b, p.rows[1])]
                # One destination taking the whole chunk as it is (the usual case at tp 1): the NaN/Inf
                # check runs block by block just before each block is hashed, so memory is read once.
                fused = None
                if hasher is not None and len(hits) == 1:
                    rank, out, p, _ = hits[0]
                    if (p.rows[0] <= a and b <= p.rows[1] and tags[rank][out.name] == info.dtype
                            and (p.cols is None or p.cols[1] - p.cols[0] == row_bytes // isz)):
                        fused = functools.partial(check_finite, tag=info.dtype, info=info, row0=a, row1=b)
                if fused is not None:
                    pass
                elif hasher is not None:
                    hasher.call(check_finite, arr, info.dtype, info, a, b)
                else:
                    check_finite(arr, info.dtype, info, a, b)
                for rank, out, p, row0 in hits:
                    x, y = max(a, p.rows[0]), min(b, p.rows[1])
                    block = arr[x - a:y - a]
                    whole_rows = p.cols is None or p.cols[1] - p.cols[0] == row_bytes // isz  # e.g. row-parallel at tp 1
                    if not whole_rows:
                        block = block[:, p.cols[0] * isz:p.cols[1] * isz]
                    tag = tags[rank][out.name]
                    copy_from = None
                    if tag != info.dtype:
                        import torch

                        dt_in, dt_out = _torch_dtype(info.dtype), _torch_dtype(tag)
                        src_buf = arena.take(block.nbytes).reshape(block.shape)
                        np.copyto(src_buf, block)  # the map is read-only; torch wants writable memory
                        dst_buf = arena.take(block.nbytes // isz * ITEMSIZE[tag]).reshape(block.shape[0], -1)
                        cast = torch.from_numpy(dst_buf).view(dt_out)
                        cast.copy_(torch.from_numpy(src_buf).view(dt_in))
                        # The source was checked finite, so a non-finite value here is an overflow of the
                        # narrower dtype (e.g. |w| > 65504 cast to float16): silent inf weights otherwise.
                        if not bool(torch.isfinite(cast).all()):
                            raise CheckpointError(
                                f"rows [{x}, {y}) overflow {tag} when cast from {info.dtype} (a finite value "
                                f"beyond {tag}'s largest); convert with a wider --dtype", file=info.file,
                                tensor=info.name)
                        block = dst_buf
                    elif whole_rows:  # whole rows, same dtype: the kernel copies them file to file
                        copy_from = (fd, off + (x - a) * row_bytes) if KERNEL_COPY else None
                    else:
                        buf = arena.take(block.nbytes).reshape(block.shape)
                        np.copyto(buf, block)
                        block = buf
                    out_row_bytes = out.width * ITEMSIZE[tag]
                    writers[rank].write(out.name, (row0 + x - p.rows[0]) * out_row_bytes, block, copy_from, fused)
                fences[slot] = hasher.fence() if hasher is not None else None
                total += nbytes
                view = arr = block = buf = fused = None  # no view of the map may outlive its fence
                if progress is not None:
                    progress.update(nbytes)
                if poll is not None:
                    poll()
    finally:
        maps.clear()
        for fd, _ in fds.values():
            os.close(fd)
    return total


def _completion_order(plan: list[OutTensor], src_order: dict[tuple[str, str], int]) -> list[OutTensor]:
    """Outputs ordered by when their last source is read, so each file fills front to back
    (that lets the SHA-256 thread hash most writes from memory instead of re-reading them)."""
    return sorted(plan, key=lambda o: (max(src_order[(p.ckpt, p.src)] for p in o.pieces), o.name))


# ---- entry point ----------------------------------------------------------------------------

def convert_pair(drafter_dir: str | Path, target_dir: str | Path, output: str | Path, *, tp_size: int = 1,
                 dtype: str | None = None, force: bool = False, progress: bool | None = None) -> ConvertResult:
    """Convert a DFlash2 drafter and its target into one TensorRT-LLM checkpoint at ``output``."""
    t0 = time.perf_counter()
    if tp_size not in TP_SIZES:
        raise ConfigError(f"must be one of {', '.join(map(str, TP_SIZES))}, got {tp_size}", field="--tp-size")
    if dtype is not None and dtype not in OUT_DTYPES:
        raise ConfigError(f"must be one of {', '.join(OUT_DTYPES)}, got {dtype!r}", field="--dtype")
    drafter_dir, target_dir = Path(drafter_dir), Path(target_dir)
    t = TargetConfig.from_hugging_face(target_dir)
    d = DFlash2Config.from_hugging_face(drafter_dir)
    if t.family not in FAMILY_MAPS:
        raise ConfigError(f"target family {t.family!r} cannot be converted yet; supported: "
                          f"{', '.join(FAMILY_MAPS)}", source=t.source, field="architectures")
    out_dtype = dtype or t.dtype
    tck, dck = SafetensorsCheckpoint(target_dir), SafetensorsCheckpoint(drafter_dir)
    fc_shape = dck.info("fc.weight").shape if "fc.weight" in dck else None
    # With an explicit --dtype both sides are cast to it, so their stored dtypes need not agree.
    problems = pairing_problems(replace(d, dtype=t.dtype) if dtype else d, t, fc_weight_shape=fc_shape)
    from ..config.pairing import warn_pairing

    warn_pairing(d)
    if problems:
        raise PairingError("drafter and target do not pair:\n  - " + "\n  - ".join(problems))
    refuse_overlap(output, "--output", [("target directory", target_dir), ("drafter directory", drafter_dir)])
    check_output_dir(output, force)
    drops = FAMILY_MAPS[t.family].target_drops(t)
    target_inventory = _TargetInventory(t, tck, drops)
    try:
        return _convert_checked(t, d, tck, dck, drafter_dir, target_dir, drops, target_inventory, output, tp_size,
                                out_dtype, force, progress, t0)
    except Exception as exc:
        first = target_inventory.first_error()
        if first is not None and first is not exc:
            raise first from None  # the old order: the target inventory was checked before anything below
        raise


def _convert_checked(t: TargetConfig, d: DFlash2Config, tck: SafetensorsCheckpoint, dck: SafetensorsCheckpoint,
                     drafter_dir: Path, target_dir: Path, drops: list[Drop], target_inventory: _TargetInventory,
                     output, tp_size: int, out_dtype: str, force: bool, progress: bool | None,
                     t0: float) -> ConvertResult:
    """:func:`convert_pair` after the cheap checks, with the target inventory running meanwhile."""
    dropped: dict[str, int] = {}
    _check_inventory(dck, expected_drafter_tensors(d, t.hidden_size), [], dropped)
    sources = {TARGET: _Source(tck, t, target_dir), DRAFTER: _Source(dck, d, drafter_dir)}
    plans = rank_plans(t, d, tp_size)
    _check_plan(plans, sources, drops)

    infos = {(p.ckpt, p.src): sources[p.ckpt].ckpt.info(p.src) for plan in plans for o in plan for p in o.pieces}
    src_order = {k: i for i, k in enumerate(sorted(infos, key=lambda k: (str(infos[k].file), infos[k].offsets[0])))}
    plans = [_completion_order(plan, src_order) for plan in plans]
    tags = [{o.name: _out_tag(o, sources, out_dtype) for o in plan} for plan in plans]
    layouts = [SafetensorsLayout([TensorSpec(o.name, tags[r][o.name], o.shape) for o in plan], {"format": "pt"})
               for r, plan in enumerate(plans)]
    total_bytes = sum(i.nbytes for i in infos.values())
    config = build_config(t, d, tp_size=tp_size, dtype=out_dtype, converter_version=__version__)
    identities = {"target": source_identity(target_dir, tck), "drafter": source_identity(drafter_dir, dck)}

    show = sys.stderr.isatty() if progress is None else progress
    from tqdm import tqdm

    atomic = AtomicOutputDir(output, force=force)
    with _sigterm_as_interrupt(), atomic as tmp:
        hasher: HashWorker | None = HashWorker()
        writers: list[StreamingSafetensorsWriter] = []
        bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="convert",
                   disable=not show, file=sys.stderr, dynamic_ncols=True)

        def poll() -> None:  # stop early when the target inventory fails, or on a stop whose exception was lost
            raise_if_stop_requested()
            if target_inventory.done():
                target_inventory.check()

        try:
            for r, layout in enumerate(layouts):
                writers.append(StreamingSafetensorsWriter(tmp / f"rank{r}.safetensors", layout, hasher))
            read = _stream(sources, plans, writers, tags, bar, hasher, poll)
            for w in writers:
                w.finish()
            hasher.close()
            hasher = None
            digests = [w.sha256() for w in writers]
        finally:
            bar.close()
            if hasher is not None:  # error path: stop the thread without masking the original error
                try:
                    hasher.close()
                except Exception:
                    pass
            for w in writers:
                w.close()
        dropped = {**target_inventory.check(), **dropped}  # nothing is renamed into place before it passed
        write_small_file(tmp / "config.json", json.dumps(config, indent=2) + "\n")
        files = [{"name": "config.json", "size": (tmp / "config.json").stat().st_size,
                  "sha256": sha256_file(tmp / "config.json")}]
        for w, digest in zip(writers, digests):
            files.append({"name": w.path.name, "size": w.path.stat().st_size, "sha256": digest})
        manifest = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "converter_version": __version__,
            "tp_size": tp_size,
            "dtype": out_dtype,
            "files": files,
            "sources": identities,
            "dropped": dropped,
        }
        write_small_file(tmp / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return ConvertResult(Path(output), tp_size, out_dtype, files, read, time.perf_counter() - t0, dropped,
                         [str(p) for p in atomic.stale_removed])
