// depthwise: convolutions with groups == C (one input channel per group, K = m·C output channels with
// channel multiplier m), any kernel size, stride, padding and dilation. Memory-bound: every kernel here
// aims to move each input and output element through DRAM about once.
//
// This file: every pass on channels-last activations, x/dx (N, H, W, C) and out/dy (N, P, Q, C), multiplier 1.
// Their planning: cuconv/algos/depthwise/nhwc.py.
#include "depthwise/depthwise.cuh"
#include "epilogue.cuh"

// V = 16 / sizeof(T) accumulators rounded to T once and stored as one 16-byte vector at p (the channels-last
// kernels' output: V adjacent channels of a pixel).
template <typename T, typename Acc>
__device__ __forceinline__ void store_vector(T* __restrict__ p, const Acc* acc) {
    RowsOut<T, 16> o;
#pragma unroll
    for (int e = 0; e < 16 / static_cast<int>(sizeof(T)); ++e) o.v[e] = cuconv::from_acc<T>(acc[e]);
    *reinterpret_cast<RowsOut<T, 16>*>(p) = o;
}

// The same at out + off, each sum through the forward's epilogue first (res: the residual, lying as out does).
template <bool kEpi, typename T, typename Acc>
__device__ __forceinline__ void store_vector(T* __restrict__ out, i64 off, Acc* acc, const T* __restrict__ res,
                                             const cuconv::EpilogueArgs& epi) {
#pragma unroll
    for (int e = 0; e < 16 / static_cast<int>(sizeof(T)); ++e)
        acc[e] = cuconv::epilogue_if<kEpi>(acc[e], epi, res, off + e);
    store_vector<T>(out + off, acc);
}

// ---- channels-last (NHWC) activations -------------------------------------------------------------------------
// depthwise_nhwc_weight<T>(w, wt, C, taps, flip)
//     the weight (C, 1, R, S) as (R·S, C), so that a tap's weights of V adjacent channels are one 16-byte
//     vector; with `flip` the taps reversed (the kernel flipped in both axes: dgrad at stride 1 as the forward
//     convolution of dy).
// depthwise_nhwc_fwd<T, KR, Index, kEpi>(x, wt, bias, out, res, ConvGeometry, total, epi)
//     multiplier 1, x (N, H, W, C) and out (N, P, Q, C) channels-last, C a multiple of V = 16 / sizeof(T),
//     x, wt and out 16-byte aligned: a thread per (output pixel, V adjacent channels), flat over the batch with
//     the channels fastest (a warp's loads of one tap are consecutive 16-byte vectors; the taps' overlap comes
//     through L1); per tap one 16-byte load of x and one of wt, V FMAs in Acc<T>; bias added; the epilogue
//     (kEpi: epi, a cuconv::EpilogueArgs, and res, the residual lying as out does); one 16-byte
//     store. KR > 0: a KR x KR kernel with its tap loops unrolled; 0: R x S read at run time. Index: int
//     where total and every tensor's element count fit 31 bits (32-bit decodes), else long long.
template <typename T>
__global__ void __launch_bounds__(256)
depthwise_nhwc_weight(const T* __restrict__ w, T* __restrict__ wt, long long c, int taps, int flip) {
    const long long total = c * taps;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long t = i / c, ch = i - t * c;  // (tap, channel) of wt
        wt[i] = w[ch * taps + (flip ? taps - 1 - t : t)];
    }
}

