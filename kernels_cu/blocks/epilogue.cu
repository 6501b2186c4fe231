// The epilogue of a convolution as one pass over its output, for the algorithms that do not apply it in their own
// kernels: out[i] = act(y[i] + r[i]) (res 1: the residual before the activation), act(y[i]) + r[i] (res 2:
// after), act(y[i]) (res 0), computed in fp32 (fp64 for double) and rounded once; ``out`` may be ``y``.
//
// Kernel   epilogue<T>(y, r, out, n, act, res, alpha)   act: the activation's code (epilogue.cuh), alpha
//                                                        leaky_relu's slope (a double: float64's
//                                                        slope is not rounded to fp32); r unused (null) where res is 0
// One instance a type: the activation and the residual's place are launch-wide values (the pass is bound by
// memory; a uniform branch costs nothing there), not template parameters (116 instances to compile).
// Mapping: a grid-stride loop, one element a thread a step (coalesced over i); y, r and out share one layout.
#include "common.cuh"
#include "epilogue.cuh"

using cuconv::i64;

template <typename T>
__global__ void epilogue(const T* y, const T* __restrict__ r, T* out, i64 n, int act, int res, double alpha) {
    using A = typename cuconv::Acc<T>::type;
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        A v = cuconv::to_acc<T>(y[i]);
        if (res == 1) v += cuconv::to_acc<T>(r[i]);
        v = cuconv::activate<A>(act, v, static_cast<A>(alpha));
        if (res == 2) v += cuconv::to_acc<T>(r[i]);
        out[i] = cuconv::from_acc<T>(v);
    }
}
