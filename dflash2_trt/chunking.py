"""The chunked-context switch, ``$DFLASH2_CHUNKED_CONTEXT`` (no torch here: the CLI reads it before anything loads, and
the Triton repository writer writes it into the python model's ``enable_chunked_context``).

``1`` (or unset, or empty) chunks a prompt that does not fit what an engine step has left of ``max_num_tokens``, as
TensorRT-LLM's batch manager does (``engine/trtllm/facts/context_chunking.yaml``); ``0`` takes every prompt whole
(one over ``max_num_tokens`` is refused)."""

from __future__ import annotations

import os

from .errors import ConfigError

CHUNKED_CONTEXT_ENV = "DFLASH2_CHUNKED_CONTEXT"


def chunked_context_default() -> bool:
    """The switch's value; another value than 0 or 1 is a ConfigError naming the variable."""
    value = os.environ.get(CHUNKED_CONTEXT_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(f"must be 0 or 1, got {value!r}", field=CHUNKED_CONTEXT_ENV)
    return value != "0"
