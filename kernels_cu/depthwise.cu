// depthwise: convolutions with groups == C (one input channel per group, K = m·C output channels with
// channel multiplier m), any kernel size, stride, padding and dilation. Memory-bound: every kernel here
// aims to move each input and output element through DRAM about once.
//
// Kernels (T: storage type; sums in cuconv::Acc<T>, i.e. float for half types, rounded once):
//   depthwise_fwd<T, KR, KS>(x, w, bias, out, ...)
//       blockIdx.x = one output plane (n, k), blockIdx.y = one 32×64 tile of it; 32×8 threads. The block
//       stages its input tile, halo and dilation included ((32-1)·sh + (R-1)·dh + 1 rows × (64-1)·sw +
//       (S-1)·dw + 1 columns, zeros where the tile hangs over the padding, only the part its outputs inside
//       the plane read at a stride or dilation above 1; 12 loads in flight per thread)
//       and the R·S weights in dynamic shared memory; each thread then keeps 4×2 outputs in registers
//       (rows ty + 8i, columns tx + 32j: conflict-free reads, coalesced stores). KR×KS = 3×3, 5×5, 7×7 are
//       compiled with unrolled tap loops (and, for stride = dilation = 1, compile-time tile offsets), 0×0
//       reads R, S at run time. Bias is added in the sum.
//   depthwise_fwd_strips<T, KR, KS, kFlat>(x, w, bias, out, ..., rows_per_strip, strips, items)
//       stride = dilation = 1 with a 3×3, 5×5 or 7×7 kernel: no shared memory at all. blockIdx.x = one output
//       plane (n, k) and thread blockIdx.y·256 + threadIdx.x of it, or with kFlat (small planes, whose few
//       strips would leave a block per plane nearly empty and the SM at its resident-block limit) thread
//       blockIdx.x·256 + threadIdx.x of the (plane, strip, column) items flat over the batch, owns output
//       column q and a strip of rows_per_strip consecutive output rows, walking down them with the KR input
//       rows it reads held in registers (KS columns each): per output row, KS loads of one new input row
//       (neighbouring lanes read neighbouring columns: coalesced, the overlap served by L1), KR·KS FMAs and one
//       coalesced store.
//   depthwise_fwd_rows<T, KR, KS, kSegmented, kBytes>(x, w, bias, out, ..., slots, strips, segs, seg_lanes,
//                                                     rows_per_strip)
//       stride = dilation = 1, KS odd with its centred padding left and right (Q == W), rows of a multiple
//       of kBytes (16, or 8 for 16-bit rows of 4 modulo 8 elements such as 28 or 20), 16-byte aligned
//       tensors: the fastest where it applies (near a same-size copy's time; docs/perf-notes.md). A thread
//       owns V = kBytes / sizeof(T) consecutive columns of a strip of output rows: per input row one kBytes
//       load (the KS - 1 halo columns come from the neighbouring lanes by shuffles), KR·KS·V FMAs and one
//       kBytes store per output row; its KR window rows stay in registers, indexed j % KR so that a step of
//       KR rows needs no register moves, the KR loads of a step in flight together, issued a step early in
//       the 16-bit types (else the next step's rows are prefetched into L2). A row's
//       W / V vectors form segments of at most 32 lanes (edge lanes of a segment that ends inside the
//       image load their halo: kSegmented); a warp serves 32 / seg_lanes slots side by side, a slot being
//       one segment of one strip of one output plane, and a persistent grid walks the slots.
//   depthwise_fwd_plane<T, KR, KS>(x, w, bias, out, ..., rows_per_strip, strips, lead, pitch, stages)
//       stride = dilation = 1 with a 3×3 (or, summing in float, 5×5) kernel, where a padded input plane fits
//       in shared memory and its rows are 16-byte aligned: a persistent grid, block b convolving input
//       planes (n, c) = b, b + gridDim.x, ... into their `mult` output planes each. Planes are staged whole
//       by 16-byte cp.async copies, `stages` buffers deep (image column 0 at shared column `lead`, a
//       multiple of 16 bytes, rows `pitch` apart; the zero halo written once), so that the loads of the
//       next planes are in flight while one is convolved: each thread walks column strips of
//       rows_per_strip output rows as depthwise_fwd_strips does, reading shared memory instead of L1.
//   depthwise_fwd_gather<T, KR, KS>(x, w, bias, out, DwGeometry)
//       3×3, 5×5, 7×7 at any stride and dilation: one thread per output, flat over the batch's planes (small
//       planes and strided layers, where a tile or a strip per plane leaves most threads idle); the window
//       comes through L1.
//   depthwise_fwd_gather2<T, KR, KS, SW>(x, w, bias, out, DwGeometry)
//       the gather at dilation 1 and column stride SW = 1 or 2: two neighbouring outputs per thread, their
//       shared window columns loaded once.
//   depthwise_dgrad_s2<T, KR, KS>(dy, w, dx, DwGeometry)
//       stride 2×2, dilation 1, 3×3, 5×5, 7×7: one thread per 2×2 quad of dx, each tap serving exactly one
//       of the four (their parities are the same for every quad).
//   depthwise_dgrad<T, kUnitStride, Index>(dy, w, dx, ...)   (Index: int when the tensor has < 2^31
//       elements, else long long — 64-bit division is a software routine, so decode in 32 bits if possible)
//       one thread per dx element (n, c, h, w): the gather dx = Σ_{j<m} Σ_{r,s} w[c·m+j, r, s] ·
//       dy[n, c·m+j, p, q] over the (p, q) that read (h, w); dy comes through L1/L2.
//   depthwise_wgrad_strips<T, KR, KS, SH>(x, dy, partial, DwGeometry)
//       3×3, 5×5, 7×7, dilation 1, row stride SH = 1 or 2: per-block partial sums of every tap, a thread per
//       column strip of output rows with its input window and the KR·KS sums in registers (one dy load and
//       SH·KS input loads per output); then depthwise_wgrad_reduce.
//   depthwise_wgrad_partial<T, Index>(x, dy, partial, ...) and depthwise_wgrad_reduce<T>(partial, dw, ...)
//       blockIdx.x = output channel k, blockIdx.y = one chunk of the flattened (n, p, q) space. Each thread
//       accumulates all R·S taps in its own shared-memory column, the block reduces each tap in a fixed
//       tree, and a second kernel sums the chunks in order: deterministic, no atomics.
// Layouts: x (N, C, H, W), w (K, 1, R, S), out/dy (N, K, P, Q), all contiguous; 64-bit plane offsets; the
// depthwise_nhwc_* kernels at the end of the file take channels-last activations (N, H, W, C).
#include "common.cuh"
#include "mma.cuh"

using cuconv::i64;

// What a launch of the 64-bit-indexed kernels (depthwise_fwd, _strips, _rows, _plane, depthwise_dgrad,
// depthwise_wgrad_partial) takes besides the cuconv::ConvGeometry (C = groups, K = C·mult): each kernel reads
// its own fields, the others are zero (DW_WORK_DTYPE in cuconv/families/depthwise.py has this layout).
// mult: K / C (every kernel; computed on the host: a 64-bit division costs registers); total: work items;
// tiles_q: output tiles along q; rows, strips: output rows per strip and strips per plane; items: strips' work
// items; slots, segs, seg_lanes: the rows kernel's warp slots, row segments and lanes per
// segment; lead, pitch, stages: the plane kernel's buffer layout; chunk: work items per block.
struct DwWork {
    long long mult, total, tiles_q, rows, strips, items, slots, segs, seg_lanes, lead, pitch, stages, chunk, flip;
};
static_assert(sizeof(DwWork) == 112, "DW_WORK_DTYPE in cuconv/families/depthwise.py has this layout");

// Tap i = r·S + s of filter k's R·S taps: as stored, or with `flip` (dgrad at stride 1 as the forward
// convolution of dy: the kernel flipped in both axes, w'[k][r][s] = w[k][R-1-r][S-1-s], the flattened taps
// reversed) read from the stored weight in place, no flipped copy.
__device__ __forceinline__ i64 tap_index(i64 k, int taps, int i, bool flip) {
    return k * taps + (flip ? taps - 1 - i : i);
}

// Forward tile: kRowsPerThread × 8 rows and kColsPerThread × 32 columns of one output plane; a block of
// 32 × 8 threads, each computing kRowsPerThread × kColsPerThread outputs held in registers.
constexpr int kRowsPerThread = 4;
constexpr int kColsPerThread = 2;
constexpr int kTileP = 8 * kRowsPerThread;
constexpr int kTileQ = 32 * kColsPerThread;
constexpr int kLoads = 12;  // input-tile elements each thread loads per batch (34 x 66 = 2244 < 12 x 256)