template <typename T, int KR, typename Index, bool kEpi>
__global__ void __launch_bounds__(256)
depthwise_nhwc_fwd(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                   T* __restrict__ out, const T* __restrict__ res, const cuconv::ConvGeometry g, long long total,
                   const cuconv::EpilogueArgs epi) {
    using Acc = typename cuconv::Acc<T>::type;
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const Index vectors = static_cast<Index>(g.c / V), q_count = static_cast<Index>(g.q);
    const Index p_count = static_cast<Index>(g.p), h = static_cast<Index>(g.h), w = static_cast<Index>(g.w);
    const Index c = static_cast<Index>(g.c);
    const int r_count = KR > 0 ? KR : static_cast<int>(g.r), s_count = KR > 0 ? KR : static_cast<int>(g.s);
    for (Index i = static_cast<Index>(blockIdx.x) * 256 + static_cast<Index>(threadIdx.x);
         i < static_cast<Index>(total); i += static_cast<Index>(gridDim.x) * 256) {
        const Index v = i % vectors, pix = i / vectors;
        const Index oq = pix % q_count, rest = pix / q_count, op = rest % p_count, n = rest / p_count;
        const Index c0 = v * V;
        Acc acc[V];
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = bias != nullptr ? cuconv::to_acc(bias[c0 + e]) : Acc(0);
        const Index h0 = op * static_cast<Index>(g.stride_h) - static_cast<Index>(g.pad_top);
        const Index w0 = oq * static_cast<Index>(g.stride_w) - static_cast<Index>(g.pad_left);
        const T* __restrict__ xn = x + static_cast<i64>(n) * h * w * c + c0;
#pragma unroll
        for (int r = 0; r < r_count; ++r) {
            const Index ih = h0 + r * static_cast<Index>(g.dil_h);
            if (ih < 0 || ih >= h) continue;
#pragma unroll
            for (int s = 0; s < s_count; ++s) {
                const Index iw = w0 + s * static_cast<Index>(g.dil_w);
                if (iw < 0 || iw >= w) continue;
                const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xn + (static_cast<i64>(ih) * w + iw) * c));
                const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wt + static_cast<i64>(r * s_count + s) * c + c0));
#pragma unroll
                for (int e = 0; e < V; ++e) acc[e] = fma(elem_of<T>(xv, e), elem_of<T>(wv, e), acc[e]);
            }
        }
        store_vector<kEpi, T>(out, static_cast<i64>(pix) * c + c0, acc, res, epi);
    }
}

// depthwise_nhwc_fwd_q<T, KR, QT, kUnit, Index, kEpi>(x, wt, bias, out, res, ConvGeometry, total, epi)
//     depthwise_nhwc_fwd for a KR x KR kernel with QT adjacent output pixels of a row a thread (V channels each):
//     a tap's weight vector is loaded and converted to Acc<T> once for the QT pixels; with kUnit (stride and
//     dilation 1 along the row) a kernel row's KR + QT - 1 input vectors are loaded and converted once and shared
//     by every tap that overlaps them (the one-pixel kernel converts 2·KR vectors per kernel row for KR
//     pixel-taps' FMAs). Work items: (n, p, tile of QT pixels along q, vector of channels), channels fastest;
//     pixels past Q are computed from in-bounds loads and not stored.
template <typename T, int KR, int QT, bool kUnit, typename Index, bool kEpi>
__global__ void __launch_bounds__(256)
depthwise_nhwc_fwd_q(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                     T* __restrict__ out, const T* __restrict__ res, const cuconv::ConvGeometry g, long long total,
                     const cuconv::EpilogueArgs epi) {
    using Acc = typename cuconv::Acc<T>::type;
    constexpr int V = 16 / static_cast<int>(sizeof(T)), kWindow = kUnit ? KR + QT - 1 : 1;
    const Index vectors = static_cast<Index>(g.c / V), q_count = static_cast<Index>(g.q);
    const Index q_tiles = (q_count + QT - 1) / QT, p_count = static_cast<Index>(g.p);
    const Index h = static_cast<Index>(g.h), w = static_cast<Index>(g.w), c = static_cast<Index>(g.c);
    const Index sw = static_cast<Index>(g.stride_w), dw = static_cast<Index>(g.dil_w);
    for (Index i = static_cast<Index>(blockIdx.x) * 256 + static_cast<Index>(threadIdx.x);
         i < static_cast<Index>(total); i += static_cast<Index>(gridDim.x) * 256) {
        const Index v = i % vectors, item = i / vectors;
        const Index qt = item % q_tiles, rest = item / q_tiles, op = rest % p_count, n = rest / p_count;
        const Index c0 = v * V, oq0 = qt * QT;
        Acc acc[QT][V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
            const Acc b = bias != nullptr ? cuconv::to_acc(bias[c0 + e]) : Acc(0);
#pragma unroll
            for (int q = 0; q < QT; ++q) acc[q][e] = b;
        }
        const Index h0 = op * static_cast<Index>(g.stride_h) - static_cast<Index>(g.pad_top);
        const Index w0 = oq0 * sw - static_cast<Index>(g.pad_left);
        const T* __restrict__ xn = x + static_cast<i64>(n) * h * w * c + c0;
#pragma unroll
        for (int r = 0; r < KR; ++r) {
            const Index ih = h0 + r * static_cast<Index>(g.dil_h);
            if (ih < 0 || ih >= h) continue;
            const T* __restrict__ xr = xn + static_cast<i64>(ih) * w * c;
            Acc xw[kWindow][V];  // (kUnit) input columns w0 .. w0 + KR + QT - 2, zero outside the row
            if constexpr (kUnit) {
#pragma unroll
                for (int j = 0; j < kWindow; ++j) {
                    const Index iw = w0 + j;
                    if (iw >= 0 && iw < w) {
                        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xr + static_cast<i64>(iw) * c));
#pragma unroll
                        for (int e = 0; e < V; ++e) xw[j][e] = elem_of<T>(xv, e);
                    } else {
#pragma unroll
                        for (int e = 0; e < V; ++e) xw[j][e] = Acc(0);
                    }
                }
            }
#pragma unroll
            for (int s = 0; s < KR; ++s) {
                const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wt + static_cast<i64>(r * KR + s) * c + c0));
                Acc wf[V];
