// im2col: gather the column matrix of a convolution straight from the unpadded NCHW input.
//
// Kernel   im2col<T, kVec>(x, col, ...)
//   T      storage type (__half, __nv_bfloat16, float, double); values are copied, never rounded.
//   kVec   true when every column-matrix row length L is a multiple of 16 / sizeof(T), so each
//          thread writes one aligned 16-byte vector; false: the same mapping with scalar stores.
//
// Layouts: x is (nb, C, H, W) contiguous (nb samples of a chunk); col is (nb, C*R*S, L) contiguous
// with L = rows * Q: the output rows [p0, p0 + rows) of every sample, row-major over (p, q).
// Column-matrix row index (n, c, r, s) = ((n*C + c)*R + r)*S + s, so a group's rows are contiguous.
//
// Mapping: blockIdx.x = one column-matrix row (decoded once per block), threads stride along L.
// Writes are coalesced 16-byte stores; reads of x are coalesced along q when stride_w == 1 and come
// from L1/L2 otherwise (each input element is read R*S times but fetched from DRAM about once).
// Padding, stride and dilation are resolved in the index arithmetic: out-of-image taps read as zero.
// Offsets into x and col are 64-bit: a column chunk may pass 2^31 elements.
#include "common.cuh"

using cuconv::i64;

template <typename T, bool kVec>
__global__ void im2col(const T* __restrict__ x, T* __restrict__ col,
                       i64 C, i64 H, i64 W, i64 R, i64 S, i64 Q, i64 p0, i64 L,
                       i64 stride_h, i64 stride_w, i64 pad_top, i64 pad_left,
                       i64 dil_h, i64 dil_w) {
    constexpr int V = cuconv::VecWidth<T>::value;
    const i64 row = blockIdx.x;                       // (n, c, r, s) flattened
    const int s = static_cast<int>(row % S);
    const int r = static_cast<int>((row / S) % R);
    const i64 nc = row / (R * S);                     // n * C + c
    const T* __restrict__ plane = x + nc * H * W;
    T* __restrict__ out = col + row * L;
    const int h_off = static_cast<int>(r * dil_h - pad_top);
    const int w_off = static_cast<int>(s * dil_w - pad_left);
    const int Hi = static_cast<int>(H), Wi = static_cast<int>(W);
    const int Qi = static_cast<int>(Q);

    for (i64 j0 = (static_cast<i64>(blockIdx.y) * blockDim.x + threadIdx.x) * V; j0 < L;
         j0 += static_cast<i64>(gridDim.y) * blockDim.x * V) {
        int p = static_cast<int>(j0 / Q);
        int q = static_cast<int>(j0 - static_cast<i64>(p) * Q);
        cuconv::Vec16<T> vec;
#pragma unroll
        for (int e = 0; e < V; ++e) {
            const int ih = static_cast<int>((p0 + p) * stride_h) + h_off;
            const int iw = static_cast<int>(q * stride_w) + w_off;
            const bool inside = ih >= 0 && ih < Hi && iw >= 0 && iw < Wi;
            vec.v[e] = inside ? plane[static_cast<i64>(ih) * W + iw] : cuconv::zero<T>();
            if (++q == Qi) { q = 0; ++p; }
        }
        if (kVec) {
            *reinterpret_cast<cuconv::Vec16<T>*>(out + j0) = vec;
        } else {
#pragma unroll
            for (int e = 0; e < V; ++e)
                if (j0 + e < L) out[j0 + e] = vec.v[e];
        }
    }
}
