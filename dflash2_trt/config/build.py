"""Build configs (top-level ``build_configs/*.yaml``; see :func:`dflash2_trt.targets.build_config_dir`):
every engine-shape and trtllm-build setting of a target, validated strictly.

Overrides (``build --set key=value`` and the named ``build`` options such as ``--block-size``) go
through the same validation as the YAML: :meth:`BuildConfig.load` merges them into the file's
mapping first, and an error names where the offending value came from (the file, or ``--set``).

=================================  =========  ==================================================================
key                                default    meaning
=================================  =========  ==================================================================
target                             required   the registry key the file belongs to (``dflash2-trt targets``)
dtype                              bfloat16   weights and KV cache: bfloat16, float16 or float32
tp_size                            1          tensor-parallel ranks: 1, 2, 4 or 8
pp_size                            1          pipeline stages: 1 only
block_size                         required   draft block size K + 1 (``max_draft_len`` = K); at most 16
selector                           greedy     greedy (the published walk: greedy at T=0, sampling at T>0) or
                                              viterbi (global best path, lossless, never the default)
max_batch_size                     required   requests per engine step; at most 512 (trtllm-build's EAGLE limit)
max_input_len                      required   longest prompt
max_seq_len                        required   prompt + output (trtllm-build adds 2K draft slots on top); the project
                                              runtime admits prompt + output + K + 1 <= max_seq_len, so at least
                                              max_input_len + 1 + block_size
max_num_tokens                     required   tokens per engine step; >= max_batch_size x block_size
kv_cache_free_gpu_mem_fraction     0.9        share of the GPU memory left after weights and activations that the
                                              runtime gives the KV cache (TensorRT-LLM's KvCacheConfig); a cuda
                                              engine's pool takes it of what is free once its weights and state
                                              slots are in
tokens_per_block                   32         tokens per paged KV block; a power of two
drafter_window                     model      model: the drafter's own sliding window; full: full-context drafter
                                              attention (the TensorRT-LLM backend needs ``full`` where the
                                              drafter's window can bind: engine/trtllm/windows.py)
sliding_path                       auto       how the target's sliding-window layers take a step's new tokens: context
                                              (as a context chunk after the committed tokens, where TensorRT-LLM's
                                              attention applies the window; the engine then runs on the project
                                              runtime only), generation (the speculative-decoding call every layer
                                              takes), auto (context where the target's window can bind:
                                              engine/pretrained.py resolve_sliding_path; TensorRT-LLM's side:
                                              engine/trtllm/windows.py)
gpus                               both       CUDA architectures the plugin library is built for: sm_90a, sm_100a
num_kv_blocks                      0          cpu and cuda backends: KV blocks in each rank's pool (0 = enough
                                              for max_batch_size requests of max_seq_len)
=================================  =========  ==================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..errors import ConfigError
from ..textfiles import read_utf8
from ._fields import DTYPES

SELECTORS = ("greedy", "viterbi")
DRAFTER_WINDOWS = ("model", "full")
SLIDING_PATHS = ("auto", "context", "generation")
GPU_ARCHS = ("sm_90a", "sm_100a")
TP_SIZES = (1, 2, 4, 8)
MAX_EAGLE_BATCH = 512          # tensorrt_llm/builder.py asserts max_batch_size <= 512 in EAGLE mode
MAX_BLOCK_SIZE = 16            # DFlash2PairwiseScan walks at most 15 draft positions

DEFAULTS: dict[str, Any] = {
    "dtype": "bfloat16", "tp_size": 1, "pp_size": 1, "selector": "greedy", "kv_cache_free_gpu_mem_fraction": 0.9,
    "tokens_per_block": 32, "drafter_window": "model", "sliding_path": "auto", "gpus": list(GPU_ARCHS),
    "num_kv_blocks": 0,
}
REQUIRED = ("block_size", "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")
KEYS = ("target", "dtype", "tp_size", "pp_size", "block_size", "selector", "max_batch_size", "max_input_len",
        "max_seq_len", "max_num_tokens", "kv_cache_free_gpu_mem_fraction", "tokens_per_block", "drafter_window",
        "sliding_path", "gpus", "num_kv_blocks")
SETTABLE = tuple(k for k in KEYS if k != "target")


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: str, first: int, again: int):
        super().__init__(f"given twice (lines {first} and {again}): which one is meant is not guessed")
        self.key = key


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The safe loader, refusing a mapping key given twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                hash(key)
            except TypeError:
                continue            # an unhashable key: the base class refuses it as YAML does ("found unhashable key")
            if key in seen:
                raise _DuplicateKey(str(key), seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error in one line: what is wrong and where (its own text spans several, with the context lines)."""
    mark = getattr(exc, "problem_mark", None)
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{what} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else what


