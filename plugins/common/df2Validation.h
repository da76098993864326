/*
 * What the three plugins' validation code (the <p>Params.cpp files) and their CPU builds'
 * C ABIs (<p>Cpu.cpp) share: the message every rejection writes, the "dim not known yet" rule,
 * the per-input dtype/rank and per-dim agreement checks, and the attribute and descriptor arrays
 * of the C ABI. Host code only: TensorRT-free and
 * never included by a .cu file. Each plugin keeps its own rules (ranges, which dims must agree,
 * derived params) in its own Params.cpp.
 */
#pragma once

#include "df2Common.h"

#include <cstdarg>
#include <cstdio>

namespace dflash2
{

//! The rejection of one plugin:  constexpr ParamFail fail{"DFlash2X"};  then
//! return fail(msg, msgLen, "kernel_size=%d outside [1, %d]", k, kMax);  writes
//! "DFlash2X: kernel_size=... outside [1, 4]" into msg (NUL-terminated when msgLen > 0; nothing is
//! written when msg is null) and returns Status::kINVALID. g++ checks every call's arguments against
//! its format (the attribute counts the object as argument 1).
struct ParamFail
{
    char const* plugin;

    __attribute__((format(printf, 4, 5))) Status operator()(char* msg, size_t msgLen, char const* fmt, ...) const
    {
        if (msg != nullptr && msgLen > 0)
        {
            int n = std::snprintf(msg, msgLen, "%s: ", plugin);
            if (n < 0 || static_cast<size_t>(n) >= msgLen)
                n = 0;
            va_list args;
            va_start(args, fmt);
            std::vsnprintf(msg + n, msgLen - n, fmt, args);
            va_end(args);
        }
        return Status::kINVALID;
    }
};

//! An accepted call leaves an empty message.
inline void clearMessage(char* msg, size_t msgLen)
{
    if (msg != nullptr && msgLen > 0)
        msg[0] = '\0';
}

//! A dim of -1 is not known yet (TensorRT build time with dynamic shapes): checks on it are skipped.
inline bool known(int64_t d)
{
    return d >= 0;
}

//! The activation dtypes every plugin accepts: float32, float16, bfloat16.
inline bool isFloatType(DType t)
{
    return t == DType::kFLOAT32 || t == DType::kFLOAT16 || t == DType::kBFLOAT16;
}

//! Every input's dtype and rank against the plugin's tables, in input order; the first mismatch
//! is "input <i> (<name>) has dtype <got>, expected <want>" or "... must have <n> dims, got <m>".
inline Status checkTypesAndRanks(ParamFail const& fail, TensorDesc const* in, int32_t nbInputs,
    char const* const* names, DType const* types, int32_t const* ranks, char* msg, size_t msgLen)
{
    for (int32_t i = 0; i < nbInputs; ++i)
    {
        if (in[i].type != types[i])
            return fail(msg, msgLen, "input %d (%s) has dtype %s, expected %s", i, names[i], dtypeName(in[i].type),
                dtypeName(types[i]));
        if (in[i].nbDims != ranks[i])
            return fail(msg, msgLen, "input %d (%s) must have %d dims, got %d", i, names[i], ranks[i], in[i].nbDims);
    }
    return Status::kOK;
}

//! One expected dim: input, dim index, value (-1 = unknown, skipped), what the value stands for.
struct DimRule
{
    int32_t input;
    int32_t dim;
    int64_t value;
    char const* what;
};

//! The rules in order; the first known dim that differs from its known value is
//! "input <i> (<name>) dim <d> is <got> but <what>=<value>".
inline Status checkDims(ParamFail const& fail, TensorDesc const* in, char const* const* names, DimRule const* rules,
    int32_t nbRules, char* msg, size_t msgLen)
{
    for (int32_t k = 0; k < nbRules; ++k)
    {
        DimRule const& r = rules[k];
        int64_t const got = in[r.input].dims[r.dim];
        if (known(got) && known(r.value) && got != r.value)
            return fail(msg, msgLen, "input %d (%s) dim %d is %lld but %s=%lld", r.input, names[r.input], r.dim,
                static_cast<long long>(got), r.what, static_cast<long long>(r.value));
    }
    return Status::kOK;
}

template <size_t N>
Status checkDims(ParamFail const& fail, TensorDesc const* in, char const* const* names, DimRule const (&rules)[N],
    char* msg, size_t msgLen)
{
    return checkDims(fail, in, names, rules, static_cast<int32_t>(N), msg, msgLen);
}

//! The CPU builds' C ABI passes the attributes as int32 values in the table's order.
template <typename Attrs, size_t N>
Attrs attrsFromValues(Int32AttrField<Attrs> const (&fields)[N], int32_t const* values)
{
    Attrs a;
    for (size_t i = 0; i < N; ++i)
        a.*fields[i].member = values[i];
    return a;
}

//! The CPU builds' C ABI passes the input descriptors as arrays: dtype codes, ranks, and 8 dim
//! slots per input. Fills out[0, nbInputs), or rejects a count outside [0, N] with "nbInputs=<n>".
template <size_t N>
Status descsFromArrays(ParamFail const& fail, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, TensorDesc (&out)[N], char* msg, size_t msgLen)
{
    if (nbInputs < 0 || static_cast<size_t>(nbInputs) > N)
        return fail(msg, msgLen, "nbInputs=%d", nbInputs);
    for (int32_t i = 0; i < nbInputs; ++i)
    {
        out[i].type = static_cast<DType>(dtypes[i]);
        out[i].nbDims = nbDims[i];
        for (int32_t d = 0; d < 8; ++d)
            out[i].dims[d] = dims[i * 8 + d];
    }
    return Status::kOK;
}

} // namespace dflash2
