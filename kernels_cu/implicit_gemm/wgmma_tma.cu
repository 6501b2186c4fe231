// implicit_gemm's TMA-fed wgmma GEMMs (sm_90a): implicit_gemm_wgmma_tma and its TMA-store (_st), persistent
// (_pst) and strided dgrad phases (_phases) instances, the row-band implicit_gemm_wgmma_tma_rows (_st).
// Python twin: cuconv/algos/implicit_gemm/wgmma_tma.py.
#include "implicit_gemm/sm90.cuh"

// ---------------------------------------------------------------------------------------------------
// The wgmma GEMM fed by the tensor memory accelerator (sm_90a): no thread computes an address or issues a copy
// per row. implicit_gemm_wgmma's threads each issue a k tile's cp.asyncs (16 bytes a row, through L1), and ncu
// read the L1/TEX unit as the busiest (64-78% on the dense layers and the large problems, the tensor pipe at
// 28-51%). Here one thread issues a k tile as two bulk copies: the input's im2col column of BP pixels at one
// tap and TK channels (a tensor map in im2col mode over the NHWC input: the window origins of the block's
// output pixels, wrapping across rows and images, zeros outside the image and past the batch; the tap as the
// copy's offsets) and the weight's BF rows × TK k (a tiled map over the (rows, w_row) weight, rows past it
// zero), both written with the KB-byte swizzle that wgmma's descriptors read. A k tile is one tap and TK = KB / 2
// channels (128-byte tiles of 64 channels; 64- and 32-byte ones of 32 and 16 for narrow layers, whose taps would
// otherwise fill a 64-channel tile in part or straddle two: the Python twin takes this kernel where a group's
// padded channels cp are a multiple of TK, in the 16-bit types), so k tile kk is tap kk / (cp / TK), channels
// TK · (kk % (cp / TK)), weight columns TK · kk.
//
// Block: BF / 64 consumer warpgroups (64 filters × BP pixels each, m64n128 wgmmas as implicit_gemm_wgmma), then
// one producer warp whose first lane issues the copies. Slot s of STAGES has a full barrier (the producer's
// one arrival with the slot's byte count; the copies complete it) and an empty one (every consumer thread
// arrives once its wgmmas reading the slot are retired, one tile late: one tile of wgmmas stays in flight).
// The producer refills slot s for tile kt once tile kt - STAGES is released. Tile kt is phase kt / STAGES of
// its slot. Shared memory (WgmmaTmaTile.smem_bytes): the slots (the epilogue's staging reuses them once every
// tile is consumed), then 2 · STAGES 8-byte barriers and a word (block_diag_fixup's flag). At least MINB blocks an
// SM (the register budget).
// Block-diagonal groups (Geometry.block_diag: the groups' width): a tile's products of a group's filters with the
// other groups' channels are zeros times those channels, NaN where one holds Inf or NaN, which a grouped
// convolution's other groups never see. Where a block's sums came out non-finite, its outputs stored non-finite
// are summed again directly over their own group's channels (the weight's row for them, x where it lies): what
// the group's own inputs make non-finite stays so, what another group's made so comes out as the group's sum.
template <typename T, int BF, int BP>
__device__ __forceinline__ void block_diag_fixup(const T* __restrict__ x, const T* __restrict__ wp,
                                              const T* __restrict__ bias, T* __restrict__ y, const igemm::Geometry& g,
                                              int m0, int n0, int tid, int threads) {
    const int gw = g.block_diag, pq = g.p * g.q, taps = g.r * g.s;
    for (int idx = tid; idx < BP * BF; idx += threads) {
        const int m = m0 + idx / BF, f = n0 + idx % BF;
        if (m >= g.m || f >= g.k) continue;
        const int img = m / pq, rem = m - img * pq, op = rem / g.q, oq = rem - op * g.q;
        T* yp = y + img * g.out_img + op * static_cast<long long>(g.out_row) + oq * static_cast<long long>(g.out_col) + f;
        if (isfinite(to_acc(*yp))) continue;
        const int c0 = f - f % gw, j0 = c0 - (f - f % g.cp);  // the group's first channel, its weight column
        float v = bias != nullptr ? to_acc(bias[f]) : 0.f;
        for (int t = 0; t < taps; ++t) {
            const int r = t / g.s, s = t - r * g.s;
            const int ih = op * g.stride_h - g.pad_h + r * g.dil_h, iw = oq * g.stride_w - g.pad_w + s * g.dil_w;
            if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
            const T* xp = x + ((static_cast<long long>(img) * g.h + ih) * g.w + iw) * g.pix + c0;
            const T* wr = wp + f * g.w_row + static_cast<long long>(t) * g.cp + j0;
            for (int c = 0; c < gw; ++c) v = fmaf(to_acc(xp[c]), to_acc(wr[c]), v);
        }
        *yp = from_acc<T>(v);
    }
}

