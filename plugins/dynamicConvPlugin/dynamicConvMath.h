/*
 * DFlash2DynamicConv: per-element math shared by the CUDA kernel and the CPU build.
 *
 *   coef[t, j, c] = base[j, c] + delta[t, j, c / G]                       (fp32)
 *   y[t, c]       = sum_{j < K, (t mod block) >= j} coef[t, j, c] * x[t - j, c]
 *                   accumulated in fp32 in the order j = 0, 1, ..., K-1
 *   out[t, c]     = round_to_dtype(y)            or, fused:  residual[t, c] + y  (fp32)
 *
 * Silent failure modes named here because nothing would crash:
 *   - a tap that crosses a block boundary (tokens are whole blocks laid end to end; position 0 of
 *     every block reads zero padding) only degrades acceptance;
 *   - reading delta as [T, H/G, K] instead of [T, K, H/G] mixes taps and groups;
 *   - group g must cover the contiguous channels [g*G, (g+1)*G), not a strided set.
 */
#pragma once

#include "../common/df2Common.h"

namespace dflash2
{

DF2_HD float convCoefficient(float base, float delta)
{
    return addRn(base, delta);
}

//! Tap j reads position (t - j); it exists only when it stays inside t's block.
DF2_HD bool convTapInBlock(int32_t posInBlock, int32_t tap)
{
    return posInBlock >= tap;
}

//! First tap (j = 0, always inside the block): the accumulator starts as coef * x.
DF2_HD float convFirstTap(float coef, float x)
{
    return mulRn(coef, x);
}

DF2_HD float convNextTap(float acc, float coef, float x)
{
    return addRn(acc, mulRn(coef, x));
}

DF2_HD float convResidual(float residual, float y)
{
    return addRn(residual, y);
}

//! y[t, c] in fp32 from raw storage (the CPU build's element function; the CUDA kernel uses the
//! same primitives in the same order on 16-byte vectors).
template <class T>
DF2_HD float dynamicConvElement(typename T::Storage const* x, typename T::Storage const* delta,
    typename T::Storage const* base, int64_t t, int64_t c, int64_t hidden, int64_t groups, int32_t kernelSize,
    int32_t groupSize, int32_t blockSize)
{
    int32_t const pos = static_cast<int32_t>(t % blockSize);
    int64_t const g = c / groupSize;
    float acc = 0.0f;
    for (int32_t j = 0; j < kernelSize; ++j)
    {
        if (!convTapInBlock(pos, j))
            break;
        float const coef = convCoefficient(T::load(base[j * hidden + c]), T::load(delta[(t * kernelSize + j) * groups + g]));
        float const xv = T::load(x[(t - j) * hidden + c]);
        acc = (j == 0) ? convFirstTap(coef, xv) : convNextTap(acc, coef, xv);
    }
    return acc;
}

} // namespace dflash2
