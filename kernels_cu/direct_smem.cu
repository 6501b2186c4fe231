// direct_smem: direct convolution from shared-memory tiles, with a register tile per thread.
//
// Kernel   direct_smem<T, KT, QT, WK>(x, w_gck, bias, out, ...)
//   T      storage type. Operands are staged in shared memory as Acc = cuconv::Acc<T> (float for the half
//          types, double for double), so the inner loop is plain FFMA (DFMA); the bias is added in Acc and
//          the sum rounded to T once, at the store.
//   KT     output channels per thread; KT * sizeof(Acc) is a multiple of 16 (weights are read as 16-byte
//          vectors).
//   QT     output columns per thread, 32 apart (lane, lane + 32, ...): a warp covers TQ = 32 * QT columns.
//   WK     warps along the output channels; the kWarps / WK warps of each channel slice take one output
//          row each.
//
// Mapping: a block of kThreads computes TK = WK*KT output channels of one group × TP = kWarps/WK output
// rows × TQ output columns of one sample. blockIdx.x = (n, p tile, q tile) with q fastest, blockIdx.y =
// (group, k tile). Warp w computes channels [(w % WK)*KT, +KT) of the tile's row w / WK; each thread a
// KT × QT tile in registers. Per chunk of `ct` input channels of the group, the block stages
//   ws[c][r][s][kk] = w[k0 + kk, c0 + c, r, s]            (zero past K/groups)
//   xs[c][row][col] = x[n, c0 + c, ih0 + row, iw0 + col]  (zero outside the image: the padding)
// for rows [0, x_rows), x_rows = (TP-1)*stride_h + (R-1)*dil_h + 1, and columns [0, x_cols), x_cols =
// (TQ-1)*stride_w + (S-1)*dil_w + 1 (halo, stride and dilation included; x_cols is also the row pitch),
// where (ih0, iw0) is the input position of the tile's first output. Then every thread runs, over c, r, s
// in that order,
//   acc[j][i] += ws[c][r][s][kw*KT + j] * xs[c][pw*stride_h + r*dil_h][(lane + 32*i)*stride_w + s*dil_w]
// that is, per tap, QT loads of x (consecutive lanes read consecutive words at stride 1: no bank
// conflicts), KT/(16/sizeof(Acc)) warp-uniform 16-byte loads of w (broadcasts), and KT*QT FMAs.
//
// Layouts: x (N, C, H, W); w_gck (groups, C/groups*R*S, K/groups), the weights transposed by the launcher
// so that the k tile of one tap is contiguous (coalesced global reads, conflict-free shared stores);
// out (N, K, P, Q); bias (K,) or a null pointer. Dynamic shared memory holds ws (ct_max*R*S*TK) then xs
// (ct_max*x_rows*x_cols), both Acc; cuconv/direct_smem.py sizes it and passes ct_max, x_rows and x_cols.
// Plane and output offsets are 64-bit; positions inside a plane and shared-memory indices are int.
#include "common.cuh"

using cuconv::i64;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kLoads = 4;  // global loads in flight per thread while staging

// dst[0, N) = src[0, N) from 16-byte aligned shared memory, as 16-byte vectors.
template <int N>
__device__ __forceinline__ void load_vec16(float (&dst)[N], const float* src) {
    static_assert(N % 4 == 0, "KT * sizeof(float) must be a multiple of 16");
#pragma unroll
    for (int v = 0; v < N / 4; ++v) {
        const float4 t = reinterpret_cast<const float4*>(src)[v];
        dst[4 * v] = t.x;
        dst[4 * v + 1] = t.y;
        dst[4 * v + 2] = t.z;
        dst[4 * v + 3] = t.w;
    }
}

template <int N>
__device__ __forceinline__ void load_vec16(double (&dst)[N], const double* src) {
    static_assert(N % 2 == 0, "KT * sizeof(double) must be a multiple of 16");
#pragma unroll
    for (int v = 0; v < N / 2; ++v) {
        const double2 t = reinterpret_cast<const double2*>(src)[v];
        dst[2 * v] = t.x;
        dst[2 * v + 1] = t.y;
    }
}

}  // namespace

