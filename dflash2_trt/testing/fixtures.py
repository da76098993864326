"""Where the published-config fixtures live: ``tests/fixtures/`` of this checkout.

The fixtures hold configs and tensor inventories of the real checkpoints, never weights; they
are part of the repository, so a fresh clone tests itself without anything beside it.
``$DFLASH2_TRT_FIXTURES`` overrides the location explicitly (e.g. for an installed, non-editable
package, which has no ``tests/``). The rule is :func:`dflash2_trt.targets.fixtures_dir` (shipped code
uses it too, and never imports this package).
"""

from __future__ import annotations

from ..targets import REPO_FIXTURES, fixtures_dir

__all__ = ["REPO_FIXTURES", "fixtures_dir", "FIXTURES", "QWEN_DRAFTER", "MUSE_DRAFTER", "QWEN_TARGET", "MUSE_TARGET"]

FIXTURES = fixtures_dir()
QWEN_DRAFTER = FIXTURES / "z-lab__Qwen3.8-27B-DFlash2"
MUSE_DRAFTER = FIXTURES / "z-lab__Muse-Glimmer-30B-DFlash2"
QWEN_TARGET = FIXTURES / "Qwen__Qwen3.8-27B"
MUSE_TARGET = FIXTURES / "meta-models__Muse-Glimmer-30B"
