"""Every section reference (``§N``) in the repository resolves to a section of a document in docs/.

A reference names its document right before the sign (``docs/architecture.md §3``, also with the
name in backticks or across a line break); inside a Markdown page a bare ``§N`` means that page's
own section N. The cited file must exist in this repository under ``docs/`` and have a heading
numbered N (``## 3.`` or ``## 3 ``, any heading level). Code may not cite a bare ``§N``: a reader
of the code could not tell which document it means.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ["dflash2_trt", "scripts", "tests", "docs", "plugins", "build_configs", "README.md", "setup.py",
           "pyproject.toml"]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".sh", ".toml", ".cfg", ".json", ".h", ".cpp", ".cu", ".cuh",
                 ""}

# The document name, optionally in backticks, then whitespace (line breaks, comment or docstring
# indentation included), then the sign and its number.
REF = re.compile(r"(?:(?P<doc>[\w./-]+\.md)`?[ \t]*(?:\n[ \t#]*)?)?§[ \t]*(?P<num>\d+)")


def _files():
    for entry in SCANNED:
        p = REPO / entry
        paths = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
        for q in paths:
            if q.suffix in TEXT_SUFFIXES and "__pycache__" not in q.parts:
                yield q


def _sections(doc: Path) -> set[int]:
    heads = re.findall(r"^#+[ \t]+(\d+)(?:\.|[ \t])", doc.read_text(encoding="utf-8"), flags=re.M)
    return {int(h) for h in heads}


def references(path: Path, text: str):
    """(line, cited document or None, section) for each ``§N`` of ``text``."""
    for m in REF.finditer(text):
        line = text.count("\n", 0, m.start("num")) + 1
        yield line, m.group("doc"), int(m.group("num"))


def resolve(path: Path, doc: str | None) -> Path | None:
    """The docs/ file a reference means; None when it names no file of this repository's docs/."""
    if doc is None:
        return path if path.suffix == ".md" and path.parent == REPO / "docs" else None
    for base in (REPO, path.parent, REPO / "docs"):
        cand = (base / doc).resolve()
        if cand.is_file() and cand.parent == REPO / "docs":
            return cand
    return None


def problems() -> list[str]:
    out = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        rel = path.relative_to(REPO)
        for line, doc, num in references(path, text):
            if path == Path(__file__).resolve():
                continue   # this file's own examples
            target = resolve(path, doc)
            if target is None:
                what = f"{doc} §{num}" if doc else f"§{num} (no document named)"
                out.append(f"{rel}:{line}: {what} does not point into docs/")
            elif num not in _sections(target):
                out.append(f"{rel}:{line}: {target.relative_to(REPO)} has no section {num}")
    return out


def test_the_reference_parser(tmp_path):
    text = ("see docs/architecture.md §3 and `docs/TRTLLM-ENGINE.md` §1;\n"
            "    wrapped (docs/hybrid-runtime.md\n    §4), bare §2, a placeholder §N\n")
    got = [(doc, num) for _, doc, num in references(Path("x.py"), text)]
    assert got == [("docs/architecture.md", 3), ("docs/TRTLLM-ENGINE.md", 1), ("docs/hybrid-runtime.md", 4),
                   (None, 2)]
    assert resolve(REPO / "dflash2_trt" / "x.py", None) is None
    assert resolve(REPO / "docs" / "architecture.md", None) == REPO / "docs" / "architecture.md"
    assert resolve(REPO / "dflash2_trt" / "x.py", "DESIGN.md") is None
    assert resolve(REPO / "dflash2_trt" / "x.py", "../elsewhere/TRTLLM-ENGINE.md") is None
    page = tmp_path / "p.md"
    page.write_text("# T\n\n## 1. One\n### 2 Two\n## Three\n")
    assert _sections(page) == {1, 2}


def test_the_design_documents_exist():
    for name in ("architecture.md", "engine-contract.md", "hybrid-runtime.md", "TRTLLM-ENGINE.md"):
        assert (REPO / "docs" / name).is_file(), name
    head = (REPO / "docs" / "TRTLLM-ENGINE.md").read_text(encoding="utf-8")[:600]
    assert "copy" not in head.lower() and "brief" not in head.lower()


def test_every_section_reference_resolves():
    found = problems()
    assert not found, "section references that do not resolve:\n" + "\n".join(found)


def test_nothing_cites_a_path_outside_the_repository():
    """A reader of a clone has only the repository: no document or source names the authoring machine's folders
    (a scratch tree, the workspace beside the checkout, a home directory)."""
    outside = re.compile(r"/work/|\.\./shared\b|/root/")
    hits = [f"{q.relative_to(REPO)}:{n}: {line.strip()[:100]}" for q in _files() if q != Path(__file__)
            for n, line in enumerate(q.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if outside.search(line)]
    assert not hits, "\n".join(hits)


def test_every_markdown_table_row_is_one_line():
    """A table row broken over two lines renders as a cut row and a stray paragraph (docs/cli.md had four)."""
    broken = []
    for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "plugins").rglob("*.md"))]:
        lines = p.read_text(encoding="utf-8").split("\n")
        for i, ln in enumerate(lines):
            if ln.startswith("|") and not ln.rstrip().endswith("|"):
                broken.append(f"{p.relative_to(REPO)}:{i + 1}")
    assert broken == [], broken
