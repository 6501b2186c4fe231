// winograd_fused: a 3x3 convolution (stride 1, dilation 1, one group) as Winograd F(2x2, 3x3) in one kernel,
// float32 FFMA; no transformed operand goes through global memory.
//
// Every 2x2 output tile t of filter k comes from a 4x4 input tile d_t through the 16 points (a, b) of
// winograd.cuh's F(2, 3) (interpolation points 0, 1, -1, infinity):
//   U[a, b, c, k] = (G · w[k, c] · Gᵀ)[a, b]                      winograd_fused_weight, once per call
//   V[a, b, c, t] = (BT · d_t[c] · BTᵀ)[a, b]                     per block, into shared memory
//   M[a, b, k, t] = Σ_c U[a, b, c, k] · V[a, b, c, t]             16 GEMMs, per block, in registers
//   y_t[k]        = AT · M[:, :, k, t] · ATᵀ  (+ bias[k])         per block, through shared memory
// 16 products per 4 outputs and input channel instead of 36 (2.25x fewer FFMA); BT and AT hold only 0 and
// ±1, G halves (exact in binary), so the error stays that of a direct sum of a few more terms.
//
// Kernels (float32 only: a lane's 128 accumulators would need 256 registers in float64):
//   winograd_fused_weight(w, u, K, C, c_pad, k_pad)   one thread per (k, c); w is (K, C, 3, 3), u is
//       (16, c_pad, k_pad) and zero where c >= C or k >= K (the caller zero-fills it)
//   winograd_fused_3x3<BK, BT, WARPS, CC, MIN_BLOCKS, OVERLAP>(x, u, bias, y, w, ...)   MIN_BLOCKS: per SM
//       (registers); w (the weights as given) only for outputs that come out non-finite (wino::direct_output).
//       A work item is (sample n, tile row th, BT tiles of that row, BK filters); block b takes items b,
//       b + gridDim.x, ... (wfused::decode: the filter block fastest, so the items in flight share input rows in
//       L2). x NCHW, y NCHW. OVERLAP: M has shared memory of its own, so the next item's first chunk is staged
//       during this item's last chunk and arrives while its outputs are transformed and stored (the caller
//       launches a block per SM); otherwise M lies over the staging buffers (the caller launches a block per
//       item, and a block takes one).
// A block walks the input channels CC at a time, two shared-memory buffers deep: U's slice and the input
// rows of the next chunk (CC channels x 4 rows x 2·BT + 2 columns, zero outside the image) arrive by
// cp.async while the current chunk's products run; then each thread transforms 4x4 input tiles of those rows
// into V. The 16 points are split over
// the warps (16 / WARPS each); a lane keeps, per point, an 8-filter x (BT / 4)-tile register tile (filters
// kg·4.. and BK/2 + kg·4.., tiles tg·4.. every BT / NTV), so per channel and point it reads two 16-byte U
// vectors (8 lanes' distinct vectors: one wavefront) and NTV V vectors for 32 · NTV FFMA. Afterwards the
// accumulators cross shared memory as M[point][filter][tile], the first BK/2 filters then the others (row
// stride BT + 4: conflict-free 16-byte stores), and each thread takes (filter, tile) pairs, transforms 16
// points into 2x2 outputs and stores them (two floats at a time where rows are 8-byte aligned: consecutive
// threads, consecutive tiles).
// Index arithmetic of x and y is 64-bit; padding and image edges are zero-filled by the loads' masks.
#include "common.cuh"
#include "winograd.cuh"

using cuconv::i64;

