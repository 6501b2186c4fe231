// direct: the plain convolution, one thread per output element; the baseline every other kernel is
// measured against, written to be obviously right rather than fast.
//
// Kernel   direct<T>(x, w, bias, out, ConvGeometry)
//   T      storage type (__half, __nv_bfloat16, float, double); products are summed in cuconv::Acc<T>
//          (float for the half types, double for double), the bias is added in that type and the sum is
//          rounded to T once, at the store.
//
// Layouts: x (N, C, H, W), w (K, C/groups, R, S), out (N, K, P, Q), bias (K,) or a null pointer; all
// contiguous. Output channel k belongs to group k / (K/groups) and reads that group's C/groups input
// channels.
//
// Mapping: a grid-stride loop over the N*K*P*Q outputs in memory order, so the threads of a warp share
// (n, k) and mostly p: their weight reads are warp-uniform and, at stride 1, their input reads
// consecutive. Each output sums c, r, s in that order over the taps that fall inside the image (the
// padding contributes zero). Output and plane offsets are 64-bit; positions inside one plane are int.
#include "common.cuh"

using cuconv::i64;

template <typename T>
__global__ void __launch_bounds__(256)
direct(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ out,
       const cuconv::ConvGeometry geo) {
    typedef typename cuconv::Acc<T>::type Acc;
    const i64 N = geo.n, C = geo.c, H = geo.h, W = geo.w, K = geo.k, P = geo.p, Q = geo.q, R = geo.r, S = geo.s;
    const i64 groups = geo.groups, stride_h = geo.stride_h, stride_w = geo.stride_w, pad_top = geo.pad_top;
    const i64 pad_left = geo.pad_left, dil_h = geo.dil_h, dil_w = geo.dil_w;
    const i64 total = N * K * P * Q;
    const i64 c_per_group = C / groups, k_per_group = K / groups;
    const int Hi = static_cast<int>(H), Wi = static_cast<int>(W), Ri = static_cast<int>(R);
    const int Si = static_cast<int>(S);
    for (i64 idx = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += static_cast<i64>(gridDim.x) * blockDim.x) {
        const int q = static_cast<int>(idx % Q);
        const int p = static_cast<int>((idx / Q) % P);
        const i64 k = (idx / (P * Q)) % K;
        const i64 n = idx / (K * P * Q);
        const i64 g = k / k_per_group;
        const T* __restrict__ x_plane = x + (n * C + g * c_per_group) * H * W;  // first plane of the group
        const T* __restrict__ w_tap = w + k * c_per_group * R * S;              // w[k, 0, 0, 0]
        const int ih0 = p * static_cast<int>(stride_h) - static_cast<int>(pad_top);
        const int iw0 = q * static_cast<int>(stride_w) - static_cast<int>(pad_left);

        Acc acc = 0;
        for (i64 c = 0; c < c_per_group; ++c, x_plane += H * W) {
            for (int r = 0; r < Ri; ++r, w_tap += S) {
                const int ih = ih0 + r * static_cast<int>(dil_h);
                if (ih < 0 || ih >= Hi) continue;
                for (int s = 0; s < Si; ++s) {
                    const int iw = iw0 + s * static_cast<int>(dil_w);
                    if (iw < 0 || iw >= Wi) continue;
                    acc += cuconv::to_acc(x_plane[static_cast<i64>(ih) * W + iw]) * cuconv::to_acc(w_tap[s]);
                }
            }
        }
        if (bias != nullptr) acc += cuconv::to_acc(bias[k]);
        out[idx] = cuconv::from_acc<T>(acc);
    }
}
