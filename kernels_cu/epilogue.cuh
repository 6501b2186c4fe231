// The activations of a convolution's epilogue, on the fp32 (fp64 for double) value before its one rounding.
//
// ACT codes follow cuconv.problem.ACTIVATIONS, 0 meaning none: 1 relu, 2 relu6, 3 leaky_relu (slope alpha),
// 4 silu, 5 gelu (erf), 6 gelu_tanh, 7 hardswish, 8 hardsigmoid, 9 sigmoid. Each is torch's formula; NaN stays
// NaN through every one (the comparisons are written so that a NaN falls through to itself).
#pragma once
#include "common.cuh"

namespace cuconv {

template <int ACT, typename A>
__device__ __forceinline__ A activate(A v, A alpha) {
    if constexpr (ACT == 1) {
        return v < A(0) ? A(0) : v;
    } else if constexpr (ACT == 2) {
        return v < A(0) ? A(0) : (v > A(6) ? A(6) : v);
    } else if constexpr (ACT == 3) {
        return v > A(0) ? v : v * alpha;
    } else if constexpr (ACT == 4) {
        return v / (A(1) + exp(-v));
    } else if constexpr (ACT == 5) {
        return A(0.5) * v * (A(1) + erf(v * A(0.70710678118654752440)));
    } else if constexpr (ACT == 6) {
        const A inner = A(0.79788456080286535588) * (v + A(0.044715) * v * v * v);
        return A(0.5) * v * (A(1) + tanh(inner));
    } else if constexpr (ACT == 7) {
        const A t = v + A(3);
        return v * (t < A(0) ? A(0) : (t > A(6) ? A(6) : t)) / A(6);
    } else if constexpr (ACT == 8) {
        const A t = v + A(3);
        return (t < A(0) ? A(0) : (t > A(6) ? A(6) : t)) / A(6);
    } else if constexpr (ACT == 9) {
        return A(1) / (A(1) + exp(-v));
    } else {
        return v;
    }
}

// The same, the activation's code chosen at run time (one instance for every activation: the epilogue pass is
// bound by memory, and a launch-wide uniform branch costs nothing there).
template <typename A>
__device__ __forceinline__ A activate(int act, A v, A alpha) {
    switch (act) {
        case 1: return activate<1, A>(v, alpha);
        case 2: return activate<2, A>(v, alpha);
        case 3: return activate<3, A>(v, alpha);
        case 4: return activate<4, A>(v, alpha);
        case 5: return activate<5, A>(v, alpha);
        case 6: return activate<6, A>(v, alpha);
        case 7: return activate<7, A>(v, alpha);
        case 8: return activate<8, A>(v, alpha);
        case 9: return activate<9, A>(v, alpha);
        default: return v;
    }
}

// v through the residual's value rv, added before the activation (res 1) or after it (res 2), and the activation
// act (0: none): the epilogue's one order, for every kernel that applies it (cuconv::epilogue below, implicit_gemm's
// igemm::finish).
template <typename A>
__device__ __forceinline__ A finish_value(A v, int act, int res, A alpha, A rv) {
    if (res == 1) v += rv;
    if (act != 0) v = activate<A>(act, v, alpha);
    if (res == 2) v += rv;
    return v;
}

// A forward's epilogue as the kernels that apply it in their stores take it (depthwise; implicit_gemm has its own
// Epilogue, with an fp32 slope), launch-wide: act the activation's code (0: none), res where the residual is
// added (0: none, 1: before the activation, 2: after it), alpha leaky_relu's slope, a double so that a float64
// convolution's is not rounded to fp32 (EPILOGUE_ARGS_DTYPE in cuconv/blocks/epilogue.py has this layout).
// Backward passes and plain forwards take zeros: their stores write the sums as they are.
struct EpilogueArgs {
    int act, res;
    double alpha;
};
static_assert(sizeof(EpilogueArgs) == 16, "EPILOGUE_ARGS_DTYPE in cuconv/blocks/epilogue.py has this layout");

// v (a sum with its bias, in the arithmetic type A) through the residual r[off] (r lies as the output does; read
// only where e.res says so) and the activation, before the caller's one rounding to the output's type.
template <typename T, typename A>
__device__ __forceinline__ A epilogue(A v, const EpilogueArgs& e, const T* __restrict__ r, long long off) {
    const A rv = e.res != 0 ? static_cast<A>(to_acc(r[off])) : A(0);
    return finish_value<A>(v, e.act, e.res, static_cast<A>(e.alpha), rv);
}

// epilogue() in the instances that apply one (kEpi), v as it is in the others: a kernel's plain instance keeps the
// registers it had without an epilogue (the code of nine activations at every store cost the depthwise rows
// kernel 27 registers, and with them a resident block per SM, though no branch to it was taken).
template <bool kEpi, typename T, typename A>
__device__ __forceinline__ A epilogue_if(A v, const EpilogueArgs& e, const T* __restrict__ r, long long off) {
    if constexpr (kEpi) {
        return epilogue(v, e, r, off);
    } else {
        return v;
    }
}

}  // namespace cuconv