namespace wfused {

constexpr int kPoints = 16;  // F(2x2, 3x3): 4x4 points

template <int BK, int BT, int WARPS, int CC, bool OVERLAP>
struct Config {
    static constexpr int kThreads = 32 * WARPS;
    static constexpr int kPointsPerWarp = kPoints / WARPS;
    static constexpr int kLanesK = BK / 8;         // lanes along filters (8 filters each)
    static constexpr int kLanesT = 32 / kLanesK;   // lanes along tiles
    static constexpr int kTilesPerLane = BT / kLanesT;
    static constexpr int kTileVectors = kTilesPerLane / 4;
    static constexpr int kLdM = BT + 4;            // M's row stride: 4 mod 8, conflict-free 16-byte stores
    static constexpr int kUFloats = kPoints * CC * BK;  // one buffer
    static constexpr int kVFloats = kPoints * CC * BT;
    static constexpr int kRawCols = 2 * BT + 2;   // the input columns of BT tiles
    static constexpr int kRawPitch = (kRawCols + 31) / 32 * 32;
    static constexpr int kRawFloats = CC * 4 * kRawPitch;
    static constexpr int kHalfFilters = BK / 2;  // the epilogue's M holds half the filters at a time
    static constexpr int kMFloats = kPoints * kHalfFilters * kLdM;
    static constexpr int kStagingFloats = 2 * (kUFloats + kVFloats + kRawFloats);
    static constexpr int kSmemFloats =
        OVERLAP ? kStagingFloats + kMFloats : (kStagingFloats > kMFloats ? kStagingFloats : kMFloats);
    static_assert(kPoints % WARPS == 0, "the points split evenly over the warps");
    static_assert(BK % 8 == 0 && 32 % kLanesK == 0 && BT % (4 * kLanesT) == 0, "lane tiles of 8 x 4n");
    static_assert(kUFloats % 4 == 0 && kVFloats % 4 == 0, "16-byte aligned buffers");
    static_assert(kThreads % BT == 0, "the epilogue's threads split evenly over the tiles");
};

}  // namespace wfused

__global__ void __launch_bounds__(256)
winograd_fused_weight(const float* __restrict__ w, float* __restrict__ u, i64 K, i64 C, i64 c_pad, i64 k_pad) {
    using T = float;
    constexpr const wino::Axis<2, 3>& ax = wino::Table<2, 3>::value;
    const i64 total = K * C;
    for (i64 idx = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += static_cast<i64>(gridDim.x) * blockDim.x) {
        const i64 k = idx / C, c = idx - k * C;
        const T* __restrict__ src = w + idx * 9;
        T taps[3][3];
#pragma unroll
        for (int i = 0; i < 3; ++i)
#pragma unroll
            for (int j = 0; j < 3; ++j) taps[i][j] = src[i * 3 + j];
        T out[4][4];
        wino::transform(ax.g, taps, ax.g, out);
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b) u[((a * 4 + b) * c_pad + c) * k_pad + k] = out[a][b];
    }
}

// The launch's padded channel and filter counts of U, its grid's tile rows of a sample, tile column blocks and
// filter blocks, and its work items (a block's worth: tile rows x column blocks x filter blocks x samples)
// (FUSED_TILES_DTYPE in cuconv/algos/winograd_fused.py has this layout).
struct FusedTiles {
    long long c_pad, k_pad;
    int tiles_h, col_blocks, k_blocks, items;
};
static_assert(sizeof(FusedTiles) == 32, "FUSED_TILES_DTYPE in cuconv/algos/winograd_fused.py has this layout");

namespace wfused {

// A work item's sample, tile row, tile column block and first filter: the filter block fastest, then the tile
// column block, then (n, tile row), so the items in flight at once share input rows (L2). Fewer than 2^31 items
// (the caller checks): 32-bit divisions (64-bit ones are long subroutines).
struct Item {
    i64 n, th;
    int cb, k0;
};

template <int BK>
__device__ __forceinline__ Item decode(unsigned item, const FusedTiles& tiling) {
    const unsigned kb = item % static_cast<unsigned>(tiling.k_blocks);
    const unsigned rest = item / static_cast<unsigned>(tiling.k_blocks);
    const unsigned cb = rest % static_cast<unsigned>(tiling.col_blocks);
    const unsigned row = rest / static_cast<unsigned>(tiling.col_blocks);
    const unsigned n = row / static_cast<unsigned>(tiling.tiles_h);
    return Item{static_cast<i64>(n), static_cast<i64>(row - n * static_cast<unsigned>(tiling.tiles_h)),
                static_cast<int>(cb), static_cast<int>(kb) * BK};
}

}  // namespace wfused

