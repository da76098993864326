"""The target families the engine network has: one module each, as TensorRT-LLM keeps ``models/<family>/``."""

from __future__ import annotations

from .muse_glimmer import MuseGlimmerTransformer
from .qwen3 import Qwen3Transformer
from .qwen3_5 import Qwen3_5Transformer

TARGET_FAMILIES = {"qwen3": Qwen3Transformer, "qwen3_5": Qwen3_5Transformer, "muse_glimmer": MuseGlimmerTransformer}
"""qwen_type -> target transformer class."""
