// batched_pointers: the A, B and C pointer arrays of one batched GEMM over (sample, group) pairs.
//
// Kernel   batched_pointers(a, b, c, a0, b0, c0, count, groups, a_sample, a_group, b_group, c_sample, c_group)
//   Entry i = n·groups + g of each array is base + n·(sample stride) + g·(group stride), in bytes.
// Built on the device (not copied from the host) so that the GEMM stays capturable in a CUDA graph and
// costs one tiny launch instead of a pageable host-to-device copy; the bases are the call's pointers, so the
// arrays are built at every call (a plan's launch takes the six pointers first).
#include "common.cuh"

using cuconv::i64;

__global__ void batched_pointers(unsigned long long* __restrict__ a, unsigned long long* __restrict__ b,
                                 unsigned long long* __restrict__ c, unsigned long long a0,
                                 unsigned long long b0, unsigned long long c0, i64 count, i64 groups,
                                 i64 a_sample, i64 a_group, i64 b_group, i64 c_sample, i64 c_group) {
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        const i64 n = i / groups, g = i - (i / groups) * groups;
        a[i] = a0 + n * a_sample + g * a_group;
        b[i] = b0 + g * b_group;
        c[i] = c0 + n * c_sample + g * c_group;
    }
}