template <int BK, int BT, int WARPS, int CC, int MIN_BLOCKS, bool OVERLAP>
__global__ void __launch_bounds__(32 * WARPS, MIN_BLOCKS)
winograd_fused_3x3(const float* __restrict__ x, const float* __restrict__ u, const float* __restrict__ bias,
                   float* __restrict__ y, const float* __restrict__ w,
                   const cuconv::ConvGeometry geo, const FusedTiles tiling) {
    using T = float;
    const i64 C = geo.c, H = geo.h, W = geo.w, K = geo.k, P = geo.p, Q = geo.q, pad_top = geo.pad_top;
    const i64 pad_left = geo.pad_left, c_pad = tiling.c_pad, k_pad = tiling.k_pad;
    const unsigned items = static_cast<unsigned>(tiling.items);
    using Cfg = wfused::Config<BK, BT, WARPS, CC, OVERLAP>;
    constexpr int kThreads = Cfg::kThreads, kPPW = Cfg::kPointsPerWarp, kTPL = Cfg::kTilesPerLane;
    constexpr int kNTV = Cfg::kTileVectors, kLdM = Cfg::kLdM, kBKH = Cfg::kHalfFilters;
    constexpr const wino::Axis<2, 3>& ax = wino::Table<2, 3>::value;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* const u_s = reinterpret_cast<float*>(smem_raw);  // [2][16][CC][BK]
    float* const v_s = u_s + 2 * Cfg::kUFloats;             // [2][16][CC][BT]
    float* const raw_s = v_s + 2 * Cfg::kVFloats;  // [2][CC][4][kRawPitch]: the chunk's input rows
    // [16][BK / 2][kLdM]: half the filters' M at a time; beside the staging buffers (OVERLAP) or over them
    float* const m_s = u_s + (OVERLAP ? Cfg::kStagingFloats : 0);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int kg = lane / Cfg::kLanesT, tg = lane % Cfg::kLanesT;

    // ---- staging: U's slice and the chunk's input rows by cp.async; input tiles from there into V --------
    // Per thread: U vectors (pt0 + e·kPointStep, c_u, kv) for e < kUPerThread, and input columns lane,
    // lane + 32, ... of rows warp·kRowsPerWarp.. of the chunk's CC x 4 staged rows.
    constexpr int kUPerThread = Cfg::kUFloats / 4 / kThreads;
    constexpr int kPointStep = kThreads / (CC * BK / 4);
    static_assert(Cfg::kUFloats / 4 % kThreads == 0 && kThreads % (CC * BK / 4) == 0, "U's slice splits evenly");
    const int u_pt0 = tid / (CC * BK / 4), u_c = tid % (CC * BK / 4) / (BK / 4), u_kv = tid % (BK / 4);
    const i64 u_point_stride = kPointStep * c_pad * k_pad;
    const unsigned u_dst0 = cuconv::smem_addr(u_s + (u_pt0 * CC + u_c) * BK + u_kv * 4);
    // Input rows: warp w stages rows w·kRowsPerWarp.. of the chunk's CC x 4 (channel cl = row / 4, input row
    // h0 + row % 4), lane l columns l, l + 32, ... of kRawPitch (a multiple of 32: every lane copies, the
    // columns past kRawCols are zero-filled and never read); rows and columns outside the image are zeros.
    constexpr int kRowsPerWarp = CC * 4 / WARPS;
    constexpr int kColsPerLane = Cfg::kRawPitch / 32;
    static_assert((CC * 4) % WARPS == 0, "the staged rows split evenly over the warps");

    // What staging an item's chunks needs, decided once per item: its sample's input and U's filter block,
    // its first input row and this lane's first column, which of this lane's columns lie inside the image.
    struct Source {
        const float* x_n;
        const float* u_k;
        i64 h0, w0;
        bool col_in[kColsPerLane];
    };
    auto source = [&](unsigned item) {
        const wfused::Item it = wfused::decode<BK>(item, tiling);
        Source src;
        src.x_n = x + it.n * C * H * W;
        src.u_k = u + (static_cast<i64>(u_pt0) * c_pad + u_c) * k_pad + it.k0 + u_kv * 4;
        src.h0 = 2 * it.th - pad_top;
        src.w0 = 2 * static_cast<i64>(it.cb) * BT - pad_left + lane;
#pragma unroll
        for (int j = 0; j < kColsPerLane; ++j)
            src.col_in[j] = lane + 32 * j < Cfg::kRawCols && src.w0 + 32 * j >= 0 && src.w0 + 32 * j < W;
        return src;
    };
    auto stage = [&](const Source& src, int chunk, int buf) {
        const float* u_src = src.u_k + static_cast<i64>(chunk) * CC * k_pad;
        const unsigned u_dst = u_dst0 + buf * Cfg::kUFloats * 4;
#pragma unroll
        for (int e = 0; e < kUPerThread; ++e)
            cuconv::cp_async_cg16(u_dst + e * kPointStep * CC * BK * 4, u_src + e * u_point_stride, true);
        const unsigned raw_dst = cuconv::smem_addr(raw_s + buf * Cfg::kRawFloats + lane);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
            const int row = warp * kRowsPerWarp + r, cl = row / 4, dh = row % 4;
            const i64 c = static_cast<i64>(chunk) * CC + cl, h = src.h0 + dh;
            const bool row_in = c < C && h >= 0 && h < H;
            const float* src_row = src.x_n + (c * H + h) * W + src.w0;
#pragma unroll
            for (int j = 0; j < kColsPerLane; ++j) {
                const bool in = row_in && src.col_in[j];
                cuconv::cp_async_ca<4>(raw_dst + (row * Cfg::kRawPitch + 32 * j) * 4, in ? src_row + 32 * j : x, in);
            }
        }
        cuconv::cp_async_commit();
    };
    // Input tile (c, t) of the chunk in buf: rows 0..3, columns 2t..2t+3 of its staged rows, into V.
    auto transform_tiles = [&](int buf) {
        const float* raw = raw_s + buf * Cfg::kRawFloats;
        float* v_dst = v_s + buf * Cfg::kVFloats;
#pragma unroll
        for (int e = 0; e < (CC * BT + kThreads - 1) / kThreads; ++e) {
            const int idx = tid + e * kThreads, cl = idx / BT, tl = idx % BT;
            if ((CC * BT) % kThreads != 0 && idx >= CC * BT) break;
            float d[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) d[i][j] = raw[(cl * 4 + i) * Cfg::kRawPitch + 2 * tl + j];
            float v[4][4];
            wino::transform(ax.bt, d, ax.bt, v);
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int b = 0; b < 4; ++b) v_dst[((a * 4 + b) * CC + cl) * BT + tl] = v[a][b];
        }
    };

    const int chunks = static_cast<int>(c_pad / CC);
    int buf = 0;
    bool staged = false;  // the first chunk of this item is on its way into buf (staged under the last one's work)
    for (unsigned item = blockIdx.x; item < items; item += gridDim.x) {
        const unsigned next = item + gridDim.x;
        const Source src = source(item);
        if (chunks > 0) {  // C == 0: the output is the bias
            if (!staged) stage(src, 0, buf);
            cuconv::cp_async_wait<0>();
            __syncthreads();
            transform_tiles(buf);
            __syncthreads();
        }
        staged = false;

        // ---- the channel loop: 16 GEMMs of (BK x BT) over CC channels per chunk -------------------------
        float acc[kPPW][8][kTPL];
#pragma unroll
        for (int p = 0; p < kPPW; ++p)
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < kTPL; ++j) acc[p][i][j] = 0.0f;

        for (int chunk = 0; chunk < chunks; ++chunk) {
            const bool more = chunk + 1 < chunks;
            if (more) {
                stage(src, chunk + 1, buf ^ 1);
            } else if (OVERLAP && next < items) {  // the next item's first chunk arrives under this one's epilogue
                stage(source(next), 0, buf ^ 1);
                staged = true;
            }
            const float* u_b = u_s + buf * Cfg::kUFloats;
            const float* v_b = v_s + buf * Cfg::kVFloats;
#pragma unroll
            for (int c = 0; c < CC; ++c) {
#pragma unroll
                for (int p = 0; p < kPPW; ++p) {
                    const int pt = warp * kPPW + p;
                    const float* u_row = u_b + (pt * CC + c) * BK;
                    const float* v_row = v_b + (pt * CC + c) * BT;
                    const float4 ua = *reinterpret_cast<const float4*>(u_row + kg * 4);
                    const float4 ub = *reinterpret_cast<const float4*>(u_row + BK / 2 + kg * 4);
                    const float uk[8] = {ua.x, ua.y, ua.z, ua.w, ub.x, ub.y, ub.z, ub.w};
                    float vt[kTPL];
#pragma unroll
                    for (int vv = 0; vv < kNTV; ++vv) {
                        const float4 q = *reinterpret_cast<const float4*>(v_row + vv * (BT / kNTV) + tg * 4);
                        vt[vv * 4 + 0] = q.x;
                        vt[vv * 4 + 1] = q.y;
                        vt[vv * 4 + 2] = q.z;
                        vt[vv * 4 + 3] = q.w;
                    }
#pragma unroll
                    for (int i = 0; i < 8; ++i)
#pragma unroll
                        for (int j = 0; j < kTPL; ++j) acc[p][i][j] = fmaf(uk[i], vt[j], acc[p][i][j]);
                }
            }
            if (more) {
                cuconv::cp_async_wait<0>();
                __syncthreads();  // the next chunk's rows are in, from every thread
                transform_tiles(buf ^ 1);
            }
            __syncthreads();  // V of the next chunk is written; this chunk's buffers are free
            buf ^= 1;
        }

        // ---- epilogue, a half of the filters at a time: M through shared memory, then 2x2 outputs -------
        // A lane's accumulators i < 4 are filters kg·4.. of the first half, i >= 4 the same of the second.
        const wfused::Item it = wfused::decode<BK>(item, tiling);
        const int tl = tid % BT;
        const i64 q0 = 2 * (static_cast<i64>(it.cb) * BT + tl), p0 = 2 * it.th;
        const bool q1_in = q0 + 1 < Q, p1_in = p0 + 1 < P;
        const bool pairs = q1_in && Q % 2 == 0 && reinterpret_cast<unsigned long long>(y) % 8 == 0;
        constexpr int kKStep = kThreads / BT;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            // every thread is past the channel loop's last barrier, or done reading the other half
            if (half == 1 || chunks == 0) __syncthreads();
