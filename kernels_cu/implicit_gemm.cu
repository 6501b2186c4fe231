// implicit_gemm: forward convolution as an implicit GEMM on tensor cores, TF32 / FP16 / BF16: mma.sync on
// any sm_80+ device (implicit_gemm_fprop), warpgroup MMAs on compute capability 9.0 (implicit_gemm_wgmma,
// further down, with its own notes). Both share the packing, the tile loader and the NCHW store; the last
// kernel, implicit_gemm_wgmma_nchw, packs nothing and gathers NCHW itself (notes there).
//
// GEMM view (one group): out (M = N·P·Q, K) = A (M, R·S·Cp) @ Bᵀ, A never materialised. The input is
// first packed to NHWC with the channels padded to Cp (a multiple of one 16-byte vector: 4 floats, 8
// halves) by `pack_nhwc` (`pack_nhwc_narrow` for narrow pixels), and the weight to (Kp, R·S·Cp rounded
// up to a k tile) by the same launch, both zero-filled, so that:
//   - every 16-byte vector of an A row is 8 (or 4) consecutive channels of one input pixel at one tap:
//     one cp.async with zero fill for padding, out-of-image taps, rows past M and k past R·S·Cp;
//   - the B tile needs no masks at all.
// Shared memory holds STAGES tiles of A (BM rows) and B (BN rows), each row KB bytes of k (KB = 128: 32
// floats or 64 halves; or 64) plus 16 bytes of padding: the 144- (80-) byte pitch makes ldmatrix reads
// conflict-free. Each k step takes 32 bytes of every row: for TF32 that is k = 8 (m16n8k8), for halves
// k = 16 (m16n8k16), and the ldmatrix addressing is byte-for-byte the same for both (the lane addressing in the main loop).
// The epilogue stages the accumulator tile through shared memory as [n][m] and writes NCHW rows of m
// with 128-byte coalesced stores, or, for channels-last outputs in whole 16-byte vectors of filters, as
// [m][n] and writes 16-byte vectors of a pixel's filters (store_tile_nhwc); bias added in fp32 before the one
// rounding.
//
// TF32: the pack kernels round float32 to TF32 (cvt.rna) once, so the MMAs see rounded operands.
#include "common.cuh"
#include "mma.cuh"

namespace cuconv {
namespace igemm {


template <typename T, bool kTf32> __device__ __forceinline__ T prepare(T v) { return v; }
template <> __device__ __forceinline__ float prepare<float, true>(float v) { return round_tf32(v); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

}  // namespace igemm
}  // namespace cuconv

using namespace cuconv;

// ---------------------------------------------------------------------------------------------------
// Packing: one launch per chunk packs the input and, in the first chunk's launch, the weight as well (a
// launch costs the host as much time as a small layer's pack itself).
//
// The weight: KCRS (k, c, r·s) -> (kp, row) with row index (r·s)·cp + ch, zero for k >= k_valid,
// ch >= c and past r·s·cp (the last k tile's padding); elements first, first + step, ... of w_total (0:
// no weight in this launch). With w_flip the source is a dgrad's layer weight (groups·w_c, k_valid, r·s)
// and the forward of dy takes it per group transposed and flipped: packed (k, ch, t) = source (ch, k,
// rs - 1 - t) (dgrad_forward.py), read in place (no launch writes the flipped copy). With w_krsc the source is
// channels-last, (k, r·s, ch) (flipped: (ch, r·s, k)): a thread's row elements then read adjacent channels.
//
// Both pack kernels take their sizes as one struct (host time per launch argument, see CUCONV_IGEMM_PARAMS):
// channels c and padded cp, pixels per sample hw, units (pack_nhwc: hw tiles; pack_nhwc_narrow: 16-byte
// output vectors, of which in_blocks blocks take care), and the weight's k_valid filters, rs taps, row length
// and total elements (0: none), its channels w_c, their pitch in a row w_cp (a group's padded channels) and
// rows per group w_kp (groups follow each other: row kk is filter kk % w_kp of group kk / w_kp); then the
// input's strides in elements between samples and between channels (an NCHW input: c·hw and hw; wgrad packs x
// and dy with samples and channels swapped, ``transposed_spec``) and between packed samples (hw·cp, or a packed
// weight row where wgrad packs dy as its weight), whether the weight is read flipped (w_flip), and the input's
// stride between pixels (1 for NCHW; C for a channels-last input, which only pack_nhwc_narrow reads: pack_nhwc's
// tiles read along the pixels and take 1). The Python twin builds the same layout (PACK_SHAPE_DTYPE).
struct PackShape {
    int c, cp, hw, units, in_blocks, k_valid, rs, w_c, w_cp, w_kp, w_flip, w_krsc;
    long long w_row, w_total, src_sample, src_channel, dst_sample, src_pixel;
};
static_assert(sizeof(PackShape) == 96 && alignof(PackShape) == 8,  // 12 ints, 6 long longs
              "PACK_SHAPE_DTYPE in cuconv/families/implicit_gemm.py has this layout");

// A 64 x 64 tile of 16-bit elements transposed by 256 threads with 16-byte accesses on both sides (the weight
// packs below move 2-byte elements; one a thread read and wrote 64 bytes a warp instruction, 0.4-0.9 TB/s).
// load(i, v): the 8 elements (a uint4) of source row i (the tile's column i), vector v (its rows 8v .. 8v + 7);
// store(o, v, value): output row o's vector v, its elements those of source rows 8v .. 8v + 7 at column o. A warp
// reads and writes 4 rows of 128 bytes. `tile`: 512 uint4 of shared memory, row i's 16-byte chunk v at i·8 + (v ^
// (i / 8 % 8)): a quarter warp's stores hit 8 chunks of one row, a warp's gathers 8 chunks of 8 rows.
template <typename Load, typename Store>
__device__ __forceinline__ void transpose_tile_b16(uint4* tile, int thread, Load load, Store store) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
        const int idx = thread + 256 * p, i = idx / 8, v = idx % 8;
        tile[i * 8 + (v ^ (i / 8 % 8))] = load(i, v);
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < 2; ++p) {
        const int idx = thread + 256 * p, o = idx / 8, v = idx % 8;
        unsigned w[4];
#pragma unroll
        for (int k = 0; k < 8; k += 2) {
            const unsigned short* lo = reinterpret_cast<const unsigned short*>(tile + (8 * v + k) * 8 + ((o / 8) ^ v));
            const unsigned short* hi = reinterpret_cast<const unsigned short*>(tile + (8 * v + k + 1) * 8 + ((o / 8) ^ v));
            w[k / 2] = lo[o % 8] | (static_cast<unsigned>(hi[o % 8]) << 16);
        }
        store(o, v, make_uint4(w[0], w[1], w[2], w[3]));
    }
    __syncthreads();
}

// Block `block` of `blocks` packs rows block, block + blocks, ... of the weight, its 256 threads along a row
// (one 32-bit division per element: a row is below 2^31 elements, as the GEMM's k offsets); a flipped weight
// in tiles of 32 rows (see there).
template <typename T, bool kTf32>
__device__ __forceinline__ void pack_weight_part(const T* __restrict__ src, T* __restrict__ dst, const PackShape& ps,
                                                 int block, int blocks, int thread) {
    const int row = static_cast<int>(ps.w_row);
    const long long rows = ps.w_total / ps.w_row;
    // element (k, ch, t) of group grp: source ((grp·k_valid + k)·w_c + ch)·rs + t, or flipped
    // ((grp·w_c + ch)·k_valid + k)·rs + rs - 1 - t; channels-last: ((grp·k_valid + k)·rs + t)·w_c + ch, or
    // flipped ((grp·w_c + ch)·rs + rs - 1 - t)·k_valid + k
    const long long group_elems = static_cast<long long>(ps.k_valid) * ps.w_c * ps.rs;
    const long long inner = ps.w_flip ? ps.k_valid : ps.w_c;  // (the source's second-slowest extent: c or k)
    const long long k_step = ps.w_krsc ? (ps.w_flip ? 1 : ps.rs * inner) : (ps.w_flip ? ps.rs : inner * ps.rs);
    const long long ch_step = ps.w_krsc ? (ps.w_flip ? ps.rs * inner : 1) : (ps.w_flip ? inner * ps.rs : ps.rs);
    const long long t_step = ps.w_krsc ? inner : 1;
    if constexpr (sizeof(T) == 2) if (ps.w_flip && ps.w_krsc && ps.k_valid % 8 == 0 && ps.w_kp % 8 == 0 &&
        ps.w_row % 8 == 0 && reinterpret_cast<unsigned long long>(src) % 16 == 0 &&
        reinterpret_cast<unsigned long long>(dst) % 16 == 0) {
        // A channels-last weight read flipped, 16-bit: 8 packed rows' element (kk .. kk + 7 of one group, all
        // filters or none) are one 16-byte vector of the source, 8 elements of a packed row one of the packed
        // weight: 64 x 64 tiles by transpose_tile_b16.
        __shared__ uint4 vt[512];
        const long long col_tiles = (row + 63) / 64, tiles = (rows + 63) / 64 * col_tiles;
        for (long long tt = block; tt < tiles; tt += blocks) {
            const long long kk0 = tt / col_tiles * 64;
            const int j0 = static_cast<int>(tt % col_tiles) * 64;
            transpose_tile_b16(
                vt, thread,
                [&](int i, int v) {
                    const long long kk = kk0 + 8 * v;
                    const int j = j0 + i, tap = j / ps.w_cp, ch = j - tap * ps.w_cp;
                    const long long grp = kk / ps.w_kp, kl = kk - grp * ps.w_kp;
                    if (kk >= rows || j >= row || kl >= ps.k_valid || ch >= ps.w_c || tap >= ps.rs)
                        return make_uint4(0, 0, 0, 0);
                    return *reinterpret_cast<const uint4*>(src + grp * group_elems + kl + ch * ch_step +
                                                           (ps.rs - 1 - tap) * t_step);
                },
                [&](int o, int v, uint4 value) {
                    const long long kk = kk0 + o;
                    const int j = j0 + 8 * v;
                    if (kk < rows && j < row) *reinterpret_cast<uint4*>(dst + kk * ps.w_row + j) = value;
                });
        }
        return;
    }
    if (ps.w_flip) {
        // Transposed: a packed row's elements lie k_valid·rs (or rs) apart in the source and its rows next to each
        // other, so 32-row x 32-element tiles go through shared memory, read along the rows and written along
        // them (a thread per element along a row read one sector per element: 0.4 TB/s on 512x512x3x3).
        __shared__ T tile[32][33];
        const int tx = thread % 32, ty = thread / 32;
        const long long col_tiles = (row + 31) / 32, tiles = (rows + 31) / 32 * col_tiles;
        for (long long tt = block; tt < tiles; tt += blocks) {
            const long long kk0 = tt / col_tiles * 32;
            const int j0 = static_cast<int>(tt % col_tiles) * 32;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const long long kk = kk0 + tx;
                const int j = j0 + ty + 8 * i, tap = j / ps.w_cp, ch = j - tap * ps.w_cp;
                const long long grp = kk / ps.w_kp, kl = kk - grp * ps.w_kp;
                T v = zero<T>();
                if (kk < rows && j < row && kl < ps.k_valid && ch < ps.w_c && tap < ps.rs)
                    v = igemm::prepare<T, kTf32>(
                        src[grp * group_elems + kl * k_step + ch * ch_step + (ps.rs - 1 - tap) * t_step]);
                tile[ty + 8 * i][tx] = v;
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const long long kk = kk0 + ty + 8 * i;
                if (kk < rows && j0 + tx < row) dst[kk * ps.w_row + j0 + tx] = tile[tx][ty + 8 * i];
            }
            __syncthreads();
        }
        return;
    }
    for (long long kk = block; kk < rows; kk += blocks) {
        const long long grp = kk / ps.w_kp, kl = kk - grp * ps.w_kp;
        const T* s = src + grp * group_elems + kl * k_step;
        T* d = dst + kk * ps.w_row;
        const bool k_ok = kl < ps.k_valid;
        for (int j = thread; j < row; j += 256) {
            const int tap = j / ps.w_cp, ch = j - tap * ps.w_cp;
            d[j] = k_ok && ch < ps.w_c && tap < ps.rs ? igemm::prepare<T, kTf32>(s[ch * ch_step + tap * t_step])
                                                      : zero<T>();
        }
    }
}


