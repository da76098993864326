"""The converted checkpoint of a build: reuse one whose manifest matches, else write it.

A checkpoint (``dflash2-trt convert``: ``config.json``, ``rank{N}.safetensors``, ``manifest.json``)
matches a build when its manifest names the same format and schema, the same converter version,
tp size and dtype, the same sources (config sha256, every safetensors file's name, size, modification time and
header sha256, the HF revision when known; NOT the path, so a moved model directory still matches, a hard link too,
but not a copy that drops times; a manifest of an earlier version without the times is not reused either), when
its ``config.json`` is byte for byte what the converter would write now, and when every file the
manifest lists is there with its size and its sha256. The files are re-hashed on every reuse (one
flipped byte in a rank file keeps its size and header; a reused checkpoint is what the engine is
built from and what ``engine.json`` vouches for): about 54 GB for Qwen3.8-27B, read once, still far
cheaper than converting again.

A directory that exists and does not match is never overwritten silently: the build stops with the
first difference unless the caller asked to reconvert.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from .. import __version__, convert
from ..checkpoint.reader import SafetensorsCheckpoint
from ..checkpoint.writer import check_output_dir, marker_format, sha256_file
from ..convert.driver import source_identity
from ..convert.schema import FORMAT, SCHEMA_VERSION
from ..errors import ConfigError
from ..textfiles import json_loads


def _ident_key(ident: dict) -> dict:
    return {k: v for k, v in ident.items() if k != "path"}


def _without_times(ident: dict) -> dict:
    files = ident.get("files")
    if not isinstance(files, list):
        return ident
    return {**ident, "files": [{k: v for k, v in f.items() if k != "mtime_ns"} if isinstance(f, dict) else f
                               for f in files]}


def _has_times(ident: dict) -> bool:
    files = ident.get("files")
    return isinstance(files, list) and any(isinstance(f, dict) and "mtime_ns" in f for f in files)


def checkpoint_problems(ckpt_dir, prep, *, progress=None, rehash: bool = True) -> list[str]:
    """Why ``ckpt_dir`` cannot be reused for ``prep`` (empty: it matches). The content hashes are checked
    last (the cheap differences first); ``progress`` gets one line before the files are re-hashed. ``rehash``
    False: the cheap checks only (a dry run: the re-hash reads every byte, ~54 GB for Qwen3.8-27B)."""
    ckpt_dir = Path(ckpt_dir)
    man_path = ckpt_dir / "manifest.json"
    try:
        man = json_loads(man_path.read_text())
    except OSError:
        return ["manifest.json: missing (not a dflash2-trt checkpoint, or an interrupted one)"]
    except json.JSONDecodeError as exc:
        return [f"manifest.json: invalid JSON ({exc.msg})"]
    if not isinstance(man, dict):
        return ["manifest.json: not an object"]
    cfg = prep.cfg
    want = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "converter_version": __version__,
            "tp_size": cfg.tp_size, "dtype": cfg.dtype}
    problems = [f"{k}: {man.get(k)!r}, this build needs {v!r}" for k, v in want.items() if man.get(k) != v]
    if problems:
        return problems
    sources = man.get("sources") or {}
    for kind, directory in (("target", prep.target_dir), ("drafter", prep.drafter_dir)):
        try:
            now = source_identity(Path(directory), SafetensorsCheckpoint(directory))
        except Exception as exc:   # the sources themselves are broken: the build reports that elsewhere
            return [f"sources.{kind}: cannot identify {directory} ({exc})"]
        then = sources.get(kind) or {}
        if _ident_key(then) != _ident_key(now):
            if _ident_key(_without_times(then)) == _ident_key(_without_times(now)) and not _has_times(then):
                # a manifest of an earlier version, which recorded no modification times: it cannot tell whether the
                # weights changed since (what the times are for), so it is not reused, and not blamed on the files
                return [f"sources.{kind}: recorded by an earlier dflash2-trt without the files' modification times, "
                        f"so it cannot show the weights are unchanged; convert once more (--reconvert)"]
            return [f"sources.{kind}: written from different files than {directory} (its config, or a safetensors "
                    f"file's header, size or modification time differs)"]
    files = man.get("files")
    if not isinstance(files, list):
        return ["files: missing"]
    for f in files:
        p = ckpt_dir / str(f.get("name"))
        if not p.is_file():
            return [f"files: {f.get('name')} is missing"]
        if p.stat().st_size != f.get("size"):
            return [f"files: {f.get('name')} has {p.stat().st_size} bytes, the manifest says {f.get('size')}"]
    names = {f.get("name") for f in files}
    ranks = {f"rank{r}.safetensors" for r in range(cfg.tp_size)}
    if not ranks | {"config.json"} <= names:
        return [f"files: expected config.json and {', '.join(sorted(ranks))}"]
    try:
        written = json_loads((ckpt_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"config.json: unreadable ({exc})"]
    if written != prep.checkpoint_config:
        diff = sorted(k for k in set(written) | set(prep.checkpoint_config)
                      if written.get(k) != prep.checkpoint_config.get(k))
        return [f"config.json: differs from what the converter writes now (fields {', '.join(diff[:5])})"]
    if not rehash:
        return []
    if progress:
        total = sum(int(f.get("size") or 0) for f in files)
        progress(f"checkpoint: re-hashing {len(files)} files ({total / 2**30:.2f} GiB) against {man_path}")
    for f in files:
        want_sha = f.get("sha256")
        if not isinstance(want_sha, str):
            return [f"files: {f.get('name')} has no sha256 in the manifest"]
        if sha256_file(ckpt_dir / str(f.get("name"))) != want_sha:
            return [f"files: {f.get('name')}: sha256 differs from the manifest (same size: modified or corrupted "
                    f"after it was written)"]
    return []


def _a_checkpoint(ckpt_dir: Path) -> bool:
    """Whether ``ckpt_dir`` holds a checkpoint the converter wrote: a manifest.json naming its format (whatever
    else differs from this build)."""
    return marker_format(ckpt_dir, "manifest.json") == FORMAT


def refuse_foreign_checkpoint_dir(ckpt_dir) -> None:
    """A non-empty checkpoint directory that is not a checkpoint the converter wrote is refused (one line): it is
    neither reused nor, with --reconvert, replaced (that deleted whatever it held: a reviewer's documents)."""
    ckpt_dir = Path(ckpt_dir)
    try:
        exists = ckpt_dir.is_dir() and any(ckpt_dir.iterdir())
    except OSError:
        return   # unreadable: the checks that read it say so
    if exists and not _a_checkpoint(ckpt_dir):
        raise ConfigError("not empty and not a dflash2-trt checkpoint (no manifest.json of one): --reconvert replaces "
                          "only a checkpoint this tool wrote; give a new or empty --checkpoint-dir", source=ckpt_dir)


def ensure_checkpoint(prep, ckpt_dir, *, reconvert: bool = False, progress=None) -> dict:
    """Reuse ``ckpt_dir`` when it matches ``prep``, else convert into it (atomically). Returns
    ``{"path", "reused", "seconds"}``. A non-matching existing checkpoint is an error naming the first
    difference, unless ``reconvert``. The converter is looked up per call (``convert.convert_pair``): tests
    replace it to prove a checkpoint is reused."""
    ckpt_dir = Path(ckpt_dir)
    t0 = time.perf_counter()
    if not ckpt_dir.is_symlink():
        refuse_foreign_checkpoint_dir(ckpt_dir)  # first: its line names --reconvert, which is what replaces here
    check_output_dir(ckpt_dir, force=True)      # symlinks / files refused
    exists = ckpt_dir.is_dir() and any(ckpt_dir.iterdir())
    if exists:
        problems = checkpoint_problems(ckpt_dir, prep, progress=progress)
        if not problems:
            if progress:
                progress(f"checkpoint: reusing {ckpt_dir} (manifest and every file's sha256 match)")
            return {"path": str(ckpt_dir), "reused": True, "seconds": round(time.perf_counter() - t0, 3)}
        if not reconvert:
            raise ConfigError(f"exists and does not match this build: {problems[0]}; pass --reconvert to replace it, "
                              f"or another --checkpoint-dir", source=ckpt_dir / "manifest.json")
    if progress:
        progress(f"checkpoint: converting into {ckpt_dir}")
    convert.convert_pair(prep.drafter_dir, prep.target_dir, ckpt_dir, tp_size=prep.cfg.tp_size, dtype=prep.cfg.dtype,
                         force=exists, progress=None)
    return {"path": str(ckpt_dir), "reused": False, "seconds": round(time.perf_counter() - t0, 3)}


def link_files(src_dir, dst_dir, names, *, symlink_ok: bool = True) -> str:
    """Hard-link ``names`` from ``src_dir`` into ``dst_dir`` (same file system), else symlink them
    (``symlink_ok``), else copy. Returns how: ``hardlink``, ``symlink`` or ``copy``."""
    src_dir, dst_dir = Path(src_dir).resolve(), Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    how = "hardlink"
    for name in names:
        src, dst = src_dir / name, dst_dir / name
        try:
            if how == "hardlink":
                os.link(src, dst)
                continue
        except OSError:
            how = "symlink" if symlink_ok else "copy"
        if how == "symlink":
            os.symlink(src, dst)
        else:
            shutil.copy2(src, dst)
    return how