namespace cuconv {
namespace igemm {
#ifdef CUCONV_IGEMM_WGMMA
// A box of shared memory to a tiled map's box at (x, y) (columns, rows), and the bulk group's wait for every such
// store to have read its shared memory.
__device__ __forceinline__ void tma_store_2d(const TensorMap& map, unsigned src, int x, int y) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                 ::"l"(reinterpret_cast<unsigned long long>(&map)), "r"(x), "r"(y), "r"(src) : "memory");
}
__device__ __forceinline__ void tma_store_3d(const TensorMap& map, unsigned src, int x, int y, int z) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n"
                 ::"l"(reinterpret_cast<unsigned long long>(&map)), "r"(x), "r"(y), "r"(z), "r"(src) : "memory");
}
__device__ __forceinline__ void tma_store_commit_and_wait() {
    asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void tma_store_drain() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// The TMA forward's epilogue into a dense channels-last output (implicit_gemm_wgmma_tma_st): wgmma_epilogue spends
// its time issuing instructions (square_3x3_1024: 14 K warp instructions a 128 × 128 tile, the tensor pipe 17%
// busy), each accumulator a 4-byte store of fp32 and every 16 bytes of output 8 loads and conversions. Here a
// thread adds its two filters' bias to its accumulators and rounds them in pairs of pixels, and a warp's stmatrix
// (.trans: an 8 × 8 block of filters × pixels stored as 8 pixels' 16 bytes of filters) writes 4 such blocks an
// instruction into the staging: a [BP pixels][64 filters] box a warpgroup, 128-byte rows with the 128-byte swizzle
// (chunk c of pixel r at c ^ (r % 8): the 8 rows of a block hit 8 distinct chunks, no bank conflicts). Then one
// thread stores the boxes with the TMA through y_map (the output as an (N·P·Q) × K matrix, 64 × BP boxes; rows and
// filters past it are not written) and waits until they have read the staging. `stage`: 1024-byte aligned, free.
// kRows (implicit_gemm_wgmma_tma_rows_st): y_map is the output as N·P rows of Q pixels × K (3-D), the block's
// pixels q0 (`m0`) on of output row `row`: pixels past the row's Q are not stored.
// kOverlap (implicit_gemm_wgmma_tma_pst, a staging of its own): the stores of the block's previous tile may still
// be reading it: the storing thread waits for them before the consumers meet, and returns as soon as this tile's
// are issued (the block's last ones: tma_store_drain before it exits).
// The epilogue applied to the accumulators in place before the stores: the bias and the launch's activation, and the
// residual (r_map: a map of it as y_map is of the output) added before or after the activation, its box copied by the
// TMA into the staging where the output's box will lie (zeros past the output, as the store clips there) and read
// back with ldmatrix, the inverse of the store's stmatrix: each thread gets the residual's values of its own
// accumulators, in fp32 before the one rounding. r_bar: a barrier free once the consumers meet (phase r_parity next).
// The launch's activation is chosen once, outside the loop over the 64·NW elements, and each activation's loop holds
// that activation's code alone: chosen at each element, the code of all nine made the store loop 14x longer, a 1x1
// channels-last layer with a ReLU twice as slow as with a residual and the shared-memory store, and GELU's erf
// spilled the persistent kernel's registers; a copy of the whole store loop (addresses, stmatrix) per activation
// doubled the persistent instances' compile time. A loop of arithmetic per activation and one store loop compile in
// half that time, without spills (docs/perf-notes.md, "Fused blocks").
template <int kAct, typename T, int NW>
__device__ __forceinline__ void bias_act(float (&acc)[NW][64], float b0, float b1, const Epi<T>& ep) {
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int i = 0; i < 64; ++i) {  // (element i of the wgmma's fragment: filter f0 + 8 where i % 4 >= 2)
            acc[n][i] = activate<kAct, float>(acc[n][i] + (i % 4 >= 2 ? b1 : b0), ep.alpha);
        }
}

template <typename T, int NW>
__device__ __forceinline__ void bias_act_any(float (&acc)[NW][64], float b0, float b1, const Epi<T>& ep) {
    switch (ep.act) {
        case 0: bias_act<0>(acc, b0, b1, ep); break;
        case 1: bias_act<1>(acc, b0, b1, ep); break;
        case 2: bias_act<2>(acc, b0, b1, ep); break;
        case 3: bias_act<3>(acc, b0, b1, ep); break;
        case 4: bias_act<4>(acc, b0, b1, ep); break;
        case 5: bias_act<5>(acc, b0, b1, ep); break;
        case 6: bias_act<6>(acc, b0, b1, ep); break;
        case 7: bias_act<7>(acc, b0, b1, ep); break;
        case 8: bias_act<8>(acc, b0, b1, ep); break;
        case 9: bias_act<9>(acc, b0, b1, ep); break;
    }
}

