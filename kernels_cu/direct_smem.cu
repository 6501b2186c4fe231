// direct_smem: direct convolution from shared-memory tiles, with a register tile per thread.
//
// Kernel   direct_smem<T, KT, QT, WK, MIN_BLOCKS>(x, w_gck, bias, out, ConvGeometry, DirectSmemTiling)
//   T      storage type. Operands are staged in shared memory as Acc = cuconv::Acc<T> (float for the half
//          types, double for double), so the inner loop is plain FFMA (DFMA); the bias is added in Acc and
//          the sum rounded to T once, at the store.
//   KT     output channels per thread; KT * sizeof(Acc) is a multiple of 16 (weights are read as 16-byte
//          vectors).
//   QT     output columns per thread, 32 apart (lane, lane + 32, ...): a warp covers TQ = 32 * QT columns.
//   WK     warps along the output channels; the kWarps / WK warps of each channel slice take one output
//          row each.
//   MIN_BLOCKS  blocks per SM the register allocation must allow (__launch_bounds__): 2 caps a thread at
//          128 registers, 1 at 255.
//
// Mapping: a block of kThreads computes TK = WK*KT output channels of one group × TP = kWarps/WK output
// rows × TQ output columns of one sample. blockIdx.x = (n, p tile, q tile) with q fastest, blockIdx.y =
// (group, k tile). Warp w computes channels [(w % WK)*KT, +KT) of the tile's row w / WK; each thread a
// KT × QT tile in registers. The input channels of the group are walked in chunks of `ct_max`; for each
// chunk (c0, ct channels) the block stages
//   ws[c][r][s][kk] = w[k0 + kk, c0 + c, r, s]            (zero past K/groups)
//   xs[c][row][col] = x[n, c0 + c, ih0 + row, iw0 + col]  (zero outside the image: the padding)
// for rows [0, x_rows), x_rows = (TP-1)*stride_h + (R-1)*dil_h + 1, and columns [0, x_cols), x_cols =
// (TQ-1)*stride_w + (S-1)*dil_w + 1 (halo, stride and dilation included), where (ih0, iw0) is the input
// position of the tile's first output. A staged row is split by stride phase: column col sits at
// col % stride_w * x_phase_cols + col / stride_w (x_phase_cols = ceil(x_cols / stride_w); with stride 1
// that is just col), so that the columns one tap reads for a thread's outputs are 32 apart and those of
// consecutive lanes adjacent, at any stride. Then every thread runs, over the taps t = (c, r, s) of the
// chunk in that order,
//   acc[j][i] += ws[c][r][s][kk] * xs[c][pw*stride_h + r*dil_h][(lane + 32*i)*stride_w + s*dil_w]
// with kk = kw*KT + j, that is, per tap, QT loads of x (consecutive lanes read consecutive words: no
// bank conflicts), KT/(16/sizeof(Acc)) warp-uniform 16-byte loads of w (broadcasts), and KT*QT FMAs.
// The tap loop is unrolled twice so that the loads of one tap are issued among the FMAs of the other.
//
// Pipeline: `stages` (1 to 3, chosen by the launcher from what fits) buffers of one chunk each. With float
// and double the chunk is staged by cp.async (4 or 8 bytes, zero-filled for the padding) while the block
// computes the chunks before it, so the global-memory latency of staging hides behind the FMAs: chunk
// i + stages - 1 is requested as soon as every warp has finished with chunk i - 1, whose buffer it takes.
// The half types convert to float on the way in, through registers (cp.async copies bytes); their loads
// still overlap the other block's arithmetic. One stage (a single channel as large as the device allows)
// stages and computes in turn.
//
// Layouts: x (N, C, H, W); w_gck (groups, C/groups*R*S, K/groups), the weights transposed first
// (transpose_weight<T>, below, into the plan's workspace) so that the k tile of one tap is contiguous (coalesced
// global reads, conflict-free shared stores);
// out (N, K, P, Q); bias (K,) or a null pointer. Dynamic shared memory holds `stages` buffers, each ws
// (ct_max*R*S*TK) then xs (ct_max*x_rows rows of stride_w*x_phase_cols, padded to 16 bytes), all Acc;
// cuconv/algos/direct_smem.py sizes it and passes ct_max, stages, stage_elems (one buffer), x_rows, x_cols and
// x_phase_cols. Plane and output offsets are 64-bit;
// positions inside a plane and shared-memory indices are int.
#include "common.cuh"

