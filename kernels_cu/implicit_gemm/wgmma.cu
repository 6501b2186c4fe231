// implicit_gemm_wgmma: the packed GEMM on warpgroup MMAs, its tiles loaded by cp.async (sm_90a).
// Python twin: cuconv/algos/implicit_gemm/wgmma.py.
#include "implicit_gemm/sm90.cuh"

// ---------------------------------------------------------------------------------------------------
// The GEMM on warpgroup MMAs (wgmma, sm_90a only: the loader compiles this file with -arch=sm_90a on
// compute capability 9.0; elsewhere the kernel is an empty instance that traps, and the Python twin never
// launches it).
//
// Operands are swapped against implicit_gemm_fprop: the MMA's M is the filters (64 per warpgroup) and its
// N the output pixels (128 per wgmma), D = W · Aᵀ, so that the long pixel tile is the operand wgmma reads
// once per 64 filters and the short weight tile the one re-read: 10 KB of shared memory per m64n256k8
// against 16 KB for the pixel-major m64n64k8 shape at the same FLOPs. Both operands are K-major (row =
// pixel or filter, 128 bytes of k), the only layout wgmma accepts for TF32, stored with the 128-byte
// swizzle: 16-byte chunk c of row r sits at chunk c ^ (r % 8), 8-row atoms of 1024 bytes, so the tensor
// cores read them without bank conflicts. A k step (32 bytes: k = 8 for TF32, 16 for halves) moves the
// descriptors' start address by 32 bytes inside the atom; the hardware applies the swizzle to the address.
//
// Pipeline: STAGES slots filled by cp.async (every thread loads; no warp specialisation), one barrier per k
// tile. With RETIRE false one wgmma group stays in flight across the barrier: at the top of tile kt every
// warpgroup has retired the wgmmas of tile kt - 2, so their slot takes tile kt + STAGES - 2. With RETIRE
// true each tile's wgmmas are retired before the next barrier, so the slot of tile kt - 1 is free and the
// loads run STAGES - 1 tiles ahead: with 3 slots, two tiles of loads in flight instead of one, for short
// reductions where other blocks on the SM fill the tensor cores' gaps.
//
// Block: BF / 64 warpgroups along filters times WG_P along pixels; a warpgroup owns 64 filters and
// BP / WG_P pixels, NW = BP / WG_P / 128 wgmmas of m64n128 per k step (64·NW fp32 accumulators a thread).
// The epilogue stages the accumulators in the retired pipeline slots as [filter][pixel] and writes NCHW
// rows through store_tile_nchw, as implicit_gemm_fprop (128 pixels of a filter row per warp store where the
// tile lies inside one image). Writing straight from the accumulators (8 filters x 8 pixels per warp store)
// was slower where the output dominates (square_3x3_1024).

template <typename T, int BF, int BP, int WG_P, int STAGES, bool RETIRE>
__global__ void __launch_bounds__(BF / 64 * WG_P * 128)
implicit_gemm_wgmma(CUCONV_IGEMM_PARAMS) {
#ifdef CUCONV_IGEMM_WGMMA
    using namespace igemm;
    constexpr int kThreads = BF / 64 * WG_P * 128;
    constexpr int kRowBytes = 128;
    constexpr int kRowsPerPass = kThreads / 8;                 // 8 vectors of 16 bytes per row
    constexpr int kWgPixels = BP / WG_P;
    constexpr int NW = kWgPixels / 128;
    constexpr int kStageBytes = (BF + BP) * kRowBytes;
    static_assert(BF % 64 == 0 && kWgPixels % 128 == 0 && kRowsPerPass % 8 == 0, "tile shape");

    extern __shared__ __align__(1024) unsigned char smem[];
    // [STAGES][BF weight rows, then BP pixel rows] of 128 bytes; the swizzle needs 1024-byte alignment
    const unsigned base = (smem_addr(smem) + 1023u) & ~1023u;

    const int tid = threadIdx.x;
    const int m0 = blockIdx.x * BP;
    const int n0 = blockIdx.y * BF;
    const int vec = tid % 8;
    const int row0 = tid / 8;
    const unsigned swizzled = row0 * kRowBytes + ((vec ^ (row0 & 7)) << 4);
    const int kt0 = blockIdx.z * g.split_tiles;
    const int k_tiles = min(g.split_tiles, g.k_tiles - kt0);
    TileLoader<T, BP, BF, kRowsPerPass, kRowBytes / sizeof(T)> loader(g, wp, m0, n0, row0, vec, kt0);
    auto load_tile = [&](int stage) {
        const unsigned slot = base + stage * kStageBytes;
        loader.load(g, x, slot + BF * kRowBytes + swizzled, slot + swizzled, kRowBytes);
    };

    const int wg = tid / 128;
    const int wg_f = wg % (BF / 64), wg_p = wg / (BF / 64);
    const unsigned a_off = wg_f * 64 * kRowBytes;                             // this warpgroup's filters
    const unsigned b_off = (BF + wg_p * kWgPixels) * kRowBytes;               // and pixels

    float acc[NW][64];
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[n][i] = 0.f;

    constexpr int kAhead = RETIRE ? STAGES - 1 : STAGES - 2;  // tiles of loads in flight
    static_assert(kAhead >= 1, "the pipeline needs a slot to load into");
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
        if (s < k_tiles) load_tile(s);
        cp_async_commit();
    }
    for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<kAhead - 1>();
        fence_proxy_async();
        __syncthreads();  // tile kt is visible; the wgmmas of tile kt - 2 (kt - 1 with RETIRE) are retired
        if (kt + kAhead < k_tiles) load_tile((kt + kAhead) % STAGES);
        cp_async_commit();

        const unsigned slot = base + (kt % STAGES) * kStageBytes;
        wgmma_k_tile<T>(acc, slot + a_off, slot + b_off);
        wgmma_wait<RETIRE ? 0 : 1>();
    }
    wgmma_wait<0>();
#pragma unroll
    for (int n = 0; n < NW; ++n) fence_acc(acc[n]);

    wgmma_epilogue<T, BF, BP, WG_P>(acc, smem + (base - smem_addr(smem)), g, epi_of(bias, res, e), y, m0, n0);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}
