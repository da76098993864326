"""Where the published-config fixtures live: ``tests/fixtures/`` of this checkout.

The fixtures hold configs and tensor inventories of the real checkpoints, never weights; they
are part of the repository, so a fresh clone tests itself without anything beside it.
``$DFLASH2_TRT_FIXTURES`` overrides the location explicitly (e.g. for an installed, non-editable
package, which has no ``tests/``).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def fixtures_dir() -> Path:
    env = os.environ.get("DFLASH2_TRT_FIXTURES")
    return Path(env) if env else REPO_FIXTURES


FIXTURES = fixtures_dir()
QWEN_DRAFTER = FIXTURES / "z-lab__Qwen3.8-27B-DFlash2"
MUSE_DRAFTER = FIXTURES / "z-lab__Muse-Glimmer-30B-DFlash2"
QWEN_TARGET = FIXTURES / "Qwen__Qwen3.8-27B"
MUSE_TARGET = FIXTURES / "meta-models__Muse-Glimmer-30B"
