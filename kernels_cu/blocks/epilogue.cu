// The epilogue of a convolution as one pass over its output, for the algorithms that do not apply it in their own
// kernels: out[i] = act(y[i] + r[i]) (res 1: the residual before the activation), act(y[i]) + r[i] (res 2:
// after), act(y[i]) (res 0), computed in fp32 (fp64 for double) and rounded once; ``out`` may be ``y``.
//
// Kernel   epilogue<T>(y, r, out, n, act, res, alpha)   act: the activation's code (epilogue.cuh), alpha
//                                                        leaky_relu's slope (a double: float64's
//                                                        slope is not rounded to fp32); r unused (null) where res is 0
// One instance a type: the activation and the residual's place are launch-wide values (the pass is bound by
// memory; a uniform branch costs nothing there), not template parameters (116 instances to compile).
// Mapping: a grid-stride loop over 16-byte vectors where y, out (and r) lie on 16-byte boundaries (one element a
// thread a step moved a third less than the copy bandwidth in the 16-bit types), then the elements past the last
// whole vector (all of them elsewhere) one a thread; y, r and out share one layout.
#include "common.cuh"
#include "epilogue.cuh"

using cuconv::i64;

template <typename T>
__global__ void epilogue(const T* y, const T* __restrict__ r, T* out, i64 n, int act, int res, double alpha) {
    using A = typename cuconv::Acc<T>::type;
    constexpr int V = cuconv::VecWidth<T>::value;
    const cuconv::EpilogueArgs e{act, res, alpha};
    const i64 first = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
    const i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
    const unsigned long long bases = reinterpret_cast<unsigned long long>(y) |
                                     reinterpret_cast<unsigned long long>(out) |
                                     (res != 0 ? reinterpret_cast<unsigned long long>(r) : 0ull);
    const i64 vectors = bases % 16 == 0 ? n / V : 0;
    for (i64 i = first; i < vectors; i += step) {
        cuconv::Vec16<T> v = reinterpret_cast<const cuconv::Vec16<T>*>(y)[i], rv;
        if (res != 0) rv = reinterpret_cast<const cuconv::Vec16<T>*>(r)[i];
#pragma unroll
        for (int j = 0; j < V; ++j)
            v.v[j] = cuconv::from_acc<T>(cuconv::epilogue<T, A>(cuconv::to_acc<T>(v.v[j]), e, rv.v, j));
        reinterpret_cast<cuconv::Vec16<T>*>(out)[i] = v;
    }
    for (i64 i = vectors * V + first; i < n; i += step)
        out[i] = cuconv::from_acc<T>(cuconv::epilogue<T, A>(cuconv::to_acc<T>(y[i]), e, r, i));
}