#pragma unroll
                for (int e = 0; e < V; ++e) wf[e] = elem_of<T>(wv, e);
#pragma unroll
                for (int q = 0; q < QT; ++q) {
                    if constexpr (kUnit) {
#pragma unroll
                        for (int e = 0; e < V; ++e) acc[q][e] = fma(xw[q + s][e], wf[e], acc[q][e]);
                    } else {
                        const Index iw = w0 + q * sw + s * dw;
                        if (iw < 0 || iw >= w) continue;
                        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xr + static_cast<i64>(iw) * c));
#pragma unroll
                        for (int e = 0; e < V; ++e) acc[q][e] = fma(elem_of<T>(xv, e), wf[e], acc[q][e]);
                    }
                }
            }
        }
        const i64 o = (static_cast<i64>(n * p_count + op) * q_count + oq0) * c + c0;
#pragma unroll
        for (int q = 0; q < QT; ++q) {
            if (oq0 + q >= q_count) break;
            store_vector<kEpi, T>(out, o + static_cast<i64>(q) * c, acc[q], res, epi);
        }
    }
}

// depthwise_nhwc_fwd_tile<T, KR, SR, QT, kEpi>(x, wt, bias, out, res, ConvGeometry, epi)
//     the 16-bit types' channels-last forward for a square KR x KR kernel at stride SR along both axes, dilation
//     1: a block per (tile of 8 output rows x 2·QT columns, 32 channels, sample) stages the tile's input window
//     of its 32 channels in shared memory once (16-byte vectors, 12 or fewer loads in flight a thread; zeros
//     outside the image and past C) and the channels' weights as fp32 pairs; a thread then takes a channel pair
//     and QT adjacent outputs of one row, and per kernel row converts the (QT - 1)·SR + KR input pairs its taps
//     read once into registers: KR·QT FMA pairs for QT + 6 shared loads (7x7, stride 1). The per-tap 16-byte
//     loads and conversions of depthwise_nhwc_fwd made it issue-bound at ~3x its FMA count. Staged rows are
//     kDwTileRowWords words apart, so that the two rows a warp's halves read fall in different banks. Sample
//     offsets within 31 bits (the Python twin checks).
constexpr int kDwTileRows = 8, kDwTileChannels = 32;
// Words between two staged rows: at least a row's hc pixels of 32 channels (16 words), 16-byte aligned, and
// sr rows ≡ 16 words (mod 32): a warp's two halves read rows sr apart, 16 consecutive words each.
__host__ __device__ constexpr int dw_tile_row_words(int hc, int sr) {
    int rp = hc * 16;
    while ((sr * rp) % 32 != 16) rp += 4;
    return rp;
}

