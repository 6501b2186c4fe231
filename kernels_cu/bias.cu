// bias_add: out[n, k, :] += bias[k] on an NCHW-contiguous output, in place.
//
// Kernel   bias_add<T>(out, bias, K, PQ)
//   T      storage type; the sum is formed in the arithmetic type (float for half types) and rounded once.
// Mapping: blockIdx.x = one (n, k) output plane, threads stride along its P*Q elements.
// Used by algorithms whose GEMM cannot fuse the bias (cuBLAS has no per-row bias epilogue here).
#include "common.cuh"

using cuconv::i64;

template <typename T>
__global__ void bias_add(T* __restrict__ out, const T* __restrict__ bias, i64 K, i64 PQ) {
    const i64 plane = blockIdx.x;
    const auto b = cuconv::to_acc(bias[plane % K]);
    T* __restrict__ dst = out + plane * PQ;
    for (i64 j = static_cast<i64>(blockIdx.y) * blockDim.x + threadIdx.x; j < PQ;
         j += static_cast<i64>(gridDim.y) * blockDim.x) {
        dst[j] = cuconv::from_acc<T>(cuconv::to_acc(dst[j]) + b);
    }
}
