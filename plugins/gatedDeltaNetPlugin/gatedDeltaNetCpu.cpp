/*
 * DFlash2GatedDeltaNet: CPU build of the shared math (gatedDeltaNetMath.h) and the validation,
 * with a C ABI for ctypes. Built by dflash2_trt/trtllm/cpu/plugin_libs.py (g++
 * -ffp-contract=off) for the CPU engine backend and the tests; never part of the plugin library.
 * It runs the kernels' stages in the kernels' order (conv, norms, gates, recurrence or chunk
 * matrices / solve / scan, conv state), each through the same functions of gatedDeltaNetMath.h.
 *
 * Inputs and outputs are passed like TensorRT's enqueue: arrays of pointers in the plugin's
 * order; rnn_state_ptr / conv_state_ptr point at one int64 holding the pool's address.
 */
#include "gatedDeltaNetMath.h"
#include "gatedDeltaNetParams.h"
#include "../common/df2Validation.h"

#include <cmath>
#include <cstring>
#include <vector>

using namespace dflash2;

namespace
{

constexpr ParamFail fail{kGatedDeltaNetName};

//! What one call works on: the row space (packed tokens in forward, B x Kv verify rows in commit)
//! and, per request, its first row, its token count and the rows a stage must cover.
struct Batch
{
    std::vector<int64_t> base;  //!< first row of request r
    std::vector<int32_t> len;   //!< tokens of request r (cu_seqlens)
    std::vector<int32_t> count; //!< commit: tokens to commit (gdnCommitCount); forward: len
};

//! Where one slot's parts live (gatedDeltaNetParams.h GdnSlotLayout) for one value head h reading key
//! head kHead: its state, and the records of the deferred commit.
struct SlotView
{
    float* base;
    GdnSlotLayout const* l;
    int64_t kv, dk, dv;

