"""The target's tokenizer, for commands that accept prompt text (run, generate, analyze, bench prepare-dataset).

One loader and one encoding rule for every command, so that the same text becomes the same
prompt everywhere: no special tokens are added (a BOS added by one command and not another would
silently change the prompt and so the acceptance numbers). With ``--chat`` (:class:`ChatFormat`) the text is
first rendered as a user message by the target's chat template, in every one of those commands alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

# transformers can build an EMPTY tokenizer from config.json alone (every text encodes to no
# tokens), so real tokenizer files are required first.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
# Everything a tokenizer directory may need, copied into an engine directory (``tokenizer/``) so
# an engine is self-contained; config.json goes along because AutoTokenizer may read model_type.
TOKENIZER_COPY_FILES = TOKENIZER_FILES + ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                                          "merges.txt", "vocab.txt", "chat_template.jinja", "chat_template.json",
                                          "config.json")
ENGINE_TOKENIZER_DIR = "tokenizer"


def has_tokenizer_files(directory: str | Path) -> bool:
    return any((Path(directory) / f).is_file() for f in TOKENIZER_FILES)


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> list[str]:
    """Copy the tokenizer files of ``src`` into ``dst`` (created); [] (nothing created) when it has none."""
    import shutil

    src, dst = Path(src), Path(dst)
    if not has_tokenizer_files(src):
        return []
    dst.mkdir(parents=True, exist_ok=False)
    names = [f for f in TOKENIZER_COPY_FILES if (src / f).is_file()]
    for f in names:
        shutil.copyfile(src / f, dst / f)
    return names


def engine_tokenizer_dir(engine_dir: str | Path, manifest: dict) -> Path | None:
    """The tokenizer an engine serves text with: its own copy (``ENGINE_DIR/tokenizer/``, written by
    ``build``), else the target directory recorded at build time (engines built before the copy
    existed), else None."""
    own = Path(engine_dir) / ENGINE_TOKENIZER_DIR
    if manifest.get("tokenizer") and has_tokenizer_files(own):
        return own
    target = (manifest.get("sources") or {}).get("target_dir")
    if target and has_tokenizer_files(target):
        return Path(target)
    return None


def find_tokenizer(target_dir: str | Path, *, strict: bool = False):
    """The tokenizer saved in ``target_dir``, or None when it has no usable one. ``strict``: tokenizer files
    that are there but cannot be loaded (a corrupt tokenizer.json) are a ConfigError naming the directory and
    the reason, not "no tokenizer"."""
    target_dir = Path(target_dir)
    if not has_tokenizer_files(target_dir):
        return None
    if strict:
        try:
            return _load_tokenizer(target_dir)
        except Exception as exc:  # noqa: BLE001 - transformers/tokenizers raise many kinds
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise ConfigError(f"has tokenizer files that cannot be loaded ({type(exc).__name__}: {reason})",
                              source=target_dir) from None
    try:
        return _load_tokenizer(target_dir)
    except Exception:  # noqa: BLE001 - any failure means "no usable tokenizer here"
        return None


def _load_tokenizer(target_dir: Path):
    if declares_generic_fast_class(target_dir):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(target_dir))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(target_dir))


GENERIC_FAST_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def declares_generic_fast_class(directory: str | Path) -> bool:
    """True when ``tokenizer_config.json`` names the generic fast class and ``tokenizer.json`` exists.

    Such a tokenizer IS its tokenizer.json and is loaded as that class. AutoTokenizer (transformers
    5) would instead pick the model type's own class from config.json for some model types (seen:
    ``qwen3_5`` -> Qwen3_5Tokenizer), which rebuilds a BPE pipeline from the vocabulary and ignores
    tokenizer.json's: the tiny pairs' word-level text then encodes to NO tokens, silently. The
    python-backend pre/postprocessing models apply the same rule."""
    import json

    d = Path(directory)
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return (d / "tokenizer.json").is_file() and isinstance(cfg, dict) \
        and cfg.get("tokenizer_class") in GENERIC_FAST_CLASSES


WORD_SCAN_LIMIT = 10_000
"""Distinct words an encoding error tries one by one to name the one the tokenizer cannot take."""


@dataclass(frozen=True)
class ChatFormat:
    """``--chat``: each prompt text is one user message put through the target tokenizer's own chat template, with
    the assistant's turn opened (``add_generation_prompt``), before it is encoded. A chat model's drafter was trained
    on such conversations, so its acceptance is measured on them: the public DFlash benchmark (z-lab/dflash
    ``dflash/benchmark.py``, ``_apply_chat_template``) renders every prompt this way, with ``enable_thinking`` False
    unless ``--enable-thinking`` is given. The template's own text says where a BOS goes, so the rendered text is
    encoded without special tokens, as every prompt is here: the ids Hugging Face's own
    ``apply_chat_template(..., tokenize=True)`` gives (that benchmark's transformers path encodes with special tokens,
    which doubles the BOS of a tokenizer that adds one; for Qwen's tokenizers the ids are the same)."""

    enable_thinking: bool = False

    def template_kwargs(self) -> dict:
        """The variables the template is rendered with beside the messages (a template that does not read one
        ignores it)."""
        return {"enable_thinking": self.enable_thinking}

    def to_dict(self) -> dict:
        return {"add_generation_prompt": True, **self.template_kwargs()}


def chat_report(chat: ChatFormat | None) -> dict:
    """What a report says of ``--chat``: ``{"chat_template": {...}}`` (its template variables) where prompt text went
    through the chat template, nothing otherwise (reports without the key are as before)."""
    return {} if chat is None else {"chat_template": chat.to_dict()}


def chat_label(chat_template: dict) -> str:
    """What a text output says of a report's ``chat_template`` (:func:`chat_report`)."""
    return f"chat template, enable_thinking {str(chat_template['enable_thinking']).lower()}"


def chat_format(chat: bool, enable_thinking: bool) -> ChatFormat | None:
    """The commands' ``--chat`` / ``--enable-thinking`` as a :class:`ChatFormat` (None: prompt text is encoded as
    given). ``--enable-thinking`` alone is refused rather than ignored."""
    if enable_thinking and not chat:
        raise ConfigError("is a chat template variable: give --chat too", field="--enable-thinking")
    return ChatFormat(enable_thinking=enable_thinking) if chat else None


def refuse_chat_without_text(chat: ChatFormat | None, has_text: bool, what: str) -> None:
    """``--chat`` renders prompt TEXT; where every prompt is token ids (``what`` says which) it would do nothing, so it
    is refused rather than ignored."""
    if chat is not None and not has_text:
        raise ConfigError(f"puts prompt text through the chat template, but {what}: give text prompts, or drop --chat "
                          f"(token ids are taken as they are)", field="--chat")


def render_chat(tokenizer, text: str, chat: ChatFormat, *, source=None, field: str = "prompt") -> str:
    """``text`` as the user's message in the tokenizer's chat template, the assistant's turn opened (a string: the
    caller encodes it)."""
    return render_messages(tokenizer, [{"role": "user", "content": text}], chat.template_kwargs(), source=source,
                           field=field, what="--chat: ", advice="drop --chat, or give the template")


def render_messages(tokenizer, messages: list, template_kwargs: dict, *, source=None, field: str | None = None,
                    what: str = "", advice: str = "give the template") -> str:
    """``messages`` rendered by the tokenizer's chat template with ``template_kwargs``, the assistant's turn opened
    (text: the caller encodes it without special tokens). No template, a template that fails and one that renders
    anything but text are ConfigErrors (``what`` leads their message: the option or endpoint)."""
    where = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ConfigError(f"{what}the tokenizer ({where}) has no chat template (tokenizer_config.json "
                          f"\"chat_template\", or chat_template.jinja): {advice}", source=source, field=field)
    if isinstance(template, dict) and "default" not in template:   # Hugging Face picks "default" among named ones
        raise ConfigError(f"{what}the tokenizer ({where}) has named chat templates ({', '.join(sorted(template))}) "
                          f"and none named \"default\", the one that is rendered", source=source, field=field)
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)
    except Exception as exc:  # noqa: BLE001 - jinja2's errors, a template's own raise_exception(...)
        reason = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError(f"{what}the tokenizer's chat template ({where}) failed on the messages: "
                          f"{type(exc).__name__}: {reason}", source=source, field=field) from None
    if not isinstance(out, str):   # tokenize=False renders text; anything else is not a template this code knows
        raise ConfigError(f"{what}the tokenizer's chat template ({where}) rendered {type(out).__name__}, not text",
                          source=source, field=field)
    if not out.strip():            # the caller's "empty prompt" would blame the text, which was not empty
        raise ConfigError(f"{what}the tokenizer's chat template ({where}) rendered the messages as empty text",
                          source=source, field=field)
    return out