template <typename T, int KR, int SR, int QT, bool kEpi>
__global__ void __launch_bounds__(256)
depthwise_nhwc_fwd_tile(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                        T* __restrict__ out, const T* __restrict__ res, const cuconv::ConvGeometry g,
                        const cuconv::EpilogueArgs epi) {
    static_assert(sizeof(T) == 2, "16-bit storage: a word is a channel pair");
    constexpr int TP = kDwTileRows, TQ = 2 * QT, kPairs = kDwTileChannels / 2;
    constexpr int HR = (TP - 1) * SR + KR, HC = (TQ - 1) * SR + KR;
    constexpr int RP = dw_tile_row_words(HC, SR);
    constexpr int kVectors = HR * HC * 4;  // 16-byte vectors staged: a pixel's 32 channels are 4
    constexpr int kLoads = (kVectors + 255) / 256;
    constexpr int kWindow = (QT - 1) * SR + KR;
    __shared__ __align__(16) unsigned s_x[HR * RP];
    __shared__ float2 s_w[KR * KR][kPairs];
    const int C = static_cast<int>(g.c), H = static_cast<int>(g.h), W = static_cast<int>(g.w);
    const int P = static_cast<int>(g.p), Q = static_cast<int>(g.q);
    const int q_tiles = (Q + TQ - 1) / TQ;
    const int p0 = static_cast<int>(blockIdx.x) / q_tiles * TP, q0 = static_cast<int>(blockIdx.x) % q_tiles * TQ;
    const int c0 = static_cast<int>(blockIdx.y) * kDwTileChannels;
    const int tid = static_cast<int>(threadIdx.x);
    const T* __restrict__ xn = x + static_cast<i64>(blockIdx.z) * H * W * C;
    const int ih0 = p0 * SR - static_cast<int>(g.pad_top), iw0 = q0 * SR - static_cast<int>(g.pad_left);

    for (int i = tid; i < KR * KR * kPairs; i += 256) {
        const int tap = i / kPairs, c = c0 + 2 * (i - tap * kPairs);
        s_w[tap][i - tap * kPairs] = c < C ? make_float2(cuconv::to_acc(wt[static_cast<i64>(tap) * C + c]),
                                                         cuconv::to_acc(wt[static_cast<i64>(tap) * C + c + 1]))
                                           : make_float2(0.f, 0.f);
    }
    uint4 v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
        const int i = tid + 256 * j, pix = i / 4, vec = i % 4;
        const int hr = pix / HC, hc = pix - hr * HC;
        const int ih = ih0 + hr, iw = iw0 + hc, c = c0 + 8 * vec;
        v[j] = make_uint4(0, 0, 0, 0);
        if (i < kVectors && ih >= 0 && ih < H && iw >= 0 && iw < W && c < C)
            v[j] = __ldg(reinterpret_cast<const uint4*>(xn + (ih * W + iw) * C + c));
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
        const int i = tid + 256 * j, pix = i / 4, vec = i % 4;
        const int hr = pix / HC, hc = pix - hr * HC;
        if (i < kVectors) *reinterpret_cast<uint4*>(&s_x[hr * RP + hc * 16 + vec * 4]) = v[j];
    }
    __syncthreads();

    // thread: channel pair tid % 16, output row (tid / 16) % 8 of the tile, columns QT·(tid / 128) on
    const int pair = tid % kPairs, pos = tid / kPairs, row = pos % TP, qg = pos / TP;
    const int c = c0 + 2 * pair;
    float acc[QT][2];
    {
        const float2 b = bias != nullptr && c < C ? make_float2(cuconv::to_acc(bias[c]), cuconv::to_acc(bias[c + 1]))
                                                  : make_float2(0.f, 0.f);
#pragma unroll
        for (int q = 0; q < QT; ++q) acc[q][0] = b.x, acc[q][1] = b.y;
    }
    const unsigned* base = s_x + row * SR * RP + qg * QT * SR * 16 + pair;
