"""The tiny-pair registry: the families a tiny pair exists for and the (family, target, drafter)
record both the shipped trained pairs (:func:`dflash2_trt.assets.trained_pair`) and the seeded
random pairs of :mod:`dflash2_trt.testing.tiny` are handed out as.

It lives with the shipped assets so that they stand on their own: ``testing/`` imports it, the
assets never import ``testing/`` (tests/test_import_graph.py keeps that true).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FAMILIES = ("qwen3", "qwen3_5", "muse_glimmer")


@dataclass(frozen=True)
class TinyPair:
    family: str
    target_dir: Path
    drafter_dir: Path
