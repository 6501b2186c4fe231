// implicit_gemm's packs (pack_nhwc, pack_nhwc_narrow, pack_swap, pack_block_diagonal, pack_dgrad_phases) and
// split-K's sum (sum_splits): the launches that prepare the GEMMs' operands and finish their partial sums.
// Python twin: cuconv/algos/implicit_gemm/pack.py.
#include "implicit_gemm/igemm.cuh"

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
              "PACK_SHAPE_DTYPE in cuconv/algos/implicit_gemm/pack.py has this layout");

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
              "SWAP_SHAPE_DTYPE in cuconv/algos/implicit_gemm/pack.py has this layout");

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
static_assert(sizeof(BlockDiagonal) == 32, "BLOCK_DIAGONAL_DTYPE in cuconv/algos/implicit_gemm/pack.py");

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

// dgrad at a stride above 1 (implicit_gemm/dgrad_phases.py): dx's pixels h ≡ ph (mod stride_h), w ≡ pw (phase (ph, pw))
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
              "PHASE_WEIGHTS_DTYPE in cuconv/algos/implicit_gemm/pack.py has this layout");

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
// ... in order: deterministic) with the filter's bias, then the epilogue (the residual res lies as y), rounded
// once. The partials have y's layout, n elements
// apart; an element's filter is (i / pq) % k (NCHW; wgrad has no bias).
struct SplitSum {
    long long n;
    int splits, pq, k, unused;
};
static_assert(sizeof(SplitSum) == 24 && alignof(SplitSum) == 8,
              "SPLIT_SUM_DTYPE in cuconv/algos/implicit_gemm/pack.py has this layout");

template <typename T>
__global__ void __launch_bounds__(256)
sum_splits(const float* __restrict__ partials, const T* __restrict__ bias, T* __restrict__ y,
           const T* __restrict__ res, const SplitSum ss, const cuconv::igemm::Epilogue e) {
    const cuconv::igemm::Epi<T> ep = cuconv::igemm::epi_of(bias, res, e);
    for (long long i = blockIdx.x * 256LL + threadIdx.x; i < ss.n; i += gridDim.x * 256LL) {
        float v = cuconv::igemm::bias_at(ep, (i / ss.pq) % ss.k);
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
        y[i] = from_acc<T>(cuconv::igemm::finish_at(sum + v, ep, i));
    }
}
