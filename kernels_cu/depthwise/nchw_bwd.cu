// depthwise: convolutions with groups == C (one input channel per group, K = m·C output channels with
// channel multiplier m), any kernel size, stride, padding and dilation. Memory-bound: every kernel here
// aims to move each input and output element through DRAM about once.
//
// This file: dgrad where it is not the forward of dy (strides, multipliers above 1) and wgrad, on NCHW
// activations. Their planning: cuconv/algos/depthwise/nchw_bwd.py.
//
// Kernels (T: storage type; sums in cuconv::Acc<T>, i.e. float for half types, rounded once):
//   depthwise_dgrad_s2<T, KR, KS>(dy, w, dx, DwGeometry)
//       stride 2×2, dilation 1, 3×3, 5×5, 7×7: one thread per 2×2 quad of dx, each tap serving exactly one
//       of the four (their parities are the same for every quad).
//   depthwise_dgrad<T, kUnitStride, Index>(dy, w, dx, ...)   (Index: int when the tensor has < 2^31
//       elements, else long long — 64-bit division is a software routine, so decode in 32 bits if possible)
//       one thread per dx element (n, c, h, w): the gather dx = Σ_{j<m} Σ_{r,s} w[c·m+j, r, s] ·
//       dy[n, c·m+j, p, q] over the (p, q) that read (h, w); dy comes through L1/L2.
//   depthwise_wgrad_strips<T, KR, KS, SH>(x, dy, partial, DwGeometry)
//       3×3, 5×5, 7×7, dilation 1, row stride SH = 1 or 2: per-block partial sums of every tap, a thread per
//       column strip of output rows with its input window and the KR·KS sums in registers (one dy load and
//       SH·KS input loads per output); then depthwise_wgrad_reduce.
//   depthwise_wgrad_partial<T, Index>(x, dy, partial, ...) and depthwise_wgrad_reduce<T>(partial, dw, ...)
//       blockIdx.x = output channel k, blockIdx.y = one chunk of the flattened (n, p, q) space. Each thread
//       accumulates all R·S taps in its own shared-memory column, the block reduces each tap in a fixed
//       tree, and a second kernel sums the chunks in order: deterministic, no atomics.
// Layouts: x/dx (N, C, H, W), w/dw (K, 1, R, S), dy (N, K, P, Q), all contiguous; 64-bit plane offsets.
#include "depthwise/depthwise.cuh"

// dgrad at stride 2x2, dilation 1: one thread per 2x2 quad of dx (rows 2i, 2i+1, columns 2j, 2j+1). Output
// row h reads dy row (h + pad_top - r) / 2 through the taps r of its parity, and the parity of 2i + a + pad_top
// is the same for every quad: each tap serves exactly one of the four outputs (R·S products per quad, no
// divergence), where a thread per dx element would test every tap and use a quarter of them.
template <typename T, int KR, int KS>
__global__ void __launch_bounds__(256)
depthwise_dgrad_s2(const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, DwGeometry g) {
    typedef typename cuconv::Acc<T>::type Acc;
    const int h2 = (g.h + 1) / 2, w2 = (g.w + 1) / 2;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < g.total; idx += gridDim.x * blockDim.x) {
        const int j = idx % w2;
        const int t = idx / w2;
        const int i = t % h2;
        const int nc = t / h2;  // n * C + c
        const int c = nc % g.c, n = nc / g.c;
        Acc acc[2][2] = {{Acc(0), Acc(0)}, {Acc(0), Acc(0)}};
        for (int m = 0; m < g.mult; ++m) {
            const int k = c * g.mult + m;
            const T* __restrict__ dy_plane = dy + (static_cast<i64>(n) * g.k + k) * g.p * g.q;
            const T* __restrict__ w_k = w + static_cast<i64>(k) * (KR * KS);
#pragma unroll
            for (int a = 0; a < 2; ++a) {
#pragma unroll
                for (int r = 0; r < KR; ++r) {
                    const int hp = 2 * i + a + g.pad_top - r;
                    if ((hp & 1) != 0) continue;  // the same for every quad
                    const int p = hp >> 1;  // exact: hp is even
                    if (static_cast<unsigned>(p) >= static_cast<unsigned>(g.p)) continue;
#pragma unroll
                    for (int b = 0; b < 2; ++b) {
#pragma unroll
                        for (int s = 0; s < KS; ++s) {
                            const int wq = 2 * j + b + g.pad_left - s;
                            if ((wq & 1) != 0) continue;
                            const int q = wq >> 1;
                            if (static_cast<unsigned>(q) < static_cast<unsigned>(g.q))
                                acc[a][b] = fma(cuconv::to_acc(w_k[r * KS + s]),
                                                cuconv::to_acc(dy_plane[p * g.q + q]), acc[a][b]);
                        }
                    }
                }
            }
        }
        T* __restrict__ dx_plane = dx + static_cast<i64>(nc) * g.h * g.w;
#pragma unroll
        for (int a = 0; a < 2; ++a) {
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const int h = 2 * i + a, wc = 2 * j + b;
                if (h < g.h && wc < g.w) dx_plane[h * g.w + wc] = cuconv::from_acc<T>(acc[a][b]);
            }
        }
    }
}