// KR, KS > 0: the kernel size is known at compile time (tap loops unrolled); 0: read R, S at run time.
// kUnit: stride and dilation are 1, so with KR, KS the tile's shape and every shared-memory offset are
// compile-time constants (ncu showed the general kernel issue-bound on index arithmetic, DRAM at 25%).
template <typename T, int KR, int KS, bool kUnit>
__global__ void __launch_bounds__(256)
depthwise_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ out,
              const cuconv::ConvGeometry geo, const DwWork work) {
    const i64 C = geo.c, H = geo.h, W = geo.w, K = geo.k, R_rt = geo.r, S_rt = geo.s, P = geo.p, Q = geo.q;
    const i64 mult = work.mult, stride_h = geo.stride_h, stride_w = geo.stride_w, pad_top = geo.pad_top;
    const i64 pad_left = geo.pad_left, dil_h = geo.dil_h, dil_w = geo.dil_w, tiles_q = work.tiles_q;
    typedef typename cuconv::Acc<T>::type Acc;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int R = KR > 0 ? KR : static_cast<int>(R_rt);
    const int S = KS > 0 ? KS : static_cast<int>(S_rt);
    const int taps = R * S;
    Acc* w_s = reinterpret_cast<Acc*>(smem_raw);
    T* tile = reinterpret_cast<T*>(smem_raw + ((taps * sizeof(Acc) + 15) / 16) * 16);

    // 32-bit decode: a 64-bit division is a ~100-instruction routine that every thread would run.
    const int plane = blockIdx.x;  // n * K + k (grid.x < 2^31)
    const int k = plane % static_cast<int>(K);
    const int n = plane / static_cast<int>(K);
    const T* __restrict__ x_plane = x + (static_cast<i64>(n) * C + k / static_cast<int>(mult)) * H * W;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 32 + tx;
    const int p0 = static_cast<int>(blockIdx.y) / static_cast<int>(tiles_q) * kTileP;
    const int q0 = static_cast<int>(blockIdx.y) % static_cast<int>(tiles_q) * kTileQ;
    const int sh = kUnit ? 1 : static_cast<int>(stride_h), sw = kUnit ? 1 : static_cast<int>(stride_w);
    const int dh = kUnit ? 1 : static_cast<int>(dil_h), dw = kUnit ? 1 : static_cast<int>(dil_w);
    const int Hi = static_cast<int>(H), Wi = static_cast<int>(W);
    const int tile_h = (kTileP - 1) * sh + (R - 1) * dh + 1;
    const int tile_w = (kTileQ - 1) * sw + (S - 1) * dw + 1;
    const int ih0 = p0 * sh - static_cast<int>(pad_top);
    const int iw0 = q0 * sw - static_cast<int>(pad_left);

    for (int i = tid; i < taps; i += 256) w_s[i] = cuconv::to_acc(w[tap_index(k, taps, i, work.flip != 0)]);
    // Stage the input the tile's outputs inside the plane read (need_h x need_w of the tile_h x tile_w
    // window, rows tile_w apart; strided tiles on small planes, e.g. 7x7 outputs at stride 2, would otherwise
    // stage a window 30x what they read): kLoads elements per thread per batch, all loads in flight before any
    // store (one batch covers the whole tile of a 3x3 stride-1 kernel). The sums of outputs past the plane
    // read unstaged shared memory and are not stored.
    const int rows_out = min(kTileP, static_cast<int>(P) - p0), cols_out = min(kTileQ, static_cast<int>(Q) - q0);
    const int need_h = kUnit ? tile_h : min(tile_h, (rows_out - 1) * sh + (R - 1) * dh + 1);
    const int need_w = kUnit ? tile_w : min(tile_w, (cols_out - 1) * sw + (S - 1) * dw + 1);
    const int need_size = need_h * need_w;
    const int step_r = 256 / need_w, step_c = 256 - step_r * need_w;  // (row, col) advance of 256 elements
    for (int base = 0; base < need_size; base += kLoads * 256) {
        T v[kLoads];
        int at[kLoads];
        int r = (base + tid) / need_w, c = (base + tid) - r * need_w;
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
            const int ih = ih0 + r, iw = iw0 + c;
            const bool inside = r < need_h && ih >= 0 && ih < Hi && iw >= 0 && iw < Wi;
            v[j] = inside ? x_plane[static_cast<i64>(ih) * W + iw] : cuconv::zero<T>();
            at[j] = r * tile_w + c;
            r += step_r;
            c += step_c;
            if (c >= need_w) { c -= need_w; ++r; }
        }
#pragma unroll
        for (int j = 0; j < kLoads; ++j)
            if (base + j * 256 + tid < need_size) tile[at[j]] = v[j];
    }
    __syncthreads();

    const Acc b = bias != nullptr ? cuconv::to_acc(bias[k]) : Acc(0);
    Acc acc[kRowsPerThread][kColsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) acc[i][j] = b;
#pragma unroll
    for (int r = 0; r < (KR > 0 ? KR : 1); ++r) {
        for (int rr = (KR > 0 ? r : 0); rr < (KR > 0 ? r + 1 : R); ++rr) {
#pragma unroll
            for (int s = 0; s < (KS > 0 ? KS : 1); ++s) {
                for (int ss = (KS > 0 ? s : 0); ss < (KS > 0 ? s + 1 : S); ++ss) {
                    const Acc wv = w_s[rr * S + ss];
                    const T* __restrict__ src = tile + (ty * sh + rr * dh) * tile_w + tx * sw + ss * dw;
#pragma unroll
                    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
                        for (int j = 0; j < kColsPerThread; ++j)
                            acc[i][j] += wv * cuconv::to_acc(src[(8 * i * sh) * tile_w + 32 * j * sw]);
                }
            }
        }
    }
    T* __restrict__ out_plane = out + static_cast<i64>(plane) * P * Q;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
        const int p = p0 + ty + 8 * i;
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) {
            const int q = q0 + tx + 32 * j;
            if (p < P && q < Q) out_plane[static_cast<i64>(p) * Q + q] = cuconv::from_acc<T>(acc[i][j]);
        }
    }
}

// The column-strip kernels (strips, plane, rows) share these two steps.
// wr = the KR x KS taps of output channel k in the arithmetic type (flipped: see tap_index); returns its bias
// (0 without one).
template <typename T, typename Acc, int KR, int KS>
__device__ __forceinline__ Acc load_taps(Acc (&wr)[KR][KS], const T* __restrict__ w, const T* __restrict__ bias,
                                         i64 k, bool flip) {
#pragma unroll
    for (int r = 0; r < KR; ++r) {
#pragma unroll
        for (int s = 0; s < KS; ++s) wr[r][s] = cuconv::to_acc(w[tap_index(k, KR * KS, r * KS + s, flip)]);
    }
    return bias != nullptr ? cuconv::to_acc(bias[k]) : Acc(0);
}

// One step down a strip: win[r] = win[r + 1] (renamed away by the caller's unrolling), win[KR - 1] =
// new_row, and the output b + sum of wr * win.
template <typename Acc, int KR, int KS>
__device__ __forceinline__ Acc strip_step(Acc (&win)[KR][KS], const Acc (&new_row)[KS], const Acc (&wr)[KR][KS],
                                          Acc b) {
#pragma unroll
    for (int r = 0; r + 1 < KR; ++r) {
#pragma unroll
        for (int s = 0; s < KS; ++s) win[r][s] = win[r + 1][s];
    }
#pragma unroll
    for (int s = 0; s < KS; ++s) win[KR - 1][s] = new_row[s];
    Acc acc = b;
#pragma unroll
    for (int r = 0; r < KR; ++r) {
#pragma unroll
        for (int s = 0; s < KS; ++s) acc = fma(wr[r][s], win[r][s], acc);
    }
    return acc;
}

// dst[s] = x_plane[ih][iw0 + s], zero outside the plane (col_ok[s]: column iw0 + s is inside).
template <int KS, typename T, typename Acc>
__device__ __forceinline__ void strip_row(Acc (&dst)[KS], const T* __restrict__ x_plane, int ih, int H, i64 W,
                                          int iw0, const bool (&col_ok)[KS]) {
    const bool row_ok = static_cast<unsigned>(ih) < static_cast<unsigned>(H);
    const T* __restrict__ src = x_plane + static_cast<i64>(row_ok ? ih : 0) * W + iw0;
#pragma unroll
    for (int s = 0; s < KS; ++s) dst[s] = row_ok && col_ok[s] ? cuconv::to_acc(src[s]) : Acc(0);
}

// Forward, stride = dilation = 1, compile-time KR × KS: a column strip of output rows per thread (see top).
template <typename T, int KR, int KS, bool kFlat>
__global__ void __launch_bounds__(256)
depthwise_fwd_strips(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                     T* __restrict__ out, const cuconv::ConvGeometry geo, const DwWork work) {
    const i64 C = geo.c, H = geo.h, W = geo.w, K = geo.k, P = geo.p, Q = geo.q, mult = work.mult;
    const i64 pad_top = geo.pad_top, pad_left = geo.pad_left, rows_per_strip = work.rows, strips = work.strips;
    const i64 items = work.items;
    typedef typename cuconv::Acc<T>::type Acc;
    const int Qi = static_cast<int>(Q), Hi = static_cast<int>(H), Wi = static_cast<int>(W);
    int q, strip, plane;  // plane = n * K + k
    if (kFlat) {
        const int idx = static_cast<int>(blockIdx.x) * 256 + static_cast<int>(threadIdx.x);  // items < 2^31
        if (idx >= static_cast<int>(items)) return;
        q = idx % Qi;
        const int t = idx / Qi;
        strip = t % static_cast<int>(strips);
        plane = t / static_cast<int>(strips);
    } else {
        const int idx = static_cast<int>(blockIdx.y) * 256 + static_cast<int>(threadIdx.x);
        q = idx % Qi;
        strip = idx / Qi;
        if (strip >= static_cast<int>(strips)) return;
        plane = blockIdx.x;  // grid.x < 2^31
    }
    const int k = plane % static_cast<int>(K);
    const int n = plane / static_cast<int>(K);
    const T* __restrict__ x_plane = x + (static_cast<i64>(n) * C + k / static_cast<int>(mult)) * H * W;
    T* __restrict__ out_col = out + static_cast<i64>(plane) * P * Q + q;

    Acc wr[KR][KS];
    const Acc b = load_taps(wr, w, bias, k, work.flip != 0);
    const int iw0 = q - static_cast<int>(pad_left);
    bool col_ok[KS];
#pragma unroll
    for (int s = 0; s < KS; ++s) col_ok[s] = static_cast<unsigned>(iw0 + s) < static_cast<unsigned>(Wi);

    // win[r][s] = x[ih0 + r][iw0 + s] for the current output row p (ih0 = p - pad_top); zeros outside.
    Acc win[KR][KS];
    const int p0 = strip * static_cast<int>(rows_per_strip);
    const int p1 = min(p0 + static_cast<int>(rows_per_strip), static_cast<int>(P));
    const int ih0 = p0 - static_cast<int>(pad_top);
#pragma unroll
    for (int r = 0; r + 1 < KR; ++r) strip_row<KS>(win[r + 1], x_plane, ih0 + r, Hi, W, iw0, col_ok);
#pragma unroll 8  // loads of several rows in flight; measured: 4 and 8 best, 8 by 12% on fp16
    for (int p = p0; p < p1; ++p) {
        Acc row[KS];
        strip_row<KS>(row, x_plane, p - static_cast<int>(pad_top) + KR - 1, Hi, W, iw0, col_ok);
        out_col[static_cast<i64>(p) * Q] = cuconv::from_acc<T>(strip_step(win, row, wr, b));
    }
}

// depthwise_fwd_rows: registers allow two blocks per SM for 3×3 summing in float (~110 registers in the
// half types, whose window is converted once), else one (5×5: 150-200). A third block at 80 registers spills
// in the half types and is slower (docs/perf-notes.md).
template <typename T, int KR>
__host__ __device__ constexpr int rows_min_blocks() {
    return KR <= 3 && sizeof(typename cuconv::Acc<T>::type) == 4 ? 2 : 1;
}

// A row vector of depthwise_fwd_rows as 32-bit words: kBytes = 16 or 8.
template <int kBytes> struct RowsRaw;
template <> struct RowsRaw<16> {
    typedef uint4 type;
    static __device__ __forceinline__ uint4 zero() { return make_uint4(0u, 0u, 0u, 0u); }
};
template <> struct RowsRaw<8> {
    typedef uint2 type;
    static __device__ __forceinline__ uint2 zero() { return make_uint2(0u, 0u); }
};

// Its output vector: V elements of T stored with one kBytes store.
template <typename T, int kBytes> struct alignas(kBytes) RowsOut {
    T v[kBytes / sizeof(T)];
};

// Word i of a row vector held as 32-bit words; i is a compile-time constant once the caller's loops are
// unrolled.
__device__ __forceinline__ unsigned word_of(const uint4& u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}
__device__ __forceinline__ unsigned word_of(const uint2& u, int i) {
    return i == 0 ? u.x : u.y;
}
__device__ __forceinline__ unsigned word_of(unsigned u, int) { return u; }

