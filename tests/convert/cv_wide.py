"""Tiny checkpoints WIDE enough for every --tp-size up to 8, built in the tests.

The project's standard tiny pair (dflash2_trt.testing.tiny) has 4 query / 2 KV heads, which
cannot be split over 8 ranks (and is used below to check that clear error). These variants keep
hidden 64 / vocab 256 but have 8 query heads (2 KV heads, so tp 4 and 8 duplicate KV heads) and,
for Qwen3.5, 8 value / 2 key Gated DeltaNet heads (key heads duplicated at tp 4 and 8). Unlike
the standard tiny target, EVERY tensor is random here — RMSNorm scales, A_log, dt_bias included —
so that a swapped or mis-offset norm changes the logits.

The Muse Glimmer variant also decouples what the released checkpoint couples, so that a converter
or network inferring one from the other is caught: layers [sliding, full, sliding, full] with NoPE
on layers 1 and 2 (a full layer that rotates and a sliding layer that does not); a window of 5
(shorter than the test sequences); norm eps far enough apart (``rms_norm_eps`` 1e-2,
``post_norm_eps`` 1e-6) that using one for the other moves the logits; and ``output_multiplier``
2.0 (the release's ``1/sqrt(hidden/256)`` at hidden 64), large enough that the softcap binds.
"""

from __future__ import annotations

from pathlib import Path

from dflash2_trt.testing.tiny import build_tiny_drafter, build_tiny_target

WIDE_HEADS = 8
WIDE_TAPS = (0, 2, 3)


MUSE_WIDE = dict(layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                 layer_rope_theta=[10000.0, 0.0, 0.0, 10000.0], sliding_window=5, rms_norm_eps=1e-2,
                 post_norm_eps=1e-6, output_multiplier=2.0)


def build_wide_target(family: str, out_dir: Path, *, seed: int = 0, tie: bool = False) -> Path:
    return build_tiny_target(family, out_dir, seed=seed, heads=WIDE_HEADS, linear_value_heads=WIDE_HEADS,
                             tie=tie, random_1d=True, text_overrides=MUSE_WIDE if family == "muse_glimmer" else None)


def build_wide_drafter(family: str, out_dir: Path, *, seed: int = 1) -> Path:
    return build_tiny_drafter(family, out_dir, seed=seed, heads=WIDE_HEADS, target_layer_ids=WIDE_TAPS,
                              norm_std=0.2)


def build_wide_pair(family: str, root: Path, *, tie: bool = False) -> tuple[Path, Path]:
    """(drafter_dir, target_dir)."""
    return build_wide_drafter(family, root / "drafter"), build_wide_target(family, root / "target", tie=tie)