// The staged box's values added to the accumulators: the ldmatrix (.trans) of each block the store loop's stmatrix
// writes, at the same addresses (box: the warpgroup's; q, r, chunk: the lane's row and the warp's 16-byte chunk).
template <typename T, int NW>
__device__ __forceinline__ void add_staged(float (&acc)[NW][64], unsigned box, int q, int r, int chunk) {
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int j = 0; j < 16; j += 2) {
            const int pixel = n * 128 + 8 * (j + q / 2) + r;
            const unsigned addr = box + pixel * 128 + ((chunk ^ (pixel % 8)) << 4);
            unsigned v[4];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(addr) : "memory");
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int i = 4 * (j + k / 2) + 2 * (k % 2);
                acc[n][i] += word_half<T>(v[k], 0);
                acc[n][i + 1] += word_half<T>(v[k], 1);
            }
        }
}

template <typename T, int BF, int BP, int NW, bool kRows = false, bool kOverlap = false>
__device__ __forceinline__ void tma_store_epilogue(float (&acc)[NW][64], unsigned stage, const Geometry& g,
                                                   const Epi<T>& ep, const TensorMap& y_map, int m0,
                                                   int n0, int row = 0, const TensorMap* r_map = nullptr,
                                                   unsigned r_bar = 0, unsigned r_parity = 0) {
    constexpr int kThreads = BF / 64 * 128;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32, wg = tid / 128;
    const int f0 = n0 + wg * 64 + (warp % 4) * 16 + lane / 4;  // the thread's filters f0, f0 + 8
    const float b0 = f0 < g.k ? bias_at(ep, f0) : 0.f, b1 = f0 + 8 < g.k ? bias_at(ep, f0 + 8) : 0.f;
    const bool residual = r_map != nullptr && ep.res != 0;
    const unsigned box = stage + wg * BP * 128;
    const int q = lane / 8, r = lane % 8;  // this lane's address: row r of block q of an stmatrix
    const int chunk = (warp % 4) * 2 + q % 2;  // the block's 8 filters: a 16-byte chunk of the box's row
    // (one call of bias_act_any, its ten loops: each call site more is the code of all ten again)
    if (residual) {
        if (kOverlap && tid == 0) tma_store_drain();
        epilogue_sync<kThreads, true>();  // (the slots or, kOverlap, the staging free: as below)
        if (tid == 0) {  // the residual's boxes where the output's will be staged (none wholly past K)
            const int boxes = min(BF / 64, (g.k - n0 + 63) / 64);
            mbarrier_expect_bytes(r_bar, boxes * BP * 128);
            for (int b = 0; b < boxes; ++b) {
                if constexpr (kRows)
                    tma_tile_3d(stage + b * BP * 128, *r_map, n0 + b * 64, m0, row, r_bar);
                else
                    tma_tile_2d(stage + b * BP * 128, *r_map, n0 + b * 64, m0, r_bar);
            }
        }
        mbarrier_wait(r_bar, r_parity);
        if (ep.res == 1) add_staged<T, NW>(acc, box, q, r, chunk);  // (before the activation)
    }
    bias_act_any<T, NW>(acc, b0, b1, ep);
    if (residual) {
        if (ep.res == 2) add_staged<T, NW>(acc, box, q, r, chunk);
    } else {
        if (kOverlap && tid == 0) tma_store_drain();
        epilogue_sync<kThreads, true>();  // (every consumer's wgmmas retired: the slots, kOverlap: the staging free)
    }
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int j = 0; j < 16; j += 2) {  // pixel groups j, j + 1 of the wgmma's 128: blocks (f0, j), (f0 + 8, j)..
            unsigned v[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int i = 4 * (j + k / 2) + 2 * (k % 2);
                v[k] = pair_word<T>(acc[n][i], acc[n][i + 1]);
            }
            const int pixel = n * 128 + 8 * (j + q / 2) + r;
            const unsigned addr = box + pixel * 128 + ((chunk ^ (pixel % 8)) << 4);
            asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
                         ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
        }
    fence_proxy_async();  // (the staging, written through the generic proxy, is read by the TMA's)
    epilogue_sync<kThreads, true>();
    if (tid == 0) {
#pragma unroll
        for (int b = 0; b < BF / 64 && n0 + b * 64 < g.k; ++b) {  // (a box wholly past K: nothing to store)
            if constexpr (kRows)
                tma_store_3d(y_map, stage + b * BP * 128, n0 + b * 64, m0, row);
            else
                tma_store_2d(y_map, stage + b * BP * 128, n0 + b * 64, m0);
        }
        if constexpr (kOverlap)
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        else
            tma_store_commit_and_wait();
    }
}
#endif
}  // namespace igemm
}  // namespace cuconv

