"""Trained tiny DFlash2 pairs shipped with the package (``tiny/<family>/{target,drafter}``).

Made by ``scripts/train_tiny_drafter.py`` (seeded, CPU, minutes); see ``tiny/README.md`` and
``tiny/<family>/card.json`` for how, and for their measured acceptance. Unlike the seeded RANDOM
pairs of :mod:`dflash2_trt.testing.tiny` (whose drafts are almost always rejected at the first
position), these drafters predict their targets, so multi-token acceptance is exercised.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DFlash2Error
from .registry import FAMILIES, TinyPair

ASSET_ROOT = Path(__file__).resolve().parent / "tiny"

__all__ = ["ASSET_ROOT", "FAMILIES", "TinyPair", "trained_pair", "trained_card"]


def trained_pair(family: str = "qwen3") -> TinyPair:
    """The shipped trained tiny pair of ``family`` (``qwen3``, ``qwen3_5`` or ``muse_glimmer``)."""
    if family not in FAMILIES:
        raise DFlash2Error(f"unknown tiny family {family!r}; known: {', '.join(FAMILIES)}")
    root = ASSET_ROOT / family
    pair = TinyPair(family, root / "target", root / "drafter")
    for d in (pair.target_dir, pair.drafter_dir):
        if not (d / "model.safetensors").is_file() or not (d / "config.json").is_file():
            # An install without the package data would otherwise fall back to nothing useful.
            raise DFlash2Error(
                f"shipped tiny checkpoint missing: {d} (config.json + model.safetensors). The package "
                f"data was not installed (package-data needs '**/*.safetensors'), or regenerate it with "
                f"`python scripts/train_tiny_drafter.py --family {family}`")
    return pair


def trained_card(family: str = "qwen3") -> dict:
    """The card (how the pair was made, measured acceptance) of a shipped pair."""
    import json

    path = ASSET_ROOT / family / "card.json"
    if not path.is_file():
        raise DFlash2Error(f"shipped tiny card missing: {path}")
    return json.loads(path.read_text())