def encode_text(tokenizer, text: str, vocab_size: int | None = None, *, source=None, field: str = "prompt",
                chat: ChatFormat | None = None) -> list[int]:
    """``text`` as token ids (no special tokens added). ``vocab_size``: the engine's vocabulary; ids at or beyond
    it mean the tokenizer is not the target's (refused here, naming the tokenizer, not later as a bad request).
    ``source``: where the text came from (a file and its line), named by the error with ``field`` (a file's
    ``prompt`` field, or the option that gave the text: ``--prompt``). ``chat``: the text is the user's message,
    rendered by the tokenizer's chat template first (:func:`render_chat`)."""
    if chat is not None:
        if not text.strip():   # refused as it is without --chat: the template alone would be the prompt
            raise ConfigError("the prompt text is empty", source=source, field=field)
        text = render_chat(tokenizer, text, chat, source=source, field=field)
    try:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    except Exception as exc:  # noqa: BLE001 - e.g. a word-level vocabulary without an unknown token
        # each distinct word once, the first WORD_SCAN_LIMIT of them (a long text ending in an unknown word must not
        # cost a tokenizer call per word: the tokenizer's own message past that)
        bad = next((w for w in list(dict.fromkeys(text.split()))[:WORD_SCAN_LIMIT] if not _encodes(tokenizer, w)), None)
        what = f"the word {bad!r} is not in its vocabulary" if bad is not None else str(exc)
        raise ConfigError(f"the tokenizer cannot encode the prompt text: {what}", source=source,
                          field=field) from None
    if not ids and text.strip():
        # a tokenizer whose pipeline does not match its vocabulary maps every word to nothing
        raise ConfigError(f"the tokenizer encodes the prompt text to no tokens ({type(tokenizer).__name__}: its "
                          f"pre-tokenizer does not match its vocabulary?)", source=source, field=field)
    bad = [] if vocab_size is None else ids_outside(ids, vocab_size)
    if bad:
        where = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(f"the tokenizer ({where}) encodes the prompt text to token ids {bad[:5]} outside the "
                          f"engine's vocabulary [0, {vocab_size}): it is not this target's tokenizer", source=source,
                          field=field)
    return ids


def ids_outside(ids, vocab_size: int) -> list[int]:
    """The distinct ids of ``ids`` outside ``[0, vocab_size)`` (no embedding row for them), ascending."""
    return sorted({i for i in ids if not 0 <= i < vocab_size})


def out_of_vocab_ids(tokenizer, vocab_size: int) -> list[int]:
    """The tokenizer's ids (its vocabulary and added tokens) at or beyond ``vocab_size``, ascending."""
    return ids_outside(tokenizer.get_vocab().values(), vocab_size)


def _encodes(tokenizer, text: str) -> bool:
    try:
        tokenizer(text, add_special_tokens=False)
        return True
    except Exception:  # noqa: BLE001
        return False