using cuconv::i64;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

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

// *dst = valid ? *src : 0. Storage type == arithmetic type (float, double): an asynchronous copy, completed
// by cp_async_wait. Half types: a load, a conversion and a store.
template <typename T>
__device__ __forceinline__ void stage_element(typename cuconv::Acc<T>::type* dst, const T* src, bool valid) {
    typedef typename cuconv::Acc<T>::type Acc;
    if constexpr (sizeof(T) == sizeof(Acc)) {
        cuconv::cp_async_ca<sizeof(T)>(cuconv::smem_addr(dst), src, valid);
    } else {
        *dst = valid ? cuconv::to_acc(*src) : Acc(0);
    }
}

// One (c, r) row of taps s = 0..S-1 for a thread's KT x QT outputs: acc[j][i] += w_row[s*TK + j] *
// x_row[offset(s) + 32*i]. Tap s reads window column (lane + 32*i)*sw + s*dw, stored at phase (s*dw) % sw,
// position lane + 32*i + (s*dw) / sw, so the x loads sit 32 apart (immediate offsets) at any stride; the
// offset of tap s is kept incrementally: kUnit (stride 1) adds dw, otherwise tap_step, wrapping into the
// next position (tap_wrap) when the phase passes sw. Unrolled twice so that one tap's loads issue among the
// other's FMAs.
template <bool kUnit, int TK, typename Acc, int KT, int QT>
__device__ __forceinline__ void row_of_taps(Acc (&acc)[KT][QT], const Acc* x_row, const Acc* w_row, int S, int dw,
                                            int sw, int tap_step, int tap_phase, int tap_wrap) {
    int off = 0, phase = 0;
#pragma unroll 2
    for (int s = 0; s < S; ++s, w_row += TK) {
        Acc xv[QT], wv[KT];
#pragma unroll
        for (int i = 0; i < QT; ++i) xv[i] = x_row[off + 32 * i];
        load_vec16(wv, w_row);
#pragma unroll
        for (int j = 0; j < KT; ++j) {
#pragma unroll
            for (int i = 0; i < QT; ++i) acc[j][i] = fma(wv[j], xv[i], acc[j][i]);
        }
        if (kUnit) {
            off += dw;
        } else {
            off += tap_step;
            phase += tap_phase;
            if (phase >= sw) { phase -= sw; off += tap_wrap; }
        }
    }
}

}  // namespace

// The plan's tiling, passed by value beside the ConvGeometry (DIRECT_SMEM_TILING_DTYPE in
// cuconv/algos/direct_smem.py has this layout).
struct DirectSmemTiling {
    long long tiles_p, tiles_q, tiles_k, ct_max, stages, stage_elems, x_rows, x_cols, x_phase_cols;
};
static_assert(sizeof(DirectSmemTiling) == 72,
              "DIRECT_SMEM_TILING_DTYPE in cuconv/algos/direct_smem.py has this layout");