#pragma unroll 1  // (unrolled, the compiler hoists every row's window: 210-228 registers for bf16 7x7)
    for (int r = 0; r < KR; ++r) {
        float2 win[kWindow];
#pragma unroll
        for (int j = 0; j < kWindow; ++j) {
            const unsigned w = base[r * RP + j * 16];
            win[j] = make_float2(elem_of<T>(w, 0), elem_of<T>(w, 1));
        }
#pragma unroll
        for (int s = 0; s < KR; ++s) {
            const float2 wv = s_w[r * KR + s][pair];
#pragma unroll
            for (int q = 0; q < QT; ++q) {
                acc[q][0] = fmaf(win[q * SR + s].x, wv.x, acc[q][0]);
                acc[q][1] = fmaf(win[q * SR + s].y, wv.y, acc[q][1]);
            }
        }
    }
    const int op = p0 + row;
    if (op >= P || c >= C) return;
    const i64 o = ((static_cast<i64>(blockIdx.z) * P + op) * Q) * C + c;
#pragma unroll
    for (int q = 0; q < QT; ++q) {
        const int oq = q0 + qg * QT + q;
        const i64 at = o + static_cast<i64>(oq) * C;
        if (oq < Q)
            *reinterpret_cast<unsigned*>(out + at) = cuconv::pair_word<T>(cuconv::epilogue_if<kEpi>(acc[q][0], epi, res, at),
                                                                        cuconv::epilogue_if<kEpi>(acc[q][1], epi, res, at + 1));
    }
}

// depthwise_nhwc_dgrad<T, Index>(dy, wt, dx, ConvGeometry, total)
//     multiplier 1, any stride and dilation: a thread per (dx pixel, V adjacent channels), flat over the batch
//     with the channels fastest; per tap whose output position (h + pad - r·dil) / stride is whole and inside
//     dy, one 16-byte load of dy and one of wt (the weight as (R·S, C), not flipped), V FMAs in Acc<T>; one
//     16-byte store (a gather: no atomics, every dx element written once).
template <typename T, typename Index>
__global__ void __launch_bounds__(256)
depthwise_nhwc_dgrad(const T* __restrict__ dy, const T* __restrict__ wt, T* __restrict__ dx,
                     const cuconv::ConvGeometry g, long long total) {
    using Acc = typename cuconv::Acc<T>::type;
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const Index vectors = static_cast<Index>(g.c / V), w_count = static_cast<Index>(g.w);
    const Index h_count = static_cast<Index>(g.h), p_count = static_cast<Index>(g.p), q_count = static_cast<Index>(g.q);
    const Index c = static_cast<Index>(g.c);
    const int r_count = static_cast<int>(g.r), s_count = static_cast<int>(g.s);
    const int sh = static_cast<int>(g.stride_h), sw = static_cast<int>(g.stride_w);
    for (Index i = static_cast<Index>(blockIdx.x) * 256 + static_cast<Index>(threadIdx.x);
         i < static_cast<Index>(total); i += static_cast<Index>(gridDim.x) * 256) {
        const Index v = i % vectors, pix = i / vectors;
        const Index iw = pix % w_count, rest = pix / w_count, ih = rest % h_count, n = rest / h_count;
        const Index c0 = v * V;
        Acc acc[V];
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = Acc(0);
        const T* __restrict__ dyn = dy + static_cast<i64>(n) * p_count * q_count * c + c0;
        for (int r = 0; r < r_count; ++r) {
            const Index ph = ih + static_cast<Index>(g.pad_top) - r * static_cast<Index>(g.dil_h);
            if (ph < 0 || ph % sh != 0 || ph / sh >= p_count) continue;
            const Index op = ph / sh;
            for (int s = 0; s < s_count; ++s) {
                const Index pw = iw + static_cast<Index>(g.pad_left) - s * static_cast<Index>(g.dil_w);
                if (pw < 0 || pw % sw != 0 || pw / sw >= q_count) continue;
                const T* __restrict__ dyp = dyn + (static_cast<i64>(op) * q_count + pw / sw) * c;
                const uint4 dv = __ldg(reinterpret_cast<const uint4*>(dyp));
                const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wt + static_cast<i64>(r * s_count + s) * c + c0));
#pragma unroll
                for (int e = 0; e < V; ++e) acc[e] = fma(elem_of<T>(dv, e), elem_of<T>(wv, e), acc[e]);
            }
        }
        store_vector<T>(dx + static_cast<i64>(pix) * c + c0, acc);
    }
}

