"""CPU stand-in for the ``tensorrt_llm.layers`` the network uses (TensorRT-LLM 1.2).

NOT TensorRT-LLM. Constructor arguments follow ``tensorrt_llm/layers/{embedding,linear,
normalization}.py``. Tensor parallelism as TensorRT-LLM shards it:

- ``ColumnLinear``: each rank holds ``out/tp`` rows of the weight; ``gather_output`` concatenates
  the ranks' outputs on the last dim (``allgather``).
- ``RowLinear``: each rank holds ``in/tp`` columns; partial products are summed (``allreduce``).
- ``Embedding``: ``sharding_dim 0`` = vocab-parallel (``functional.embedding``).
- ``RmsNorm``: replicated; fp32 normalisation.
"""

from __future__ import annotations

from . import functional as F
from .module import Module, Parameter


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, dtype="float32", tp_size: int = 1,
                 tp_group=None, sharding_dim: int = 0, tp_rank: int = 0):
        super().__init__()
        rows = num_embeddings // tp_size if sharding_dim == 0 else num_embeddings
        cols = embedding_dim // tp_size if sharding_dim == 1 else embedding_dim
        self.tp_size, self.tp_group, self.sharding_dim, self.tp_rank = tp_size, tp_group, sharding_dim, tp_rank
        self.weight = Parameter(shape=(rows, cols), dtype=dtype)

    def forward(self, x):
        return F.embedding(x, self.weight.value, self.tp_size, self.tp_group, self.sharding_dim, self.tp_rank)


class ColumnLinear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype="float32",
                 tp_group=None, tp_size: int = 1, gather_output: bool = True):
        super().__init__()
        if bias:
            raise NotImplementedError("ColumnLinear stand-in: bias is not used by the network")
        if out_features % tp_size:
            raise ValueError(f"ColumnLinear: out_features {out_features} not divisible by tp {tp_size}")
        self.tp_group, self.tp_size, self.gather_output = tp_group, tp_size, gather_output
        self.weight = Parameter(shape=(out_features // tp_size, in_features), dtype=dtype)

    def forward(self, x):
        y = F.matmul(x, self.weight.value, transb=True)
        if self.gather_output and self.tp_size > 1:
            y = F.allgather(y, self.tp_group, gather_dim=y.dim() - 1)
        return y


class RowLinear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype="float32",
                 tp_group=None, tp_size: int = 1):
        super().__init__()
        if bias:
            raise NotImplementedError("RowLinear stand-in: bias is not used by the network")
        if in_features % tp_size:
            raise ValueError(f"RowLinear: in_features {in_features} not divisible by tp {tp_size}")
        self.tp_group, self.tp_size = tp_group, tp_size
        self.weight = Parameter(shape=(out_features, in_features // tp_size), dtype=dtype)

    def forward(self, x):
        y = F.matmul(x, self.weight.value, transb=True)
        if self.tp_size > 1:
            y = F.allreduce(y, self.tp_group)
        return y


Linear = ColumnLinear


class RmsNorm(Module):
    def __init__(self, normalized_shape: int, eps: float = 1e-6, elementwise_affine: bool = True, dtype="float32"):
        super().__init__()
        self.normalized_shape, self.eps = int(normalized_shape), eps
        self.weight = Parameter(shape=(self.normalized_shape,), dtype=dtype) if elementwise_affine else None

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, None if self.weight is None else self.weight.value, self.eps)