// wgrad partial sums, dilation 1, row stride SH (1 or 2, at most KR): work item (n, strip, q) of channel
// k = blockIdx.x / chunks is a column strip of `rows` output rows, walked top-down with the KR x KS input window
// in registers (per row: one dy load, SH new input rows of KS loads, KR·KS FMAs into per-thread accumulators);
// block blockIdx.x % chunks takes items [chunk·b, chunk·(b+1)) over the batch. Each tap's sums are reduced by
// a fixed butterfly per warp and then over the warps in order: deterministic, no atomics; partial[(k·chunks +
// b)·taps + tap] for depthwise_wgrad_reduce.
template <typename T, int KR, int KS, int SH>
__global__ void __launch_bounds__(256)
depthwise_wgrad_strips(const T* __restrict__ x, const T* __restrict__ dy,
                       typename cuconv::Acc<T>::type* __restrict__ partial, DwGeometry g) {
    typedef typename cuconv::Acc<T>::type Acc;
    static_assert(SH >= 1 && SH <= KR, "the window slides SH rows per output row");
    __shared__ Acc warp_sums[8][KR * KS];
    const int chunks = (g.total + g.chunk - 1) / g.chunk;
    const int k = blockIdx.x / chunks, b = blockIdx.x - k * chunks;
    Acc acc[KR][KS];
#pragma unroll
    for (int r = 0; r < KR; ++r)
#pragma unroll
        for (int s = 0; s < KS; ++s) acc[r][s] = Acc(0);
    const int end = min(g.total, (b + 1) * g.chunk);
    for (int item = b * g.chunk + static_cast<int>(threadIdx.x); item < end; item += 256) {
        const int q = item % g.q;
        const int t = item / g.q;
        const int strip = t % g.strips, n = t / g.strips;
        const int p0 = strip * g.rows, p1 = min(g.p, p0 + g.rows);
        const T* __restrict__ x_plane = x + (static_cast<i64>(n) * g.c + k / g.mult) * g.h * g.w;
        const T* __restrict__ dy_plane = dy + (static_cast<i64>(n) * g.k + k) * g.p * g.q;
        const int iw0 = q * g.stride_w - g.pad_left;
        bool col_ok[KS];
#pragma unroll
        for (int s = 0; s < KS; ++s) col_ok[s] = static_cast<unsigned>(iw0 + s) < static_cast<unsigned>(g.w);
        const int ih0 = p0 * SH - g.pad_top;  // window row r of output row p is input row p·SH - pad_top + r
        Acc win[KR][KS];
#pragma unroll
        for (int r = 0; r < KR - SH; ++r) strip_row<KS>(win[r + SH], x_plane, ih0 + r, g.h, g.w, iw0, col_ok);
        for (int p = p0; p < p1; ++p) {
#pragma unroll
            for (int r = 0; r < KR - SH; ++r)
#pragma unroll
                for (int s = 0; s < KS; ++s) win[r][s] = win[r + SH][s];
#pragma unroll
            for (int r = KR - SH; r < KR; ++r)
                strip_row<KS>(win[r], x_plane, (p - p0) * SH + ih0 + r, g.h, g.w, iw0, col_ok);
            const Acc d = cuconv::to_acc(dy_plane[p * g.q + q]);
#pragma unroll
            for (int r = 0; r < KR; ++r)
#pragma unroll
                for (int s = 0; s < KS; ++s) acc[r][s] = fma(d, win[r][s], acc[r][s]);
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < KR; ++r) {
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            Acc v = acc[r][s];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane == 0) warp_sums[warp][r * KS + s] = v;
        }
    }
    __syncthreads();
    for (int tap = threadIdx.x; tap < KR * KS; tap += 256) {
        Acc sum = warp_sums[0][tap];
#pragma unroll
        for (int w8 = 1; w8 < 8; ++w8) sum += warp_sums[w8][tap];
        partial[static_cast<i64>(blockIdx.x) * (KR * KS) + tap] = sum;
    }
}