// The input: NCHW (n, c, hw) -> (n, hw, cp), pad channels zero; 32-channel x 64-pixel tiles through smem so
// both the read (along hw) and the write (along c) are coalesced. Block (32, 8); grid (hw tile blocks,
// channel tiles, samples + 1 if the weight is packed too: the last z slice packs it). Each block walks
// several hw tiles. Each thread has 8 loads in flight: with 32 x 32 tiles (4) the pack was latency-bound.
template <typename T, bool kTf32>
__global__ void __launch_bounds__(256)
pack_nhwc(const T* __restrict__ src, T* __restrict__ dst, const T* __restrict__ w_src, T* __restrict__ w_dst,
          const PackShape ps) {
    constexpr int kHalves = 2;  // 32-pixel halves of a tile
    const int c = ps.c, cp = ps.cp, hw = ps.hw, hw_tiles = ps.units;
    if (ps.w_total > 0 && blockIdx.z == gridDim.z - 1) {
        pack_weight_part<T, kTf32>(w_src, w_dst, ps, blockIdx.y * gridDim.x + blockIdx.x, gridDim.x * gridDim.y,
                                   threadIdx.y * 32 + threadIdx.x);
        return;
    }
    __shared__ T tile[kHalves][32][33];
    const int c0 = blockIdx.y * 32;
    const T* s_n = src + blockIdx.z * ps.src_sample;
    T* d_n = dst + blockIdx.z * ps.dst_sample;  // in-sample offsets are int: h·w·cp < 2^31 (Python twin)
    for (int t = blockIdx.x; t < hw_tiles; t += gridDim.x) {
        const int hw0 = t * 32 * kHalves;
#pragma unroll
        for (int half = 0; half < kHalves; ++half)
#pragma unroll
            for (int i = threadIdx.y; i < 32; i += 8) {
                const int ch = c0 + i, pos = hw0 + half * 32 + threadIdx.x;
                tile[half][i][threadIdx.x] =
                    (ch < c && pos < hw) ? igemm::prepare<T, kTf32>(s_n[ch * ps.src_channel + pos]) : zero<T>();
            }
        __syncthreads();
#pragma unroll
        for (int half = 0; half < kHalves; ++half)
#pragma unroll
            for (int i = threadIdx.y; i < 32; i += 8) {
                const int pos = hw0 + half * 32 + i, ch = c0 + threadIdx.x;
                if (ch < cp && pos < hw) d_n[pos * cp + ch] = tile[half][threadIdx.x][i];
            }
        __syncthreads();
    }
}

// The same for narrower pixels (cp · sizeof(T) <= 256 bytes: up to 64 floats or 128 halves; below 64 bytes
// half or more of pack_nhwc's 32-channel tile would idle), and for channels-last inputs of any width: one thread
// per 16-byte output vector, its V channels read from V planes (NCHW: a warp's loads cover 32 / (cp / V)
// consecutive pixels of each of its channels) or from one pixel's V adjacent channels (channels-last: a warp's
// loads are contiguous), its stores 512 contiguous bytes a warp. Chunks hold below 2^31 elements (Python twin).
// Blocks from in_blocks on pack the weight.
template <typename T, bool kTf32>
__global__ void __launch_bounds__(256)
pack_nhwc_narrow(const T* __restrict__ src, T* __restrict__ dst, const T* __restrict__ w_src, T* __restrict__ w_dst,
                 const PackShape ps) {
    const int c = ps.c, cp = ps.cp, hw = ps.hw, total_vecs = ps.units, in_blocks = ps.in_blocks;
    if (static_cast<int>(blockIdx.x) >= in_blocks) {
        pack_weight_part<T, kTf32>(w_src, w_dst, ps, blockIdx.x - in_blocks, gridDim.x - in_blocks, threadIdx.x);
        return;
    }
    constexpr int V = 16 / sizeof(T);
    const int nvec = cp / V;
    for (int i = blockIdx.x * 256 + threadIdx.x; i < total_vecs; i += in_blocks * 256) {
        const int pix = i / nvec;  // sample · hw + position
        const int ch0 = (i - pix * nvec) * V;
        const int img = pix / hw, pos = pix - img * hw;
        const T* s = src + img * ps.src_sample + ch0 * ps.src_channel + pos * ps.src_pixel;
        Vec16<T> v;
#pragma unroll
        for (int e = 0; e < V; ++e)
            v.v[e] = ch0 + e < c ? igemm::prepare<T, kTf32>(s[e * ps.src_channel]) : zero<T>();
        *reinterpret_cast<Vec16<T>*>(dst + img * ps.dst_sample + pos * cp + ch0) = v;
    }
}

// wgrad on channels-last activations: x (N, H·W, C) and dy (N, P·Q, K) as transposed_spec reads them, C
// images (K filter rows) of N channels: src (a, b, c) at a·src_a + b·c_count + c -> dst (c, b, a) at c·dst_c +
// b·ap + a, a zero-filled up to ap (the padded samples), float32 rounded to TF32 on the way. A sample's pixels
// are one run of l = b_count·c_count elements, so block (32, 8) transposes tiles of 32 samples x 64 of the run
// (j = b·c_count + c) through shared memory: a warp loads 32 adjacent elements of one sample and stores 32
// adjacent samples of one (c, b), whatever the channels (a stem's 3 fill the tile as well as 256), 8 loads in
// flight a thread. Grid (tile columns, capped: blocks walk them; sample tiles over ap). A run is below 2^31
// elements (the packed x is: Python twin): 32-bit j, and b = j / c_count as (j · c_magic) >> c_shift (the
// Python twin's magic number: exact for j < 2^31; a division per store made the pack issue-bound).
struct SwapShape {
    int a, b, c, ap;
    long long src_a, l, dst_c, c_magic;
    int c_shift, unused;
};
static_assert(sizeof(SwapShape) == 56 && alignof(SwapShape) == 8,
              "SWAP_SHAPE_DTYPE in cuconv/families/implicit_gemm.py has this layout");

template <typename T, bool kTf32>
__global__ void __launch_bounds__(256)
pack_swap(const T* __restrict__ src, T* __restrict__ dst, const SwapShape ss) {
    constexpr int kHalves = 2;  // 32-element halves of a tile's run
    __shared__ T tile[kHalves][32][33];
    const int a0 = blockIdx.y * 32, tx = threadIdx.x, ty = threadIdx.y;
    const int l = static_cast<int>(ss.l), tiles = (l + 32 * kHalves - 1) / (32 * kHalves);
    const unsigned long long magic = static_cast<unsigned long long>(ss.c_magic);
    const T* rows[4];  // this thread's sample rows a0 + ty + 8·ii (null past the samples: zeros)
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) rows[ii] = a0 + ty + 8 * ii < ss.a ? src + (a0 + ty + 8 * ii) * ss.src_a : nullptr;
    T* const column = dst + a0 + tx;  // (this thread's sample in every (c, b) run of dst)
    const bool a_ok = a0 + tx < ss.ap;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int j0 = t * 32 * kHalves;
#pragma unroll
        for (int half = 0; half < kHalves; ++half)
#pragma unroll
            for (int ii = 0; ii < 4; ++ii) {  // tile[half][a][j] = src (a0 + ty + 8·ii, j0 + 32·half + tx)
                const int j = j0 + half * 32 + tx;
                tile[half][ty + 8 * ii][tx] =
                    rows[ii] != nullptr && j < l ? igemm::prepare<T, kTf32>(rows[ii][j]) : zero<T>();
            }
        __syncthreads();
