"""DFlash2DynamicConv: the CPU build of the kernel's math against the torch reference.

fp32 must match exactly (same operations in the same order, no FMA); fp16/bf16 share the fp32
accumulation and a single round-to-nearest-even at the end, so they must match exactly too —
a looser tolerance would hide a wrong rounding mode or a double rounding.
"""

from __future__ import annotations

import math
import struct

import pytest
import torch

from dflash2_trt.reference.conv import dynamic_conv

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(gen, n_blocks, block_size, k, h, g, dtype):
    t = n_blocks * block_size
    x = torch.randn(t, h, generator=gen).to(dtype)
    delta = (0.3 * torch.randn(t, k, h // g, generator=gen)).to(dtype)
    base = torch.randn(k, h, generator=gen).to(dtype)
    residual = torch.randn(t, h, generator=gen)
    return x, delta, base, residual


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("block_size", list(range(2, 17)))
def test_conv_matches_reference_all_block_sizes(conv_lib, dtype, block_size):
    gen = torch.Generator().manual_seed(1000 + block_size)
    for k in sorted({1, 2, min(3, block_size), min(4, block_size)}):
        for g, h in ((1, 24), (8, 64), (16, 48)):
            x, delta, base, residual = _inputs(gen, 3, block_size, k, h, g, dtype)
            for res in (None, residual):
                got = conv_lib.run(x, delta, base, block_size=block_size, group_size=g, residual=res)
                want = dynamic_conv(x, delta, base, block_size=block_size, group_size=g, residual=res)
                assert got.dtype == want.dtype
                assert torch.equal(got, want), (
                    f"K={k} G={g} H={h} fused={res is not None}: max |diff| "
                    f"{(got.float() - want.float()).abs().max().item()}")


def test_conv_independent_loop_and_block_locality(conv_lib):
    """Against a plain per-element loop (independent of the reference), and the taps of the
    first position of every block must not see the previous block."""
    gen = torch.Generator().manual_seed(7)
    bs, k, g, h, nb = 5, 3, 4, 16, 4
    x, delta, base, _ = _inputs(gen, nb, bs, k, h, g, torch.float32)
    got = conv_lib.run(x, delta, base, block_size=bs, group_size=g)
    want = torch.zeros_like(x, dtype=torch.float64)
    for t in range(nb * bs):
        for c in range(h):
            for j in range(k):
                if t % bs >= j:
                    want[t, c] += (float(base[j, c]) + float(delta[t, j, c // g])) * float(x[t - j, c])
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # Perturb the last position of block 1: only block 1 may change.
    x2 = x.clone()
    x2[2 * bs - 1] += 10.0
    got2 = conv_lib.run(x2, delta, base, block_size=bs, group_size=g)
    changed = (got2 != got).any(dim=1).nonzero().flatten().tolist()
    assert changed == [2 * bs - 1]


def test_conv_large_hidden_packed_many_blocks(conv_lib):
    gen = torch.Generator().manual_seed(11)
    x, delta, base, residual = _inputs(gen, 9, 16, 2, 1024, 16, torch.bfloat16)
    for res in (None, residual):
        got = conv_lib.run(x, delta, base, block_size=16, group_size=16, residual=res)
        want = dynamic_conv(x, delta, base, block_size=16, group_size=16, residual=res)
        assert torch.equal(got, want)


def test_half_and_bf16_conversions_match_torch(conv_lib):
    lib = conv_lib.lib
    # every fp16 bit pattern -> float (NaNs compared as NaN)
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    ref = bits.float()
    for i in range(0, 1 << 16, 37):
        got = lib.df2_half_to_float(i)
        r = ref[i].item()
        assert (math.isnan(got) and math.isnan(r)) or got == r, f"half bits {i:#06x}"
    # float -> fp16 / bf16 rounding, including subnormals, ties, overflow and specials
    gen = torch.Generator().manual_seed(3)
    vals = torch.cat([
        torch.randn(4000, generator=gen) * torch.pow(2.0, torch.randint(-30, 18, (4000,), generator=gen).float()),
        torch.tensor([0.0, -0.0, 65504.0, 65519.0, 65520.0, -65520.0, 1e-8, 2.0 ** -24, 2.0 ** -25,
                      3 * 2.0 ** -26, 2.0 ** -14, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11,
                      float("inf"), float("-inf"), 3.0e38]),
    ])
    for v in vals.tolist():
        f32 = struct.unpack("f", struct.pack("f", v))[0]
        want_h = torch.tensor([f32]).half().view(torch.int16).item() & 0xFFFF
        want_b = torch.tensor([f32]).bfloat16().view(torch.int16).item() & 0xFFFF
        assert lib.df2_float_to_half(f32) == want_h, f"fp16 of {f32!r}"
        assert lib.df2_float_to_bf16(f32) == want_b, f"bf16 of {f32!r}"
    assert math.isnan(lib.df2_half_to_float(lib.df2_float_to_half(float("nan"))))


def test_exp_within_two_ulp(conv_lib):
    xs = torch.linspace(-100.0, 80.0, 20001).tolist() + [0.0, -1e-30, -87.5, -103.0]
    for x in xs:
        got = conv_lib.lib.df2_exp(x)
        want = math.exp(struct.unpack("f", struct.pack("f", x))[0])
        if want < 1.2e-38:  # subnormal results: absolute error of a few subnormal ulps
            assert abs(got - want) <= 4 * 1.4e-45 + want * 2.4e-7
        else:
            assert abs(got - want) <= 2.4e-7 * want, f"exp({x})={got} want {want}"


# ------------------------------------------------------------------------------- validation
def _good(k=2, bs=4, g=8, h=64, t=8, dtype=torch.float16):
    return [torch.zeros(t, h, dtype=dtype), torch.zeros(t, k, h // g, dtype=dtype), torch.zeros(k, h, dtype=dtype)]


def test_validation_accepts_good_and_unknown_dims(conv_lib):
    assert conv_lib.validate(_good(), block_size=4, kernel_size=2, group_size=8) == (0, "")
    fused = _good() + [torch.zeros(8, 64)]
    assert conv_lib.validate(fused, block_size=4, kernel_size=2, group_size=8, fuse=True) == (0, "")
    dyn = [(1, (-1, 64)), (1, (-1, 2, 8)), (1, (2, 64))]  # TensorRT build time: tokens unknown
    assert conv_lib.validate(dyn, block_size=4, kernel_size=2, group_size=8)[0] == 0


@pytest.mark.parametrize("case,kwargs,inputs,needle", [
    ("K>4", dict(kernel_size=5, block_size=8), None, "kernel_size=5 outside [1, 4]"),
    ("K>block", dict(kernel_size=4, block_size=3), None, "exceeds block_size=3"),
    ("block mismatch", dict(block_size=3), None, "tokens=8 is not a multiple of block_size=3"),
    ("group", dict(group_size=5), None, "group_size=5 does not divide H=64"),
    ("x dtype", {}, lambda: _good(dtype=torch.int32), "input 0 (x) has dtype int32"),
    ("x fp64", {}, lambda: _good(dtype=torch.float64), "input 0 (x) has dtype unknown"),
    ("delta dtype", {}, lambda: [_good()[0], _good(dtype=torch.bfloat16)[1], _good()[2]],
     "input 1 (delta) has dtype bfloat16 but x is float16"),
    ("base dtype", {}, lambda: [*_good()[:2], torch.zeros(2, 64)], "input 2 (base_kernel) has dtype float32"),
    ("H multiple", dict(group_size=1), lambda: _good(g=1, h=20), "H=20 must be a positive multiple of 8"),
    ("delta taps", {}, lambda: [_good()[0], torch.zeros(8, 3, 8, dtype=torch.float16), _good()[2]],
     "delta) dim 1 is 3 but kernel_size=2"),
    ("delta groups", {}, lambda: [_good()[0], torch.zeros(8, 2, 4, dtype=torch.float16), _good()[2]],
     "dim 2 is 4 but H/group_size = 8"),
    ("delta tokens", {}, lambda: [_good()[0], torch.zeros(4, 2, 8, dtype=torch.float16), _good()[2]],
     "delta) has 4 tokens but x has 8"),
    ("base taps", {}, lambda: [*_good()[:2], torch.zeros(3, 64, dtype=torch.float16)], "dim 0 is 3"),
    ("rank", {}, lambda: [torch.zeros(2, 4, 64, dtype=torch.float16), *_good()[1:]], "must be 2-D"),
    ("nb inputs", dict(fuse=True), None, "expected 4 inputs"),
])
def test_validation_rejects(conv_lib, case, kwargs, inputs, needle):
    attrs = dict(block_size=4, kernel_size=2, group_size=8)
    attrs.update(kwargs)
    rc, msg = conv_lib.validate(inputs() if inputs else _good(), **attrs)
    assert rc == 1, case
    assert needle in msg and msg.startswith("DFlash2DynamicConv: "), msg


def test_validation_rejects_bad_residual(conv_lib):
    base = _good()
    rc, msg = conv_lib.validate(base + [torch.zeros(8, 64, dtype=torch.float16)], block_size=4, kernel_size=2,
                                group_size=8, fuse=True)
    assert rc == 1 and "residual) has dtype float16; it must be float32" in msg
    rc, msg = conv_lib.validate(base + [torch.zeros(8, 32)], block_size=4, kernel_size=2, group_size=8, fuse=True)
    assert rc == 1 and "residual) dim 1 is 32 but x has 64" in msg


def test_run_raises_on_invalid(conv_lib):
    x, delta, base = _good(t=6)
    with pytest.raises(ValueError, match="not a multiple of block_size"):
        conv_lib.run(x, delta, base, block_size=4, group_size=8)
