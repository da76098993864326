#!/usr/bin/env python
"""Write the phrase-language tokenizer (``dflash2_trt/assets/phrase_tokenizer.py``) into the shipped
tiny targets (``dflash2_trt/assets/tiny/{qwen3,qwen3_5}/target/``) without retraining them.

``scripts/train_tiny_drafter.py`` writes the same files when it retrains a pair.

Usage::

    python scripts/make_tiny_tokenizer.py
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dflash2_trt.assets import ASSET_ROOT  # noqa: E402
from dflash2_trt.assets.phrase_tokenizer import write_tokenizer  # noqa: E402


def main() -> int:
    for family in ("qwen3", "qwen3_5"):
        for p in write_tokenizer(ASSET_ROOT / family / "target"):
            print(f"wrote {p.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