#pragma unroll
        for (int half = 0; half < kHalves; ++half)
#pragma unroll
            for (int ii = 0; ii < 4; ++ii) {  // dst (c, b, a0 + tx) of j = j0 + 32·half + ty + 8·ii (one per warp)
                const int j = j0 + half * 32 + ty + 8 * ii;
                if (j < l && a_ok) {
                    const int b = static_cast<int>((static_cast<unsigned long long>(j) * magic) >> ss.c_shift);
                    const int c = j - b * ss.c;
                    column[c * ss.dst_c + static_cast<long long>(b) * ss.ap] = tile[half][tx][ty + 8 * ii];
                }
            }
        __syncthreads();
    }
}

// A grouped weight (K, gw, R, S) (krsc: (K, R, S, gw)) of groups of gw channels and gw filters as the dense
// block-diagonal weight the TMA forward reads with Geometry.block_diag: row f (of kp, zero past K) holds, for each
// tap t, bw columns t·bw + j for the input channels b + j of its block of bw filters (b = f - f % bw): filter f's
// weight at channel c = b + j where c is in f's group (c / gw == f / gw), zero elsewhere. A thread an element.
struct BlockDiagonal {
    long long total;  // kp · taps · bw
    int k, gw, taps, bw, krsc, unused;
};
static_assert(sizeof(BlockDiagonal) == 32, "BLOCK_DIAGONAL_DTYPE in cuconv/families/implicit_gemm.py");

template <typename T>
__global__ void __launch_bounds__(256)
pack_block_diagonal(const T* __restrict__ w, T* __restrict__ wp, const BlockDiagonal bd) {
    const long long row = static_cast<long long>(bd.taps) * bd.bw;
    for (long long i = blockIdx.x * 256LL + threadIdx.x; i < bd.total; i += gridDim.x * 256LL) {
        const int f = static_cast<int>(i / row), col = static_cast<int>(i - f * row);
        const int t = col / bd.bw, c = f - f % bd.bw + (col - t * bd.bw);
        T v = zero<T>();
        if (f < bd.k && c / bd.gw == f / bd.gw) {
            const int cl = c % bd.gw;
            v = w[bd.krsc ? (static_cast<long long>(f) * bd.taps + t) * bd.gw + cl
                          : (static_cast<long long>(f) * bd.gw + cl) * bd.taps + t];
        }
        wp[i] = v;
    }
}

// dgrad at a stride above 1 (implicit_gemm.py): dx's pixels h ≡ ph (mod stride_h), w ≡ pw (phase (ph, pw))
// are the forward convolution of dy, at stride 1, by the kernel's taps r ≡ ph + pad_h (mod stride_h), s
// likewise, flipped: tap r = r0 + stride_h·(th - 1 - a) of the th taps of its phase (r0 = r mod stride_h) is the
// phase's tap a. Each phase's weight is packed here as the forward's weight rows are: row (phase, group, c) for
// filter c of the group (an input channel of x), its k index (a·tw + b)·cp + channel k; rows of w_row elements,
// channels past the group's zero, rows past its filters and k past the phase's taps not written (the GEMM
// drops those columns and zero-fills k past its reduction). Block (32, 8) transposes a 64 x 64 tile of
// (channel k, filter c) of one group at one kernel tap through shared memory (16-bit channels-last weights by
// transpose_tile_b16, others as four 32 x 32 tiles); grid (c tiles · groups, k tiles over cp, taps). krsc: the layer's weight is channels-last, (k, r·s, c). Offsets are 32-bit but the packed
// row's (Python twin).
struct PhaseWeights {
    int groups, kg, cg, kp, cp, r, s, stride_h, stride_w, pad_h, pad_w, krsc;
    long long w_row, rows;
};
static_assert(sizeof(PhaseWeights) == 64 && alignof(PhaseWeights) == 8,  // 12 ints, then 2 long longs
              "PHASE_WEIGHTS_DTYPE in cuconv/families/implicit_gemm.py has this layout");

