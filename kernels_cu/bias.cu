// bias_fill: out[n, k, :] = bias[k] on an NCHW-contiguous output.
//
// Kernel   bias_fill<T>(out, bias, K, PQ)
//   T      storage type.
// Mapping: blockIdx.x = one (n, k) output plane, threads stride along its P*Q elements.
// Why a fill and not an add: the GEMM then accumulates onto the bias (beta = 1), so the sum
// W·col + bias is formed in the GEMM's fp32 (or fp64) arithmetic and rounded to T once. Adding the
// bias after a half-precision GEMM output would round twice (measured: 2.6e-3 normwise in bf16).
#include "common.cuh"

using cuconv::i64;

template <typename T>
__global__ void bias_fill(T* __restrict__ out, const T* __restrict__ bias, i64 K, i64 PQ) {
    const int plane = blockIdx.x;  // grid.x < 2^31: 32-bit modulo (64-bit is a software routine)
    const T b = bias[plane % static_cast<int>(K)];
    T* __restrict__ dst = out + static_cast<i64>(plane) * PQ;
    for (i64 j = static_cast<i64>(blockIdx.y) * blockDim.x + threadIdx.x; j < PQ;
         j += static_cast<i64>(gridDim.y) * blockDim.x) {
        dst[j] = b;
    }
}