    float* state(int64_t h) const { return base + l->state + h * dk * dv; }
    float* delta(int64_t h) const { return base + l->delta + h * kv * dv; } //!< [Kv][Dv]
    float* keys(int64_t g) const { return base + l->keys + g * kv * dk; }   //!< [Kv][Dk]
    float* decay(int64_t h) const { return base + l->decay + h * kv; }     //!< [Kv]
    int32_t pendingRaw() const
    {
        int32_t v;
        std::memcpy(&v, base + l->pending, sizeof(v));
        return v;
    }
    void setPending(int32_t v) const { std::memcpy(base + l->pending, &v, sizeof(v)); }
};

SlotView slotView(GatedDeltaNetParams const& p, GdnSlotLayout const& l, float* pool, int32_t slot)
{
    auto const& a = p.attrs;
    return SlotView{pool + static_cast<int64_t>(slot) * l.floats, &l, a.maxVerifyTokens, a.headKDim, a.headVDim};
}

//! The fold of one state column over `pend` records (the deferred commit of the previous step), slice by
//! slice: k of record t at keys[t * dk], its decay at decay[t], the column's delta at delta[t * dv].
template <int32_t kDk>
void foldColumn(float* s, int32_t pend, float const* keys, float const* decay, float const* delta, int64_t dv)
{
    constexpr int32_t kSplit = kGdnSplit<kDk>;
    constexpr int32_t kSlice = kDk / kSplit;
    for (int32_t t = 0; t < pend; ++t)
        for (int32_t l = 0; l < kSplit; ++l)
            gdnSliceFold<kSlice>(s + l * kSlice, keys + t * kDk + l * kSlice, decay[t], delta[t * dv]);
}

//! What a state column starts from: zeros, or the slot's state folded over its pending records.
struct ColumnStart
{
    bool zero;
    int32_t pend;          //!< records to fold (0 with zero)
    float const* keys;     //!< the column's key head's records [Kv][Dk]
    float const* decay;    //!< the column's value head's [Kv]
    float const* delta;    //!< the column's [Kv][Dv] (this column at offset 0)
};

//! Which state a call stores in the slot: none, the folded one (a generation request whose slot had
//! records: the committed state, before its verify tokens), or the advanced one (a context request).
enum class StateWrite
{
    kNone,
    kFolded,
    kAdvanced,
};

//! The per-token recurrence of one state column over n tokens, slice by slice exactly as the
//! lanes of gdnRecurrentKernel (gatedDeltaNetMath.h), after the fold of its pending records. v / y
//! are addressed by element index in the activation dtype. deltaOut (generation requests): the
//! column's delta of the first nRec tokens, at deltaOut[t * dv] (the next step's fold reads them).
template <int32_t kDk>
void recurrentColumn(float* st, int64_t dv, ColumnStart const& from, float const* qh, float const* kh, int64_t qkw,
    DType vt, void const* xc, int64_t v0, int64_t vStride, float const* gates, int64_t gateStride, int64_t betaOffset,
    int32_t n, void* y, int64_t y0, int64_t yStride, StateWrite write, float* deltaOut, int32_t nRec)
{
    constexpr int32_t kSplit = kGdnSplit<kDk>;
    constexpr int32_t kSlice = kDk / kSplit;
    float s[kDk];
    float part[kSplit];
    for (int32_t i = 0; i < kDk; ++i)
        s[i] = from.zero ? 0.0f : st[i * dv];
    foldColumn<kDk>(s, from.pend, from.keys, from.decay, from.delta, dv);
    if (write == StateWrite::kFolded)
        for (int32_t i = 0; i < kDk; ++i)
            st[i * dv] = s[i];
    for (int32_t p = 0; p < n; ++p)
    {
        float const* kp = kh + p * qkw;
        float const decay = expRn(gates[p * gateStride]);
        float const beta = gates[p * gateStride + betaOffset];
        for (int32_t l = 0; l < kSplit; ++l)
            part[l] = gdnSliceDecayDot<kSlice>(s + l * kSlice, kp + l * kSlice, decay);
        float const delta = gdnDelta(gdnLoad(vt, xc, v0 + p * vStride), gdnCombine<kSplit>(part), beta);
        if (p < nRec)
            deltaOut[p * dv] = delta;
        for (int32_t l = 0; l < kSplit; ++l)
            gdnSliceUpdate<kSlice>(s + l * kSlice, kp + l * kSlice, delta);
        float const* qp = qh + p * qkw;
        for (int32_t l = 0; l < kSplit; ++l)
            part[l] = gdnSliceDot<kSlice>(s + l * kSlice, qp + l * kSlice);
        gdnStore(vt, y, y0 + p * yStride, gdnCombine<kSplit>(part));
    }
    if (write == StateWrite::kAdvanced)
        for (int32_t i = 0; i < kDk; ++i)
            st[i * dv] = s[i];
}

//! The records a forward folds for request r's slot (none for a zero_state context request).
int32_t pendingOf(SlotView const& sv, bool zeroInit)
{
    return zeroInit ? 0 : gdnPendingCount(sv.pendingRaw(), static_cast<int32_t>(sv.kv));
}

ColumnStart columnStart(SlotView const& sv, bool zeroInit, int32_t pend, int64_t h, int64_t kHead, int64_t j)
{
    return ColumnStart{zeroInit, pend, sv.keys(kHead), sv.decay(h), sv.delta(h) + j};
}

//! One request's per-token recurrence: generation requests (verify: y and the delta records; the
//! folded state, the committed one, is written back when records were folded into it) and, with
//! chunk_size = 0, context requests (the state advances).
template <int32_t kDk>
void recurrentColumns(GatedDeltaNetParams const& p, GdnSlotLayout const& L, int32_t n, int32_t slot, float* pool,
    float const* qh, float const* kh, void const* xc, float const* gates, void* y, bool ctx, int64_t base,
    bool zeroInit)
{
    auto const& a = p.attrs;
    int64_t const hk = a.numKHeads, hv = a.numVHeads, dv = a.headVDim, C = p.convDim;
    int64_t const group = hv / hk;
    int64_t const qkw = hk * kDk;
    SlotView const sv = slotView(p, L, pool, slot);
    int32_t const pend = pendingOf(sv, zeroInit);
    StateWrite const write = ctx ? StateWrite::kAdvanced : (pend > 0 ? StateWrite::kFolded : StateWrite::kNone);
    int32_t const nRec = ctx ? 0 : (n < a.maxVerifyTokens ? n : a.maxVerifyTokens);
    for (int64_t h = 0; h < hv; ++h)
    {
        int64_t const kHead = h / group;
        float* st = sv.state(h);
        for (int64_t j = 0; j < dv; ++j)
            recurrentColumn<kDk>(st + j, dv, columnStart(sv, zeroInit, pend, h, kHead, j),
                qh + base * qkw + kHead * kDk, kh + base * qkw + kHead * kDk, qkw, p.dataType, xc,
                base * C + 2 * qkw + h * dv + j, C, gates + base * 2 * hv + h, 2 * hv, hv, n, y,
                base * hv * dv + h * dv + j, hv * dv, write, sv.delta(h) + j, nRec);
    }
}

//! The chunked scan of one state column over a request's n tokens, slice by slice exactly as the
//! lanes of gdnChunkScanKernel. v_new is written over u (the GPU keeps it in shared memory).
template <int32_t kDk>
void chunkScanColumn(float* st, int64_t dv, float const* qh, float const* kh, int64_t qkw, float const* gam,
    int64_t gamStride, float const* qk, int64_t qkmStride, float* u, int64_t uStride, float const* w, int64_t wStride,
    int32_t n, int32_t chunk, DType yt, void* y, int64_t y0, int64_t yStride, ColumnStart const& from)
{
    constexpr int32_t kSplit = kGdnSplit<kDk>;
    constexpr int32_t kSlice = kDk / kSplit;
    float s[kDk];
    float part[kSplit];
    for (int32_t i = 0; i < kDk; ++i)
        s[i] = from.zero ? 0.0f : st[i * dv];
    foldColumn<kDk>(s, from.pend, from.keys, from.decay, from.delta, dv);
    for (int32_t c0 = 0; c0 < n; c0 += chunk)
    {
        int32_t const m = (n - c0) < chunk ? (n - c0) : chunk;
        for (int32_t p = 0; p < m; ++p)
        {
            float const* wp = w + (c0 + p) * wStride;
            for (int32_t l = 0; l < kSplit; ++l)
                part[l] = gdnSliceFmaDot<kSlice>(s + l * kSlice, wp + l * kSlice);
            float* up = u + (c0 + p) * uStride;
            *up = subRn(*up, gdnCombine<kSplit>(part));
        }
        for (int32_t p = 0; p < m; ++p)
        {
            float const* qp = qh + (c0 + p) * qkw;
            float const e = expRn(gam[(c0 + p) * gamStride]);
            for (int32_t l = 0; l < kSplit; ++l)
                part[l] = gdnSliceDecayedDot<kSlice>(s + l * kSlice, qp + l * kSlice, e);
            float const inter = gdnCombine<kSplit>(part);
            float const intra = gdnChunkIntra(qk + (c0 + p) * qkmStride, u + c0 * uStride, uStride, p);
            gdnStore(yt, y, y0 + (c0 + p) * yStride, addRn(inter, intra));
        }
        float const gl = gam[(c0 + m - 1) * gamStride];
        for (int32_t l = 0; l < kSplit; ++l)
            gdnSliceScale<kSlice>(s + l * kSlice, expRn(gl));
        for (int32_t p = 0; p < m; ++p)
        {
            float const* kp = kh + (c0 + p) * qkw;
            float const f = expRn(subRn(gl, gam[(c0 + p) * gamStride]));
            float const vn = u[(c0 + p) * uStride];
            for (int32_t l = 0; l < kSplit; ++l)
                gdnSliceChunkUpdate<kSlice>(s + l * kSlice, kp + l * kSlice, f, vn);
        }
    }
    for (int32_t i = 0; i < kDk; ++i)
        st[i * dv] = s[i];
}

template <int32_t kDk>
void chunkedRequest(GatedDeltaNetParams const& p, GdnSlotLayout const& L, int32_t n, int32_t slot, float* pool,
    float const* qh,
    float const* kh, void const* xc, float const* gates, float* gam, float* amat, float* qk, float* u, float* w,
    void* y, int64_t base, bool zeroInit)
{
    auto const& a = p.attrs;
    int64_t const hk = a.numKHeads, hv = a.numVHeads, dv = a.headVDim, C = p.convDim, ch = a.chunkSize;
    int64_t const group = hv / hk;
    int64_t const qkw = hk * kDk; // qh/kh row width
    for (int32_t c0 = 0; c0 < n; c0 += a.chunkSize)
    {
        int32_t const m = (n - c0) < a.chunkSize ? (n - c0) : a.chunkSize;
        int64_t const row0 = base + c0;
        for (int64_t h = 0; h < hv; ++h)
        {
            int64_t const kHead = h / group;
            // matrices (gdnChunkMatricesKernel)
            gdnChunkCumDecay(gates + row0 * 2 * hv + h, 2 * hv, m, gam + row0 * hv + h, hv);
            for (int32_t pp = 0; pp < m; ++pp)
            {
                int64_t const rp = row0 + pp;
                float const gp = gam[rp * hv + h];
                float const bp = gates[rp * 2 * hv + hv + h];
                for (int32_t s = 0; s <= pp; ++s)
                {
                    int64_t const rs = row0 + s;
                    float const gs = gam[rs * hv + h];
                    float const* ks = kh + rs * qkw + kHead * kDk;
                    qk[(rp * hv + h) * ch + s] = gdnChunkQKEntry(qh + rp * qkw + kHead * kDk, ks, gp, gs, kDk);
                    if (s < pp)
                        amat[(rp * hv + h) * ch + s] = gdnChunkAEntry(kh + rp * qkw + kHead * kDk, ks, bp, gp, gs, kDk);
                }
            }
            // solve (gdnChunkSolveKernel): Dv columns of U, then Dk columns of W
            float const* arow = amat + (row0 * hv + h) * ch;
            for (int64_t col = 0; col < dv + kDk; ++col)
            {
                float* x;
                int64_t xs;
                if (col < dv)
                {
                    x = u + (row0 * hv + h) * dv + col;
                    xs = hv * dv;
                    for (int32_t pp = 0; pp < m; ++pp)
                        x[pp * xs] = gdnChunkRhsU(gdnLoad(p.dataType, xc, (row0 + pp) * C + 2 * qkw + h * dv + col),
                            gates[(row0 + pp) * 2 * hv + hv + h]);
                }
                else
                {
                    int64_t const i = col - dv;
                    x = w + (row0 * hv + h) * kDk + i;
                    xs = hv * kDk;
                    for (int32_t pp = 0; pp < m; ++pp)
                        x[pp * xs] = gdnChunkRhsW(kh[(row0 + pp) * qkw + kHead * kDk + i],
                            gates[(row0 + pp) * 2 * hv + hv + h], gam[(row0 + pp) * hv + h]);
                }
                gdnChunkSolveColumn(arow, hv * ch, m, x, xs);
            }
        }
    }
    // scan (gdnChunkScanKernel): sequential over the chunks, one column at a time, from the slot's
    // state folded over its pending records
    SlotView const sv = slotView(p, L, pool, slot);
    int32_t const pend = pendingOf(sv, zeroInit);
    for (int64_t h = 0; h < hv; ++h)
    {
        int64_t const kHead = h / group;
        float* st = sv.state(h);
        for (int64_t j = 0; j < dv; ++j)
            chunkScanColumn<kDk>(st + j, dv, qh + base * qkw + kHead * kDk, kh + base * qkw + kHead * kDk, qkw,
                gam + base * hv + h, hv, qk + (base * hv + h) * ch, hv * ch, u + (base * hv + h) * dv + j, hv * dv,
                w + (base * hv + h) * kDk, hv * kDk, n, a.chunkSize, p.dataType, y, base * hv * dv + h * dv + j,
                hv * dv, columnStart(sv, zeroInit, pend, h, kHead, j));
    }
}

//! Conv state after n more tokens: the last K-1 raw inputs of [old state, x[0..n)] (old state =
//! zeros when zeroInit).
template <class T>
void updateConvState(GatedDeltaNetParams const& p, typename T::Storage* state, typename T::Storage const* x,
    int64_t base, int32_t n, bool zeroInit)
{
    int32_t const keep = p.attrs.convKernel - 1;
    int64_t const C = p.convDim;
    std::vector<typename T::Storage> col(static_cast<size_t>(keep > 0 ? keep : 1));
    for (int64_t c = 0; c < C; ++c)
    {
        for (int32_t m = 0; m < keep; ++m)
        {
            int32_t const pos = n - keep + m;
            col[m] = pos >= 0 ? x[(base + pos) * C + c]
                              : (zeroInit ? T::store(0.0f) : state[static_cast<int64_t>(pos + keep) * C + c]);
        }
        for (int32_t m = 0; m < keep; ++m)
            state[static_cast<int64_t>(m) * C + c] = col[m];
    }
}

template <int32_t kDk, class T>
void forwardTyped(GatedDeltaNetParams const& p, void const* const* in, void* const* out)
{
    using S = typename T::Storage;
    auto const& a = p.attrs;
    int64_t const T_ = p.tokens, B = p.batch, C = p.convDim;
    int64_t const hk = a.numKHeads, hv = a.numVHeads, kv = a.maxVerifyTokens;
    auto const* x = static_cast<S const*>(in[0]);
    auto const* wconv = static_cast<S const*>(in[1]);
    auto const* av = static_cast<S const*>(in[2]);
    auto const* bv = static_cast<S const*>(in[3]);
    auto const* dtBias = static_cast<float const*>(in[4]);
    auto const* aLog = static_cast<float const*>(in[5]);
    auto const* cu = static_cast<int32_t const*>(in[6]);
    auto const* slots = static_cast<int32_t const*>(in[7]);
    auto* rnnPool = reinterpret_cast<float*>(*static_cast<int64_t const*>(in[9]));
    auto* convPool = reinterpret_cast<S*>(*static_cast<int64_t const*>(in[10]));
    auto const* zeroState = a.zeroStateInput ? static_cast<int32_t const*>(in[11]) : nullptr;
    auto zeroInit = [&](int64_t r) { return zeroState != nullptr && r < p.numContext && zeroState[r] != 0; };
    auto* y = static_cast<S*>(out[0]);
    auto* vqkv = static_cast<S*>(out[1]);
    auto* vgates = static_cast<float*>(out[2]);

    GatedDeltaNetWorkspace const ws = gatedDeltaNetWorkspaceLayout(p);
    std::vector<unsigned char> buf(ws.total + 256);
    unsigned char* base = buf.data();
    auto* xc = reinterpret_cast<S*>(base + ws.xc);
    auto* qh = reinterpret_cast<float*>(base + ws.qh);
    auto* kh = reinterpret_cast<float*>(base + ws.kh);
    auto* gates = reinterpret_cast<float*>(base + ws.gates);
    int64_t const keep = a.convKernel - 1;
    float const scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kDk)));

    // 1. conv + silu (gdnConvKernel), raw verify rows of generation requests
    for (int64_t r = 0; r < B; ++r)
    {
        int64_t const r0 = cu[r];
        int32_t const n = cu[r + 1] - cu[r];
        S const* st = zeroInit(r) ? nullptr : convPool + static_cast<int64_t>(slots[r]) * keep * C;
        bool const gen = r >= p.numContext;
        for (int32_t pp = 0; pp < n; ++pp)
            for (int64_t c = 0; c < C; ++c)
            {
                xc[(r0 + pp) * C + c] = gdnConvSilu<T>(x + r0 * C, C, st, C, wconv, a.convKernel, pp, c);
                if (gen && pp < kv)
                    vqkv[(r * kv + pp) * C + c] = x[(r0 + pp) * C + c];
            }
    }
    // 2. l2norm of q and k (gdnQkNormKernel)
    for (int64_t t = 0; t < T_; ++t)
        for (int64_t g = 0; g < hk; ++g)
        {
            gdnL2Normalize<T>(xc + t * C + g * kDk, qh + (t * hk + g) * kDk, kDk, scale);
            gdnL2Normalize<T>(xc + t * C + hk * kDk + g * kDk, kh + (t * hk + g) * kDk, kDk, 0.0f);
        }
    // 3. gates (gdnGatesKernel)
    for (int64_t r = 0; r < B; ++r)
    {
        bool const gen = r >= p.numContext;
        for (int32_t pp = 0; pp < cu[r + 1] - cu[r]; ++pp)
        {
            int64_t const t = cu[r] + pp;
            for (int64_t h = 0; h < hv; ++h)
            {
                float const g = gdnDecayLog(T::load(av[t * hv + h]), dtBias[h], aLog[h]);
                float const beta = gdnBeta<T>(bv[t * hv + h]);
                gates[t * 2 * hv + h] = g;
                gates[t * 2 * hv + hv + h] = beta;
                if (gen && pp < kv)
                {
                    vgates[(r * kv + pp) * 2 * hv + h] = g;
                    vgates[(r * kv + pp) * 2 * hv + hv + h] = beta;
                }
            }
        }
    }
    GdnSlotLayout const L = gatedDeltaNetSlotLayout(a);
    // 4. recurrence, from each slot's state folded over its pending records: generation requests (verify:
    // y, delta records; the folded state is written back), context requests when chunk_size = 0
    for (int64_t r = 0; r < B; ++r)
    {
        bool const ctx = r < p.numContext;
        if (ctx && a.chunkSize > 0)
            continue;
        recurrentColumns<kDk>(p, L, cu[r + 1] - cu[r], slots[r], rnnPool, qh, kh, xc, gates, y, ctx, cu[r],
            zeroInit(r));
    }
    // 5. chunked context requests
    if (a.chunkSize > 0)
    {
        auto* gam = reinterpret_cast<float*>(base + ws.gam);
        auto* amat = reinterpret_cast<float*>(base + ws.a);
        auto* qk = reinterpret_cast<float*>(base + ws.qk);
        auto* u = reinterpret_cast<float*>(base + ws.u);
        auto* w = reinterpret_cast<float*>(base + ws.w);
        for (int64_t r = 0; r < p.numContext; ++r)
            chunkedRequest<kDk>(p, L, cu[r + 1] - cu[r], slots[r], rnnPool, qh, kh, xc, gates, gam, amat, qk, u, w,
                y, cu[r], zeroInit(r));
    }
    // 6. (gdnConvStateKernel, after every reader of the old records) the conv state of context requests;
    // the keys and decay records of generation requests' verify tokens; every slot's pending count to 0
    // (the records are folded; the commit sets the count of the new ones)
    for (int64_t r = 0; r < B; ++r)
    {
        SlotView const sv = slotView(p, L, rnnPool, slots[r]);
        int32_t const n = cu[r + 1] - cu[r];
        if (r < p.numContext)
            updateConvState<T>(p, convPool + static_cast<int64_t>(slots[r]) * keep * C, x, cu[r], n, zeroInit(r));
        else
        {
            int32_t const nRec = n < a.maxVerifyTokens ? n : a.maxVerifyTokens;
            for (int32_t t = 0; t < nRec; ++t)
            {
                int64_t const row = cu[r] + t;
                for (int64_t g = 0; g < hk; ++g)
                    for (int64_t i = 0; i < kDk; ++i)
                        sv.keys(g)[t * kDk + i] = kh[(row * hk + g) * kDk + i];
                for (int64_t h = 0; h < hv; ++h)
                    sv.decay(h)[t] = expRn(gates[row * 2 * hv + h]);
            }
        }
        sv.setPending(0);
    }
}

