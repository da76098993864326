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


def json_loads(text, **kw):
    """``json.loads``, with the two ways a hand-edited or hostile file still got past the readers' ``JSONDecodeError``
    as a traceback raised as a ``JSONDecodeError`` too: a document nested deeper than the parser's recursion
    (``RecursionError``) and an integer of more digits than Python converts (a ``ValueError``)."""
    import json

    try:
        return json.loads(text, **kw)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text if isinstance(text, str) else "", 0) from None
    except ValueError as exc:
        if not str(exc).startswith("Exceeds the limit"):
            raise       # a reader's own object hook's error (e.g. a repeated key): its own to report
        raise json.JSONDecodeError(f"a number too long ({str(exc).split(';')[0]})",
                                   text if isinstance(text, str) else "", 0) from None