template <typename T, bool kTf32>
__global__ void __launch_bounds__(256)
pack_dgrad_phases(const T* __restrict__ w, T* __restrict__ dst, const PhaseWeights pw) {
    const int c_tiles = (pw.cg + 63) / 64;
    const int g = blockIdx.x / c_tiles;
    const int c00 = (blockIdx.x - g * c_tiles) * 64, k00 = blockIdx.y * 64;
    const int tid = threadIdx.y * 32 + threadIdx.x;
    const int rs = pw.r * pw.s;
    const T* src = w + g * pw.kg * pw.cg * rs;
    const int t = blockIdx.z, r = t / pw.s, s = t - r * pw.s;
    const int ph = ((r - pw.pad_h) % pw.stride_h + pw.stride_h) % pw.stride_h, r0 = r % pw.stride_h;
    const int th = (pw.r - r0 + pw.stride_h - 1) / pw.stride_h, a = th - 1 - (r - r0) / pw.stride_h;
    const int pq = ((s - pw.pad_w) % pw.stride_w + pw.stride_w) % pw.stride_w, s0 = s % pw.stride_w;
    const int tw = (pw.s - s0 + pw.stride_w - 1) / pw.stride_w, b = tw - 1 - (s - s0) / pw.stride_w;
    const long long row0 = static_cast<long long>((ph * pw.stride_w + pq) * pw.groups + g) * pw.kp;
    const int at0 = (a * tw + b) * pw.cp;
    if constexpr (sizeof(T) == 2) if (pw.krsc && pw.cg % 8 == 0 && pw.cp % 8 == 0 && pw.w_row % 8 == 0 &&
        reinterpret_cast<unsigned long long>(w) % 16 == 0 && reinterpret_cast<unsigned long long>(dst) % 16 == 0) {
        // channels-last, 16-bit: a filter's 8 channels are one 16-byte vector of the source, 8 filters of a
        // packed row one of the packed weight (transpose_tile_b16)
        __shared__ uint4 vt[512];
        transpose_tile_b16(
            vt, tid,
            [&](int i, int v) {
                const int k = k00 + i, c = c00 + 8 * v;
                if (k >= pw.kg || c >= pw.cg) return make_uint4(0, 0, 0, 0);
                return *reinterpret_cast<const uint4*>(src + (k * rs + t) * pw.cg + c);
            },
            [&](int o, int v, uint4 value) {
                const int c = c00 + o, k = k00 + 8 * v;
                if (c < pw.cg && k < pw.cp) *reinterpret_cast<uint4*>(dst + (row0 + c) * pw.w_row + at0 + k) = value;
            });
        return;
    }
    __shared__ T tile[32][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int sub = 0; sub < 4; ++sub) {  // the block's 64 x 64 as four 32 x 32 tiles
        const int c0 = c00 + 32 * (sub % 2), k0 = k00 + 32 * (sub / 2);
#pragma unroll
        for (int i = ty; i < 32; i += 8) {  // tile[k][c] = w[k0 + i, c0 + tx, t], zero past the group
            const int k = k0 + i, c = c0 + tx;
            const int from = pw.krsc ? (k * rs + t) * pw.cg + c : (k * pw.cg + c) * rs + t;
            tile[i][tx] = k < pw.kg && c < pw.cg ? igemm::prepare<T, kTf32>(src[from]) : zero<T>();
        }
        __syncthreads();
        const int k = k0 + tx;
#pragma unroll
        for (int i = ty; i < 32; i += 8) {  // row (phase, g, c0 + i), channel k0 + tx
            const int c = c0 + i;
            if (c < pw.cg && k < pw.cp) dst[(row0 + c) * pw.w_row + at0 + k] = tile[tx][i];
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------------------
// Split-K's last launch: y = Σ_z partials[z] + bias, the fp32 partial sums of the GEMM's k ranges (z = 0, 1,
// ... in order: deterministic) with the filter's bias, rounded once. The partials have y's layout, n elements
// apart; an element's filter is (i / pq) % k (NCHW; wgrad has no bias).
struct SplitSum {
    long long n;
    int splits, pq, k, unused;
};
static_assert(sizeof(SplitSum) == 24 && alignof(SplitSum) == 8,
              "SPLIT_SUM_DTYPE in cuconv/families/implicit_gemm.py has this layout");

template <typename T>
__global__ void __launch_bounds__(256)
sum_splits(const float* __restrict__ partials, const T* __restrict__ bias, T* __restrict__ y, const SplitSum ss) {
    for (long long i = blockIdx.x * 256LL + threadIdx.x; i < ss.n; i += gridDim.x * 256LL) {
        float v = bias != nullptr ? to_acc(bias[(i / ss.pq) % ss.k]) : 0.f;
        // eight partial sums' loads in flight before the first add (a load an add was latency-bound), added in
        // the order of z all the same
        float sum = 0.f;
        int z = 0;
        for (; z + 8 <= ss.splits; z += 8) {
            float part[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) part[u] = partials[(z + u) * ss.n + i];
#pragma unroll
            for (int u = 0; u < 8; ++u) sum += part[u];
        }
        for (; z < ss.splits; ++z) sum += partials[z * ss.n + i];
        y[i] = from_acc<T>(sum + v);
    }
}

// ---------------------------------------------------------------------------------------------------
// What both GEMM kernels share: the geometry and the tile loader.

namespace cuconv {
namespace igemm {

// Packed input (n, h, w, cp) of this chunk's samples; output channels k and size p x q; kernel r x s,
// stride, top and left padding, dilation; m = n·p·q, the GEMM's M; k_tiles = ceil(r·s·cp / tile k); w_row:
// the packed weight's row length. The output's strides in elements between images and between filters
// (NCHW: k·p·q and p·q; wgrad writes dW (K, C, R, S) from images that are its input channels: r·s and c·r·s).
// Split-K: block z reduces k tiles [z·split_tiles, (z + 1)·split_tiles) and, where split_stride is not 0,
// writes its fp32 partial sums at z·split_stride floats into the output (a workspace the caller sums in a
// fixed order: deterministic). Groups: k is a group's filters and kp its block rows (a multiple of the
// tile's); block row n0 is group grp = n0 / kp, which reads the packed input from element grp·grp_a on, the
// packed weight from row grp·w_rows on (w_rows: a group's rows there) and writes filters from grp·k, its m
// (a group's GEMM rows) its own. The forward's groups split the channels: cp is a group's (its reduction),
// pix the packed input's pixel stride (all groups' channels), grp_a = cp and w_rows = kp. wgrad's split the
// images (x's channels), each group a GEMM of m = C/groups·R·S rows over the whole reduction: pix = cp,
// grp_a a group's images, w_rows = k (dy's filters packed one after another). One group: grp is 0. The
// Python twin builds the same layout (GEOMETRY_DTYPE). Output pixel (p, q) of an image sits at
// p·out_row + q·out_col (q and 1 but where dgrad's phases write every stride-th pixel of dx). block_diag
// (implicit_gemm_wgmma_tma only; 0: none): the width of the groups of a grouped forward whose packed weight is
// block-diagonal, a block's filters n0 .. n0 + cp - 1 against the input channels from n0 on (those of their
// groups; pack_block_diagonal); pix is then the input's pixel pitch (its C channels).
struct Geometry {
    int h, w, cp, k, p, q, r, s, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, m, k_tiles;
    long long w_row, out_img, out_k, split_stride;
    int split_tiles, pix, kp, grp_a, w_rows, out_row, out_col, block_diag;
};
static_assert(sizeof(Geometry) == 128 && alignof(Geometry) == 8,  // 16 ints, 4 long longs from byte 64, 8 ints
              "GEOMETRY_DTYPE in cuconv/families/implicit_gemm.py has this layout");

// One thread's share of a k tile: the 16-byte vector column `vec` of ROWS_A rows of A (output pixels,
// gathered from the packed input) and ROWS_B rows of B (packed weight rows), every ROWS_PER_PASS-th row
// from `row0`. The caller gives the shared address of its first A and B row at its vector column and the
// distance between its rows, so one loader serves padded (mma.sync) and swizzled (wgmma) layouts.
//
// Per A row two registers: the element offset of the row's top-left input pixel (img, ih0, iw0) in the
// packed chunk (int: the Python twin keeps chunks below 2^31 elements) and ih0, iw0 packed as 16-bit halves
// (images below 32768 per side); ih0 = -32768 marks a row past M and fails every bounds check. The k
// position (tap r, s and channel c of the vector) starts at tile kt0 (split-K) and advances one tile at a
// time, without divisions. B vectors past the reduction (r·s·cp) are zero-filled like A's, so a packed
// weight row needs nothing written past it.
template <typename T, int ROWS_A, int ROWS_B, int ROWS_PER_PASS, int TILE_K>
struct TileLoader {
    static constexpr int A_ITERS = ROWS_A / ROWS_PER_PASS, B_ITERS = ROWS_B / ROWS_PER_PASS;
    static_assert(ROWS_A % ROWS_PER_PASS == 0 && ROWS_B % ROWS_PER_PASS == 0, "tile rows must split over threads");
    int a_off[A_ITERS], a_hw[A_ITERS];
    int kc, ks, kr;
    const T* b_ptr;

    __device__ __forceinline__ TileLoader(const Geometry& g, const T* wp, int m0, int n0, int row0, int vec,
                                          int kt0) {
        const int pq = g.p * g.q;
        const int grp = n0 / g.kp;
#pragma unroll
        for (int i = 0; i < A_ITERS; ++i) {
            const int m = m0 + row0 + i * ROWS_PER_PASS;
            if (m < g.m) {
                const int img = m / pq;
                const int rem = m - img * pq;
                const int op = rem / g.q;
                const int oq = rem - op * g.q;
                const int ih = op * g.stride_h - g.pad_h, iw = oq * g.stride_w - g.pad_w;
                a_off[i] = ((img * g.h + ih) * g.w + iw) * g.pix + grp * g.grp_a;
                a_hw[i] = (ih << 16) | (iw & 0xffff);
            } else {
                a_off[i] = 0;
                a_hw[i] = static_cast<int>(0x80000000u);
            }
        }
        const int k0 = kt0 * TILE_K + vec * (16 / static_cast<int>(sizeof(T)));
        const int tap = k0 / g.cp;
        kc = k0 - tap * g.cp;
        kr = tap / g.s;
        ks = tap - kr * g.s;
        b_ptr = wp + (static_cast<long long>(grp) * g.w_rows + (n0 - grp * g.kp) + row0) * g.w_row + k0;
    }

    // Issue this thread's cp.asyncs of the next k tile; a_dst/b_dst: shared address of its first row.
    __device__ __forceinline__ void load(const Geometry& g, const T* __restrict__ x, unsigned a_dst,
                                         unsigned b_dst, int row_bytes) {
        const bool k_valid = kr < g.r;
        const int dr = kr * g.dil_h, ds = ks * g.dil_w;
        const int offset = (dr * g.w + ds) * g.pix + kc;
#pragma unroll
        for (int i = 0; i < A_ITERS; ++i) {
            const int ih = (a_hw[i] >> 16) + dr, iw = ((a_hw[i] << 16) >> 16) + ds;
            const bool ok = k_valid && static_cast<unsigned>(ih) < static_cast<unsigned>(g.h) &&
                            static_cast<unsigned>(iw) < static_cast<unsigned>(g.w);
            cp_async_ca<16>(a_dst + i * ROWS_PER_PASS * row_bytes, x + (ok ? a_off[i] + offset : 0), ok);
        }
#pragma unroll
        for (int i = 0; i < B_ITERS; ++i)
            cp_async_cg16(b_dst + i * ROWS_PER_PASS * row_bytes,
                          k_valid ? b_ptr + static_cast<long long>(i) * ROWS_PER_PASS * g.w_row : b_ptr, k_valid);
        b_ptr += TILE_K;
        kc += TILE_K;
        while (kc >= g.cp) { kc -= g.cp; if (++ks == g.s) { ks = 0; ++kr; } }
    }
};

// The epilogue's second half, shared by all GEMM kernels: the block's fp32 tile, staged in shared memory as
// c_smem[filter][pixel] (pitch BM + 4), goes to NCHW rows (or, where filters are adjacent, out_k == 1, to
// channels-last pixels, lanes along the filters) with bias added before the one rounding. A warp
// writes one filter's BM pixels at a time. Where the tile's pixels are one run of a single image, stored
// densely, and the runs are aligned (the run's start and P·Q multiples of 4, the output 4-element aligned; a
// row-band tile's run starts where its output row does) a lane writes 4 consecutive pixels per store, 128
// pixels of a filter row per warp store; elsewhere 32 pixels per store
// (whole 128-byte runs in fp32 where dense), each pixel's image and place found on its own.
template <typename T, int BM, int BN, int WARPS>
__device__ __forceinline__ void store_tile_nchw(const float* c_smem, const Geometry& g, const T* __restrict__ bias,
                                                T* __restrict__ y, int m0, int n0, int warp, int lane) {
    constexpr int kCPitch = BM + 4;
    constexpr int kCols = BM / 32;  // output pixels per lane per channel
    const int pq = g.p * g.q;
    const int grp = n0 / g.kp;  // the group's filters, from filter grp·k of the output
    const long long filter0 = static_cast<long long>(grp) * g.k;
    n0 -= grp * g.kp;
    if constexpr (BM % 128 == 0) {
        const int img = m0 / pq, rem = m0 - img * pq;
        if (rem + BM <= pq && m0 + BM <= g.m && rem % 4 == 0 && pq % 4 == 0 && g.out_img % 4 == 0 && g.out_k % 4 == 0 &&
            g.out_col == 1 && g.out_row == g.q &&
            reinterpret_cast<unsigned long long>(y) % (4 * sizeof(T)) == 0) {
            T* yl = y + img * g.out_img + rem + 4 * lane;
            for (int nl = warp; nl < BN; nl += WARPS) {
                const int n = n0 + nl;
                if (n >= g.k) break;
                const float b = bias != nullptr ? to_acc(bias[filter0 + n]) : 0.f;
                T* dst = yl + (filter0 + n) * g.out_k;
#pragma unroll
                for (int j = 0; j < BM / 128; ++j) {
                    const float4 v = *reinterpret_cast<const float4*>(&c_smem[nl * kCPitch + 128 * j + 4 * lane]);
                    // (in PTX: the C++ float4 store came out of NVRTC as four 4-byte stores)
                    if constexpr (sizeof(T) == 4) {
                        asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + 128 * j),
                                     "f"(v.x + b), "f"(v.y + b), "f"(v.z + b), "f"(v.w + b) : "memory");
                    } else {
                        unsigned lo, hi;
                        put_bits(lo, 0, from_acc<T>(v.x + b));
                        put_bits(lo, 1, from_acc<T>(v.y + b));
                        put_bits(hi, 0, from_acc<T>(v.z + b));
                        put_bits(hi, 1, from_acc<T>(v.w + b));
                        asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" ::"l"(dst + 128 * j), "r"(lo), "r"(hi)
                                     : "memory");
                    }
                }
            }
            return;
        }
    }
    if (g.out_k == 1) {  // filters adjacent (channels-last, or one output pixel a plane)
        // lanes along filters, a warp storing one pixel's run of filters at a time (reads of c_smem BM + 4
        // words apart: 4-way banked; whole 16-byte vectors of filters take store_tile_nhwc instead)
        for (int ml = warp; ml < BM; ml += WARPS) {
            const int m = m0 + ml;
            if (m >= g.m) break;
            const int img = m / pq, rem = m - img * pq, op = rem / g.q;
            T* yp = y + img * g.out_img + op * g.out_row + (rem - op * g.q) * g.out_col + filter0;
            for (int nl = lane; nl < BN; nl += 32) {
                const int n = n0 + nl;
                if (n >= g.k) break;
                const float b = bias != nullptr ? to_acc(bias[filter0 + n]) : 0.f;
                yp[n] = from_acc<T>(c_smem[nl * kCPitch + ml] + b);
            }
        }
        return;
    }
    long long out_off[kCols];
    bool m_ok[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
        const int m = m0 + lane + 32 * j;
        m_ok[j] = m < g.m;
        const int img = m_ok[j] ? m / pq : 0, rem = m - img * pq, op = rem / g.q;
        out_off[j] = img * g.out_img + op * g.out_row + (rem - op * g.q) * g.out_col;
    }
    for (int nl = warp; nl < BN; nl += WARPS) {
        const int n = n0 + nl;
        if (n >= g.k) break;
        const float b = bias != nullptr ? to_acc(bias[filter0 + n]) : 0.f;
        T* yn = y + (filter0 + n) * g.out_k;
#pragma unroll
        for (int j = 0; j < kCols; ++j)
            if (m_ok[j]) yn[out_off[j]] = from_acc<T>(c_smem[nl * kCPitch + lane + 32 * j] + b);
    }
}

// Channels-last outputs in whole 16-byte vectors of filters (filters adjacent, out_k == 1; K, the pixels'
// strides and y vector-aligned; not split over k): the epilogue stages the tile as c_smem[pixel][filter]
// (pitch BN + 4, store_tile_nhwc) instead, so that a thread reads a vector's filters of one pixel together.
template <typename T>
__device__ __forceinline__ bool nhwc_vectors(const Geometry& g, const T* y) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    return g.split_stride == 0 && g.out_k == 1 && g.k % kVec == 0 && g.out_img % kVec == 0 &&
           g.out_row % kVec == 0 && g.out_col % kVec == 0 && reinterpret_cast<unsigned long long>(y) % 16 == 0;
}

// The tile from c_smem[pixel][filter] (pitch BN + 4) to channels-last pixels, bias added before the one
// rounding: a thread per (pixel, 16-byte vector of filters), 8 consecutive threads 8 pixels of one vector
// (their 16-byte reads 4 banks apart: no conflicts), so a warp stores 4 vectors, 64 bytes, of each of 8 pixels.
template <typename T, int BM, int BN, int WARPS>
__device__ __forceinline__ void store_tile_nhwc(const float* c_smem, const Geometry& g, const T* __restrict__ bias,
                                                T* __restrict__ y, int m0, int n0, int tid) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T)), kPitch = BN + 4, kVectors = BN / kVec;
    constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
    static_assert(BM % 8 == 0 && BN % kVec == 0, "whole groups of 8 pixels and vectors of filters");
    const int pq = g.p * g.q;
    const int grp = n0 / g.kp;  // the group's filters, from filter grp·k of the output
    const long long filter0 = static_cast<long long>(grp) * g.k;
    n0 -= grp * g.kp;
    for (int idx = tid; idx < BM * kVectors; idx += 32 * WARPS) {
        const int ml = idx % 8 + idx / (8 * kVectors) * 8, nl = idx / 8 % kVectors * kVec;
        const int m = m0 + ml, n = n0 + nl;
        if (m >= g.m || n >= g.k) continue;
        const int img = m / pq, rem = m - img * pq, op = rem / g.q;
        T* yp = y + img * g.out_img + op * g.out_row + (rem - op * g.q) * g.out_col + filter0 + n;
        unsigned word[4];
#pragma unroll
        for (int v = 0; v < kVec / 4; ++v) {
            const float4 f = *reinterpret_cast<const float4*>(&c_smem[ml * kPitch + nl + 4 * v]);
            const float e[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int el = 4 * v + i;
                const float b = bias != nullptr ? to_acc(bias[filter0 + n + el]) : 0.f;
                put_bits(word[el / kPerWord], el % kPerWord, from_acc<T>(e[i] + b));
            }
        }
        *reinterpret_cast<uint4*>(yp) = make_uint4(word[0], word[1], word[2], word[3]);
    }
}