//! The commit: each generation request's slot records its accepted count (the next forward folds
//! that many records into the state) and its conv state advances over the accepted tokens.
template <class T>
void commitTyped(GatedDeltaNetParams const& p, void const* const* in, void* const* out)
{
    using S = typename T::Storage;
    auto const& a = p.attrs;
    int64_t const B = p.batch, C = p.convDim;
    int64_t const kv = a.maxVerifyTokens;
    auto const* vqkv = static_cast<S const*>(in[0]);
    auto const* numAccepted = static_cast<int32_t const*>(in[3]);
    auto const* cu = static_cast<int32_t const*>(in[4]);
    auto const* slots = static_cast<int32_t const*>(in[5]);
    auto* rnnPool = reinterpret_cast<float*>(*static_cast<int64_t const*>(in[7]));
    auto* convPool = reinterpret_cast<S*>(*static_cast<int64_t const*>(in[8]));
    auto* committed = static_cast<int32_t*>(out[0]);
    GdnSlotLayout const L = gatedDeltaNetSlotLayout(a);
    int64_t const keep = a.convKernel - 1;

    for (int64_t r = 0; r < B; ++r)
    {
        bool const gen = r >= p.numContext;
        int32_t const n = gen ? gdnCommitCount(numAccepted[r], cu[r + 1] - cu[r], a.maxVerifyTokens) : 0;
        committed[r] = n;
        if (!gen)
            continue;
        slotView(p, L, rnnPool, slots[r]).setPending(n);
        if (n > 0) // conv state (gdnConvStateKernel)
            updateConvState<T>(p, convPool + static_cast<int64_t>(slots[r]) * keep * C, vqkv, r * kv, n, false);
    }
}

