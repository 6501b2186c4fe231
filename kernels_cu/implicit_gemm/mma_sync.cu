// implicit_gemm on mma.sync (any sm_80+ device): implicit_gemm_fprop and implicit_gemm_fprop_phases (a strided
// dgrad's phases in one launch), reading the packed input and weight (pack.cu). Python twin:
// cuconv/algos/implicit_gemm/mma_sync.py.
#include "implicit_gemm/igemm.cuh"

// ---------------------------------------------------------------------------------------------------
// The GEMM on mma.sync (sm_80+). Block: WARPS_M x WARPS_N warps, each a (BM/WARPS_M) x (BN/WARPS_N) tile of
// m16n8 MMAs. Grid: (ceil(M / BM), Kp / BN). Dynamic shared memory: Tile.smem_bytes in the Python twin.
namespace cuconv {
namespace igemm {
// implicit_gemm_fprop's block (m_block, n_block) of k range `split` on geometry g.
template <typename T, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int KB>
__device__ __forceinline__ void mma_block(const T* __restrict__ x, const T* __restrict__ wp,
                                          const Epi<T>& ep, T* __restrict__ y, const Geometry& g,
                                          int m_block, int n_block, int split) {
    constexpr int kRowBytes = KB;                // k bytes per smem row and per k tile (64 or 128)
    constexpr int kPitch = kRowBytes + 16;       // padded row: conflict-free ldmatrix (80 or 144 bytes)
    constexpr int kVecPerRow = kRowBytes / 16;   // 16-byte vectors per row
    constexpr int kSteps = kRowBytes / 32;       // MMA k steps per tile
    constexpr int kThreads = WARPS_M * WARPS_N * 32;
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
    constexpr int MI = WTM / 16, NI = WTN / 8;
    constexpr int kRowsPerPass = kThreads / kVecPerRow;    // rows one pass of the block's threads covers
    static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile must be whole m16 x n16 blocks");

    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* a_smem = smem;                                  // [STAGES][BM][kPitch]
    unsigned char* b_smem = smem + STAGES * BM * kPitch;           // [STAGES][BN][kPitch]

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
    const int m0 = m_block * BM;
    const int n0 = n_block * BN;

    const int vec = tid % kVecPerRow;
    const int row0 = tid / kVecPerRow;
    const int kt0 = split * g.split_tiles;
    const int k_tiles = min(g.split_tiles, g.k_tiles - kt0);
    TileLoader<T, BM, BN, kRowsPerPass, kRowBytes / sizeof(T)> loader(g, wp, m0, n0, row0, vec, kt0);
    auto load_tile = [&](int stage) {
        loader.load(g, x, smem_addr(a_smem + (stage * BM + row0) * kPitch + vec * 16),
                    smem_addr(b_smem + (stage * BN + row0) * kPitch + vec * 16), kPitch);
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles) load_tile(s);
        cp_async_commit();
    }

    // ldmatrix lane addressing (see the header comment): A matrices are (rows 0-7 | 8-15) x (bytes 0-15 |
    // 16-31) of a 16-row block, lane l feeding row l % 16 at byte 16·(l / 16); B x4 covers two n8 tiles,
    // lane l feeding row (l % 8) + 8·(l / 16) at byte 16·((l / 8) % 2).
    const int a_row = warp_m * WTM + (lane & 15);
    const int a_byte = (lane >> 4) * 16;
    const int b_row = warp_n * WTN + (lane & 7) + ((lane >> 4) << 3);
    const int b_byte = ((lane >> 3) & 1) * 16;

    for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // tile kt is visible; every warp is done with the stage refilled below
        if (kt + STAGES - 1 < k_tiles) load_tile((kt + STAGES - 1) % STAGES);
        cp_async_commit();

        const int stage = kt % STAGES;
        const unsigned a_stage = smem_addr(a_smem + (stage * BM + a_row) * kPitch + a_byte);
        const unsigned b_stage = smem_addr(b_smem + (stage * BN + b_row) * kPitch + b_byte);
#pragma unroll
        for (int step = 0; step < kSteps; ++step) {
            unsigned a_frag[MI][4], b_frag[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) ldmatrix_x4(a_frag[i], a_stage + i * 16 * kPitch + step * 32);
#pragma unroll
            for (int j = 0; j < NI; j += 2) {
                unsigned r4[4];
                ldmatrix_x4(r4, b_stage + j * 8 * kPitch + step * 32);
                b_frag[j][0] = r4[0]; b_frag[j][1] = r4[1];
                b_frag[j + 1][0] = r4[2]; b_frag[j + 1][1] = r4[3];
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) Mma<T>::run(acc[i][j], a_frag[i], b_frag[j]);
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // the pipeline's shared memory is reused for the epilogue

    // ---- epilogue: acc -> smem [n][m] (pitch BM + 4: conflict-free fragment stores) -> NCHW rows, or
    // [m][n] (pitch BN + 4) -> channels-last vectors
    float* c_smem = reinterpret_cast<float*>(smem);
    const int gid = lane >> 2, tig = lane & 3;
    if (nhwc_vectors(g, y, ep)) {
        constexpr int kNPitch = BN + 4;
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                const int m = warp_m * WTM + i * 16 + gid;
                const int n = warp_n * WTN + j * 8 + 2 * tig;
                *reinterpret_cast<float2*>(&c_smem[m * kNPitch + n]) = make_float2(acc[i][j][0], acc[i][j][1]);
                *reinterpret_cast<float2*>(&c_smem[(m + 8) * kNPitch + n]) = make_float2(acc[i][j][2], acc[i][j][3]);
            }
        __syncthreads();
        store_tile_nhwc_any<T, BM, BN, WARPS_M * WARPS_N>(c_smem, g, ep, y, m0, n0, threadIdx.x);
        return;
    }
    constexpr int kCPitch = BM + 4;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
            const int m = warp_m * WTM + i * 16 + gid;
            const int n = warp_n * WTN + j * 8 + 2 * tig;
            c_smem[n * kCPitch + m] = acc[i][j][0];
            c_smem[(n + 1) * kCPitch + m] = acc[i][j][1];
            c_smem[n * kCPitch + m + 8] = acc[i][j][2];
            c_smem[(n + 1) * kCPitch + m + 8] = acc[i][j][3];
        }
    __syncthreads();

    store_tile<T, BM, BN, WARPS_M * WARPS_N>(c_smem, g, ep, y, m0, n0, warp, lane);
}
}  // namespace igemm
}  // namespace cuconv

template <typename T, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int KB>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
implicit_gemm_fprop(CUCONV_IGEMM_PARAMS) {
    cuconv::igemm::mma_block<T, BM, BN, WARPS_M, WARPS_N, STAGES, KB>(x, wp, cuconv::igemm::epi_of(bias, res, e), y,
                                                                      g, blockIdx.x, blockIdx.y, blockIdx.z);
}


template <typename T, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int KB>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
implicit_gemm_fprop_phases(const T* __restrict__ x, const T* __restrict__ wp, const T* __restrict__ bias,
                           T* __restrict__ y, const __grid_constant__ PhaseGemms ph) {
    const int z = blockIdx.z;
    const igemm::Geometry& g = ph.g[z];
    if (static_cast<int>(blockIdx.x) * BM >= g.m) return;
    cuconv::igemm::mma_block<T, BM, BN, WARPS_M, WARPS_N, STAGES, KB>(x, wp + ph.w_offset[z],
                                                                      cuconv::igemm::bias_only(bias),
                                                                      y + ph.y_offset[z], g, blockIdx.x, blockIdx.y, 0);
}