// Element e of a row vector of T held as words, in the arithmetic type. Rows travel as words so that loads,
// zero fills and window moves are whole 32-bit registers: as a vector of halves the compiler moved every
// 16-bit element separately (~60 PRMT per step of 3 rows, a sixth of the loop's instructions).
template <typename T> struct ElemOf;
template <> struct ElemOf<float> {
    template <typename Raw> static __device__ __forceinline__ float get(const Raw& u, int e) {
        return __uint_as_float(word_of(u, e));
    }
};
template <> struct ElemOf<double> {
    template <typename Raw> static __device__ __forceinline__ double get(const Raw& u, int e) {
        return __hiloint2double(static_cast<int>(word_of(u, 2 * e + 1)), static_cast<int>(word_of(u, 2 * e)));
    }
};
template <> struct ElemOf<__half> {
    template <typename Raw> static __device__ __forceinline__ float get(const Raw& u, int e) {
        const unsigned w = word_of(u, e / 2);
        const __half2 h = *reinterpret_cast<const __half2*>(&w);
        return e % 2 ? __high2float(h) : __low2float(h);
    }
};
template <> struct ElemOf<__nv_bfloat16> {
    template <typename Raw> static __device__ __forceinline__ float get(const Raw& u, int e) {
        const unsigned w = word_of(u, e / 2);  // a bfloat16 is the high half of its float
        return __uint_as_float(e % 2 ? w & 0xffff0000u : w << 16);
    }
};
template <typename T, typename Raw>
__device__ __forceinline__ typename cuconv::Acc<T>::type elem_of(const Raw& u, int e) {
    return ElemOf<T>::get(u, e);
}

// One input row of a depthwise_fwd_rows window: the thread's V columns c0 .. c0 + V - 1 as stored and the
// halo in the arithmetic type, (KS - 1) / 2 columns each side.
template <typename T, int KS, int kBytes>
struct RowsWindowRow {
    typedef typename cuconv::Acc<T>::type Acc;
    typedef typename RowsRaw<kBytes>::type Raw;
    static constexpr int V = kBytes / static_cast<int>(sizeof(T)), PL = (KS - 1) / 2, PR = KS - 1 - PL;
    Raw mid;
    Acc halo[KS - 1];  // columns c0 - PL .. c0 - 1, then c0 + V .. c0 + V + PR - 1

    // Window column col (0 .. V + KS - 2), i.e. image column c0 - PL + col; col is a compile-time constant
    // once the caller's loops are unrolled.
    __device__ __forceinline__ Acc at(int col) const {
        return col < PL ? halo[col] : col < PL + V ? elem_of<T>(mid, col - PL) : halo[col - V];
    }

    // mid = raw (already zero outside the image); the halo from the neighbouring lanes' vectors by shuffles,
    // except at the edges of a segment: there from `row` (the image row at column c0) where the segment
    // ends inside the image (edge_load_*: ok and the row is an image row), zero in the padding. Every
    // lane of the warp must call this: the shuffles are warp-wide.
    __device__ __forceinline__ void fill(const Raw& raw, const T* __restrict__ row, bool left_edge,
                                         bool right_edge, bool edge_load_left, bool edge_load_right) {
        mid = raw;
#pragma unroll
        for (int j = 0; j < PL; ++j) {  // column c0 - PL + j: the left lane's (c0 - V) + V - PL + j
            const Acc v = __shfl_up_sync(0xffffffffu, elem_of<T>(mid, V - PL + j), 1);
            Acc e = Acc(0);
            if (edge_load_left) e = cuconv::to_acc(row[j - PL]);
            halo[j] = left_edge ? e : v;
        }
#pragma unroll
        for (int j = 0; j < PR; ++j) {  // column c0 + V + j: the right lane's (c0 + V) + j
            const Acc v = __shfl_down_sync(0xffffffffu, elem_of<T>(mid, j), 1);
            Acc e = Acc(0);
            if (edge_load_right) e = cuconv::to_acc(row[V + j]);
            halo[PL + j] = right_edge ? e : v;
        }
    }
};

// Forward, stride = dilation = 1, KR × KS with KS odd and its centred padding left and right (so Q == W),
// rows of a multiple of kBytes: kBytes vectors per thread (see top). kSegmented: rows of more than 32
// vectors, cut into segments whose edge lanes read their halo from memory (the instance without it has
// no such loads: fewer instructions per row).
template <typename T, int KR, int KS, bool kSegmented, int kBytes>
__global__ void __launch_bounds__(256, rows_min_blocks<T, KR>())
depthwise_fwd_rows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                   T* __restrict__ out, const cuconv::ConvGeometry geo, const DwWork work) {
    const i64 C = geo.c, H = geo.h, W = geo.w, K = geo.k, P = geo.p, mult = work.mult, pad_top = geo.pad_top;
    const i64 slots = work.slots, strips = work.strips, segs = work.segs, seg_lanes = work.seg_lanes;
    const i64 rows_per_strip = work.rows;
    typedef typename cuconv::Acc<T>::type Acc;
    typedef typename RowsRaw<kBytes>::type Raw;
    typedef RowsOut<T, kBytes> Vec;
    constexpr int V = kBytes / static_cast<int>(sizeof(T));
    static_assert(KS % 2 == 1 && (KS - 1) / 2 <= V, "the halo must come from one neighbouring vector");

    const int lane = threadIdx.x & 31;
    const int Ls = static_cast<int>(seg_lanes), per_warp = 32 / Ls;
    const int sub = lane / Ls, li = lane - sub * Ls;
    const int G = static_cast<int>(W) / V, Hi = static_cast<int>(H), Pi = static_cast<int>(P);
    const int Ki = static_cast<int>(K), m = static_cast<int>(mult), pt = static_cast<int>(pad_top);
    const int rps = static_cast<int>(rows_per_strip), n_strips = static_cast<int>(strips);
    const int n_segs = static_cast<int>(segs), n_slots = static_cast<int>(slots);  // < 2^31: the launcher's check
    const int warps = gridDim.x * (256 / 32);

    // A persistent grid: warp i serves the slot groups i, i + warps, ... (a warp-uniform loop: the shuffles
    // need every lane).
    for (int base = (blockIdx.x * 256 + static_cast<int>(threadIdx.x)) / 32 * per_warp; base < n_slots;
         base += warps * per_warp) {
        const int slot = base + sub;
        const bool live = sub < per_warp && slot < n_slots;
        int rest = live ? slot : 0;
        const int seg = rest % n_segs;
        rest /= n_segs;
        const int strip = rest % n_strips;
        const int plane = rest / n_strips;  // n * K + k
        const int g = seg * Ls + li, c0 = g * V;
        const int k = plane % Ki, n = plane / Ki;
        Acc wr[KR][KS];
        const Acc b = load_taps(wr, w, bias, static_cast<i64>(k), work.flip != 0);

        // Output rows p0 .. p1 - 1; input row j of the window (image row p0 - pt + j) is read iff
        // j_lo <= j < j_hi (inside the image, and needed by a row of this strip; none for an idle lane).
        const int p0 = strip * rps, p1 = min(p0 + rps, Pi);
        const int j_lo = max(0, pt - p0);
        const int j_hi = live && g < G ? max(j_lo, min(p1 - p0 + KR - 1, Hi + pt - p0)) : j_lo;
        auto in_rows = [&](int j) { return static_cast<unsigned>(j - j_lo) < static_cast<unsigned>(j_hi - j_lo); };
        const bool left_edge = li == 0, right_edge = li == Ls - 1 || g >= G - 1;
        const bool load_left = kSegmented && left_edge && g > 0;  // a segment's end inside the image
        const bool load_right = kSegmented && right_edge && g < G - 1;
        // Row j of the window at src + j * W (an address outside the plane is never dereferenced); pointers
        // advance row by row (a 64-bit multiply per row was a third of the loop's instructions).
        const T* __restrict__ src = x + (static_cast<i64>(n) * C + k / m) * H * W + static_cast<i64>(p0 - pt) * W + c0;
        T* __restrict__ dst = out + static_cast<i64>(plane) * P * W + static_cast<i64>(p0) * W + c0;
        const int n_store = live && g < G ? p1 - p0 : 0;  // output rows this lane writes
        auto load_row = [&](const T* row, bool ok, Raw& raw) {  // a predicated load over zeros
            raw = RowsRaw<kBytes>::zero();
            if (ok) raw = *reinterpret_cast<const Raw*>(row);
        };

        // The window row j lives in win[j % KR]: stepping KR output rows at a time, every index below is a
        // compile-time constant (no register moves down the window), and the KR loads of a step are in
        // flight together, the next step's rows prefetched into L2 behind them.
        RowsWindowRow<T, KS, kBytes> win[KR];
#pragma unroll
        for (int j = 0; j + 1 < KR; ++j, src += W) {
            Raw raw;
            const bool ok = in_rows(j);
            load_row(src, ok, raw);
            win[j].fill(raw, src, left_edge, right_edge, ok && load_left, ok && load_right);
        }
        // Output rows i .. i + KR - 1 per step (rps is a multiple of KR); src at window row i + KR - 1.
        // When a step's KR rows are loaded: 16-bit types (unsegmented rows) load the next step's rows while
        // this one is convolved (registers double-buffered); the others load a step's rows as it starts and
        // prefetch the next step's into L2. Loading early pays in the 16-bit types; in float the extra
        // registers halve its resident blocks, whose loads were in flight side by side already, and segmented
        // 16-bit rows lose too (measurements: docs/perf-notes.md).
        constexpr bool kEarly = sizeof(T) == 2 && !kSegmented;
        Raw next[KR];
        bool next_ok[KR];
        auto load_step = [&](const T* row, int i0) {  // window rows i0 + KR - 1 .. i0 + 2 KR - 2 from `row`
#pragma unroll
            for (int u = 0; u < KR; ++u, row += W) {
                next_ok[u] = in_rows(i0 + u + KR - 1);
                load_row(row, next_ok[u], next[u]);
            }
        };
        if (kEarly) load_step(src, 0);
        for (int i = 0; i < rps; i += KR) {
            if (!kEarly) load_step(src, i);
            Raw raw[KR];
            bool ok[KR];
#pragma unroll
            for (int u = 0; u < KR; ++u) raw[u] = next[u], ok[u] = next_ok[u];
            if (kEarly) {
                load_step(src + KR * W, i + KR);
            } else {
                const T* __restrict__ row = src + KR * W;
#pragma unroll
                for (int u = 0; u < KR; ++u, row += W) {  // predicated, not branched around
                    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %1, 0;\n @p prefetch.global.L2 [%0];\n}\n"
                                 ::"l"(row), "r"(static_cast<int>(in_rows(i + KR + u + KR - 1))));
                }
            }
#pragma unroll
            for (int u = 0; u < KR; ++u, src += W, dst += W) {
                win[(u + KR - 1) % KR].fill(raw[u], src, left_edge, right_edge, ok[u] && load_left,
                                            ok[u] && load_right);
                Vec o;
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    Acc acc = b;
#pragma unroll
                    for (int r = 0; r < KR; ++r) {
#pragma unroll
                        for (int s = 0; s < KS; ++s) acc = fma(wr[r][s], win[(u + r) % KR].at(e + s), acc);
                    }
                    o.v[e] = cuconv::from_acc<T>(acc);
                }
                if (i + u < n_store) *reinterpret_cast<Vec*>(dst) = o;
            }
        }
    }
}

