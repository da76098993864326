#!/usr/bin/env python
"""Write the phrase-language tokenizer (``dflash2_trt/assets/phrase_tokenizer.py``) into every shipped
tiny target (``dflash2_trt/assets/tiny/<family>/target/``) without retraining them.

``scripts/train_tiny_drafter.py`` writes the same files when it retrains a pair. A target whose
vocabulary is not the language's 256 ids is refused (its ids would not mean these words).

Usage::

    python scripts/make_tiny_tokenizer.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dflash2_trt.assets import ASSET_ROOT  # noqa: E402
from dflash2_trt.assets.phrase_tokenizer import VOCAB, write_tokenizer  # noqa: E402


def main() -> int:
    for cfg_path in sorted(ASSET_ROOT.glob("*/target/config.json")):
        cfg = json.loads(cfg_path.read_text())
        vocab = cfg.get("text_config", cfg).get("vocab_size")
        if vocab != VOCAB:
            print(f"error: {cfg_path}: vocab_size {vocab}, the phrase language has {VOCAB} ids", file=sys.stderr)
            return 1
        for p in write_tokenizer(cfg_path.parent):
            print(f"wrote {p.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
