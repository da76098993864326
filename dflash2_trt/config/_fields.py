"""Small typed accessors for HF config dicts. Every failure names the file and the field."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigError
from ..textfiles import json_loads, read_utf8

_MISSING = object()

DTYPES = ("bfloat16", "float16", "float32")
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


def load_config_dict(path_or_dict: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """Return (a private copy of the config dict, a name for error messages).

    Accepts a model directory, a path to a ``config.json``, or a mapping. The caller's mapping is
    never mutated (it is deep-copied through JSON, which also rejects non-JSON values early).
    """
    if isinstance(path_or_dict, Mapping):
        try:
            return json.loads(json.dumps(dict(path_or_dict))), "<dict>"
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"config is not JSON-serialisable: {exc}", source="<dict>") from None
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        if not path.exists() and path.name != "config.json":   # the directory given is what is missing
            raise ConfigError("no such directory", source=path)
        raise ConfigError("config file not found", source=path)
    text = read_utf8(path, what="config")
    repeated: list = []
    try:
        data = json_loads(text, object_pairs_hook=lambda pairs: _last_of_each(pairs, repeated))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", source=path) from None
    if not isinstance(data, dict):
        raise ConfigError("top level of config.json must be an object", source=path)
    for obj, key, first, last in repeated:
        where = ".".join(_path_to(data, obj) + [key])
        warn_once(f"{path}: {where} is given more than once, with different values ({_short(first)}, then "
                  f"{_short(last)}); the last one is used, as transformers reads the file")
    return data, str(path)


def _path_to(root: Any, obj: dict) -> list[str]:
    """The keys (list indices as numbers) from ``root`` down to the object ``obj`` (found by identity)."""
    stack: list[tuple[Any, list[str]]] = [(root, [])]
    while stack:
        node, keys = stack.pop()
        if node is obj:
            return keys
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend((v, keys + [str(k)]) for k, v in items if isinstance(v, (dict, list)))
    return []


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """``message`` as a ``warning:`` line on stderr, once per process."""
    import sys

    if message not in _warned:
        _warned.add(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def _last_of_each(pairs: list[tuple[str, Any]], repeated: list) -> dict[str, Any]:
    """A JSON object as ``json.loads`` makes it (a repeated key keeps its last value, which is what transformers
    reads), noting (the object, key, first value, last value) for each key repeated with another value: compared as
    JSON text, so that 1 then 1.0 or true counts as another value and NaN twice does not."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out and json.dumps(out[key], sort_keys=True) != json.dumps(value, sort_keys=True):
            repeated.append((out, key, out[key], value))
        out[key] = value
    return out


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Fields:
    """Typed reads from one config mapping, with a field-path prefix for messages."""

    def __init__(self, data: Mapping[str, Any], source: str, prefix: str = ""):
        self.data = data
        self.source = source
        self.prefix = prefix
        self.seen: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(message, source=self.source, field=self.name(key))

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self.seen.add(key)
        if key not in self.data or self.data[key] is None:
            if default is _MISSING:
                raise self.error(key, "required field is missing")
            return default
        return self.data[key]

    def int(self, key: str, default: Any = _MISSING, *, min: int | None = None) -> int:
        value = self.raw(key, default)
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {value!r}")
        if min is not None and value < min:
            raise self.error(key, f"must be >= {min}, got {value}")
        return value

    def float(self, key: str, default: Any = _MISSING, *, positive: bool = False) -> float:
        value = self.raw(key, default)
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise self.error(key, f"must be finite, got {value}")
        if positive and value <= 0:
            raise self.error(key, f"must be > 0, got {value}")
        return value

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self.raw(key, default)
        if value is None:
            return value
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def str(self, key: str, default: Any = _MISSING, *, choices: tuple[str, ...] | None = None) -> str:
        value = self.raw(key, default)
        if value is None:
            return value
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {value!r}")
        if choices is not None and value not in choices:
            raise self.error(key, f"unsupported value {value!r}; supported: {', '.join(choices)}")
        return value

    def int_list(self, key: str, default: Any = _MISSING) -> tuple[int, ...]:
        value = self.raw(key, default)
        if value is None:
            return value
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.error(key, f"expected a list of integers, got {value!r}")
        return tuple(value)

    def dtype(self) -> str:
        key = "dtype" if self.has("dtype") else "torch_dtype"
        value = self.raw(key, "bfloat16")
        if not isinstance(value, str):
            raise self.error(key, f"expected a dtype name, got {value!r}")
        value = _DTYPE_ALIASES.get(value, value)
        if value not in DTYPES:
            raise self.error(key, f"unsupported dtype {value!r}; supported: {', '.join(DTYPES)}")
        self.seen.add("torch_dtype")
        self.seen.add("dtype")
        return value

    def unknown(self, known: set[str]) -> tuple[str, ...]:
        return tuple(sorted(k for k in self.data if k not in known and k not in self.seen))