// The block's tile to the output in T, or, split over k (split_stride), to its fp32 partial sums.
template <typename T, int BM, int BN, int WARPS>
__device__ __forceinline__ void store_tile(const float* c_smem, const Geometry& g, const T* __restrict__ bias,
                                           T* __restrict__ y, int m0, int n0, int warp, int lane) {
    if (g.split_stride != 0)
        store_tile_nchw<float, BM, BN, WARPS>(c_smem, g, nullptr, reinterpret_cast<float*>(y) +
                                              blockIdx.z * g.split_stride, m0, n0, warp, lane);
    else
        store_tile_nchw<T, BM, BN, WARPS>(c_smem, g, bias, y, m0, n0, warp, lane);
}

}  // namespace igemm
}  // namespace cuconv

// Both GEMM kernels take the packed operands, the bias (or null), the output chunk and the geometry as one
// struct: a launch's host time grows with its argument count.
#define CUCONV_IGEMM_PARAMS                                                                          \
    const T *__restrict__ x, const T *__restrict__ wp, const T *__restrict__ bias, T *__restrict__ y, \
        const igemm::Geometry g

// ---------------------------------------------------------------------------------------------------
// The GEMM on mma.sync (sm_80+). Block: WARPS_M x WARPS_N warps, each a (BM/WARPS_M) x (BN/WARPS_N) tile of
// m16n8 MMAs. Grid: (ceil(M / BM), Kp / BN). Dynamic shared memory: Tile.smem_bytes in the Python twin.
namespace cuconv {
namespace igemm {
// implicit_gemm_fprop's block (m_block, n_block) of k range `split` on geometry g.
template <typename T, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int KB>
__device__ __forceinline__ void mma_block(const T* __restrict__ x, const T* __restrict__ wp,
                                          const T* __restrict__ bias, T* __restrict__ y, const Geometry& g,
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
    if (nhwc_vectors(g, y)) {
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
        store_tile_nhwc<T, BM, BN, WARPS_M * WARPS_N>(c_smem, g, bias, y, m0, n0, threadIdx.x);
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

    store_tile<T, BM, BN, WARPS_M * WARPS_N>(c_smem, g, bias, y, m0, n0, warp, lane);
}
}  // namespace igemm
}  // namespace cuconv

template <typename T, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int KB>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
implicit_gemm_fprop(CUCONV_IGEMM_PARAMS) {
    cuconv::igemm::mma_block<T, BM, BN, WARPS_M, WARPS_N, STAGES, KB>(x, wp, bias, y, g, blockIdx.x, blockIdx.y,
                                                                      blockIdx.z);
}

// A strided dgrad's phases (implicit_gemm.py: phase_specs) in one launch: grid z the phase, each its own
// geometry, packed weight (w_offset elements on) and first pixel of dx (y_offset); grid x the most pixel blocks
// of any phase (a phase's blocks past its pixels return at once). Separate launches left the SMs idle: a phase
// of ResNet-50's 512@14² stride-2 dgrad is 104 blocks.
struct PhaseGemms {
    igemm::Geometry g[4];
    long long y_offset[4], w_offset[4];
};
static_assert(sizeof(PhaseGemms) == 4 * 128 + 64, "PHASE_GEMMS_DTYPE in cuconv/families/implicit_gemm.py");

template <typename T, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int KB>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
implicit_gemm_fprop_phases(const T* __restrict__ x, const T* __restrict__ wp, const T* __restrict__ bias,
                           T* __restrict__ y, const __grid_constant__ PhaseGemms ph) {
    const int z = blockIdx.z;
    const igemm::Geometry& g = ph.g[z];
    if (static_cast<int>(blockIdx.x) * BM >= g.m) return;
    cuconv::igemm::mma_block<T, BM, BN, WARPS_M, WARPS_N, STAGES, KB>(x, wp + ph.w_offset[z], bias,
                                                                      y + ph.y_offset[z], g, blockIdx.x, blockIdx.y, 0);
}


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

namespace cuconv {
namespace igemm {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CUCONV_IGEMM_WGMMA 1
#endif

// Descriptor of a K-major tile of KB-byte rows (128, 64 or 32) stored with the KB-byte swizzle at shared address
// `addr` (atoms of 8 rows, 8·KB bytes, aligned to their size): start address, leading byte offset unused (1),
// stride byte offset 8·KB (one atom), all in 16-byte units; layout type 1, 2, 3 = 128-, 64-, 32-byte swizzle.
template <int KB = 128> __device__ __forceinline__ unsigned long long wgmma_desc(unsigned addr) {
    static_assert(KB == 128 || KB == 64 || KB == 32, "a swizzle wgmma reads");
    constexpr unsigned long long kLayout = KB == 128 ? 1 : KB == 64 ? 2 : 3;
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (1ull << 16) |
           (static_cast<unsigned long long>(KB / 2) << 32) | (kLayout << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes through the generic proxy, wgmma reads through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// A tensor map (cuTensorMapEncode*, cuconv/_tma.py): 128 opaque bytes, passed as a __grid_constant__ kernel
// parameter so that the TMA reads it where the launch put it.
struct alignas(64) TensorMap {
    unsigned long long bits[16];
};

// mbarriers (shared memory, CTA scope; try_wait is sm_90): init with the arrivals a phase needs, arrive, and
// wait until the phase of the given parity has completed.
#ifdef CUCONV_IGEMM_WGMMA
__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// A ring of STAGES slots' barriers, 8 bytes apart: slot s's full barrier completes on the producer's one arrival
// (with the slot's byte count) and its copies, its empty one on every consumer thread's arrival.
template <int STAGES> __device__ __forceinline__ void init_ring(unsigned full, unsigned empty, unsigned consumers) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
        mbarrier_init(full + 8 * s, 1);
        mbarrier_init(empty + 8 * s, consumers);
    }
}

// The tensor memory accelerator (TMA, TensorMap below): bulk copies of a tensor map's boxes into shared memory
// that complete on an mbarrier, which the issuing thread first tells how many bytes to expect.
__device__ __forceinline__ void mbarrier_expect_bytes(unsigned bar, unsigned bytes) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n"
                 ::"r"(bar), "r"(bytes) : "memory");
}
// A column of an NHWC tensor's im2col matrix: the box's pixels (pixelsPerColumn of the map) from window origin
// (w, h) of image n on, walking the map's bounding box of origins (W fastest, then H, then N; past the last image
// and outside the image: zeros), each pixel's channels c.. (channelsPerPixel of the map) at tap offset (ow, oh).
__device__ __forceinline__ void tma_im2col_4d(unsigned dst, const TensorMap& map, int c, int w, int h, int n,
                                              unsigned short ow, unsigned short oh, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c), "r"(w), "r"(h), "r"(n),
                   "r"(bar), "h"(ow), "h"(oh) : "memory");
}
// A box of an NHWC tensor (a 4-D tiled map: channels, W, H, N) from channel c, column w, row h of image n (outside
// the tensor: zeros).
__device__ __forceinline__ void tma_tile_4d(unsigned dst, const TensorMap& map, int c, int w, int h, int n,
                                            unsigned bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar)
                 : "memory");
}
// A box of a 2-D tensor from column x, row y (rows past the tensor: zeros).
__device__ __forceinline__ void tma_tile_2d(unsigned dst, const TensorMap& map, int x, int y, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(x), "r"(y), "r"(bar) : "memory");
}