// depthwise_nhwc_wgrad<T, KS, SW>(x, dy, partial, ConvGeometry, rows_per_slice, vpb, lanes)
//     multiplier 1, kernels of up to kDwNhwcMaxS columns. Grid (ceil(C/V / vpb), slices) of 256-thread blocks,
//     V = 8 / sizeof(T) adjacent channels a thread (8-byte vectors: a kernel row's S·V sums and a chunk's
//     inputs fit in registers with two blocks per SM). Thread t of a block takes vector vl = t % vpb of the
//     block's vpb, kernel row r = t / vpb % R and row lane t / (vpb·R) of `lanes`: over the dy rows first + lane,
//     first + lane + lanes, ... of its slice it sums S·V products dy[n, p, q, c] · x[n, ih(p, r), iw(q, s), c].
//     The block's threads cover a band of consecutive dy rows and every kernel row of their channels together,
//     so that each x row comes from L2 about once per slice and its R uses hit L1.
//     KS > 0 and SW = 1 or 2 (dilation 1 along w): a row is walked in chunks of U output columns (wgrad_chunk);
//     a chunk's NQ <= U dy vectors and the (NQ - 1)·SW + KS input columns they read are loaded first (all in
//     flight together), each converted once, and column j of the chunk feeds tap s of output u where
//     j = u·SW + s: compile-time pairs, NQ compile-time too (the row's last chunk is dispatched on its count),
//     so no product of an output past Q is formed and a chunk inside the row checks no bounds. KS = 0, SW = 0:
//     S, stride and dilation at run time, per output one dy load and S input loads. Input columns outside the
//     row are zeros.
//     The lanes' sums are added through shared memory in lane order, and the block writes its partial sums
//     partial[slice][r·S + s][c] in Acc<T>; depthwise_nhwc_wgrad_reduce adds the slices in order into
//     dw (C, 1, R, S): deterministic, no atomics.
constexpr int kDwNhwcMaxS = 8;

// One chunk of depthwise_nhwc_wgrad's input-window path: NQ outputs from dyc (a vector every cc elements) and
// the (NQ - 1)·SW + KS input columns from xc (column iw0 of the row; with kCheck, columns outside [0, w_count)
// read as zeros).
template <typename T, int KS, int SW, int NQ, bool kCheck>
__device__ __forceinline__ void wgrad_chunk(typename cuconv::Acc<T>::type (&acc)[KS][8 / sizeof(T)],
                                            const T* __restrict__ dyc, const T* __restrict__ xc, int cc, int iw0,
                                            int w_count) {
    using Acc = typename cuconv::Acc<T>::type;
    constexpr int V = 8 / static_cast<int>(sizeof(T)), SPAN = (NQ - 1) * SW + KS;
    uint2 dv[NQ], xv[SPAN];
#pragma unroll
    for (int u = 0; u < NQ; ++u) dv[u] = __ldg(reinterpret_cast<const uint2*>(dyc + u * cc));
#pragma unroll
    for (int j = 0; j < SPAN; ++j) {
        const bool inside = !kCheck || (iw0 + j >= 0 && iw0 + j < w_count);
        xv[j] = inside ? __ldg(reinterpret_cast<const uint2*>(xc + j * cc)) : make_uint2(0u, 0u);
    }
    Acc df[NQ][V];
#pragma unroll
    for (int u = 0; u < NQ; ++u)
#pragma unroll
        for (int e = 0; e < V; ++e) df[u][e] = elem_of<T>(dv[u], e);
#pragma unroll
    for (int j = 0; j < SPAN; ++j) {
        Acc xf[V];
#pragma unroll
        for (int e = 0; e < V; ++e) xf[e] = elem_of<T>(xv[j], e);
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            if (j < s || (j - s) % SW != 0 || (j - s) / SW >= NQ) continue;  // (compile time)
#pragma unroll
            for (int e = 0; e < V; ++e) acc[s][e] = fma(xf[e], df[(j - s) / SW][e], acc[s][e]);
        }
    }
}

