/*
 * dflash2 plugins: definitions shared by the CUDA kernels, the CPU build of the math and the
 * TensorRT glue. Nothing here includes TensorRT; CUDA headers are used only under nvcc.
 *
 * Floating-point contract: every kernel's arithmetic goes through mulRn/addRn/divRn/fmaRn, which
 * are IEEE single operations with round-to-nearest-even; a multiply-add is fused only where the
 * math says fmaRn (explicitly, identically on both sides), never by the compiler. nvcc would
 * otherwise contract a*b+c into an FMA, which changes the last bit and makes the GPU results
 * differ from the CPU build (the tests would then compare against a number the GPU never
 * computes). The CPU build must be compiled with -ffp-contract=off for the same reason (GCC
 * contracts by default in GNU mode when the target has FMA, e.g. -march=native).
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define DF2_HD __host__ __device__ __forceinline__
#else
#define DF2_HD inline
#endif

namespace dflash2
{

//! Element types the plugins understand (independent of nvinfer1::DataType on purpose: the
//! kernels and their tests must build without TensorRT).
enum class DType : int32_t
{
    kFLOAT32 = 0,
    kFLOAT16 = 1,
    kBFLOAT16 = 2,
    kINT32 = 3,
    kINT64 = 4, //!< pointer-valued host tensors (state pool addresses)
};

inline char const* dtypeName(DType t)
{
    switch (t)
    {
    case DType::kFLOAT32: return "float32";
    case DType::kFLOAT16: return "float16";
    case DType::kBFLOAT16: return "bfloat16";
    case DType::kINT32: return "int32";
    case DType::kINT64: return "int64";
    }
    return "unknown";
}

inline size_t dtypeSize(DType t)
{
    if (t == DType::kINT64)
        return 8;
    return (t == DType::kFLOAT16 || t == DType::kBFLOAT16) ? 2 : 4;
}

//! Shape/dtype of one tensor as seen by a validation function. A dim of -1 means "not known
//! yet" (TensorRT build time with dynamic shapes): checks that need it are skipped.
struct TensorDesc
{
    DType type{DType::kFLOAT32};
    int32_t nbDims{0};
    int64_t dims[8]{};
};

// ---------------------------------------------------------------------------------------------
// Rounding-exact scalar arithmetic (see the file comment).
// ---------------------------------------------------------------------------------------------
DF2_HD float mulRn(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

DF2_HD float addRn(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

DF2_HD float subRn(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

//! Fused a*b+c with a single rounding: __fmaf_rn on the GPU, std::fmaf (correctly rounded by
//! IEEE 754 / C99, in software where the CPU has no FMA) on the host: bit-identical.
DF2_HD float fmaRn(float a, float b, float c)
{
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return std::fmaf(a, b, c);
#endif
}

DF2_HD float divRn(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

DF2_HD uint32_t floatBits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
#endif
}

DF2_HD float bitsFloat(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

//! exp(x) evaluated with mulRn/addRn only, so the CPU build and the GPU agree bit for bit
//! (CUDA's expf and glibc's expf differ in the last ulp). Relative error < 2 ulp over the
//! range used by softmax (x <= 0). Returns 0 below about -103 and +inf above about 88.7.
DF2_HD float expRn(float x)
{
    if (x != x)
        return x; // NaN propagates
    if (x < -103.97f)
        return 0.0f;
    if (x > 88.72f)
        return bitsFloat(0x7f800000u);
    // x = n*ln2 + r, |r| <= ln2/2; ln2 split in a high part exact in 16 bits and a low part.
    float const kLog2e = 1.44269504088896341f;
    float const kLn2Hi = 0.693145751953125f;
    float const kLn2Lo = 1.42860682030941723212e-6f;
    float t = mulRn(x, kLog2e);
    float nf = (t >= 0.0f) ? static_cast<float>(static_cast<int32_t>(addRn(t, 0.5f)))
                           : -static_cast<float>(static_cast<int32_t>(addRn(-t, 0.5f)));
    float r = subRn(subRn(x, mulRn(nf, kLn2Hi)), mulRn(nf, kLn2Lo));
    // exp(r) by a degree-7 Taylor/Horner polynomial (|r| <= 0.3466: truncation < 1e-9 relative).
    float p = 1.98412698e-4f;        // 1/5040
    p = addRn(mulRn(p, r), 1.38888889e-3f); // 1/720
    p = addRn(mulRn(p, r), 8.33333333e-3f); // 1/120
    p = addRn(mulRn(p, r), 4.16666667e-2f); // 1/24
    p = addRn(mulRn(p, r), 1.66666667e-1f); // 1/6
    p = addRn(mulRn(p, r), 0.5f);
    p = addRn(mulRn(p, r), 1.0f);
    p = addRn(mulRn(p, r), 1.0f);
    // scale by 2^n in two steps so that subnormal results are produced correctly.
    int32_t n = static_cast<int32_t>(nf);
    int32_t n1 = n / 2;
    int32_t n2 = n - n1;
    float s1 = bitsFloat(static_cast<uint32_t>(n1 + 127) << 23);
    float s2 = bitsFloat(static_cast<uint32_t>(n2 + 127) << 23);
    return mulRn(mulRn(p, s1), s2);
}

// ---------------------------------------------------------------------------------------------
// Storage types. 16-bit values are carried as raw uint16_t bits so that the CPU build needs no
// CUDA headers; conversions round to nearest even on both sides (bit-identical).
// ---------------------------------------------------------------------------------------------
DF2_HD float halfBitsToFloat(uint16_t h)
{
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0)
    {
        if (man == 0)
        {
            bits = sign;
        }
        else
        { // subnormal half: normalise
            int32_t e = -1;
            do
            {
                ++e;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    }
    else if (exp == 0x1f)
    {
        bits = sign | 0x7f800000u | (man << 13);
    }
    else
    {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return bitsFloat(bits);
#endif
}

DF2_HD uint16_t floatToHalfBits(float f)
{
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(f));
#else
    uint32_t x = floatBits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) // inf or NaN
        return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    if (absx >= 0x477ff000u) // rounds to >= 65520: overflow to inf
        return static_cast<uint16_t>(sign | 0x7c00u);
    if (absx < 0x38800000u)
    { // result is subnormal (or zero) in half
        if (absx < 0x33000000u) // < 2^-25: rounds to zero
            return static_cast<uint16_t>(sign);
        uint32_t e = absx >> 23;
        uint32_t man = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; // 14 + (127-15) - e ... gives mantissa aligned at 2^-24
        uint32_t half = man >> (shift);
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u)))
            ++half;
        return static_cast<uint16_t>(sign | half);
    }
    uint32_t e = (absx >> 23) - 127 + 15;
    uint32_t man = absx & 0x7fffffu;
    uint32_t h = (e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        ++h; // may carry into the exponent, which is the right result (incl. to inf)
    return static_cast<uint16_t>(sign | h);
#endif
}

DF2_HD float bf16BitsToFloat(uint16_t b)
{
    return bitsFloat(static_cast<uint32_t>(b) << 16);
}

DF2_HD uint16_t floatToBf16Bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    uint32_t x = floatBits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return static_cast<uint16_t>((x >> 16) | 0x40u); // quiet NaN
    uint32_t lsb = (x >> 16) & 1u;
    return static_cast<uint16_t>((x + 0x7fffu + lsb) >> 16);
#endif
}

//! Element traits: Storage is what lives in memory, load/store convert to/from fp32.
struct F32
{
    using Storage = float;
    static constexpr DType kType = DType::kFLOAT32;
    static DF2_HD float load(Storage v) { return v; }
    static DF2_HD Storage store(float v) { return v; }
};

struct F16
{
    using Storage = uint16_t;
    static constexpr DType kType = DType::kFLOAT16;
    static DF2_HD float load(Storage v) { return halfBitsToFloat(v); }
    static DF2_HD Storage store(float v) { return floatToHalfBits(v); }
};

struct BF16
{
    using Storage = uint16_t;
    static constexpr DType kType = DType::kBFLOAT16;
    static DF2_HD float load(Storage v) { return bf16BitsToFloat(v); }
    static DF2_HD Storage store(float v) { return floatToBf16Bits(v); }
};

//! One int32 attribute: its name in the plugin's YAML spec, its member in the plugin's Attrs
//! struct, and whether createPlugin requires it (otherwise the struct's default stands). Each
//! plugin lists its attributes once, in the spec's order, in its Params.h; the creator's field
//! list, createPlugin's parsing, the serialised fields and the CPU build's attribute array all
//! read that table.
template <typename Attrs>
struct Int32AttrField
{
    using Member = int32_t Attrs::*;

    char const* name;
    Member member;
    bool required;
};

//! Status returned by validation functions and launchers: 0 = ok, otherwise a message.
enum class Status : int32_t
{
    kOK = 0,
    kINVALID = 1,     //!< inputs outside the plugin's spec (message says which)
    kCUDA_ERROR = 2,  //!< a CUDA launch failed
};

} // namespace dflash2
