// Host emulation of the plugin kernels' bodies (tests/plugins/test_plugin_kernel_emulation.py).
//
// The CUDA kernels of the dynamic conv and the pairwise scan are thin wrappers around
// __host__ __device__ bodies (*KernelBody.h). This program runs those bodies on the CPU over every
// thread of every block of a launch, with the launch plans the launchers use, and compares the
// results bit for bit with the CPU builds (the plugins' reference). It checks the kernels'
// indexing, strips, tails, block-boundary rule, rounds, cluster ranks and shared-memory layout
// without a GPU; the arithmetic is the shared *Math.h's on both sides. Compiled with g++
// -ffp-contract=off. Prints one line per failing case and "N case(s), M failure(s)" at the end.
#include "dynamicConvPlugin/dynamicConvKernelBody.h"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace dflash2;

namespace
{

int gCases = 0;
int gFailures = 0;

void fail(std::string const& what)
{
    ++gFailures;
    std::printf("FAIL %s\n", what.c_str());
}

//! 16-byte aligned buffer of n elements (the kernels use 16-byte vector accesses).
template <class E>
struct Buf
{
    std::vector<unsigned char> bytes;
    E* ptr{nullptr};
    explicit Buf(size_t n)
        : bytes(n * sizeof(E) + 16)
    {
        auto const addr = reinterpret_cast<uintptr_t>(bytes.data());
        ptr = reinterpret_cast<E*>((addr + 15) & ~static_cast<uintptr_t>(15));
    }
};

//! A random value with some signed zeros, and (rarely) values that make inf * 0 and -0 + +0
//! differ, so a kernel that zeroed a skipped tap instead of skipping it would show.
float randomValue(std::mt19937& rng, float scale)
{
    std::uniform_int_distribution<int> pick(0, 99);
    int const k = pick(rng);
    if (k < 6)
        return -0.0f;
    if (k < 10)
        return 0.0f;
    std::normal_distribution<float> nd(0.0f, scale);
    return nd(rng);
}

// ---------------------------------------------------------------------------------------------
// DFlash2DynamicConv
// ---------------------------------------------------------------------------------------------
template <class T, bool kFuse, int kTaps, int kTok>
void emulateConv(DynamicConvParams const& p, typename T::Storage const* x, typename T::Storage const* d,
    typename T::Storage const* b, float const* res, void* out)
{
    constexpr int N = 16 / static_cast<int>(sizeof(typename T::Storage));
    DynamicConvShape const sh = dynamicConvShape(p, N, kTok);
    for (int32_t strip = 0; strip < sh.strips; ++strip)
        for (int32_t cv = 0; cv < sh.vecPerRow; ++cv)
            dynamicConvStrip<T, kFuse, kTaps, kTok>(x, d, b, res, out, sh, cv, strip);
}

template <class T>
void convCase(std::mt19937& rng, int32_t bs, int32_t K, int32_t G, int32_t H, int32_t nBlocks, bool fuse)
{
    using S = typename T::Storage;
    constexpr int N = 16 / static_cast<int>(sizeof(S));
    DynamicConvParams p;
    p.attrs.blockSize = bs;
    p.attrs.kernelSize = K;
    p.attrs.groupSize = G;
    p.attrs.fuseResidual = fuse ? 1 : 0;
    p.tokens = static_cast<int64_t>(nBlocks) * bs;
    p.hidden = H;
    p.groups = H / G;
    int64_t const T_ = p.tokens;
    Buf<S> x(T_ * H), d(T_ * K * (H / G)), b(static_cast<size_t>(K) * H);
    Buf<float> res(T_ * H);
    for (int64_t i = 0; i < T_ * H; ++i)
    {
        x.ptr[i] = T::store(randomValue(rng, 1.0f));
        res.ptr[i] = randomValue(rng, 1.0f);
    }
    for (int64_t i = 0; i < T_ * K * (H / G); ++i)
        d.ptr[i] = T::store(randomValue(rng, 0.3f));
    for (int64_t i = 0; i < static_cast<int64_t>(K) * H; ++i)
        b.ptr[i] = T::store(randomValue(rng, 1.0f));

    // the CPU build's computation (dynamicConvCpu.cpp runTyped)
    size_t const outBytes = static_cast<size_t>(T_ * H) * (fuse ? 4 : sizeof(S));
    std::vector<unsigned char> want(outBytes);
    for (int64_t t = 0; t < T_; ++t)
        for (int64_t c = 0; c < H; ++c)
        {
            float const y = dynamicConvElement<T>(x.ptr, d.ptr, b.ptr, t, c, H, p.groups, K, G, bs);
            int64_t const o = t * H + c;
            if (fuse)
                reinterpret_cast<float*>(want.data())[o] = convResidual(res.ptr[o], y);
            else
                reinterpret_cast<S*>(want.data())[o] = T::store(y);
        }

    auto run = [&](char const* path, auto emulate) {
        ++gCases;
        Buf<unsigned char> got(outBytes);
        std::memset(got.ptr, 0xA5, outBytes); // every element must be written
        emulate(got.ptr);
        if (std::memcmp(got.ptr, want.data(), outBytes) != 0)
        {
            char buf[200];
            std::snprintf(buf, sizeof(buf), "conv %s dtype=%d bs=%d K=%d G=%d H=%d blocks=%d fused=%d", path,
                static_cast<int>(T::kType), bs, K, G, H, nBlocks, fuse ? 1 : 0);
            fail(buf);
        }
    };
    // The generic path handles every shape; the fixed path where the launcher would take it.
    run("generic", [&](void* o) {
        if (fuse)
            emulateConv<T, true, 0, kConvTokGeneric>(p, x.ptr, d.ptr, b.ptr, res.ptr, o);
        else
            emulateConv<T, false, 0, kConvTokGeneric>(p, x.ptr, d.ptr, b.ptr, res.ptr, o);
    });
    if (dynamicConvFixedPath(p, N))
        run("fixed", [&](void* o) {
            if (fuse)
                emulateConv<T, true, 2, kConvTokFixedFused>(p, x.ptr, d.ptr, b.ptr, res.ptr, o);
            else
                emulateConv<T, false, 2, kConvTokFixed>(p, x.ptr, d.ptr, b.ptr, res.ptr, o);
        });
}

int fixedCases = 0;

template <class T>
void convSuite(std::mt19937& rng)
{
    constexpr int N = 16 / static_cast<int>(sizeof(typename T::Storage));
    int32_t const blockSizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24, 32, 64};
    int32_t const hiddens[] = {8, 24, 48, 64, 136, 1024};
    int32_t const groupSizes[] = {1, 2, 3, 4, 8, 16};
    for (int32_t bs : blockSizes)
        for (int32_t K = 1; K <= 4 && K <= bs; ++K)
            for (int32_t H : hiddens)
                for (int32_t G : groupSizes)
                {
                    if (H % G != 0)
                        continue;
                    int32_t const nBlocks = 1 + static_cast<int32_t>(rng() % 3);
                    for (bool fuse : {false, true})
                    {
                        DynamicConvParams p;
                        p.attrs = DynamicConvAttrs{bs, K, G, fuse ? 1 : 0};
                        p.tokens = static_cast<int64_t>(nBlocks) * bs;
                        fixedCases += dynamicConvFixedPath(p, N) ? 1 : 0;
                        convCase<T>(rng, bs, K, G, H, nBlocks, fuse);
                    }
                }
    // the published shape at a small token count
    convCase<T>(rng, 16, 2, 16, 5120, 3, false);
    convCase<T>(rng, 16, 2, 16, 5120, 3, true);
}

} // namespace

int main(int argc, char** argv)
{
    std::string const which = argc > 1 ? argv[1] : "all";
    std::mt19937 rng(20260530u);
    if (which == "all" || which == "conv")
    {
        convSuite<F32>(rng);
        convSuite<F16>(rng);
        convSuite<BF16>(rng);
        std::printf("conv: %d shapes took the fixed (K 2) path\n", fixedCases);
    }
    std::printf("%d case(s), %d failure(s)\n", gCases, gFailures);
    return gFailures == 0 && gCases > 0 ? 0 : 1;
}