#pragma unroll
            for (int p = 0; p < kPPW; ++p) {
                const int pt = warp * kPPW + p;
#pragma unroll
                for (int ii = 0; ii < 4; ++ii) {
                    const int i = half * 4 + ii;
                    T* m_row = m_s + (pt * kBKH + kg * 4 + ii) * kLdM;
#pragma unroll
                    for (int vv = 0; vv < kNTV; ++vv) {
                        float4 q;
                        q.x = acc[p][i][vv * 4 + 0];
                        q.y = acc[p][i][vv * 4 + 1];
                        q.z = acc[p][i][vv * 4 + 2];
                        q.w = acc[p][i][vv * 4 + 3];
                        *reinterpret_cast<float4*>(m_row + vv * (BT / kNTV) + tg * 4) = q;
                    }
                }
            }
            __syncthreads();
            if (q0 >= Q) continue;
            const int kh = it.k0 + half * kBKH;  // the half's first filter
            int kl = tid / BT;
            float* out = y + ((it.n * K + kh + kl) * P + p0) * Q + q0;
            for (; kl < kBKH && kh + kl < K; kl += kKStep, out += kKStep * P * Q) {
                float e[4][4];
#pragma unroll
                for (int a = 0; a < 4; ++a)
#pragma unroll
                    for (int b = 0; b < 4; ++b) e[a][b] = m_s[((a * 4 + b) * kBKH + kl) * kLdM + tl];
                float o[2][2];
                wino::transform(ax.at, e, ax.at, o);
                // a NaN or Inf among the tile's inputs (see wino::direct_output): one test for the four outputs
                // (their sum is non-finite if any is; one that overflows only costs a needless recomputation)
                if (!isfinite((o[0][0] + o[0][1]) + (o[1][0] + o[1][1]))) {
#pragma unroll
                    for (int i = 0; i < 2; ++i)
#pragma unroll
                        for (int j = 0; j < 2; ++j)
                            if (!isfinite(o[i][j]))
                                o[i][j] = wino::direct_output(x, w, it.n, kh + kl, p0 + i, q0 + j, C, H, W, 3, 3,
                                                              pad_top, pad_left);
                }
                const float add = bias != nullptr ? __ldg(bias + kh + kl) : 0.0f;
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    if (i == 1 && !p1_in) break;
                    float* out_row = out + i * Q;
                    if (pairs) {
                        *reinterpret_cast<float2*>(out_row) = make_float2(o[i][0] + add, o[i][1] + add);
                    } else {
                        out_row[0] = o[i][0] + add;
                        if (q1_in) out_row[1] = o[i][1] + add;
                    }
                }
            }
        }
        if (!OVERLAP) break;  // a block per item (M lies over the staging buffers the next item would need)
    }
}
