// im2col: gather the column matrix of a convolution straight from the unpadded NCHW input.
//
// Kernel   im2col<T>(x, col, ConvGeometry, p0, L, ld, ld_n)
//   T      storage type (__half, __nv_bfloat16, float, double); values are copied, never rounded.
//
// Layouts: x is (nb, C, H, W) contiguous (the nb samples of a chunk). The row of sample n and tap
// (c, r, s) holds L = rows * Q values (output rows [p0, p0 + rows), row-major over (p, q)) and starts at
// col + n * ld_n + ((c*R + r)*S + s) * ld, followed by zeros up to the next multiple of V = 16 / sizeof(T)
// elements (every row starts 16-byte aligned, every thread writes whole 16-byte vectors; ld and ld_n are
// multiples of V). Two layouts use this:
//   ld_n = C*R*S * ld: (nb, C*R*S, ld), one sample's matrix after another (forward and dgrad GEMMs);
//   ld = nb * ld_n:    (C*R*S, nb, ld_n), every row of taps holding the nb samples one after another, so
//                      that one GEMM reduces over samples and positions together (wgrad; the zeros between
//                      samples add nothing to it).
// One group's rows are contiguous in both.
//
// Mapping: blockIdx.x = one column-matrix row (n, c, r, s), decoded once per block; blockIdx.y = a
// segment of kItems * blockDim.x * V columns of that row. Each thread gathers kItems vectors (all loads
// in flight before the first store) and writes each with one 16-byte store, coalesced across the warp.
// Fast path: a vector lying in one output row, inside the image, with stride_w == 1 is V plain loads;
// otherwise each element resolves padding, stride and dilation itself (taps outside the image are 0).
// Row and plane offsets are 64-bit (a chunk may pass 2^31 elements); positions inside one row are
// 32-bit because the launcher keeps ld < 2^31 - 2^16 (cuBLAS's int dimensions need that anyway).
//
// Kernel   im2col_nhwc<Unit, Index, kChannelMajor>(x, col, ConvGeometry, units_per_pixel, total)
//   the column matrix of a one-group layer on channels-last x (N, H, W, C): col (N·P·Q, R·S·C), row (n, p, q)
//   holding for each tap (r, s) in turn the C channels of x[n, p·stride_h - pad_top + r·dil_h,
//   q·stride_w - pad_left + s·dil_w, :] (zeros where that falls in the padding): the (r, s, c) order of a
//   channels-last weight's rows; kChannelMajor: the (c, r, s) order of a KCRS weight's rows (a unit an
//   element). Bytes are copied in Units (uint4 where a pixel's channels are whole 16-byte vectors and both
//   pointers 16-byte aligned, down to 2-byte words), a thread a unit, flat over col; Index int where every unit
//   offset fits 31 bits.
#include "common.cuh"

using cuconv::i64;

constexpr int kItems = 4;  // 16-byte vectors per thread per segment