template <typename T, bool kUnitStride, typename Index>
__global__ void __launch_bounds__(256)
depthwise_dgrad(const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
                const cuconv::ConvGeometry geo, const DwWork work) {
    const i64 total = work.total, C = geo.c, H = geo.h, W = geo.w, K = geo.k, R = geo.r, S = geo.s, P = geo.p;
    const i64 Q = geo.q, mult = work.mult, stride_h = geo.stride_h, stride_w = geo.stride_w;
    const i64 pad_top = geo.pad_top, pad_left = geo.pad_left, dil_h = geo.dil_h, dil_w = geo.dil_w;
    typedef typename cuconv::Acc<T>::type Acc;
    const int sh = static_cast<int>(stride_h), sw = static_cast<int>(stride_w);
    const Index Wx = static_cast<Index>(W), Hx = static_cast<Index>(H), Cx = static_cast<Index>(C);
    for (Index idx = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; idx < static_cast<Index>(total);
         idx += static_cast<Index>(gridDim.x) * blockDim.x) {
        const int wi = static_cast<int>(idx % Wx);
        const int h = static_cast<int>((idx / Wx) % Hx);
        const Index nc = idx / (Hx * Wx);
        const i64 c = nc % Cx, n = nc / Cx;
        Acc acc = 0;
        for (i64 j = 0; j < mult; ++j) {
            const i64 k = c * mult + j;
            const T* __restrict__ dy_plane = dy + (n * K + k) * P * Q;
            const T* __restrict__ w_k = w + k * R * S;
            for (int r = 0; r < R; ++r) {
                const int hp = h + static_cast<int>(pad_top - r * dil_h);
                if (hp < 0 || (!kUnitStride && hp % sh != 0)) continue;
                const int p = kUnitStride ? hp : hp / sh;
                if (p >= P) continue;
                for (int s = 0; s < S; ++s) {
                    const int wq = wi + static_cast<int>(pad_left - s * dil_w);
                    if (wq < 0 || (!kUnitStride && wq % sw != 0)) continue;
                    const int q = kUnitStride ? wq : wq / sw;
                    if (q >= Q) continue;
                    acc += cuconv::to_acc(w_k[r * S + s]) * cuconv::to_acc(dy_plane[static_cast<i64>(p) * Q + q]);
                }
            }
        }
        dx[idx] = cuconv::from_acc<T>(acc);
    }
}

template <typename T, typename Index>
__global__ void depthwise_wgrad_partial(const T* __restrict__ x, const T* __restrict__ dy,
                                        typename cuconv::Acc<T>::type* __restrict__ partial,
                                        const cuconv::ConvGeometry geo, const DwWork work) {
    const i64 C = geo.c, H = geo.h, W = geo.w, K = geo.k, R = geo.r, S = geo.s, P = geo.p, Q = geo.q;
    const i64 mult = work.mult, stride_h = geo.stride_h, stride_w = geo.stride_w, pad_top = geo.pad_top;
    const i64 pad_left = geo.pad_left, dil_h = geo.dil_h, dil_w = geo.dil_w, total = work.total;
    const i64 chunk = work.chunk;
    typedef typename cuconv::Acc<T>::type Acc;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Acc* acc = reinterpret_cast<Acc*>(smem_raw);  // acc[tap * blockDim.x + thread]
    const int taps = static_cast<int>(R * S), Si = static_cast<int>(S);
    const int nt = blockDim.x, t = threadIdx.x;
    for (int tap = 0; tap < taps; ++tap) acc[tap * nt + t] = 0;

    const int k = blockIdx.x;
    const i64 c = k / static_cast<int>(mult);
    const Index begin = static_cast<Index>(blockIdx.y) * static_cast<Index>(chunk);
    const Index end = min(static_cast<Index>(total), begin + static_cast<Index>(chunk));
    const Index PQ = static_cast<Index>(P * Q);
    const int Qi = static_cast<int>(Q);
    for (Index idx = begin + t; idx < end; idx += nt) {  // idx over (n, p, q)
        const Index n = idx / PQ;
        const int pq = static_cast<int>(idx - n * PQ);
        const int p = pq / Qi, q = pq - (pq / Qi) * Qi;
        const Acc g = cuconv::to_acc(dy[(static_cast<i64>(n) * K + k) * (P * Q) + pq]);
        const T* __restrict__ x_plane = x + (static_cast<i64>(n) * C + c) * H * W;
        const int ih0 = p * static_cast<int>(stride_h) - static_cast<int>(pad_top);
        const int iw0 = q * static_cast<int>(stride_w) - static_cast<int>(pad_left);
        for (int r = 0; r < R; ++r) {
            const int ih = ih0 + r * static_cast<int>(dil_h);
            if (ih < 0 || ih >= H) continue;
            for (int s = 0; s < Si; ++s) {
                const int iw = iw0 + s * static_cast<int>(dil_w);
                if (iw < 0 || iw >= W) continue;
                acc[(r * Si + s) * nt + t] += g * cuconv::to_acc(x_plane[static_cast<i64>(ih) * W + iw]);
            }
        }
    }
    __syncthreads();
    for (int half = nt / 2; half > 0; half /= 2) {  // fixed tree: deterministic
        if (t < half)
            for (int tap = 0; tap < taps; ++tap) acc[tap * nt + t] += acc[tap * nt + t + half];
        __syncthreads();
    }
    for (int tap = t; tap < taps; tap += nt)
        partial[(static_cast<i64>(k) * gridDim.y + blockIdx.y) * taps + tap] = acc[tap * nt];
}

template <typename T>
__global__ void depthwise_wgrad_reduce(const typename cuconv::Acc<T>::type* __restrict__ partial,
                                       T* __restrict__ dw, i64 K, i64 taps, i64 chunks) {
    typedef typename cuconv::Acc<T>::type Acc;
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < K * taps;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        const i64 k = i / taps, tap = i % taps;
        Acc sum = 0;
        for (i64 j = 0; j < chunks; ++j) sum += partial[(k * chunks + j) * taps + tap];  // in order
        dw[i] = cuconv::from_acc<T>(sum);
    }
}
