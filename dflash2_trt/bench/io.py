"""Atomic file outputs: written to a temporary file beside the target, fsynced, then renamed over it.

A report, plot or dataset is either the complete new file or the old one (or absent); an error or
Ctrl-C leaves no partial file and no temporary behind. A failed write is one
:class:`~dflash2_trt.checkpoint.writer.OutputWriteError` line naming the output.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..checkpoint.writer import OutputWriteError, current_umask
from ..errors import ConfigError


def check_output_file(path: str | Path, *, field: str) -> Path:
    """Refuse an output path that is a directory or whose parent directory does not exist; never writes."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory; give a file name", field=field)
    if not path.parent.is_dir():
        raise ConfigError(f"the directory {path.parent} does not exist", field=field)
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
        with os.fdopen(fd, "wb") as f:        # owns fd from here: closed whatever follows
            os.fchmod(f.fileno(), 0o666 & ~current_umask())   # mkstemp makes it 0600; the result should look like open()'s
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise OutputWriteError(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, doc) -> Path:
    return atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