// Blocks per SM its registers must allow: 4 for 3×3 kernels summing in float (54 registers), else 2
// (5×5 in float: 96; 3×3 in double: 72).
template <typename T, int KR>
__host__ __device__ constexpr int plane_min_blocks() {
    return KR <= 3 && sizeof(typename cuconv::Acc<T>::type) == 4 ? 4 : 2;
}

// Forward, stride = dilation = 1, compile-time KR × KS, whole input planes in shared memory (see top).
template <typename T, int KR, int KS>
__global__ void __launch_bounds__(256, plane_min_blocks<T, KR>())
depthwise_fwd_plane(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                    T* __restrict__ out, const cuconv::ConvGeometry geo, const DwWork work) {
    const i64 N = geo.n, C = geo.c, H = geo.h, W = geo.w, K = geo.k, P = geo.p, Q = geo.q, mult = work.mult;
    const i64 pad_top = geo.pad_top, pad_left = geo.pad_left, rows_per_strip = work.rows, strips = work.strips;
    const i64 lead = work.lead, pitch = work.pitch, stages = work.stages;
    typedef typename cuconv::Acc<T>::type Acc;
    constexpr int V = cuconv::VecWidth<T>::value;  // elements of a 16-byte copy
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* __restrict__ bufs = reinterpret_cast<T*>(smem_raw);  // `stages` buffers of rows * pitch elements

    const int Hi = static_cast<int>(H), Wi = static_cast<int>(W), Pi = static_cast<int>(P), Qi = static_cast<int>(Q);
    const int pt = static_cast<int>(pad_top), pl = static_cast<int>(pad_left);
    const int ld = static_cast<int>(lead), pch = static_cast<int>(pitch);
    const int rows = Pi + KR - 1;  // window rows: image rows -pt .. P + KR - 2 - pt
    const int buf_elems = rows * pch, n_stages = static_cast<int>(stages);
    const int tid = threadIdx.x;
    const i64 planes = N * C, grid = gridDim.x;

    // The halo (rows above and below the image, columns left and right of it) is the same in every buffer
    // and no copy ever writes it: zero it once.
    for (int b = 0; b < n_stages; ++b) {
        T* win = bufs + b * buf_elems;
        for (int i = tid; i < pt * pch; i += 256) win[i] = cuconv::zero<T>();
        for (int i = (pt + Hi) * pch + tid; i < buf_elems; i += 256) win[i] = cuconv::zero<T>();
        const int side = pch - Wi;  // per image row: columns [0, lead) and [lead + W, pitch)
        for (int i = tid; i < Hi * side; i += 256) {
            const int r = i / side, col = i - r * side;
            win[(r + pt) * pch + (col < ld ? col : col + Wi)] = cuconv::zero<T>();
        }
    }
    // Requests input plane `plane` (if it exists) into buffer b, in 16-byte copies (the launcher's
    // condition: 16-byte aligned rows; elsewhere the strips kernel, as fast without them, runs instead).
    auto stage = [&](i64 plane, int b) {
        if (plane >= planes) return;
        T* win = bufs + b * buf_elems + pt * pch + ld;  // image (0, 0)
        const T* __restrict__ x_plane = x + plane * H * W;
        const int per_row = Wi / V;
        for (int i = tid; i < Hi * per_row; i += 256) {
            const int r = i / per_row, v = i - r * per_row;
            cuconv::cp_async_cg16(cuconv::smem_addr(win + r * pch + v * V), x_plane + r * Wi + v * V, true);
        }
    };

    // Pipeline over this block's planes blockIdx.x, + gridDim.x, ...: plane it + stages - 1 is requested
    // while plane it is convolved (one commit group per plane, empty past the last).
    for (int b = 0; b + 1 < n_stages; ++b) {
        stage(blockIdx.x + b * grid, b);
        cuconv::cp_async_commit();
    }
    const int m = static_cast<int>(mult);
    const int rps = static_cast<int>(rows_per_strip), n_strips = static_cast<int>(strips);
    // (n, c) of a plane: in 32 bits where the planes allow (a 64-bit division is a ~100-instruction routine)
    const bool narrow = planes <= 0x7fffffff;
    int it = 0;
    for (i64 plane = blockIdx.x; plane < planes; plane += grid, ++it) {
        stage(plane + (n_stages - 1) * grid, (it + n_stages - 1) % n_stages);  // the buffer of plane it - 1
        cuconv::cp_async_commit();
        if (n_stages >= 4)
            cuconv::cp_async_wait<3>();
        else if (n_stages == 3)
            cuconv::cp_async_wait<2>();
        else
            cuconv::cp_async_wait<1>();
        __syncthreads();  // plane it has landed for every thread (and the halo is zero)

        // Each thread slot owns output column q and a strip of rows_per_strip rows, walking down it with
        // the KR window rows it reads in registers (KS columns each): per output row, KS conflict-free
        // shared-memory loads (neighbouring lanes, neighbouring columns), KR·KS FMAs, one coalesced store.
        const T* __restrict__ win = bufs + (it % n_stages) * buf_elems + ld - pl;  // window (0, 0)
        const int c = narrow ? static_cast<int>(static_cast<unsigned>(plane) % static_cast<unsigned>(C))
                             : static_cast<int>(plane % C);
        const i64 n = narrow ? static_cast<i64>(static_cast<unsigned>(plane) / static_cast<unsigned>(C)) : plane / C;

        for (int j = 0; j < m; ++j) {
            const int k = c * m + j;
            Acc wr[KR][KS];
            const Acc b = load_taps(wr, w, bias, static_cast<i64>(k), work.flip != 0);
            T* __restrict__ out_plane = out + (n * K + k) * P * Q;
            for (int idx = tid; idx < n_strips * Qi; idx += 256) {
                const int strip = idx / Qi, q = idx - strip * Qi;
                const int p0 = strip * rps, p1 = min(p0 + rps, Pi);
                const T* __restrict__ src = win + p0 * pch + q;
                Acc xw[KR][KS];
#pragma unroll
                for (int r = 0; r + 1 < KR; ++r) {
#pragma unroll
                    for (int s = 0; s < KS; ++s) xw[r + 1][s] = cuconv::to_acc(src[r * pch + s]);
                }
                src += (KR - 1) * pch;
#pragma unroll 4
                for (int p = p0; p < p1; ++p, src += pch) {
                    Acc row[KS];
#pragma unroll
                    for (int s = 0; s < KS; ++s) row[s] = cuconv::to_acc(src[s]);
                    out_plane[static_cast<i64>(p) * Q + q] = cuconv::from_acc<T>(strip_step(xw, row, wr, b));
                }
            }
        }
        __syncthreads();  // every thread is done with this buffer before it is staged into again
    }
    cuconv::cp_async_wait<0>();  // only empty groups remain; nothing in flight at exit
}

// Geometry of the gather kernels, passed by value (DW_GEOMETRY_DTYPE in cuconv/families/depthwise.py has this
// layout). `total` counts the threads' work items (outputs, or 2x2 quads of dx); the launcher keeps it below
// 2^31 so every decode is 32-bit.
// wgrad's strips: `rows` output rows per strip, `strips` per plane, `chunk` work items per block.
struct DwGeometry {
    int n, c, h, w, k, p, q, mult, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, total, rows, strips, chunk,
        flip;
};
static_assert(sizeof(DwGeometry) == 76, "DW_GEOMETRY_DTYPE in cuconv/families/depthwise.py has this layout");

// One thread per output (n, k, p, q), flat over the batch's planes, so that small planes (7x7, 14x14) and
// strided layers keep every thread busy; the KR x KS window comes through L1, where the neighbouring outputs'
// windows overlap it.
template <typename T, int KR, int KS>
__global__ void __launch_bounds__(256)
depthwise_fwd_gather(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                     T* __restrict__ out, DwGeometry g) {
    typedef typename cuconv::Acc<T>::type Acc;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < g.total; idx += gridDim.x * blockDim.x) {
        const int q = idx % g.q;
        const int t = idx / g.q;
        const int p = t % g.p;
        const int plane = t / g.p;  // n * K + k
        const int k = plane % g.k, n = plane / g.k;
        const T* __restrict__ x_plane = x + (static_cast<i64>(n) * g.c + k / g.mult) * g.h * g.w;
        const T* __restrict__ w_k = w + static_cast<i64>(k) * (KR * KS);
        const int ih0 = p * g.stride_h - g.pad_top, iw0 = q * g.stride_w - g.pad_left;
        Acc acc = bias != nullptr ? cuconv::to_acc(bias[k]) : Acc(0);
#pragma unroll
        for (int r = 0; r < KR; ++r) {
            const int ih = ih0 + r * g.dil_h;
            if (static_cast<unsigned>(ih) >= static_cast<unsigned>(g.h)) continue;
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                const int iw = iw0 + s * g.dil_w;
                if (static_cast<unsigned>(iw) < static_cast<unsigned>(g.w))
                    acc = fma(cuconv::to_acc(w_k[g.flip ? KR * KS - 1 - (r * KS + s) : r * KS + s]),
                              cuconv::to_acc(x_plane[ih * g.w + iw]), acc);
            }
        }
        out[idx] = cuconv::from_acc<T>(acc);
    }
}

// The same at dilation 1 and a column stride SW of 1 or 2, two neighbouring outputs (p, 2j) and (p, 2j + 1) per
// thread: their windows share KS - SW columns, so a window row is KS + SW loads for two outputs, not 2·KS.
template <typename T, int KR, int KS, int SW>
__global__ void __launch_bounds__(256)
depthwise_fwd_gather2(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                      T* __restrict__ out, DwGeometry g) {
    typedef typename cuconv::Acc<T>::type Acc;
    constexpr int kCols = KS + SW;  // window columns iw0 .. iw0 + SW + KS - 1
    const int pairs = (g.q + 1) / 2;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < g.total; idx += gridDim.x * blockDim.x) {
        const int j = idx % pairs;
        const int t = idx / pairs;
        const int p = t % g.p;
        const int plane = t / g.p;  // n * K + k
        const int k = plane % g.k, n = plane / g.k;
        const T* __restrict__ x_plane = x + (static_cast<i64>(n) * g.c + k / g.mult) * g.h * g.w;
        const T* __restrict__ w_k = w + static_cast<i64>(k) * (KR * KS);
        const int q = 2 * j;
        const int ih0 = p * g.stride_h - g.pad_top, iw0 = q * SW - g.pad_left;
        bool col_ok[kCols];
#pragma unroll
        for (int c = 0; c < kCols; ++c) col_ok[c] = static_cast<unsigned>(iw0 + c) < static_cast<unsigned>(g.w);
        const Acc b = bias != nullptr ? cuconv::to_acc(bias[k]) : Acc(0);
        Acc acc0 = b, acc1 = b;
#pragma unroll
        for (int r = 0; r < KR; ++r) {
            const int ih = ih0 + r;
            if (static_cast<unsigned>(ih) >= static_cast<unsigned>(g.h)) continue;
            const T* __restrict__ row = x_plane + ih * g.w + iw0;
            Acc v[kCols];
#pragma unroll
            for (int c = 0; c < kCols; ++c) v[c] = col_ok[c] ? cuconv::to_acc(row[c]) : Acc(0);
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                const Acc wv = cuconv::to_acc(w_k[g.flip ? KR * KS - 1 - (r * KS + s) : r * KS + s]);
                acc0 = fma(wv, v[s], acc0);
                acc1 = fma(wv, v[s + SW], acc1);
            }
        }
        T* __restrict__ out_row = out + static_cast<i64>(plane) * g.p * g.q + p * g.q;
        out_row[q] = cuconv::from_acc<T>(acc0);
        if (q + 1 < g.q) out_row[q + 1] = cuconv::from_acc<T>(acc1);
    }
}

