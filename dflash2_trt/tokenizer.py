"""The target's tokenizer, for commands that accept prompt text (generate, analyze).

One loader and one encoding rule for every command, so that the same text becomes the same
prompt everywhere: no special tokens are added (a BOS added by one command and not another would
silently change the prompt and so the acceptance numbers).
"""

from __future__ import annotations

from pathlib import Path

# transformers can build an EMPTY tokenizer from config.json alone (every text encodes to no
# tokens), so real tokenizer files are required first.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def find_tokenizer(target_dir: str | Path):
    """The tokenizer saved in ``target_dir``, or None when it has no usable one."""
    target_dir = Path(target_dir)
    if not any((target_dir / f).is_file() for f in TOKENIZER_FILES):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(target_dir))
    except Exception:  # noqa: BLE001 - any failure means "no usable tokenizer here"
        return None


def encode_text(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
