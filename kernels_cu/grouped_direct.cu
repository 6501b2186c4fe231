// grouped_direct: the forward of grouped convolutions with few channels and filters per group (up to 64 of
// each), FFMA out of shared memory. Such a layer reduces over only C/groups·R·S per output: on the narrowest
// groups (ResNeXt's 4 and 8 channels) tensor-core tiles are mostly padding, where a block that holds one group's
// whole weight and a band of its input planes in shared memory does the arithmetic straight away. From 16
// channels a group the tensor-core tiles are faster (registry.py takes this family for up to 8).
//
// Kernel   grouped_direct<T, FK, PX>(x, w, bias, out, ConvGeometry, GroupedTiling)
//   T      storage type (__half, __nv_bfloat16, float, double); products summed in cuconv::Acc<T> (float for
//          the half types and float32, double for double), the bias added in that type, one rounding at the
//          store.
//   FK     filters a thread computes (divides K/groups), PX neighbouring output columns of one row. The loops
//          over the taps stay loops: unrolled for 3x3 they ran slower on 4 filters a thread (register pressure).
//
// Layouts: x (N, C, H, W), w (K, C/groups, R, S), out (N, K, P, Q), bias (K,) or a null pointer; contiguous.
//
// Mapping: block (row band, group, sample): `rows` output rows of one sample and group, every column. Shared
// memory holds the group's weight as [c][r][s][k] (a thread's FK filters side by side: vector loads that every
// thread of the warp with the same filters shares) and `chunk` input channels of the band's input rows at a
// time, zero where the padding is, converted to the arithmetic type. Thread t computes pixel block
// t % (rows·col_blocks) (row, then PX columns from PX·block) for filter block t / (rows·col_blocks).
#include "common.cuh"

using cuconv::i64;

// The launch's tiling (GROUPED_TILING_DTYPE in cuconv/algos/grouped_direct.py has this layout).
struct GroupedTiling {
    int rows;           // output rows per block
    int col_blocks;     // ceil(Q / PX)
    int filter_blocks;  // (K / groups) / FK
    int chunk;          // input channels per shared-memory stage
    int in_rows;        // input rows of a band: (rows - 1)·stride_h + (R - 1)·dil_h + 1
    int in_cols;        // input columns of a band: (col_blocks·PX - 1)·stride_w + (S - 1)·dil_w + 1
};
static_assert(sizeof(GroupedTiling) == 24, "GROUPED_TILING_DTYPE in cuconv/algos/grouped_direct.py");

