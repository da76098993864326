"""One rule for every command that writes: an output never is, contains, or lies inside an input.

``--force`` replaces an output directory by moving it aside and deleting it, so an ``--output`` that
is (or contains) a source checkpoint would delete the source; one inside an input would write into
it (an engine directory's manifest, a model directory). Every writing command (``build --output`` /
``--checkpoint-dir``, ``convert``, ``export-onnx``, ``deploy triton``, ``bench prepare-dataset``,
``bench run --json/--plot``, ``bench project --json``, ``serve --log``) checks its outputs with
:func:`refuse_overlap` before anything is written or deleted, ``--force`` or not. Paths are compared
after resolving symbolic links (``..`` and relative paths included); two existing paths that are the
same file (a hard link) count as the same. An input directory's own symbolic links count as part of it
(the Hugging Face cache: ``snapshots/REV/model.safetensors`` links into ``blobs/``), so an output that is,
contains (or, for a linked directory, lies inside) where one of them points is refused too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from .errors import ConfigError


def _resolved(p) -> Path:
    path = Path(os.path.expanduser(os.fspath(p)))
    try:
        return path.resolve()
    except RuntimeError:   # a symbolic link loop (Python 3.11's resolve raises this): one line, from the caller
        raise ConfigError("is a symbolic link loop", source=path) from None


def _relation(out: Path, src: Path) -> str | None:
    if out == src:
        return "is"
    if out in src.parents:
        return "contains"
    if src in out.parents:
        return "lies inside"
    try:
        if out.exists() and src.exists() and os.path.samefile(out, src):
            return "is"
    except OSError:
        pass
    return None


def _linked(src: Path):
    """``(name, target)`` for each symbolic link inside the directory ``src`` (links not followed) whose target
    lies outside it: the files and directories the input reads that its own path does not cover."""
    if not src.is_dir():
        return
    for root, dirs, files in os.walk(src):
        for name in dirs + files:
            entry = Path(root) / name
            if entry.is_symlink():
                target = entry.resolve()
                if target != src and src not in target.parents:
                    yield entry.relative_to(src), target


def overlap(output, inputs: Iterable[tuple[str, object]]) -> tuple[str, str, object] | None:
    """``(relation, what, path)`` of the first input ``output`` is, contains or lies inside, else None.
    ``inputs``: ``(what, path or None)`` pairs; None entries are skipped. A symbolic link inside an input
    directory that points out of it counts: ``what`` then names the link, ``path`` is where it points."""
    out = _resolved(output)
    for what, p in inputs:
        if p is None:
            continue
        src = _resolved(p)
        rel = _relation(out, src)
        if rel is not None:
            return rel, what, p
        for name, target in _linked(src):
            rel = _relation(out, target)
            if rel == "lies inside" and not target.is_dir():
                rel = None
            if rel is not None:
                return rel, f"{what}'s {name} (a symbolic link to)", target
    return None


def refuse_unreachable(path, option: str) -> None:
    """Raise one :class:`ConfigError` line naming ``option`` when ``path`` lies under a directory this process may not
    search: on Python 3.11 ``Path.exists()`` / ``is_symlink()`` raise ``PermissionError`` there instead of answering,
    and every command that writes asks them of its output path (a fuzzing review: a traceback in build, convert,
    export-onnx, deploy triton, bench prepare-dataset). Writes nothing; a path that does not exist is fine."""
    p = Path(path).absolute()
    try:
        os.lstat(p)
    except PermissionError as exc:
        blocked = next((q for q in reversed(p.parents) if not os.access(q, os.X_OK)), None)
        where = f" ({blocked} cannot be searched)" if blocked is not None else ""
        raise ConfigError(f"{path}: cannot access it: {exc.strerror or exc}{where}", field=option) from None
    except OSError:
        return      # ENOENT, ENOTDIR, ELOOP, ...: the callers' own checks name those


def refuse_overlap(output, option: str, inputs: Iterable[tuple[str, object]], *, force: bool = True) -> None:
    """Raise one :class:`ConfigError` line naming ``option`` and the input when ``output`` is, contains or
    lies inside one of ``inputs`` (``(what, path or None)`` pairs), or lies where this process cannot look
    (:func:`refuse_unreachable`). Writes nothing. ``force``: whether the command has a ``--force`` that replaces the
    output (the line says what that would do; else what writing would)."""
    if output is None:
        return
    refuse_unreachable(output, option)
    hit = overlap(output, inputs)
    if hit is None:
        return
    rel, what, p = hit
    shown_out, shown_in = _resolved(output), _resolved(p)
    replaced = "--force would delete it" if force else "writing the output would replace it"
    why = {"is": replaced, "contains": replaced if force else "it lies inside the output path",
           "lies inside": "the output would be written into it"}[rel]
    raise ConfigError(f"{shown_out} {rel} the {what} {shown_in} ({why}); an output must not be, contain or lie "
                      f"inside an input: nothing was written", field=option)


__all__ = ["overlap", "refuse_overlap", "refuse_unreachable"]
