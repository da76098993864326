"""Strict tensor inventories: what a checkpoint must hold, what it holds, and the difference.

The drafter's expected tensors come from its config (the published contract, docs/architecture.md §2).
A target's come from transformers itself: its model class is instantiated on the meta device
(no memory, no weights) and its state dict names and shapes are the contract, so a family's
layout is never re-derived by hand here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..config import DFlash2Config, TargetConfig
from ..errors import CheckpointError, ConfigError
from ..transformers_support import require_supported_transformers
from .reader import DTYPE_NAMES, SafetensorsCheckpoint


@dataclass(frozen=True)
class Expected:
    shape: tuple[int, ...]
    dtype: str | None  # safetensors tag, or None for "any floating dtype"


@dataclass
class InventoryReport:
    """Result of comparing a checkpoint against its expected tensors."""

    directory: str
    checked: int = 0
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    wrong_shape: list[str] = field(default_factory=list)
    wrong_dtype: list[str] = field(default_factory=list)
    ignored: dict[str, int] = field(default_factory=dict)  # deliberately skipped prefix -> tensor count

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.wrong_shape or self.wrong_dtype)

    def problems(self) -> list[str]:
        out = [f"missing tensor {n}" for n in self.missing]
        out += [f"unexpected tensor {n}" for n in self.unexpected]
        out += self.wrong_shape + self.wrong_dtype
        return out

    def raise_for_problems(self) -> None:
        if not self.ok:
            probs = self.problems()
            more = f"\n  ... and {len(probs) - 20} more" if len(probs) > 20 else ""
            raise CheckpointError(
                f"tensor inventory does not match ({len(self.missing)} missing, {len(self.unexpected)} unexpected, "
                f"{len(self.wrong_shape)} wrong shape, {len(self.wrong_dtype)} wrong dtype):\n  "
                + "\n  ".join(probs[:20]) + more,
                file=self.directory,
            )

    def as_dict(self) -> dict:
        return {
            "ok": self.ok, "checked": self.checked, "missing": self.missing, "unexpected": self.unexpected,
            "wrong_shape": self.wrong_shape, "wrong_dtype": self.wrong_dtype, "ignored": self.ignored,
        }


def expected_drafter_tensors(cfg: DFlash2Config, target_hidden_size: int | None = None) -> dict[str, Expected]:
    """The published DFlash2 drafter tensors (no ``model.`` prefix), with shapes from the config."""
    h = cfg.hidden_size
    th = target_hidden_size if target_hidden_size is not None else h
    dt = DTYPE_NAMES[cfg.dtype]
    q_out = cfg.num_attention_heads * cfg.head_dim
    kv_out = cfg.num_key_value_heads * cfg.head_dim
    out: dict[str, Expected] = {
        "fc.weight": Expected((h, cfg.num_taps * th), dt),
        "hidden_norm.weight": Expected((h,), dt),
        "norm.weight": Expected((h,), dt),
        "candidate_selector.predecessor_codebook": Expected((cfg.vocab_size, cfg.selector_rank), dt),
        "candidate_selector.successor_codebook": Expected((cfg.vocab_size, cfg.selector_rank), dt),
        "candidate_selector.hidden_projection.weight": Expected((cfg.selector_rank, h), dt),
    }
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        out[p + "input_layernorm.weight"] = Expected((h,), dt)
        out[p + "post_attention_layernorm.weight"] = Expected((h,), dt)
        out[p + "self_attn.q_proj.weight"] = Expected((q_out, h), dt)
        out[p + "self_attn.k_proj.weight"] = Expected((kv_out, h), dt)
        out[p + "self_attn.v_proj.weight"] = Expected((kv_out, h), dt)
        out[p + "self_attn.o_proj.weight"] = Expected((h, q_out), dt)
        out[p + "self_attn.q_norm.weight"] = Expected((cfg.head_dim,), dt)
        out[p + "self_attn.k_norm.weight"] = Expected((cfg.head_dim,), dt)
        out[p + "mlp.gate_proj.weight"] = Expected((cfg.intermediate_size, h), dt)
        out[p + "mlp.up_proj.weight"] = Expected((cfg.intermediate_size, h), dt)
        out[p + "mlp.down_proj.weight"] = Expected((h, cfg.intermediate_size), dt)
        for conv in ("attention_conv", "mlp_conv"):
            out[p + conv + ".base_kernel"] = Expected((2, cfg.conv_kernel_size, h), dt)
            out[p + conv + ".kernel_projection.weight"] = Expected((cfg.kernel_projection_out, h), dt)
    return out


# Tensors that real checkpoints keep in float32 whatever the model dtype (Gated DeltaNet decay params).
_FLOAT32_OK = ("A_log", "dt_bias")
# Top-level groups of a target checkpoint that the language model does not use.
IGNORED_TARGET_PREFIXES = ("model.visual.", "model.vision_tower.", "model.multi_modal_projector.",
                            "model.vision_adapter.", "model.vision_projection.", "mtp.")


def _hf_config(config_cls, text: dict, cfg: TargetConfig):
    """``config_cls(**text)``, with transformers' own validation errors (huggingface_hub's strict
    dataclass checks of every field it knows) turned into a ConfigError naming the field."""
    import re

    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # pragma: no cover - older huggingface_hub
        StrictDataclassError = ValueError
    try:
        return config_cls(**{k: v for k, v in text.items() if k not in ("architectures", "model_type")})
    except (StrictDataclassError, TypeError, ValueError, KeyError, AttributeError) as exc:
        text_msg = str(exc).strip()
        m = re.search(r"field '([^']+)'", text_msg)
        last = text_msg.splitlines()[-1].strip() if text_msg else type(exc).__name__
        field = m.group(1) if m else None
        if field is not None and cfg.text_config_key:
            field = f"{cfg.text_config_key}.{field}"
        raise ConfigError(f"transformers rejects the config: {last}", source=cfg.source, field=field) from None


def _hf_text_model(cfg: TargetConfig) -> "torch.nn.Module":
    """The family's HF causal LM for the text config, on the meta device."""
    import torch

    require_supported_transformers("the target's inventory check")
    import transformers

    raw = dict(cfg.raw)
    text = dict(raw[cfg.text_config_key]) if cfg.text_config_key else raw
    if cfg.family == "qwen3":
        conf = _hf_config(transformers.Qwen3Config, text, cfg)
        cls = transformers.Qwen3ForCausalLM
    elif cfg.family == "qwen3_5":
        conf = _hf_config(transformers.Qwen3_5TextConfig, text, cfg)
        cls = transformers.Qwen3_5ForCausalLM
    elif cfg.family == "muse_glimmer":
        from transformers.models.muse_glimmer import configuration_muse_glimmer as mg
        from transformers.models.muse_glimmer import modeling_muse_glimmer as mm

        conf = _hf_config(mg.MuseGlimmerTextConfig, text, cfg)
        model_cls = mm.MuseGlimmerTextModel

        class _LM(torch.nn.Module):  # text model + lm_head, matching the wrapper's naming
            def __init__(self, c):
                super().__init__()
                self.model = model_cls(c)
                self.lm_head = torch.nn.Linear(c.hidden_size, c.vocab_size, bias=False)

        conf.tie_word_embeddings = cfg.tie_word_embeddings
        with torch.device("meta"):
            return _LM(conf)
    else:  # pragma: no cover - guarded by TargetConfig
        raise ValueError(cfg.family)
    conf.tie_word_embeddings = cfg.tie_word_embeddings
    with torch.device("meta"):
        return cls(conf)