namespace cuconv {
namespace igemm {
#ifdef CUCONV_IGEMM_WGMMA
// A TMA producer's walk over the im2col columns of a block's BP output pixels from m0 (the first one's window
// origin w0, h0 in image img), from k tile kt0 on: each k tile's channel block, kernel column and row, stepped a
// tile at a time (no division a tile). copy: the tile's column of TK channels from channel c0 + its block's.
template <int TK>
struct Im2colWalk {
    int img, w0, h0, cblocks, cb, sc, r;
    __device__ __forceinline__ Im2colWalk(const Geometry& g, int m0, int kt0) {
        const int pq = g.p * g.q;
        img = m0 / pq;
        const int rem = m0 - img * pq, op = rem / g.q, oq = rem - op * g.q;
        w0 = oq * g.stride_w - g.pad_w, h0 = op * g.stride_h - g.pad_h;
        cblocks = g.cp / TK;
        cb = kt0 % cblocks, sc = kt0 / cblocks % g.s, r = kt0 / cblocks / g.s;
    }
    __device__ __forceinline__ void copy(unsigned dst, const TensorMap& map, const Geometry& g, int c0,
                                         unsigned bar) const {
        tma_im2col_4d(dst, map, c0 + cb * TK, w0, h0, img, static_cast<unsigned short>(sc * g.dil_w),
                      static_cast<unsigned short>(r * g.dil_h), bar);
    }
    __device__ __forceinline__ void next(const Geometry& g) {
        if (++cb == cblocks) {
            cb = 0;
            if (++sc == g.s) sc = 0, ++r;
        }
    }
};
#endif

// implicit_gemm_wgmma_tma's block (m_block, n_block) of k range `split`, on geometry g and the maps of its input
// and weight (grid constants: kernel parameters, or members of one).
template <typename T, int BF, int BP, int STAGES, int KB>
__device__ __forceinline__ void wgmma_tma_block(const T* __restrict__ x, const T* __restrict__ wp,
                                                const Epi<T>& ep, T* __restrict__ y, const Geometry& g,
                                                const TensorMap& x_map, const TensorMap& w_map, int m_block,
                                                int n_block, int split, const TensorMap* y_map = nullptr,
                                                const TensorMap* r_map = nullptr) {
#ifdef CUCONV_IGEMM_WGMMA
    constexpr int kConsumers = BF / 64 * 128;
    constexpr int kRowBytes = KB;
    constexpr int TK = kRowBytes / sizeof(T);  // k per tile: TK channels of one tap
    constexpr int NW = BP / 128;
    constexpr int kStageBytes = (BF + BP) * kRowBytes;
    constexpr int kStagingBytes = staging_bytes<BF, BP>();
    constexpr int kSlotsBytes = STAGES * kStageBytes > kStagingBytes ? STAGES * kStageBytes : kStagingBytes;
    static_assert(BF % 64 == 0 && BP % 128 == 0 && BP <= 256 && BF <= 256 && STAGES >= 2 && sizeof(T) == 2 &&
                  (KB == 128 || KB == 64 || KB == 32), "tile shape");

    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned base = (smem_addr(smem) + 1023u) & ~1023u;  // the swizzles' atoms: up to 1024-byte alignment
    const unsigned full = base + kSlotsBytes, empty = full + 8 * STAGES;

    const int tid = threadIdx.x;
    const int m0 = m_block * BP;
    const int n0 = n_block * BF;
    const int kt0 = split * g.split_tiles;
    const int k_tiles = min(g.split_tiles, g.k_tiles - kt0);
    // (block_diag) whether a consumer's sum came out Inf or NaN: a word after the barriers
    volatile int* nonfinite_flag = reinterpret_cast<volatile int*>(smem + (empty + 8 * STAGES - smem_addr(smem)));
    if (tid == 0) {
        init_ring<STAGES>(full, empty, kConsumers);
        mbarrier_init_fence();  // the copy engine sees the barriers initialised
        *nonfinite_flag = 0;
    }
    __syncthreads();

    if (tid >= kConsumers) {  // the producer warp: its first lane issues every copy
        if (tid != kConsumers) return;
        Im2colWalk<TK> walk(g, m0, kt0);
        for (int kt = 0; kt < k_tiles; ++kt) {
            const int s = kt % STAGES;
            const unsigned slot = base + s * kStageBytes, bar = ring_fill<STAGES>(full, empty, kt, kStageBytes);
            tma_tile_2d(slot, w_map, (kt0 + kt) * TK, n0, bar);
            walk.copy(slot + BF * kRowBytes, x_map, g, g.block_diag ? n0 : 0, bar);
            walk.next(g);
        }
        return;
    }

    const int wg = tid / 128;
    const unsigned a_off = wg * 64 * kRowBytes;  // this warpgroup's filters
    const unsigned b_off = BF * kRowBytes;       // the block's pixels

    float acc[NW][64];
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[n][i] = 0.f;

    for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % STAGES;
        ring_wait_full<STAGES>(full, kt);
        const unsigned slot = base + s * kStageBytes;
        wgmma_k_tile<T, NW, KB>(acc, slot + a_off, slot + b_off);
        ring_release_previous<STAGES>(empty, kt);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int n = 0; n < NW; ++n) fence_acc(acc[n]);

