// Elementwise helpers of the plans: fills, casts and sums of partial results, so that a plan needs no array
// library between its launches (its workspace is raw memory, and a CUDA graph captures these like any other
// launch).
//
// Kernel   fill<T>(dst, n, value)      dst[i] = value (a double, converted once), in 16-byte stores where dst is
//                                      on a 16-byte boundary
// Kernel   cast<S, D>(src, dst, n)     dst[i] = src[i] converted, rounded once (fp32 sums to half types)
// Kernel   sum_partials<A, T>(partials, acc, dst, n, parts)
//                                      dst[i] = (acc ? acc[i] : 0) + Σ_j partials[j·n + i], summed in A in the
//                                      order j = 0, 1, ... (deterministic) and rounded to T once; acc may be
//                                      dst itself (a running sum over turns)
// Kernel   swap_planes<T>(src, dst, A, B, L)
//                                      dst (B, A, L) = src (A, B, L) with the first two axes swapped, rows of L
//                                      contiguous elements moved whole (a batch's (N, C, P·Q) as (C, N·P·Q):
//                                      one GEMM over the batch for 1x1 layers on small planes); 32-bit indices
//                                      (A·B·L < 2^31).
//   T, S, D  storage types; A the arithmetic type of the sums (float or double).
// Mapping: a grid-stride loop, one element per thread per step (coalesced over i).
#include "common.cuh"

using cuconv::i64;

template <typename T>
__global__ void fill(T* __restrict__ dst, i64 n, double value) {
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const T v = cuconv::from_acc<T>(static_cast<typename cuconv::Acc<T>::type>(value));
    const i64 first = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x, step = static_cast<i64>(gridDim.x) *
                                                                                        blockDim.x;
    i64 head = 0;
    if (reinterpret_cast<unsigned long long>(dst) % 16 == 0) {  // (a 16-byte store a thread: the copy bandwidth)
        alignas(16) T e[V];
#pragma unroll
        for (int j = 0; j < V; ++j) e[j] = v;
        const uint4 word = *reinterpret_cast<const uint4*>(e);
        const i64 vectors = n / V;
        for (i64 i = first; i < vectors; i += step) reinterpret_cast<uint4*>(dst)[i] = word;
        head = vectors * V;
    }
    for (i64 i = head + first; i < n; i += step) dst[i] = v;
}

template <typename S, typename D>
__global__ void cast(const S* __restrict__ src, D* __restrict__ dst, i64 n) {
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        dst[i] = cuconv::from_acc<D>(static_cast<typename cuconv::Acc<D>::type>(cuconv::to_acc<S>(src[i])));
    }
}

template <typename A, typename T>
__global__ void sum_partials(const A* __restrict__ partials, const A* acc, T* dst, i64 n, i64 parts) {
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        A sum = acc ? acc[i] : A(0);
        for (i64 j = 0; j < parts; ++j) sum += partials[j * n + i];
        dst[i] = cuconv::from_acc<T>(static_cast<typename cuconv::Acc<T>::type>(sum));
    }
}

template <typename T>
__global__ void swap_planes(const T* __restrict__ src, T* __restrict__ dst, i64 A, i64 B, i64 L) {
    const int a_count = static_cast<int>(A), b_count = static_cast<int>(B), l_count = static_cast<int>(L);
    const int total = a_count * b_count * l_count;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const int l = e % l_count, t = e / l_count;
        const int a = t % a_count, b = t / a_count;  // dst[b, a, l] = src[a, b, l]
        dst[e] = src[(a * b_count + b) * l_count + l];
    }
}
