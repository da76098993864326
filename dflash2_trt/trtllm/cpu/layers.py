"""CPU stand-in for the ``tensorrt_llm.layers`` the network uses (TensorRT-LLM 1.2).

NOT TensorRT-LLM. Constructor arguments follow ``tensorrt_llm/layers/{embedding,linear,
normalization}.py``. Tensor parallelism as TensorRT-LLM shards it:

Signatures and defaults are those of ``api_1_2.yaml`` (``bias=True`` by default, as in TensorRT-LLM).

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
    def __init__(self, num_embeddings: int, embedding_dim: int, dtype=None, tp_size: int = 1, tp_group=None,
                 sharding_dim: int = 0, tp_rank=None):
        super().__init__()
        if sharding_dim == 0:
            rows, cols = -(-num_embeddings // tp_size), embedding_dim
        elif sharding_dim == 1:
            rows, cols = num_embeddings, embedding_dim // tp_size
        else:
            raise ValueError(f"Embedding: sharding_dim {sharding_dim} (0 or 1)")
        self.tp_size, self.tp_group, self.sharding_dim, self.tp_rank = tp_size, tp_group, sharding_dim, tp_rank
        self.weight = Parameter(shape=(rows, cols), dtype=dtype)

    def forward(self, x):
        return F.embedding(x, self.weight.value, tp_size=self.tp_size, tp_group=self.tp_group,
                           sharding_dim=self.sharding_dim, tp_rank=self.tp_rank)


class _LinearBase(Module):
    def _init(self, local_in, local_out, bias, dtype, tp_group, tp_size, share_weight, strict_dtype, pad_lda,
              prefer_managed_weight, pad_ldc=0, is_expert=False):
        if share_weight is not None or strict_dtype or pad_lda or pad_ldc or is_expert:
            raise NotImplementedError("Linear stand-in: share_weight / strict_dtype / pad_lda / pad_ldc / is_expert "
                                      "are not used by the network")
        self.tp_group, self.tp_size = tp_group, tp_size
        self.weight = Parameter(shape=(local_out, local_in), dtype=dtype)
        # TensorRT-LLM's default is bias=True: a layer built without bias=False needs `<name>.bias` in the checkpoint
        self.bias = Parameter(shape=(local_out,), dtype=dtype) if bias else None

    def _matmul(self, x):
        y = F.matmul(x, self.weight.value, transb=True)
        return y


class ColumnLinear(_LinearBase):
    """``Linear`` / ``ColumnLinear``: each rank holds ``out/tp`` rows; bias added before the gather."""

    def __init__(self, in_features, out_features, bias=True, dtype=None, tp_group=None, tp_size=1,
                 gather_output=True, share_weight=None, strict_dtype=False, pad_lda=0, pad_ldc=0,
                 prefer_managed_weight=True, is_qkv=False):
        super().__init__()
        if out_features % tp_size:
            raise ValueError(f"ColumnLinear: out_features {out_features} not divisible by tp {tp_size}")
        self._init(in_features, out_features // tp_size, bias, dtype, tp_group, tp_size, share_weight, strict_dtype,
                   pad_lda, prefer_managed_weight, pad_ldc=pad_ldc)
        self.gather_output = gather_output

    def forward(self, x):
        y = self._matmul(x)
        if self.bias is not None:
            y = y + F.cast(self.bias.value, y.dtype)
        if self.gather_output and self.tp_size > 1 and self.tp_group is not None:
            y = F.allgather(y, self.tp_group, gather_dim=y.dim() - 1)
        return y


class RowLinear(_LinearBase):
    """Each rank holds ``in/tp`` columns; partial products are summed (``allreduce``), then the bias."""

    def __init__(self, in_features, out_features, bias=True, dtype=None, tp_group=None, tp_size=1,
                 strict_dtype=False, pad_lda=0, prefer_managed_weight=True, is_expert=False):
        super().__init__()
        if in_features % tp_size:
            raise ValueError(f"RowLinear: in_features {in_features} not divisible by tp {tp_size}")
        self._init(in_features // tp_size, out_features, bias, dtype, tp_group, tp_size, None, strict_dtype, pad_lda,
                   prefer_managed_weight, is_expert=is_expert)

    def forward(self, x):
        y = self._matmul(x)
        if self.tp_size > 1 and self.tp_group is not None:
            y = F.allreduce(y, self.tp_group)
        if self.bias is not None:
            y = y + F.cast(self.bias.value, y.dtype)
        return y


Linear = ColumnLinear


class RmsNorm(Module):
    def __init__(self, normalized_shape, num_groups=1, eps=1e-06, elementwise_affine=True, dtype=None):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if self.normalized_shape[-1] % num_groups != 0:
            raise ValueError("num_channels must be divisible by num_groups")
        self.eps, self.num_groups = eps, num_groups
        self.weight = Parameter(shape=self.normalized_shape, dtype=dtype) if elementwise_affine else None

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.num_groups,
                          None if self.weight is None else self.weight.value, self.eps)