template <typename T, int KT, int QT, int WK>
__global__ void __launch_bounds__(kThreads, 2)
direct_smem(const T* __restrict__ x, const T* __restrict__ w_gck, const T* __restrict__ bias,
            T* __restrict__ out, i64 C, i64 H, i64 W, i64 K, i64 P, i64 Q, i64 R, i64 S, i64 groups,
            i64 stride_h, i64 stride_w, i64 pad_top, i64 pad_left, i64 dil_h, i64 dil_w,
            i64 tiles_p, i64 tiles_q, i64 tiles_k, i64 ct_max, i64 x_rows, i64 x_cols) {
    typedef typename cuconv::Acc<T>::type Acc;
    static_assert(kWarps % WK == 0, "WK must divide the warps of a block");
    constexpr int TK = WK * KT;
    constexpr int TP = kWarps / WK;
    constexpr int TQ = 32 * QT;

    const int Hi = static_cast<int>(H), Wi = static_cast<int>(W), Si = static_cast<int>(S);
    const int RS = static_cast<int>(R * S);
    const int sh = static_cast<int>(stride_h), sw = static_cast<int>(stride_w);
    const int dh = static_cast<int>(dil_h), dw = static_cast<int>(dil_w);
    const int rows = static_cast<int>(x_rows), cols = static_cast<int>(x_cols);
    const int c_per_group = static_cast<int>(C / groups), k_per_group = static_cast<int>(K / groups);

    extern __shared__ __align__(16) unsigned char smem_raw[];
    Acc* __restrict__ ws = reinterpret_cast<Acc*>(smem_raw);
    Acc* __restrict__ xs = ws + static_cast<int>(ct_max) * RS * TK;  // 16-byte aligned, as TK*sizeof(Acc)

    // The tile: sample n, output rows [p0, p0 + TP), columns [q0, q0 + TQ), channels [k0, k0 + TK) of group g.
    i64 tile = blockIdx.x;
    const int q0 = static_cast<int>(tile % tiles_q) * TQ;
    tile /= tiles_q;
    const int p0 = static_cast<int>(tile % tiles_p) * TP;
    const i64 n = tile / tiles_p;
    const int g = static_cast<int>(blockIdx.y / tiles_k);
    const int k0 = static_cast<int>(blockIdx.y % tiles_k) * TK;  // within the group
    const int ih0 = p0 * sh - static_cast<int>(pad_top);
    const int iw0 = q0 * sw - static_cast<int>(pad_left);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kw = warp % WK;  // this warp's KT channels: [k0 + kw*KT, +KT)
    const int pw = warp / WK;  // this warp's output row: p0 + pw

    const T* __restrict__ x_group = x + (n * C + static_cast<i64>(g) * c_per_group) * H * W;
    const T* __restrict__ w_group = w_gck + static_cast<i64>(g) * c_per_group * RS * k_per_group + k0;

    Acc acc[KT][QT];
#pragma unroll
    for (int j = 0; j < KT; ++j) {
#pragma unroll
        for (int i = 0; i < QT; ++i) acc[j][i] = 0;
    }

    for (int c0 = 0; c0 < c_per_group; c0 += static_cast<int>(ct_max)) {
        const int ct = min(static_cast<int>(ct_max), c_per_group - c0);
        __syncthreads();  // every warp has finished reading the previous chunk

        // ws: ct*R*S rows of TK channels; row (c, r, s) of w_gck holds K/groups channels, we take [k0, +TK).
        const T* __restrict__ w_chunk = w_group + static_cast<i64>(c0) * RS * k_per_group;
        const int w_count = ct * RS * TK;
        for (int e0 = threadIdx.x; e0 < w_count; e0 += kThreads * kLoads) {
            Acc v[kLoads];
#pragma unroll
            for (int u = 0; u < kLoads; ++u) {
                const int e = e0 + u * kThreads;
                const int row = e / TK, kk = e % TK;
                v[u] = e < w_count && k0 + kk < k_per_group
                           ? cuconv::to_acc(w_chunk[static_cast<i64>(row) * k_per_group + kk]) : Acc(0);
            }
#pragma unroll
            for (int u = 0; u < kLoads; ++u) {
                const int e = e0 + u * kThreads;
                if (e < w_count) ws[e] = v[u];
            }
        }

        // xs: ct*rows rows of cols columns, a warp per row, consecutive lanes on consecutive columns.
        for (int row = warp; row < ct * rows; row += kWarps) {
            const int c = row / rows;
            const int ih = ih0 + (row - c * rows);
            const bool inside_h = ih >= 0 && ih < Hi;
            const T* __restrict__ src = x_group + (static_cast<i64>(c0 + c) * H + (inside_h ? ih : 0)) * W;
            Acc* __restrict__ dst = xs + row * cols;
            for (int col0 = lane; col0 < cols; col0 += 32 * kLoads) {
                Acc v[kLoads];
#pragma unroll
                for (int u = 0; u < kLoads; ++u) {
                    const int col = col0 + 32 * u;
                    const int iw = iw0 + col;
                    v[u] = inside_h && col < cols && iw >= 0 && iw < Wi ? cuconv::to_acc(src[iw]) : Acc(0);
                }
#pragma unroll
                for (int u = 0; u < kLoads; ++u) {
                    const int col = col0 + 32 * u;
                    if (col < cols) dst[col] = v[u];
                }
            }
        }
        __syncthreads();

        const int q_step = 32 * sw;  // between a thread's output columns, in input columns
        for (int c = 0; c < ct; ++c) {
            for (int r = 0; r < static_cast<int>(R); ++r) {
                const Acc* x_row = xs + (c * rows + pw * sh + r * dh) * cols + lane * sw;
                const Acc* w_row = ws + (c * RS + r * Si) * TK + kw * KT;
                for (int s = 0; s < Si; ++s, x_row += dw, w_row += TK) {
                    Acc xv[QT], wv[KT];
#pragma unroll
                    for (int i = 0; i < QT; ++i) xv[i] = x_row[i * q_step];
                    load_vec16(wv, w_row);
#pragma unroll
                    for (int j = 0; j < KT; ++j) {
#pragma unroll
                        for (int i = 0; i < QT; ++i) acc[j][i] = fma(wv[j], xv[i], acc[j][i]);
                    }
                }
            }
        }
    }

    const int p = p0 + pw;
    if (p >= P) return;
#pragma unroll
    for (int j = 0; j < KT; ++j) {
        const int k = k0 + kw * KT + j;
        if (k >= k_per_group) break;
        const i64 kk = static_cast<i64>(g) * k_per_group + k;
        const Acc b = bias != nullptr ? cuconv::to_acc(bias[kk]) : Acc(0);
        T* __restrict__ dst = out + ((n * K + kk) * P + p) * Q;
#pragma unroll
        for (int i = 0; i < QT; ++i) {
            const int q = q0 + lane + 32 * i;
            if (q < Q) dst[q] = cuconv::from_acc<T>(acc[j][i] + b);
        }
    }
}