// The ring's three steps. The producer takes slot kt % STAGES for tile kt once the consumers released tile
// kt - STAGES from it (phase kt / STAGES - 1 of its empty barrier), tells its full barrier the copies' bytes and
// returns that barrier; a consumer waits for tile kt's full barrier (phase kt / STAGES); once it has issued tile
// kt's wgmmas, it retires tile kt - 1's (one group stays in flight) and releases that tile's slot.
template <int STAGES> __device__ __forceinline__ unsigned ring_fill(unsigned full, unsigned empty, int kt,
                                                                   unsigned bytes) {
    const int s = kt % STAGES;
    if (kt >= STAGES) mbarrier_wait(empty + 8 * s, ((kt / STAGES) - 1) & 1);
    mbarrier_expect_bytes(full + 8 * s, bytes);
    return full + 8 * s;
}
template <int STAGES> __device__ __forceinline__ void ring_wait_full(unsigned full, int kt) {
    mbarrier_wait(full + 8 * (kt % STAGES), (kt / STAGES) & 1);
}
template <int STAGES> __device__ __forceinline__ void ring_release_previous(unsigned empty, int kt) {
    wgmma_wait<1>();
    if (kt > 0) mbarrier_arrive(empty + 8 * ((kt - 1) % STAGES));
}
#endif

// Pin the accumulators at this point of the program: the compiler sees only the wgmma's asm statement
// write them, not the asynchronous completion that wgmma_wait marks.
template <int N> __device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define CUCONV_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                     "+f"(d[i + 6]), "+f"(d[i + 7])
#define CUCONV_D64 CUCONV_D8(0), CUCONV_D8(8), CUCONV_D8(16), CUCONV_D8(24), CUCONV_D8(32), CUCONV_D8(40), \
                   CUCONV_D8(48), CUCONV_D8(56)
#define CUCONV_D64_LIST "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define CUCONV_WGMMA_M64N128(shape_types, tail)                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                 \
                 "wgmma.mma_async.sync.aligned.m64n128" shape_types " " CUCONV_D64_LIST ", %64, %65, p, 1, 1" \
                 tail ";\n}\n"                                                                                \
                 : CUCONV_D64                                                                                 \
                 : "l"(a), "l"(b), "r"(1))

#define CUCONV_D32 CUCONV_D8(0), CUCONV_D8(8), CUCONV_D8(16), CUCONV_D8(24)
#define CUCONV_D32_LIST "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define CUCONV_WGMMA_M64N64(shape_types, tail)                                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                 \
                 "wgmma.mma_async.sync.aligned.m64n64" shape_types " " CUCONV_D32_LIST ", %32, %33, p, 1, 1"  \
                 tail ";\n}\n"                                                                                \
                 : CUCONV_D32                                                                                 \
                 : "l"(a), "l"(b), "r"(1))

// d (64 filters x 128 pixels, fp32) += A (64 x k step) · B (128 x k step)ᵀ, both from shared memory.
template <typename T> struct Wgmma;
template <> struct Wgmma<float> {
    static __device__ __forceinline__ void run(float (&d)[64], unsigned long long a, unsigned long long b) {
#ifdef CUCONV_IGEMM_WGMMA
        CUCONV_WGMMA_M64N128("k8.f32.tf32.tf32", "");
#endif
    }
};
template <> struct Wgmma<__half> {
    static __device__ __forceinline__ void run(float (&d)[64], unsigned long long a, unsigned long long b) {
#ifdef CUCONV_IGEMM_WGMMA
        CUCONV_WGMMA_M64N128("k16.f32.f16.f16", ", 0, 0");
#endif
    }
};
template <> struct Wgmma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float (&d)[64], unsigned long long a, unsigned long long b) {
#ifdef CUCONV_IGEMM_WGMMA
        CUCONV_WGMMA_M64N128("k16.f32.bf16.bf16", ", 0, 0");
#endif
    }
};

// wgrad's products, both operands MN-major (imm-trans-a = imm-trans-b = 1, the 16-bit types only): d (64 filters
// x N channels, fp32, N / 2 a thread) += A (64 filters x 16 pixels, filters contiguous) · B (16 pixels x N
// channels, channels contiguous).
template <typename T> constexpr bool kHalfStorage = false;
template <> constexpr bool kHalfStorage<__half> = true;
template <typename T, int N> struct WgmmaMn {
    static_assert(N == 64 || N == 128, "m64n64 or m64n128");
    static __device__ __forceinline__ void run(float (&d)[N / 2], unsigned long long a, unsigned long long b) {
#ifdef CUCONV_IGEMM_WGMMA
        if constexpr (N == 64 && kHalfStorage<T>)
            CUCONV_WGMMA_M64N64("k16.f32.f16.f16", ", 1, 1");
        else if constexpr (N == 64)
            CUCONV_WGMMA_M64N64("k16.f32.bf16.bf16", ", 1, 1");
        else if constexpr (kHalfStorage<T>)
            CUCONV_WGMMA_M64N128("k16.f32.f16.f16", ", 1, 1");
        else
            CUCONV_WGMMA_M64N128("k16.f32.bf16.bf16", ", 1, 1");
#endif
    }
};

// Descriptor of an MN-major operand at shared address `addr` as wgrad's TMA copies store it: boxes of 64 k rows
// (pixels) × 64 MN elements (128 bytes, the 128-byte swizzle: atoms of 8 rows, 1024 bytes), one box after the
// other along MN. Leading byte offset: the next 64 MN elements (the next box, 8192 bytes on); stride byte offset:
// the next 8 k rows (1024 bytes); 16-byte units; layout type 1 (128-byte swizzle).
constexpr unsigned kMnBoxBytes = 64 * 128;
__device__ __forceinline__ unsigned long long wgmma_desc_mn(unsigned addr) {
    constexpr unsigned long long kLeading = kMnBoxBytes >> 4, kStride = 1024 >> 4;
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (kLeading << 16) | (kStride << 32) | (1ull << 62);
}

// Descriptor of a K-major operand without swizzle whose rows are 16 bytes apart (8-row core matrices one after
// the other: stride byte offset 128) and whose 16-byte k chunks are `chunk_bytes` apart (leading byte offset):
// implicit_gemm_wgmma_tma_rows's band of input pixels, read from any pixel on (a start 16 bytes further is the
// operand one pixel further: no swizzle atom to stay aligned to). 16-byte units; layout type 0.
__device__ __forceinline__ unsigned long long wgmma_desc_rows(unsigned addr, unsigned chunk_bytes) {
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) |
           (static_cast<unsigned long long>(chunk_bytes >> 4) << 16) | (static_cast<unsigned long long>(128 >> 4) << 32);
}

// Bytes of the epilogue's fp32 staging of a BF x BP tile: [BF][BP + 4], or [BP][BF + 4] for channels-last vectors
// (nhwc_vectors), whichever is larger (the Python twin's _staging_bytes).
template <int BF, int BP> __host__ __device__ constexpr int staging_bytes() {
    return 4 * (BF * (BP + 4) > BP * (BF + 4) ? BF * (BP + 4) : BP * (BF + 4));
}

// One KB-byte k tile of a warpgroup's wgmmas (KB / 32 k steps), committed as one group: its 64 filter rows from
// shared address `a`, its NW × 128 pixel rows from `b` (both KB-byte rows in swizzled atoms of 8); the caller
// waits for the group.
template <typename T, int NW, int KB = 128>
__device__ __forceinline__ void wgmma_k_tile(float (&acc)[NW][64], unsigned a, unsigned b) {
    const unsigned long long da = wgmma_desc<KB>(a);
    const unsigned long long db = wgmma_desc<KB>(b);
    wgmma_fence();
#pragma unroll
    for (int step = 0; step < KB / 32; ++step)
#pragma unroll
        for (int n = 0; n < NW; ++n)  // +2 per 32-byte k step, in 16-byte units; 128 rows of KB bytes per wgmma
            Wgmma<T>::run(acc[n], da + 2 * step, db + 2 * step + n * 128 * (KB / 16));
    wgmma_commit();
}

}  // namespace igemm
}  // namespace cuconv

