// implicit_gemm_wgrad_tma: wgrad on channels-last tensors fed by the TMA, no pack (sm_90a).
// Python twin: cuconv/algos/implicit_gemm/wgrad_tma.py.
#include "implicit_gemm/sm90.cuh"

// ---------------------------------------------------------------------------------------------------
// wgrad on channels-last tensors fed by the TMA (sm_90a, the 16-bit types): dW (K, C, R, S) =
// Σ over the output pixels m = (n, p, q) of dy[m, k] · x[n, p·stride_h + r·dil_h - pad_h, q·stride_w + s·dil_w -
// pad_w, c]. For one tap (r, s) that is a GEMM of dyᵀ (K × M) by the tap's im2col column matrix (M × C), whose
// reduction M is both operands' strided dimension: dy's rows and the im2col rows are pixels with their filters
// and channels contiguous, so both are MN-major operands (wgmma's transposed modes), copied as they lie in
// memory: no pack, no transposition, no column matrix. A k tile is 64 output pixels: the producer copies dy's
// 64 rows × BF filters (a tiled map over dy as an (M, K) matrix, 64-filter boxes) and the im2col column of the
// same 64 window origins at the block's tap, BC channels (the forward's im2col map, 64-channel boxes), each box
// 64 rows of 128 bytes with the 128-byte swizzle. Rows past M, filters past K, channels past C: zeros.
//
// Block (C / BC · R·S tap-major, K / BF, splits): BF / 64 consumer warpgroups of 64 filters × BC channels (m64n64
// or m64n128 wgmmas, BC / 2 fp32 a thread) and a producer warp, as implicit_gemm_wgmma_tma. Split z reduces k
// tiles [z·split_tiles, ...): with split_stride, fp32 partial sums at z·split_stride into `out` (sum_splits adds
// them in order: deterministic), else the dW tile rounded once into `out`, straight from the accumulators (a
// thread's pairs of adjacent channels as one store where dW is channels-last). dW element (k, c, r, s) sits at
// k·out_k + c·out_c + r·out_r + s·out_s (KCRS or KRSC).
//
// kGroups: groups of group_width channels and as many filters (the Python twin takes 16, 32 or 64 with BF = BC =
// 64; instances of their own, so that the one-group instances' epilogue has no group arithmetic): a block's 64
// filters and the 64 channels of the same groups (c0 = n0; grid x the taps alone) make a 64 × 64 product of
// which the group_width × group_width blocks on its diagonal are dW's (the others pair a group's filters with
// another group's channels and are not stored); channel c of a group is dW's c % group_width.
struct WgradTmaGeometry {
    int p, q, s, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, k, c, c_tiles, k_tiles, split_tiles, group_width,
        unused;
    long long out_k, out_c, out_r, out_s, split_stride;
};
static_assert(sizeof(WgradTmaGeometry) == 104, "WGRAD_TMA_GEOMETRY_DTYPE in cuconv/algos/implicit_gemm/wgrad_tma.py");