// dgrad at stride 2x2, dilation 1: one thread per 2x2 quad of dx (rows 2i, 2i+1, columns 2j, 2j+1). Output
// row h reads dy row (h + pad_top - r) / 2 through the taps r of its parity, and the parity of 2i + a + pad_top
// is the same for every quad: each tap serves exactly one of the four outputs (R·S products per quad, no
// divergence), where a thread per dx element would test every tap and use a quarter of them.
template <typename T, int KR, int KS>
__global__ void __launch_bounds__(256)
depthwise_dgrad_s2(const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, DwGeometry g) {
    typedef typename cuconv::Acc<T>::type Acc;
    const int h2 = (g.h + 1) / 2, w2 = (g.w + 1) / 2;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < g.total; idx += gridDim.x * blockDim.x) {
        const int j = idx % w2;
        const int t = idx / w2;
        const int i = t % h2;
        const int nc = t / h2;  // n * C + c
        const int c = nc % g.c, n = nc / g.c;
        Acc acc[2][2] = {{Acc(0), Acc(0)}, {Acc(0), Acc(0)}};
        for (int m = 0; m < g.mult; ++m) {
            const int k = c * g.mult + m;
            const T* __restrict__ dy_plane = dy + (static_cast<i64>(n) * g.k + k) * g.p * g.q;
            const T* __restrict__ w_k = w + static_cast<i64>(k) * (KR * KS);
#pragma unroll
            for (int a = 0; a < 2; ++a) {
#pragma unroll
                for (int r = 0; r < KR; ++r) {
                    const int hp = 2 * i + a + g.pad_top - r;
                    if ((hp & 1) != 0) continue;  // the same for every quad
                    const int p = hp >> 1;  // exact: hp is even
                    if (static_cast<unsigned>(p) >= static_cast<unsigned>(g.p)) continue;
#pragma unroll
                    for (int b = 0; b < 2; ++b) {
#pragma unroll
                        for (int s = 0; s < KS; ++s) {
                            const int wq = 2 * j + b + g.pad_left - s;
                            if ((wq & 1) != 0) continue;
                            const int q = wq >> 1;
                            if (static_cast<unsigned>(q) < static_cast<unsigned>(g.q))
                                acc[a][b] = fma(cuconv::to_acc(w_k[r * KS + s]),
                                                cuconv::to_acc(dy_plane[p * g.q + q]), acc[a][b]);
                        }
                    }
                }
            }
        }
        T* __restrict__ dx_plane = dx + static_cast<i64>(nc) * g.h * g.w;
#pragma unroll
        for (int a = 0; a < 2; ++a) {
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const int h = 2 * i + a, wc = 2 * j + b;
                if (h < g.h && wc < g.w) dx_plane[h * g.w + wc] = cuconv::from_acc<T>(acc[a][b]);
            }
        }
    }
}

// wgrad partial sums, dilation 1, row stride SH (1 or 2, at most KR): work item (n, strip, q) of channel
// k = blockIdx.x / chunks is a column strip of `rows` output rows, walked top-down with the KR x KS input window
// in registers (per row: one dy load, SH new input rows of KS loads, KR·KS FMAs into per-thread accumulators);
// block blockIdx.x % chunks takes items [chunk·b, chunk·(b+1)) over the batch. Each tap's sums are reduced by
// a fixed butterfly per warp and then over the warps in order: deterministic, no atomics; partial[(k·chunks +
// b)·taps + tap] for depthwise_wgrad_reduce.
template <typename T, int KR, int KS, int SH>
__global__ void __launch_bounds__(256)
depthwise_wgrad_strips(const T* __restrict__ x, const T* __restrict__ dy,
                       typename cuconv::Acc<T>::type* __restrict__ partial, DwGeometry g) {
    typedef typename cuconv::Acc<T>::type Acc;
    static_assert(SH >= 1 && SH <= KR, "the window slides SH rows per output row");
    __shared__ Acc warp_sums[8][KR * KS];
    const int chunks = (g.total + g.chunk - 1) / g.chunk;
    const int k = blockIdx.x / chunks, b = blockIdx.x - k * chunks;
    Acc acc[KR][KS];
#pragma unroll
    for (int r = 0; r < KR; ++r)
#pragma unroll
        for (int s = 0; s < KS; ++s) acc[r][s] = Acc(0);
    const int end = min(g.total, (b + 1) * g.chunk);
    for (int item = b * g.chunk + static_cast<int>(threadIdx.x); item < end; item += 256) {
        const int q = item % g.q;
        const int t = item / g.q;
        const int strip = t % g.strips, n = t / g.strips;
        const int p0 = strip * g.rows, p1 = min(g.p, p0 + g.rows);
        const T* __restrict__ x_plane = x + (static_cast<i64>(n) * g.c + k / g.mult) * g.h * g.w;
        const T* __restrict__ dy_plane = dy + (static_cast<i64>(n) * g.k + k) * g.p * g.q;
        const int iw0 = q * g.stride_w - g.pad_left;
        bool col_ok[KS];
#pragma unroll
        for (int s = 0; s < KS; ++s) col_ok[s] = static_cast<unsigned>(iw0 + s) < static_cast<unsigned>(g.w);
        const int ih0 = p0 * SH - g.pad_top;  // window row r of output row p is input row p·SH - pad_top + r
        Acc win[KR][KS];
#pragma unroll
        for (int r = 0; r < KR - SH; ++r) strip_row<KS>(win[r + SH], x_plane, ih0 + r, g.h, g.w, iw0, col_ok);
        for (int p = p0; p < p1; ++p) {
#pragma unroll
            for (int r = 0; r < KR - SH; ++r)
#pragma unroll
                for (int s = 0; s < KS; ++s) win[r][s] = win[r + SH][s];
#pragma unroll
            for (int r = KR - SH; r < KR; ++r)
                strip_row<KS>(win[r], x_plane, (p - p0) * SH + ih0 + r, g.h, g.w, iw0, col_ok);
            const Acc d = cuconv::to_acc(dy_plane[p * g.q + q]);
#pragma unroll
            for (int r = 0; r < KR; ++r)
#pragma unroll
                for (int s = 0; s < KS; ++s) acc[r][s] = fma(d, win[r][s], acc[r][s]);
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < KR; ++r) {
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            Acc v = acc[r][s];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane == 0) warp_sums[warp][r * KS + s] = v;
        }
    }
    __syncthreads();
    for (int tap = threadIdx.x; tap < KR * KS; tap += 256) {
        Acc sum = warp_sums[0][tap];
#pragma unroll
        for (int w8 = 1; w8 < 8; ++w8) sum += warp_sums[w8][tap];
        partial[static_cast<i64>(blockIdx.x) * (KR * KS) + tap] = sum;
    }
}

template <typename T, bool kUnitStride, typename Index>
__global__ void __launch_bounds__(256)
depthwise_dgrad(const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
                const cuconv::ConvGeometry geo, const DwWork work) {
    const i64 total = work.total, C = geo.c, H = geo.h, W = geo.w, K = geo.k, R = geo.r, S = geo.s, P = geo.p;
    const i64 Q = geo.q, mult = work.mult, stride_h = geo.stride_h, stride_w = geo.stride_w;
    const i64 pad_top = geo.pad_top, pad_left = geo.pad_left, dil_h = geo.dil_h, dil_w = geo.dil_w;
    typedef typename cuconv::Acc<T>::type Acc;
    const int sh = static_cast<int>(stride_h), sw = static_cast<int>(stride_w);
    const Index Wx = static_cast<Index>(W), Hx = static_cast<Index>(H), Cx = static_cast<Index>(C);
    for (Index idx = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; idx < static_cast<Index>(total);
         idx += static_cast<Index>(gridDim.x) * blockDim.x) {
        const int wi = static_cast<int>(idx % Wx);
        const int h = static_cast<int>((idx / Wx) % Hx);
        const Index nc = idx / (Hx * Wx);
        const i64 c = nc % Cx, n = nc / Cx;
        Acc acc = 0;
        for (i64 j = 0; j < mult; ++j) {
            const i64 k = c * mult + j;
            const T* __restrict__ dy_plane = dy + (n * K + k) * P * Q;
            const T* __restrict__ w_k = w + k * R * S;
            for (int r = 0; r < R; ++r) {
                const int hp = h + static_cast<int>(pad_top - r * dil_h);
                if (hp < 0 || (!kUnitStride && hp % sh != 0)) continue;
                const int p = kUnitStride ? hp : hp / sh;
                if (p >= P) continue;
                for (int s = 0; s < S; ++s) {
                    const int wq = wi + static_cast<int>(pad_left - s * dil_w);
                    if (wq < 0 || (!kUnitStride && wq % sw != 0)) continue;
                    const int q = kUnitStride ? wq : wq / sw;
                    if (q >= Q) continue;
                    acc += cuconv::to_acc(w_k[r * S + s]) * cuconv::to_acc(dy_plane[static_cast<i64>(p) * Q + q]);
                }
            }
        }
        dx[idx] = cuconv::from_acc<T>(acc);
    }
}

