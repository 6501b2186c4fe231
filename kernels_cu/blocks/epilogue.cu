// The epilogue of a convolution as one pass over its output, for the algorithms that do not apply it in their own
// kernels: out[i] = act(y[i] + r[i]) (RES 1: the residual before the activation), act(y[i]) + r[i] (RES 2: after),
// act(y[i]) (RES 0), computed in fp32 (fp64 for double) and rounded once; ``out`` may be ``y``.
//
// Kernel   epilogue<T, ACT, RES>(y, r, out, n, alpha)   ACT: the activation's code (epilogue.cuh), alpha
//                                                        leaky_relu's slope; r unused (null) where RES is 0
// Mapping: a grid-stride loop, one element a thread a step (coalesced over i); y, r and out share one layout.
#include "common.cuh"
#include "epilogue.cuh"

using cuconv::i64;

template <typename T, int ACT, int RES>
__global__ void epilogue(const T* y, const T* __restrict__ r, T* out, i64 n, float alpha) {
    using A = typename cuconv::Acc<T>::type;
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        A v = cuconv::to_acc<T>(y[i]);
        if constexpr (RES == 1) v += cuconv::to_acc<T>(r[i]);
        v = cuconv::activate<ACT, A>(v, static_cast<A>(alpha));
        if constexpr (RES == 2) v += cuconv::to_acc<T>(r[i]);
        out[i] = cuconv::from_acc<T>(v);
    }
}