// The row's last chunk, of q_left < U outputs: wgrad_chunk with NQ = q_left.
template <typename T, int KS, int SW, int NQ>
__device__ __forceinline__ void wgrad_tail(typename cuconv::Acc<T>::type (&acc)[KS][8 / sizeof(T)],
                                           const T* __restrict__ dyc, const T* __restrict__ xc, int cc, int iw0,
                                           int w_count, int q_left) {
    if constexpr (NQ > 0) {
        if (q_left == NQ) wgrad_chunk<T, KS, SW, NQ, true>(acc, dyc, xc, cc, iw0, w_count);
        else wgrad_tail<T, KS, SW, NQ - 1>(acc, dyc, xc, cc, iw0, w_count, q_left);
    }
}

template <typename T, int KS, int SW>
__global__ void __launch_bounds__(256, 2)
depthwise_nhwc_wgrad(const T* __restrict__ x, const T* __restrict__ dy,
                     typename cuconv::Acc<T>::type* __restrict__ partial, const cuconv::ConvGeometry g,
                     long long rows_per_slice, int vpb, int lanes) {
    using Acc = typename cuconv::Acc<T>::type;
    constexpr int V = 8 / static_cast<int>(sizeof(T));
    constexpr int S_MAX = KS > 0 ? KS : kDwNhwcMaxS;
    constexpr bool kWindow = KS > 0 && SW > 0;
    constexpr int U = SW == 1 ? 8 : 4;                           // output columns a chunk
    constexpr int SPAN = kWindow ? (U - 1) * SW + KS : 1;        // input columns a chunk reads
    __shared__ Acc sums[256 * S_MAX * V];
    const int s_count = KS > 0 ? KS : static_cast<int>(g.s), r_count = static_cast<int>(g.r);
    const int per_lane = vpb * r_count, tid = threadIdx.x;
    const int lane = tid / per_lane, r = tid % per_lane / vpb, vl = tid % vpb;
    const long long vectors = g.c / V, v = static_cast<long long>(blockIdx.x) * vpb + vl;
    const bool live = lane < lanes && v < vectors;
    const long long c0 = v * V;
    Acc acc[S_MAX][V];
#pragma unroll
    for (int s = 0; s < S_MAX; ++s)
#pragma unroll
        for (int e = 0; e < V; ++e) acc[s][e] = Acc(0);
    const long long rows = g.n * g.p;
    const long long first = static_cast<long long>(blockIdx.y) * rows_per_slice;
    const long long last = min(rows, first + rows_per_slice);
    // (a row's offsets in 32 bits: W·C and Q·C elements are below 2^31, as the Python twin checks)
    const int cc = static_cast<int>(g.c), q_count = static_cast<int>(g.q), w_count = static_cast<int>(g.w);
    const int sw = static_cast<int>(g.stride_w), pw = static_cast<int>(g.pad_left), dw = static_cast<int>(g.dil_w);
    if (live) {
        for (long long row = first + lane; row < last; row += lanes) {
            const long long n = row / g.p, op = row - n * g.p;
            const long long ih = op * g.stride_h - g.pad_top + r * g.dil_h;
            if (ih < 0 || ih >= g.h) continue;
            const T* __restrict__ dyr = dy + row * g.q * g.c + c0;
            const T* __restrict__ xr = x + (n * g.h + ih) * g.w * g.c + c0;
            if constexpr (kWindow) {
                for (int q0 = 0; q0 < q_count; q0 += U) {
                    const int iw0 = q0 * SW - pw;
                    const T* __restrict__ dyc = dyr + q0 * cc;
                    const T* __restrict__ xc = xr + iw0 * cc;
                    if (q0 + U > q_count)
                        wgrad_tail<T, KS, SW, U - 1>(acc, dyc, xc, cc, iw0, w_count, q_count - q0);
                    else if (iw0 >= 0 && iw0 + SPAN <= w_count)
                        wgrad_chunk<T, KS, SW, U, false>(acc, dyc, xc, cc, iw0, w_count);
                    else
                        wgrad_chunk<T, KS, SW, U, true>(acc, dyc, xc, cc, iw0, w_count);
                }
            } else {
                for (int oq = 0; oq < q_count; ++oq) {
                    const uint2 dv = __ldg(reinterpret_cast<const uint2*>(dyr + oq * cc));
                    const int iw0 = oq * sw - pw;
#pragma unroll
                    for (int s = 0; s < S_MAX; ++s) {
                        const int iw = iw0 + s * dw;
                        if (s >= s_count || iw < 0 || iw >= w_count) continue;
                        const uint2 xv = __ldg(reinterpret_cast<const uint2*>(xr + iw * cc));
#pragma unroll
                        for (int e = 0; e < V; ++e) acc[s][e] = fma(elem_of<T>(xv, e), elem_of<T>(dv, e), acc[s][e]);
                    }
                }
            }
        }
    }
    // sums[lane][r][s][vl][e]: the lanes' sums of one (r, s, channel) lanes·per_lane·S_MAX·V apart
    const int stride = per_lane * S_MAX * V;
    if (lane < lanes)
#pragma unroll
        for (int s = 0; s < S_MAX; ++s)
#pragma unroll
            for (int e = 0; e < V; ++e) sums[lane * stride + ((r * S_MAX + s) * vpb + vl) * V + e] = acc[s][e];
    __syncthreads();
    for (int i = tid; i < stride; i += 256) {
        const int e = i % V, vi = i / V % vpb, rs = i / (V * vpb), s = rs % S_MAX, ri = rs / S_MAX;
        const long long ch = (static_cast<long long>(blockIdx.x) * vpb + vi) * V + e;
        if (s >= s_count || ch >= g.c) continue;
        Acc sum = sums[i];
        for (int l = 1; l < lanes; ++l) sum += sums[l * stride + i];  // in lane order
        partial[(static_cast<long long>(blockIdx.y) * r_count * s_count + ri * s_count + s) * g.c + ch] = sum;
    }
}

