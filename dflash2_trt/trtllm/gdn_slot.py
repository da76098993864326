"""One slot of the Gated DeltaNet's recurrent-state pool: its size (what the runtime allocates) and the plugin's
layout inside it, in plain Python (no torch, no compiler) for the engine config, the dry run's sizing and the
runtimes. The one definition is ``gatedDeltaNetSlotLayout`` in ``plugins/gatedDeltaNetPlugin/gatedDeltaNetParams.h``;
``tests/plugins/test_plugin_gdn_cpu.py`` checks this copy against it through the CPU build.

The slot holds the state as of the last fold and the records of the deferred commit (docs/hybrid-runtime.md §5):
``state [Hv, Dk, Dv]`` fp32, ``pending`` int32 (+ 3 floats of padding), ``delta [Hv, Kv, Dv]``, ``keys [Hk, Kv, Dk]``,
``decay [Hv, Kv]``, each segment at a multiple of 4 floats. The runtime sees the slot as TensorRT-LLM's
``RnnStateManager`` row ``[rnn_hidden_size / rnn_head_size, state_size, rnn_head_size]`` = ``[Hv, Dk + E, Dv]``
float32 with ``E = record_rows``: the config's ``state_size`` is ``Dk + E``, not ``Dk``.
"""

from __future__ import annotations

from dataclasses import dataclass


def _pad4(v: int) -> int:
    return (v + 3) // 4 * 4


@dataclass(frozen=True)
class GdnSlotLayout:
    """Offsets in floats from a slot's start, per rank: ``num_k_heads`` Hk, ``num_v_heads`` Hv, ``head_k_dim``
    Dk, ``head_v_dim`` Dv, ``max_verify_tokens`` Kv (the engine's block size)."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    max_verify_tokens: int

    @property
    def state(self) -> int:
        return 0

    @property
    def pending(self) -> int:
        return _pad4(self.num_v_heads * self.head_k_dim * self.head_v_dim)

    @property
    def delta(self) -> int:
        return self.pending + 4

    @property
    def keys(self) -> int:
        return self.delta + _pad4(self.num_v_heads * self.max_verify_tokens * self.head_v_dim)

    @property
    def decay(self) -> int:
        return self.keys + _pad4(self.num_k_heads * self.max_verify_tokens * self.head_k_dim)

    @property
    def record_rows(self) -> int:
        """Rows of ``Hv x Dv`` floats the records take beyond the state (rounded up)."""
        end = self.decay + _pad4(self.num_v_heads * self.max_verify_tokens)
        row = self.num_v_heads * self.head_v_dim
        return -(-(end - self.num_v_heads * self.head_k_dim * self.head_v_dim) // row)

    @property
    def state_size(self) -> int:
        """The runtime's ``state_size``: Dk + the record rows."""
        return self.head_k_dim + self.record_rows

    @property
    def floats(self) -> int:
        """The slot's size in floats (the pool's slot stride)."""
        return self.num_v_heads * self.state_size * self.head_v_dim

    @property
    def row_shape(self) -> tuple[int, int, int]:
        """A slot as the runtime allocates it: ``[Hv, Dk + E, Dv]`` float32."""
        return (self.num_v_heads, self.state_size, self.head_v_dim)

    def as_tuple(self) -> tuple[int, ...]:
        """(state, pending, delta, keys, decay, record_rows, floats): the CPU build's ``df2_gdn_slot_layout``."""
        return (self.state, self.pending, self.delta, self.keys, self.decay, self.record_rows, self.floats)


def gdn_slot_layout(num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                    max_verify_tokens: int) -> GdnSlotLayout:
    return GdnSlotLayout(int(num_k_heads), int(num_v_heads), int(head_k_dim), int(head_v_dim),
                         int(max_verify_tokens))


def layout_of_linear_attention(la: dict, tp: int, block_size: int) -> GdnSlotLayout:
    """Per-rank layout from a checkpoint's ``linear_attention`` dict (key heads duplicated below tp, as convert
    does) and the engine's block size (Kv)."""
    nk, nv = int(la["num_key_heads"]), int(la["num_value_heads"])
    return gdn_slot_layout(nk // tp if nk >= tp else 1, nv // tp, la["key_head_dim"], la["value_head_dim"],
                           block_size)


def engine_slot_layout(pre: dict) -> GdnSlotLayout:
    """The slot layout of a hybrid engine, from its ``pretrained_config`` (``linear_attention``, ``mapping.tp_size``,
    ``dflash2.block_size``), checked against the ``state_size`` it tells the runtime (when it carries one): an engine
    whose ``state_size`` is not ``Dk + record_rows`` (e.g. one built before the deferred commit, with ``Dk``) would
    have its slots indexed with another stride by the plugin, so it is refused here rather than corrupted."""
    from ..errors import ConfigError

    lay = layout_of_linear_attention(pre["linear_attention"], int(pre["mapping"]["tp_size"]),
                                     int(pre["dflash2"]["block_size"]))
    if "state_size" in pre and int(pre["state_size"]) != lay.state_size:
        raise ConfigError(f"state_size {pre['state_size']} but the Gated DeltaNet plugin's slot needs "
                          f"{lay.state_size} (key dim {lay.head_k_dim} + {lay.record_rows} rows of deferred-commit "
                          f"records at block size {lay.max_verify_tokens}); rebuild the engine with this version "
                          f"(docs/hybrid-runtime.md §5)", field="pretrained_config.state_size")
    return lay