namespace cuconv {
namespace igemm {

// The epilogue of both wgmma kernels, once every wgmma is retired: accumulators -> shared memory [filter]
// [pixel] at `stage` (the pipeline's slots, free by now) -> NCHW rows, or [pixel][filter] -> channels-last
// vectors (nhwc_vectors). Accumulator i of a thread: filter row
// (lane / 4) + 8·((i / 2) % 2) of its warp's 16, pixel column 2·(lane % 4) + (i % 2) + 8·(i / 4) of the
// wgmma's 128; pairs of columns go as one 8-byte store.
// NAMED: the block has threads besides these (implicit_gemm_wgmma_tma's producer warp, the last one), so they
// meet at named barrier 1 of their own count instead of __syncthreads.
template <int kThreads, bool NAMED> __device__ __forceinline__ void epilogue_sync() {
    if constexpr (NAMED)
        asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
    else
        __syncthreads();
}

template <typename T, int BF, int BP, int WG_P, int NW, bool NAMED = false>
__device__ __forceinline__ void wgmma_epilogue(float (&acc)[NW][64], unsigned char* stage, const Geometry& g,
                                               const T* __restrict__ bias, T* __restrict__ y, int m0, int n0) {
    constexpr int kThreads = BF / 64 * WG_P * 128;
    constexpr int kWgPixels = BP / WG_P;
    cp_async_wait<0>();
    epilogue_sync<kThreads, NAMED>();
    float* c_smem = reinterpret_cast<float*>(stage);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32, wg = tid / 128;
    const int wg_f = wg % (BF / 64), wg_p = wg / (BF / 64);
    const int row = wg_f * 64 + (warp % 4) * 16 + lane / 4;
    if (nhwc_vectors(g, y)) {  // [pixel][filter], pitch BF + 4: a warp's 8 columns x 8 rows hit 32 banks
        constexpr int kFPitch = BF + 4;
#pragma unroll
        for (int n = 0; n < NW; ++n)
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const int col = wg_p * kWgPixels + n * 128 + 8 * j + 2 * (lane % 4);
                c_smem[col * kFPitch + row] = acc[n][4 * j];
                c_smem[(col + 1) * kFPitch + row] = acc[n][4 * j + 1];
                c_smem[col * kFPitch + row + 8] = acc[n][4 * j + 2];
                c_smem[(col + 1) * kFPitch + row + 8] = acc[n][4 * j + 3];
            }
        epilogue_sync<kThreads, NAMED>();
        store_tile_nhwc<T, BP, BF, kThreads / 32>(c_smem, g, bias, y, m0, n0, tid);
        return;
    }
    constexpr int kCPitch = BP + 4;  // rows 4 banks apart: a warp's 8 rows x 8 columns hit 32 banks
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int col = wg_p * kWgPixels + n * 128 + 8 * j + 2 * (lane % 4);
            *reinterpret_cast<float2*>(&c_smem[row * kCPitch + col]) = make_float2(acc[n][4 * j], acc[n][4 * j + 1]);
            *reinterpret_cast<float2*>(&c_smem[(row + 8) * kCPitch + col]) =
                make_float2(acc[n][4 * j + 2], acc[n][4 * j + 3]);
        }
    epilogue_sync<kThreads, NAMED>();
    store_tile<T, BP, BF, kThreads / 32>(c_smem, g, bias, y, m0, n0, warp, lane);
}

}  // namespace igemm
}  // namespace cuconv

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

    wgmma_epilogue<T, BF, BP, WG_P>(acc, smem + (base - smem_addr(smem)), g, bias, y, m0, n0);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}


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
template <typename T, int BF, int BP, int NW, bool kRows = false, bool kOverlap = false>
__device__ __forceinline__ void tma_store_epilogue(float (&acc)[NW][64], unsigned stage, const Geometry& g,
                                                   const T* __restrict__ bias, const TensorMap& y_map, int m0,
                                                   int n0, int row = 0) {
    constexpr int kThreads = BF / 64 * 128;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32, wg = tid / 128;
    const int f0 = n0 + wg * 64 + (warp % 4) * 16 + lane / 4;  // the thread's filters f0, f0 + 8
    const float b0 = bias != nullptr && f0 < g.k ? to_acc(bias[f0]) : 0.f;
    const float b1 = bias != nullptr && f0 + 8 < g.k ? to_acc(bias[f0 + 8]) : 0.f;
    const unsigned box = stage + wg * BP * 128;
    const int q = lane / 8, r = lane % 8;  // this lane's address: row r of block q of an stmatrix
    const int chunk = (warp % 4) * 2 + q % 2;  // the block's 8 filters: a 16-byte chunk of the box's row
    if (kOverlap && tid == 0) tma_store_drain();
    epilogue_sync<kThreads, true>();  // (every consumer's wgmmas retired: the slots are free; kOverlap: the staging)
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int j = 0; j < 16; j += 2) {  // pixel groups j, j + 1 of the wgmma's 128: blocks (f0, j), (f0 + 8, j)..
            unsigned v[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int i = 4 * (j + k / 2) + 2 * (k % 2);
                const float b = k % 2 ? b1 : b0;
                v[k] = pair_word<T>(acc[n][i] + b, acc[n][i + 1] + b);
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
                                                const T* __restrict__ bias, T* __restrict__ y, const Geometry& g,
                                                const TensorMap& x_map, const TensorMap& w_map, int m_block,
                                                int n_block, int split, const TensorMap* y_map = nullptr) {
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
        tma_store_epilogue<T, BF, BP, NW>(acc, base, g, bias, *y_map, m0, n0);
        return;
    }
    wgmma_epilogue<T, BF, BP, 1, NW, true>(acc, smem + (base - smem_addr(smem)), g, bias, y, m0, n0);
    if (g.block_diag != 0) {
        epilogue_sync<kConsumers, true>();  // the tile is stored
        if (*nonfinite_flag) block_diag_fixup<T, BF, BP>(x, wp, bias, y, g, m0, n0, tid, kConsumers);
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
    igemm::wgmma_tma_block<T, BF, BP, STAGES, KB>(x, wp, bias, y, g, x_map, w_map, blockIdx.x, blockIdx.y, blockIdx.z);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}

// The same into a dense channels-last output through tma_store_epilogue (y_map: the output as an (N·P·Q) × K
// matrix; one k range, no block-diagonal weight).
template <typename T, int BF, int BP, int STAGES, int MINB, int KB>
__global__ void __launch_bounds__(BF / 64 * 128 + 32, MINB)
implicit_gemm_wgmma_tma_st(CUCONV_IGEMM_PARAMS, const __grid_constant__ igemm::TensorMap x_map,
                           const __grid_constant__ igemm::TensorMap w_map,
                           const __grid_constant__ igemm::TensorMap y_map) {
#ifdef CUCONV_IGEMM_WGMMA
    igemm::wgmma_tma_block<T, BF, BP, STAGES, KB>(x, wp, bias, y, g, x_map, w_map, blockIdx.x, blockIdx.y, 0, &y_map);
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
                            const __grid_constant__ igemm::TensorMap y_map) {
#ifdef CUCONV_IGEMM_WGMMA
    using namespace igemm;
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
    int it = 0;
    for (int mb = first; mb < m_blocks; mb += step) {
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
        tma_store_epilogue<T, BF, BP, NW, false, true>(acc, staging, g, bias, y_map, mb * BP, n0);
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
    igemm::wgmma_tma_block<T, BF, BP, STAGES, KB>(x, wp, bias, y + ph.y_offset[z], g, xm, wm, blockIdx.x, blockIdx.y,
                                                   0);
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
                                                     const T* __restrict__ bias, T* __restrict__ y,
                                                     const Geometry& g, const TensorMap& x_map,
                                                     const TensorMap& w_map, const TensorMap* y_map) {
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
        tma_store_epilogue<T, BF, BP, NW, true>(acc, base, g, bias, *y_map, q0, n0, row);
        return;
    }
    Geometry row_g = g;  // the epilogue stores this row's pixels only
    row_g.m = min(g.m, m0 + min(BP, g.q - q0));
    wgmma_epilogue<T, BF, BP, 1, NW, true>(acc, smem + (base - smem_addr(smem)), row_g, bias, y, m0, n0);
#endif
}
}  // namespace igemm
}  // namespace cuconv

template <typename T, int BF, int BP, int STAGES, int MINB, int CP>
__global__ void __launch_bounds__(BF / 64 * 128 + 32, MINB)
implicit_gemm_wgmma_tma_rows(CUCONV_IGEMM_PARAMS, const __grid_constant__ igemm::TensorMap x_map,
                             const __grid_constant__ igemm::TensorMap w_map) {
#ifdef CUCONV_IGEMM_WGMMA
    igemm::wgmma_tma_rows_block<T, BF, BP, STAGES, CP>(x, wp, bias, y, g, x_map, w_map, nullptr);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}

// The same into a dense channels-last output through the TMA (y_map: N·P rows of Q pixels × K filters).
template <typename T, int BF, int BP, int STAGES, int MINB, int CP>
__global__ void __launch_bounds__(BF / 64 * 128 + 32, MINB)
implicit_gemm_wgmma_tma_rows_st(CUCONV_IGEMM_PARAMS, const __grid_constant__ igemm::TensorMap x_map,
                                const __grid_constant__ igemm::TensorMap w_map,
                                const __grid_constant__ igemm::TensorMap y_map) {
#ifdef CUCONV_IGEMM_WGMMA
    igemm::wgmma_tma_rows_block<T, BF, BP, STAGES, CP>(x, wp, bias, y, g, x_map, w_map, &y_map);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}


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
static_assert(sizeof(WgradTmaGeometry) == 104, "WGRAD_TMA_GEOMETRY_DTYPE in cuconv/families/implicit_gemm.py");

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


