"""Paged KV block manager of the CPU runtime (plays TensorRT-LLM's ``KVCacheManager`` for this engine).

One pool of ``num_blocks`` blocks of ``tokens_per_block`` tokens, shared by the target layers and the
drafter layers (KV layers ``num_hidden_layers + i``: each block covers every layer, as TensorRT-LLM's
primary pool does). A request owns an ordered list of blocks; its token ``t`` lives in block
``blocks[t // tokens_per_block]`` at slot ``t % tokens_per_block``. Each generation step needs
room for ``K + 1`` positions past the committed length (the EAGLE draft length TensorRT-LLM reserves
per request), so :meth:`ensure` is called with ``committed + K + 1`` before every step. Blocks are
returned when a request finishes. Block offsets are written as TensorRT-LLM's KV cache manager writes them for
the attention plugin: ``block * layers * 2 + field`` (K field 0, V field 1; ``layers`` the pool's layers, every
layer of a block in one pool row: ``trtllm/cpu/attention.py`` KVCachePool, and the facts of
``engine/trtllm/facts/tensorrt_session.yaml`` kv_pool).
"""

from __future__ import annotations

import torch

from ..errors import DFlash2Error


class OutOfBlocks(DFlash2Error):
    pass


class BlockManager:
    def __init__(self, num_blocks: int, tokens_per_block: int, layers: int = 1):
        if num_blocks < 1 or tokens_per_block < 1 or layers < 1:
            raise ValueError("num_blocks, tokens_per_block and layers must be >= 1")
        self.num_blocks, self.tokens_per_block, self.layers = num_blocks, tokens_per_block, layers
        self._free = list(range(num_blocks - 1, -1, -1))   # pop() hands out low ids first
        self.owned: dict[int, list[int]] = {}

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.tokens_per_block)

    def can_fit(self, req_id: int, tokens: int) -> bool:
        have = len(self.owned.get(req_id, ()))
        return self.blocks_for(tokens) - have <= len(self._free)

    def ensure(self, req_id: int, tokens: int) -> None:
        blocks = self.owned.setdefault(req_id, [])
        need = self.blocks_for(tokens) - len(blocks)
        if need > len(self._free):
            raise OutOfBlocks(f"KV cache full: request {req_id} needs {need} more block(s), {len(self._free)} free")
        for _ in range(need):
            blocks.append(self._free.pop())

    def free(self, req_id: int) -> None:
        for b in reversed(self.owned.pop(req_id, [])):
            self._free.append(b)

    def offsets(self, req_ids: list[int], max_blocks: int) -> torch.Tensor:
        """``kv_cache_block_offsets [1, bs, 2, max_blocks]`` int32 (unused entries 0)."""
        out = torch.zeros(1, len(req_ids), 2, max_blocks, dtype=torch.int32)
        for i, r in enumerate(req_ids):
            blocks = torch.tensor(self.owned.get(r, []), dtype=torch.int32)
            if blocks.numel() > max_blocks:
                raise OutOfBlocks(f"request {r} holds {blocks.numel()} blocks, the engine allows {max_blocks}")
            out[0, i, 0, :blocks.numel()] = blocks * (2 * self.layers)
            out[0, i, 1, :blocks.numel()] = blocks * (2 * self.layers) + 1
        return out