//! Every listed slot's state folded over its pending records, the count set to 0: the committed state
//! (what a forward starts from), materialised in place.
template <int32_t kDk>
void foldSlots(GatedDeltaNetParams const& p, float* pool, int32_t const* slots, int64_t count)
{
    auto const& a = p.attrs;
    GdnSlotLayout const L = gatedDeltaNetSlotLayout(a);
    int64_t const hv = a.numVHeads, dv = a.headVDim, group = hv / a.numKHeads;
    float s[kDk];
    for (int64_t q = 0; q < count; ++q)
    {
        SlotView const sv = slotView(p, L, pool, slots[q]);
        int32_t const pend = pendingOf(sv, false);
        for (int64_t h = 0; h < hv; ++h)
            for (int64_t j = 0; j < dv; ++j)
            {
                float* st = sv.state(h) + j;
                for (int32_t i = 0; i < kDk; ++i)
                    s[i] = st[i * dv];
                foldColumn<kDk>(s, pend, sv.keys(h / group), sv.decay(h), sv.delta(h) + j, dv);
                for (int32_t i = 0; i < kDk; ++i)
                    st[i * dv] = s[i];
            }
        sv.setPending(0);
    }
}

template <class T>
void dispatchDk(GatedDeltaNetParams const& p, void const* const* in, void* const* out)
{
    if (p.attrs.mode == static_cast<int32_t>(GdnMode::kCOMMIT))
        return commitTyped<T>(p, in, out);
    switch (p.attrs.headKDim)
    {
    case 16: forwardTyped<16, T>(p, in, out); break;
    case 32: forwardTyped<32, T>(p, in, out); break;
    case 64: forwardTyped<64, T>(p, in, out); break;
    default: forwardTyped<128, T>(p, in, out); break;
    }
}

