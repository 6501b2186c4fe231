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

}  // namespace cuconv
