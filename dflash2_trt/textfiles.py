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
    as a traceback raised as a ``JSONDecodeError`` too, at the place it starts: a document nested deeper than the
    parser's recursion (``RecursionError``) and an integer of more digits than Python converts (a ``ValueError``)."""
    import json
    import re

    try:
        return json.loads(text, **kw)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        doc = _as_text(text)
        at = _too_deep_at(doc)
        raise json.JSONDecodeError(f"nested deeper than {_DEPTH_SHOWN} levels" if at else "nested too deeply", doc,
                                   at) from None
    except ValueError as exc:
        if not str(exc).startswith("Exceeds the limit"):
            raise       # a reader's own object hook's error (e.g. a repeated key): its own to report
        doc = _as_text(text)
        m = re.search(r"\d{4301,}", doc)
        raise json.JSONDecodeError(f"a number too long ({str(exc).split(';')[0]})", doc,
                                   m.start() if m else 0) from None


def _as_text(text) -> str:
    """The document ``json.loads`` was given, as text for an error's position (only on the error paths)."""
    return text if isinstance(text, str) else bytes(text).decode("utf-8", "replace")


_DEPTH_SHOWN = 900    # below the parser's recursion limit (1000 by default): where the document is surely too deep


def _too_deep_at(doc: str) -> int:
    """Where ``doc``'s nesting first passes :data:`_DEPTH_SHOWN` levels (strings skipped), else 0."""
    depth, in_str, escaped = 0, False, False
    for i, c in enumerate(doc):
        if in_str:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            if depth > _DEPTH_SHOWN:
                return i
        elif c in "]}":
            depth -= 1
    return 0
