"""Build configs (top-level ``build_configs/*.yaml``; see :func:`dflash2_trt.targets.build_config_dir`):
engine-shape settings per target."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import ConfigError
from ._fields import DTYPES, Fields

SELECTORS = ("greedy", "sample", "viterbi", "none")
GPU_ARCHS = ("sm_90a", "sm_100a")
_KEYS = {"target", "dtype", "tp_size", "pp_size", "block_size", "selector", "max_batch_size", "max_input_len",
         "max_seq_len", "max_num_tokens", "gpus"}


@dataclass(frozen=True)
class BuildConfig:
    target: str
    dtype: str
    tp_size: int
    pp_size: int
    block_size: int
    selector: str
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    gpus: tuple[str, ...]
    source: str

    @classmethod
    def load(cls, path: str | Path) -> "BuildConfig":
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror}", source=path) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"invalid YAML: {exc}", source=path) from None
        if not isinstance(data, dict):
            raise ConfigError("expected a mapping at the top level", source=path)
        f = Fields(data, str(path))
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise f.error(unknown[0], f"unknown key; known: {', '.join(sorted(_KEYS))}")
        tp = f.int("tp_size", 1, min=1)
        if tp not in (1, 2, 4, 8):
            raise f.error("tp_size", f"must be 1, 2, 4 or 8, got {tp}")
        pp = f.int("pp_size", 1, min=1)
        if pp != 1:
            raise f.error("pp_size", f"only 1 is supported, got {pp}")
        gpus = data.get("gpus", list(GPU_ARCHS))
        if not isinstance(gpus, list) or any(g not in GPU_ARCHS for g in gpus):
            raise f.error("gpus", f"expected a list drawn from {', '.join(GPU_ARCHS)}, got {gpus!r}")
        max_input = f.int("max_input_len", min=1)
        max_seq = f.int("max_seq_len", min=1)
        if max_input > max_seq:
            raise f.error("max_input_len", f"{max_input} exceeds max_seq_len={max_seq}")
        block = f.int("block_size", min=2)
        return cls(
            target=f.str("target"),
            dtype=f.str("dtype", "bfloat16", choices=DTYPES),
            tp_size=tp,
            pp_size=pp,
            block_size=block,
            selector=f.str("selector", "greedy", choices=SELECTORS),
            max_batch_size=f.int("max_batch_size", min=1),
            max_input_len=max_input,
            max_seq_len=max_seq,
            max_num_tokens=f.int("max_num_tokens", min=block),
            gpus=tuple(gpus),
            source=str(path),
        )