// ---------------------------------------------------------------------------------------------------
// The wgmma GEMM straight from NCHW (sm_90a): no packing launch. The block gathers both operands itself,
// through registers: the input from NCHW (a thread per pixel row: a warp's 32 lanes read 32 neighbouring
// pixels of one channel and tap, coalesced) and the weight from KCRS (16-byte vectors where the rows allow,
// else element by element), rounds float32 to TF32 on the way, and stores both in the swizzled layout of
// implicit_gemm_wgmma. What a packed input buys (one 16-byte cp.async per 4 or 8 k) costs a separate
// launch and a round trip of the input through memory. Where the GEMM does little work per input element
// that round trip costs more than this gather (1x1 layers), or as much (float32 resnet_3x3_64, one launch
// fewer); elsewhere the packed kernels win (docs/perf-notes.md, v6).
//
// k order here is the weight's own, k = (c·R + r)·S + s over C·R·S (g.w_row; g.cp is C), zero past it up
// to whole 128-byte k tiles. A table in shared memory gives each k its input offset c·H·W + r·dil_h·W +
// s·dil_w and its tap's bit 1 << (r·S + s) (0 past C·R·S); each thread holds the bits of the taps that fall
// inside the image for its pixel, so a k costs the gather one shared load (the same address for a warp),
// one AND and a predicated load (kernels of up to 31 taps, Python twin). Two slots: tile kt + 1 goes from
// registers to its slot while the wgmmas of tile kt run, and tile kt + 2 is loaded into registers then.
// Block: BF / 64 warpgroups along filters, 128 pixels (one m64n128 wgmma per k step each); epilogue as
// implicit_gemm_wgmma. Shared memory (the Python twin's NchwTile): the slots or the epilogue's staging, if
// larger, then 8 bytes of table per k.

template <typename T, int BF, int BP, int MINB>
__global__ void __launch_bounds__(BF / 64 * 128, MINB)
implicit_gemm_wgmma_nchw(CUCONV_IGEMM_PARAMS) {
#ifdef CUCONV_IGEMM_WGMMA
    using namespace igemm;
    constexpr int kThreads = BF / 64 * 128;
    constexpr int kRowBytes = 128;
    constexpr int V = 16 / sizeof(T);          // elements per 16-byte vector
    constexpr int TK = kRowBytes / sizeof(T);  // k per tile
    constexpr int TPR = kThreads / BP;         // threads per pixel row
    constexpr int EPT = TK / TPR;              // k of a row per thread and tile
    constexpr int VPT = EPT / V;               // its 16-byte vectors
    constexpr int BPT = BF * 8 / kThreads;     // weight vectors per thread and tile
    constexpr int kSlotBytes = (BF + BP) * kRowBytes;
    constexpr int kStagingBytes = staging_bytes<BF, BP>();
    constexpr int kTableOffset = 2 * kSlotBytes > kStagingBytes ? 2 * kSlotBytes : kStagingBytes;
    static_assert(BP == 128 && kThreads % BP == 0 && VPT >= 1 && BPT >= 1 && (BF * 8) % kThreads == 0,
                  "tile shape");

    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned base = (smem_addr(smem) + 1023u) & ~1023u;  // the swizzle needs 1024-byte alignment
    unsigned char* const stage = smem + (base - smem_addr(smem));
    int2* const table = reinterpret_cast<int2*>(stage + kTableOffset);

    const int tid = threadIdx.x;
    const int m0 = blockIdx.x * BP, n0 = blockIdx.y * BF;
    const int crs = static_cast<int>(g.w_row);
    const int hw = g.h * g.w;
    {
        const int rs = g.r * g.s;
        for (int k = tid; k < g.k_tiles * TK; k += kThreads) {
            int2 e = make_int2(0, 0);  // past C·R·S: no tap
            if (k < crs) {
                const int c = k / rs, tap = k - c * rs, r = tap / g.s, s = tap - r * g.s;
                e = make_int2(c * hw + r * g.dil_h * g.w + s * g.dil_w, 1 << tap);
            }
            table[k] = e;
        }
    }

    // This thread's pixel row: a pointer to its window's top-left input element in channel 0 (outside the
    // image where padded: only taps inside it are read) and the bits of those taps (none past M); and its
    // EPT k of each tile.
    const int row = tid % BP, kseg = tid / BP;
    const T* xr = x;
    unsigned taps = 0;
    if (m0 + row < g.m) {
        const int pq = g.p * g.q;
        const int img = (m0 + row) / pq, rem = m0 + row - img * pq;
        const int op = rem / g.q, oq = rem - op * g.q;
        const int ih0 = op * g.stride_h - g.pad_h, iw0 = oq * g.stride_w - g.pad_w;
        xr = x + (static_cast<long long>(img) * g.cp * hw + ih0 * g.w + iw0);
        for (int r = 0; r < g.r; ++r)
            for (int s = 0; s < g.s; ++s)
                if (static_cast<unsigned>(ih0 + r * g.dil_h) < static_cast<unsigned>(g.h) &&
                    static_cast<unsigned>(iw0 + s * g.dil_w) < static_cast<unsigned>(g.w))
                    taps |= 1u << (r * g.s + s);
    }
    // Weight vector i of a tile: filter row i·(kThreads / 8) + tid / 8 of the block, 16-byte column tid % 8.
    const bool b_vectors = crs % V == 0 && (reinterpret_cast<unsigned long long>(wp) & 15) == 0;
    const int b_col = tid % 8;

    // The staged tiles as 32-bit words (16-bit elements in pairs, low half first): arrays of halves assigned
    // element by element went to the stack. Nothing here consumes a loaded value: float32 is rounded to TF32
    // when stored (store_regs), a tile later, and halves are paired after all of a tile's loads are issued.
    // (Rounding right after each load made every load wait for the one before: 4x slower.)
    constexpr int kPerWord = 4 / sizeof(T);
    unsigned a_reg[VPT][4], b_reg[BPT][4];
    auto load_regs = [&](int kt) {
        const int2* t = table + kt * TK + kseg * EPT;
        if constexpr (sizeof(T) == 4) {
#pragma unroll
            for (int e = 0; e < EPT; ++e) {
                const int2 d = t[e];
                T v = zero<T>();
                if (taps & d.y) v = xr[d.x];
                put_bits(a_reg[e / V][e % V], 0, v);
            }
        } else {
            unsigned short raw[EPT];
#pragma unroll
            for (int e = 0; e < EPT; ++e) {
                const int2 d = t[e];
                raw[e] = 0;
                if (taps & d.y) raw[e] = reinterpret_cast<const unsigned short*>(xr)[d.x];
            }
#pragma unroll
            for (int e = 0; e < EPT; e += 2)
                a_reg[e / V][(e % V) / 2] = raw[e] | (static_cast<unsigned>(raw[e + 1]) << 16);
        }
        const int k = kt * TK + b_col * V;
#pragma unroll
        for (int i = 0; i < BPT; ++i) {
            const int f = n0 + i * (kThreads / 8) + tid / 8;
            const T* src = wp + static_cast<long long>(f) * crs + k;
            if (f < g.k && b_vectors && k < crs) {
                const uint4 q = *reinterpret_cast<const uint4*>(src);
                b_reg[i][0] = q.x; b_reg[i][1] = q.y; b_reg[i][2] = q.z; b_reg[i][3] = q.w;
            } else {
#pragma unroll
                for (int e = 0; e < V; ++e)
                    put_bits(b_reg[i][e / kPerWord], e % kPerWord, f < g.k && k + e < crs ? src[e] : zero<T>());
            }
        }
    };
    auto store_regs = [&](int slot) {
        unsigned char* s = stage + slot * kSlotBytes;
        // TF32, rounded once as the pack kernels do: more accurate than the MMA's truncation, for a few percent
        // of the time
        if constexpr (sizeof(T) == 4) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int v = 0; v < VPT; ++v) a_reg[v][j] = __float_as_uint(round_tf32(__uint_as_float(a_reg[v][j])));
#pragma unroll
                for (int i = 0; i < BPT; ++i) b_reg[i][j] = __float_as_uint(round_tf32(__uint_as_float(b_reg[i][j])));
            }
        }
#pragma unroll
        for (int j = 0; j < VPT; ++j) {
            const int r = BF + row, chunk = kseg * VPT + j;
            *reinterpret_cast<uint4*>(s + r * kRowBytes + ((chunk ^ (r & 7)) << 4)) =
                make_uint4(a_reg[j][0], a_reg[j][1], a_reg[j][2], a_reg[j][3]);
        }
#pragma unroll
        for (int i = 0; i < BPT; ++i) {
            const int r = i * (kThreads / 8) + tid / 8;
            *reinterpret_cast<uint4*>(s + r * kRowBytes + ((b_col ^ (r & 7)) << 4)) =
                make_uint4(b_reg[i][0], b_reg[i][1], b_reg[i][2], b_reg[i][3]);
        }
    };

    const int wg = tid / 128;
    const unsigned a_off = wg * 64 * kRowBytes;  // this warpgroup's filters
    const unsigned b_off = BF * kRowBytes;       // the block's pixels

    float acc[1][64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[0][i] = 0.f;

    __syncthreads();  // the table is written
    load_regs(0);
    store_regs(0);
    if (g.k_tiles > 1) load_regs(1);
    for (int kt = 0; kt < g.k_tiles; ++kt) {
        fence_proxy_async();  // the generic-proxy stores of tile kt, before the wgmmas (async proxy) read them
        __syncthreads();      // tile kt is in its slot; every warpgroup retired tile kt - 1, whose slot is next
        const unsigned slot = base + (kt & 1) * kSlotBytes;
        wgmma_k_tile<T>(acc, slot + a_off, slot + b_off);
        if (kt + 1 < g.k_tiles) {
            store_regs((kt + 1) & 1);
            if (kt + 2 < g.k_tiles) load_regs(kt + 2);
        }
        wgmma_wait<0>();
    }
    fence_acc(acc[0]);
    wgmma_epilogue<T, BF, BP, 1>(acc, stage, g, bias, y, m0, n0);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}