    if (g.block_diag != 0) {  // (block_diag_fixup's flag: read after the epilogue's barriers)
        bool nonfinite = false;
#pragma unroll
        for (int n = 0; n < NW; ++n)
#pragma unroll
            for (int i = 0; i < 64; ++i) nonfinite |= !isfinite(acc[n][i]);
        if (nonfinite) *nonfinite_flag = 1;
    }

    // Every slot was full before a consumer read it, so every copy has landed: once the consumers meet (the
    // epilogue's first barrier), the slots are free for the staging.
    if (y_map != nullptr) {  // (implicit_gemm_wgmma_tma_st; never with a block-diagonal weight: no fixup here)
        // (the residual's copy completes slot 0's full barrier once more: its fills were ceil(k_tiles / STAGES))
        tma_store_epilogue<T, BF, BP, NW>(acc, base, g, ep, *y_map, m0, n0, 0, r_map, full,
                                          ((k_tiles + STAGES - 1) / STAGES) & 1);
        return;
    }
    wgmma_epilogue<T, BF, BP, 1, NW, true>(acc, smem + (base - smem_addr(smem)), g, ep, y, m0, n0);
    if (g.block_diag != 0) {
        epilogue_sync<kConsumers, true>();  // the tile is stored
        if (*nonfinite_flag) block_diag_fixup<T, BF, BP>(x, wp, ep.bias, y, g, m0, n0, tid, kConsumers);
    }
#endif
}
}  // namespace igemm
}  // namespace cuconv

template <typename T, int BF, int BP, int STAGES, int MINB, int KB>
__global__ void __launch_bounds__(BF / 64 * 128 + 32, MINB)
implicit_gemm_wgmma_tma(CUCONV_IGEMM_PARAMS, const __grid_constant__ igemm::TensorMap x_map,
                        const __grid_constant__ igemm::TensorMap w_map) {
#ifdef CUCONV_IGEMM_WGMMA
    igemm::wgmma_tma_block<T, BF, BP, STAGES, KB>(x, wp, igemm::epi_of(bias, res, e), y, g, x_map, w_map, blockIdx.x,
                                                   blockIdx.y, blockIdx.z);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}

// The same into a dense channels-last output through tma_store_epilogue (y_map: the output as an (N·P·Q) × K
// matrix, r_map the residual as one, or the output again where the epilogue adds none; one k range, no
// block-diagonal weight).
template <typename T, int BF, int BP, int STAGES, int MINB, int KB>
__global__ void __launch_bounds__(BF / 64 * 128 + 32, MINB)
implicit_gemm_wgmma_tma_st(CUCONV_IGEMM_PARAMS, const __grid_constant__ igemm::TensorMap x_map,
                           const __grid_constant__ igemm::TensorMap w_map,
                           const __grid_constant__ igemm::TensorMap y_map,
                           const __grid_constant__ igemm::TensorMap r_map) {
#ifdef CUCONV_IGEMM_WGMMA
    igemm::wgmma_tma_block<T, BF, BP, STAGES, KB>(x, wp, igemm::epi_of(bias, res, e), y, g, x_map, w_map, blockIdx.x,
                                                   blockIdx.y, 0, &y_map, &r_map);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}

