"""Dynamic conv vs a naive per-position loop (independent indexing, no reshapes)."""

import pytest
import torch

from dflash2_trt.reference.conv import DynamicConv, dynamic_conv


def naive_conv(x, delta, base, block_size, group_size):
    *lead, t, h = x.shape
    k = base.shape[0]
    base = base.detach()
    xf = x.detach().double().reshape(-1, t, h)
    df = delta.detach().double().reshape(-1, t, k, h // group_size)
    out = torch.zeros_like(xf)
    for n in range(xf.shape[0]):
        for pos in range(t):
            s = pos % block_size
            for ch in range(h):
                acc = 0.0
                for j in range(k):
                    if s - j < 0:
                        continue  # zero padding at the block start
                    c = float(base[j, ch]) + float(df[n, pos, j, ch // group_size])
                    acc += c * float(xf[n, pos - j, ch])
                out[n, pos, ch] = acc
    return out.reshape(*lead, t, h)


@pytest.mark.parametrize("block_size,nblocks,k,h,g", [(4, 3, 2, 8, 4), (8, 1, 2, 16, 16),
                                                       (5, 2, 3, 6, 2), (16, 2, 2, 4, 1)])
def test_matches_naive_loop(block_size, nblocks, k, h, g):
    gen = torch.Generator().manual_seed(block_size * 100 + k)
    t = block_size * nblocks
    x = torch.randn(2, t, h, generator=gen)
    delta = torch.randn(2, t, k, h // g, generator=gen)
    base = torch.randn(k, h, generator=gen)
    got = dynamic_conv(x, delta, base, block_size=block_size, group_size=g)
    want = naive_conv(x, delta, base, block_size, g)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # residual form returns fp32 residual + y
    r = torch.randn(2, t, h, generator=gen)
    got_r = dynamic_conv(x, delta, base, block_size=block_size, group_size=g, residual=r)
    assert got_r.dtype == torch.float32
    torch.testing.assert_close(got_r.double(), want + r.double(), rtol=1e-5, atol=1e-5)


def test_block_boundary_is_not_crossed():
    # With base tap 1 = 1 and tap 0 = 0, y[t] = x[t-1] inside a block and 0 at block starts.
    x = torch.arange(1, 13, dtype=torch.float32).reshape(1, 12, 1)
    base = torch.tensor([[0.0], [1.0]])
    delta = torch.zeros(1, 12, 2, 1)
    y = dynamic_conv(x, delta, base, block_size=4, group_size=1)
    assert y.flatten().tolist() == [0, 1, 2, 3, 0, 5, 6, 7, 0, 9, 10, 11]


def test_bf16_output_dtype_and_fp32_accumulation():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 8, 32, generator=gen).bfloat16()
    delta = torch.randn(1, 8, 2, 2, generator=gen).bfloat16()
    base = torch.randn(2, 32, generator=gen).bfloat16()
    y = dynamic_conv(x, delta, base, block_size=8, group_size=16)
    assert y.dtype == torch.bfloat16
    want = naive_conv(x.float(), delta.float(), base.float(), 8, 16)
    torch.testing.assert_close(y.double(), want, rtol=1e-2, atol=1e-2)


def test_module_prepare_finish_layout():
    """kernel_projection output is [side, tap, group]: check against explicit index math."""
    gen = torch.Generator().manual_seed(1)
    h, k, g, bs = 8, 2, 4, 4
    m = DynamicConv(h, k, g, bs)
    with torch.no_grad():
        m.base_kernel.copy_(torch.randn(2, k, h, generator=gen))
        m.kernel_projection.weight.copy_(torch.randn(2 * k * (h // g), h, generator=gen))
    x = torch.randn(1, 8, h, generator=gen)
    sub = torch.randn(1, 8, h, generator=gen)
    proj = x @ m.kernel_projection.weight.T            # [1, 8, 2*K*H/G]
    ng = h // g
    pre_d = torch.stack([proj[..., (0 * k + j) * ng:(0 * k + j + 1) * ng] for j in range(k)], -2)
    post_d = torch.stack([proj[..., (1 * k + j) * ng:(1 * k + j + 1) * ng] for j in range(k)], -2)
    y, post = m.prepare(x)
    torch.testing.assert_close(y.double(), naive_conv(x, pre_d, m.base_kernel[0].detach(), bs, g),
                               rtol=1e-5, atol=1e-5)
    z = m.finish(sub, post)
    torch.testing.assert_close(z.double(), naive_conv(sub, post_d, m.base_kernel[1].detach(), bs, g),
                               rtol=1e-5, atol=1e-5)


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of block_size"):
        dynamic_conv(torch.zeros(1, 6, 4), torch.zeros(1, 6, 2, 4), torch.zeros(2, 4),
                     block_size=4, group_size=1)
    with pytest.raises(ValueError, match="delta must be"):
        dynamic_conv(torch.zeros(1, 4, 4), torch.zeros(1, 4, 4, 2), torch.zeros(2, 4),
                     block_size=4, group_size=2)
