/*
 * Host emulation of the CUDA subset the plugin kernels use, so that a kernel source (.cu) compiles
 * with g++ and runs on the CPU (tests/plugins/test_plugin_gdn_emulated.py). Not a simulator of the
 * GPU's timing or memory model: it executes the kernels' own code, in their own index mapping, with
 * their barriers and warp exchanges, which is what a bit-for-bit comparison needs.
 *
 * - A block's threads are fibers (ucontext) run by one OS thread, each until it reaches a barrier
 *   or ends; blocks run in parallel on a pool of OS threads (EMU_WORKERS, default 16).
 * - __shared__ arrays become per-block arenas, filled with garbage (the test's transform rewrites
 *   each declaration into emu::shared<T[..]>(id)).
 * - __syncthreads releases when every live thread of the block waits there; a warp barrier
 *   (__syncwarp, and the two inside every shuffle / ballot) when every live thread of the warp
 *   does. A thread that ends drops out. A state where no fiber can run, or a warp barrier reached
 *   by only part of the live warp while the rest waits elsewhere, aborts (a barrier in divergent
 *   code: a bug on the GPU too). Fibers run in a fixed order until they block (first to last, or
 *   last to first with EMU_REVERSE), so a missing barrier shows up as a read of another thread's
 *   not-yet-written (or already overwritten) data when the reader runs first: the tests run both
 *   orders. A shuffle whose lane or source lane is outside its mask, or whose source lane has
 *   exited, and a ballot over a mask with an exited lane abort (undefined results on the GPU).
 * - reinterpret_cast becomes emu::checkedCast: a vector access (float4, 8/16-byte storage vectors)
 *   at a misaligned address aborts, as it would fault on the GPU.
 * - Arithmetic is the host side of df2Common.h (__CUDA_ARCH__ is not defined): the CPU build's,
 *   which is bit for bit the GPU's by construction.
 */
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <ucontext.h>
#include <vector>

