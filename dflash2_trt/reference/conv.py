"""Block-local dynamic depthwise convolution of DFlash2 (the "two-tap conv").

Math (docs/architecture.md §1), for a sequence packed as consecutive blocks of ``block_size`` positions::

    coef[t, j, h] = base_kernel[j, h] + delta[t, j, h // group_size]
    y[t, h]       = sum_{j < K, (t mod block_size) >= j} coef[t, j, h] * x[t - j, h]

``j`` is the tap (0 = the position itself, 1 = its predecessor, ...). Taps never reach across a
block boundary: block position 0 reads zero padding for tap 1. ``delta`` (the content-dependent
correction) is shared by each group of ``group_size`` consecutive channels.

Silent failure modes this module guards against (none of them would crash):
- a delta laid out as [..., groups, taps] instead of [..., taps, groups] (the published
  ``kernel_projection`` output is [side, tap, group] — see :meth:`DynamicConv.prepare`);
- a convolution that lets tap 1 cross from the last position of one block into the next;
- group g covering channels {g, g + groups, ...} instead of the contiguous range
  [g*G, (g+1)*G).

All arithmetic runs in fp32 (one rounding to ``x.dtype`` at the end), which is the contract the
CUDA kernel (plugins/dynamicConvPlugin) is checked against.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["dynamic_conv", "DynamicConv"]


def _check_shapes(x: torch.Tensor, delta: torch.Tensor, base_kernel: torch.Tensor,
                  block_size: int, group_size: int) -> tuple[int, int, int]:
    if x.dim() < 2:
        raise ValueError(f"dynamic_conv: x must be [..., T, H], got shape {tuple(x.shape)}")
    t, h = x.shape[-2], x.shape[-1]
    if base_kernel.dim() != 2 or base_kernel.shape[1] != h:
        raise ValueError(
            f"dynamic_conv: base_kernel must be [K, H={h}], got {tuple(base_kernel.shape)}")
    k = base_kernel.shape[0]
    if block_size < 1 or t % block_size:
        raise ValueError(f"dynamic_conv: T={t} is not a multiple of block_size={block_size}")
    if k > block_size:
        raise ValueError(f"dynamic_conv: kernel size K={k} exceeds block_size={block_size}")
    if group_size < 1 or h % group_size:
        raise ValueError(f"dynamic_conv: group_size={group_size} does not divide H={h}")
    want = (*x.shape[:-1], k, h // group_size)
    if tuple(delta.shape) != want:
        raise ValueError(
            f"dynamic_conv: delta must be [..., T, K, H/G] = {want}, got {tuple(delta.shape)}")
    return t, h, k


def dynamic_conv(
    x: torch.Tensor,
    delta: torch.Tensor,
    base_kernel: torch.Tensor,
    *,
    block_size: int,
    group_size: int,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply the block-local dynamic convolution.

    Args:
        x: ``[..., T, H]``, ``T`` a multiple of ``block_size`` (several packed blocks allowed).
        delta: ``[..., T, K, H/G]`` per-position, per-tap, per-group kernel corrections.
        base_kernel: ``[K, H]`` learned base kernel of ONE side (pre or post).
        block_size: positions per block; taps never cross block boundaries.
        group_size: channels sharing one delta value (``G``).
        residual: optional ``[..., T, H]``; when given, returns ``residual.float() + y`` in fp32
            (the fused "finish + residual add" form).

    Returns:
        ``y`` in ``x.dtype`` (one rounding from fp32), or fp32 ``residual + y``.
    """
    t, h, k = _check_shapes(x, delta, base_kernel, block_size, group_size)
    xf = x.float()
    # [..., T, K, H]: expand each group's delta over its G contiguous channels.
    coef = base_kernel.float() + delta.float().repeat_interleave(group_size, dim=-1)
    y = coef[..., 0, :] * xf
    if k > 1:
        lead = x.shape[:-2]
        nb = t // block_size
        xb = xf.reshape(*lead, nb, block_size, h)
        cb = coef.reshape(*lead, nb, block_size, k, h)
        yb = y.reshape(*lead, nb, block_size, h).clone()
        for j in range(1, k):
            # Position s >= j of each block reads position s - j of the SAME block; positions
            # s < j read zero padding (no term added).
            yb[..., j:, :] += cb[..., j:, j, :] * xb[..., : block_size - j, :]
        y = yb.reshape(*lead, t, h)
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(
                f"dynamic_conv: residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
        return residual.float() + y
    return y.to(x.dtype)


class DynamicConv(nn.Module):
    """One DFlash2 conv wrapper around a sublayer (``attention_conv`` or ``mlp_conv``).

    Parameters (published names, docs/architecture.md §2):
        base_kernel: ``[2, K, H]`` — side 0 = before the sublayer, side 1 = after it.
        kernel_projection: ``Linear(H, 2*K*H/G, bias=False)``; its output is read as
            ``[2 (side), K (tap), H/G (group)]``. Both sides' corrections come from the SAME
            normed sublayer input — the post-sublayer conv does NOT project the sublayer output.
    """

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int, block_size: int):
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"conv_group_size={group_size} does not divide hidden_size={hidden_size}")
        self.hidden_size = hidden_size
        self.kernel_size = kernel_size
        self.group_size = group_size
        self.block_size = block_size
        self.num_groups = hidden_size // group_size
        base = torch.zeros(2, kernel_size, hidden_size)
        base[:, 0] = 1.0  # identity until loaded
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.num_groups, bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def deltas(self, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(pre delta, post delta), each ``[..., T, K, H/G]``, from the normed sublayer input."""
        d = self.kernel_projection(normed).reshape(
            *normed.shape[:-1], 2, self.kernel_size, self.num_groups)
        return d[..., 0, :, :], d[..., 1, :, :]

    def prepare(self, normed: torch.Tensor, block_size: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-sublayer conv. Returns (convolved input, post-side delta for :meth:`finish`)."""
        pre, post = self.deltas(normed)
        y = dynamic_conv(normed, pre, self.base_kernel[0], block_size=block_size or self.block_size,
                         group_size=self.group_size)
        return y, post

    def finish(self, sub_out: torch.Tensor, post_delta: torch.Tensor,
               block_size: int | None = None) -> torch.Tensor:
        """Post-sublayer conv with the delta computed by :meth:`prepare`."""
        return dynamic_conv(sub_out, post_delta, self.base_kernel[1],
                            block_size=block_size or self.block_size, group_size=self.group_size)