int32_t run(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims, int64_t const* dims,
    void const* const* in, void* const* out, int64_t numSlots, int32_t wantMode, char* msg, int32_t msgLen)
{
    GatedDeltaNetAttrs const a = attrsFromValues(kGatedDeltaNetFields, attrs);
    TensorDesc descs[16];
    if (descsFromArrays(fail, nbInputs, dtypes, nbDims, dims, descs, msg, msgLen) != Status::kOK)
        return static_cast<int32_t>(Status::kINVALID);
    if (a.mode != wantMode)
        return static_cast<int32_t>(fail(msg, msgLen, "mode=%d called through the %s entry point", a.mode,
            gdnModeName(static_cast<GdnMode>(wantMode))));
    GatedDeltaNetParams p;
    Status s = validateGatedDeltaNet(a, descs, nbInputs, &p, msg, msgLen);
    if (s != Status::kOK)
        return static_cast<int32_t>(s);
    bool const commit = a.mode == static_cast<int32_t>(GdnMode::kCOMMIT);
    int32_t const* types = static_cast<int32_t const*>(in[commit ? 6 : 8]);
    int32_t const* cu = static_cast<int32_t const*>(in[commit ? 4 : 6]);
    int32_t const* slots = static_cast<int32_t const*>(in[commit ? 5 : 7]);
    int32_t const* numAccepted = commit ? static_cast<int32_t const*>(in[3]) : nullptr;
    s = validateGatedDeltaNetBatch(&p, types, cu, slots, numSlots, numAccepted, msg, msgLen);
    if (s != Status::kOK)
        return static_cast<int32_t>(s);
    switch (p.dataType)
    {
    case DType::kFLOAT16: dispatchDk<F16>(p, in, out); break;
    case DType::kBFLOAT16: dispatchDk<BF16>(p, in, out); break;
    default: dispatchDk<F32>(p, in, out); break;
    }
    return 0;
}

} // namespace

