"""The declarative conversion plan: which source rows land where in which rank file.

Every output tensor of one rank is the vertical concatenation of :class:`Piece` s, each a block
``source[rows, cols]`` of one source tensor seen as 2-D (``[shape[0], prod(shape[1:])]``; a 1-D
tensor is ``[N, 1]``). That one shape of rule covers everything the converter does:

* replication:           one piece, all rows, all columns;
* column-parallel (dim 0, ``fc``/``gate``/``lm_head``): one piece, this rank's rows;
* row-parallel (dim 1, ``dense``/``proj``): one piece, all rows, this rank's columns;
* fused qkv per head group: several pieces from q, k and v (KV rows repeated on several ranks
  when ``kv_heads < tp``);
* the Qwen3.5 gated query (q and gate interleaved per head in ``q_proj``): one piece per head.

Because the plan is data, the output headers (names, shapes, offsets) are known before any tensor
is read, and the driver streams each source tensor once, in row chunks, into all its destinations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import ConfigError

TARGET = "target"
DRAFTER = "drafter"


@dataclass(frozen=True)
class Piece:
    ckpt: str                    # TARGET or DRAFTER
    src: str                     # full tensor name in that checkpoint
    rows: tuple[int, int]        # [begin, end) along dim 0
    cols: tuple[int, int] | None = None  # [begin, end) along the flattened trailing dims; None = all

    @property
    def num_rows(self) -> int:
        return self.rows[1] - self.rows[0]


@dataclass(frozen=True)
class OutTensor:
    name: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    keep_float32: bool = False   # stays float32 when its source is float32, whatever --dtype says

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def width(self) -> int:
        return math.prod(self.shape[1:])


@dataclass(frozen=True)
class Drop:
    """Source tensors deliberately not converted: names starting with ``prefix`` (or equal to ``name``)."""

    reason: str
    prefix: str | None = None
    name: str | None = None

    def matches(self, key: str) -> bool:
        return key == self.name if self.name is not None else key.startswith(self.prefix or "\0")


@dataclass
class RankPlan:
    rank: int
    tensors: list[OutTensor]


def width_of(shape: Sequence[int]) -> int:
    return math.prod(shape[1:]) if len(shape) > 1 else 1


class Shapes:
    """Source shapes by (checkpoint, name), with helpers that build pieces and check their fit."""

    def __init__(self, shapes: dict[tuple[str, str], tuple[int, ...]]):
        self.shapes = shapes

    def __call__(self, ckpt: str, name: str) -> tuple[int, ...]:
        return self.shapes[(ckpt, name)]


# ---- tensor-parallel splits -----------------------------------------------------------------

def even_split(n: int, tp: int, rank: int) -> tuple[int, int]:
    assert n % tp == 0, (n, tp)
    per = n // tp
    return rank * per, (rank + 1) * per


def require_divisible(n: int, tp: int, *, what: str, source: str, field: str) -> None:
    if n % tp:
        raise ConfigError(f"{n} is not divisible by --tp-size {tp} (each rank needs an equal share of {what})",
                          source=source, field=field)


def head_groups(num_heads: int, num_groups: int, tp: int, rank: int, *, source: str, heads_field: str,
                groups_field: str) -> tuple[range, range]:
    """(heads, groups) owned by ``rank``: the head-group split of grouped attention.

    ``num_heads`` heads share ``num_groups`` groups (KV heads; for Gated DeltaNet, value heads
    share key heads), head h belonging to group ``h // (num_heads // num_groups)``. Each rank
    owns ``num_heads / tp`` consecutive heads and the group(s) they use; when
    ``num_groups < tp`` a group is duplicated on ``tp / num_groups`` consecutive ranks
    (TensorRT-LLM's KV-head duplication). Anything else cannot be split and is an error.
    """
    if num_heads % tp:
        raise ConfigError(f"{num_heads} heads are not divisible by --tp-size {tp} (each rank must own whole heads)",
                          source=source, field=heads_field)
    if num_groups % tp and tp % num_groups:
        raise ConfigError(f"{num_groups} head groups neither divide nor are divisible by --tp-size {tp}",
                          source=source, field=groups_field)
    h0, h1 = even_split(num_heads, tp, rank)
    per_group = num_heads // num_groups
    g0, g1 = h0 // per_group, (h1 - 1) // per_group + 1
    heads, groups = range(h0, h1), range(g0, g1)
    # Every owned head's group is owned (and nothing else): true by construction when the split is valid.
    assert {h // per_group for h in heads} == set(groups), (num_heads, num_groups, tp, rank)
    return heads, groups


def rows_of(items: range, size: int, offset: int = 0) -> tuple[int, int]:
    """Row range of consecutive items (heads, groups) of ``size`` rows each, after ``offset`` rows."""
    return offset + items.start * size, offset + items.stop * size


# ---- piece builders ---------------------------------------------------------------------------

def replicated(name: str, ckpt: str, src: str, shape: tuple[int, ...], **kw) -> OutTensor:
    return OutTensor(name, tuple(shape), (Piece(ckpt, src, (0, shape[0])),), **kw)


def column_parallel(name: str, ckpt: str, src: str, shape: tuple[int, ...], tp: int, rank: int, **kw) -> OutTensor:
    """Split on dim 0 (output features / vocab)."""
    r0, r1 = even_split(shape[0], tp, rank)
    return OutTensor(name, (r1 - r0, *shape[1:]), (Piece(ckpt, src, (r0, r1)),), **kw)


def row_parallel(name: str, ckpt: str, src: str, shape: tuple[int, ...], tp: int, rank: int) -> OutTensor:
    """Split on dim 1 (input features) of a 2-D weight."""
    assert len(shape) == 2, shape
    c0, c1 = even_split(shape[1], tp, rank)
    return OutTensor(name, (shape[0], c1 - c0), (Piece(ckpt, src, (0, shape[0]), (c0, c1)),))


def stacked(name: str, pieces: Sequence[Piece], width: int, trailing: tuple[int, ...] | None = None,
            **kw) -> OutTensor:
    """Concatenation of ``pieces`` along dim 0; output shape ``[sum rows, *trailing]``."""
    n = sum(p.num_rows for p in pieces)
    trailing = trailing if trailing is not None else (width,)
    assert math.prod(trailing) == width
    return OutTensor(name, (n, *trailing), tuple(pieces), **kw)


MapFn = Callable[..., list[OutTensor]]
