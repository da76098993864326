"""Which transformers this project's Hugging Face stages run on, and the one-line refusal elsewhere.

The stages that read a checkpoint through transformers' own model classes (the inventory check of ``inspect``,
``convert`` and ``build``; the target's greedy decoding of ``generate``, ``analyze`` and the build's verify gate; the
converter's Gated DeltaNet check) are written for the minors of pyproject's pin
(``tests/test_transformers_support.py`` holds :data:`SUPPORTED_MINORS` equal to it; ``tests/test_dependency_pins.py``
holds the pin to the tested versions). Another transformers is not a harmless difference: TensorRT-LLM 1.2 pins
``transformers==4.57.x`` (``engine/trtllm/facts/trtllm_requirements.yaml``), so installing it after this project
downgrades transformers, and on 4.57.1 the Qwen3.5 and Muse Glimmer classes do not exist while the tiny dense target's
reference decoding gives other tokens than under 5.25 (measured 2026-12-06: ``build --target tiny`` fails its verify
gate at token 5 of prompt 0). So those stages refuse it in one line, before any work.

What does not need transformers' model classes (running, benchmarking and serving an engine, the tokenizer) runs on
TensorRT-LLM's own transformers: an environment with TensorRT-LLM 1.2 runs the TensorRT side (docs/trt-session.md
§11).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

from .errors import MissingDependencyError

SUPPORTED_MINORS = ((5, 24), (5, 25))
"""The transformers minors the whole suite has passed on (pyproject.toml: ``transformers>=5.24,<5.26``)."""

TRTLLM_DIST = "tensorrt-llm"


def _minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m[1]), int(m[2])) if m else None


def supported_range() -> str:
    lo, hi = SUPPORTED_MINORS[0], SUPPORTED_MINORS[-1]
    return f">={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}"


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def trtllm_transformers_requirement() -> str | None:
    """The transformers requirement of the installed TensorRT-LLM's own metadata (``"==4.57.1"``), or None where
    TensorRT-LLM is not installed or names none. Read from the wheel's METADATA, not by importing it."""
    try:
        reqs = importlib.metadata.requires(TRTLLM_DIST) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for r in reqs:
        m = re.match(r"\s*transformers(?![A-Za-z0-9._-])\s*(\[[^\]]*\])?\s*([^;]*)", r, re.IGNORECASE)
        if m:
            return m[2].strip().strip("()").replace(" ", "") or None
    return None


def version_problem(version: str | None, *, trtllm_pin: str | None = None) -> str | None:
    """Why ``version`` (the installed transformers) is not one the Hugging Face stages run on, or None."""
    if version is None:
        return f"transformers is not installed: pip install 'transformers{supported_range()}'"
    if _minor(version) in SUPPORTED_MINORS:
        return None
    why = ""
    if trtllm_pin:
        why = (f"; the TensorRT-LLM installed here pins transformers{trtllm_pin}, so this environment serves the "
               f"TensorRT side (run, bench, serve) and the Hugging Face stages run in one with this project's pin "
               f"(docs/trt-session.md §11)")
    return (f"transformers {version} is installed; this project's Hugging Face stages are written and tested for "
            f"transformers{supported_range()}{why}")


def require_supported_transformers(stage: str) -> None:
    """Refuse, in one line naming ``stage``, to run a Hugging Face stage on a transformers it was not tested on."""
    problem = version_problem(installed_version(), trtllm_pin=trtllm_transformers_requirement())
    if problem:
        raise MissingDependencyError(f"{stage} needs transformers' own model classes: {problem}")


def tensorrt_llm_import_failure(exc: ImportError) -> str:
    """Why ``import tensorrt_llm`` failed, in one line; beside transformers 5 it is TensorRT-LLM 1.2's own module-level
    import of a class transformers 5 removed (engine/trtllm/facts/trtllm_requirements.yaml), whatever the text says."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    if getattr(exc, "name", None) == "tensorrt_llm":   # not installed (here): not a failure inside it
        return (f"TensorRT-LLM is not importable by {sys.executable} ({first}): it runs from its own environment, "
                f"tensorrt-llm 1.2.x on its own pins with this project added by `pip install --no-deps` "
                f"(docs/trt-session.md §11)")
    msg = f"`import tensorrt_llm` failed: {type(exc).__name__}: {first}"
    have = installed_version() or ""
    if have.split(".")[0].isdigit() and int(have.split(".")[0]) >= 5:
        msg += (f"; transformers {have} is installed here, and TensorRT-LLM 1.2 imports only with its own pin "
                f"(transformers 4.57): run the TensorRT side from TensorRT-LLM's environment "
                f"(docs/trt-session.md §11)")
    return msg