@dataclass(frozen=True)
class BuildConfig:
    target: str | None
    dtype: str
    tp_size: int
    pp_size: int
    block_size: int
    selector: str
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    kv_cache_free_gpu_mem_fraction: float
    tokens_per_block: int
    drafter_window: str
    sliding_path: str
    gpus: tuple[str, ...]
    num_kv_blocks: int
    source: str

    @property
    def max_draft_len(self) -> int:
        return self.block_size - 1

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        d["gpus"] = list(self.gpus)
        return d

    @classmethod
    def load(cls, path: str | Path, overrides: Mapping[str, Any] | None = None,
             origins: Mapping[str, str] | None = None, *, target_key: str | None = None) -> "BuildConfig":
        """The YAML at ``path`` with ``overrides`` (key -> value) applied, validated as one mapping.
        ``origins`` names where each override came from (default ``--set``) for error messages; ``target_key``: the
        registry key whose file this is (its ``target`` field must name it). A key given twice is refused, not
        resolved to the last one."""
        path = Path(path)
        text = read_utf8(path)
        try:
            data = yaml.load(text, Loader=_UniqueKeyLoader)
        except _DuplicateKey as exc:
            raise ConfigError(str(exc), source=path, field=exc.key) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"invalid YAML: {_yaml_problem(exc)}", source=path) from None
        if not isinstance(data, dict):
            raise ConfigError("expected a mapping at the top level", source=path)
        unknown = sorted(set(map(str, data)) - set(KEYS))
        if unknown:
            raise ConfigError(f"unknown key; known: {', '.join(KEYS)}", source=path, field=unknown[0])
        if not isinstance(data.get("target"), str):
            raise ConfigError("required: the registry key this file belongs to", source=path, field="target")
        if target_key is not None and data["target"] != target_key:
            raise ConfigError(f"{data['target']!r}, but this is the build config of target {target_key!r}",
                              source=path, field="target")
        return cls.from_mapping(data, str(path), overrides, origins)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str, overrides: Mapping[str, Any] | None = None,
                     origins: Mapping[str, str] | None = None) -> "BuildConfig":
        overrides = dict(overrides or {})
        origins = dict(origins or {})
        bad = sorted(set(overrides) - set(SETTABLE))
        if bad:
            raise ConfigError(f"unknown key; settable: {', '.join(SETTABLE)}", source=origins.get(bad[0], "--set"),
                              field=bad[0])
        merged = {**DEFAULTS, **dict(data), **overrides}

        def where(key: str) -> str:
            return origins.get(key, "--set") if key in overrides else source

        def err(key: str, msg: str) -> ConfigError:
            return ConfigError(msg, source=where(key), field=key)

        for k in REQUIRED:
            if merged.get(k) is None:
                raise err(k, "required field is missing")

        def integer(key: str, lo: int) -> int:
            v = merged[key]
            if isinstance(v, bool) or not isinstance(v, int):
                raise err(key, f"expected an integer, got {v!r}")
            if v < lo:
                raise err(key, f"must be >= {lo}, got {v}")
            return v

        def choice(key: str, options: tuple[str, ...]) -> str:
            v = merged[key]
            if not isinstance(v, str) or v not in options:
                raise err(key, f"must be one of {', '.join(options)}, got {v!r}")
            return v

        target = merged.get("target")
        if target is not None and not isinstance(target, str):
            raise err("target", f"expected a string, got {target!r}")
        tp = integer("tp_size", 1)
        if tp not in TP_SIZES:
            raise err("tp_size", f"must be 1, 2, 4 or 8, got {tp}")
        pp = integer("pp_size", 1)
        if pp != 1:
            raise err("pp_size", f"only 1 is supported, got {pp}")
        block = integer("block_size", 2)
        if block > MAX_BLOCK_SIZE:
            raise err("block_size", f"at most {MAX_BLOCK_SIZE} (the selector plugin walks at most "
                                    f"{MAX_BLOCK_SIZE - 1} draft positions), got {block}")
        mbs = integer("max_batch_size", 1)
        if mbs > MAX_EAGLE_BATCH:
            raise err("max_batch_size", f"at most {MAX_EAGLE_BATCH} (trtllm-build's limit in EAGLE mode), got {mbs}")
        max_input = integer("max_input_len", 1)
        max_seq = integer("max_seq_len", 1)
        # a limit pair that does not fit is blamed on the option given (max_input_len unless only max_seq_len was)
        key = "max_input_len" if "max_input_len" in overrides or "max_seq_len" not in overrides else "max_seq_len"
        if max_input > max_seq:
            raise err(key, f"max_input_len {max_input} exceeds max_seq_len {max_seq}")
        if max_input + 1 + block > max_seq:
            # the project runtime (every cpu / cuda engine, and the TensorRT engines it drives) admits a request
            # when prompt + new tokens + the K + 1 draft slots fit max_seq_len: an engine whose longest prompt
            # could not generate one token would refuse its own limit at run time
            raise err(key, f"max_seq_len {max_seq} leaves no room to generate after a prompt of max_input_len "
                           f"{max_input}: the runtime needs prompt + at least 1 new token + the {block} draft slots "
                           f"(K + 1) = {max_input + 1 + block}")
        mnt = integer("max_num_tokens", 1)
        if mnt < mbs * block:
            key = "max_num_tokens" if "max_num_tokens" in overrides or "max_batch_size" not in overrides \
                else "max_batch_size"
            raise err(key, f"{mnt} < max_batch_size x block_size = {mbs} x {block} = {mbs * block} (every request "
                           f"of a full batch runs block_size tokens per step; trtllm-build requires it): raise "
                           f"max_num_tokens or lower max_batch_size")
        frac = merged["kv_cache_free_gpu_mem_fraction"]
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not math.isfinite(frac) \
                or not 0 < frac < 1:
            raise err("kv_cache_free_gpu_mem_fraction", f"must be a number in (0, 1), got {frac!r} (TensorRT-LLM's "
                                                        f"KV cache manager refuses 1: freeMemFraction < 1)")
        tpb = integer("tokens_per_block", 1)
        if tpb & (tpb - 1):
            raise err("tokens_per_block", f"must be a power of two (TensorRT-LLM's paged KV cache), got {tpb}")
        gpus = merged["gpus"]
        if not isinstance(gpus, list) or not gpus or any(g not in GPU_ARCHS for g in gpus) \
                or len(set(gpus)) != len(gpus):
            raise err("gpus", f"expected a non-empty list of distinct entries from {', '.join(GPU_ARCHS)}, "
                              f"got {gpus!r}")
        return cls(
            target=target, dtype=choice("dtype", DTYPES), tp_size=tp, pp_size=pp, block_size=block,
            selector=choice("selector", SELECTORS), max_batch_size=mbs, max_input_len=max_input,
            max_seq_len=max_seq, max_num_tokens=mnt, kv_cache_free_gpu_mem_fraction=float(frac),
            tokens_per_block=tpb, drafter_window=choice("drafter_window", DRAFTER_WINDOWS),
            sliding_path=choice("sliding_path", SLIDING_PATHS), gpus=tuple(gpus),
            num_kv_blocks=integer("num_kv_blocks", 0), source=source)