template <typename T, typename Index>
__global__ void depthwise_wgrad_partial(const T* __restrict__ x, const T* __restrict__ dy,
                                        typename cuconv::Acc<T>::type* __restrict__ partial,
                                        const cuconv::ConvGeometry geo, const DwWork work) {
    const i64 C = geo.c, H = geo.h, W = geo.w, K = geo.k, R = geo.r, S = geo.s, P = geo.p, Q = geo.q;
    const i64 mult = work.mult, stride_h = geo.stride_h, stride_w = geo.stride_w, pad_top = geo.pad_top;
    const i64 pad_left = geo.pad_left, dil_h = geo.dil_h, dil_w = geo.dil_w, total = work.total;
    const i64 chunk = work.chunk;
    typedef typename cuconv::Acc<T>::type Acc;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Acc* acc = reinterpret_cast<Acc*>(smem_raw);  // acc[tap * blockDim.x + thread]
    const int taps = static_cast<int>(R * S), Si = static_cast<int>(S);
    const int nt = blockDim.x, t = threadIdx.x;
    for (int tap = 0; tap < taps; ++tap) acc[tap * nt + t] = 0;

    const int k = blockIdx.x;
    const i64 c = k / static_cast<int>(mult);
    const Index begin = static_cast<Index>(blockIdx.y) * static_cast<Index>(chunk);
    const Index end = min(static_cast<Index>(total), begin + static_cast<Index>(chunk));
    const Index PQ = static_cast<Index>(P * Q);
    const int Qi = static_cast<int>(Q);
    for (Index idx = begin + t; idx < end; idx += nt) {  // idx over (n, p, q)
        const Index n = idx / PQ;
        const int pq = static_cast<int>(idx - n * PQ);
        const int p = pq / Qi, q = pq - (pq / Qi) * Qi;
        const Acc g = cuconv::to_acc(dy[(static_cast<i64>(n) * K + k) * (P * Q) + pq]);
        const T* __restrict__ x_plane = x + (static_cast<i64>(n) * C + c) * H * W;
        const int ih0 = p * static_cast<int>(stride_h) - static_cast<int>(pad_top);
        const int iw0 = q * static_cast<int>(stride_w) - static_cast<int>(pad_left);
        for (int r = 0; r < R; ++r) {
            const int ih = ih0 + r * static_cast<int>(dil_h);
            if (ih < 0 || ih >= H) continue;
            for (int s = 0; s < Si; ++s) {
                const int iw = iw0 + s * static_cast<int>(dil_w);
                if (iw < 0 || iw >= W) continue;
                acc[(r * Si + s) * nt + t] += g * cuconv::to_acc(x_plane[static_cast<i64>(ih) * W + iw]);
            }
        }
    }
    __syncthreads();
    for (int half = nt / 2; half > 0; half /= 2) {  // fixed tree: deterministic
        if (t < half)
            for (int tap = 0; tap < taps; ++tap) acc[tap * nt + t] += acc[tap * nt + t + half];
        __syncthreads();
    }
    for (int tap = t; tap < taps; tap += nt)
        partial[(static_cast<i64>(k) * gridDim.y + blockIdx.y) * taps + tap] = acc[tap * nt];
}

template <typename T>
__global__ void depthwise_wgrad_reduce(const typename cuconv::Acc<T>::type* __restrict__ partial,
                                       T* __restrict__ dw, i64 K, i64 taps, i64 chunks) {
    typedef typename cuconv::Acc<T>::type Acc;
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < K * taps;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        const i64 k = i / taps, tap = i % taps;
        Acc sum = 0;
        for (i64 j = 0; j < chunks; ++j) sum += partial[(k * chunks + j) * taps + tap];  // in order
        dw[i] = cuconv::from_acc<T>(sum);
    }
}

// V = 16 / sizeof(T) accumulators rounded to T once and stored as one 16-byte vector at p (the channels-last
// kernels' output: V adjacent channels of a pixel).
template <typename T, typename Acc>
__device__ __forceinline__ void store_vector(T* __restrict__ p, const Acc* acc) {
    RowsOut<T, 16> o;
#pragma unroll
    for (int e = 0; e < 16 / static_cast<int>(sizeof(T)); ++e) o.v[e] = cuconv::from_acc<T>(acc[e]);
    *reinterpret_cast<RowsOut<T, 16>*>(p) = o;
}

// ---- channels-last (NHWC) activations -------------------------------------------------------------------------
// depthwise_nhwc_weight<T>(w, wt, C, taps, flip)
//     the weight (C, 1, R, S) as (R·S, C), so that a tap's weights of V adjacent channels are one 16-byte
//     vector; with `flip` the taps reversed (the kernel flipped in both axes: dgrad at stride 1 as the forward
//     convolution of dy).
// depthwise_nhwc_fwd<T, KR, Index>(x, wt, bias, out, ConvGeometry, total)
//     multiplier 1, x (N, H, W, C) and out (N, P, Q, C) channels-last, C a multiple of V = 16 / sizeof(T),
//     x, wt and out 16-byte aligned: a thread per (output pixel, V adjacent channels), flat over the batch with
//     the channels fastest (a warp's loads of one tap are consecutive 16-byte vectors; the taps' overlap comes
//     through L1); per tap one 16-byte load of x and one of wt, V FMAs in Acc<T>; bias added; one 16-byte
//     store. KR > 0: a KR x KR kernel with its tap loops unrolled; 0: R x S read at run time. Index: int
//     where total and every tensor's element count fit 31 bits (32-bit decodes), else long long.
template <typename T>
__global__ void __launch_bounds__(256)
depthwise_nhwc_weight(const T* __restrict__ w, T* __restrict__ wt, long long c, int taps, int flip) {
    const long long total = c * taps;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long t = i / c, ch = i - t * c;  // (tap, channel) of wt
        wt[i] = w[ch * taps + (flip ? taps - 1 - t : t)];
    }
}

template <typename T, int KR, typename Index>
__global__ void __launch_bounds__(256)
depthwise_nhwc_fwd(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                   T* __restrict__ out, const cuconv::ConvGeometry g, long long total) {
    using Acc = typename cuconv::Acc<T>::type;
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const Index vectors = static_cast<Index>(g.c / V), q_count = static_cast<Index>(g.q);
    const Index p_count = static_cast<Index>(g.p), h = static_cast<Index>(g.h), w = static_cast<Index>(g.w);
    const Index c = static_cast<Index>(g.c);
    const int r_count = KR > 0 ? KR : static_cast<int>(g.r), s_count = KR > 0 ? KR : static_cast<int>(g.s);
    for (Index i = static_cast<Index>(blockIdx.x) * 256 + static_cast<Index>(threadIdx.x);
         i < static_cast<Index>(total); i += static_cast<Index>(gridDim.x) * 256) {
        const Index v = i % vectors, pix = i / vectors;
        const Index oq = pix % q_count, rest = pix / q_count, op = rest % p_count, n = rest / p_count;
        const Index c0 = v * V;
        Acc acc[V];
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = bias != nullptr ? cuconv::to_acc(bias[c0 + e]) : Acc(0);
        const Index h0 = op * static_cast<Index>(g.stride_h) - static_cast<Index>(g.pad_top);
        const Index w0 = oq * static_cast<Index>(g.stride_w) - static_cast<Index>(g.pad_left);
        const T* __restrict__ xn = x + static_cast<i64>(n) * h * w * c + c0;
#pragma unroll
        for (int r = 0; r < r_count; ++r) {
            const Index ih = h0 + r * static_cast<Index>(g.dil_h);
            if (ih < 0 || ih >= h) continue;
#pragma unroll
            for (int s = 0; s < s_count; ++s) {
                const Index iw = w0 + s * static_cast<Index>(g.dil_w);
                if (iw < 0 || iw >= w) continue;
                const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xn + (static_cast<i64>(ih) * w + iw) * c));
                const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wt + static_cast<i64>(r * s_count + s) * c + c0));
#pragma unroll
                for (int e = 0; e < V; ++e) acc[e] = fma(elem_of<T>(xv, e), elem_of<T>(wv, e), acc[e]);
            }
        }
        store_vector<T>(out + static_cast<i64>(pix) * c + c0, acc);
    }
}

// depthwise_nhwc_fwd_q<T, KR, QT, kUnit, Index>(x, wt, bias, out, ConvGeometry, total)
//     depthwise_nhwc_fwd for a KR x KR kernel with QT adjacent output pixels of a row a thread (V channels each):
//     a tap's weight vector is loaded and converted to Acc<T> once for the QT pixels; with kUnit (stride and
//     dilation 1 along the row) a kernel row's KR + QT - 1 input vectors are loaded and converted once and shared
//     by every tap that overlaps them (the one-pixel kernel converts 2·KR vectors per kernel row for KR
//     pixel-taps' FMAs). Work items: (n, p, tile of QT pixels along q, vector of channels), channels fastest;
//     pixels past Q are computed from in-bounds loads and not stored.
template <typename T, int KR, int QT, bool kUnit, typename Index>
__global__ void __launch_bounds__(256)
depthwise_nhwc_fwd_q(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                     T* __restrict__ out, const cuconv::ConvGeometry g, long long total) {
    using Acc = typename cuconv::Acc<T>::type;
    constexpr int V = 16 / static_cast<int>(sizeof(T)), kWindow = kUnit ? KR + QT - 1 : 1;
    const Index vectors = static_cast<Index>(g.c / V), q_count = static_cast<Index>(g.q);
    const Index q_tiles = (q_count + QT - 1) / QT, p_count = static_cast<Index>(g.p);
    const Index h = static_cast<Index>(g.h), w = static_cast<Index>(g.w), c = static_cast<Index>(g.c);
    const Index sw = static_cast<Index>(g.stride_w), dw = static_cast<Index>(g.dil_w);
    for (Index i = static_cast<Index>(blockIdx.x) * 256 + static_cast<Index>(threadIdx.x);
         i < static_cast<Index>(total); i += static_cast<Index>(gridDim.x) * 256) {
        const Index v = i % vectors, item = i / vectors;
        const Index qt = item % q_tiles, rest = item / q_tiles, op = rest % p_count, n = rest / p_count;
        const Index c0 = v * V, oq0 = qt * QT;
        Acc acc[QT][V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
            const Acc b = bias != nullptr ? cuconv::to_acc(bias[c0 + e]) : Acc(0);
#pragma unroll
            for (int q = 0; q < QT; ++q) acc[q][e] = b;
        }
        const Index h0 = op * static_cast<Index>(g.stride_h) - static_cast<Index>(g.pad_top);
        const Index w0 = oq0 * sw - static_cast<Index>(g.pad_left);
        const T* __restrict__ xn = x + static_cast<i64>(n) * h * w * c + c0;
#pragma unroll
        for (int r = 0; r < KR; ++r) {
            const Index ih = h0 + r * static_cast<Index>(g.dil_h);
            if (ih < 0 || ih >= h) continue;
            const T* __restrict__ xr = xn + static_cast<i64>(ih) * w * c;
            Acc xw[kWindow][V];  // (kUnit) input columns w0 .. w0 + KR + QT - 2, zero outside the row
            if constexpr (kUnit) {
#pragma unroll
                for (int j = 0; j < kWindow; ++j) {
                    const Index iw = w0 + j;
                    if (iw >= 0 && iw < w) {
                        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xr + static_cast<i64>(iw) * c));
#pragma unroll
                        for (int e = 0; e < V; ++e) xw[j][e] = elem_of<T>(xv, e);
                    } else {
#pragma unroll
                        for (int e = 0; e < V; ++e) xw[j][e] = Acc(0);
                    }
                }
            }
#pragma unroll
            for (int s = 0; s < KR; ++s) {
                const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wt + static_cast<i64>(r * KR + s) * c + c0));
                Acc wf[V];