// depthwise_nhwc_wgrad_reduce<T>(partial, dw, slices, C, taps): dw[c·taps + t] = Σ over slices j of
//     partial[j][t][c]. Block (32, 8) of grid (ceil(C / 32), taps): thread x a channel (a warp's reads of a
//     slice are 32 consecutive sums), y a slice lane adding slices y, y + 8, ... in order; the 8 lanes' sums are
//     then added in lane order (deterministic).
template <typename T>
__global__ void __launch_bounds__(256)
depthwise_nhwc_wgrad_reduce(const typename cuconv::Acc<T>::type* __restrict__ partial, T* __restrict__ dw,
                            long long slices, long long c, long long taps) {
    using Acc = typename cuconv::Acc<T>::type;
    __shared__ Acc lanes[8][32];
    const long long ch = static_cast<long long>(blockIdx.x) * 32 + threadIdx.x, t = blockIdx.y;
    Acc sum = 0;
    if (ch < c)
        for (long long j = threadIdx.y; j < slices; j += 8) sum += partial[(j * taps + t) * c + ch];
    lanes[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
#pragma unroll
        for (int l = 1; l < 8; ++l) sum += lanes[l][threadIdx.x];
        dw[ch * taps + t] = cuconv::from_acc<T>(sum);
    }
}