template <typename A, int FK>
__device__ __forceinline__ void load_filters(const A* __restrict__ src, A (&dst)[FK]) {
    if constexpr (sizeof(A) == 4 && FK % 4 == 0) {  // (16-byte aligned: K/groups and FK are multiples of 4)
#pragma unroll
        for (int f = 0; f < FK; f += 4) {
            const float4 v = *reinterpret_cast<const float4*>(src + f);
            dst[f] = v.x; dst[f + 1] = v.y; dst[f + 2] = v.z; dst[f + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int f = 0; f < FK; ++f) dst[f] = src[f];
    }
}

template <typename T, int FK, int PX>
__global__ void __launch_bounds__(256)
grouped_direct(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ out,
               const cuconv::ConvGeometry geo, const GroupedTiling t) {
    typedef typename cuconv::Acc<T>::type A;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int C = static_cast<int>(geo.c), H = static_cast<int>(geo.h), W = static_cast<int>(geo.w);
    const int K = static_cast<int>(geo.k), P = static_cast<int>(geo.p), Q = static_cast<int>(geo.q);
    const int R = static_cast<int>(geo.r), S = static_cast<int>(geo.s), groups = static_cast<int>(geo.groups);
    const int sh = static_cast<int>(geo.stride_h), sw = static_cast<int>(geo.stride_w);
    const int dh = static_cast<int>(geo.dil_h), dw = static_cast<int>(geo.dil_w);
    const int kg = K / groups, cg = C / groups, rs = R * S;
    const int n = blockIdx.z, g = blockIdx.y, p0 = blockIdx.x * t.rows;
    const int tid = threadIdx.x;
    A* s_w = reinterpret_cast<A*>(smem_raw);                       // [cg][R][S][kg]
    A* s_x = s_w + ((cg * rs * kg + 3) & ~3);                      // [chunk][in_rows][in_cols]

    const T* __restrict__ w_group = w + static_cast<i64>(g) * kg * cg * rs;
    for (int i = tid; i < kg * cg * rs; i += blockDim.x) {  // w (k, c, r, s) -> [c][r][s][k]
        const int k = i / (cg * rs), crs = i - k * cg * rs;
        s_w[crs * kg + k] = cuconv::to_acc(w_group[i]);
    }

    const int pixel_blocks = t.rows * t.col_blocks;
    const int pb = tid % pixel_blocks, fb = tid / pixel_blocks;
    const int pr = pb / t.col_blocks, q0 = (pb - pr * t.col_blocks) * PX;
    const int p = p0 + pr;
    const bool active = fb < t.filter_blocks && p < P;
    const int ih0 = p0 * sh - static_cast<int>(geo.pad_top), iw0 = -static_cast<int>(geo.pad_left);
    const T* __restrict__ x_group = x + (static_cast<i64>(n) * C + static_cast<i64>(g) * cg) * H * W;

    A acc[FK][PX];
#pragma unroll
    for (int f = 0; f < FK; ++f)
#pragma unroll
        for (int j = 0; j < PX; ++j) acc[f][j] = A(0);

    for (int c0 = 0; c0 < cg; c0 += t.chunk) {
        const int cc = min(t.chunk, cg - c0);
        __syncthreads();  // (the weight is in; the last chunk's readers are done)
        // a warp per input row of the band (one division per row), its lanes along the row: coalesced reads
        for (int row = tid / 32; row < cc * t.in_rows; row += blockDim.x / 32) {
            const int c = row / t.in_rows, yy = row - c * t.in_rows;
            const int ih = ih0 + yy;
            A* dst = s_x + row * t.in_cols;
            const T* __restrict__ src = x_group + static_cast<i64>(c0 + c) * H * W + static_cast<i64>(ih) * W;
            const bool inside = ih >= 0 && ih < H;
            for (int xx = tid % 32; xx < t.in_cols; xx += 32) {
                const int iw = iw0 + xx;
                dst[xx] = inside && iw >= 0 && iw < W ? cuconv::to_acc(src[iw]) : A(0);
            }
        }
        __syncthreads();
        if (active) {
            for (int c = 0; c < cc; ++c) {
                for (int r = 0; r < R; ++r) {
                    const A* xrow = s_x + (c * t.in_rows + pr * sh + r * dh) * t.in_cols + q0 * sw;
                    const A* wrow = s_w + ((c0 + c) * R + r) * S * kg + fb * FK;
                    for (int s = 0; s < S; ++s) {
                        A xv[PX], wv[FK];
#pragma unroll
                        for (int j = 0; j < PX; ++j) xv[j] = xrow[j * sw + s * dw];
                        load_filters<A, FK>(wrow + s * kg, wv);
#pragma unroll
                        for (int f = 0; f < FK; ++f)
#pragma unroll
                            for (int j = 0; j < PX; ++j) acc[f][j] = fma(wv[f], xv[j], acc[f][j]);
                    }
                }
            }
        }
    }
    if (!active) return;
#pragma unroll
    for (int f = 0; f < FK; ++f) {
        const int k = g * kg + fb * FK + f;
        const A b = bias != nullptr ? cuconv::to_acc(bias[k]) : A(0);
        T* __restrict__ row = out + (static_cast<i64>(n) * K + k) * P * Q + static_cast<i64>(p) * Q;
#pragma unroll
        for (int j = 0; j < PX; ++j)
            if (q0 + j < Q) row[q0 + j] = cuconv::from_acc<T>(acc[f][j] + b);
    }
}