#pragma unroll
                for (int e = 0; e < V; ++e) wf[e] = elem_of<T>(wv, e);
#pragma unroll
                for (int q = 0; q < QT; ++q) {
                    if constexpr (kUnit) {
#pragma unroll
                        for (int e = 0; e < V; ++e) acc[q][e] = fma(xw[q + s][e], wf[e], acc[q][e]);
                    } else {
                        const Index iw = w0 + q * sw + s * dw;
                        if (iw < 0 || iw >= w) continue;
                        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xr + static_cast<i64>(iw) * c));
#pragma unroll
                        for (int e = 0; e < V; ++e) acc[q][e] = fma(elem_of<T>(xv, e), wf[e], acc[q][e]);
                    }
                }
            }
        }
        T* __restrict__ o = out + (static_cast<i64>(n * p_count + op) * q_count + oq0) * c + c0;
#pragma unroll
        for (int q = 0; q < QT; ++q) {
            if (oq0 + q >= q_count) break;
            store_vector<T>(o + static_cast<i64>(q) * c, acc[q]);
        }
    }
}

// depthwise_nhwc_fwd_tile<T, KR, SR, QT>(x, wt, bias, out, ConvGeometry)
//     the 16-bit types' channels-last forward for a square KR x KR kernel at stride SR along both axes, dilation
//     1: a block per (tile of 8 output rows x 2·QT columns, 32 channels, sample) stages the tile's input window
//     of its 32 channels in shared memory once (16-byte vectors, 12 or fewer loads in flight a thread; zeros
//     outside the image and past C) and the channels' weights as fp32 pairs; a thread then takes a channel pair
//     and QT adjacent outputs of one row, and per kernel row converts the (QT - 1)·SR + KR input pairs its taps
//     read once into registers: KR·QT FMA pairs for QT + 6 shared loads (7x7, stride 1). The per-tap 16-byte
//     loads and conversions of depthwise_nhwc_fwd made it issue-bound at ~3x its FMA count. Staged rows are
//     kDwTileRowWords words apart, so that the two rows a warp's halves read fall in different banks. Sample
//     offsets within 31 bits (the Python twin checks).
constexpr int kDwTileRows = 8, kDwTileChannels = 32;
// Words between two staged rows: at least a row's hc pixels of 32 channels (16 words), 16-byte aligned, and
// sr rows ≡ 16 words (mod 32): a warp's two halves read rows sr apart, 16 consecutive words each.
__host__ __device__ constexpr int dw_tile_row_words(int hc, int sr) {
    int rp = hc * 16;
    while ((sr * rp) % 32 != 16) rp += 4;
    return rp;
}

template <typename T, int KR, int SR, int QT>
__global__ void __launch_bounds__(256)
depthwise_nhwc_fwd_tile(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                        T* __restrict__ out, const cuconv::ConvGeometry g) {
    static_assert(sizeof(T) == 2, "16-bit storage: a word is a channel pair");
    constexpr int TP = kDwTileRows, TQ = 2 * QT, kPairs = kDwTileChannels / 2;
    constexpr int HR = (TP - 1) * SR + KR, HC = (TQ - 1) * SR + KR;
    constexpr int RP = dw_tile_row_words(HC, SR);
    constexpr int kVectors = HR * HC * 4;  // 16-byte vectors staged: a pixel's 32 channels are 4
    constexpr int kLoads = (kVectors + 255) / 256;
    constexpr int kWindow = (QT - 1) * SR + KR;
    __shared__ __align__(16) unsigned s_x[HR * RP];
    __shared__ float2 s_w[KR * KR][kPairs];
    const int C = static_cast<int>(g.c), H = static_cast<int>(g.h), W = static_cast<int>(g.w);
    const int P = static_cast<int>(g.p), Q = static_cast<int>(g.q);
    const int q_tiles = (Q + TQ - 1) / TQ;
    const int p0 = static_cast<int>(blockIdx.x) / q_tiles * TP, q0 = static_cast<int>(blockIdx.x) % q_tiles * TQ;
    const int c0 = static_cast<int>(blockIdx.y) * kDwTileChannels;
    const int tid = static_cast<int>(threadIdx.x);
    const T* __restrict__ xn = x + static_cast<i64>(blockIdx.z) * H * W * C;
    const int ih0 = p0 * SR - static_cast<int>(g.pad_top), iw0 = q0 * SR - static_cast<int>(g.pad_left);

    for (int i = tid; i < KR * KR * kPairs; i += 256) {
        const int tap = i / kPairs, c = c0 + 2 * (i - tap * kPairs);
        s_w[tap][i - tap * kPairs] = c < C ? make_float2(cuconv::to_acc(wt[static_cast<i64>(tap) * C + c]),
                                                         cuconv::to_acc(wt[static_cast<i64>(tap) * C + c + 1]))
                                           : make_float2(0.f, 0.f);
    }
    uint4 v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
        const int i = tid + 256 * j, pix = i / 4, vec = i % 4;
        const int hr = pix / HC, hc = pix - hr * HC;
        const int ih = ih0 + hr, iw = iw0 + hc, c = c0 + 8 * vec;
        v[j] = make_uint4(0, 0, 0, 0);
        if (i < kVectors && ih >= 0 && ih < H && iw >= 0 && iw < W && c < C)
            v[j] = __ldg(reinterpret_cast<const uint4*>(xn + (ih * W + iw) * C + c));
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
        const int i = tid + 256 * j, pix = i / 4, vec = i % 4;
        const int hr = pix / HC, hc = pix - hr * HC;
        if (i < kVectors) *reinterpret_cast<uint4*>(&s_x[hr * RP + hc * 16 + vec * 4]) = v[j];
    }
    __syncthreads();

    // thread: channel pair tid % 16, output row (tid / 16) % 8 of the tile, columns QT·(tid / 128) on
    const int pair = tid % kPairs, pos = tid / kPairs, row = pos % TP, qg = pos / TP;
    const int c = c0 + 2 * pair;
    float acc[QT][2];
    {
        const float2 b = bias != nullptr && c < C ? make_float2(cuconv::to_acc(bias[c]), cuconv::to_acc(bias[c + 1]))
                                                  : make_float2(0.f, 0.f);
#pragma unroll
        for (int q = 0; q < QT; ++q) acc[q][0] = b.x, acc[q][1] = b.y;
    }
    const unsigned* base = s_x + row * SR * RP + qg * QT * SR * 16 + pair;
#pragma unroll 1  // (unrolled, the compiler hoists every row's window: 210-228 registers for bf16 7x7)
    for (int r = 0; r < KR; ++r) {
        float2 win[kWindow];
#pragma unroll
        for (int j = 0; j < kWindow; ++j) {
            const unsigned w = base[r * RP + j * 16];
            win[j] = make_float2(elem_of<T>(w, 0), elem_of<T>(w, 1));
        }
#pragma unroll
        for (int s = 0; s < KR; ++s) {
            const float2 wv = s_w[r * KR + s][pair];
#pragma unroll
            for (int q = 0; q < QT; ++q) {
                acc[q][0] = fmaf(win[q * SR + s].x, wv.x, acc[q][0]);
                acc[q][1] = fmaf(win[q * SR + s].y, wv.y, acc[q][1]);
            }
        }
    }
    const int op = p0 + row;
    if (op >= P || c >= C) return;
    T* __restrict__ o = out + ((static_cast<i64>(blockIdx.z) * P + op) * Q) * C + c;
#pragma unroll
    for (int q = 0; q < QT; ++q) {
        const int oq = q0 + qg * QT + q;
        if (oq < Q)
            *reinterpret_cast<unsigned*>(o + static_cast<i64>(oq) * C) = cuconv::pair_word<T>(acc[q][0], acc[q][1]);
    }
}

// depthwise_nhwc_dgrad<T, Index>(dy, wt, dx, ConvGeometry, total)
//     multiplier 1, any stride and dilation: a thread per (dx pixel, V adjacent channels), flat over the batch
//     with the channels fastest; per tap whose output position (h + pad - r·dil) / stride is whole and inside
//     dy, one 16-byte load of dy and one of wt (the weight as (R·S, C), not flipped), V FMAs in Acc<T>; one
//     16-byte store (a gather: no atomics, every dx element written once).
template <typename T, typename Index>
__global__ void __launch_bounds__(256)
depthwise_nhwc_dgrad(const T* __restrict__ dy, const T* __restrict__ wt, T* __restrict__ dx,
                     const cuconv::ConvGeometry g, long long total) {
    using Acc = typename cuconv::Acc<T>::type;
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const Index vectors = static_cast<Index>(g.c / V), w_count = static_cast<Index>(g.w);
    const Index h_count = static_cast<Index>(g.h), p_count = static_cast<Index>(g.p), q_count = static_cast<Index>(g.q);
    const Index c = static_cast<Index>(g.c);
    const int r_count = static_cast<int>(g.r), s_count = static_cast<int>(g.s);
    const int sh = static_cast<int>(g.stride_h), sw = static_cast<int>(g.stride_w);
    for (Index i = static_cast<Index>(blockIdx.x) * 256 + static_cast<Index>(threadIdx.x);
         i < static_cast<Index>(total); i += static_cast<Index>(gridDim.x) * 256) {
        const Index v = i % vectors, pix = i / vectors;
        const Index iw = pix % w_count, rest = pix / w_count, ih = rest % h_count, n = rest / h_count;
        const Index c0 = v * V;
        Acc acc[V];
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = Acc(0);
        const T* __restrict__ dyn = dy + static_cast<i64>(n) * p_count * q_count * c + c0;
        for (int r = 0; r < r_count; ++r) {
            const Index ph = ih + static_cast<Index>(g.pad_top) - r * static_cast<Index>(g.dil_h);
            if (ph < 0 || ph % sh != 0 || ph / sh >= p_count) continue;
            const Index op = ph / sh;
            for (int s = 0; s < s_count; ++s) {
                const Index pw = iw + static_cast<Index>(g.pad_left) - s * static_cast<Index>(g.dil_w);
                if (pw < 0 || pw % sw != 0 || pw / sw >= q_count) continue;
                const T* __restrict__ dyp = dyn + (static_cast<i64>(op) * q_count + pw / sw) * c;
                const uint4 dv = __ldg(reinterpret_cast<const uint4*>(dyp));
                const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wt + static_cast<i64>(r * s_count + s) * c + c0));
#pragma unroll
                for (int e = 0; e < V; ++e) acc[e] = fma(elem_of<T>(dv, e), elem_of<T>(wv, e), acc[e]);
            }
        }
        store_vector<T>(dx + static_cast<i64>(pix) * c + c0, acc);
    }
}