struct dim3
{
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct emu_uint3
{
    unsigned x, y, z;
};
struct float4
{
    float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }

using cudaStream_t = void*;
enum cudaError_t
{
    cudaSuccess = 0
};
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline char const* cudaGetErrorString(cudaError_t) { return "no error"; }
// The device queries a launcher makes, answered for a small device (EMU_SMS multiprocessors, default 3; EMU_PER_SM
// blocks of any kernel per multiprocessor, default 2), so that a grid sized by occupancy has fewer blocks than work
// items and its blocks loop over several.
enum cudaDeviceAttr
{
    cudaDevAttrMultiProcessorCount = 16
};
enum cudaFuncAttribute
{
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8
};
inline int emuEnvInt(char const* name, int dflt)
{
    char const* e = std::getenv(name);
    return e != nullptr ? std::atoi(e) : dflt;
}
inline cudaError_t cudaGetDevice(int* dev)
{
    *dev = 0;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int)
{
    *v = emuEnvInt("EMU_SMS", 3);
    return cudaSuccess;
}
template <class F>
cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int)
{
    return cudaSuccess;
}
template <class F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, F, int, size_t)
{
    *n = emuEnvInt("EMU_PER_SM", 2);
    return cudaSuccess;
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

inline int min(int a, int b) { return a < b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }

namespace emu
{
[[noreturn]] inline void die(char const* what)
{
    std::fprintf(stderr, "emu: %s\n", what);
    std::abort();
}

enum class St
{
    kRun,
    kBlockBar,
    kWarpBar,
    kDone
};

struct Block;
struct Fiber
{
    ucontext_t uc;
    std::unique_ptr<char[]> stack;
    emu_uint3 tid;
    St st = St::kRun;
    Block* blk = nullptr;
};

struct Block
{
    emu_uint3 bid;
    dim3 bdim, gdim;
    std::vector<Fiber> fibers;
    std::vector<uint64_t> xchg; // 32 per warp
    std::map<int, std::unique_ptr<unsigned char[]>> shared;
    size_t dynBytes = 0;                           // the launch's dynamic shared memory (extern __shared__)
    std::unique_ptr<unsigned char[]> dyn;
    ucontext_t sched;
    std::function<void()> body;
};

inline thread_local Fiber* cur = nullptr;
//! Fibers of a block run from the last thread to the first: compiled with -DEMU_REVERSE=1 (=0: first
//! to last; the tests always say which, so nothing in the environment can make two builds run the
//! same order), or, in a build without the define, with the environment's EMU_REVERSE=1. In one
//! order a missing barrier shows only where the reader runs before the writer; running both orders
//! shows it whichever side of the writer the reader sits.
#ifdef EMU_REVERSE
inline bool gReverse = EMU_REVERSE != 0;
#else
inline bool gReverse = [] {
    char const* e = std::getenv("EMU_REVERSE");
    return e != nullptr && e[0] == '1';
}();
#endif
inline std::atomic<long long> gBlocks{0}, gThreads{0};
constexpr size_t kStack = 256 * 1024;

inline void yield(St s)
{
    Fiber* f = cur;
    f->st = s;
    swapcontext(&f->uc, &f->blk->sched);
}

inline void trampoline()
{
    cur->blk->body();
    cur->st = St::kDone;
    swapcontext(&cur->uc, &cur->blk->sched);
}

inline void runBlock(Block& b)
{
    int const n = static_cast<int>(b.bdim.x);
    b.fibers = std::vector<Fiber>(n);
    b.xchg.assign(n, 0);
    for (int t = 0; t < n; ++t)
    {
        Fiber& f = b.fibers[t];
        f.tid = {static_cast<unsigned>(t), 0, 0};
        f.blk = &b;
        f.stack.reset(new char[kStack]);
        getcontext(&f.uc);
        f.uc.uc_stack.ss_sp = f.stack.get();
        f.uc.uc_stack.ss_size = kStack;
        f.uc.uc_link = nullptr;
        makecontext(&f.uc, trampoline, 0);
    }
    int const warps = n / 32;
    for (;;)
    {
        bool ran = false;
        for (int i = 0; i < n; ++i)
        {
            Fiber& f = b.fibers[gReverse ? n - 1 - i : i];
            if (f.st != St::kRun)
                continue;
            cur = &f;
            swapcontext(&b.sched, &f.uc);
            cur = nullptr;
            ran = true;
        }
        if (ran)
            continue;
        // nobody runnable: release a complete barrier
        bool released = false;
        for (int w = 0; w < warps; ++w)
        {
            int live = 0, atWarp = 0;
            for (int l = 0; l < 32; ++l)
            {
                St s = b.fibers[w * 32 + l].st;
                live += s != St::kDone;
                atWarp += s == St::kWarpBar;
            }
            if (atWarp > 0)
            {
                if (atWarp != live)
                    die("warp barrier: some live lanes of the warp wait elsewhere (divergent shuffle/syncwarp)");
                for (int l = 0; l < 32; ++l)
                    if (b.fibers[w * 32 + l].st == St::kWarpBar)
                        b.fibers[w * 32 + l].st = St::kRun;
                released = true;
            }
        }
        if (released)
            continue;
        int live = 0, atBlock = 0;
        for (auto& f : b.fibers)
        {
            live += f.st != St::kDone;
            atBlock += f.st == St::kBlockBar;
        }
        if (live == 0)
            break;
        if (atBlock != live)
            die("deadlock");
        for (auto& f : b.fibers)
            if (f.st == St::kBlockBar)
                f.st = St::kRun;
    }
}

//! Per-block shared array: the declaration's id -> one zeroed buffer per block.
template <class T>
T& shared(int id)
{
    auto& slot = cur->blk->shared[id];
    if (!slot)
    {
        slot.reset(new unsigned char[sizeof(T)]);
        std::memset(slot.get(), 0x5a, sizeof(T)); // garbage, as on a GPU
    }
    return *reinterpret_cast<T*>(slot.get());
}

//! The block's dynamic shared memory (the test's transform rewrites `extern __shared__ ... name[];` into a call):
//! the launch's bytes, garbage-filled, 16-byte aligned (operator new[]'s alignment).
inline unsigned char* dynamicShared()
{
    Block* b = cur->blk;
    if (!b->dyn)
    {
        b->dyn.reset(new unsigned char[b->dynBytes > 0 ? b->dynBytes : 1]);
        std::memset(b->dyn.get(), 0x5a, b->dynBytes);
    }
    return b->dyn.get();
}

template <class T>
T shflXor(unsigned mask, T v, int off)
{
    static_assert(sizeof(T) <= 8);
    Fiber* f = cur;
    int const t = f->tid.x, w0 = t & ~31;
    int const src = (t & 31) ^ off;
    if (((mask >> (t & 31)) & 1u) == 0 || ((mask >> src) & 1u) == 0)
        die("shuffle: this lane or its source lane is not in the mask");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    f->blk->xchg[t] = bits;
    yield(St::kWarpBar);
    if (f->blk->fibers[w0 + src].st == St::kDone)
        die("shuffle: the source lane has exited (undefined on the GPU)");
    uint64_t const got = f->blk->xchg[w0 + src];
    yield(St::kWarpBar);
    T out;
    std::memcpy(&out, &got, sizeof(T));
    return out;
}

inline unsigned ballot(unsigned mask, int pred)
{
    Fiber* f = cur;
    int const t = f->tid.x, w0 = t & ~31;
    f->blk->xchg[t] = pred ? 1 : 0;
    yield(St::kWarpBar);
    for (int l = 0; l < 32; ++l)
        if (((mask >> l) & 1u) != 0 && f->blk->fibers[w0 + l].st == St::kDone)
            die("ballot: a lane of the mask has exited (undefined on the GPU)");
    unsigned m = 0;
    for (int l = 0; l < 32; ++l)
        m |= (f->blk->xchg[w0 + l] ? 1u : 0u) << l;
    yield(St::kWarpBar);
    return m;
}

//! reinterpret_cast with an alignment check of the pointee (misaligned vector accesses fault on a GPU).
template <class To, class From>
To checkedCast(From p)
{
    if constexpr (std::is_pointer_v<To> && std::is_pointer_v<From>)
    {
        using P = std::remove_cv_t<std::remove_pointer_t<To>>;
        constexpr size_t kAlign = std::is_same_v<P, float4> ? 16 : alignof(P);
        if (reinterpret_cast<uintptr_t>(p) % kAlign != 0)
            die("misaligned vector access");
    }
    return reinterpret_cast<To>(p);
}

inline int gWorkers = [] {
    char const* e = std::getenv("EMU_WORKERS");
    return e ? std::atoi(e) : 16;
}();

struct Launch
{
    dim3 grid, block;
    size_t smem;
    template <class F, class... Args>
    void operator()(F f, Args... args) const
    {
        if (block.y != 1 || block.z != 1 || block.x % 32 != 0)
            die("unsupported block shape");
        long long const total = 1LL * grid.x * grid.y * grid.z;
        std::atomic<long long> next{0};
        auto work = [&]()
        {
            for (;;)
            {
                long long const i = next++;
                if (i >= total)
                    return;
                Block b;
                b.bid = {static_cast<unsigned>(i % grid.x), static_cast<unsigned>((i / grid.x) % grid.y),
                    static_cast<unsigned>(i / (1LL * grid.x * grid.y))};
                b.bdim = block;
                b.gdim = grid;
                b.dynBytes = smem;
                b.body = [&]() { f(args...); };
                runBlock(b);
                ++gBlocks;
                gThreads += block.x;
            }
        };
        int const nw = static_cast<int>(std::min<long long>(gWorkers, total));
        std::vector<std::thread> ws;
        for (int i = 1; i < nw; ++i)
            ws.emplace_back(work);
        work();
        for (auto& t : ws)
            t.join();
    }
};
inline Launch launch(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t = nullptr) { return Launch{grid, block, smem}; }
} // namespace emu

#define threadIdx (emu::cur->tid)
#define blockIdx (emu::cur->blk->bid)
#define blockDim (emu::cur->blk->bdim)
#define gridDim (emu::cur->blk->gdim)
inline void __syncthreads() { emu::yield(emu::St::kBlockBar); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::yield(emu::St::kWarpBar); }
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int off) { return emu::shflXor(mask, v, off); }
inline unsigned __ballot_sync(unsigned mask, int pred) { return emu::ballot(mask, pred); }
