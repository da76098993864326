"""Drafter <-> target pairing checks.

A mismatch here rarely crashes later: a drafter trained on other taps or another tokenizer
produces plausible-looking drafts that are almost never accepted. So every check is an error.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import PairingError
from ._fields import warn_once
from .drafter import DFlash2Config, max_block_size
from .target import TargetConfig


def pairing_problems(
    drafter: DFlash2Config,
    target: TargetConfig,
    *,
    fc_weight_shape: Sequence[int] | None = None,
) -> list[str]:
    """Every reason the pair does not fit, as messages naming both files and fields."""
    d, t = drafter.source, target.source
    problems = []
    if drafter.vocab_size != target.vocab_size:
        problems.append(f"vocab_size: drafter {drafter.vocab_size} ({d}) != target {target.vocab_size} ({t})")
    if drafter.hidden_size != target.hidden_size:
        problems.append(
            f"hidden_size: drafter {drafter.hidden_size} ({d}) != target {target.hidden_size} ({t}); the drafter "
            "embeds with the target's embedding and decodes with its lm_head, so they must match"
        )
    if drafter.num_target_layers != target.num_hidden_layers:
        problems.append(
            f"num_target_layers: drafter says {drafter.num_target_layers} ({d}), target has "
            f"num_hidden_layers={target.num_hidden_layers} ({t})"
        )
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < target.num_hidden_layers]
    if bad:
        problems.append(
            f"dflash_config.target_layer_ids: {bad} outside the target's {target.num_hidden_layers} layers ({t})"
        )
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        problems.append(f"dflash_config.mask_token_id: {drafter.mask_token_id} outside the target vocab {target.vocab_size}")
    expected_in = drafter.num_taps * target.hidden_size
    if fc_weight_shape is not None:
        if tuple(fc_weight_shape) != (drafter.hidden_size, expected_in):
            problems.append(
                f"fc.weight: shape {list(fc_weight_shape)} but len(target_layer_ids) x target hidden_size = "
                f"{drafter.num_taps} x {target.hidden_size} = {expected_in} inputs and {drafter.hidden_size} outputs"
            )
    if drafter.block_size > max_block_size(target.max_position_embeddings):    # the drafter's own rule, the target's
        problems.append(f"dflash_config.block_size: {drafter.block_size} ({d}) does not fit in the target's "
                        f"max_position_embeddings={target.max_position_embeddings} ({t}): the block follows at least "
                        f"one prompt token")
    if drafter.dtype != target.dtype:
        problems.append(f"dtype: drafter {drafter.dtype} ({d}) != target {target.dtype} ({t})")
    return problems


def pairing_warnings(drafter: DFlash2Config) -> list[str]:
    """What is accepted but suspicious. ``target_layer_ids`` out of ascending order: the fc layer reads the taps
    concatenated in the listed order, and the published drafters list them ascending, so another order is
    either a drafter trained that way or a config edited by hand (its fc columns then read the wrong layers:
    plausible-looking but worse drafts, no error anywhere)."""
    ids = list(drafter.target_layer_ids)
    if ids != sorted(ids):
        return [f"dflash_config.target_layer_ids {ids} are not in ascending order ({sorted(ids)}); the taps are "
                f"concatenated in the listed order for fc, so this must be the order the drafter was trained with "
                f"({drafter.source})"]
    return []


def warn_pairing(drafter: DFlash2Config) -> list[str]:
    """:func:`pairing_warnings` as ``warning:`` lines on stderr, each once per process."""
    out = pairing_warnings(drafter)
    for w in out:
        warn_once(w)
    return out


def check_pair(drafter: DFlash2Config, target: TargetConfig, *, fc_weight_shape: Sequence[int] | None = None) -> None:
    problems = pairing_problems(drafter, target, fc_weight_shape=fc_weight_shape)
    if problems:
        raise PairingError("drafter and target do not pair:\n  - " + "\n  - ".join(problems))
