"""The tokenizer of the tiny pairs' phrase language: a real Hugging Face ``tokenizers`` tokenizer.

The tiny targets (``tiny/<family>/target``) have 256 token ids and were trained on a synthetic
phrase language (``scripts/train_tiny_drafter.py``): ids 3..254 are its words, 0/1/2 are
pad/BOS/EOS and 255 is the drafter's MASK. This module gives every id a fixed surface form so text
prompts can be served:

=====  ============  ===========================================================================
id     token         role
=====  ============  ===========================================================================
0      ``<pad>``     padding (``pad_token_id``); never generated
1      ``<s>``       BOS; **not added** to prompts (the targets were trained without one; every
                     command encodes text with ``add_special_tokens=False``)
2      ``</s>``      EOS (``eos_token_id``, Triton's ``end_id``): generation stops on it. The tiny
                     targets never saw it in training, so in practice outputs run to max tokens
3..254 a word        two consonant-vowel syllables (``teku``); id ``3 + k`` is word ``k``
255    ``<mask>``    the drafter's MASK (``mask_token_id``); never in text
=====  ============  ===========================================================================

Text is words separated by whitespace. Each word token decodes WITH its leading space (GPT-2's
byte-level convention: the vocabulary stores ``Ġteku``), so ``decode(a + b) == decode(a) +
decode(b)`` for any split of a token sequence: streamed chunks concatenate to the full text (a
decoder that strips the first space would silently glue the words of two chunks together). A
continuation's text therefore starts with a space: ``prompt_text + decode(output)`` is the whole
sequence. A word outside the vocabulary cannot be encoded (there is no id to spare for an unknown
token): :func:`dflash2_trt.tokenizer.encode_text` reports it by name.

Chat convention (``chat_template`` in ``tokenizer_config.json``): the language has no roles, so a
conversation is the messages' contents joined by single spaces, with no BOS and no role markers.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 256
PAD, BOS, EOS, MASK = 0, 1, 2, 255
SPECIAL = {PAD: "<pad>", BOS: "<s>", EOS: "</s>", MASK: "<mask>"}
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
_SYLLABLES = [c + v for c in CONSONANTS for v in VOWELS]   # 70
_SPACE = "\u0120"   # byte-level encoding of " " (GPT-2's "Ġ")
CHAT_TEMPLATE = ("{% for message in messages %}{% if not loop.first %} {% endif %}"
                 "{{ message['content'] }}{% endfor %}")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def word(i: int) -> str:
    """Surface form of id ``i``: a special token, or the word of language id ``i`` (3..254)."""
    if i in SPECIAL:
        return SPECIAL[i]
    if not 3 <= i <= 254:
        raise ValueError(f"id {i} outside [0, {VOCAB})")
    k = i - 3
    n = len(_SYLLABLES)
    # first syllable: k mod 70. The four k sharing it (q = k // 70 = 0..3) get second syllables
    # shifted by 17 q mod 70 (3 * 70 = 0 mod 70): 0, 17, 34, 51 apart, so every word is unique
    return _SYLLABLES[k % n] + _SYLLABLES[(3 * k + 17 * (k // n) + 11) % n]


WORDS = tuple(word(i) for i in range(VOCAB))


def build_tokenizer():
    """The ``tokenizers.Tokenizer`` (word level, byte-level spaces, 4 special tokens)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {(w if i in SPECIAL else _SPACE + w): i for i, w in enumerate(WORDS)}
    # unk_token names no vocabulary entry on purpose: an unknown word is an encoding error, never
    # a silent stand-in id (every id 0..255 already means something to the target)
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(SPECIAL[i], special=True, normalized=False) for i in sorted(SPECIAL)])
    return tk


def tokenizer_config(model_max_length: int = 512) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": SPECIAL[PAD], "bos_token": SPECIAL[BOS], "eos_token": SPECIAL[EOS],
        "mask_token": SPECIAL[MASK],
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length, "chat_template": CHAT_TEMPLATE,
    }


def write_tokenizer(directory: str | Path, *, model_max_length: int = 512) -> list[Path]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory`` (a target dir)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(d / "tokenizer.json"), pretty=True)
    (d / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(model_max_length), indent=2) + "\n")
    return [d / f for f in TOKENIZER_FILES]
