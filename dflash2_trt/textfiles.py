"""A user's text file read as UTF-8, its failures as one ConfigError line naming the file: a hand-edited config,
prompts or dataset file with a stray byte (a Latin-1 editor, a binary appended) ended in a UnicodeDecodeError
traceback where the reader caught only OSError."""

from __future__ import annotations

from pathlib import Path

from .errors import ConfigError


def read_utf8(path: str | Path, *, what: str = "", bom: bool = False) -> str:
    """The text of ``path``; ``bom``: a leading UTF-8 byte-order mark (Windows editors) is not part of it. ``what``
    names the content in a read error ("cannot read prompts: ...")."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8-sig" if bom else "utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read{' ' + what if what else ''}: {exc.strerror or exc}", source=path) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start}: {exc.reason})", source=path) from None
