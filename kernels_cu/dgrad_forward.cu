// flip_weight: the weight of dgrad's forward convolution (dgrad_forward.py): per group, input and output
// channels swapped and the kernel flipped in both axes.
//
// Kernel   flip_weight<T>(w, wf, groups, KG, CG, RS)
//   w   (groups·KG, CG, R, S)    the forward weight, KCRS
//   wf  (groups·CG, KG, R, S)    wf[g·CG + c, k, t] = w[g·KG + k, c, RS - 1 - t]  (t = r·S + s: reversing the
//                                flattened tap index flips both axes)
//   T   storage type.
// Mapping: one thread per element of wf, grid-stride loop; reads are gathers, writes coalesced.
#include "common.cuh"

using cuconv::i64;

template <typename T>
__global__ void flip_weight(const T* __restrict__ w, T* __restrict__ wf, i64 groups, i64 KG, i64 CG, i64 RS) {
    const i64 total = groups * CG * KG * RS;
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        const i64 t = i % RS;
        const i64 k = (i / RS) % KG;
        const i64 gc = i / (RS * KG);  // g·CG + c
        const i64 g = gc / CG, c = gc - g * CG;
        wf[i] = w[((g * KG + k) * CG + c) * RS + (RS - 1 - t)];
    }
}