def pool_blocks(max_seq_len: int, tokens_per_block: int, max_batch_size: int, num_kv_blocks: int = 0) -> int:
    """The KV blocks in each rank's pool of a cpu or cuda engine: ``num_kv_blocks``, or (0) enough for
    ``max_batch_size`` requests of ``max_seq_len`` (the engine opens with it; the dry run sizes it)."""
    return int(num_kv_blocks) or -(-int(max_seq_len) // int(tokens_per_block)) * int(max_batch_size)


def fit_pool_blocks(every: int, free_bytes: int, block_bytes: int, fraction: float) -> int:
    """How TensorRT-LLM sizes a KV pool on a GPU (KvCacheConfig ``free_gpu_memory_fraction``, the build's
    ``kv_cache_free_gpu_mem_fraction``): the blocks that ``fraction`` of the memory free once the engine is loaded
    holds, and no more than ``every`` (:func:`pool_blocks`, every request at max_seq_len); 0 when not one block fits.
    The TensorRT session and a cuda engine open with it; the dry run sizes with it."""
    return max(0, min(int(every), int(int(free_bytes) * float(fraction)) // int(block_bytes)))


def parse_set(items) -> dict[str, Any]:
    """``--set key=value`` items -> {key: value}; values are YAML scalars or lists (``64``, ``0.85``,
    ``full``, ``[sm_90a]``). Unknown keys and repeated keys are errors naming the item."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, raw = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}", source="--set")
        if key not in SETTABLE:
            raise ConfigError(f"unknown key; settable: {', '.join(SETTABLE)}", source="--set", field=key)
        if key in out:
            raise ConfigError("given twice", source="--set", field=key)
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"value {raw!r} is not a YAML scalar or list ({exc.__class__.__name__})",
                              source="--set", field=key) from None
        if value is None:
            raise ConfigError("empty value", source="--set", field=key)
        out[key] = value
    return out
