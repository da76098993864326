"""A fresh clone tests itself: the published-config fixtures are read from the repository's own
``tests/fixtures/``, never from a directory beside the checkout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash2_trt.testing import fixtures

REPO = Path(__file__).resolve().parents[1]


def test_fixtures_default_to_the_repository_copy(monkeypatch):
    monkeypatch.delenv("DFLASH2_TRT_FIXTURES", raising=False)
    assert fixtures.fixtures_dir() == REPO / "tests" / "fixtures"


def test_fixtures_override_is_explicit(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH2_TRT_FIXTURES", str(tmp_path))
    assert fixtures.fixtures_dir() == tmp_path


@pytest.mark.parametrize("name", ["QWEN_DRAFTER", "MUSE_DRAFTER", "QWEN_TARGET", "MUSE_TARGET"])
def test_each_fixture_folder_is_in_the_clone(name):
    d = getattr(fixtures, name)
    assert (d / "config.json").is_file(), d
    json.loads((d / "config.json").read_text())
    assert d.resolve().is_relative_to(REPO.resolve()), d  # nothing outside the checkout
    if "DRAFTER" in name:
        assert isinstance(json.loads((d / "tensors.json").read_text()), (list, dict))


def test_no_source_points_outside_the_clone():
    """No code or test reaches for the old ``../shared`` location."""
    hits = []
    for top in ("dflash2_trt", "tests", "scripts"):
        for p in (REPO / top).rglob("*"):
            if p.suffix in (".py", ".sh", ".cpp", ".cu", ".yaml", ".toml") and p.is_file() and p != Path(__file__).resolve():
                text = p.read_text(errors="replace")
                if '"shared" / "fixtures"' in text or "../shared" in text or "shared/fixtures" in text:
                    hits.append(str(p.relative_to(REPO)))
    assert hits == []
