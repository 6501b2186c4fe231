// implicit_gemm: forward convolution as an implicit GEMM on tensor cores (mma.sync), TF32 / FP16 / BF16.
//
// GEMM view (one group): out (M = N·P·Q, K) = A (M, R·S·Cp) @ Bᵀ, A never materialised. The input is
// first packed to NHWC with the channels padded to Cp (a multiple of one 16-byte vector: 4 floats, 8
// halves) by `pack_nhwc`, and the weight to (Kp, R·S·Cp rounded up to a k tile) by `pack_weight`, both
// zero-filled, so that:
//   - every 16-byte vector of an A row is 8 (or 4) consecutive channels of one input pixel at one tap:
//     one cp.async with zero fill for padding, out-of-image taps, rows past M and k past R·S·Cp;
//   - the B tile needs no masks at all.
// Shared memory holds STAGES tiles of A (BM rows) and B (BN rows), each row KB bytes of k (KB = 128: 32
// floats or 64 halves; or 64) plus 16 bytes of padding: the 144- (80-) byte pitch makes ldmatrix reads
// conflict-free. Each k step takes 32 bytes of every row: for TF32 that is k = 8 (m16n8k8), for halves
// k = 16 (m16n8k16), and the ldmatrix addressing is byte-for-byte the same for both (see load_frags).
// The epilogue stages the accumulator tile through shared memory as [n][m] and writes NCHW rows of m
// with 128-byte coalesced stores, bias added in fp32 before the one rounding.
//
// TF32: the pack kernels round float32 to TF32 (cvt.rna) once, so the MMAs see rounded operands.
#include "common.cuh"

namespace cuconv {
namespace igemm {


__device__ __forceinline__ float round_tf32(float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return __uint_as_float(r);
}

template <typename T, bool kTf32> __device__ __forceinline__ T prepare(T v) { return v; }
template <> __device__ __forceinline__ float prepare<float, true>(float v) { return round_tf32(v); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// D += A·B for one m16n8 tile and one 32-byte k step. Fragments: a 4 registers, b 2, c 4 floats.
template <typename T> struct Mma;
template <> struct Mma<float> {  // TF32 m16n8k8
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], const unsigned* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<__half> {  // FP16 m16n8k16, fp32 accumulation
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], const unsigned* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<__nv_bfloat16> {  // BF16 m16n8k16, fp32 accumulation
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], const unsigned* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

}  // namespace igemm
}  // namespace cuconv

using namespace cuconv;

// ---------------------------------------------------------------------------------------------------
// Packing. NCHW (n, c, hw) -> (n, hw, cp), pad channels zero; 32 x 32 tiles through smem so both the read
// (along hw) and the write (along c) are coalesced. Block (32, 8); each block walks several hw tiles.
template <typename T, bool kTf32>
__global__ void __launch_bounds__(256)
pack_nhwc(const T* __restrict__ src, T* __restrict__ dst, int c, int cp, int hw, int hw_tiles) {
    __shared__ T tile[32][33];
    const int c0 = blockIdx.y * 32;
    const T* s_n = src + static_cast<long long>(blockIdx.z) * c * hw;   // in-sample offsets are int:
    T* d_n = dst + static_cast<long long>(blockIdx.z) * hw * cp;        // h·w·cp < 2^31 (Python twin)
    for (int t = blockIdx.x; t < hw_tiles; t += gridDim.x) {
        const int hw0 = t * 32;
#pragma unroll
        for (int i = threadIdx.y; i < 32; i += 8) {
            const int ch = c0 + i, pos = hw0 + threadIdx.x;
            tile[i][threadIdx.x] = (ch < c && pos < hw) ? igemm::prepare<T, kTf32>(s_n[ch * hw + pos]) : zero<T>();
        }
        __syncthreads();
#pragma unroll
        for (int i = threadIdx.y; i < 32; i += 8) {
            const int pos = hw0 + i, ch = c0 + threadIdx.x;
            if (ch < cp && pos < hw) d_n[pos * cp + ch] = tile[threadIdx.x][i];
        }
        __syncthreads();
    }
}

// KCRS (k, c, r·s) -> (kp, row) with row index (r·s)·cp + ch, zero for k >= k_valid, ch >= c and past
// r·s·cp (the last k tile's padding). Tiny; one thread per packed element.
template <typename T, bool kTf32>
__global__ void pack_weight(const T* __restrict__ src, T* __restrict__ dst, int k_valid, int c, int cp, int rs,
                            long long row, long long total) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long kk = i / row;
        const long long j = i - kk * row;
        const long long tap = j / cp;
        const int ch = static_cast<int>(j - tap * cp);
        T v = zero<T>();
        if (kk < k_valid && ch < c && tap < rs) v = igemm::prepare<T, kTf32>(src[(kk * c + ch) * rs + tap]);
        dst[i] = v;
    }
}