template <typename T>
__global__ void __launch_bounds__(256)
im2col(const T* __restrict__ x, T* __restrict__ col, const cuconv::ConvGeometry geo, i64 p0, i64 L, i64 ld,
       i64 ld_n) {
    const i64 C = geo.c, H = geo.h, W = geo.w, R = geo.r, S = geo.s, Q = geo.q;
    const i64 stride_h = geo.stride_h, stride_w = geo.stride_w, pad_top = geo.pad_top, pad_left = geo.pad_left;
    const i64 dil_h = geo.dil_h, dil_w = geo.dil_w;
    constexpr int V = cuconv::VecWidth<T>::value;
    // 32-bit decode (grid.x < 2^31): a 64-bit division is a ~100-instruction routine per thread.
    const int row = blockIdx.x;
    const int Si = static_cast<int>(S), RSi = static_cast<int>(R * S), CRSi = static_cast<int>(C * R * S);
    const int s = row % Si;
    const int r = (row / Si) % static_cast<int>(R);
    const T* __restrict__ plane = x + static_cast<i64>(row / RSi) * H * W;  // (n*C + c)-th input plane
    const int n = row / CRSi;
    T* __restrict__ out = col + static_cast<i64>(n) * ld_n + static_cast<i64>(row - n * CRSi) * ld;

    const int Hi = static_cast<int>(H), Wi = static_cast<int>(W), Qi = static_cast<int>(Q);
    const int Li = static_cast<int>(L);
    const int sh = static_cast<int>(stride_h), sw = static_cast<int>(stride_w);
    const int h_base = static_cast<int>(p0 * stride_h + r * dil_h - pad_top);  // ih of output row p0
    const int w_base = static_cast<int>(s * dil_w - pad_left);                 // iw of output column 0
    const int seg_len = kItems * blockDim.x * V;

    for (int seg = blockIdx.y * seg_len; seg < Li; seg += gridDim.y * seg_len) {
        cuconv::Vec16<T> vec[kItems];
#pragma unroll
        for (int it = 0; it < kItems; ++it) {
            const int j0 = seg + (it * blockDim.x + threadIdx.x) * V;
            int p = j0 / Qi;
            int q = j0 - p * Qi;
            const int ih0 = h_base + p * sh;
            const int iw0 = w_base + q;
            if (sw == 1 && q + V <= Qi && ih0 >= 0 && ih0 < Hi && iw0 >= 0 && iw0 + V <= Wi) {
                const T* __restrict__ src = plane + static_cast<i64>(ih0) * W + iw0;
#pragma unroll
                for (int e = 0; e < V; ++e) vec[it].v[e] = src[e];
                continue;
            }
            // (a vector that crosses L crosses an output row, so it takes this path: zeros past L)
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const int ih = h_base + p * sh;
                const int iw = w_base + q * sw;
                const bool inside = j0 + e < Li && ih >= 0 && ih < Hi && iw >= 0 && iw < Wi;
                vec[it].v[e] = inside ? plane[static_cast<i64>(ih) * W + iw] : cuconv::zero<T>();
                if (++q == Qi) { q = 0; ++p; }
            }
        }
#pragma unroll
        for (int it = 0; it < kItems; ++it) {
            const int j0 = seg + (it * blockDim.x + threadIdx.x) * V;
            if (j0 < Li) *reinterpret_cast<cuconv::Vec16<T>*>(out + j0) = vec[it];
        }
    }
}

template <typename Unit, typename Index, bool kChannelMajor>
__global__ void __launch_bounds__(256)
im2col_nhwc(const Unit* __restrict__ x, Unit* __restrict__ col, const cuconv::ConvGeometry g, long long units_per_pixel,
            long long total) {
    const Index per = static_cast<Index>(units_per_pixel), q_count = static_cast<Index>(g.q);
    const Index p_count = static_cast<Index>(g.p), h = static_cast<Index>(g.h), w = static_cast<Index>(g.w);
    const Index s_count = static_cast<Index>(g.s), taps = static_cast<Index>(g.r) * s_count;
    const Index sh = static_cast<Index>(g.stride_h), sw = static_cast<Index>(g.stride_w);
    const Index pt = static_cast<Index>(g.pad_top), pl = static_cast<Index>(g.pad_left);
    const Index dh = static_cast<Index>(g.dil_h), dw = static_cast<Index>(g.dil_w);
    for (Index i = static_cast<Index>(blockIdx.x) * 256 + static_cast<Index>(threadIdx.x);
         i < static_cast<Index>(total); i += static_cast<Index>(gridDim.x) * 256) {
        Index u, tap, pix;
        if constexpr (kChannelMajor) {
            const Index rest = i / taps;
            tap = i - rest * taps, u = rest % per, pix = rest / per;
        } else {
            const Index rest = i / per;
            u = i - rest * per, tap = rest % taps, pix = rest / taps;
        }
        const Index q = pix % q_count, t = pix / q_count, p = t % p_count, n = t / p_count;
        const Index r = tap / s_count, s = tap - r * s_count;
        const Index ih = p * sh - pt + r * dh, iw = q * sw - pl + s * dw;
        Unit v{};  // (zero-initialised: the padding)
        if (ih >= 0 && ih < h && iw >= 0 && iw < w) v = x[((n * h + ih) * w + iw) * per + u];
        col[i] = v;
    }
}