def parse_rope(f: Fields) -> tuple[float, str, float]:
    """(rope_theta, rope_type, partial_rotary_factor) from ``rope_parameters`` or legacy fields.

    Only ``rope_type: default`` is supported: a scaled RoPE read as plain RoPE would not crash,
    it would silently misplace every position and acceptance would collapse. transformers applies
    a scaling from ``rope_scaling`` even next to ``rope_parameters``, and reads the legacy key
    ``type`` inside either, so every one of those places is checked (``generate`` would otherwise
    run yarn through transformers while ``convert`` writes ``rotary_scaling: null``).
    """
    scaling = f.raw("rope_scaling", None)
    if scaling is not None:
        if not isinstance(scaling, dict):
            raise f.error("rope_scaling", f"expected an object or null, got {scaling!r}")
        _check_rope_type(Fields(scaling, f.source, prefix=f.name("rope_scaling") + "."))
    if f.has("rope_parameters"):
        params = f.raw("rope_parameters")
        if not isinstance(params, dict):
            raise f.error("rope_parameters", f"expected an object, got {params!r}")
        sub = Fields(params, f.source, prefix=f.name("rope_parameters") + ".")
        theta = sub.float("rope_theta", positive=True)
        rope_type = _check_rope_type(sub)
        partial = sub.float("partial_rotary_factor", None)
        if partial is None:
            partial = f.float("partial_rotary_factor", 1.0, positive=True)
        else:
            f.seen.add("partial_rotary_factor")
    else:
        theta = f.float("rope_theta", 10000.0, positive=True)
        rope_type = "default"
        partial = f.float("partial_rotary_factor", 1.0, positive=True)
    if partial > 1.0:
        raise f.error("partial_rotary_factor", f"must be in (0, 1], got {partial}")
    return theta, rope_type, partial


def _check_rope_type(sub: Fields) -> str:
    """``rope_type`` (or its legacy spelling ``type``) of a RoPE object; only ``default``."""
    for key in ("rope_type", "type"):
        value = sub.str(key, None)
        if value is not None and value != "default":
            raise sub.error(key, f"unsupported value {value!r}; supported: default (scaled RoPE - yarn, "
                                 "linear, dynamic, llama3, longrope - is not implemented by the reference, the "
                                 "converter or the engine)")
    return "default"


# Standard Hugging Face fields that do not change this project's numbers but that transformers
# type-checks when it builds the model: a string there ("use_cache": "true") would otherwise be a
# huggingface_hub traceback deep inside transformers, or (bool("false") is True) silently wrong.
HF_TYPED_FIELDS = {
    "use_cache": "bool", "tie_word_embeddings": "bool", "use_sliding_window": "bool", "attention_bias": "bool",
    "output_attentions": "bool", "output_hidden_states": "bool", "return_dict": "bool",
    "initializer_range": "number", "attention_dropout": "number",
    "max_window_layers": "int", "full_attention_interval": "int",
    "bos_token_id": "token", "eos_token_id": "token", "pad_token_id": "token",
}
# Token ids that generation uses (stop / padding): one outside the vocabulary can never be produced
# (a stop that never stops) or indexes past the embedding.
VOCAB_TOKEN_FIELDS = ("eos_token_id", "pad_token_id")


def check_hf_fields(f: Fields, vocab: int) -> None:
    """Types of :data:`HF_TYPED_FIELDS` present in ``f``, and eos/pad ids inside ``[0, vocab)``.

    A token id field may be null, an integer, or a list of integers.
    """
    for key, kind in HF_TYPED_FIELDS.items():
        if not f.has(key):
            continue
        value = f.data[key]
        if kind == "bool":
            f.bool(key)
        elif kind == "int":
            f.int(key, min=0)
        elif kind == "number":
            f.float(key)
        else:
            ids = value if isinstance(value, list) else [value]
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise f.error(key, f"expected a token id or a list of token ids, got {value!r}")
            if key in VOCAB_TOKEN_FIELDS:
                bad = [i for i in ids if not 0 <= i < vocab]
                if bad:
                    raise f.error(key, f"token id(s) {bad} outside the vocabulary [0, {vocab})")
            f.seen.add(key)


def reject_quantization(f: Fields) -> None:
    """A ``quantization_config`` means packed/quantized weights, which nothing here reads."""
    if f.has("quantization_config"):
        q = f.data["quantization_config"]
        method = q.get("quant_method") if isinstance(q, dict) else None
        raise f.error("quantization_config", "quantized checkpoints are not supported"
                      + (f" (quant_method {method!r})" if method else "") + "; use the unquantized checkpoint")


def parse_attention_dims(f: Fields) -> tuple[int, int, int, int, int, int]:
    """(hidden, layers, heads, kv_heads, head_dim, vocab) of a Qwen-style decoder, validated."""
    hidden = f.int("hidden_size", min=1)
    layers = f.int("num_hidden_layers", min=1)
    heads = f.int("num_attention_heads", min=1)
    kv_heads = f.int("num_key_value_heads", heads, min=1)
    if heads % kv_heads:
        raise f.error("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}")
    head_dim = f.int("head_dim", hidden // heads, min=1)
    if head_dim % 2:
        raise f.error("head_dim", f"RoPE needs an even head_dim, got {head_dim}")
    vocab = f.int("vocab_size", min=2)
    return hidden, layers, heads, kv_heads, head_dim, vocab


def parse_layer_types(f: Fields, layer_types, layers: int, allowed: tuple[str, ...]) -> tuple[tuple[str, ...], int | None]:
    """Validate per-layer attention types and the sliding window they imply.

    Returns (layer_types, sliding_window); the window is None when no layer slides, so that a
    stray ``sliding_window`` never limits a full-attention model.
    """
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        raise f.error("layer_types", f"expected a list of {layers} layer types (num_hidden_layers), got {layer_types!r}")
    for i, t in enumerate(layer_types):
        if t not in allowed:
            raise f.error("layer_types", f"layer {i}: unsupported layer type {t!r}; supported: {', '.join(allowed)}")
    sliding_window = f.int("sliding_window", None, min=1)
    if "sliding_attention" in layer_types and sliding_window is None:
        raise f.error("sliding_window", "required when layer_types has sliding_attention layers")
    if "sliding_attention" not in layer_types:
        sliding_window = None
    return tuple(layer_types), sliding_window
