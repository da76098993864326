"""The CPU runtime: KV block manager, in-flight batching scheduler and EAGLE bookkeeping for CPU engines."""

from .kv_cache import BlockManager, OutOfBlocks
from .runtime import Request, Runtime

__all__ = ["BlockManager", "OutOfBlocks", "Request", "Runtime"]
