"""A fresh clone (or an installed package) tests itself: the published configs and tensor inventories are
package data (``dflash2_trt/assets/published/``) and are read only from there. This file reads the package and the
repository's own pyproject.toml, nothing else; CI runs the suite in a clean clone inside an empty directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dflash2_trt
from dflash2_trt.testing import fixtures

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(dflash2_trt.__file__).resolve().parent


def test_fixtures_are_the_package_copy():
    import inspect

    assert fixtures.fixtures_dir() == PACKAGE / "assets" / "published"
    # no environment override: nothing outside the package can be made the fixtures
    assert "environ" not in inspect.getsource(fixtures.fixtures_dir)


@pytest.mark.parametrize("name", ["QWEN_DRAFTER", "MUSE_DRAFTER", "QWEN_TARGET", "MUSE_TARGET"])
def test_each_fixture_folder_is_in_the_package(name):
    d = getattr(fixtures, name)
    assert (d / "config.json").is_file(), d
    json.loads((d / "config.json").read_text())
    assert d.resolve().is_relative_to(PACKAGE), d  # shipped with the package
    if "DRAFTER" in name:
        assert isinstance(json.loads((d / "tensors.json").read_text()), (list, dict))


def test_the_package_data_globs_ship_them():
    text = (REPO / "pyproject.toml").read_text()
    assert '"**/*.json"' in text and '"**/*.md"' in text