def expected_target_tensors(cfg: TargetConfig) -> dict[str, Expected]:
    """Language-model tensors of the target, under their names in the HF checkpoint."""
    model = _hf_text_model(cfg)
    dt = DTYPE_NAMES[cfg.dtype]
    out: dict[str, Expected] = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if name.startswith("model."):
            name = cfg.weight_prefix + name[len("model."):]
        leaf = name.rsplit(".", 1)[-1]
        out[name] = Expected(tuple(tensor.shape), None if leaf in _FLOAT32_OK else dt)
    return out


def check_inventory(
    ckpt: SafetensorsCheckpoint,
    expected: Mapping[str, Expected],
    *,
    ignore_prefixes: tuple[str, ...] = (),
    allow_float32: tuple[str, ...] = (),
) -> InventoryReport:
    rep = InventoryReport(directory=str(ckpt.directory))
    have = ckpt.infos()
    for name, exp in expected.items():
        info = have.get(name)
        if info is None:
            rep.missing.append(name)
            continue
        rep.checked += 1
        if info.shape != exp.shape:
            rep.wrong_shape.append(f"{name}: shape {list(info.shape)}, expected {list(exp.shape)} ({info.file.name})")
        if exp.dtype is not None and info.dtype != exp.dtype:
            rep.wrong_dtype.append(f"{name}: dtype {info.dtype}, expected {exp.dtype} ({info.file.name})")
        elif exp.dtype is None and info.dtype not in ("BF16", "F16", "F32"):
            rep.wrong_dtype.append(f"{name}: dtype {info.dtype}, expected a float dtype ({info.file.name})")
    for name in have:
        if name in expected:
            continue
        prefix = next((p for p in ignore_prefixes if name.startswith(p)), None)
        if prefix is not None:
            rep.ignored[prefix] = rep.ignored.get(prefix, 0) + 1
        else:
            rep.unexpected.append(name)
    return rep


def check_drafter_checkpoint(directory: str | Path, cfg: DFlash2Config,
                             target_hidden_size: int | None = None) -> InventoryReport:
    ckpt = SafetensorsCheckpoint(directory)
    return check_inventory(ckpt, expected_drafter_tensors(cfg, target_hidden_size))


def check_target_checkpoint(directory: str | Path, cfg: TargetConfig) -> InventoryReport:
    ckpt = SafetensorsCheckpoint(directory)
    return check_inventory(ckpt, expected_target_tensors(cfg), ignore_prefixes=IGNORED_TARGET_PREFIXES)
