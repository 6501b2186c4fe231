// winograd.cuh: the Winograd (Toom-Cook) transform matrices F(M, R) and the 2-D transform of a tile in
// registers, shared by winograd.cu (transforms through memory, cuBLAS GEMMs) and winograd_fused.cu (F(2x2,
// 3x3) in one kernel), and the direct recomputation of an output that comes out non-finite. The matrices are computed at compile time from the interpolation points, so their zeros
// cost nothing and their ones no multiply.
#pragma once

namespace wino {

// Interpolation points in the order they are taken; infinity is always the last point.
__host__ __device__ constexpr double point(int i) {
    return i == 0 ? 0.0 : i == 1 ? 1.0 : i == 2 ? -1.0 : i == 3 ? 2.0 : i == 4 ? -2.0 : i == 5 ? 0.5 : -0.5;
}

// The matrices of F(M, R) with A = M + R - 1 points (A - 1 finite ones and infinity):
//   at[i][j] = p_j^i,  at[i][∞] = [i == M - 1]                     (M x A)
//   g[j][k]  = p_j^k / Π_{l≠j} (p_j - p_l),  g[∞][k] = [k == R - 1]  (A x R)
//   bt[j][i] = coefficient of x^i in Π_{l≠j} (x - p_l),  bt[∞][i] = that of Π_l (x - p_l)  (A x A)
// (the transpose of the Toom-Cook product of polynomials: Lagrange interpolation at the points, the
// leading coefficient at infinity). Exact in double except the divisions of g (rounded once).
template <int M, int R>
struct Axis {
    static constexpr int A = M + R - 1;
    static_assert(M >= 1 && R >= 1 && A <= 8, "F(M, R) needs M + R - 1 <= 8 points");
    double at[M][A];
    double g[A][R];
    double bt[A][A];

    __host__ __device__ constexpr Axis() : at{}, g{}, bt{} {
        constexpr int finite = A - 1;
        for (int i = 0; i < M; ++i) {
            for (int j = 0; j < finite; ++j) {
                double pj = 1.0;
                for (int e = 0; e < i; ++e) pj *= point(j);
                at[i][j] = pj;
            }
            at[i][A - 1] = (i == M - 1) ? 1.0 : 0.0;
        }
        for (int j = 0; j < finite; ++j) {
            double f = 1.0;
            for (int l = 0; l < finite; ++l)
                if (l != j) f *= point(j) - point(l);
            double pk = 1.0;
            for (int k = 0; k < R; ++k) {
                g[j][k] = pk / f;
                pk *= point(j);
            }
        }
        g[A - 1][R - 1] = 1.0;
        for (int j = 0; j <= finite; ++j) {  // j == finite: the product over every finite point
            double poly[8] = {1.0};
            int degree = 0;
            for (int l = 0; l < finite; ++l) {
                if (l == j) continue;
                // poly *= (x - p_l)
                for (int e = degree + 1; e > 0; --e) poly[e] = poly[e - 1] - point(l) * poly[e];
                poly[0] = -point(l) * poly[0];
                ++degree;
            }
            for (int i = 0; i < A; ++i) bt[j][i] = i <= degree ? poly[i] : 0.0;
        }
    }
};

// out = Σ_i coef[i] · in[i] over a compile-time row of coefficients: zeros are skipped, ones and minus
// ones are additions, and the first term found starts the sum (a sum started at 0 costs an addition of zero
// the compiler may not drop: 0 + -0 is +0). `started` is a constant once the loops that call this are
// unrolled. A row of zeros gives 0.
template <typename Acc>
__device__ __forceinline__ Acc combine_term(Acc sum, bool& started, double coef, Acc value) {
    if (coef == 0.0) return sum;
    const bool first = !started;
    started = true;
    if (coef == 1.0) return first ? value : sum + value;
    if (coef == -1.0) return first ? -value : sum - value;
    return first ? static_cast<Acc>(coef) * value : fma(static_cast<Acc>(coef), value, sum);
}

// One constant table per F(M, R), evaluated once by the front end.
template <int M, int R>
struct Table {
    static constexpr Axis<M, R> value{};
};

// out = left · in · rightᵀ for a tile in registers: the 2-D transform of every Winograd kernel (left and
// right are Axis tables, constants once inlined and unrolled).
template <int OH, int IH, int OW, int IW, typename T>
__device__ __forceinline__ void transform(const double (&left)[OH][IH], const T (&in)[IH][IW],
                                          const double (&right)[OW][IW], T (&out)[OH][OW]) {
    T rows[OH][IW];  // left · in
#pragma unroll
    for (int a = 0; a < OH; ++a)
#pragma unroll
        for (int j = 0; j < IW; ++j) {
            T sum = 0;
            bool started = false;
#pragma unroll
            for (int i = 0; i < IH; ++i) sum = combine_term(sum, started, left[a][i], in[i][j]);
            rows[a][j] = sum;
        }
#pragma unroll
    for (int a = 0; a < OH; ++a)
#pragma unroll
        for (int b = 0; b < OW; ++b) {
            T sum = 0;
            bool started = false;
#pragma unroll
            for (int j = 0; j < IW; ++j) sum = combine_term(sum, started, right[b][j], rows[a][j]);
            out[a][b] = sum;
        }
}

// Non-finite values. The transforms mix every input of a tile (and 0 · Inf is NaN), so one NaN or Inf in a tile's
// input makes all its outputs non-finite, where a direct sum (torch's convolution) spoils only the outputs whose
// window holds it. Both families therefore compute an output that comes out non-finite again, directly from its
// own window: y[n, k, p, q] of a stride-1, dilation-1, one-group convolution, bias not added. Finite outputs cost
// one test each (winograd_fused: one per four). Not inlined: the rare path stays out of the callers' registers
// and instruction stream.
template <typename T>
__device__ __noinline__ T direct_output(const T* __restrict__ x, const T* __restrict__ w, long long n, long long k,
                                        long long p, long long q, long long C, long long H, long long W, int R,
                                        int S, long long pad_top, long long pad_left) {
    T acc = T(0);
    const T* __restrict__ wk = w + k * C * R * S;
    for (long long c = 0; c < C; ++c) {
        const T* __restrict__ plane = x + (n * C + c) * H * W;
        for (int r = 0; r < R; ++r) {
            const long long ih = p + r - pad_top;
            if (ih < 0 || ih >= H) continue;
            for (int s = 0; s < S; ++s) {
                const long long iw = q + s - pad_left;
                if (iw >= 0 && iw < W) acc += plane[ih * W + iw] * wk[(c * R + r) * S + s];
            }
        }
    }
    return acc;
}

}  // namespace wino