// ---------------------------------------------------------------------------------------------------
// The GEMM. Block: WARPS_M x WARPS_N warps, each a (BM/WARPS_M) x (BN/WARPS_N) tile of m16n8 MMAs.
// Grid: (ceil(M / BM), Kp / BN). Dynamic shared memory: igemm_smem_bytes below (the Python twin mirrors it).
template <typename T, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int KB>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
implicit_gemm_fprop(const T* __restrict__ x, const T* __restrict__ wp, const T* __restrict__ bias,
                    T* __restrict__ y,
                    int in_h, int in_w, int cp,            // packed input (n, in_h, in_w, cp), this chunk's samples
                    int k_out, int out_p, int out_q,       // output channels and size
                    int kernel_r, int kernel_s, int stride_h, int stride_w, int pad_h, int pad_w, int dil_h,
                    int dil_w,
                    int m_rows,                            // n·p·q: the GEMM's M
                    int k_tiles, long long w_row) {        // ceil(r·s·cp / tile k); packed weight row length
    using namespace igemm;
    const struct {
        int h, w, cp, k, p, q, r, s, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, m, k_tiles;
        long long w_row;
    } g = {in_h, in_w, cp, k_out, out_p, out_q, kernel_r, kernel_s, stride_h, stride_w, pad_h, pad_w, dil_h,
           dil_w, m_rows, k_tiles, w_row};
    constexpr int kRowBytes = KB;                // k bytes per smem row and per k tile (64 or 128)
    constexpr int kPitch = kRowBytes + 16;       // padded row: conflict-free ldmatrix (80 or 144 bytes)
    constexpr int kVecPerRow = kRowBytes / 16;   // 16-byte vectors per row
    constexpr int kSteps = kRowBytes / 32;       // MMA k steps per tile
    constexpr int kThreads = WARPS_M * WARPS_N * 32;
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
    constexpr int MI = WTM / 16, NI = WTN / 8;
    constexpr int kV = 16 / sizeof(T);                     // elements per 16-byte vector
    constexpr int kTileK = kRowBytes / sizeof(T);          // k elements per tile
    constexpr int kRowsPerPass = kThreads / kVecPerRow;    // rows one pass of the block's threads covers
    constexpr int A_ITERS = BM / kRowsPerPass, B_ITERS = BN / kRowsPerPass;
    static_assert(BM % kRowsPerPass == 0 && BN % kRowsPerPass == 0, "tile rows must split over threads");
    static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile must be whole m16 x n16 blocks");

    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* a_smem = smem;                                  // [STAGES][BM][kPitch]
    unsigned char* b_smem = smem + STAGES * BM * kPitch;           // [STAGES][BN][kPitch]

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
    const int m0 = blockIdx.x * BM;
    const int n0 = blockIdx.y * BN;

    // ---- loader state: this thread's 16-byte vector column and its A rows (output pixels). Per row two
    // registers: the element offset of the row's top-left input pixel (img, ih0, iw0) in the packed chunk
    // (int: the Python twin keeps chunks below 2^31 elements) and ih0, iw0 packed as 16-bit halves
    // (images below 32768 per side); ih0 = -32768 marks a row past M and fails every bounds check.
    const int vec = tid % kVecPerRow;
    const int row0 = tid / kVecPerRow;
    int a_off[A_ITERS], a_hw[A_ITERS];
    const int pq = g.p * g.q;
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
        const int m = m0 + row0 + i * kRowsPerPass;
        if (m < g.m) {
            const int img = m / pq;
            const int rem = m - img * pq;
            const int op = rem / g.q;
            const int oq = rem - op * g.q;
            const int ih = op * g.stride_h - g.pad_h, iw = oq * g.stride_w - g.pad_w;
            a_off[i] = ((img * g.h + ih) * g.w + iw) * g.cp;
            a_hw[i] = (ih << 16) | (iw & 0xffff);
        } else {
            a_off[i] = 0;
            a_hw[i] = static_cast<int>(0x80000000u);
        }
    }
    // This thread's k position (tap r, s and channel c of its vector), advanced one tile at a time.
    int kc = vec * kV, ks = 0, kr = 0;
    while (kc >= g.cp) { kc -= g.cp; if (++ks == g.s) { ks = 0; ++kr; } }
    const T* b_ptr = wp + static_cast<long long>(n0 + row0) * g.w_row + vec * kV;

    auto load_tile = [&](int stage) {
        const bool k_valid = kr < g.r;
        const int dr = kr * g.dil_h, ds = ks * g.dil_w;
        const int offset = (dr * g.w + ds) * g.cp + kc;
        unsigned a_dst = smem_addr(a_smem + (stage * BM + row0) * kPitch + vec * 16);
#pragma unroll
        for (int i = 0; i < A_ITERS; ++i) {
            const int ih = (a_hw[i] >> 16) + dr, iw = ((a_hw[i] << 16) >> 16) + ds;
            const bool ok = k_valid && static_cast<unsigned>(ih) < static_cast<unsigned>(g.h) &&
                            static_cast<unsigned>(iw) < static_cast<unsigned>(g.w);
            cp_async_ca<16>(a_dst + i * kRowsPerPass * kPitch, x + (ok ? a_off[i] + offset : 0), ok);
        }
        unsigned b_dst = smem_addr(b_smem + (stage * BN + row0) * kPitch + vec * 16);
#pragma unroll
        for (int i = 0; i < B_ITERS; ++i)
            cp_async_cg16(b_dst + i * kRowsPerPass * kPitch,
                          b_ptr + static_cast<long long>(i) * kRowsPerPass * g.w_row, true);
        b_ptr += kTileK;
        kc += kTileK;
        while (kc >= g.cp) { kc -= g.cp; if (++ks == g.s) { ks = 0; ++kr; } }
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
        if (s < g.k_tiles) load_tile(s);
        cp_async_commit();
    }

    // ldmatrix lane addressing (see the header comment): A matrices are (rows 0-7 | 8-15) x (bytes 0-15 |
    // 16-31) of a 16-row block, lane l feeding row l % 16 at byte 16·(l / 16); B x4 covers two n8 tiles,
    // lane l feeding row (l % 8) + 8·(l / 16) at byte 16·((l / 8) % 2).
    const int a_row = warp_m * WTM + (lane & 15);
    const int a_byte = (lane >> 4) * 16;
    const int b_row = warp_n * WTN + (lane & 7) + ((lane >> 4) << 3);
    const int b_byte = ((lane >> 3) & 1) * 16;

    for (int kt = 0; kt < g.k_tiles; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // tile kt is visible; every warp is done with the stage refilled below
        if (kt + STAGES - 1 < g.k_tiles) load_tile((kt + STAGES - 1) % STAGES);
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

    // ---- epilogue: acc -> smem [n][m] (pitch BM + 4: conflict-free fragment stores) -> NCHW rows
    constexpr int kCPitch = BM + 4;
    float* c_smem = reinterpret_cast<float*>(smem);
    const int gid = lane >> 2, tig = lane & 3;
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

    constexpr int kWarps = WARPS_M * WARPS_N;
    constexpr int kCols = BM / 32;  // output pixels per lane per channel
    long long out_off[kCols];
    bool m_ok[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
        const int m = m0 + lane + 32 * j;
        m_ok[j] = m < g.m;
        const int img = m_ok[j] ? m / pq : 0;
        out_off[j] = static_cast<long long>(img) * g.k * pq + (m - img * pq);
    }
    for (int nl = warp; nl < BN; nl += kWarps) {
        const int n = n0 + nl;
        if (n >= g.k) break;
        const float b = bias != nullptr ? to_acc(bias[n]) : 0.f;
        T* yn = y + static_cast<long long>(n) * pq;
#pragma unroll
        for (int j = 0; j < kCols; ++j)
            if (m_ok[j]) yn[out_off[j]] = from_acc<T>(c_smem[nl * kCPitch + lane + 32 * j] + b);
    }
}
