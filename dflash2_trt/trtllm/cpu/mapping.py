"""CPU stand-in for ``tensorrt_llm.Mapping`` (TensorRT-LLM 1.2; tensor parallelism only, pp = 1)."""

from __future__ import annotations


class Mapping:
    def __init__(self, world_size: int = 1, rank: int = 0, gpus_per_node: int = 8, tp_size: int = 1,
                 pp_size: int = 1, **unused):
        if pp_size != 1 or world_size != tp_size:
            raise NotImplementedError("Mapping stand-in: tensor parallelism only (pp_size 1, world = tp)")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of {world_size}")
        self.world_size, self.rank, self.tp_size, self.pp_size = world_size, rank, tp_size, pp_size
        self.gpus_per_node = gpus_per_node

    @property
    def tp_rank(self) -> int:
        return self.rank

    @property
    def tp_group(self) -> list[int]:
        return list(range(self.tp_size))

    def is_first_pp_rank(self) -> bool:
        return True

    def is_last_pp_rank(self) -> bool:
        return True