// depthwise_nhwc_wgrad<T, KS, SW>(x, dy, partial, ConvGeometry, rows_per_slice, vpb, lanes)
//     multiplier 1, kernels of up to kDwNhwcMaxS columns. Grid (ceil(C/V / vpb), slices) of 256-thread blocks,
//     V = 8 / sizeof(T) adjacent channels a thread (8-byte vectors: a kernel row's S·V sums and a chunk's
//     inputs fit in registers with two blocks per SM). Thread t of a block takes vector vl = t % vpb of the
//     block's vpb, kernel row r = t / vpb % R and row lane t / (vpb·R) of `lanes`: over the dy rows first + lane,
//     first + lane + lanes, ... of its slice it sums S·V products dy[n, p, q, c] · x[n, ih(p, r), iw(q, s), c].
//     The block's threads cover a band of consecutive dy rows and every kernel row of their channels together,
//     so that each x row comes from L2 about once per slice and its R uses hit L1.
//     KS > 0 and SW = 1 or 2 (dilation 1 along w): a row is walked in chunks of U output columns (wgrad_chunk);
//     a chunk's NQ <= U dy vectors and the (NQ - 1)·SW + KS input columns they read are loaded first (all in
//     flight together), each converted once, and column j of the chunk feeds tap s of output u where
//     j = u·SW + s: compile-time pairs, NQ compile-time too (the row's last chunk is dispatched on its count),
//     so no product of an output past Q is formed and a chunk inside the row checks no bounds. KS = 0, SW = 0:
//     S, stride and dilation at run time, per output one dy load and S input loads. Input columns outside the
//     row are zeros.
//     The lanes' sums are added through shared memory in lane order, and the block writes its partial sums
//     partial[slice][r·S + s][c] in Acc<T>; depthwise_nhwc_wgrad_reduce adds the slices in order into
//     dw (C, 1, R, S): deterministic, no atomics.
constexpr int kDwNhwcMaxS = 8;

// One chunk of depthwise_nhwc_wgrad's input-window path: NQ outputs from dyc (a vector every cc elements) and
// the (NQ - 1)·SW + KS input columns from xc (column iw0 of the row; with kCheck, columns outside [0, w_count)
// read as zeros).
template <typename T, int KS, int SW, int NQ, bool kCheck>
__device__ __forceinline__ void wgrad_chunk(typename cuconv::Acc<T>::type (&acc)[KS][8 / sizeof(T)],
                                            const T* __restrict__ dyc, const T* __restrict__ xc, int cc, int iw0,
                                            int w_count) {
    using Acc = typename cuconv::Acc<T>::type;
    constexpr int V = 8 / static_cast<int>(sizeof(T)), SPAN = (NQ - 1) * SW + KS;
    uint2 dv[NQ], xv[SPAN];
#pragma unroll
    for (int u = 0; u < NQ; ++u) dv[u] = __ldg(reinterpret_cast<const uint2*>(dyc + u * cc));
#pragma unroll
    for (int j = 0; j < SPAN; ++j) {
        const bool inside = !kCheck || (iw0 + j >= 0 && iw0 + j < w_count);
        xv[j] = inside ? __ldg(reinterpret_cast<const uint2*>(xc + j * cc)) : make_uint2(0u, 0u);
    }
    Acc df[NQ][V];
#pragma unroll
    for (int u = 0; u < NQ; ++u)
#pragma unroll
        for (int e = 0; e < V; ++e) df[u][e] = elem_of<T>(dv[u], e);
#pragma unroll
    for (int j = 0; j < SPAN; ++j) {
        Acc xf[V];
#pragma unroll
        for (int e = 0; e < V; ++e) xf[e] = elem_of<T>(xv[j], e);
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            if (j < s || (j - s) % SW != 0 || (j - s) / SW >= NQ) continue;  // (compile time)
#pragma unroll
            for (int e = 0; e < V; ++e) acc[s][e] = fma(xf[e], df[(j - s) / SW][e], acc[s][e]);
        }
    }
}

// The row's last chunk, of q_left < U outputs: wgrad_chunk with NQ = q_left.
template <typename T, int KS, int SW, int NQ>
__device__ __forceinline__ void wgrad_tail(typename cuconv::Acc<T>::type (&acc)[KS][8 / sizeof(T)],
                                           const T* __restrict__ dyc, const T* __restrict__ xc, int cc, int iw0,
                                           int w_count, int q_left) {
    if constexpr (NQ > 0) {
        if (q_left == NQ) wgrad_chunk<T, KS, SW, NQ, true>(acc, dyc, xc, cc, iw0, w_count);
        else wgrad_tail<T, KS, SW, NQ - 1>(acc, dyc, xc, cc, iw0, w_count, q_left);
    }
}

template <typename T, int KS, int SW>
__global__ void __launch_bounds__(256, 2)
depthwise_nhwc_wgrad(const T* __restrict__ x, const T* __restrict__ dy,
                     typename cuconv::Acc<T>::type* __restrict__ partial, const cuconv::ConvGeometry g,
                     long long rows_per_slice, int vpb, int lanes) {
    using Acc = typename cuconv::Acc<T>::type;
    constexpr int V = 8 / static_cast<int>(sizeof(T));
    constexpr int S_MAX = KS > 0 ? KS : kDwNhwcMaxS;
    constexpr bool kWindow = KS > 0 && SW > 0;
    constexpr int U = SW == 1 ? 8 : 4;                           // output columns a chunk
    constexpr int SPAN = kWindow ? (U - 1) * SW + KS : 1;        // input columns a chunk reads
    __shared__ Acc sums[256 * S_MAX * V];
    const int s_count = KS > 0 ? KS : static_cast<int>(g.s), r_count = static_cast<int>(g.r);
    const int per_lane = vpb * r_count, tid = threadIdx.x;
    const int lane = tid / per_lane, r = tid % per_lane / vpb, vl = tid % vpb;
    const long long vectors = g.c / V, v = static_cast<long long>(blockIdx.x) * vpb + vl;
    const bool live = lane < lanes && v < vectors;
    const long long c0 = v * V;
    Acc acc[S_MAX][V];
#pragma unroll
    for (int s = 0; s < S_MAX; ++s)
#pragma unroll
        for (int e = 0; e < V; ++e) acc[s][e] = Acc(0);
    const long long rows = g.n * g.p;
    const long long first = static_cast<long long>(blockIdx.y) * rows_per_slice;
    const long long last = min(rows, first + rows_per_slice);
    // (a row's offsets in 32 bits: W·C and Q·C elements are below 2^31, as the Python twin checks)
    const int cc = static_cast<int>(g.c), q_count = static_cast<int>(g.q), w_count = static_cast<int>(g.w);
    const int sw = static_cast<int>(g.stride_w), pw = static_cast<int>(g.pad_left), dw = static_cast<int>(g.dil_w);
    if (live) {
        for (long long row = first + lane; row < last; row += lanes) {
            const long long n = row / g.p, op = row - n * g.p;
            const long long ih = op * g.stride_h - g.pad_top + r * g.dil_h;
            if (ih < 0 || ih >= g.h) continue;
            const T* __restrict__ dyr = dy + row * g.q * g.c + c0;
            const T* __restrict__ xr = x + (n * g.h + ih) * g.w * g.c + c0;
            if constexpr (kWindow) {
                for (int q0 = 0; q0 < q_count; q0 += U) {
                    const int iw0 = q0 * SW - pw;
                    const T* __restrict__ dyc = dyr + q0 * cc;
                    const T* __restrict__ xc = xr + iw0 * cc;
                    if (q0 + U > q_count)
                        wgrad_tail<T, KS, SW, U - 1>(acc, dyc, xc, cc, iw0, w_count, q_count - q0);
                    else if (iw0 >= 0 && iw0 + SPAN <= w_count)
                        wgrad_chunk<T, KS, SW, U, false>(acc, dyc, xc, cc, iw0, w_count);
                    else
                        wgrad_chunk<T, KS, SW, U, true>(acc, dyc, xc, cc, iw0, w_count);
                }
            } else {
                for (int oq = 0; oq < q_count; ++oq) {
                    const uint2 dv = __ldg(reinterpret_cast<const uint2*>(dyr + oq * cc));
                    const int iw0 = oq * sw - pw;
#pragma unroll
                    for (int s = 0; s < S_MAX; ++s) {
                        const int iw = iw0 + s * dw;
                        if (s >= s_count || iw < 0 || iw >= w_count) continue;
                        const uint2 xv = __ldg(reinterpret_cast<const uint2*>(xr + iw * cc));
#pragma unroll
                        for (int e = 0; e < V; ++e) acc[s][e] = fma(elem_of<T>(xv, e), elem_of<T>(dv, e), acc[s][e]);
                    }
                }
            }
        }
    }
    // sums[lane][r][s][vl][e]: the lanes' sums of one (r, s, channel) lanes·per_lane·S_MAX·V apart
    const int stride = per_lane * S_MAX * V;
    if (lane < lanes)
#pragma unroll
        for (int s = 0; s < S_MAX; ++s)
#pragma unroll
            for (int e = 0; e < V; ++e) sums[lane * stride + ((r * S_MAX + s) * vpb + vl) * V + e] = acc[s][e];
    __syncthreads();
    for (int i = tid; i < stride; i += 256) {
        const int e = i % V, vi = i / V % vpb, rs = i / (V * vpb), s = rs % S_MAX, ri = rs / S_MAX;
        const long long ch = (static_cast<long long>(blockIdx.x) * vpb + vi) * V + e;
        if (s >= s_count || ch >= g.c) continue;
        Acc sum = sums[i];
        for (int l = 1; l < lanes; ++l) sum += sums[l * stride + i];  // in lane order
        partial[(static_cast<long long>(blockIdx.y) * r_count * s_count + ri * s_count + s) * g.c + ch] = sum;
    }
}

// depthwise_nhwc_wgrad_reduce<T>(partial, dw, slices, C, taps): dw[c·taps + t] = Σ over slices j of
//     partial[j][t][c]. Block (32, 8) of grid (ceil(C / 32), taps): thread x a channel (a warp's reads of a
//     slice are 32 consecutive sums), y a slice lane adding slices y, y + 8, ... in order; the 8 lanes' sums are
//     then added in lane order (deterministic).
template <typename T>
__global__ void __launch_bounds__(256)
depthwise_nhwc_wgrad_reduce(const typename cuconv::Acc<T>::type* __restrict__ partial, T* __restrict__ dw,
                            long long slices, long long c, long long taps) {
    using Acc = typename cuconv::Acc<T>::type;
    __shared__ Acc lanes[8][32];
    const long long ch = static_cast<long long>(blockIdx.x) * 32 + threadIdx.x, t = blockIdx.y;
    Acc sum = 0;
    if (ch < c)
        for (long long j = threadIdx.y; j < slices; j += 8) sum += partial[(j * taps + t) * c + ch];
    lanes[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
#pragma unroll
        for (int l = 1; l < 8; ++l) sum += lanes[l][threadIdx.x];
        dw[ch * taps + t] = cuconv::from_acc<T>(sum);
    }
}
