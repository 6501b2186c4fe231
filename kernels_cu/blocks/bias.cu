// The bias of a convolution: broadcast into an NCHW output (forward) and summed out of grad_output (backward).
//
// Kernel   bias_fill<T>(out, bias, K, PQ)       out[n, k, :] = bias[k]
// Kernel   bias_grad<T>(dy, db, N, K, PQ)       db[k] = Σ over n, p, q of dy[n, k, p, q]
//   T      storage type.
// bias_fill: blockIdx.x = one (n, k) output plane, threads stride along its P*Q elements.
// Why a fill and not an add: the GEMM then accumulates onto the bias (beta = 1), so the sum
// W·col + bias is formed in the GEMM's fp32 (or fp64) arithmetic and rounded to T once. Adding the
// bias after a half-precision GEMM output would round twice (measured: 2.6e-3 normwise in bf16).
// bias_grad: blockIdx.x = one channel k; its threads stride along each sample's plane (coalesced), sum in
// the arithmetic type (fp32 for the half types) and reduce in a fixed order: deterministic, no atomics.
// Kernel   bias_fill_flat<T>(out, bias, K, PQ, total)   the same fill, a thread per element (grid-stride,
//          32-bit: total < 2^31): for planes smaller than a block (squeeze-excitation's 1x1), where a block per
//          plane would leave all but PQ threads idle.
// Kernel   bias_grad_warps<T>(dy, db, N, K, PQ)         the same sums, a warp per channel (8 per block) striding
//          over (n, p·q), reduced by a fixed butterfly: for small planes, where a block per channel is one
//          busy thread walking the batch.
// Kernel   bias_fill_vec<T, kBytes>(out, bias, K, plane_vecs, total_vecs)   the same fill in kBytes-wide stores
//          (16, 8 or 4), a thread per vector (grid-stride, 32-bit: total_vecs < 2^30), for a 256-byte aligned out
//          whose planes are whole vectors (plane_vecs of them): a block per plane stores one T at a time and is
//          done after 256 of them, so the plain fill ran at a sixth of the copy bandwidth on 56x56 half planes.
// Kernel   bias_grad_nhwc_part<T>(dy, partials, rows, K, slice_rows)   channels-last grad_output (rows = N·P·Q
//          of K channels): block (32, 8) of grid (K / 32, slices) sums 32 channels over rows [y·slice_rows,
//          (y + 1)·slice_rows), a warp reading 32 adjacent channels of a row, its 8 row lanes added in a fixed
//          order into partials[y][k] (the arithmetic type);
// Kernel   bias_grad_nhwc_sum<T>(partials, db, slices, K)   db[k] = Σ over y, a warp per channel (8 per block):
//          lane l adds slices l, l + 32, ..., then a fixed butterfly: deterministic, no atomics.
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

constexpr int kBiasGradThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kBiasGradThreads) bias_grad(const T* __restrict__ dy, T* __restrict__ db,
                                                              i64 N, i64 K, i64 PQ) {
    typedef typename cuconv::Acc<T>::type Acc;
    __shared__ Acc partial[kBiasGradThreads];
    const i64 k = blockIdx.x;
    Acc sum = 0;
    for (i64 n = 0; n < N; ++n) {
        const T* __restrict__ plane = dy + (n * K + k) * PQ;
        for (i64 j = threadIdx.x; j < PQ; j += kBiasGradThreads) sum += cuconv::to_acc<T>(plane[j]);
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int half = kBiasGradThreads / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) db[k] = cuconv::from_acc<T>(partial[0]);
}

template <typename T>
__global__ void bias_fill_flat(T* __restrict__ out, const T* __restrict__ bias, i64 K, i64 PQ, i64 total) {
    const int k_count = static_cast<int>(K), pq = static_cast<int>(PQ);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < static_cast<int>(total); i += gridDim.x * blockDim.x)
        out[i] = bias[(i / pq) % k_count];
}

template <typename T>
__global__ void __launch_bounds__(256) bias_grad_warps(const T* __restrict__ dy, T* __restrict__ db, i64 N, i64 K,
                                                       i64 PQ) {
    typedef typename cuconv::Acc<T>::type Acc;
    const i64 k = static_cast<i64>(blockIdx.x) * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (k >= K) return;  // whole warps: the butterfly below has every lane of a live warp
    Acc sum = 0;
    for (i64 i = lane; i < N * PQ; i += 32) {
        const i64 n = i / PQ, j = i - n * PQ;
        sum += cuconv::to_acc<T>(dy[(n * K + k) * PQ + j]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) db[k] = cuconv::from_acc<T>(sum);
}

// kBytes of T, stored at once.
template <typename T, int kBytes> struct alignas(kBytes) BiasVec {
    T v[kBytes / sizeof(T)];
};

template <typename T, int kBytes>
__global__ void bias_fill_vec(T* __restrict__ out, const T* __restrict__ bias, i64 K, i64 plane_vecs,
                              i64 total_vecs) {
    const int k_count = static_cast<int>(K), per_plane = static_cast<int>(plane_vecs);
    BiasVec<T, kBytes>* __restrict__ dst = reinterpret_cast<BiasVec<T, kBytes>*>(out);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < static_cast<int>(total_vecs);
         i += gridDim.x * blockDim.x) {
        const T b = bias[(i / per_plane) % k_count];
        BiasVec<T, kBytes> v;
#pragma unroll
        for (int j = 0; j < kBytes / static_cast<int>(sizeof(T)); ++j) v.v[j] = b;
        dst[i] = v;
    }
}

template <typename T>
__global__ void __launch_bounds__(256) bias_grad_nhwc_part(const T* __restrict__ dy,
                                                           typename cuconv::Acc<T>::type* __restrict__ partials,
                                                           i64 rows, i64 K, i64 slice_rows) {
    typedef typename cuconv::Acc<T>::type Acc;
    __shared__ Acc lanes[8][33];
    const i64 k = static_cast<i64>(blockIdx.x) * 32 + threadIdx.x;
    const i64 first = static_cast<i64>(blockIdx.y) * slice_rows;
    const i64 last = min(rows, first + slice_rows);
    Acc sum = 0;
    if (k < K)
        for (i64 row = first + threadIdx.y; row < last; row += 8) sum += cuconv::to_acc<T>(dy[row * K + k]);
    lanes[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && k < K) {
        Acc total = lanes[0][threadIdx.x];
#pragma unroll
        for (int i = 1; i < 8; ++i) total += lanes[i][threadIdx.x];
        partials[static_cast<i64>(blockIdx.y) * K + k] = total;
    }
}

template <typename T>
__global__ void __launch_bounds__(256) bias_grad_nhwc_sum(const typename cuconv::Acc<T>::type* __restrict__ partials,
                                                          T* __restrict__ db, i64 slices, i64 K) {
    typedef typename cuconv::Acc<T>::type Acc;
    const i64 k = static_cast<i64>(blockIdx.x) * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (k >= K) return;  // whole warps: the butterfly below has every lane of a live warp
    Acc sum = 0;
    for (i64 y = lane; y < slices; y += 32) sum += partials[y * K + k];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) db[k] = cuconv::from_acc<T>(sum);
}