template <typename T, int BF, int BC, int STAGES, int MINB, bool kGroups>
__global__ void __launch_bounds__(BF / 64 * 128 + 32, MINB)
implicit_gemm_wgrad_tma(const T* __restrict__ x, const T* __restrict__ dy, void* __restrict__ out,
                        const WgradTmaGeometry g, const __grid_constant__ igemm::TensorMap x_map,
                        const __grid_constant__ igemm::TensorMap dy_map) {
#ifdef CUCONV_IGEMM_WGMMA
    using namespace igemm;
    constexpr int kConsumers = BF / 64 * 128;
    constexpr int kFilterBoxes = BF / 64, kChannelBoxes = BC / 64;
    constexpr int kStageBytes = (kFilterBoxes + kChannelBoxes) * kMnBoxBytes;
    constexpr int kN = BC < 128 ? BC : 128;  // channels a wgmma
    constexpr int NW = BC / kN;
    static_assert((BF == 64 || BF == 128) && (BC == 64 || BC == 128 || BC == 256) && STAGES >= 2 &&
                  sizeof(T) == 2 && (!kGroups || (BF == 64 && BC == 64)), "tile shape");

    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned base = (smem_addr(smem) + 1023u) & ~1023u;  // the swizzle's atoms: 1024-byte alignment
    const unsigned full = base + STAGES * kStageBytes, empty = full + 8 * STAGES;

    const int tid = threadIdx.x;
    const int n0 = blockIdx.y * BF;
    const int tap = blockIdx.x / g.c_tiles;
    const int c0 = kGroups ? n0 : (blockIdx.x - tap * g.c_tiles) * BC;
    const int r = tap / g.s, sc = tap - r * g.s;
    const int kt0 = blockIdx.z * g.split_tiles;
    const int k_tiles = min(g.split_tiles, g.k_tiles - kt0);
    if (tid == 0) {
        init_ring<STAGES>(full, empty, kConsumers);
        mbarrier_init_fence();
    }
    __syncthreads();

    if (tid >= kConsumers) {  // the producer warp: its first lane issues every copy
        if (tid != kConsumers) return;
        const int pq = g.p * g.q;
        const unsigned short ow = static_cast<unsigned short>(sc * g.dil_w), oh = static_cast<unsigned short>(r * g.dil_h);
        for (int kt = 0; kt < k_tiles; ++kt) {
            const int s = kt % STAGES;
            const unsigned slot = base + s * kStageBytes, bar = ring_fill<STAGES>(full, empty, kt, kStageBytes);
            const int m0 = (kt0 + kt) * 64;
            const int img = m0 / pq, rem = m0 - img * pq, op = rem / g.q, oq = rem - op * g.q;
#pragma unroll
            for (int f = 0; f < kFilterBoxes; ++f) tma_tile_2d(slot + f * kMnBoxBytes, dy_map, n0 + 64 * f, m0, bar);
#pragma unroll
            for (int j = 0; j < kChannelBoxes; ++j)
                tma_im2col_4d(slot + (kFilterBoxes + j) * kMnBoxBytes, x_map, c0 + 64 * j,
                              oq * g.stride_w - g.pad_w, op * g.stride_h - g.pad_h, img, ow, oh, bar);
        }
        return;
    }

    const int wg = tid / 128;
    float acc[NW][kN / 2];
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) acc[n][i] = 0.f;

    for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % STAGES;
        ring_wait_full<STAGES>(full, kt);
        const unsigned a = base + s * kStageBytes + wg * kMnBoxBytes;  // this warpgroup's 64 filters
        const unsigned b = base + s * kStageBytes + kFilterBoxes * kMnBoxBytes;
        wgmma_fence();
#pragma unroll
        for (int step = 0; step < 4; ++step)  // 16 pixels (rows of 128 bytes) a step: 2048 bytes on
#pragma unroll
            for (int n = 0; n < NW; ++n)
                WgmmaMn<T, kN>::run(acc[n], wgmma_desc_mn(a + step * 2048),
                                    wgmma_desc_mn(b + n * (kN / 64) * kMnBoxBytes + step * 2048));
        wgmma_commit();
        ring_release_previous<STAGES>(empty, kt);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int n = 0; n < NW; ++n) fence_acc(acc[n]);

    // Accumulator i of a thread: filter (lane / 4) + 8·((i / 2) % 2) of its warp's 16, channel 2·(lane % 4) +
    // (i % 2) + 8·(i / 4) of the wgmma's kN. C is a multiple of 8: a pair's channels are both in range or not.
    const int lane = tid & 31;
    const int f_lane = n0 + wg * 64 + (tid / 32 % 4) * 16 + lane / 4;
    const long long tap_offset = r * g.out_r + sc * g.out_s;
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int i = 0; i < kN / 2; i += 2) {
            const int f = f_lane + 8 * ((i / 2) % 2);
            const int c = c0 + n * kN + 8 * (i / 4) + 2 * (lane % 4);
            if (f >= g.k || c >= g.c) continue;
            int cw = c;  // dW's channel: within the filter's group
            if constexpr (kGroups) {
                if (f / g.group_width != c / g.group_width) continue;
                cw = c % g.group_width;
            }
            const long long o = f * g.out_k + cw * g.out_c + tap_offset;
            if (g.split_stride != 0) {
                float* p = static_cast<float*>(out) + blockIdx.z * g.split_stride + o;
                if (g.out_c == 1) {
                    *reinterpret_cast<float2*>(p) = make_float2(acc[n][i], acc[n][i + 1]);
                } else {
                    p[0] = acc[n][i];
                    p[g.out_c] = acc[n][i + 1];
                }
            } else {
                T* p = static_cast<T*>(out) + o;
                if (g.out_c == 1) {
                    *reinterpret_cast<unsigned*>(p) = pair_word<T>(acc[n][i], acc[n][i + 1]);
                } else {
                    p[0] = from_acc<T>(acc[n][i]);
                    p[g.out_c] = from_acc<T>(acc[n][i + 1]);
                }
            }
        }
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}