extern "C"
{

//! attrs: the values in kGatedDeltaNetFields' order (mode, num_k_heads, num_v_heads, head_k_dim,
//! head_v_dim, conv_kernel, max_verify_tokens, chunk_size, zero_state_input); dims holds 8 slots
//! per input.
int32_t df2_gdn_validate(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, char* msg, int32_t msgLen)
{
    TensorDesc descs[16];
    if (descsFromArrays(fail, nbInputs, dtypes, nbDims, dims, descs, msg, msgLen) != Status::kOK)
        return static_cast<int32_t>(Status::kINVALID);
    return static_cast<int32_t>(
        validateGatedDeltaNet(attrsFromValues(kGatedDeltaNetFields, attrs), descs, nbInputs, nullptr, msg, msgLen));
}

//! The forward on the CPU: validates (shapes, then the request data against numSlots pool
//! slots), then computes y, verify_qkv, verify_gates and updates the context requests' slots.
int32_t df2_gdn_forward(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, void const* const* inputs, void* const* outputs, int64_t numSlots, char* msg, int32_t msgLen)
{
    return run(attrs, nbInputs, dtypes, nbDims, dims, inputs, outputs, numSlots, 0, msg, msgLen);
}

//! The commit on the CPU: advances each generation request's slot over its accepted tokens.
int32_t df2_gdn_commit(int32_t const* attrs, int32_t nbInputs, int32_t const* dtypes, int32_t const* nbDims,
    int64_t const* dims, void const* const* inputs, void* const* outputs, int64_t numSlots, char* msg, int32_t msgLen)
{
    return run(attrs, nbInputs, dtypes, nbDims, dims, inputs, outputs, numSlots, 1, msg, msgLen);
}

//! The slot layout (GdnSlotLayout) for these attributes: out[0..6] = state, pending, delta, keys, decay
//! offsets (floats), record rows, slot floats. Returns 0, or the attribute validation's status.
int32_t df2_gdn_slot_layout(int32_t const* attrs, int64_t* out, char* msg, int32_t msgLen)
{
    GatedDeltaNetAttrs const a = attrsFromValues(kGatedDeltaNetFields, attrs);
    Status const s = validateGatedDeltaNetAttrs(a, msg, msgLen);
    if (s != Status::kOK)
        return static_cast<int32_t>(s);
    GdnSlotLayout const l = gatedDeltaNetSlotLayout(a);
    int64_t const v[7] = {l.state, l.pending, l.delta, l.keys, l.decay, l.recordRows, l.floats};
    std::memcpy(out, v, sizeof(v));
    return 0;
}

//! Folds the pending records of `count` slots of the rnn pool at `pool` ([numSlots, slot floats]) into
//! their state and sets their counts to 0, in place: the committed state, as the next forward would
//! start from it (the tests' and the runtime's view of a slot).
int32_t df2_gdn_fold(int32_t const* attrs, float* pool, int64_t numSlots, int32_t const* slots, int64_t count,
    char* msg, int32_t msgLen)
{
    GatedDeltaNetAttrs const a = attrsFromValues(kGatedDeltaNetFields, attrs);
    Status const s = validateGatedDeltaNetAttrs(a, msg, msgLen);
    if (s != Status::kOK)
        return static_cast<int32_t>(s);
    for (int64_t q = 0; q < count; ++q)
        if (slots[q] < 0 || slots[q] >= numSlots)
            return static_cast<int32_t>(fail(msg, msgLen, "fold: slot %d outside the state pool's %lld slots",
                slots[q], static_cast<long long>(numSlots)));
    GatedDeltaNetParams p;
    p.attrs = a;
    switch (a.headKDim)
    {
    case 16: foldSlots<16>(p, pool, slots, count); break;
    case 32: foldSlots<32>(p, pool, slots, count); break;
    case 64: foldSlots<64>(p, pool, slots, count); break;
    default: foldSlots<128>(p, pool, slots, count); break;
    }
    return 0;
}

//! Scalar functions exposed for the tests (against torch's own).
float df2_gdn_softplus(float x) { return gdnSoftplus(x); }
float df2_gdn_sigmoid(float x) { return gdnSigmoid(x); }
float df2_gdn_silu(float x) { return gdnSilu(x); }
float df2_gdn_log(float x) { return gdnLogRn(x); }

} // extern "C"