// The same, persistent, its block's filters' weight resident (implicit_gemm_wgmma_tma_pst): a layer of short
// reductions and many pixels (square_3x3_1024: 16 channels, 9 k tiles a tile, 65 K tiles of 256 pixels) copies
// its weight once for every tile, a third of what its TMA copies move, in rows of 2 * 16 bytes. Here gridDim.x
// blocks, a multiple of the filter blocks (g.kp / BF), each keep the weight of filter block blockIdx.x % that in
// shared memory (all g.k_tiles k tiles, copied once, one barrier) and take pixel blocks blockIdx.x / that,
// + gridDim.x / that, ...: only the im2col columns stream through the ring (BP × KB a slot), the producer running
// on into the next tile's while the consumers store this one, and the consumers computing the next while its TMA
// stores drain from a staging of its own. Shared memory (WgmmaTmaTile.resident_smem): the weight, the ring, the
// staging (BP × BF outputs), then the barriers.
template <typename T, int BF, int BP, int STAGES, int MINB, int KB>
__global__ void __launch_bounds__(BF / 64 * 128 + 32, MINB)
implicit_gemm_wgmma_tma_pst(CUCONV_IGEMM_PARAMS, const __grid_constant__ igemm::TensorMap x_map,
                            const __grid_constant__ igemm::TensorMap w_map,
                            const __grid_constant__ igemm::TensorMap y_map,
                            const __grid_constant__ igemm::TensorMap r_map) {
#ifdef CUCONV_IGEMM_WGMMA
    using namespace igemm;
    const Epi<T> ep = epi_of(bias, res, e);
    constexpr int kConsumers = BF / 64 * 128;
    constexpr int TK = KB / sizeof(T);  // k per tile: TK channels of one tap
    constexpr int NW = BP / 128;
    constexpr int kSlotBytes = BP * KB, kWeightTileBytes = BF * KB;
    static_assert(BF % 64 == 0 && BP % 128 == 0 && BP <= 256 && BF <= 256 && STAGES >= 2 && sizeof(T) == 2 &&
                  (KB == 128 || KB == 64 || KB == 32) && kSlotBytes % 1024 == 0 && kWeightTileBytes % 1024 == 0,
                  "tile shape");
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned weight = (smem_addr(smem) + 1023u) & ~1023u;
    const unsigned ring = weight + g.k_tiles * kWeightTileBytes;
    const unsigned staging = ring + STAGES * kSlotBytes;
    const unsigned full = staging + BP * BF * sizeof(T), empty = full + 8 * STAGES, weight_full = empty + 8 * STAGES;
    const int tid = threadIdx.x;
    const int n_blocks = g.kp / BF, m_blocks = (g.m + BP - 1) / BP;
    const int n0 = blockIdx.x % n_blocks * BF, first = blockIdx.x / n_blocks, step = gridDim.x / n_blocks;
    if (tid == 0) {
        init_ring<STAGES>(full, empty, kConsumers);
        mbarrier_init(weight_full, 1);
        mbarrier_init_fence();
    }
    __syncthreads();

    if (tid >= kConsumers) {  // the producer warp's first lane: the weight, then every tile's columns
        if (tid != kConsumers) return;
        mbarrier_expect_bytes(weight_full, g.k_tiles * kWeightTileBytes);
        for (int kt = 0; kt < g.k_tiles; ++kt)
            tma_tile_2d(weight + kt * kWeightTileBytes, w_map, kt * TK, n0, weight_full);
        int it = 0;  // the ring's count runs on across tiles
        for (int mb = first; mb < m_blocks; mb += step) {
            Im2colWalk<TK> walk(g, mb * BP, 0);
            for (int kt = 0; kt < g.k_tiles; ++kt, ++it) {
                const unsigned bar = ring_fill<STAGES>(full, empty, it, kSlotBytes);
                walk.copy(ring + it % STAGES * kSlotBytes, x_map, g, 0, bar);
                walk.next(g);
            }
        }
        return;
    }

    const unsigned a_off = tid / 128 * 64 * KB;  // this warpgroup's filters in a k tile of the weight
    float acc[NW][64];
    mbarrier_wait(weight_full, 0);  // (also where a block has no tile: its weight lands before it exits)
    int it = 0, tile = 0;  // (tile: the block's own count; the residual's copies complete weight_full's phases 1..)
    for (int mb = first; mb < m_blocks; mb += step, ++tile) {
#pragma unroll
        for (int n = 0; n < NW; ++n)
#pragma unroll
            for (int i = 0; i < 64; ++i) acc[n][i] = 0.f;
        for (int kt = 0; kt < g.k_tiles; ++kt, ++it) {
            ring_wait_full<STAGES>(full, it);
            wgmma_k_tile<T, NW, KB>(acc, weight + kt * kWeightTileBytes + a_off, ring + it % STAGES * kSlotBytes);
            wgmma_wait<1>();  // column it - 1's wgmmas retired: its slot is free
            if (kt > 0) mbarrier_arrive(empty + 8 * ((it - 1) % STAGES));
        }
        wgmma_wait<0>();
        mbarrier_arrive(empty + 8 * ((it - 1) % STAGES));
#pragma unroll
        for (int n = 0; n < NW; ++n) fence_acc(acc[n]);
        tma_store_epilogue<T, BF, BP, NW, false, true>(acc, staging, g, ep, y_map, mb * BP, n0, 0, &r_map,
                                                       weight_full, (tile + 1) & 1);
    }
    if (tid == 0) tma_store_drain();  // (the staging stays allocated until the stores have read it)
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}

// The phases in one launch on the TMA (PhaseGemms, implicit_gemm_fprop_phases): a phase's maps are its own
// (dy's im2col map with the phase's padding, the weight's from the phase's packed rows on; w_offset unused).

template <typename T, int BF, int BP, int STAGES, int MINB, int KB>
__global__ void __launch_bounds__(BF / 64 * 128 + 32, MINB)
implicit_gemm_wgmma_tma_phases(const T* __restrict__ x, const T* __restrict__ wp, const T* __restrict__ bias,
                               T* __restrict__ y, const __grid_constant__ PhaseGemms ph,
                               const __grid_constant__ igemm::TensorMap x0,
                               const __grid_constant__ igemm::TensorMap x1,
                               const __grid_constant__ igemm::TensorMap x2,
                               const __grid_constant__ igemm::TensorMap x3,
                               const __grid_constant__ igemm::TensorMap w0,
                               const __grid_constant__ igemm::TensorMap w1,
                               const __grid_constant__ igemm::TensorMap w2,
                               const __grid_constant__ igemm::TensorMap w3) {
#ifdef CUCONV_IGEMM_WGMMA
    const int z = blockIdx.z;
    const igemm::Geometry& g = ph.g[z];
    if (static_cast<int>(blockIdx.x) * BP >= g.m) return;
    const igemm::TensorMap& xm = z == 0 ? x0 : z == 1 ? x1 : z == 2 ? x2 : x3;
    const igemm::TensorMap& wm = z == 0 ? w0 : z == 1 ? w1 : z == 2 ? w2 : w3;
    igemm::wgmma_tma_block<T, BF, BP, STAGES, KB>(x, wp, igemm::bias_only(bias), y + ph.y_offset[z], g, xm, wm,
                                                   blockIdx.x, blockIdx.y, 0);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}


