// Device code the depthwise kernels (kernels_cu/depthwise/*.cu) share: the structs their launches pass by value
// (DwWork, DwGeometry; their NumPy twins in cuconv/algos/depthwise/shared.py), the 16-byte output vector, the
// staging constant of the tiled kernels, the column-strip kernels' row load and row vectors' elements.
#pragma once
#include "common.cuh"
#include "mma.cuh"

using cuconv::i64;

// What a launch of the 64-bit-indexed kernels (depthwise_fwd, _strips, _rows, _plane, depthwise_dgrad,
// depthwise_wgrad_partial) takes besides the cuconv::ConvGeometry (C = groups, K = C·mult): each kernel reads
// its own fields, the others are zero (DW_WORK_DTYPE in cuconv/algos/depthwise/shared.py has this layout).
// mult: K / C (every kernel; computed on the host: a 64-bit division costs registers); total: work items;
// tiles_q: output tiles along q; rows, strips: output rows per strip and strips per plane; items: strips' work
// items; slots, segs, seg_lanes: the rows kernel's warp slots, row segments and lanes per
// segment; lead, pitch, stages: the plane kernel's buffer layout; chunk: work items per block.
struct DwWork {
    long long mult, total, tiles_q, rows, strips, items, slots, segs, seg_lanes, lead, pitch, stages, chunk, flip;
};
static_assert(sizeof(DwWork) == 112, "DW_WORK_DTYPE in cuconv/algos/depthwise/shared.py has this layout");

// Geometry of the gather kernels, passed by value (DW_GEOMETRY_DTYPE in cuconv/algos/depthwise/shared.py has this
// layout). `total` counts the threads' work items (outputs, or 2x2 quads of dx); the launcher keeps it below
// 2^31 so every decode is 32-bit.
// wgrad's strips: `rows` output rows per strip, `strips` per plane, `chunk` work items per block.
struct DwGeometry {
    int n, c, h, w, k, p, q, mult, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, total, rows, strips, chunk,
        flip;
};
static_assert(sizeof(DwGeometry) == 76, "DW_GEOMETRY_DTYPE in cuconv/algos/depthwise/shared.py has this layout");

// Input-window elements each thread of the tiled kernels (depthwise_fwd, depthwise_nhwc_fwd_tile) loads per batch
// (depthwise_fwd's 34 x 66 = 2244 < 12 x 256).
constexpr int kLoads = 12;

// A 16-byte (or 8-byte) vector of V = kBytes / sizeof(T) elements, stored with one store (depthwise_fwd_rows'
// output rows, the channels-last kernels' V adjacent channels of a pixel).
template <typename T, int kBytes> struct alignas(kBytes) RowsOut {
    T v[kBytes / sizeof(T)];
};

// One input row of the column-strip kernels (forward strips, plane, rows; wgrad strips): dst[s] =
// x_plane[ih][iw0 + s], zero outside the plane (col_ok[s]: column iw0 + s is inside).
template <int KS, typename T, typename Acc>
__device__ __forceinline__ void strip_row(Acc (&dst)[KS], const T* __restrict__ x_plane, int ih, int H, i64 W,
                                          int iw0, const bool (&col_ok)[KS]) {
    const bool row_ok = static_cast<unsigned>(ih) < static_cast<unsigned>(H);
    const T* __restrict__ src = x_plane + static_cast<i64>(row_ok ? ih : 0) * W + iw0;
#pragma unroll
    for (int s = 0; s < KS; ++s) dst[s] = row_ok && col_ok[s] ? cuconv::to_acc(src[s]) : Acc(0);
}

// Word i of a row vector held as 32-bit words; i is a compile-time constant once the caller's loops are
// unrolled.
__device__ __forceinline__ unsigned word_of(const uint4& u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}
__device__ __forceinline__ unsigned word_of(const uint2& u, int i) {
    return i == 0 ? u.x : u.y;
}
__device__ __forceinline__ unsigned word_of(unsigned u, int) { return u; }

// Element e of a row vector of T held as words, in the arithmetic type. Rows travel as words so that loads,
// zero fills and window moves are whole 32-bit registers: as a vector of halves the compiler moved every
// 16-bit element separately (~60 PRMT per step of 3 rows, a sixth of the loop's instructions).
template <typename T> struct ElemOf;
template <> struct ElemOf<float> {
    template <typename Raw> static __device__ __forceinline__ float get(const Raw& u, int e) {
        return __uint_as_float(word_of(u, e));
    }
};
template <> struct ElemOf<double> {
    template <typename Raw> static __device__ __forceinline__ double get(const Raw& u, int e) {
        return __hiloint2double(static_cast<int>(word_of(u, 2 * e + 1)), static_cast<int>(word_of(u, 2 * e)));
    }
};
template <> struct ElemOf<__half> {
    template <typename Raw> static __device__ __forceinline__ float get(const Raw& u, int e) {
        const unsigned w = word_of(u, e / 2);
        const __half2 h = *reinterpret_cast<const __half2*>(&w);
        return e % 2 ? __high2float(h) : __low2float(h);
    }
};
template <> struct ElemOf<__nv_bfloat16> {
    template <typename Raw> static __device__ __forceinline__ float get(const Raw& u, int e) {
        const unsigned w = word_of(u, e / 2);  // a bfloat16 is the high half of its float
        return __uint_as_float(e % 2 ? w & 0xffff0000u : w << 16);
    }
};
template <typename T, typename Raw>
__device__ __forceinline__ typename cuconv::Acc<T>::type elem_of(const Raw& u, int e) {
    return ElemOf<T>::get(u, e);
}
