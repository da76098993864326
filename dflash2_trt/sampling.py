"""The temperature rule shared by every entry point (``generate``, ``analyze``, ``run``, ``bench run``, the
Triton models, the CPU runtime).

A temperature must be a finite number >= 0. ``0`` is greedy decoding. Sampling divides logits (and the
selector's lattice scores) by the temperature in fp32: below ``FLT_MIN`` (1.2e-38) the quotient of any
ordinary logit overflows to inf and the softmax turns into NaN, so a "valid" ``1e-45`` used to sample
token 0 forever. A positive temperature below :data:`GREEDY_BELOW` (1e-5, vLLM's ``_SAMPLING_EPS``) is
therefore decoded greedily: at that temperature the target's distribution is already one-hot unless two
logits are within ~1e-4 of each other, and ``logit / 1e-5`` stays finite for any logit below 3e33. From
1e-5 up, sampling runs as asked (checked at 1e-5 on the trained tiny pair: the same tokens as greedy).
"""

from __future__ import annotations

import math
import struct

from .errors import ConfigError

# 1e-5 as float32 (9.99999975e-06): a client's fp32 1e-5 (Triton's temperature tensor is FP32) still samples
GREEDY_BELOW = struct.unpack("<f", struct.pack("<f", 1e-5))[0]


def effective_temperature(value, field: str = "--temperature") -> float:
    """The temperature sampling runs with: ``value`` when >= :data:`GREEDY_BELOW`, ``0.0`` (greedy) for
    ``0 <= value < GREEDY_BELOW``; a negative, NaN, infinite or non-numeric value is one ConfigError line
    naming ``field``."""
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"must be a finite number >= 0, got {value!r}", field=field) from None
    if not (t >= 0 and math.isfinite(t)):
        raise ConfigError(f"must be a finite number >= 0, got {value}", field=field)
    return t if t >= GREEDY_BELOW else 0.0


__all__ = ["GREEDY_BELOW", "effective_temperature"]