// ---------------------------------------------------------------------------------------------------
// The TMA-fed forward by rows of input (sm_90a, the 16-bit types, stride 1, CP = 16, 32 or 64 channels a tap):
// implicit_gemm_wgmma_tma copies each tap's im2col column, so a pixel comes from L2 once a tap that reads it (45
// times on square_5x9, L2 72% busy). Here a block's BP output pixels are one output row's (n, p, q0 .. q0 + BP - 1)
// and for each kernel row r the producer copies the input row they read once, a band of BP + (S - 1)·dil_w pixels
// (rounded up to 8) of CP channels from column q0 - pad_w on (a 4-D tiled map over the NHWC input, zeros outside
// it), stored without swizzle as CP / 8 planes of 16-byte chunks, a pixel's chunk 16 bytes after the previous
// pixel's; tap (r, s)'s operand is that band from pixel s·dil_w on: the descriptor's start moves 16·s·dil_w bytes
// (wgmma_desc_rows), no copy per tap. The weight streams a tap at a time as in implicit_gemm_wgmma_tma (a tiled
// map, BF rows × CP channels, the 2·CP-byte swizzle) through a ring of STAGES slots; the bands through a ring of
// two with barriers of their own (a band is released once the last tap reading it has retired). Pixels past the
// row (q ≥ Q) are computed from the band's zeros or the next columns and not stored. Shared memory
// (WgmmaTmaRowsTile.smem_for): the slots, the two bands, or the epilogue's staging if larger; then the barriers.
// A band's pixels: BP + (S - 1)·dil_w rounded up to 8, or to 16 above 256 (a box holds at most 256: two boxes of
// half a band then); the Python twin's _rows_band.
__host__ __device__ constexpr int rows_band(int bp, int s, int dil_w) {
    const int band = (bp + (s - 1) * dil_w + 7) & ~7;
    return band <= 256 ? band : (band + 15) & ~15;
}
__host__ __device__ constexpr int rows_box(int band) { return band <= 256 ? band : band / 2; }

