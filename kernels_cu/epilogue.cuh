// The activations of a convolution's epilogue, on the fp32 (fp64 for double) value before its one rounding.
//
// ACT codes follow cuconv.problem.ACTIVATIONS, 0 meaning none: 1 relu, 2 relu6, 3 leaky_relu (slope alpha),
// 4 silu, 5 gelu (erf), 6 gelu_tanh, 7 hardswish, 8 hardsigmoid, 9 sigmoid. Each is torch's formula; NaN stays
// NaN through every one (the comparisons are written so that a NaN falls through to itself).
#pragma once

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

}  // namespace cuconv
