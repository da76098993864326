"""Typed, validated, frozen configs built from Hugging Face ``config.json`` files."""

from .drafter import DFlash2Config
from .pairing import check_pair, pairing_problems
from .target import FAMILIES, TargetConfig, supported_architectures

__all__ = ["DFlash2Config", "TargetConfig", "FAMILIES", "check_pair", "pairing_problems", "supported_architectures"]