namespace cuconv {
namespace igemm {
// implicit_gemm_wgmma_tma_rows's block; with y_map (implicit_gemm_wgmma_tma_rows_st) its epilogue stores through
// the TMA (tma_store_epilogue).
template <typename T, int BF, int BP, int STAGES, int CP>
__device__ __forceinline__ void wgmma_tma_rows_block(const T* __restrict__ x, const T* __restrict__ wp,
                                                     const Epi<T>& ep, T* __restrict__ y,
                                                     const Geometry& g, const TensorMap& x_map,
                                                     const TensorMap& w_map, const TensorMap* y_map,
                                                     const TensorMap* r_map = nullptr) {
#ifdef CUCONV_IGEMM_WGMMA
    constexpr int kConsumers = BF / 64 * 128;
    constexpr int KB = 2 * CP;          // a tap's weight row: bytes
    constexpr int kChunks = CP / 8;     // 16-byte chunks of a pixel's channels
    constexpr int NW = BP / 128;
    constexpr int kWeightBytes = BF * KB;
    constexpr int kStagingBytes = staging_bytes<BF, BP>();
    static_assert(BF % 64 == 0 && BF <= 256 && BP % 128 == 0 && BP <= 256 && STAGES >= 2 && sizeof(T) == 2 &&
                  (CP == 16 || CP == 32 || CP == 64), "tile shape");

    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned base = (smem_addr(smem) + 1023u) & ~1023u;
    const int band = rows_band(BP, g.s, g.dil_w);  // pixels of a band; copied in boxes of rows_box(band) pixels
    const unsigned band_bytes = kChunks * band * 16;
    const unsigned bands = base + STAGES * kWeightBytes;
    const unsigned used = STAGES * kWeightBytes + 2 * band_bytes;
    const unsigned full = base + (used > kStagingBytes ? used : kStagingBytes), empty = full + 8 * STAGES;
    const unsigned band_full = empty + 8 * STAGES, band_empty = band_full + 16;

    const int tid = threadIdx.x;
    const int q_segments = (g.q + BP - 1) / BP;
    const int row = blockIdx.x / q_segments, q0 = (blockIdx.x - row * q_segments) * BP;
    const int img = row / g.p, op = row - img * g.p;
    const int m0 = row * g.q + q0;
    const int n0 = blockIdx.y * BF;
    if (tid == 0) {
        init_ring<STAGES>(full, empty, kConsumers);
        init_ring<2>(band_full, band_empty, kConsumers);
        mbarrier_init_fence();
    }
    __syncthreads();

    if (tid >= kConsumers) {  // the producer warp: its first lane issues every copy
        if (tid != kConsumers) return;
        int kt = 0;
        for (int r = 0; r < g.r; ++r) {
            const int b = r & 1;
            if (r >= 2) mbarrier_wait(band_empty + 8 * b, ((r >> 1) - 1) & 1);
            mbarrier_expect_bytes(band_full + 8 * b, band_bytes);
            const int ih = op * g.stride_h - g.pad_h + r * g.dil_h;
            const int box = rows_box(band);
#pragma unroll
            for (int j = 0; j < kChunks; ++j)
                for (int part = 0; part < band; part += box)
                    tma_tile_4d(bands + b * band_bytes + (j * band + part) * 16, x_map, 8 * j, q0 - g.pad_w + part, ih,
                                img, band_full + 8 * b);
            for (int sc = 0; sc < g.s; ++sc, ++kt) {
                const unsigned bar = ring_fill<STAGES>(full, empty, kt, kWeightBytes);
                tma_tile_2d(base + kt % STAGES * kWeightBytes, w_map, kt * CP, n0, bar);
            }
        }
        return;
    }

    const int wg = tid / 128;
    float acc[NW][64];
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[n][i] = 0.f;

    int kt = 0;
    for (int r = 0; r < g.r; ++r) {
        const int b = r & 1;
        mbarrier_wait(band_full + 8 * b, (r >> 1) & 1);
        for (int sc = 0; sc < g.s; ++sc, ++kt) {
            ring_wait_full<STAGES>(full, kt);
            const unsigned long long da = wgmma_desc<KB>(base + kt % STAGES * kWeightBytes + wg * 64 * KB);
            const unsigned pixels = bands + b * band_bytes + sc * g.dil_w * 16;
            wgmma_fence();
#pragma unroll
            for (int step = 0; step < CP / 16; ++step)  // 16 channels: the weight's 32 bytes, the band's two chunks
#pragma unroll
                for (int n = 0; n < NW; ++n)
                    Wgmma<T>::run(acc[n], da + 2 * step,
                                  wgmma_desc_rows(pixels + (2 * step * band + n * 128) * 16, band * 16));
            wgmma_commit();
            ring_release_previous<STAGES>(empty, kt);  // (tap kt - 1 retired: at a new row its band goes back too)
            if (sc == 0 && r > 0) mbarrier_arrive(band_empty + 8 * ((r - 1) & 1));
        }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int n = 0; n < NW; ++n) fence_acc(acc[n]);

    if (y_map != nullptr) {
        // (the residual's copy completes slot 0's full barrier once more: its fills were ceil(R·S / STAGES))
        tma_store_epilogue<T, BF, BP, NW, true>(acc, base, g, ep, *y_map, q0, n0, row, r_map, full,
                                                ((g.r * g.s + STAGES - 1) / STAGES) & 1);
        return;
    }
    Geometry row_g = g;  // the epilogue stores this row's pixels only
    row_g.m = min(g.m, m0 + min(BP, g.q - q0));
    wgmma_epilogue<T, BF, BP, 1, NW, true>(acc, smem + (base - smem_addr(smem)), row_g, ep, y, m0, n0);
#endif
}
}  // namespace igemm
}  // namespace cuconv

template <typename T, int BF, int BP, int STAGES, int MINB, int CP>
__global__ void __launch_bounds__(BF / 64 * 128 + 32, MINB)
implicit_gemm_wgmma_tma_rows(CUCONV_IGEMM_PARAMS, const __grid_constant__ igemm::TensorMap x_map,
                             const __grid_constant__ igemm::TensorMap w_map) {
#ifdef CUCONV_IGEMM_WGMMA
    igemm::wgmma_tma_rows_block<T, BF, BP, STAGES, CP>(x, wp, igemm::epi_of(bias, res, e), y, g, x_map, w_map,
                                                        nullptr);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}

// The same into a dense channels-last output through the TMA (y_map: N·P rows of Q pixels × K filters; r_map the
// residual as one, or the output again where the epilogue adds none).
template <typename T, int BF, int BP, int STAGES, int MINB, int CP>
__global__ void __launch_bounds__(BF / 64 * 128 + 32, MINB)
implicit_gemm_wgmma_tma_rows_st(CUCONV_IGEMM_PARAMS, const __grid_constant__ igemm::TensorMap x_map,
                                const __grid_constant__ igemm::TensorMap w_map,
                                const __grid_constant__ igemm::TensorMap y_map,
                                const __grid_constant__ igemm::TensorMap r_map) {
#ifdef CUCONV_IGEMM_WGMMA
    igemm::wgmma_tma_rows_block<T, BF, BP, STAGES, CP>(x, wp, igemm::epi_of(bias, res, e), y, g, x_map, w_map,
                                                        &y_map, &r_map);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}
