"""The published-config fixtures the tests read: the package's own ``assets/published/``.

They hold configs and tensor inventories of the real checkpoints, never weights; they ship with the
package (``bench project`` and the dry-run plan read them too), so a fresh clone or an installed
package tests itself without anything beside it. The rule is :func:`dflash2_trt.targets.fixtures_dir`.
"""

from __future__ import annotations

from ..targets import PUBLISHED_DIR, fixtures_dir

__all__ = ["PUBLISHED_DIR", "fixtures_dir", "FIXTURES", "QWEN_DRAFTER", "MUSE_DRAFTER", "QWEN_TARGET", "MUSE_TARGET"]

FIXTURES = fixtures_dir()
QWEN_DRAFTER = FIXTURES / "z-lab__Qwen3.8-27B-DFlash2"
MUSE_DRAFTER = FIXTURES / "z-lab__Muse-Glimmer-30B-DFlash2"
QWEN_TARGET = FIXTURES / "Qwen__Qwen3.8-27B"
MUSE_TARGET = FIXTURES / "meta-models__Muse-Glimmer-30B"
