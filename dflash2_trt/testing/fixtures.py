"""Where the published-config fixtures live (the project's ``shared/fixtures`` beside the repo).

``$DFLASH2_TRT_FIXTURES`` overrides the location. The fixtures hold configs and tensor
inventories of the real checkpoints, never weights.
"""

from __future__ import annotations

import os
from pathlib import Path


def fixtures_dir() -> Path:
    env = os.environ.get("DFLASH2_TRT_FIXTURES")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    for cand in (repo.parent / "shared" / "fixtures", repo / "shared" / "fixtures"):
        if cand.is_dir():
            return cand
    return repo.parent / "shared" / "fixtures"


FIXTURES = fixtures_dir()
QWEN_DRAFTER = FIXTURES / "z-lab__Qwen3.8-27B-DFlash2"
MUSE_DRAFTER = FIXTURES / "z-lab__Muse-Glimmer-30B-DFlash2"
QWEN_TARGET = FIXTURES / "Qwen__Qwen3.8-27B"
MUSE_TARGET = FIXTURES / "meta-models__Muse-Glimmer-30B"
