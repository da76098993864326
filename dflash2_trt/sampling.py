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

# The largest float32 (FLT_MAX): the engine carries the temperature in fp32, where a float64 that rounds past it
# becomes inf (logits / inf = 0: uniform sampling), and TensorRT-LLM's EAGLE layer takes (0, FLT_MAX] (engine_io.yaml
# request_temperature eagle_layer_range)
FLT_MAX = struct.unpack("<f", bytes.fromhex("ffff7f7f"))[0]


# What this project's GPU entry points put in a TensorRT-LLM request for greedy decoding (user temperature below
# GREEDY_BELOW, 0 included). TensorRT-LLM's EAGLE decoding layer refuses 0 (engine_io.yaml request_temperature:
# a temperature must lie in (0, FLT_MAX]) and fills eagle_temperature with 1.0 for a request without one, so greedy
# must be asked for with a positive temperature that the engine reads as greedy (trtllm/network/accept.py
# decoding_temperature).
GREEDY_REQUEST_TEMPERATURE = 1e-6   # float32 9.99999997e-07: positive, and below GREEDY_BELOW in fp32 too


# What TensorRT-LLM puts in eagle_temperature for a request without a temperature (engine_io.yaml
# request_temperature default_when_unset). This engine samples at it: the stock EAGLE engine's greedy_sampling
# switch, which keeps a default request greedy there, is not an input of this engine.
TRTLLM_DEFAULT_TEMPERATURE = 1.0


def request_temperature(value, field: str = "--temperature") -> float:
    """The temperature a TensorRT-LLM request (and the CPU runtime's feed) carries for a user's temperature:
    the value itself from :data:`GREEDY_BELOW` up, :data:`GREEDY_REQUEST_TEMPERATURE` below it (greedy); bad
    values are refused as by :func:`effective_temperature`."""
    t = effective_temperature(value, field)
    return t if t > 0 else GREEDY_REQUEST_TEMPERATURE


def check_request_temperature(value, field: str = "temperature") -> float:
    """A temperature as a TensorRT-LLM request carries it to the EAGLE engine, held to what TensorRT-LLM accepts
    (engine_io.yaml ``request_temperature``): finite and >= 0 (the executor's check), and not 0 (the EAGLE decoding
    layer's (0, FLT_MAX] check fails the request). Returned unchanged: the engine reads anything below
    :data:`GREEDY_BELOW` as greedy. Used where this project stands in for TensorRT-LLM's own request handling (the
    CPU backend's ``tensorrt_llm`` Triton model)."""
    effective_temperature(value, field)            # not a number, negative, NaN, infinite: refused
    t = float(value)
    if t == 0:
        from .trtllm.engine_io import CONTRACT
        from .yaml_files import load_yaml_file

        rule = load_yaml_file(CONTRACT)["request_temperature"]
        raise ConfigError(f"0 is refused by TensorRT-LLM's EAGLE decoding layer ("
                          f"{rule['eagle_layer_message'].format(value=t)}); greedy is any temperature below "
                          f"{GREEDY_BELOW:.0e}, e.g. {GREEDY_REQUEST_TEMPERATURE:g} (the ensemble model maps 0 to it)",
                          field=field)
    return t


def effective_temperature(value, field: str = "--temperature") -> float:
    """The temperature sampling runs with: ``value`` when >= :data:`GREEDY_BELOW`, ``0.0`` (greedy) for
    ``0 <= value < GREEDY_BELOW``; a negative, NaN, infinite, non-numeric value, or one that is inf in float32
    (rounds past :data:`FLT_MAX`), is one ConfigError line naming ``field``."""
    try:
        t = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"must be a finite number >= 0, got {value!r}", field=field) from None
    if not (t >= 0 and math.isfinite(t)):
        raise ConfigError(f"must be a finite number >= 0, got {value}", field=field)
    try:
        t32 = struct.unpack("<f", struct.pack("<f", t))[0]   # the engine compares (and carries it) in float32
    except OverflowError:                                    # rounds to inf in float32: logits / inf, uniform
        raise ConfigError(f"must be at most {FLT_MAX!r} (FLT_MAX: the engine carries the temperature in float32), "
                          f"got {value}", field=field) from None
    return t if t32 >= GREEDY_BELOW else 0.0


__all__ = ["FLT_MAX", "GREEDY_BELOW", "GREEDY_REQUEST_TEMPERATURE", "TRTLLM_DEFAULT_TEMPERATURE", "check_request_temperature", "effective_temperature",
           "request_temperature"]
