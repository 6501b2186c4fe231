// LayerNorm over the last axis of a row-major (rows, C) tensor, without its affine transform: ConvNeXt's norm of a
// depthwise convolution's channels-last output, whose weight and bias the Linear after it takes into its own
// (cuconv/nn/fuse_linear.py). The result is rounded once to the type the Linear computes in.
//
// Kernel   layer_norm_rows<TI, TO, VPL>(x, y, rows, C, eps)
//            y[r, j] = (x[r, j] - mean_r) / sqrt(var_r + eps), mean and the biased variance over j < C computed in
//            fp32 (two passes over the row held in registers: no cancellation), one rounding to TO.
//   TI       the input's storage type (float, __half, __nv_bfloat16); TO the result's (__half, __nv_bfloat16)
//   VPL      values a lane holds: a row of C <= 32·VPL elements, lane l taking j = l, l + 32, ...
// Mapping: a warp a row (the loads of a warp 32 consecutive elements: coalesced), 8 rows a block of 256 threads;
//   the sums are warp shuffles.
#include "common.cuh"

using cuconv::i64;

namespace {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

}  // namespace

template <typename TI, typename TO, int VPL>
__global__ void __launch_bounds__(256) layer_norm_rows(const TI* __restrict__ x, TO* __restrict__ y, i64 rows,
                                                       int c, float eps) {
    const int lane = threadIdx.x & 31;
    const i64 row = static_cast<i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // (a whole warp: the shuffles below see every lane of a live row)
    const TI* xr = x + row * c;
    float v[VPL];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
        const int j = lane + 32 * i;
        v[i] = j < c ? static_cast<float>(cuconv::to_acc<TI>(xr[j])) : 0.0f;
        sum += v[i];
    }
    const float mean = warp_sum(sum) / static_cast<float>(c);
    float squares = 0.0f;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
        const int j = lane + 32 * i;
        const float d = j < c ? v[i] - mean : 0.0f;
        squares += d * d;
    }
    const float rstd = rsqrtf(warp_sum(squares) / static_cast<float>(c) + eps);
    TO* yr = y + row * c;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
        const int j = lane + 32 * i;
        if (j < c) yr[j] = cuconv::from_acc<TO>((v[i] - mean) * rstd);
    }
}
