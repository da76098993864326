"""Atomic file outputs: written to a temporary file beside the target, fsynced, then renamed over it.

A report, plot or dataset is either the complete new file or the old one (or absent); an error or
Ctrl-C leaves no partial file and no temporary behind. A failed write is one
:class:`~dflash2_trt.checkpoint.writer.OutputWriteError` line naming the output. Before any work,
:func:`check_output_file` makes sure the output can be written and that an existing file there is the command's own
previous output (a ``bench`` command has no ``--force``: it replaces its report, never another file).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..checkpoint.writer import OutputWriteError, current_umask
from ..errors import ConfigError, committed_outputs
from ..textfiles import json_loads


OUTPUT_KINDS = {"run": "a `bench run` report", "steps": "a `bench steps` report",
                "project": "a `bench project` projection", "png": "a PNG image",
                "serve": "a `bench serve` report",
                "load": "a Triton load report (`python -m dflash2_trt.deploy.triton.load --json`)"}
"""What each ``bench`` output is, by the key :func:`check_output_file`'s ``replaces`` takes."""
LOAD_FORMAT = "dflash2-trt triton load report"
"""``format`` of the Triton load tool's ``--json`` document."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_REPORT_BYTES = 1 << 30
"""A larger existing file is not read: no report this project writes comes near it."""


def report_kind(doc) -> str | None:
    """Which ``bench`` report a parsed JSON document is (a key of :data:`OUTPUT_KINDS`), by the field each carries:
    ``format`` (``bench run``, ``bench steps``, ``bench serve``) or ``kind`` (``bench project``); None for anything
    else."""
    from .common import PROJECTION_KINDS, SERVE_FORMAT, STEPS_FORMAT
    from .report import REPORT_FORMAT

    if not isinstance(doc, dict):
        return None
    fmt = doc.get("format")
    if fmt == REPORT_FORMAT:
        return "run"
    if fmt == STEPS_FORMAT:
        return "steps"
    if fmt == LOAD_FORMAT:
        return "load"
    if fmt == SERVE_FORMAT:
        return "serve"
    if fmt is None and doc.get("kind") in PROJECTION_KINDS:
        return "project"
    return None


def existing_output(path: str | Path) -> tuple[str | None, str]:
    """``(kind, what)`` of the file already at ``path``: ``kind`` a key of :data:`OUTPUT_KINDS` or None, ``what`` a
    few words saying what the file is (for an error line)."""
    path = Path(path)
    try:
        st = path.stat()
        if not path.is_file():
            return None, "not a regular file"
        if st.st_size > MAX_REPORT_BYTES:
            return None, f"a file of {st.st_size / 2**30:.1f} GiB"
        data = path.read_bytes()
    except OSError as exc:
        return None, f"a file that cannot be read ({exc.strerror or exc})"
    if data.startswith(PNG_SIGNATURE):
        return "png", OUTPUT_KINDS["png"]
    if not data.strip():
        return None, "an empty file"
    try:
        doc = json_loads(data)
    except ValueError:                      # UnicodeDecodeError included
        return None, "a file of another kind (no JSON document, no PNG signature)"
    kind = report_kind(doc)
    if kind is not None:
        return kind, OUTPUT_KINDS[kind]
    if isinstance(doc, dict) and isinstance(doc.get("format"), str):
        return None, f"a {doc['format']!r} file"
    if isinstance(doc, dict) and isinstance(doc.get("kind"), str):
        return None, f"a JSON document of kind {doc['kind']!r}"
    return None, "a JSON document that is not a bench report"


def check_output_file(path: str | Path, *, field: str, replaces: str | None = None) -> Path:
    """Refuse, before any work, an output path that is a directory, whose directory does not exist or cannot be
    written (a probe file is created there and removed at once), or, with ``replaces`` (a key of
    :data:`OUTPUT_KINDS`), an existing file that is not that kind of output: a command replaces its own previous
    report, never another file (an engine's ``engine.json``, a dataset). ``replaces`` None: an existing file is the
    caller's to judge (``bench prepare-dataset --force``)."""
    if str(path) == "-":
        # many tools read "-" as standard output; here it named a file "-" in the current directory
        raise ConfigError("'-' (standard output) is not an output here: the command prints its own text there; give a "
                          "file name", field=field)
    if str(path).startswith("-"):
        # `bench run ... --json --no-baseline`: click took the next option as the file name (and the option was lost)
        raise ConfigError(f"takes the path of the file it writes, got {str(path)!r}, an option's name: give a file name "
                          f"after {field} (a name starting with '-': ./{path})", field=field)
    from ..overlap import refuse_unreachable

    refuse_unreachable(path, field)
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory; give a file name", field=field)
    if not path.parent.is_dir():
        raise ConfigError(f"the directory {path.parent} does not exist", field=field)
    if replaces is not None and (path.exists() or path.is_symlink()):
        kind, what = existing_output(path)
        if kind != replaces:
            raise ConfigError(f"{path} exists and is {what}, not {OUTPUT_KINDS[replaces]} (this command "
                              f"replaces only its own); pass another path", field=field)
    try:                                    # where the report is written at the end: checked before the run
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    except OSError as exc:
        raise ConfigError(f"cannot create a file in {path.parent}: {exc.strerror or exc}", field=field) from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass
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
        committed_outputs.append(path)   # a stop after this point says the file is complete and kept (cli._stopped)
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