template <typename T, int KT, int QT, int WK, int MIN_BLOCKS>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS)
direct_smem(const T* __restrict__ x, const T* __restrict__ w_gck, const T* __restrict__ bias,
            T* __restrict__ out, const cuconv::ConvGeometry geo, const DirectSmemTiling t) {
    typedef typename cuconv::Acc<T>::type Acc;
    const i64 C = geo.c, H = geo.h, W = geo.w, K = geo.k, P = geo.p, Q = geo.q, R = geo.r, S = geo.s;
    const i64 groups = geo.groups, stride_h = geo.stride_h, stride_w = geo.stride_w, pad_top = geo.pad_top;
    const i64 pad_left = geo.pad_left, dil_h = geo.dil_h, dil_w = geo.dil_w, tiles_p = t.tiles_p;
    const i64 tiles_q = t.tiles_q, tiles_k = t.tiles_k, ct_max = t.ct_max, stages = t.stages;
    const i64 stage_elems_ = t.stage_elems, x_rows = t.x_rows, x_cols = t.x_cols;
    const i64 x_phase_cols = t.x_phase_cols;
    static_assert(kWarps % WK == 0, "WK must divide the warps of a block");
    static_assert(kThreads % (WK * KT) == 0, "the weight staging walks rows kThreads / TK apart");
    constexpr int TK = WK * KT;
    constexpr int TP = kWarps / WK;
    constexpr int TQ = 32 * QT;

    const int Hi = static_cast<int>(H), Wi = static_cast<int>(W), Si = static_cast<int>(S);
    const int RS = static_cast<int>(R * S);
    const int sh = static_cast<int>(stride_h), sw = static_cast<int>(stride_w);
    const int dh = static_cast<int>(dil_h), dw = static_cast<int>(dil_w);
    const int rows = static_cast<int>(x_rows), cols = static_cast<int>(x_cols);
    const int pcols = static_cast<int>(x_phase_cols), pitch = sw * pcols;  // a staged row: sw phases
    const int c_per_group = static_cast<int>(C / groups), k_per_group = static_cast<int>(K / groups);
    const int ct_cap = static_cast<int>(ct_max), n_stages = static_cast<int>(stages);
    const int ws_elems = ct_cap * RS * TK;  // a multiple of 16 bytes, as TK*sizeof(Acc)
    const int stage_elems = static_cast<int>(stage_elems_);  // ws_elems + xs rounded up to 16 bytes
    const int chunks = (c_per_group + ct_cap - 1) / ct_cap;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    Acc* __restrict__ smem = reinterpret_cast<Acc*>(smem_raw);

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

    // Requests chunk `chunk` (if it exists) into buffer chunk % stages. The loops keep their indices
    // incremental (no division per element): staging runs one copy per ~6 instructions.
    auto stage_chunk = [&](int chunk) {
        if (chunk >= chunks) return;
        const int c0 = chunk * ct_cap;
        const int ct = min(ct_cap, c_per_group - c0);
        Acc* ws = smem + (chunk % n_stages) * stage_elems;
        Acc* xs = ws + ws_elems;
        // ws: ct*R*S rows of TK channels; row (c, r, s) of w_gck holds K/groups channels, we take [k0, +TK).
        // kThreads is a multiple of TK: each thread keeps one channel kk and walks rows kThreads/TK apart.
        {
            constexpr int kRowStep = kThreads / TK;
            const int kk = threadIdx.x % TK;
            const bool valid = k0 + kk < k_per_group;
            const i64 src_step = static_cast<i64>(kRowStep) * k_per_group;
            const T* src = w_group + (static_cast<i64>(c0) * RS + threadIdx.x / TK) * k_per_group + kk;
            Acc* dst = ws + threadIdx.x;
            const T* src_ok = valid ? src : w_gck;  // a readable address when nothing is read
            const i64 step = valid ? src_step : 0;
            for (int row = threadIdx.x / TK; row < ct * RS; row += kRowStep, src_ok += step, dst += kThreads)
                stage_element(dst, src_ok, valid);
        }
        // xs: ct*rows rows, a warp per row; column col of the window goes to phase col % sw, position
        // col / sw (consecutive lanes on consecutive positions).
        int c = warp / rows, row_in = warp % rows;  // of row `warp`; kWarps rows further each time
        for (int row = warp; row < ct * rows; row += kWarps) {
            const int ih = ih0 + row_in;
            const bool inside_h = static_cast<unsigned>(ih) < static_cast<unsigned>(Hi);
            const T* src = x_group + (static_cast<i64>(c0 + c) * H + (inside_h ? ih : 0)) * W;
            Acc* dst = xs + row * pitch + lane;
            if (sw == 1) {  // position == column: one counter
                for (int col = lane; col < cols; col += 32, dst += 32) {
                    const int iw = iw0 + col;
                    const bool valid = inside_h && static_cast<unsigned>(iw) < static_cast<unsigned>(Wi);
                    stage_element(dst, src + (valid ? iw : 0), valid);
                }
            } else {
                for (int phase = 0; phase < sw; ++phase) {
                    for (int pos = lane; pos < pcols; pos += 32) {
                        const int col = pos * sw + phase;
                        const int iw = iw0 + col;
                        const bool valid =
                            inside_h && col < cols && static_cast<unsigned>(iw) < static_cast<unsigned>(Wi);
                        stage_element(dst + phase * pcols + pos - lane, src + (valid ? iw : 0), valid);
                    }
                }
            }
            row_in += kWarps;
            while (row_in >= rows) { row_in -= rows; ++c; }
        }
    };

    // Tap s of a row reads window column (lane + 32*i)*sw + s*dw: phase (s*dw) % sw, position lane + 32*i +
    // (s*dw) / sw (see row_of_taps).
    const int tap_step = dw / sw + (dw % sw) * pcols, tap_phase = dw % sw, tap_wrap = 1 - sw * pcols;
    Acc acc[KT][QT];
#pragma unroll
    for (int j = 0; j < KT; ++j) {
#pragma unroll
        for (int i = 0; i < QT; ++i) acc[j][i] = 0;
    }
    for (int s = 0; s < n_stages - 1; ++s) {
        stage_chunk(s);
        cuconv::cp_async_commit();
    }
    for (int chunk = 0; chunk < chunks; ++chunk) {
        if (n_stages == 1) {
            __syncthreads();  // every warp has finished reading the previous chunk from the one buffer
            stage_chunk(chunk);
            cuconv::cp_async_commit();
        }
        if (n_stages >= 3)
            cuconv::cp_async_wait<1>();  // chunk `chunk` has landed; chunk + 1 may still be in flight
        else
            cuconv::cp_async_wait<0>();
        __syncthreads();  // chunk `chunk` is visible to all; every warp is done with chunk - 1
        if (n_stages > 1) stage_chunk(chunk + n_stages - 1);  // into chunk - 1's buffer
        cuconv::cp_async_commit();

        const int ct = min(ct_cap, c_per_group - chunk * ct_cap);
        const Acc* ws = smem + (chunk % n_stages) * stage_elems;
        const Acc* xs = ws + ws_elems;
        for (int c = 0; c < ct; ++c) {
            for (int r = 0; r < static_cast<int>(R); ++r) {
                const Acc* x_row = xs + (c * rows + pw * sh + r * dh) * pitch + lane;
                const Acc* w_row = ws + (c * RS + r * Si) * TK + kw * KT;
                if (sw == 1)
                    row_of_taps<true, TK>(acc, x_row, w_row, Si, dw, sw, tap_step, tap_phase, tap_wrap);
                else
                    row_of_taps<false, TK>(acc, x_row, w_row, Si, dw, sw, tap_step, tap_phase, tap_wrap);
            }
        }
    }
    cuconv::cp_async_wait<0>();  // nothing is left in flight when the block exits (only empty groups remain)
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

// transpose_weight<T>(w, w_gck, groups, KG, CRS): w_gck[g][j][k] = w[g][k][j], the layout direct_smem reads
// (w: (groups·KG, CRS) row-major, KCRS). One thread per element of w_gck, grid-stride loop.
template <typename T>
__global__ void transpose_weight(const T* __restrict__ w, T* __restrict__ w_gck, i64 groups, i64 KG, i64 CRS) {
    const i64 total = groups * KG * CRS;
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        const i64 k = i % KG;
        const i64 j = (i / KG) % CRS;
        const i64 g = i / (KG * CRS);
        w_gck[i] = w[(g * KG + k) * CRS + j];
    }
}
